"""The device's timeline over real decode steps: what runs between the step graphs, and how long the GPU idles.

At the Higgs Audio v2 3B shape (random bf16 weights), for each batch size the
real scheduler loop (async, CUDA graphs) decodes `--frames` frames per
request under torch.profiler. From the trace, over the decode steps (from the
first step graph's first kernel to the last one's end):
  wall      ms per step
  graph     GPU ms per step inside the step graphs (forward, sampling, publish)
  outside   GPU ms per step of kernels and copies launched outside the graphs, and their count
  idle      ms per step when the GPU runs nothing
plus the ops outside the graphs by name, and the graph's kernels by name.
Prints a table and writes JSON.

  python benchmarks/step_timeline.py --batch 1 64 256 --out step_timeline.json
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.bench import random_model, run_requests  # noqa: E402
from benchmarks.timing import DEVICE_CATS, trace_events, write_results  # noqa: E402

def _analyse(events: list[dict], top: int) -> dict:
    graph_corr = {e["args"]["correlation"] for e in events
                  if e.get("cat") == "cuda_runtime" and e.get("name", "").startswith("cudaGraphLaunch")}
    ops = sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    in_graph = [e for e in ops if e["args"].get("correlation") in graph_corr]
    if not in_graph:
        raise SystemExit("no step graph in the trace")
    start, end = in_graph[0]["ts"], max(e["ts"] + e["dur"] for e in in_graph)
    window = [e for e in ops if start <= e["ts"] < end]
    busy, cursor = 0.0, start  # union of the ops' intervals
    for e in window:
        s, t = max(e["ts"], cursor), e["ts"] + e["dur"]
        if t > s:
            busy += t - s
            cursor = t
    steps = len({e["args"]["correlation"] for e in in_graph})  # one graph launch per step
    by_name: dict[tuple[bool, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for e in window:
        key = (e["args"].get("correlation") in graph_corr, e["name"][:80])
        by_name[key][0] += e["dur"]
        by_name[key][1] += 1
    rows = [{"in_graph": g, "name": n, "us_per_step": d / steps, "calls_per_step": c / steps}
            for (g, n), (d, c) in by_name.items()]
    rows.sort(key=lambda r: -r["us_per_step"])
    graph_us = sum(r["us_per_step"] for r in rows if r["in_graph"])
    outside = [r for r in rows if not r["in_graph"]]
    return {"steps": steps, "wall_ms": (end - start) / steps / 1e3, "graph_ms": graph_us / 1e3,
            "outside_ms": sum(r["us_per_step"] for r in outside) / 1e3,
            "outside_ops_per_step": sum(r["calls_per_step"] for r in outside),
            "idle_ms": (end - start - busy) / steps / 1e3,
            "outside": outside[:top], "graph_kernels": [r for r in rows if r["in_graph"]][:top]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path, default=Path("step_timeline.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    max_seq = 64 + args.frames
    ref, model, codec = random_model("higgs-audio-v2-3b", torch.bfloat16, device, max_seq)
    del ref
    torch.cuda.empty_cache()
    run_requests(model, codec, 2, 2, 12, 64, max_seq, True, device)  # compiles the Triton kernels
    results = []
    for b in args.batch:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            res = run_requests(model, codec, b, b, args.frames, 64, max_seq, True, device)
        info = _analyse(trace_events(prof), args.top)
        info.update(batch=b, loop_ms_per_step=res.ms_per_step)
        results.append(info)
        torch.cuda.empty_cache()
    print(f"{'batch':>5} {'steps':>6} {'wall ms':>8} {'graph ms':>9} {'outside ms':>11} {'ops':>5} {'idle ms':>8}")
    for r in results:
        print(f"{r['batch']:>5} {r['steps']:>6} {r['wall_ms']:>8.3f} {r['graph_ms']:>9.3f} {r['outside_ms']:>11.3f} "
              f"{r['outside_ops_per_step']:>5.1f} {r['idle_ms']:>8.3f}")
        for k in r["outside"]:
            print(f"      outside {k['us_per_step']:8.1f} us {k['calls_per_step']:5.1f}x  {k['name']}")
        for k in r["graph_kernels"]:
            print(f"      graph   {k['us_per_step']:8.1f} us {k['calls_per_step']:5.1f}x  {k['name']}")
    write_results(args.out, frames=args.frames, rows=results)


if __name__ == "__main__":
    main()
