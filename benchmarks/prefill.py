"""Prefill forward time at the Higgs Audio v2 3B shape: ours fused, ours plain, transformers.

Random bf16 weights shared by all of them (omni_cli.bench.random_model). For
each batch size, B prompts of --prompt-len tokens go through one prefill
forward into KV slots 0..B-1: our fused CUDA path (runners/higgs_audio_v2/
model.py ``_prefill_fused``), the same replayed as a CUDA graph where the
batch is small enough (runners/cuda_graphs.py: PrefillGraphs; "eager" where
it is not), our plain modules (the CPU's and deterministic mode's path),
and transformers' forward over the same ids (its logits at
every position, as its prefill computes). Reported per batch: the first
call's ms (a fresh process's first use of each shape) and the median of
--repeat later calls, each synchronised, against the compute floor
(2 x a token's matmul parameters x tokens at 801 TFLOP/s, the measured bf16
ceiling). With --cached-prefix P every prompt's first P positions are in its
slot before the timed forwards (a refill after a cached system prompt:
runners/engine.py), which run the prompt-len tokens after them (eagerly: prefill
graphs start at position 0); transformers and the plain modules then run the
whole prompts. --graph-tokens sets the largest graph (runners/cuda_graphs.py).
Prints a table and writes JSON.

  python benchmarks/prefill.py --batch 1 8 64 256 --out prefill.json
  python benchmarks/prefill.py --batch 8 16 32 64 --cached-prefix 64 --out prefill_cached.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.bench import H200_FLOPS, random_model  # noqa: E402
from omni_cli.runners import cuda_graphs  # noqa: E402
from omni_cli.runners.attention import KVCache  # noqa: E402
from omni_cli.runners.engine import Engine, ForwardBatch  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import param_counts  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def _timed(fn, repeat: int) -> tuple[float, float]:
    """(first call ms, median of the next `repeat` calls ms), each call synchronised."""
    times = []
    for _ in range(repeat + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[0], float(np.median(times[1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cached-prefix", type=int, default=0, help="positions of every prompt already cached")
    ap.add_argument("--graph-tokens", type=int, default=cuda_graphs.PREFILL_GRAPH_TOKENS)
    ap.add_argument("--out", type=Path, default=Path("prefill.json"))
    args = ap.parse_args()
    cuda_graphs.PREFILL_GRAPH_TOKENS = args.graph_tokens
    dev = torch.device("cuda")
    ref, model = random_model("higgs-audio-v2-3b", torch.bfloat16, dev, 512)
    cfg = model.cfg
    kv = KVCache(cfg.num_hidden_layers, max(args.batch) + 1, cfg.num_key_value_heads, 512, cfg.head_dim,
                 torch.bfloat16, dev)
    engine = Engine(model, kv, dev)
    graphed = Engine(model, kv, dev)
    graphed.use_graphs()  # small prefills replay a CUDA graph (runners/cuda_graphs.py: PrefillGraphs)
    _, matmul_params = param_counts(cfg)  # a step's matmul weights: attention and one MLP per layer, the head
    rng = np.random.default_rng(0)
    rows = []
    for b in args.batch:
        t, p = args.prompt_len, args.cached_prefix
        ids = torch.from_numpy(rng.integers(0, cfg.audio_bos_token_id - 16, (b, p + t))).to(dev)
        ids[:, :p] = ids[0, :p]

        def batch(cached: bool) -> ForwardBatch:  # the host ids let a small prefill replay a graph
            return ForwardBatch(is_prefill=True, rids=[f"r{i}" for i in range(b)], slots_gpu=torch.arange(b, device=dev),
                                lengths_cpu=[p + t] * b, steps_cpu=[0] * b,
                                steps_gpu=torch.zeros(b, dtype=torch.int64, device=dev),
                                positions_gpu=torch.arange(p + t, device=dev).expand(b, p + t),
                                model_inputs={"input_ids": ids}, prompts_cpu=ids.tolist(),
                                cached_cpu=[p] * b if cached else [])

        fb, whole = batch(True), batch(False)
        engine.forward(whole)  # the prefix's keys into every slot (both engines share the cache)

        def plain():
            model.fused = False  # prefill through the plain modules (decode is not run here)
            try:
                engine.forward(whole)
            finally:
                model.fused = True

        def peer():
            with torch.inference_mode():
                ref(input_ids=ids, attention_mask=torch.ones_like(ids))

        floor = 1e3 * 2 * matmul_params * b * t / H200_FLOPS
        row = {"batch": b, "prompt_len": t, "cached_prefix": p, "floor_ms": round(floor, 2)}
        paths = [("fused", lambda: engine.forward(fb)), ("graphed", lambda: graphed.forward(fb))]
        built = set(graphed.prefill_graphs._entries)
        for name, fn in paths + [("plain", plain), ("transformers", peer)]:
            first, steady = _timed(fn, args.repeat)
            row[f"{name}_first_ms"], row[f"{name}_ms"] = round(first, 2), round(steady, 2)
        row["graph_replayed"] = bool(set(graphed.prefill_graphs._entries) - built)  # this batch's bucket
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'batch':>5} {'cached':>6} {'tokens':>7} {'fused ms':>9} {'(first)':>8} {'graphed ms':>11} {'(first)':>8} "
          f"{'plain ms':>9} {'(first)':>8} {'transformers ms':>16} {'floor ms':>9} {'fused of floor':>15}")
    for r in rows:
        graph = f"{r['graphed_ms']:>11.2f} {r['graphed_first_ms']:>8.1f}" if r["graph_replayed"] else f"{'eager':>11} {'':>8}"
        print(f"{r['batch']:>5} {r['cached_prefix']:>6} {r['batch'] * r['prompt_len']:>7} {r['fused_ms']:>9.2f} "
              f"{r['fused_first_ms']:>8.1f} {graph} {r['plain_ms']:>9.2f} {r['plain_first_ms']:>8.1f} "
              f"{r['transformers_ms']:>16.2f} {r['floor_ms']:>9.2f} {r['floor_ms'] / r['fused_ms']:>15.2f}")
    write_results(args.out, rows=rows)


if __name__ == "__main__":
    main()
