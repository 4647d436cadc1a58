"""Scoring in `omni generate`: the scorers built before the model loads (on the run's device, so the
KV budget counts their memory), and the stage set up over the queued rows."""

from __future__ import annotations

import time

from omni_cli.errors import OmniError
from omni_cli.quality.settings import QualitySettings
from omni_cli.quality.stage import QualityStage
from omni_cli.runners.scoring import Scorer, scorer_class


def _asr(s: QualitySettings, device: str) -> Scorer:
    return scorer_class("asr")(model=s.asr_model, device=device, batch_size=s.batch_size, num_beams=s.asr_beams)


def _mos(s: QualitySettings, device: str) -> Scorer:
    scorer = scorer_class("mos")(models=s.mos_model, device=device)  # on CUDA without onnxruntime-gpu: torch
    scorer.ran_on = f"{device} ({scorer.runtime})"
    return scorer


def _speaker(s: QualitySettings, device: str) -> Scorer:
    return scorer_class("speaker")(model=s.speaker_model, device=device, batch_size=s.batch_size)


def _utmos(s: QualitySettings, device: str) -> Scorer:
    return scorer_class("utmos")(model=s.utmos_model, device=device)


def _degenerate(s: QualitySettings, device: str) -> Scorer:
    return scorer_class("degenerate")()


# scorer name -> (settings, device) -> Scorer; tests put fakes here (a Whisper that returns planted text)
FACTORIES = {"asr": _asr, "mos": _mos, "speaker": _speaker, "degenerate": _degenerate, "utmos": _utmos}
FLAGS = {"asr": "--asr-model", "mos": "--mos-model", "speaker": "--speaker-model", "utmos": "--utmos-model"}


def build_scorers(settings: QualitySettings, device: str) -> tuple[dict[str, Scorer], float]:
    """Every enabled scorer, loaded; a model that does not load is an OmniError naming its flag.
    Returns them by name and the seconds it took."""
    t0 = time.perf_counter()
    built: dict[str, Scorer] = {}
    try:
        for name in settings.scorers:
            try:
                built[name] = FACTORIES[name](settings, device)
                built[name].ran_on = getattr(built[name], "ran_on", device)  # run.json: where each scorer ran
            except Exception as e:  # noqa: BLE001  (a hub id offline, a folder without the files)
                flag = FLAGS.get(name)
                raise OmniError(f"--score {name}: its model did not load" + (f" ({flag})" if flag else "") +
                                f": {type(e).__name__}: {e}") from None
    except BaseException:
        for scorer in built.values():
            scorer.close()
        raise
    return built, time.perf_counter() - t0


def start_stage(settings: QualitySettings, scorers: dict[str, Scorer], results, audio, model, queued: dict,
                clips: dict, scheduler, chunker) -> tuple[QualityStage, int]:
    """The stage over the queued rows (results.rows), with --best-of's extra attempts queued; a long
    row's attempts start it over through the chunker (omni_cli/chunked.py). Returns the stage and the
    number of extra requests the audio stage will see."""

    def reference_audio(row):
        clip = clips.get(row.reference[1]) if row.reference is not None else None
        return None if clip is None else (clip.samples, clip.rate)

    stage = QualityStage(settings, scorers, results, audio, reference_audio, model.frame_rate, model.real_code_mask,
                         chunker.retry)
    results.quality = stage
    extra = 0
    for rid, (row, system, entry, digest) in list(queued.items()):
        is_request = hasattr(entry, "prompt")  # else a LongRow: its attempts run its chunks again
        for req, requests in stage.register(row, system, entry if is_request else None,
                                            None if is_request else entry):
            scheduler.add(req)  # the same prompt as attempt 0's, which fit
            results.rows[req.rid] = queued[rid]
            extra += requests
    return stage, extra


def quality_record(settings: QualitySettings, stage: QualityStage | None, load_s: float, progress) -> dict | None:
    """run.json's `quality`: the settings, what scoring cost and found."""
    if not settings.enabled:
        return None
    rec = settings.as_record() | {"load_s": round(load_s, 3)}
    if stage is not None:
        rec |= {"devices": {k: getattr(v, "ran_on", None) for k, v in stage.scorers.items()},
                "rows_scored": stage.scored, "retries": stage.retries, "score_s": round(stage.score_s, 3),
                "score_calls": len(stage.calls), "largest_call": max(stage.calls, default=0),
                "scorer_s": {k: round(v, 3) for k, v in stage.scorer_s.items()},
                "means": progress.score_means() if hasattr(progress, "score_means") else None}
    return rec
