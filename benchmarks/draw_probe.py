"""The one-kernel draw (runners/sampling/fused_draw.py) at decode sizes: time per call and warps per row.

Rows = batch x 8 codebooks over the Higgs vocabulary (1026), random scores,
sampling as `omni bench` runs it (temperature 1, top-k 50, top-p 0.95) and
with top-k off (top-p over the whole vocabulary). Each kernel configuration
is timed inside a CUDA graph (benchmarks/timing.py) and its tokens are
checked against sampling.ops.draw_rows, the PyTorch path, which is timed too.
Prints a table and writes JSON.

  python benchmarks/draw_probe.py --batch 1 64 256 --out draw_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import graph_us, write_results  # noqa: E402
from omni_cli.runners.sampling.fused_draw import _draw_kernel, blocks  # noqa: E402
from omni_cli.runners.sampling.ops import draw_rows  # noqa: E402

VOCAB = 1026
TABLES = ("temperature", "top_k", "top_p", "min_p", "seed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--out", type=Path, default=Path("draw_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    results = []
    main, tail = blocks(VOCAB)
    for b in args.batch:
        r = b * 8
        scores = torch.randn(r, VOCAB, generator=g, device=dev) * 3
        slots, steps = torch.arange(b, device=dev), torch.full((b,), 100, device=dev)
        history = torch.zeros(b, 8, 256, dtype=torch.int64, device=dev)
        for top_k in (50, 0):
            tables = dict(temperature=torch.ones(b, device=dev), top_k=torch.full((b,), top_k, device=dev),
                          top_p=torch.full((b,), 0.95, device=dev), min_p=torch.zeros(b, device=dev),
                          seed=torch.arange(b, device=dev) * 7919)
            want, _ = draw_rows(scores, slots, steps, tables, 8, history)
            results.append({"batch": b, "rows": r, "top_k": top_k, "kernel": "pytorch draw", "warps": None,
                            "us": graph_us(lambda i: draw_rows(scores, slots, steps, tables, 8, history), 1),
                            "same_tokens": True})
            for w in args.warps:
                tok = torch.empty(r, dtype=torch.int64, device=dev)
                lp = torch.empty(r, dtype=torch.float32, device=dev)

                def call(i, w=w, tok=tok, lp=lp):
                    _draw_kernel[(r,)](scores, slots, steps, *(tables[n] for n in TABLES), tok, lp, history,
                                       history.shape[-1], VOCAB, 0, STREAMS=8, TOTAL=8, MAIN=main, TAIL=tail, num_warps=w)

                us = graph_us(call, 4)
                results.append({"batch": b, "rows": r, "top_k": top_k, "kernel": "fused", "warps": w, "us": us,
                                "same_tokens": bool(torch.equal(tok, want))})
    print(f"{'batch':>5} {'rows':>5} {'top_k':>5} {'kernel':<13} {'warps':>5} {'us':>9} {'same tokens':>12}")
    for x in results:
        print(f"{x['batch']:>5} {x['rows']:>5} {x['top_k']:>5} {x['kernel']:<13} {x['warps'] or '-':>5} "
              f"{x['us']:>9.1f} {str(x['same_tokens']):>12}")
    write_results(args.out, triton=triton.__version__, rows=results)


if __name__ == "__main__":
    main()
