"""Batch-1 projections of the 3B decode step: cuBLAS (F.linear) against a plain Triton GEMV.

At batch 1 a decode step is weight reads: 1.72 ms of GEMMs for 5.6 GB of
weights in the step profile, against 1.31 ms at full bandwidth. This probe
times each projection shape of one layer (fused QKV, o_proj, fused gate/up,
down, and the audio head) at M = 1, cycling over enough weight copies that
nothing stays in the 50 MB L2 (as in the model, where each layer's weights
are read once a step), for cuBLAS and for a Triton GEMV at a few tile sizes.
Prints a table (us and TB/s) and writes JSON. It decides nothing by itself:
it measures whether a GEMV kernel is worth adding.

  python benchmarks/gemv_probe.py --out gemv_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import graph_us  # noqa: E402

SHAPES = {"qkv": (5120, 3072), "o_proj": (3072, 3072), "gate_up": (16384, 3072), "down": (3072, 8192),
          "audio_head": (8208, 3072)}
CONFIGS = [(16, 256, 4), (32, 256, 4), (16, 512, 8), (64, 128, 4), (8, 1024, 8)]  # BLOCK_N, BLOCK_K, warps


@triton.jit
def _gemv_kernel(w_ptr, x_ptr, y_ptr, n, k, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, k, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < k
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * k + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0)
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)


def gemv(w: torch.Tensor, x: torch.Tensor, bn: int, bk: int, warps: int) -> torch.Tensor:
    n, k = w.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, bn),)](w, x, y, n, k, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gemv_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(4, (400 << 20) // (n * k * 2))  # >= 400 MB of weights in the cycle
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = F.linear(x, ws[0])[0].float()
        row = {"shape": name, "n": n, "k": k, "MB": n * k * 2 / 2**20,
               "cublas_us": graph_us(lambda i: F.linear(x, ws[i]), copies)}
        for bn, bk, warps in CONFIGS:
            err = float((gemv(ws[0], x[0], bn, bk, warps).float() - ref).abs().max())
            row[f"triton_{bn}x{bk}w{warps}_us"] = graph_us(lambda i: gemv(ws[i], x[0], bn, bk, warps), copies)
            row[f"triton_{bn}x{bk}w{warps}_maxerr"] = err
        rows.append(row)
        del ws
        torch.cuda.empty_cache()
    keys = ["cublas_us"] + [f"triton_{bn}x{bk}w{w}_us" for bn, bk, w in CONFIGS]
    print(f"{'shape':<11} {'MB':>6} " + " ".join(f"{k.replace('_us', ''):>16}" for k in keys))
    for r in rows:
        cells = [f"{r[k]:7.1f}us {r['n'] * r['k'] * 2 / r[k] / 1e6:4.2f}TB" for k in keys]
        print(f"{r['shape']:<11} {r['MB']:>6.1f} " + " ".join(f"{c:>16}" for c in cells))
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
