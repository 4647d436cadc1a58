"""Decode attention at the 3B shape: the shipped tile against other tiles of the same kernel.

The step profile puts the decode-attention kernel at 0.50 ms of a batch-64
forward (28 layers) for ~1.2 GB of KV reads, about twice what those bytes
take at full bandwidth. This probe times the kernel of
runners/decode_attention.py on one layer's slot cache (H 24, KVH 8, D 128)
at a few (keys per block, warps, pipeline stages), from a CUDA graph, at
batch 1, 64 and 256 and 164 / 1024 keys per row, and checks each against the
shipped tile's output. It changes nothing: a block size is part of a row's
arithmetic (it sets where the online softmax rescales), so choosing another
one is a numerics change to make deliberately. Prints a table, writes JSON.

  python benchmarks/attention_probe.py --out attention_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import graph_us, write_results  # noqa: E402
from runners.decode_attention import BLOCK_N, _decode_attention_kernel  # noqa: E402

TILES = [(BLOCK_N, 4, 3), (32, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 3), (64, 4, 1), (256, 8, 2)]


def run(q, kc, vc, slots, lengths, block: int, warps: int, stages: int) -> torch.Tensor:
    b, h, _, d = q.shape
    out = torch.empty((b, 1, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)
    _decode_attention_kernel[(b, kc.shape[1])](
        q, kc, vc, out, slots, lengths, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), d ** -0.5,
        REP=h // kc.shape[1], REP_PAD=16, D=d, BLOCK=block, USE_DOT=True, num_warps=warps, num_stages=stages)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("attention_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for batch in (1, 64, 256):
        for keys in (164, 1024):
            kc = torch.randn(batch + 1, 8, 2048, 128, device=dev, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            q = torch.randn(batch, 1, 24, 128, device=dev, dtype=torch.bfloat16).transpose(1, 2)
            slots = torch.randperm(batch, device=dev)
            lengths = torch.full((batch,), keys, device=dev)
            ref = run(q, kc, vc, slots, lengths, *TILES[0])
            mb = batch * 8 * keys * 128 * 2 * 2 / 2**20
            row = {"batch": batch, "keys": keys, "kv_MB_per_layer": mb}
            for tile in TILES:
                name = "x".join(map(str, tile))
                try:
                    err = float((run(q, kc, vc, slots, lengths, *tile).float() - ref.float()).abs().max())
                    row[name] = {"us": graph_us(lambda i: run(q, kc, vc, slots, lengths, *tile), 28), "max_diff": err}
                except (RuntimeError, triton.CompilationError) as e:  # e.g. out of shared memory
                    row[name] = {"error": str(e)[:200]}
            rows.append(row)
            del kc, vc
            torch.cuda.empty_cache()
    names = ["x".join(map(str, t)) for t in TILES]
    print(f"{'batch':>5} {'keys':>5} {'MB':>7} " + " ".join(f"{n + ' (blk x warps x stages)' if i == 0 else n:>12}"
                                                      for i, n in enumerate(names)))
    for r in rows:
        cells = [f"{r[n]['us']:7.1f}us" if "us" in r[n] else "  error" for n in names]
        print(f"{r['batch']:>5} {r['keys']:>5} {r['kv_MB_per_layer']:>7.1f} " + " ".join(f"{c:>12}" for c in cells))
    write_results(args.out, triton=triton.__version__, rows=rows)


if __name__ == "__main__":
    main()
