"""The generation loop: scheduler steps through the runner, sync or with lookahead.

Async decode (one-step lookahead), launch first: decode step N+1 is enqueued
on the device before step N is resolved on the host, so the host's collect,
bookkeeping and file writing hide behind the device's forward. At most one
step is pending. A prefill, or a decode batch the runner declares ineligible,
runs synchronously after the pending step is resolved (a drain); so does the
end of the input and the moment no decode step can be built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from omni_cli.scheduler import Request, Scheduler


@dataclass
class LoopStats:
    async_decode: bool
    sync_routed: int = 0  # decode steps sent down the sync path by lookahead_eligible
    step_ms: list[float] = field(default_factory=list)  # host time per decode iteration
    prefill_ms: list[float] = field(default_factory=list)  # host time per prefill step
    peak_rows: int = 0  # the most rows one decode step ran

    def percentiles(self) -> dict[str, float]:
        if not self.step_ms:
            return {}
        a = np.asarray(self.step_ms)
        return {f"p{q}": round(float(np.percentile(a, q)), 3) for q in (50, 90, 99)}


def run_loop(scheduler: Scheduler, runner, on_finished: Callable[[list[Request]], None],
             on_step: Callable[[int, LoopStats], None], async_decode: bool, feed=None) -> LoopStats:
    """Drive until every request has finished; after each step, on_finished(reqs) gets the
    requests that finished in it, in batch order (none: no call). feed (the scoring stage,
    omni_cli/quality/stage.py): requests added while the loop runs (retries), between steps;
    with the scheduler empty the loop ends only once feed.wait_for_more() says none can come."""
    stats = LoopStats(async_decode=async_decode)
    pending = None

    def handle(so_requests, out) -> None:
        on_step(len(out.req_ids), stats)
        done = []
        for req in so_requests:
            got = out.outputs.get(req.rid)
            if got is not None and got.finish_reason is not None:
                scheduler.finish(req, got.finish_reason)
                done.append(req)
        if done:
            on_finished(done)

    def resolve() -> None:
        nonlocal pending
        if pending is not None:
            p, pending = pending, None
            handle(p.scheduler_output.requests, runner.execute_resolve(p))

    try:
        while True:
            if feed is not None:
                feed.add_waiting(scheduler)
            if not (scheduler.has_work() or pending is not None):
                if feed is not None and feed.wait_for_more():
                    continue
                break
            t0 = time.perf_counter()
            so = scheduler.schedule()
            if so is None:  # every running request waits on the pending step
                resolve()
                continue
            if not so.is_prefill:
                stats.peak_rows = max(stats.peak_rows, len(so.requests))
            lookahead = async_decode and not so.is_prefill
            if lookahead and not runner.lookahead_eligible(so):
                stats.sync_routed += 1
                lookahead = False
            if lookahead:
                launched = runner.execute_launch(so)  # step N+1 first ...
                resolve()  # ... then step N
                pending = launched
            else:
                resolve()  # drain
                handle(so.requests, runner.execute(so))
            (stats.prefill_ms if so.is_prefill else stats.step_ms).append((time.perf_counter() - t0) * 1e3)
    finally:
        # on Ctrl-C or an error: the pending step's completed rows still count
        if pending is not None:
            try:
                resolve()
            except Exception:  # noqa: BLE001  (the original exception is the one to report)
                pass
    return stats
