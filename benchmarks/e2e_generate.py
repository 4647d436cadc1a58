"""`omni generate` end to end at a release shape, from a random checkpoint on disk.

Writes a random-weight checkpoint in the real transformers format (the 3B LM,
5.38 B parameters in bf16, and the released tokenizer's codec shape; the
text tokenizer and special-token ids are the tiny test checkpoint's, which is
all a speed run needs), then runs the real command line on prompt files of
N rows at --max-batch-size B, every row generating exactly --frames frames
(with --vary V, each row its own length in frames +- V, so rows finish at
different steps and reach the codec with different lengths, as with real
stops):
  omni generate prompts.jsonl -o OUT --model cfg.yaml --max-batch-size B ...
Reported per run: seconds from the command to the first wav on disk (load,
warm-up with graph capture, the first rows' decode and codec), the whole
command's wall time, the load and the warm-up, audio seconds written, and
audio-s/s over the generate phase (after the load and the warm-up; prefill,
decode, codec and all files included) and over the wall;
and from run.json, the generate phase split into the loop (prefill and
decode, with the writers working beside it), its prefill steps, and the
writers' tail after the last step, and the codec thread's calls: their
number, total and longest seconds.
With --voices V, each row also clones one of V reference voices of --voice-seconds
seconds (random clips written as wav files, a voice bank, rows spread round-robin
over the voices); --compare runs every BATCH:ROWS both with and without them. --trace-steps adds
each launched step's device time and the idle gaps between steps (runners/step_trace.py).
Prints a table and writes JSON.

  python benchmarks/e2e_generate.py --runs 1:4 64:64 256:256 --out e2e.json
  python benchmarks/e2e_generate.py --runs 256:256 --voices 4 --voice-seconds 10 --compare
With --devices D..., each BATCH:ROWS runs once per D as `omni generate --devices D` (1 vs 2 vs 4 GPUs):
  python benchmarks/e2e_generate.py --runs 256:4096 --devices 0 0,1 0,1,2,3
With --family qwen3_tts, the checkpoint is a Qwen3-TTS-12Hz CustomVoice folder in the released
layout at --shape (runners/qwen3_tts/shapes.py: talker, code predictor and the released speech
tokenizer's widths, random weights; the tiny checkpoint's tokenizer) and every row names a speaker:
  python benchmarks/e2e_generate.py --family qwen3_tts --shape qwen3-tts-12hz-0.6b --runs 1:4 64:64 256:256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omni_cli.runners.higgs_audio_v2.config import HiggsConfig  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import codec_config, shape_config, transformers_config  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402

TINY = REPO / "configs" / "tiny-higgs-audio-v2"
QUALITY_KEYS = ("score_s", "scorer_s", "load_s", "score_calls", "largest_call")  # run.json's quality, printed
# --prompt-tokens rows' system prompt: the tokenizer here is the tiny checkpoint's, about one
# token a byte, so the template with the default system prompt makes 72 tokens before any text
SHORT_SYSTEM = "Speak."


def write_higgs_checkpoint(root: Path) -> None:
    from transformers import HiggsAudioV2ForConditionalGeneration, HiggsAudioV2TokenizerModel

    tiny = HiggsConfig.from_file(TINY / "model" / "config.json")
    ids = {f: getattr(tiny, f) for f in ("audio_token_id", "audio_bos_token_id", "audio_delay_token_id",
                                         "eos_token_id")}
    cfg = dataclasses.replace(shape_config("higgs-audio-v2-3b"), **ids)
    torch.manual_seed(0)
    with torch.device("cuda"):
        lm = HiggsAudioV2ForConditionalGeneration(transformers_config(cfg)).to(torch.bfloat16)
    lm.save_pretrained(root / "model")
    del lm
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY / "model" / f, root / "model" / f)
    HiggsAudioV2TokenizerModel(codec_config("higgs-audio-v2-3b")).save_pretrained(root / "codec")
    torch.cuda.empty_cache()


def ensure_checkpoint(root: Path, family: str = "higgs_audio_v2", shape: str = "higgs-audio-v2-3b") -> None:
    """The random checkpoint in root, written unless a complete one of this shape is there already
    (its marker file is made last: an interrupted write is not reused)."""
    marker = root / "written"
    made = marker.read_text() if marker.exists() else None  # an empty marker: an older run's Higgs 3B
    if made == f"{family} {shape}" or (made == "" and family == "higgs_audio_v2"):
        return
    marker.unlink(missing_ok=True)  # another shape's: gone before its files are
    for part in ("model", "codec"):
        shutil.rmtree(root / part, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if family == "qwen3_tts":
        from omni_cli.runners.qwen3_tts.shapes import write_random_checkpoint

        write_random_checkpoint(root / "model", shape, "custom_voice", torch.bfloat16,
                                "cuda" if torch.cuda.is_available() else "cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the runs' processes take the card's memory
    else:
        write_higgs_checkpoint(root)
    marker.write_text(f"{family} {shape}")
    print(f"random checkpoint written in {time.perf_counter() - t0:.1f}s", flush=True)


def _sized_row(builder, i: int, tokens: int) -> dict:
    """Row i's text and system prompt, making a prompt of exactly `tokens` tokens (template
    included) under the checkpoint's tokenizer."""
    filler = f"Row {i}: a sentence to speak aloud, and then a few more words to say."
    for n in range(1, len(filler) + 1):  # a byte pair may merge: the count can skip one, so two endings
        for text in (filler[:n], filler[:n] + "!"):
            if len(builder.build(text, SHORT_SYSTEM, None)) == tokens:
                return {"id": f"r{i}", "system": SHORT_SYSTEM, "text": text}
    raise SystemExit(f"--prompt-tokens {tokens}: no prefix of {filler!r} makes a prompt of that many tokens")


