"""Decode attention at the 3B shape: the multi-row kernel's tiles, L2-cold.

A step reads each layer's keys and values once, and 28 layers of them do
not fit the H200's L2, so one call per layer of 28 separate caches, captured
in one CUDA graph, is timed (µs per layer call): the step's situation. (A
probe that calls one layer's cache 28 times reads 41 MB per call from L2 at
64 rows x 164 keys and reports 12 µs for what the step profile puts at
17.7.) Variants, each checked against the first's output: "rows BxW" is
runners/decode_attention.py's multi-row kernel (one program per (row, KV
head)) at B keys a block and W warps. Prints a table, writes JSON.

  python benchmarks/attention_probe.py --batch 64 256 --keys 100 164 264 --out attention_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import graph_us, write_results  # noqa: E402
from omni_cli.runners.decode_attention import _decode_attention_kernel  # noqa: E402

LAYERS, KVH, H, D = 28, 8, 24, 128
VARIANTS = ["rows 32x4", "rows 64x4", "rows 32x2", "rows 64x2"]


def run(name: str, q, kc, vc, slots, lengths) -> torch.Tensor:
    b = q.shape[0]
    out = torch.empty((b, 1, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    block, warps = (int(x) for x in name.split()[1].split("x"))
    _decode_attention_kernel[(b, KVH)](
        q, kc, vc, out, slots, lengths, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), D ** -0.5, REP=H // KVH, REP_PAD=16, D=D, BLOCK=block,
        USE_DOT=True, num_warps=warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--keys", type=int, nargs="+", default=[100, 164, 264])
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--out", type=Path, default=Path("attention_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for batch in args.batch:
        cap = max(args.keys)
        # per layer [slots, KVH, cap, D]: the slot cache's layout; one slot more than rows, as the engine's
        kcs = [torch.randn(batch + 1, KVH, cap, D, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
        vcs = [torch.randn_like(k) for k in kcs]
        q = torch.randn(batch, 1, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        slots = torch.randperm(batch + 1, device=dev)[:batch].contiguous()
        for keys in args.keys:
            lengths = torch.full((batch,), keys, device=dev, dtype=torch.int32)
            ref = run(args.variants[0], q, kcs[0], vcs[0], slots, lengths).float()
            mb = batch * KVH * keys * D * 2 * 2 / 2**20
            row = {"batch": batch, "keys": keys, "kv_MB_per_layer": mb}
            for name in args.variants:
                err = float((run(name, q, kcs[0], vcs[0], slots, lengths).float() - ref).abs().max())
                us = graph_us(lambda i: run(name, q, kcs[i], vcs[i], slots, lengths), LAYERS)
                row[name] = {"us": us, "TB_per_s": mb * 2**20 / us / 1e6, "max_diff": err}
            rows.append(row)
            print(f"batch {batch:>4} keys {keys:>4} ({mb:6.1f} MB a layer): " + "  ".join(
                f"{n} {row[n]['us']:6.2f}us {row[n]['TB_per_s']:.2f}TB/s d{row[n]['max_diff']:.0e}"
                for n in args.variants), flush=True)
        kcs = vcs = None  # freed before the next batch size's caches
        torch.cuda.empty_cache()
    write_results(args.out, triton=triton.__version__, layers=LAYERS, rows=rows)


if __name__ == "__main__":
    main()
