"""The generation loop: scheduler steps through the runner, sync or with lookahead.

Async decode (one-step lookahead), launch first: decode step N+1 is enqueued
on the device before step N is resolved on the host, so the host's collect,
bookkeeping and file writing hide behind the device's forward. At most one
decode step is pending. A prefill that carries the running rows' decode step
(the scheduler's ``beside``) launches that step, then the prefill behind it,
then resolves step N: both stay pending, and the next decode step (the new
rows with it) is launched before they are resolved, so the device never waits
on the host around a refill. A prefill alone (a first wave admitted over
several prefills) is launched the same way, so the host builds the next
prefill while the device computes this one. A decode batch the runner
declares ineligible runs synchronously after the pending steps are resolved
(a drain); so does the end of the input and the moment no decode step can be
built. Without async decode a prefill's decode step runs first, then the
prefill, so both modes batch rows alike.
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
    prefill_ms: list[float] = field(default_factory=list)  # host time per prefill step (with a decode beside it)
    peak_rows: int = 0  # the most rows one decode step ran
    beside: int = 0  # prefill steps that ran beside the running rows' decode step

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
    pending: list = []  # launched steps, resolved in launch order

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

    def resolve(count: int | None = None) -> None:
        """The oldest `count` pending steps (all: None), in launch order."""
        for _ in range(len(pending) if count is None else count):
            p = pending.pop(0)
            handle(p.scheduler_output.requests, runner.execute_resolve(p))

    def launch(decode, prefill=None) -> None:
        """Launch a decode step and a prefill behind it (either may be None), each pending the moment it is on
        the device, so an interrupt or error between the two still resolves what ran; then resolve the steps
        before them."""
        older = len(pending)
        if decode is not None:
            hold(runner.execute_launch(decode))
        if prefill is not None:
            hold(runner.execute_prefill_launch(prefill))
        resolve(older)

    def hold(step) -> None:
        if step is not None:  # None: a step with no rows
            pending.append(step)

    try:
        while True:
            if feed is not None:
                feed.add_waiting(scheduler)
            if not (scheduler.has_work() or pending):
                if feed is not None and feed.wait_for_more():
                    continue
                break
            t0 = time.perf_counter()
            so = scheduler.schedule()
            if so is None:  # every running request waits on the pending step
                resolve()
                continue
            decode = so.beside if so.is_prefill else so
            if decode is not None:
                stats.peak_rows = max(stats.peak_rows, len(decode.requests))
            lookahead = async_decode and decode is not None
            if lookahead and not runner.lookahead_eligible(decode):
                stats.sync_routed += 1
                lookahead = False
            if so.is_prefill and decode is not None:  # the running rows' step, then the prefill behind it
                stats.beside += 1
                if lookahead:  # then step N, while both run
                    launch(decode, so)
                else:
                    resolve()
                    handle(decode.requests, runner.execute(decode))
                    handle(so.requests, runner.execute(so))
            elif lookahead:  # step N+1 first, then step N (and a prefill launched beside it)
                launch(so)
            elif so.is_prefill and async_decode:  # launched, then the steps before it resolved
                launch(None, so)
            else:
                resolve()  # drain
                handle(so.requests, runner.execute(so))
            (stats.prefill_ms if so.is_prefill else stats.step_ms).append((time.perf_counter() - t0) * 1e3)
    finally:
        # on Ctrl-C or an error: the pending steps' completed rows still count
        try:
            resolve()
        except Exception:  # noqa: BLE001  (the original exception is the one to report)
            pass
    return stats
