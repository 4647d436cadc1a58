"""Qwen3-TTS's decode step on the GPU, as it stands: ms a frame (talker step + 15 predictor sub-steps
+ 16 draws, one graph replay) at the 0.6B and 1.7B shapes with random bf16 weights, sync and
async, by batch size. A probe for issue 44's targets (0.6B: 1.5 ms a frame at batch 1, 3.0 at 64;
1.7B: 2.5 at batch 1), with --profile's kernel counts; `omni bench --shape qwen3-tts-12hz-*` gives
the same loops against the floor.

The shapes are runners/qwen3_tts/shapes.py's (the released configs' talker and code predictor dims,
laid over configs/tiny-qwen3-tts's config.json).

    python benchmarks/qwen3_step.py --shape 0.6b --batch 1 --batch 64 --out step.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

SHAPES = {"0.6b": "qwen3-tts-12hz-0.6b", "1.7b": "qwen3-tts-12hz-1.7b"}  # --shape -> shapes.py's name


def profile(runner, sched, run_loop, steps: int = 20) -> dict:
    """Kernels a frame and where the GPU's time goes, from torch.profiler over `steps` decode steps."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    count = {"n": 0}

    def stop(n, st):
        count["n"] += 1
        if count["n"] >= steps:
            raise StopIteration

    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        try:
            run_loop(sched, runner, lambda rs: None, stop, False)
        except StopIteration:
            pass
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:30]
    return {"kernels_per_frame": len(events) / steps, "gpu_us_per_frame": sum(sum(v) for v in by_name.values()) / steps,
            "top": [(name[:90], len(v) / steps, sum(v) / steps) for name, v in top]}


def run(shape: str, batches: list[int], frames: int, prompt_len: int, peers: list[str],
        with_profile: bool = False) -> list[dict]:
    from omni_cli.loop import run_loop
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine
    from omni_cli.runners.qwen3_tts.config import GenerationDefaults
    from omni_cli.runners.qwen3_tts.runner import Qwen3Runner
    from omni_cli.runners.qwen3_tts.shapes import shape_config
    from omni_cli.runners.qwen3_tts.talker import Talker
    from omni_cli.runners.sampling.params import SamplingParams
    from omni_cli.scheduler import Request, Scheduler
    from omni_cli.warmup import warm_up_lm

    dev, dtype = torch.device("cuda"), torch.bfloat16
    cfg = shape_config(SHAPES[shape])
    max_seq = prompt_len + frames + 8
    torch.manual_seed(0)
    with torch.device(dev):
        model = Talker(cfg, max_seq).to(dtype)
    model = model.to_runtime(dev, dtype)
    t = cfg.talker
    params = SamplingParams(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, max_new_frames=frames,
                            min_new_frames=frames, subtalker_temperature=0.9, subtalker_top_k=50, subtalker_top_p=1.0)
    rng = np.random.default_rng(0)
    rows = []
    for b in batches:
        for peer in peers:
            kv = KVCache(t.num_hidden_layers, b + 1, t.num_key_value_heads, max_seq, t.head_dim, dtype, dev)
            engine = Engine(model, kv, dev)
            engine.use_graphs()
            runner = Qwen3Runner(engine, cfg, GenerationDefaults(), b, max_seq, dev)
            reqs = [Request(rid=f"r{i}", prompt=rng.integers(0, 150000, prompt_len).tolist(), params=params, seed=i)
                    for i in range(b)]
            warm_up_lm(runner, reqs, max_seq, peer == "async")
            sched = Scheduler(b, max_seq)
            for r in reqs:
                sched.add(r)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            stats = run_loop(sched, runner, lambda rs: None, lambda n, st: None, peer == "async")
            wall = time.perf_counter() - t0
            steps = stats.step_ms[5:]
            rows.append({"shape": shape, "peer": peer, "batch": b, "ms_per_frame": float(np.median(steps)),
                         "audio_s_per_s": b * frames / 12.5 / wall, "frames": frames})
            print(f"{shape:>5} {peer:<6} {b:>5} {rows[-1]['ms_per_frame']:>9.2f} ms/frame "
                  f"{rows[-1]['audio_s_per_s']:>9.1f} audio-s/s", flush=True)
            if with_profile and peer == "sync":
                again = [Request(rid=f"p{i}", prompt=r.prompt, params=params, seed=i) for i, r in enumerate(reqs)]
                sched = Scheduler(b, max_seq)
                for r in again:
                    sched.add(r)
                rows[-1]["profile"] = prof = profile(runner, sched, run_loop)
                print(f"      {prof['kernels_per_frame']:.0f} kernels a frame, {prof['gpu_us_per_frame'] / 1e3:.2f} ms "
                      "of GPU time a frame; top:", flush=True)
                for name, n, us in prof["top"]:
                    print(f"      {us / 1e3:8.3f} ms  {n:6.1f}x  {name}", flush=True)
            del engine, kv, runner
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--peers", default="sync,async")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profile", action="store_true", help="also count kernels and GPU time a frame (sync peer)")
    a = ap.parse_args()
    rows = []
    for shape in a.shape or ["0.6b"]:
        rows += run(shape, a.batch or [1, 8, 64], a.frames, a.prompt_len, a.peers.split(","), a.profile)
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
