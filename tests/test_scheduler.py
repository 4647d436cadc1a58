"""The offline scheduler: continuous batching within max_batch_size and the KV slots."""

from __future__ import annotations

import random

import numpy as np
import pytest

from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import FrameBuffer, Request, Scheduler, SlotPool, Status


def _req(i: int, prompt_len: int, frames: int) -> Request:
    return Request(rid=f"r{i}", prompt=[1] * prompt_len, params=SamplingParams(max_new_frames=frames), seed=0)


def _simulate(sched: Scheduler, lengths: dict[str, int]) -> list[tuple[bool, list[str]]]:
    """Drive the scheduler as the runner would; a request finishes after lengths[rid] frames."""
    trace = []
    while sched.has_work():
        so = sched.schedule()
        trace.append((so.is_prefill, [r.rid for r in so.requests]))
        assert len(sched.running) <= sched.max_batch_size
        assert len({r.slot for r in sched.running}) == len(sched.running)  # no slot shared
        for r in so.requests:
            r.frames.append(np.zeros(8, dtype=np.int64))
            if r.generation_steps >= lengths[r.rid]:
                sched.finish(r, "stop")
    return trace


def test_continuous_batching_admits_into_freed_slots():
    sched = Scheduler(max_batch_size=2, max_seq_len=100)
    lengths = {"r0": 3, "r1": 10, "r2": 4, "r3": 2}
    for i in range(4):
        sched.add(_req(i, 5 + i, 20))
    trace = _simulate(sched, lengths)
    assert trace[0] == (True, ["r0", "r1"])
    # r0 finishes after its 3rd frame; r2 is prefilled while r1 keeps decoding
    assert trace[1:3] == [(False, ["r0", "r1"]), (False, ["r0", "r1"])]
    assert trace[3] == (True, ["r2"])
    assert (False, ["r1", "r2"]) in trace
    assert trace[-1] == (False, ["r1"])
    assert sched.slots.num_free == 2


def test_random_requests_never_exceed_limits_and_free_every_slot():
    rng = random.Random(0)
    sched = Scheduler(max_batch_size=5, max_seq_len=64, max_prefill_tokens=40)
    lengths = {}
    for i in range(300):
        req = _req(i, rng.randint(1, 30), rng.randint(1, 30))
        lengths[req.rid] = rng.randint(1, req.params.max_new_frames)
        sched.add(req)
    trace = _simulate(sched, lengths)
    done = [r for _, rids in trace for r in rids]
    assert set(done) == set(lengths)
    assert sched.slots.num_free == 5 and not sched.running and not sched.waiting


def test_prefill_token_budget():
    sched = Scheduler(max_batch_size=4, max_seq_len=100, max_prefill_tokens=10)
    for i in range(3):
        sched.add(_req(i, 6, 5))
    assert [r.rid for r in sched.schedule().requests] == ["r0"]  # 6 + 6 > 10
    assert [r.rid for r in sched.schedule().requests] == ["r1"]


def test_prefill_budget_counts_the_padding_to_the_longest_prompt():
    """A prefill runs every row at its longest prompt's length, so a long prompt after a short
    one (2 + 8 = 10 real tokens, within the budget, but 2 x 8 computed) starts the next
    prefill instead."""
    sched = Scheduler(max_batch_size=8, max_seq_len=100, max_prefill_tokens=10)
    for i, n in enumerate((2, 8, 3, 3, 3)):
        sched.add(_req(i, n, 5))
    batches = []
    while sched.waiting:
        out = sched.schedule()
        assert out.is_prefill
        batches.append([r.rid for r in out.requests])
        assert len(out.requests) * max(len(r.prompt_ids) for r in out.requests) <= 10
    assert batches == [["r0"], ["r1"], ["r2", "r3", "r4"]]


def test_request_that_cannot_fit_is_rejected():
    sched = Scheduler(max_batch_size=1, max_seq_len=20)
    with pytest.raises(ValueError, match="over max_seq_len 20"):
        sched.add(_req(0, 10, 12))  # 10 + 12 - 1 = 21 positions
    sched.add(_req(1, 10, 11))  # exactly 20


def test_slot_pool_frees_once():
    pool = SlotPool(2)
    a = pool.allocate()
    pool.free(a)
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free(a)
    with pytest.raises(RuntimeError):
        pool.free(7)


def test_finish_requires_running():
    sched = Scheduler(max_batch_size=1, max_seq_len=20)
    r = _req(0, 3, 3)
    sched.add(r)
    with pytest.raises(RuntimeError, match="waiting"):
        sched.finish(r, "stop")
    sched.schedule()
    sched.finish(r, "stop")
    assert r.status is Status.FINISHED and r.slot is None


def test_admission_waits_for_an_eighth_of_the_slots():
    """With 16 slots a prefill waits for 2 free slots while others can decode; the queue's
    tail (fewer rows than that) and a batch with nothing left to decode are admitted at once."""
    sched = Scheduler(max_batch_size=16, max_seq_len=100)
    lengths = {f"r{i}": 5 + i for i in range(16)}  # one finishes per step after the 5th
    lengths.update({"r16": 30, "r17": 30, "r18": 30})
    for i in range(19):
        sched.add(_req(i, 4, 40))
    trace = _simulate(sched, lengths)
    prefills = [rids for is_prefill, rids in trace if is_prefill]
    assert prefills == [[f"r{i}" for i in range(16)], ["r16", "r17"], ["r18"]]
    first_refill = next(i for i, (p, rids) in enumerate(trace) if p and rids == ["r16", "r17"])
    # r0 finished at step 5 and r1 at step 6: the refill comes after the second, not the first
    assert [rids for _, rids in trace[5:first_refill]] == [[f"r{i}" for i in range(1, 16)]]


