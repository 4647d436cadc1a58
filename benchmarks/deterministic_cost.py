"""Cost of --deterministic at the Higgs 3B shape, and its batch invariance, in one run.

Random bf16 weights, 64-token prompts, sampling on (temperature 1, top-k 50,
top-p 0.95), every request generating exactly --frames frames (stream-EOS held
off by min_new_frames). Times every decode step of omni's runner in the
default mode and in deterministic mode, then reruns deterministic mode at
another max batch size and checks that every request's codes and logprobs are
bit-identical. Prints a table and writes JSON.

  python benchmarks/deterministic_cost.py --batch 64 --out results.json
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
from omni_cli.params import SamplingParams  # noqa: E402
from omni_cli.scheduler import Request, Scheduler  # noqa: E402
from runners.attention import KVCache  # noqa: E402
from runners.engine import Engine  # noqa: E402
from runners.higgs_audio_v2 import DETERMINISTIC_SHAPES  # noqa: E402
from runners.higgs_audio_v2.codec import HiggsCodecDecoder  # noqa: E402
from runners.higgs_audio_v2.runner import HiggsRunner  # noqa: E402

TINY_CODEC = Path(__file__).resolve().parent.parent / "configs/tiny-higgs-audio-v2/codec"


def run(model, codec, n_req: int, max_batch: int, frames: int, prompt_len: int, max_seq_len: int,
        deterministic: bool, device) -> dict:
    cfg = model.cfg
    kv = KVCache(cfg.num_hidden_layers, max_batch + 1, cfg.num_key_value_heads, max_seq_len, cfg.head_dim,
                 torch.bfloat16, device)
    engine = Engine(model, kv, device, DETERMINISTIC_SHAPES[device.type] if deterministic else None)
    engine.use_graphs()
    runner = HiggsRunner(engine, cfg, codec, max_batch, max_seq_len, device)
    sched = Scheduler(max_batch, max_seq_len)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_new_frames=frames, min_new_frames=frames)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(n_req):
        ids = rng.integers(0, min(128000, cfg.vocab_size - 16), prompt_len - 1).tolist() + [cfg.audio_bos_token_id]
        reqs.append(Request(rid=f"r{i}", prompt_ids=ids, params=params, seed=1000 + i))
        sched.add(reqs[-1])
    decode_ms, prefill_s = [], 0.0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while sched.has_work():
        so = sched.schedule()
        t = time.perf_counter()
        out = runner.execute(so)  # ends in the step's host collect (a sync)
        dt = time.perf_counter() - t
        if so.is_prefill:
            prefill_s += dt
        elif len(so.requests) == min(max_batch, n_req):
            decode_ms.append(dt * 1e3)
        for r in so.requests:
            if out.outputs[r.rid].finish_reason:
                sched.finish(r, out.outputs[r.rid].finish_reason)
    wall = time.perf_counter() - t0
    del kv, engine, runner
    torch.cuda.empty_cache()
    return {"decode_ms_median": float(np.median(decode_ms[5:])), "decode_ms_p90": float(np.percentile(decode_ms[5:], 90)),
            "prefill_s": prefill_s, "wall_s": wall, "audio_s_per_s": n_req * (frames - 8) * 0.04 / wall,
            "tokens": {r.rid: np.stack(r.frames) for r in reqs}, "logprobs": {r.rid: np.stack(r.logprobs) for r in reqs}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, nargs="+", default=[2048, 512])
    ap.add_argument("--out", type=Path, default=Path("deterministic_cost.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    codec = HiggsCodecDecoder.load(TINY_CODEC, torch.bfloat16, device)
    model = random_lm("higgs-audio-v2-3b", max(args.max_seq_len), torch.bfloat16, device)
    rows = []
    for L in args.max_seq_len:
        base = run(model, codec, args.batch, args.batch, args.frames, args.prompt_len, L, False, device)
        det = run(model, codec, args.batch, args.batch, args.frames, args.prompt_len, L, True, device)
        other = max(args.batch // 4, 1)
        det2 = run(model, codec, args.batch, other, args.frames, args.prompt_len, L, True, device)
        diff = [k for k in det["tokens"] if not (np.array_equal(det["tokens"][k], det2["tokens"][k]) and
                                                  np.array_equal(det["logprobs"][k], det2["logprobs"][k]))]
        same = not diff
        same_default = sum(np.array_equal(base["tokens"][k], det["tokens"][k]) for k in det["tokens"])
        rows.append({
            "max_seq_len": L, "batch": args.batch,
            "default_step_ms": base["decode_ms_median"], "deterministic_step_ms": det["decode_ms_median"],
            "step_cost_pct": 100 * (det["decode_ms_median"] / base["decode_ms_median"] - 1),
            "default_wall_s": base["wall_s"], "deterministic_wall_s": det["wall_s"],
            "wall_cost_pct": 100 * (det["wall_s"] / base["wall_s"] - 1),
            "default_prefill_s": base["prefill_s"], "deterministic_prefill_s": det["prefill_s"],
            f"bit_identical_batch_{args.batch}_vs_{other}": same,
            "requests_differing": len(diff),
        })
    print(f"{'max_seq_len':>11} {'default ms/step':>16} {'determ. ms/step':>16} {'step cost':>10} "
          f"{'wall cost':>10} {'invariant':>10}")
    for r in rows:
        inv = [v for k, v in r.items() if k.startswith("bit_identical")][0]
        print(f"{r['max_seq_len']:>11} {r['default_step_ms']:>16.2f} {r['deterministic_step_ms']:>16.2f} "
              f"{r['step_cost_pct']:>9.1f}% {r['wall_cost_pct']:>9.1f}% {str(inv):>10}")
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "frames": args.frames,
            "prompt_len": args.prompt_len, "rows": rows}
    args.out.write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