def write_voices(root: Path, n: int, seconds: float) -> Path:
    """n random reference clips at 24 kHz (noise under a few tones, each its own) and their bank."""
    import numpy as np
    import soundfile as sf

    lines = ["voices:"]
    for v in range(n):
        rng = np.random.default_rng(v)
        t = np.arange(int(seconds * 24000)) / 24000
        clip = sum(0.1 * np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 3000, 5))
        sf.write(root / f"voice{v}.wav", (clip + 0.02 * rng.standard_normal(len(t))).astype(np.float32), 24000)
        lines.append(f"  v{v}: {{audio: voice{v}.wav, text: 'Reference sentence number {v}, read aloud.'}}")
    bank = root / "voices.yaml"
    bank.write_text("\n".join(lines) + "\n")
    return bank


def write_inputs(root: Path, rows: int, frames: int, vary: int = 0, prompt_tokens: int = 0,
                 voices: int = 0, max_seq_len: int = 512, family: str = "higgs_audio_v2") -> tuple[Path, Path]:
    """The run's model config and prompt file (rows of one sentence each, or with prompt_tokens
    a short system prompt and a text that make prompts of that many tokens; with voices, row i
    clones voice i mod voices; Qwen3-TTS rows name a speaker) in root."""
    cfg = root / "model.yaml"
    codec = f"codec: {root / 'codec'}\n" if family == "higgs_audio_v2" else ""
    dtype = "bfloat16" if torch.cuda.is_available() or family == "higgs_audio_v2" else "float32"
    cfg.write_text(f"family: {family}\ncheckpoint: {root / 'model'}\n{codec}"
                   f"dtype: {dtype}\ndevice: auto\nmax_seq_len: {max_seq_len}\n")
    prompts = root / f"prompts-{rows}-{vary}-{prompt_tokens}-{voices}.jsonl"
    rng = random.Random(rows)
    builder = None
    if prompt_tokens:
        from omni_cli.runners.higgs_audio_v2.prompt import PromptBuilder

        builder = PromptBuilder(TINY / "model", HiggsConfig.from_file(TINY / "model" / "config.json").audio_bos_token_id)
    lines = []
    for i in range(rows):
        row = _sized_row(builder, i, prompt_tokens) if builder else {
            "id": f"r{i}", "text": f"Row number {i}: a sentence to speak aloud."}
        if family == "qwen3_tts":  # CustomVoice: one of the release's speakers
            row.update(speaker="ryan", language="English")
        if voices:
            row["voice"] = f"v{i % voices}"
        if vary:  # this row's own length: rows finish at different steps, with different codec shapes
            row["max_new_frames"] = row["min_new_frames"] = rng.randint(frames - vary, frames + vary)
        lines.append(json.dumps(row) + "\n")
    prompts.write_text("".join(lines))
    return cfg, prompts


