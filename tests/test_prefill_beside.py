"""Prefill beside decode: a refill carries the running rows' decode step, which the loop launches
first and the prefill behind it (omni_cli/scheduler.py ``beside``, omni_cli/loop.py), on the CPU.

The oracle for the rows' bytes is the synchronous drain path (no ``beside``: every prefill runs
after the running rows' steps, alone), which tests/test_seeded.py holds to the one-row run; under
--deterministic a row's bits do not depend on which steps it shared.
"""

from __future__ import annotations

import numpy as np
import pytest

from omni_cli.loop import run_loop
from omni_cli.runners.prompt_input import PromptInput
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from tests.test_async import TEXTS, _tiny_runner


def _request(rid: str, frames: int) -> Request:
    return Request(rid=rid, prompt=PromptInput(ids=[1, 2, 3]), params=SamplingParams(max_new_frames=frames), seed=0)


@pytest.mark.parametrize("beside", [True, False])
def test_a_refill_carries_the_running_rows_decode_step(beside):
    sched = Scheduler(max_batch_size=4, max_seq_len=64, beside=beside)
    reqs = [_request(f"r{i}", 6) for i in range(6)]
    for r in reqs:
        sched.add(r)
    first = sched.schedule()
    assert first.is_prefill and first.requests == reqs[:4] and first.beside is None  # nothing ran yet
    for step in (1, 2):
        so = sched.schedule()
        assert not so.is_prefill and so.steps == [step] * 4
    sched.finish(reqs[1], "stop")  # one slot free: a refill (an eighth of 4 slots rounds up to one)
    reqs[3].num_scheduled = 6  # its last frame is scheduled: it only waits, so no step of its own
    refill = sched.schedule()
    assert refill.is_prefill and refill.requests == [reqs[4]] and refill.steps == [0]
    if not beside:
        assert refill.beside is None
        assert sched.schedule().requests == [reqs[0], reqs[2], reqs[4]]  # the running rows waited a step
        return
    decode = refill.beside
    assert not decode.is_prefill and decode.requests == [reqs[0], reqs[2]] and decode.steps == [3, 3]
    nxt = sched.schedule()  # the new row's frame 1 with the others' frame 4
    assert not nxt.is_prefill and nxt.requests == [reqs[0], reqs[2], reqs[4]] and nxt.steps == [4, 4, 1]


def test_a_first_wave_admitted_over_several_prefills_starts_decoding_together():
    """Rows just prefilled (none past frame 0) do not decode beside the next prefill of the same wave:
    they would finish one step ahead of it, and reach the codec apart."""
    sched = Scheduler(max_batch_size=4, max_seq_len=64, max_prefill_tokens=6, beside=True)  # two rows a prefill
    reqs = [_request(f"r{i}", 6) for i in range(4)]
    for r in reqs:
        sched.add(r)
    first, second = sched.schedule(), sched.schedule()
    assert first.requests == reqs[:2] and second.is_prefill and second.requests == reqs[2:]
    assert second.beside is None
    step = sched.schedule()
    assert not step.is_prefill and step.requests == reqs and step.steps == [1] * 4


def _run(runner, prompts, config, beside: bool, async_decode: bool):
    """Ten rows of their own lengths (the EOS-pushed checkpoint stops some early) through 3 slots."""
    sched = Scheduler.for_runner(runner, 256)
    sched.beside = beside
    reqs = [Request(rid=f"r{i}", prompt=prompts.build(t, config.system_prompt, None),
                    params=SamplingParams(temperature=1.0, max_new_frames=8 + 3 * i), seed=i)
            for i, t in enumerate(TEXTS)]
    for r in reqs:
        sched.add(r)
    launched, executed = [], []
    launch, execute = runner.execute_prefill_launch, runner.execute
    runner.execute_prefill_launch = lambda so: (launched.append(so), launch(so))[1]
    runner.execute = lambda so: (executed.append(so.is_prefill), execute(so))[1]
    try:
        stats = run_loop(sched, runner, lambda rs: None, lambda rows, st: None, async_decode=async_decode)
    finally:
        del runner.execute_prefill_launch, runner.execute
    assert all(r.finish_reason is not None for r in reqs) and sched.slots.num_free == 3
    frames = {r.rid: (r.frames.array.copy(), r.logprobs.array.copy()) for r in reqs}
    return frames, stats, launched, executed


def test_refills_beside_decode_keep_every_rows_bytes(tmp_path, eos_ckpt):
    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path, max_batch_size=3, deterministic=True)
    # the oracle: synchronous steps, each refill after the running rows' pending steps (a drain)
    want, drained, _, _ = _run(runner, prompts, config, beside=False, async_decode=False)
    assert drained.beside == 0
    for async_decode in (True, False):
        got, stats, launched, executed = _run(runner, prompts, config, beside=True, async_decode=async_decode)
        assert stats.beside >= 5  # seven rows joined through three slots, most while others ran
        if async_decode:  # every prefill launched: the refills behind their decode step, the first wave alone
            assert len(launched) == stats.beside + 1 and executed.count(True) == 0
            assert [so.beside is not None for so in launched] == [False] + [True] * stats.beside
        else:
            assert not launched and executed.count(True) == stats.beside + 1
        assert got.keys() == want.keys()
        for rid, (frames, logprobs) in want.items():
            np.testing.assert_array_equal(got[rid][0], frames, err_msg=rid)
            np.testing.assert_array_equal(got[rid][1], logprobs, err_msg=rid)
    # fewer host iterations: the running rows took their frames during the refills
    assert len(stats.step_ms) < len(drained.step_ms)


