"""Warm-up: pay a process's first-use device costs before the first real row.

On CUDA the first prefill of a process, the first decode step at each row
bucket (each captures a CUDA graph) and the codec's first call at each shape
cost far more than later ones: lazy kernel loading, cuBLAS set-up, cuDNN
plans (BENCHMARKS.md, warm-up). Paid inside the loop, they stall every running
row; paid here they are startup time (run.json's ``warmup_s``).

The warm-up runs throwaway requests through the real scheduler, runner and
loop, with the first real row's sampling parameters (the graphs are keyed by
them) and the first real rows' prompts (a prefill's shapes follow its
prompts, and the part they share: runners/engine.py), so it warms exactly
the paths the run takes. The
throwaway rows use the slots that real rows take next, and leave nothing
behind: a request's prefill rewrites every piece of its slot's state.
"""

from __future__ import annotations

from dataclasses import replace

from omni_cli.loop import run_loop
from omni_cli.scheduler import Request, Scheduler


def warm_up_lm(runner, queued: list[Request], max_seq_len: int, async_decode: bool) -> None:
    """Prefill at the run's widest batch and at one row, and a decode step at every row bucket.

    ``queued``: the run's first rows; the first is the template. Row i of the
    wide batch takes queued row i's prompt (the template's where there is
    none, or where the warm-up's frames would not fit after it) and runs
    2 + L - bit_length(i) frames (L that of the last row), so the running set
    halves step by step, from every slot down to one: a decode step at each
    power-of-two bucket."""
    rows = runner.num_slots
    depth = (rows - 1).bit_length()
    template = queued[0]

    def request(i: int, frames: int) -> Request:  # no more frames than the template's (its KV fits)
        params = replace(template.params, max_new_frames=min(frames, template.params.max_new_frames),
                         min_new_frames=0)
        prompt = queued[i].prompt if i < len(queued) else template.prompt  # its tracks and audio, not just ids
        if len(prompt) + params.max_new_frames > max_seq_len:
            prompt = template.prompt
        return Request(rid=f"warm-up-{i}", prompt=prompt, params=params, seed=template.seed)

    for batch in ([request(i, 2 + depth - i.bit_length()) for i in range(rows)], [request(0, 1)]):
        scheduler = Scheduler.for_runner(runner, max_seq_len)
        for r in batch:
            scheduler.add(r)
        run_loop(scheduler, runner, lambda reqs: None, lambda n, stats: None, async_decode)
    runner.async_query_hit = runner.async_query_miss = 0  # the run's counters start here
    if runner.step_trace is not None:
        runner.step_trace.clear()
    if runner.kv_blocks is not None:  # and its prefix cache: the warm-up's blocks change no row's output
        runner.kv_blocks.forget()
