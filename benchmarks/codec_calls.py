"""What one graphed codec call costs at each batch size: the call `omni generate` makes at the drain.

The drain of a one-wave run splits its rows into codec calls; how big each
call should be depends on how the call's time grows with its rows. This
times the call as the runner makes it (runners/higgs_audio_v2/runner.py:
masked bf16 decode at a length bucket, then the int16 samples), replayed from
a CUDA graph as runners/codec_graphs.py replays it, at ROWS x FRAMES codec
frames with every row full. Random weights of the released tokenizer's
decoder. Per batch: ms a call, ms a row, audio-s/s.
Prints a table and writes JSON.

  python benchmarks/codec_calls.py --rows 4 8 16 21 32 64 --frames 192 --out codec_calls.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.runners.audio import pcm16  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import random_codec  # noqa: E402
from benchmarks.timing import graph_us, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 21, 32, 64])
    ap.add_argument("--frames", type=int, default=192, help="codec frames a row (the drain's length bucket)")
    ap.add_argument("--out", type=Path, default=Path("codec_calls.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    codec = random_codec("higgs-audio-v2-3b", torch.bfloat16, dev)
    seconds = args.frames * codec.hop_length / codec.sample_rate  # audio a row
    rows = []
    with torch.inference_mode():
        for b in args.rows:
            codes = torch.randint(0, 1024, (b, codec.num_quantizers, args.frames), device=dev)
            lengths = torch.full((b,), args.frames, device=dev)
            ms = graph_us(lambda i: pcm16(codec.decode(codes, lengths)), 1, iters=10) / 1e3
            rows.append({"rows": b, "frames": args.frames, "ms_per_call": ms, "ms_per_row": ms / b,
                         "audio_s_per_s": b * seconds / (ms / 1e3)})
            torch.cuda.empty_cache()
    print(f"{'rows':>5} {'ms a call':>10} {'ms a row':>9} {'audio-s/s':>10}")
    for r in rows:
        print(f"{r['rows']:>5} {r['ms_per_call']:>10.2f} {r['ms_per_row']:>9.3f} {r['audio_s_per_s']:>10.0f}")
    write_results(args.out, frames=args.frames, rows=rows)


if __name__ == "__main__":
    main()
