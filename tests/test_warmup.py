"""The warm-up (omni_cli/warmup.py) on the CPU: it reaches every decode row bucket and leaves no trace.

Its throwaway rows use the slots real rows take next; whatever state they
left behind (sampled history, delay counters, KV, sampling tables, staging)
would show as a difference from a runner that never warmed up.
"""

from __future__ import annotations

import numpy as np
import pytest

from omni_cli.loop import run_loop
from omni_cli.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from omni_cli.warmup import warm_up_lm
from tests.test_async import TEXTS, _tiny_runner

PARAMS = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.3, ras_win_len=4, max_new_frames=40)


def _run(runner, prompts, config, async_decode: bool) -> list[Request]:
    sched = Scheduler(runner.num_slots, config.max_seq_len)
    reqs = [Request(rid=f"r{i}", prompt_ids=prompts.build(t, config.system_prompt, None), params=PARAMS, seed=i)
            for i, t in enumerate(TEXTS[:7])]
    for r in reqs:
        sched.add(r)
    run_loop(sched, runner, lambda rs: None, lambda n, st: None, async_decode)
    return reqs


@pytest.mark.parametrize("async_decode", [True, False], ids=["async", "sync"])
def test_warm_up_reaches_every_bucket_and_changes_no_output(tmp_path, eos_ckpt, async_decode):
    warmed, prompts, config = _tiny_runner(eos_ckpt, tmp_path, max_batch_size=6, deterministic=False)
    cold, _, _ = _tiny_runner(eos_ckpt, tmp_path, max_batch_size=6, deterministic=False)
    for r in (warmed, cold):
        r.engine.use_graphs(capture=False)  # decode padded to row buckets, as CUDA graphs are
    template = Request(rid="t", prompt_ids=prompts.build(TEXTS[2], config.system_prompt, None), params=PARAMS, seed=5)
    warm_up_lm(warmed, template, config.max_seq_len, async_decode)
    assert {key[0] for key in warmed.engine.graphs._entries} == {1, 2, 4, 8}  # 6 slots: buckets 1 .. 8
    assert warmed.async_query_hit == warmed.async_query_miss == 0
    warmed.warm_codec(PARAMS.max_new_frames, warmed.num_slots, batched=False)
    got, want = _run(warmed, prompts, config, async_decode), _run(cold, prompts, config, async_decode)
    for a, b in zip(got, want):
        assert a.finish_reason == b.finish_reason
        np.testing.assert_array_equal(a.frames.array, b.frames.array)
        np.testing.assert_array_equal(a.logprobs.array, b.logprobs.array)
    tokens = [r.frames.array for r in got]
    for a, b in zip(warmed.decode_audio(tokens, batched=False), cold.decode_audio(tokens, batched=False)):
        np.testing.assert_array_equal(a, b)
