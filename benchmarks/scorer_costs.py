"""What each scorer costs a row, alone, at the shapes `e2e_generate.py --score` runs.

Builds the random Whisper large-v3-turbo-shaped checkpoint (benchmarks/scoring_models.py), then
scores N synthetic clips of --seconds seconds at 24 kHz (tones under a syllable-rate envelope,
with noise) in calls of --batch rows, and times each part on its own (synchronized):
  asr-features  log-mel features of every clip, batched on the device (WhisperASR.batch_features);
                "extractor": transformers' feature extractor clip by clip, as before
  asr-encoder   Whisper's encoder over those features, bf16/fp16 (every clip padded to 30 s)
  asr b=K       the whole transcription (features, encoder, generate) with K beams
  mos <runtime> DNSMOS (SIG/BAK/OVRL/P.808) through onnxruntime or our torch executor
  degenerate    the model-free checks
Prints ms per row for each and writes JSON.

  python benchmarks/scorer_costs.py --rows 256 --batch 64 --out scorer_costs.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.timing import write_results  # noqa: E402

RATE = 24000


def clips(rows: int, seconds: float, seed: int = 0) -> list[np.ndarray]:
    """Speech-like test clips: a few tones under a 4 Hz on/off envelope, plus noise. [samples] float32."""
    gen = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    out = []
    for _ in range(rows):
        tones = sum(np.sin(2 * np.pi * f * t) for f in gen.uniform(120, 1200, size=3))
        envelope = (np.sin(2 * np.pi * 4.0 * t + gen.uniform(0, 6.28)) > 0).astype(np.float64)
        out.append((0.2 * tones * envelope / 3 + 0.01 * gen.standard_normal(t.size)).astype(np.float32))
    return out


def timed(fn) -> float:
    """Seconds of fn(), synchronized on CUDA, after one untimed call (plans, allocations)."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="rows a scorer call takes (quality.batch_size)")
    ap.add_argument("--seconds", type=float, default=8.0, help="each clip's length (200 Higgs frames: 8 s)")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--mos", nargs="+", default=["torch"], choices=["torch", "onnxruntime"],
                    help="DNSMOS runtimes: our torch executor on the device, onnxruntime on the CPU")
    ap.add_argument("--mos-window-batch", type=int, nargs="+", default=[16],
                    help="DNSMOS windows a model call takes on the device (DnsmosScorer.window_batch)")
    ap.add_argument("--mos-precision", nargs="+", default=["half"], choices=["half", "float32"],
                    help="the torch executor's convolutions on the device (DnsmosScorer half); with both, "
                         "the largest score difference between them is reported")
    ap.add_argument("--skip-asr", action="store_true", help="time the MOS and degenerate scorers only")
    ap.add_argument("--root", type=Path, help="where the Whisper checkpoint is (re)used; default a temporary folder")
    ap.add_argument("--out", type=Path, default=Path("scorer_costs.json"))
    args = ap.parse_args()

    from benchmarks.scoring_models import write_whisper_turbo
    from omni_cli.runners.scoring.asr import WhisperASR
    from omni_cli.runners.scoring.base import ScoreInput, to_rate
    from omni_cli.runners.scoring.degenerate import DegenerateScorer
    from omni_cli.runners.scoring.dnsmos import DnsmosScorer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    audio = clips(args.rows, args.seconds)
    rows = [ScoreInput(audio=a, sample_rate=RATE, text="a sentence of about eight seconds", language="en",
                       id=f"r{i}") for i, a in enumerate(audio)]
    results: list[dict] = []

    def record(part: str, seconds: float, **extra) -> None:
        results.append({"part": part, "seconds": seconds, "ms_per_row": 1e3 * seconds / args.rows, **extra})
        print(f"{part:<22} {seconds:8.3f} s {1e3 * seconds / args.rows:9.2f} ms/row", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        folder = None if args.skip_asr else write_whisper_turbo((args.root or Path(tmp)) / "whisper")
        for beams in [] if args.skip_asr else args.beams:
            asr = WhisperASR(folder, device, batch_size=args.batch, num_beams=beams)
            clips_16k = [to_rate(a, RATE, asr.sampling_rate) for a in audio]
            if beams == args.beams[0]:
                record("asr-features extractor", timed(lambda: [asr._features(c, False) for c in clips_16k]))

                def features():
                    return [asr.batch_features(clips_16k[s:s + args.batch]) for s in range(0, args.rows, args.batch)]
                record("asr-features", timed(features))
                feats = features()

                @torch.inference_mode()
                def encoder():
                    for part in feats:
                        asr.model.model.encoder(part["input_features"].to(asr.device, asr.dtype))
                record("asr-encoder", timed(encoder), dtype=str(asr.dtype))
            record(f"asr b={beams}", timed(lambda: asr.transcribe(clips_16k, ["en"] * args.rows)), beams=beams)
            asr.close()
        # onnxruntime on the CPU (the device has no onnxruntime-gpu), our torch executor on the device
        scores: dict[str, list] = {}  # precision -> every row's scores (the first window batch's)
        for runtime, where in [(r, device if r == "torch" else "cpu") for r in args.mos]:
            for precision in args.mos_precision if runtime == "torch" else ["float32"]:
                for windows in args.mos_window_batch if where != "cpu" else [16]:
                    mos = DnsmosScorer(device=where, runtime=runtime, window_batch=windows,
                                       half=precision == "half" if runtime == "torch" else None)

                    def score_all():
                        return [r for s in range(0, args.rows, args.batch) for r in mos.score(rows[s:s + args.batch])]
                    record(f"mos {runtime} {precision} {where} w{windows}", timed(score_all), runtime=mos.runtime,
                           device=where, window_batch=windows, precision=precision)
                    if f"{runtime} {precision}" not in scores:
                        scores[f"{runtime} {precision}"] = score_all()
                    mos.close()
        if len(scores) > 1:  # how far each runtime / precision scores from the first
            (first, ref), *others = scores.items()
            for name, got in others:
                worst = max(abs(g[n] - r[n]) for g, r in zip(got, ref) for n in DnsmosScorer.score_names)
                results.append({"part": f"mos {name} vs {first}", "max_abs_diff": worst})
                print(f"mos {name} vs {first}: largest score difference {worst:.2e}", flush=True)
        degenerate = DegenerateScorer()
        record("degenerate", timed(lambda: [degenerate.score(rows[s:s + args.batch])
                                            for s in range(0, args.rows, args.batch)]))
    write_results(args.out, rows=args.rows, batch=args.batch, seconds=args.seconds, parts=results)


if __name__ == "__main__":
    main()