def test_frame_buffer_holds_what_numpy_stack_of_the_entries_holds():
    """A request's per-frame entries, appended one at a time (past the first capacity, so the
    buffer grows, and at every length on the way), read back as np.stack of the same entries:
    values, dtype and shape; an entry of another dtype is cast as numpy casts on assignment."""
    rng = np.random.default_rng(0)
    for dtype, entries in ((np.int64, [rng.integers(0, 1026, 8) for _ in range(2 * FrameBuffer.FIRST_CAPACITY + 7)]),
                           (np.float32, [rng.standard_normal(8).astype(np.float32) for _ in range(5)]),
                           (np.int64, [rng.integers(0, 1026, 8).astype(np.float32) for _ in range(3)])):
        buf = FrameBuffer(dtype)
        assert len(buf) == 0 and buf.array.shape[0] == 0
        for n, e in enumerate(entries, 1):
            buf.append(e)
            want = np.stack(entries[:n]).astype(dtype)
            got = buf.array
            assert len(buf) == n and got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def test_released_frames_are_gone_and_refuse_more():
    """After its files are written a request drops its frames: reading or appending them then
    raises instead of handing out stale or partial rows."""
    req = Request(rid="r", prompt=[1], params=SamplingParams(), seed=0)
    req.frames.append(np.zeros(8, dtype=np.int64))
    req.logprobs.append(np.zeros(8, dtype=np.float32))
    req.release()
    for entries in (req.frames, req.logprobs, req.raw_logprobs):
        with pytest.raises(RuntimeError, match="released"):
            entries.array
        with pytest.raises(RuntimeError, match="released"):
            entries.append(np.zeros(8))


def _held(sched: Scheduler) -> int:
    """Blocks the running requests hold, counted from their own tables (shared ones once)."""
    return len({b for r in sched.running for b in r.blocks.table})


def test_rows_are_admitted_as_their_blocks_fit_in_queue_order():
    """A pool of 10 blocks of 4 positions: rows of 12 positions (3 blocks) run three at once, never
    more blocks than the pool holds; a row of 30 positions (8 blocks) waits at the head until enough
    are free, and no row behind it overtakes it; every block comes back."""
    from omni_cli.runners.kv_blocks import BlockPool

    pool = BlockPool(10, 4)
    sched = Scheduler(max_batch_size=8, max_seq_len=64, blocks=pool)
    reqs = [Request(rid=f"r{i}", prompt=[100 + i] * 5, params=SamplingParams(max_new_frames=8), seed=0)
            for i in range(4)]
    big = Request(rid="big", prompt=[7] * 11, params=SamplingParams(max_new_frames=20), seed=0)
    after = Request(rid="after", prompt=[9] * 5, params=SamplingParams(max_new_frames=8), seed=0)
    for r in [*reqs, big, after]:
        sched.add(r)
    order, peak = [], 0
    while sched.has_work():
        so = sched.schedule()
        if so.is_prefill:
            order += [r.rid for r in so.requests]
        assert _held(sched) <= 10 and len(sched.running) <= 3
        peak = max(peak, len(sched.running))
        for r in so.requests:
            r.frames.append(np.zeros(8, dtype=np.int64))
            if r.generation_steps >= r.params.max_new_frames:
                sched.finish(r, "stop")
    assert order == ["r0", "r1", "r2", "r3", "big", "after"] and peak == 3
    assert pool.free_blocks == 10 and not pool.rows


def test_a_row_the_pool_can_never_hold_is_rejected_at_add():
    from omni_cli.runners.kv_blocks import BlockPool

    sched = Scheduler(max_batch_size=4, max_seq_len=100, blocks=BlockPool(4, 4))  # 16 positions in all
    with pytest.raises(ValueError, match="needs 19 KV positions; device memory holds 16"):
        sched.add(_req(0, 10, 10))
    sched.add(_req(1, 10, 7))  # 16 positions: fits


def test_a_forward_after_a_cached_prefix_keeps_its_copied_keys_within_the_bound():
    """Rows of 20 positions whose first 16 are one shared prompt (blocks of 4): the first row computes
    them, the rest run positions 16.. only, and a forward copies each row's keys up to its end
    (runners/attention.py: gather). With a budget of 40 tokens, 4 tokens a row would let 10 rows into
    one forward; PREFIX_KEYS_PER_TOKEN x 40 copied positions allow 160 / 20 = 8, so the rows after the
    first come 8 a prefill, in queue order."""
    from omni_cli.runners.budget import PREFIX_KEYS_PER_TOKEN
    from omni_cli.runners.kv_blocks import BlockPool

    assert PREFIX_KEYS_PER_TOKEN == 4  # the numbers below
    pool = BlockPool(200, 4)
    sched = Scheduler(max_batch_size=32, max_seq_len=64, max_prefill_tokens=40, blocks=pool)
    for i in range(18):
        sched.add(Request(rid=f"r{i}", prompt=[5] * 16 + [100 + i] * 4, params=SamplingParams(max_new_frames=4),
                          seed=0))
    prefills = []
    while sched.waiting:
        so = sched.schedule()
        assert so.is_prefill
        starts = [pool.cached_positions(r.prompt.content) if prefills or i else 0 for i, r in enumerate(so.requests)]
        prefills.append([r.rid for r in so.requests])
        assert sum(1 for s in starts if s == 16) * 20 <= PREFIX_KEYS_PER_TOKEN * 40
    assert prefills == [[f"r{i}" for i in range(9)], [f"r{i}" for i in range(9, 17)], ["r17"]]
