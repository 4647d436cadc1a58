"""A one-wave run's tail: the codec stream after the last decode step, in `omni generate` and alone.

In a one-wave run every row finishes at the last step, so the codec's calls
and the files come after the loop (run.json's write_tail_s). At batch 256 the
codec thread's calls took 0.48 s there (f201136), against ~0.22 s that
benchmarks/codec_decode.py's rate gives for the same audio. This script runs
the real command in this process (the random 3B checkpoint of
benchmarks/e2e_generate.py, written once into --root) under torch.profiler's
CUDA tracing, then, in the same process, the same calls alone: the
drain's codec calls (masked, ROWS x 192 frames, bf16) on a thread and stream
of their own, each copied to pinned host memory. For each: from the last
decode-step kernel (in situ) or the first codec kernel (alone) to the last
codec kernel, the span, the codec stream's busy time, its idle gaps (the
longest with the ops around them), the host copies, and the kernels by name
(GPU ms in all), alone also with the op that launched each and its input
shapes. --cudnn-benchmark turns on cuDNN's
benchmark mode for the process (omni generate runs with it off).
Prints a table and writes JSON.

  python benchmarks/drain_timeline.py --rows 256 --batch 256 --root /tmp/e2e_root --out drain_timeline.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.e2e_generate import add_one_wave_args, one_wave_options  # noqa: E402
from benchmarks.timing import DEVICE_CATS, trace_events, write_results  # noqa: E402

CODEC_MARK = "_unit_kernel"  # a kernel only the codec runs: its stream is the codec's


def _trace(prof) -> list[dict]:
    """The trace's device ops by start, each with the op that launched it and its input shapes
    ("op") where the trace has CPU ops (the alone run)."""
    events = trace_events(prof)
    cpu = {e["args"]["External id"]: f"{e['name']} {e['args'].get('Input Dims', '')}" for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    ops = sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    for e in ops:
        e["op"] = cpu.get(e["args"].get("External id"))
    return ops


def _analyse(ops: list[dict], after_lm: bool, top: int) -> dict:
    """The codec stream's ops after the last op of the busiest other stream (after_lm), or all of them."""
    per_stream = defaultdict(list)
    for e in ops:
        per_stream[e["args"].get("stream")].append(e)
    codec = next(s for s, es in per_stream.items() if any(CODEC_MARK in e["name"] for e in es))
    start = None
    if after_lm:
        lm = max((s for s in per_stream if s != codec), key=lambda s: len(per_stream[s]))
        start = max(e["ts"] + e["dur"] for e in per_stream[lm])
    mine = [e for e in per_stream[codec] if start is None or e["ts"] >= start]
    start = mine[0]["ts"] if start is None else start
    end = max(e["ts"] + e["dur"] for e in mine)
    busy, cursor, gaps, where = 0.0, start, [], []
    last = None  # the op that ended last before each gap
    for e in mine:
        if e["ts"] > cursor:
            gaps.append(e["ts"] - cursor)
            where.append({"at_ms": (cursor - start) / 1e3, "ms": (e["ts"] - cursor) / 1e3,
                          "after": last and last["name"][:60], "before": e["name"][:60]})
        s, t = max(e["ts"], cursor), e["ts"] + e["dur"]
        if t > s:
            busy += t - s
            cursor = t
            last = e
    names: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in mine:
        names[(e["name"][:90], e["op"])][0] += e["dur"]
        names[(e["name"][:90], e["op"])][1] += 1
    kernels = sorted(({"name": n, "op": op, "ms": d / 1e3, "count": c} for (n, op), (d, c) in names.items()),
                     key=lambda r: -r["ms"])
    big = [g for g in gaps if g > 500]
    return {"span_ms": (end - start) / 1e3, "busy_ms": busy / 1e3, "ops": len(mine),
            "gaps_over_0_5ms": len(big), "gap_ms_over_0_5ms": sum(big) / 1e3, "gap_ms": sum(gaps) / 1e3,
            "memcpy_ms": sum(e["dur"] for e in mine if e["cat"] == "gpu_memcpy") / 1e3, "kernels": kernels[:top],
            # the longest idle gaps: when (ms from the start), how long, between which ops
            "longest_gaps": sorted(where, key=lambda g: -g["ms"])[:top]}


