"""Shared by the benchmark scripts: calls replayed from one CUDA graph (as omni generate replays
the codec's calls), the median of synchronized eager calls, and the JSON every script writes."""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path

import torch


def write_results(path: Path, **payload) -> None:
    """A script's JSON: the device (the host's CPU without one) and torch it ran on, then its own fields."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, **payload}, indent=2))


def median_ms(fn, iters: int) -> float:
    """Median milliseconds of fn() over `iters` calls, each timed alone (synchronized), after one
    untimed call (compiles, cuDNN plans, allocations)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_us(fn, calls: int, iters: int = 20) -> float:
    """Microseconds per call of fn(i), i = 0..calls-1, captured once and replayed `iters` times."""
    for i in range(calls):  # compile, pick kernels, allocate
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * calls)
