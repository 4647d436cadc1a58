"""Decode projections of a few rows: cuBLAS (F.linear) against the Triton tensor-core kernel.

A decode step of a few dozen rows reads each weight once, like one row, but
cuBLAS ran its GEMMs at ~2.9 TB/s at 64 rows (BENCHMARKS.md). This probe
times each projection shape of one layer of the 3B model (fused QKV,
o_proj, fused gate/up with silu·up, down, and the audio head) at each row
count, cuBLAS against runners/fused_mm.py at a few tiles (output columns,
reduction columns, warps, stages; `tileN` in the
table is TILES[N], or PAIRED_TILES[N] for gate/up, as the JSON records), cycling over enough weight copies that
nothing stays in the 50 MB L2, calls back to back in one CUDA graph. Every
result is checked against the cuBLAS path (max |diff| in the JSON). For gate/up
the cuBLAS column is what the model runs without the kernel: one GEMM over
the fused weight, then silu_mul (runners/fused_ops.py). Prints µs per
call and TB/s of weight reads, writes JSON.

  python benchmarks/mm_probe.py --rows 2 8 16 32 64 128 256 --out mm_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import graph_us, write_results  # noqa: E402
import omni_cli.runners.fused_mm as fused_mm  # noqa: E402
from omni_cli.runners.fused_mm import TILE, mm  # noqa: E402
from omni_cli.runners import fused_ops  # noqa: E402

# name: (output columns n, reduction k, silu_mul: the weight is [2n, k])
SHAPES = {"qkv": (5120, 3072, False), "o_proj": (3072, 3072, False), "gate_up": (8192, 3072, True),
          "down": (3072, 8192, False), "audio_head": (8208, 3072, False)}
# (output columns, reduction columns, warps, stages); the plain shapes' tiles are those of the
# split-K sweep at 138d16a that did best without a split (mm_probe_h200_split.json)
TILES = [(32, 128, 4, 4), (64, 128, 4, 4), (32, 256, 4, 3)]
PAIRED_TILES = [(64, 128, 4, 4), (32, 128, 4, 4), (64, 64, 4, 6), (128, 64, 8, 4), (64, 128, 8, 4), (64, 64, 8, 4),
                (128, 128, 8, 3), (128, 64, 4, 4)]


def _cublas(x, w, silu_mul: bool) -> torch.Tensor:
    """The ops the model runs without the kernel: one cuBLAS GEMM (over the fused [2n, k] weight
    for gate/up), then silu_mul."""
    return fused_ops.silu_mul(F.linear(x, w)) if silu_mul else F.linear(x, w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 8, 16, 32, 64])
    ap.add_argument("--blas", default=None, help="torch.backends.cuda.preferred_blas_library for the cuBLAS column")
    ap.add_argument("--out", type=Path, default=Path("mm_probe.json"))
    args = ap.parse_args()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    dev = torch.device("cuda")
    fused_mm.MAX_ROWS = max(args.rows)  # the probe decides how far the kernel should serve
    out = []
    for name, (n, k, silu_mul) in SHAPES.items():
        rows_n = 2 * n if silu_mul else n
        copies = max(4, (400 << 20) // (rows_n * k * 2))  # >= 400 MB of weights in the cycle
        ws = [torch.randn(rows_n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
        for m in args.rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = _cublas(x, ws[0], silu_mul).float()
            row = {"shape": name, "rows": m, "n": n, "k": k, "MB": rows_n * k * 2 / 2**20,
                   "cublas_us": graph_us(lambda i: _cublas(x, ws[i], silu_mul), copies)}
            for t, tile in enumerate(PAIRED_TILES if silu_mul else TILES):
                key = f"tile{t}"
                row[f"{key}_tile"] = list(tile)
                try:
                    row[f"{key}_maxerr"] = float((mm(x, ws[0], silu_mul=silu_mul, tile=tile).float() - ref).abs().max())
                    row[f"{key}_us"] = graph_us(lambda i: mm(x, ws[i], silu_mul=silu_mul, tile=tile), copies)
                except triton.runtime.errors.OutOfResources:  # a tile past the shared memory
                    row[f"{key}_us"] = float("nan")
            out.append(row)
            print(name, m, {kk: round(v, 1) for kk, v in row.items() if kk.endswith("_us")}, flush=True)
        del ws
        torch.cuda.empty_cache()
    keys = [key for key in out[0] if key.endswith("_us")]  # nan: the tile did not fit
    print(f"{'shape':<11} {'rows':>4} {'MB':>6} " + " ".join(f"{k.replace('_us', ''):>15}" for k in keys))
    for r in out:
        cells = [f"{r[k]:6.1f}us {r['MB'] * 2**20 / r[k] / 1e6:4.2f}TB" for k in keys]
        print(f"{r['shape']:<11} {r['rows']:>4} {r['MB']:>6.1f} " + " ".join(f"{c:>15}" for c in cells))
    write_results(args.out, triton=triton.__version__, shipped=TILE,
                  blas=str(torch.backends.cuda.preferred_blas_library()), rows=out)


if __name__ == "__main__":
    main()
