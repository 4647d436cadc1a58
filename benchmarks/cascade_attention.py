"""Decode attention with shared voice prefixes at the Higgs Audio v2 3B shape (24 query heads, 8 KV
heads, head_dim 128, bf16, 16-position blocks), one layer, replayed from a CUDA graph.

Rows of --rows; each row's prompt opens with its voice's --shared positions (row i clones voice i mod V)
and has --own positions of its own (its text and the frames so far). Per V, microseconds a call:
  per-row   no plan: every row reads its voice's blocks itself
  after     cascade, the per-row kernel continuing from the group's partials (cascade_attention.BESIDE False)
  beside    cascade, the group's kernel on a side stream beside the per-row kernel, then the merge
and "plain": the same rows without voices (--own positions each), the no-reference step's attention.
Each call is timed L2-cold (a 256 MB buffer written between replays), as inside a decode step.
Prints a table and writes JSON.

  python benchmarks/cascade_attention.py --voices 4 64 --out cascade_attention.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import omni_cli.runners.cascade_attention as ca  # noqa: E402
from omni_cli.runners.decode_attention import decode_attention  # noqa: E402
from omni_cli.runners.kv_blocks import cascade_plan  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402

BS, H, KVH, D = 16, 24, 8, 128


def layout(rows: int, voices: int, shared: int, own: int):
    """Block tables: voice v's blocks first, then each row's own -> (table [rows + 1, width] int32, lengths,
    prompt blocks a row may share, blocks used)."""
    vb = shared // BS if voices else 0
    ob = -(-own // BS)
    tables, nxt = [], voices * vb
    for i in range(rows):
        head = list(range((i % voices) * vb, (i % voices + 1) * vb)) if voices else []
        tables.append(head + list(range(nxt, nxt + ob)))
        nxt += ob
    width = max(len(t) for t in tables)
    table = np.full((rows + 1, width), nxt, dtype=np.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    return table, [vb * BS + own] * rows, [vb] * rows, nxt + 1


def time_us(fn, flush: torch.Tensor, iters: int) -> float:
    graph = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()  # the layer's keys leave L2, as after a step's other kernels
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--voices", type=int, nargs="+", default=[4, 64])
    ap.add_argument("--shared", type=int, default=336, help="a voice's prompt positions (a multiple of 16)")
    ap.add_argument("--own", type=int, default=130)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    results = []
    for voices in [0, *args.voices]:
        table_np, lengths, shareable, blocks = layout(args.rows, voices, args.shared, args.own)
        kc = torch.randn(blocks, KVH, BS, D, device=dev, dtype=torch.bfloat16, generator=g)
        vc = torch.randn(blocks, KVH, BS, D, device=dev, dtype=torch.bfloat16, generator=g)
        table = torch.from_numpy(table_np).to(dev)
        slots = torch.arange(args.rows, device=dev)
        lens = torch.tensor(lengths, device=dev)
        q = torch.randn(args.rows, 1, H, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2)
        row = {"voices": voices, "per_row_us": time_us(lambda: decode_attention(q, kc, vc, table, slots, lens),
                                                       flush, args.iters)}
        plan = cascade_plan(table_np, list(range(args.rows)), shareable, BS) if voices else None
        if plan is not None:
            inputs = ca.to_device(plan, dev)
            outs = {}
            for beside in (False, True):
                ca.BESIDE = beside
                name = "beside" if beside else "after"
                row[f"{name}_us"] = time_us(lambda: decode_attention(q, kc, vc, table, slots, lens, cascade=inputs),
                                            flush, args.iters)
                outs[name] = decode_attention(q, kc, vc, table, slots, lens, cascade=inputs)
            ref = decode_attention(q, kc, vc, table, slots, lens).float()
            row["max_diff_after"] = (outs["after"].float() - ref).abs().max().item()
            row["max_diff_beside"] = (outs["beside"].float() - ref).abs().max().item()
        results.append(row)
    print(f"{'voices':>6} {'per-row us':>11} {'after us':>9} {'beside us':>10}  (rows {args.rows}, "
          f"shared {args.shared}, own {args.own}, {torch.cuda.get_device_name()})")
    for r in results:
        print(f"{r['voices'] or 'plain':>6} {r['per_row_us']:>11.1f} {r.get('after_us', float('nan')):>9.1f} "
              f"{r.get('beside_us', float('nan')):>10.1f}")
    if args.out:
        write_results(args.out, args=vars(args) | {"out": str(args.out)}, results=results)


if __name__ == "__main__":
    main()