def _alone(root: Path, rows: int, calls: int) -> tuple[dict, list[dict]]:
    """The drain's calls alone on a thread and stream of their own: (wall s, the profiler's ops)."""
    from omni_cli.runners.device import host_buffer
    from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder

    dev = torch.device("cuda")
    codec = HiggsCodecDecoder.load(root / "codec", torch.bfloat16, dev)
    codes = torch.randint(0, 1024, (rows, 8, 192), device=dev)
    lengths = torch.full((rows,), 192, device=dev)
    out: dict = {}

    def work():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.inference_mode():
            host = None
            for i in range(calls + 1):  # the first call plans and compiles: not profiled
                if i == 1:
                    stream.synchronize()
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                              torch.profiler.ProfilerActivity.CUDA],
                                                  record_shapes=True)
                    prof.__enter__()
                    t0 = time.perf_counter()
                wave = codec.decode(codes, lengths)
                host = host if host is not None else host_buffer(tuple(wave.shape), torch.float32, dev)
                host.copy_(wave, non_blocking=True)
                stream.synchronize()
            out["wall_s"] = time.perf_counter() - t0
            prof.__exit__(None, None, None)
            out["ops"] = _trace(prof)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return {"wall_s": out["wall_s"]}, out["ops"]


def main() -> None:
    ap = argparse.ArgumentParser()
    add_one_wave_args(ap)
    ap.add_argument("--drain-rows", type=int, default=8, help="rows per codec call at the drain (alone)")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="cuDNN's benchmark mode (it times the candidates for each new shape) for the whole process")
    ap.add_argument("--out", type=Path, default=Path("drain_timeline.json"))
    args = ap.parse_args()
    from omni_cli.generate import run_generate

    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    opts = one_wave_options(args.root, "drain", args.rows, args.batch, args.frames)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_generate(opts)
    timings = json.loads((opts.out / "run.json").read_text())["timings"]
    results = {"in_situ": {**_analyse(_trace(prof), True, args.top),
                           **{k: timings[k] for k in ("generate_s", "loop_s", "write_tail_s", "codec_calls",
                                                      "codec_s")}}}
    calls = -(-args.rows // args.drain_rows)
    alone, ops = _alone(args.root, args.drain_rows, calls)
    results["alone"] = {**_analyse(ops, False, args.top), **alone, "calls": calls}
    for name, r in results.items():
        print(f"{name}: span {r['span_ms']:.1f} ms, codec stream busy {r['busy_ms']:.1f} ms in {r['ops']} ops, "
              f"gaps {r['gap_ms']:.1f} ms ({r['gaps_over_0_5ms']} over 0.5 ms: {r['gap_ms_over_0_5ms']:.1f}), "
              f"copies {r['memcpy_ms']:.1f} ms")
        for k in r["kernels"]:
            op = f"\n{'':22}{k['op'][:150]}" if k["op"] else ""  # alone: what launched it, its shapes
            print(f"    {k['ms']:8.2f} ms {k['count']:5d}x  {k['name']}{op}")
        for g in r["longest_gaps"][:6]:
            print(f"    gap {g['ms']:7.2f} ms at {g['at_ms']:7.1f} ms, after {g['after']} / before {g['before']}")
    print(json.dumps({k: results["in_situ"][k] for k in ("generate_s", "loop_s", "write_tail_s", "codec_s")}))
    write_results(args.out, rows=args.rows, batch=args.batch, frames=args.frames, drain_rows=args.drain_rows,
                  cudnn_benchmark=args.cudnn_benchmark, **results)


if __name__ == "__main__":
    main()
