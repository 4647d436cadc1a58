"""Why the codec is slower inside `omni generate` than alone: its calls with and without the file writers beside it.

In the end-to-end runs (BENCHMARKS.md) the codec thread took 0.52 s for 256
rows of 8 s, ~3,800 audio-s/s, against 5,500-6,700 in
benchmarks/codec_decode.py. This script replays what omni generate's codec
thread does at the drain of a batch-256 run, at the released tokenizer's
shape (random weights, bf16): CALLS masked decodes of ROWS rows x 192 codec
frames on a thread of its own and its own CUDA stream, each followed by the
copy to the host; then the same while each call's rows are written by the
writer pool (omni_cli/output.py: OutputWriter.write_ok, the real wav, npz and
manifest writes, 4 threads as in generate); then that again with Python's
thread switch interval at 0.5 ms instead of 5 ms. Per mode: the wall time of
all calls, the GPU time of the decodes (CUDA events on the codec's stream),
audio-s/s over the wall. Prints a table and writes JSON.

  python benchmarks/codec_contention.py --rows 32 --calls 8 --out codec_contention.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.output import OutputWriter  # noqa: E402
from omni_cli.runners.audio import pcm16  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import random_codec  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402

FRAMES = 192  # codec frames of a 200-frame row after the delay pattern


def _calls(codec, codes, lengths, calls: int, write) -> tuple[float, float]:
    """(wall s, GPU s) of `calls` decodes on this thread's own stream; write(rows' samples) after each."""
    stream = torch.cuda.Stream()
    gpu = 0.0
    t0 = time.perf_counter()
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            wave = pcm16(codec.decode(codes, lengths))  # the samples, as the runner's calls make them
            end.record()
            host = wave.cpu().numpy()  # waits for this stream, as the runner's call does
            gpu += start.elapsed_time(end) / 1e3
            write([host[j, : FRAMES * codec.hop_length] for j in range(host.shape[0])])
    return time.perf_counter() - t0, gpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("codec_contention.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    codec = random_codec("higgs-audio-v2-3b", torch.bfloat16, dev)
    codes = torch.randint(0, 1024, (args.rows, 8, FRAMES), device=dev)
    lengths = torch.full((args.rows,), FRAMES, device=dev)
    tokens = np.zeros((FRAMES + 8, 8), dtype=np.int64)
    logprobs = np.zeros((FRAMES + 8, 8), dtype=np.float32)
    mask = np.ones((FRAMES + 8, 8), dtype=bool)
    codec_thread = ThreadPoolExecutor(max_workers=1)
    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        writer = OutputWriter(Path(out_dir), "wav", codec.sample_rate)
        counter = iter(range(10**9))
        for mode in ("warm-up", "alone", "with writers", "with writers, 0.5 ms switch"):
            pool = ThreadPoolExecutor(max_workers=4)
            pending = []

            def write(waves, files=mode.startswith("with")):
                for w in waves if files else ():
                    n = next(counter)
                    pending.append(pool.submit(writer.write_ok, n, f"r{n}", w, tokens, logprobs, mask, {"row": n}))

            sys.setswitchinterval(5e-4 if "0.5 ms" in mode else 5e-3)
            t0 = time.perf_counter()
            wall, gpu = codec_thread.submit(_calls, codec, codes, lengths, args.calls, write).result()
            pool.shutdown(wait=True)
            for f in pending:
                f.result()
            done = time.perf_counter() - t0
            audio = args.calls * args.rows * FRAMES * codec.hop_length / codec.sample_rate
            if mode != "warm-up":
                rows.append({"mode": mode, "rows": args.rows, "calls": args.calls, "codec_wall_s": wall,
                             "codec_gpu_s": gpu, "with_files_s": done, "audio_s_per_s": audio / wall})
        writer.close()
    sys.setswitchinterval(5e-3)
    print(f"{'mode':<30} {'codec wall s':>12} {'codec GPU s':>11} {'files done s':>12} {'audio-s/s':>10}")
    for r in rows:
        print(f"{r['mode']:<30} {r['codec_wall_s']:>12.3f} {r['codec_gpu_s']:>11.3f} {r['with_files_s']:>12.3f}"
              f" {r['audio_s_per_s']:>10.0f}")
    write_results(args.out, rows=rows)


if __name__ == "__main__":
    main()