def test_a_prefill_launched_beside_gives_the_synchronous_prefills_frame(tmp_path, eos_ckpt):
    """execute_prefill_launch then execute_resolve against execute on the same rows: frame 0's tokens,
    logprobs and the stop flags, with the prefill's staging pair apart from the decode steps'."""
    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path, max_batch_size=3, deterministic=True)
    outs = []
    for launched in (False, True):
        sched = Scheduler.for_runner(runner, 256)
        for i, t in enumerate(TEXTS[:3]):
            sched.add(Request(rid=f"r{i}-{launched}", prompt=prompts.build(t, config.system_prompt, None),
                              params=SamplingParams(temperature=1.0, max_new_frames=5), seed=i))
        so = sched.schedule()
        if launched:
            pending = runner.execute_prefill_launch(so)
            assert pending.host_staged and any(pending.launch_buf is b for b in runner._host_staging["prefill"])
            assert all(pending.launch_buf is not b for b in runner._host_staging.get("decode", []))
            out = runner.execute_resolve(pending)
        else:
            out = runner.execute(so)
        outs.append(out)
    sync, launched = outs
    assert sync.req_ids == ["r0-False", "r1-False", "r2-False"] and launched.req_ids == ["r0-True", "r1-True", "r2-True"]
    for ra, rb in zip(sync.req_ids, launched.req_ids):
        a, b = sync.outputs[ra], launched.outputs[rb]
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
        assert a.finish_reason == b.finish_reason


@pytest.mark.parametrize("start", [0, 5])
def test_the_prefill_routing_known_on_the_host_is_the_one_the_ids_give(tmp_path, eos_ckpt, start):
    """A prefill takes each token's routing (audio path or text path) from the prompts' host content
    (model.prefill_inputs), so its forward never waits for the device: the same split as the one read
    back from input_ids, for rows with audio spans (keyed below zero), audio and delay ids, right padding,
    and a forward that starts after a cached prefix."""
    import torch

    from omni_cli.runners.higgs_audio_v2.model import TokenSplit

    runner, _, _ = _tiny_runner(eos_ckpt, tmp_path)
    model = runner.engine.model
    a, d = model._audio_ids()
    g = np.random.default_rng(start)
    prompts = []
    for n in (40, 33, 21):
        content = g.integers(3, 200, n).tolist()
        content[8:20] = (-1 - g.integers(0, 2 ** 62, 12)).tolist()  # an audio span's frame keys
        content[20:22] = [d, a]
        prompts.append(content[:n])
    t = max(map(len, prompts))
    ids = torch.zeros(len(prompts), t, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor([a if c < 0 else c for c in p])  # placeholders where codes go
    want = TokenSplit(((ids == a) | (ids == d))[:, start:])
    got = model.prefill_inputs(prompts, start, t - start, torch.device("cpu"))["split"]
    assert got.all_audio == want.all_audio is False
    assert torch.equal(got.text_gpu, want.text_gpu) and torch.equal(got.audio_gpu, want.audio_gpu)


def test_a_failed_prefill_launch_loses_none_of_the_decode_step_launched_beside_it(tmp_path, eos_ckpt):
    """The decode step is pending the moment it is launched: when the prefill behind it raises (or an
    interrupt lands between the two), the loop still resolves it, so its rows keep every frame it drew."""
    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path, max_batch_size=3, deterministic=True)
    sched = Scheduler.for_runner(runner, 256)
    reqs = [Request(rid=f"r{i}", prompt=prompts.build(t, config.system_prompt, None),
                    params=SamplingParams(temperature=1.0, max_new_frames=6 + 4 * i), seed=i)
            for i, t in enumerate(TEXTS[:5])]
    for r in reqs:
        sched.add(r)
    failed, launch = [], runner.execute_prefill_launch

    def fail(so):
        if so.beside is None:  # the first wave, launched alone
            return launch(so)
        failed.append(so)
        raise RuntimeError("the prefill did not launch")

    runner.execute_prefill_launch = fail
    try:
        with pytest.raises(RuntimeError, match="did not launch"):
            run_loop(sched, runner, lambda rs: None, lambda rows, st: None, async_decode=True)
    finally:
        del runner.execute_prefill_launch
    (so,) = failed
    assert so.beside is not None and so.beside.requests
    for r in so.beside.requests:  # the step launched right before the failure was resolved: no frame lost
        assert len(r.frames) == r.num_scheduled, r.rid