def run(root: Path, rows: int, batch: int, frames: int, async_decode: bool, vary: int = 0,
        prompt_tokens: int = 0, voices: int = 0, max_seq_len: int = 512, warm_cache: bool = False,
        devices: str | None = None, family: str = "higgs_audio_v2", score: str | None = None,
        score_batch: int = 64, asr_beams: int | None = None, trace_steps: bool = False) -> dict:
    cfg, prompts = write_inputs(root, rows, frames, vary, prompt_tokens, voices, max_seq_len, family)
    if score:  # rows scored as they come out; nothing rejected, so every row runs once (the cost of scoring)
        cfg.write_text(cfg.read_text() + f"quality:\n  score: {score}\n  reject: none\n  batch_size: {score_batch}\n"
                       f"  asr_model: {root / 'whisper'}\n" + (f"  asr_beams: {asr_beams}\n" if asr_beams else ""))
    out = root / (f"out-{rows}-{batch}-{int(async_decode)}-{vary}-{prompt_tokens}-{voices}-{devices or 'one'}"
                  f"-{(score or 'none').replace(',', '+')}")
    cmd = [sys.executable, "-m", "omni_cli", "generate", str(prompts), "-o", str(out), "--model", str(cfg), "-q",
           "--max-batch-size", str(batch), "--max-new-frames", str(frames), "--min-new-frames", str(frames),
           "--seed", "1", "--async-decode" if async_decode else "--no-async-decode"]
    if voices:
        cmd += ["--voices", str(root / "voices.yaml")]
    if devices:
        cmd += ["--devices", devices]
    env = {**os.environ, "OMNI_CACHE_DIR": str(out) + "-cache"}  # a cold cache: the run encodes its voices
    if trace_steps:  # device step times and the loop stream's idle gaps (runners/step_trace.py)
        env["OMNI_TRACE_STEPS"] = "1"
    if voices and warm_cache:  # `omni voices encode` first (untimed): the run reads the codes from the cache
        subprocess.run([sys.executable, "-m", "omni_cli", "voices", "encode", str(root / "voices.yaml"), "--model",
                        str(cfg)], cwd=REPO, env=env, check=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    first = None
    while proc.poll() is None:
        if first is None and any(p.suffix == ".wav" and not p.name.startswith(".") for p in (out / "audio").glob("*")
                                 if (out / "audio").is_dir()):
            first = time.perf_counter() - t0
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"omni generate failed ({proc.returncode}): {' '.join(cmd)}")
    info = json.loads((out / "run.json").read_text())
    timings = info["timings"]
    if "workers" in info:  # --devices: the first worker's phases; generate_s is the parent's, its spawns included
        timings = {**next(w["timings"] for w in info["workers"] if w["timings"]), "generate_s": timings["generate_s"]}
    audio, gen = info["totals"]["audio_s"], timings["generate_s"]
    return {"family": family, "rows": rows, "devices": devices, "per_device": info.get("devices"),
            "max_batch_size": batch,
            "async_decode": async_decode, "frames": frames, "vary": vary,
            "prompt_tokens": prompt_tokens or None, "voices": voices, "max_seq_len": max_seq_len,
            "warm_cache": warm_cache and bool(voices),
            "references": info.get("references"), "references_s": timings.get("references_s"),
            "first_wav_s": first, "wall_s": wall, "load_s": timings["load_s"],
            "warmup_s": timings["warmup_s"], "load_phases": timings["load_phases"], "generate_s": gen,
            "audio_s": audio, "audio_s_per_s_generate": audio / gen, "audio_s_per_s_wall": audio / wall,
            **{k: timings[k] for k in ("loop_s", "prefill_s", "prefill_steps", "write_tail_s", "tail_codec_s",
                                                "write_busy_s", "codec_calls", "codec_s", "codec_max_call_s")},
            "step_ms": timings["step_ms"], "kv_budget": info.get("kv_budget"),
            "kv_cache": info.get("kv_cache"), "prefix_cache": info.get("prefix_cache"),
            "query_hits": info["async_decode"]["query_hits"], "query_misses": info["async_decode"]["query_misses"],
            "trace": info["async_decode"].get("trace"),
            "score": score, "quality": info.get("quality")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=("higgs_audio_v2", "qwen3_tts"), default="higgs_audio_v2")
    ap.add_argument("--shape", help="qwen3_tts: qwen3-tts-12hz-0.6b (default), qwen3-tts-12hz-1.7b or tiny-qwen3-tts")
    ap.add_argument("--runs", nargs="+", default=["1:4", "64:64", "256:256"], help="BATCH:ROWS")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--vary", type=int, default=0,
                    help="each row makes frames +- up to this many (uniform, seeded), not exactly frames")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="rows whose prompts are exactly this many tokens (omni bench's workload: 64), with a "
                         "short system prompt; default: one sentence a row under the default system prompt")
    ap.add_argument("--voices", type=int, default=0, help="rows clone these many reference voices (round-robin)")
    ap.add_argument("--voice-seconds", type=float, default=10.0, help="each reference voice's length")
    ap.add_argument("--compare", action="store_true", help="run each BATCH:ROWS also without the voices")
    ap.add_argument("--warm-cache", action="store_true", help="encode the voices into the cache before each run")
    ap.add_argument("--max-seq-len", type=int, default=512, help="the model config's max_seq_len")
    ap.add_argument("--devices", nargs="+", default=[None],
                    help="run each BATCH:ROWS with `omni generate --devices D` for each D given (e.g. 0 0,1 0,1,2,3: "
                         "1 vs 2 vs 4 GPUs); --max-batch-size is per device")
    ap.add_argument("--score", help="score every row with these scorers (asr at whisper-large-v3-turbo's shape, random "
                                    "weights: benchmarks/scoring_models.py), e.g. asr,mos,degenerate")
    ap.add_argument("--compare-score", action="store_true", help="run each BATCH:ROWS also without --score")
    ap.add_argument("--score-batch", type=int, default=64, help="rows a scorer call takes (quality.batch_size)")
    ap.add_argument("--asr-beams", type=int, help="Whisper's beams (quality.asr_beams; default: the pipeline's 5)")
    ap.add_argument("--trace-steps", action="store_true",
                    help="time each launched step on the device and the idle gaps between steps (OMNI_TRACE_STEPS)")
    ap.add_argument("--out", type=Path, default=Path("e2e_generate.json"))
    ap.add_argument("--root", type=Path, default=None,
                    help="keep the checkpoint (and outputs) in this folder, and reuse a checkpoint already there: "
                         "later runs then skip writing it")
    args = ap.parse_args()
    qwen = args.family == "qwen3_tts"
    shape = args.shape or ("qwen3-tts-12hz-0.6b" if qwen else "higgs-audio-v2-3b")
    if qwen and (args.voices or args.prompt_tokens):
        ap.error("--voices and --prompt-tokens are Higgs's (a Qwen3-TTS row here is a CustomVoice sentence)")
    if not qwen and shape != "higgs-audio-v2-3b":
        ap.error("--shape: Higgs runs higgs-audio-v2-3b only")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        ensure_checkpoint(root, args.family, shape)
        for old in root.glob("out-*"):  # outputs of an earlier call in the same folder
            shutil.rmtree(old)
        if args.voices:
            write_voices(root, args.voices, args.voice_seconds)
        if args.score and "asr" in args.score:
            from benchmarks.scoring_models import write_whisper_turbo

            write_whisper_turbo(root / "whisper")
        results = []
        for spec in args.runs:
            # flush what was written before (the 10.8 GB checkpoint, the last run's files) to disk first,
            # so a run's own file writes do not queue behind it
            os.sync()
            batch, rows = (int(x) for x in spec.split(":"))
            for voices, score, devices in [(v, sc, d) for v in ([0, args.voices] if args.compare else [args.voices])
                                           for sc in ([None, args.score] if args.compare_score else [args.score])
                                           for d in args.devices]:
                results.append(run(root, rows, batch, args.frames, True, args.vary, args.prompt_tokens, voices,
                                   args.max_seq_len, args.warm_cache, devices, args.family, score,
                                   args.score_batch, args.asr_beams, args.trace_steps))
                # after every run: a later one cut short leaves the earlier ones
                write_results(args.out, family=args.family, shape=shape, runs=results)
                r = results[-1]
                print(f"batch {batch}, {rows} rows: {r['audio_s_per_s_generate']:.1f} audio-s/s (generate), "
                      f"{r['audio_s_per_s_wall']:.1f} (wall), first wav {r['first_wav_s'] or float('nan'):.1f} s, "
                      f"references {r['references_s']} s, prefill {r['prefill_s']} s ({r['prefill_steps']} steps), "
                      f"step p50 {r['step_ms'].get('p50')} ms, peak rows {(r['kv_cache'] or {}).get('peak_rows')}, "
                      f"prefix cache {r['prefix_cache']}, score {score}: "
                      f"{ {k: (r['quality'] or {}).get(k) for k in QUALITY_KEYS} }", flush=True)
                if r["trace"]:
                    t = r["trace"]
                    print(f"  device: decode step {t['decode_ms']} ms, gaps {t['gap_ms']} ms, idle {t['gap_s']} "
                          f"of {t['span_s']} s ({t['idle_share']})", flush=True)
    print(f"{'devices':>8} {'batch':>5} {'rows':>5} {'voices':>6} {'first wav s':>12} {'wall s':>7} {'load s':>7} {'warm s':>7} {'audio s':>8} "
          f"{'aud-s/s gen':>12} {'aud-s/s wall':>13} {'loop s':>7} {'prefill s':>9} {'prefills':>8} {'tail s':>7} "
          f"{'codec s':>8} {'calls':>6} {'longest':>8} {'tail codec':>10} {'writers':>8} {'score':>20} {'score s':>8}")
    for r in results:
        print(f"{r['devices'] or '-':>8} {r['max_batch_size']:>5} {r['rows']:>5} {r['voices']:>6} {r['first_wav_s'] or float('nan'):>12.1f} {r['wall_s']:>7.1f} "
              f"{r['load_s']:>7.1f} {r['warmup_s']:>7.1f} {r['audio_s']:>8.1f} {r['audio_s_per_s_generate']:>12.1f} "
              f"{r['audio_s_per_s_wall']:>13.1f} {r['loop_s']:>7.2f} {r['prefill_s']:>9.2f} {r['prefill_steps']:>8} {r['write_tail_s']:>7.2f} "
              f"{r['codec_s']:>8.2f} {r['codec_calls']:>6} {r['codec_max_call_s']:>8.2f} "
              f"{r['tail_codec_s'] if r['tail_codec_s'] is not None else float('nan'):>10.2f} {r['write_busy_s']:>8.2f} "
              f"{r['score'] or '-':>20} {(r['quality'] or {}).get('score_s') or 0.0:>8.2f}")


if __name__ == "__main__":
    main()
