"""The batch-1 decode step three ways at the Higgs Audio v2 3B shape (random bf16 weights).

  gemm      the fused path's cuBLAS GEMMs with separate norm and silu·up kernels
  gemv      runners/fused_gemv.py: six kernels a layer, launched one after another
  gemv+pdl  the same with early launch (runners/device.py: pdl_launch)
  (--tiles / --paired-tiles add gemv+pdl at other tiles of the one-matrix GEMVs
   / of the two-tile ones, --pairs at both: runners/fused_gemv.py TILE / PAIRED_TILE;
   a tile is rows x columns x warps x columns read ahead of the wait)

--variants runs only the named ones; --mm-rows runs each at these values of
runners/fused_mm.py: MAX_ROWS (0: gate/up on cuBLAS and silu_mul at every
batch, for an A/B of that kernel at batch 2..64).

For each batch and variant: the graphed decode forward alone (ms), and the
whole decode step through the scheduler loop (async, median ms; 64-token
prompts, 64 frames). Prints a table and writes JSON; it decides nothing by
itself (runners/fused_gemv.py: MAX_ROWS and runners/device.py: PDL do).

  python benchmarks/gemv_step.py --tiles 8x1024x4 --paired-tiles 4x512x4 --out gemv_step.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import omni_cli.runners.device as device_mod  # noqa: E402
import omni_cli.runners.fused_gemv as fused_gemv  # noqa: E402
import omni_cli.runners.fused_mm as fused_mm  # noqa: E402
from benchmarks.step_profile import _decode_batch, _time_ms  # noqa: E402
from omni_cli.bench import random_model, run_requests  # noqa: E402
from omni_cli.runners.attention import KVCache  # noqa: E402
from omni_cli.runners.engine import Engine  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402

# MAX_ROWS, PDL, TILE, PAIRED_TILE (None: the shipped one)
VARIANTS = {"gemm": (0, False, None, None), "gemv": (1, False, None, None), "gemv+pdl": (1, True, None, None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--tiles", nargs="*", default=[], help="more one-matrix GEMV tiles, e.g. 8x1024x4")
    ap.add_argument("--paired-tiles", nargs="*", default=[], help="more two-tile GEMV tiles, e.g. 4x512x4x1024")
    ap.add_argument("--pairs", nargs="*", default=[], help="both at once, e.g. 4x1024x4x2048/4x512x4x1024")
    ap.add_argument("--variants", nargs="*", default=None, help="only these of the variants (default: all)")
    ap.add_argument("--mm-rows", type=int, nargs="+", default=[fused_mm.MAX_ROWS],
                    help="fused_mm.MAX_ROWS values to run each variant at (0: gate/up on cuBLAS at every batch)")
    ap.add_argument("--kv-len", type=int, default=164, help="keys per row in the timed forward")
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("gemv_step.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    ref, model, codec = random_model("higgs-audio-v2-3b", torch.bfloat16, device, args.max_seq_len)
    del ref
    cfg = model.cfg
    tile = lambda t: tuple(map(int, t.split("x")))  # noqa: E731
    variants = {**VARIANTS, **{f"gemv+pdl tile {t}": (1, True, tile(t), None) for t in args.tiles},
                **{f"gemv+pdl paired {t}": (1, True, None, tile(t)) for t in args.paired_tiles},
                **{f"gemv+pdl {t}": (1, True, *map(tile, t.split("/"))) for t in args.pairs}}
    if args.variants is not None:
        variants = {name: v for name, v in variants.items() if name in args.variants}
    shipped = fused_gemv.TILE, fused_gemv.PAIRED_TILE
    rows = []
    for b, mm_rows, (name, (max_rows, pdl, one, paired)) in itertools.product(args.batch, args.mm_rows,
                                                                             variants.items()):
        fused_gemv.MAX_ROWS, device_mod.PDL, fused_mm.MAX_ROWS = max_rows, pdl, mm_rows
        fused_gemv.TILE, fused_gemv.PAIRED_TILE = one or shipped[0], paired or shipped[1]
        step = run_requests(model, codec, b, b, 64, 64, args.max_seq_len, True, device).ms_per_step
        kv = KVCache(cfg.num_hidden_layers, b + 1, cfg.num_key_value_heads, args.max_seq_len, cfg.head_dim,
                     torch.bfloat16, device)
        engine = Engine(model, kv, device)
        engine.use_graphs()
        fb = _decode_batch(engine, b, args.kv_len, cfg.num_codebooks)
        fwd = _time_ms(lambda: engine.forward(fb), 100)
        rows.append({"batch": b, "variant": name, "mm_rows": mm_rows, "step_ms": step, "graph_forward_ms": fwd})
        print(f"batch {b:>3} {name:<30} mm rows {mm_rows:>3} step {step:6.3f} ms  graphed forward {fwd:6.3f} ms",
              flush=True)
        del engine, kv
        torch.cuda.empty_cache()
    write_results(args.out, kv_len=args.kv_len, rows=rows)


if __name__ == "__main__":
    main()
