"""Async decode (one-step lookahead) against synchronous steps, in one run.

Higgs Audio v2 3B shape, random bf16 weights, 64-token prompts, sampling on
(temperature 1, top-k 50, top-p 0.95), each request generating exactly
--frames frames. For each batch size: decode ms/step, audio-s/s over the
whole run (prefill included), the event-query hit rate, and whether async
and sync produced the same codes and logprobs bit for bit. Prints a table and
writes JSON.

  python benchmarks/async_decode.py --batch 1 8 64 --out async_decode.json
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

from benchmarks.higgs_shape import random_lm  # noqa: E402
from omni_cli.loop import run_loop  # noqa: E402
from omni_cli.params import SamplingParams  # noqa: E402
from omni_cli.scheduler import Request, Scheduler  # noqa: E402
from runners.attention import KVCache  # noqa: E402
from runners.engine import Engine  # noqa: E402
from runners.higgs_audio_v2.codec import HiggsCodecDecoder  # noqa: E402
from runners.higgs_audio_v2.runner import HiggsRunner  # noqa: E402

TINY_CODEC = Path(__file__).resolve().parent.parent / "configs/tiny-higgs-audio-v2/codec"


def run(model, codec, batch: int, frames: int, prompt_len: int, max_seq_len: int, async_decode: bool, device):
    cfg = model.cfg
    kv = KVCache(cfg.num_hidden_layers, batch + 1, cfg.num_key_value_heads, max_seq_len, cfg.head_dim, torch.bfloat16, device)
    engine = Engine(model, kv, device)
    engine.use_graphs()
    runner = HiggsRunner(engine, cfg, codec, batch, max_seq_len, device)
    sched = Scheduler(batch, max_seq_len)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_new_frames=frames, min_new_frames=frames)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(batch):
        ids = rng.integers(0, 128000, prompt_len - 1).tolist() + [cfg.audio_bos_token_id]
        reqs.append(Request(rid=f"r{i}", prompt_ids=ids, params=params, seed=1000 + i))
        sched.add(reqs[-1])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    stats = run_loop(sched, runner, lambda r: None, lambda rows, st: None, async_decode)
    wall = time.perf_counter() - t0
    hits, misses = runner.async_query_hit, runner.async_query_miss
    out = {"ms_per_step": float(np.median(stats.step_ms[5:])), "wall_s": wall,
           "audio_s_per_s": batch * (frames - 8) * 0.04 / wall,  # 960 / 24000 s a reverted frame
           "hit_rate": hits / (hits + misses) if hits + misses else None, "hits": hits, "misses": misses,
           "tokens": [np.stack(r.frames) for r in reqs], "logprobs": [np.stack(r.logprobs) for r in reqs]}
    del kv, runner
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode, alternating; medians are reported")
    ap.add_argument("--out", type=Path, default=Path("async_decode.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    codec = HiggsCodecDecoder.load(TINY_CODEC, torch.bfloat16, device)
    model = random_lm("higgs-audio-v2-3b", args.max_seq_len, torch.bfloat16, device)
    run(model, codec, 2, 20, args.prompt_len, args.max_seq_len, True, device)  # warm-up
    rows = []
    for b in args.batch:
        runs = {False: [], True: []}
        for _ in range(args.repeats):  # alternate, so drift hits both modes alike
            for mode in (False, True):
                runs[mode].append(run(model, codec, b, args.frames, args.prompt_len, args.max_seq_len, mode, device))
        sync, lookahead = runs[False][0], runs[True][0]
        same = all(np.array_equal(x, y) for x, y in zip(sync["tokens"], lookahead["tokens"])) and \
            all(np.array_equal(x, y) for x, y in zip(sync["logprobs"], lookahead["logprobs"]))
        med = lambda mode, key: float(np.median([r[key] for r in runs[mode]]))  # noqa: E731
        walls = {m: [r["wall_s"] for r in runs[m]] for m in runs}
        hits = sum(r["hits"] for r in runs[True])
        misses = sum(r["misses"] for r in runs[True])
        rows.append({"batch": b, "sync_ms_per_step": med(False, "ms_per_step"), "async_ms_per_step": med(True, "ms_per_step"),
                     "sync_audio_s_per_s": med(False, "audio_s_per_s"), "async_audio_s_per_s": med(True, "audio_s_per_s"),
                     "speedup_pct": 100 * (np.median(walls[False]) / np.median(walls[True]) - 1),
                     "sync_wall_s": walls[False], "async_wall_s": walls[True],
                     "hit_rate": hits / (hits + misses), "hits": hits, "misses": misses, "bit_identical": same})
    print(f"medians of {args.repeats} runs each")
    print(f"{'batch':>5} {'sync ms/step':>13} {'async ms/step':>14} {'sync aud-s/s':>13} {'async aud-s/s':>14} "
          f"{'speedup':>8} {'hit rate':>9} {'identical':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['sync_ms_per_step']:>13.2f} {r['async_ms_per_step']:>14.2f} "
              f"{r['sync_audio_s_per_s']:>13.2f} {r['async_audio_s_per_s']:>14.2f} {r['speedup_pct']:>7.1f}% "
              f"{100 * r['hit_rate']:>8.1f}% {str(r['bit_identical']):>9}")
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "frames": args.frames, "prompt_len": args.prompt_len, "repeats": args.repeats,
                                    "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
