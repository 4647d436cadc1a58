"""When the device ran each launched step, and how long the loop's stream sat idle between steps.

Off unless a run asks for it (OMNI_TRACE_STEPS=1: benchmarks/e2e_generate.py --trace-steps): each
launched decode step and prefill is bracketed by two timing events on the loop's stream, and at the
end of the run the pairs give each step's device time and the gap from one step's end to the next
one's start, which is time the stream had nothing queued: the host was late to launch. A
synchronous step (a drain) breaks the chain, so no gap spans it. On the CPU there is nothing to time.

This answers "does anything beside the loop (the scoring thread, the writers) delay the loop's
launches?": the gaps grow if it does, while a step slowed by other work on the device (the same
GPU's SMs shared) shows in the step's own time instead.
"""

from __future__ import annotations

import os

import numpy as np
import torch

ENV = "OMNI_TRACE_STEPS"


class StepTrace:
    def __init__(self) -> None:
        self._steps: list[tuple[torch.cuda.Event, torch.cuda.Event, bool] | None] = []

    @classmethod
    def from_env(cls, device: torch.device) -> "StepTrace | None":
        """A trace when the environment asks for one and there is a CUDA device to time; else None."""
        return cls() if device.type == "cuda" and os.environ.get(ENV, "") not in ("", "0") else None

    def start(self) -> torch.cuda.Event:
        # NOTE: an event allocated a step, on the hot path; only while tracing
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self, start: torch.cuda.Event, prefill: bool) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._steps.append((start, event, prefill))

    def gap_break(self) -> None:
        """A step that was not traced ran on the stream: the next gap is not measured."""
        if self._steps and self._steps[-1] is not None:
            self._steps.append(None)

    def clear(self) -> None:
        self._steps.clear()

    def summary(self) -> dict | None:
        """Device ms of the decode steps and the prefills, the gaps between traced steps: p50/p90/p99
        and their sum, and the gaps' share of the traced span. Waits for the last step."""
        steps = [s for s in self._steps if s is not None]
        if not steps:
            return None
        steps[-1][1].synchronize()
        decode = [a.elapsed_time(b) for a, b, prefill in steps if not prefill]
        prefill = [a.elapsed_time(b) for a, b, prefill in steps if prefill]
        gaps = [prev[1].elapsed_time(nxt[0]) for prev, nxt in zip(self._steps, self._steps[1:])
                if prev is not None and nxt is not None]
        span = steps[0][0].elapsed_time(steps[-1][1])

        def pct(values: list[float]) -> dict:
            if not values:
                return {}
            a = np.asarray(values)
            return {f"p{q}": round(float(np.percentile(a, q)), 3) for q in (50, 90, 99)}

        return {"decode_steps": len(decode), "decode_ms": pct(decode), "prefills": len(prefill),
                "prefill_ms": pct(prefill), "gaps": len(gaps), "gap_ms": pct(gaps),
                "gap_s": round(sum(gaps) / 1e3, 4), "span_s": round(span / 1e3, 4),
                "idle_share": round(sum(gaps) / span, 4) if span > 0 else None}
