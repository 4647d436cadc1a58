"""The warm-up (omni_cli/warmup.py) on the CPU: it reaches every decode row bucket and leaves no trace.

Its throwaway rows use the slots real rows take next; whatever state they
left behind (sampled history, delay counters, KV, sampling tables, staging)
would show as a difference from a runner that never warmed up.
"""

from __future__ import annotations

import numpy as np
import pytest

from omni_cli.loop import run_loop
from omni_cli.runners.prompt_input import PromptInput
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from omni_cli.warmup import warm_up_lm
from tests.audio_controls import change_one_frame, max_lsb
from tests.test_async import TEXTS, _tiny_model, _tiny_runner

PARAMS = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.3, ras_win_len=4, max_new_frames=40)


def _run(runner, prompts, config, async_decode: bool) -> list[Request]:
    sched = Scheduler.for_runner(runner, config.max_seq_len)
    reqs = [Request(rid=f"r{i}", prompt=prompts.build(t, config.system_prompt, None), params=PARAMS, seed=i)
            for i, t in enumerate(TEXTS[:7])]
    for r in reqs:
        sched.add(r)
    run_loop(sched, runner, lambda rs: None, lambda n, st: None, async_decode)
    return reqs


@pytest.mark.parametrize("async_decode", [True, False], ids=["async", "sync"])
def test_warm_up_reaches_every_bucket_and_changes_no_output(tmp_path, eos_ckpt, async_decode):
    (warmed_model, config), (cold_model, _) = (_tiny_model(eos_ckpt, tmp_path, max_batch_size=6, deterministic=False)
                                               for _ in range(2))
    warmed, cold, prompts = warmed_model.runner, cold_model.runner, warmed_model.prompts.builder
    for r in (warmed, cold):
        r.engine.use_graphs(capture=False)  # decode padded to row buckets, as CUDA graphs are
    # as omni generate passes them: the queue's first rows (more than the 6 slots here)
    queued = [Request(rid=f"q{i}", prompt=prompts.build(t, config.system_prompt, None), params=PARAMS, seed=5)
              for i, t in enumerate(TEXTS[2:7] + TEXTS[:2])]
    warm_up_lm(warmed, queued, config.max_seq_len, async_decode)
    assert {key[0] for key in warmed.engine.graphs._entries} == {1, 2, 4, 8}  # 6 slots: buckets 1 .. 8
    assert warmed.async_query_hit == warmed.async_query_miss == 0
    warmed_model.codec.warm(PARAMS.max_new_frames, warmed.num_slots, batched=False)
    got, want = _run(warmed, prompts, config, async_decode), _run(cold, prompts, config, async_decode)
    for a, b in zip(got, want):
        assert a.finish_reason == b.finish_reason
        np.testing.assert_array_equal(a.frames.array, b.frames.array)
        np.testing.assert_array_equal(a.logprobs.array, b.logprobs.array)
    tokens = [r.frames.array for r in got]
    warm_audio = warmed_model.codec.decode(tokens, batched=False)
    for a, b in zip(warm_audio, cold_model.codec.decode(tokens, batched=False)):
        np.testing.assert_array_equal(a, b)
    # control: the cold codec's audio of one row's codes with one frame changed is not equal
    row = max(range(len(tokens)), key=lambda i: len(tokens[i]))
    changed = cold_model.codec.decode([change_one_frame(tokens[row])], batched=False)[0]
    assert max_lsb(changed, warm_audio[row]) > 0


def test_warm_up_prefills_the_queued_rows_prompts(tmp_path, eos_ckpt):
    """The wide prefill takes the first rows' own prompts (their shapes and shared prefix are
    the run's first prefill's); a prompt with no room for the warm-up's frames, and slots
    beyond the queue, take the template's."""
    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path, max_batch_size=6, deterministic=False)
    queued = [Request(rid=f"q{i}", prompt=prompts.build(t, config.system_prompt, None), params=PARAMS, seed=5)
              for i, t in enumerate(TEXTS[:4])]
    queued[2].prompt = PromptInput(queued[2].prompt_ids[:1] * (config.max_seq_len - 1))  # fits 1 frame, not the warm-up's
    seen: list[list[list[int]]] = []
    forward = runner.engine.forward
    runner.engine.forward = lambda fb, *a, **k: (seen.append(fb.prompts_cpu) if fb.is_prefill else None,
                                                 forward(fb, *a, **k))[1]
    warm_up_lm(runner, queued, config.max_seq_len, False)
    template = queued[0].prompt_ids
    want = [queued[0].prompt_ids, queued[1].prompt_ids, template, queued[3].prompt_ids, template, template]
    assert sorted(p for batch in seen[:-1] for p in batch) == sorted(want)  # the wide batch, in prefills
    assert seen[-1] == [template]  # then the one-row prefill
