"""Batch-1 projections of the 3B decode step: cuBLAS (F.linear) against the shipped Triton GEMV.

At batch 1 a decode step is weight reads (BENCHMARKS.md). This probe times
each projection shape of one layer (fused QKV, o_proj, fused gate/up, down,
and the audio head) at one row, cycling over enough weight copies that
nothing stays in the 50 MB L2 (as in the model, where each layer's weights
are read once a step). The calls run back to back in one CUDA graph, so the
GEMV with early launch (runners/device.py: pdl_launch) overlaps one call's
tail with the next one's first weight reads, as in the model's chain. The
GEMV runs at a few tiles (rows of the weight, columns, warps per program),
the shipped one (runners/fused_gemv.py: TILE) with early launch on and off.
Prints µs per call and TB/s, writes JSON.

  python benchmarks/gemv_probe.py --out gemv_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import omni_cli.runners.device as device_mod  # noqa: E402
from benchmarks.timing import graph_us, write_results  # noqa: E402
from omni_cli.runners.fused_gemv import TILE, gemv  # noqa: E402

SHAPES = {"qkv": (5120, 3072), "o_proj": (3072, 3072), "gate_up": (16384, 3072), "down": (3072, 8192),
          "audio_head": (8208, 3072)}
TILES = [(4, 1024, 4), (8, 1024, 4), (8, 512, 4), (4, 2048, 4), (8, 1024, 8), (16, 512, 8), (4, 512, 2)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gemv_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = []
    for name, (n, k) in SHAPES.items():
        copies = max(4, (400 << 20) // (n * k * 2))  # >= 400 MB of weights in the cycle
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = F.linear(x, ws[0]).float()
        row = {"shape": name, "n": n, "k": k, "MB": n * k * 2 / 2**20,
               "cublas_us": graph_us(lambda i: F.linear(x, ws[i]), copies)}
        for tile in TILES:
            for pdl in (True, False) if tile == TILE else (True,):
                device_mod.PDL = pdl
                key = "x".join(map(str, tile)) + ("" if pdl else "_nopdl")
                row[f"{key}_us"] = graph_us(lambda i: gemv(x, ws[i], tile=tile), copies)
                row[f"{key}_maxerr"] = float((gemv(x, ws[0], tile=tile).float() - ref).abs().max())
        out.append(row)
        del ws
        torch.cuda.empty_cache()
    keys = [key for key in out[0] if key.endswith("_us")]
    print(f"{'shape':<11} {'MB':>6} " + " ".join(f"{k.replace('_us', ''):>15}" for k in keys))
    for r in out:
        cells = [f"{r[k]:6.1f}us {r['n'] * r['k'] * 2 / r[k] / 1e6:4.2f}TB" for k in keys]
        print(f"{r['shape']:<11} {r['MB']:>6.1f} " + " ".join(f"{c:>15}" for c in cells))
    write_results(args.out, triton=triton.__version__, rows=out)


if __name__ == "__main__":
    main()
