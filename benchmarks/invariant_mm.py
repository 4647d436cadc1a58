"""The batch-invariant projection kernel (runners/invariant_mm.py) at the Higgs 3B decode shapes.

Two questions in one run:
- bits: is a row's output the same whatever the call's row count and tile? Every
  (rows, tile) call's rows (tiles of every block size and reduction step the
  sweep tries) are compared with the same rows of a 256-row call and of a
  one-row call. cuBLAS at 1 against 256 rows is the control that can differ
  (it does for o_proj and down); a 16-column reduction step is reported too.
- speed: microseconds per call at 1, 64 and 256 rows, weights L2-cold
  (copies cycled), for each tile, against cuBLAS and today's default kernels.
qkv, o_proj and down run as invariant_mm_parts (k-range partials the next kernel
sums), for each split count of --splits: their tiles are (tile..., splits).
Prints a table and writes JSON (the best tile per shape and row bucket).

  python benchmarks/invariant_mm.py --out invariant_mm.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.runners import fused_gemv, fused_mm  # noqa: E402
from omni_cli.runners.invariant_mm import SPLITS, invariant_mm, invariant_mm_parts  # noqa: E402
from benchmarks.timing import graph_us, write_results  # noqa: E402

H, F_, QKV, HEAD = 3072, 8192, (24 + 16) * 128, 8 * 1026
# name: (n, k, silu_mul, residual: run as partials)
SHAPES = {"qkv": (QKV, H, False, False), "o_proj": (H, H, False, True), "gate_up": (F_, H, True, False),
          "down": (H, F_, False, True), "head": (HEAD, H, False, False)}
ROWS = (1, 16, 64, 256)


def tiles_for(m: int, name: str, splits: list[int]) -> list[tuple]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, TMA) candidates at m rows; (..., splits) for the
    projections run as partials (a TMA box is at most 256 wide)."""
    if m <= 16:
        grid = itertools.product((16,), (32, 64), (128, 256, 512), (4,), (3, 4))
    elif m <= 64:
        grid = itertools.product((64,), (32, 64), (128, 256), (4,), (3, 4))
    else:
        grid = itertools.product((64, 128), (64, 128), (64, 128), (4, 8), (4,))
    tiles = [(*t, tma) for t in grid for tma in (False, True) if not (tma and t[2] > 256)]
    if name not in SPLITS:
        return tiles
    return [(*t, sp) for t in tiles for sp in splits if (SHAPES[name][1] // sp) % t[2] == 0]


def call(x, w, tile, silu_mul=False, residual=None):
    if len(tile) == 7:  # partials (qkv, o_proj, down): their sum is the next kernel's
        return invariant_mm_parts(x, w, kind="down", splits=tile[6], tile=tile[:6])
    return invariant_mm(x, w, tile=tile, silu_mul=silu_mul)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A call's output as integers, a row of the call a row: partials [S, m, n] -> [m, S * n]."""
    t = t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)
    return t.transpose(0, 1).flatten(1) if t.dim() == 3 else t


def fits(x, w, tile, **kw) -> bool:
    try:  # tiles over the shared memory fail to compile
        call(x, w, tile, **kw)
        return True
    except Exception as e:  # noqa: BLE001 (Triton's OutOfResources and compile errors)
        print("skip", tile, type(e).__name__, flush=True)
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("invariant_mm.json"))
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    # bits only: compiles every tile into Triton's disk cache (shapes may run in parallel processes)
    ap.add_argument("--bits-only", action="store_true")
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="row counts timed (1, 16, 64, 256)")
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2], help="k ranges tried for qkv, o_proj, down")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows, best = [], {}
    for name in args.shapes:
        n, k, silu, resid = SHAPES[name]
        wn = 2 * n if silu else n
        copies = max(2, (256 << 20) // (wn * k * 2) + 1)  # > L2, so every call reads its weight from HBM
        ws = [torch.randn(wn, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(256, k, device=dev, dtype=torch.bfloat16)
        res = torch.randn(256, n, device=dev, dtype=torch.bfloat16)
        kw = lambda m: dict(silu_mul=silu, residual=res[:m] if resid else None)  # noqa: E731
        ok = {m: [t for t in tiles_for(m, name, args.splits) if fits(x[:m], ws[0], t, **kw(m))] for m in ROWS}
        # bits: every tile and row count against the one-row call, row 0 and all rows of the widest
        # call, of the same split count (a split count is a projection's constant, not the row count's)
        mismatches = {}
        for sp in sorted({t[6] if len(t) == 7 else 0 for ts in ok.values() for t in ts}):
            tail = (sp,) if sp else ()
            ref = bits(call(x[:1], ws[0], (16, 64, 64, 4, 3, False, *tail), **kw(1)))
            full = bits(call(x, ws[0], (64, 64, 64, 4, 3, False, *tail), **kw(256)))
            for m in ROWS:
                for t in (t for t in ok[m] if (t[6] if len(t) == 7 else 0) == sp):
                    y = bits(call(x[:m], ws[0], t, **kw(m)))
                    bad = int((y != full[:m]).any(dim=1).sum())
                    bad += int(not torch.equal(y[:1], ref))
                    if bad:
                        mismatches[f"{m}:{t}"] = bad
        last = (64, 64, 64, 4, 3, False, *((ok[256][0][6],) if name in SPLITS else ()))
        other_step = call(x, ws[0], (64, 64, 16, *last[3:]), **kw(256))
        cublas = lambda m: F.linear(x[:m], ws[0][:n])  # noqa: E731
        neg = {"kernel_k_step_16_rows_differing": int((bits(other_step) != bits(call(x, ws[0], last, **kw(256))))
                                                      .any(dim=1).sum()),
               "cublas_row0_1_vs_256_differs": not torch.equal(cublas(1)[0], cublas(256)[0])}
        rows.append({"shape": name, "bits_mismatches": mismatches, **neg})
        print(name, "mismatching (rows:tile -> rows)", mismatches or "none", neg, flush=True)
        for m in args.rows if not args.bits_only else ():
            xm = x[:m]
            timings = {}
            for t in ok[m]:
                timings[str(t)] = graph_us(lambda i: call(xm, ws[i % copies], t, **kw(m)), copies)
            tbest = min(timings, key=timings.get)
            base = {"cublas": graph_us(lambda i: F.linear(xm, ws[i % copies]), copies)}
            if m == 1:
                base["gemv"] = graph_us(lambda i: fused_gemv.gemv(xm, ws[i % copies], silu_mul=silu,
                                                                  residual=res[:1] if resid else None), copies)
            if silu and m <= fused_mm.MAX_ROWS:
                base["fused_mm"] = graph_us(lambda i: fused_mm.mm(xm, ws[i % copies], silu_mul=True), copies)
            best[f"{name}:{m}"] = {"tile": tbest, "us": timings[tbest], **base}
            rows.append({"shape": name, "rows": m, "best_tile": tbest, "best_us": timings[tbest], **base,
                         "all_us": timings})
    print(f"{'shape':>8} {'rows':>5} {'invariant us':>13} {'tile':>22} {'cublas us':>10} {'default us':>11}")
    for key, b in best.items():
        name, m = key.split(":")
        default = b.get("gemv", b.get("fused_mm", b["cublas"]))
        print(f"{name:>8} {m:>5} {b['us']:>13.1f} {b['tile']:>22} {b['cublas']:>10.1f} {default:>11.1f}")
    write_results(args.out, best=best, rows=rows)


if __name__ == "__main__":
    main()
