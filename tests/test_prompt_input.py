"""Prompts as ids plus audio codes (runners/prompt_input.py): what the prefix cache keys on is the
content, so two rows whose ids agree but whose audio differs never share a prefix's KV."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_cli.runners.attention import KVCache
from omni_cli.runners.engine import Engine
from omni_cli.runners.kv_blocks import BlockPool
from omni_cli.runners.prompt_input import AudioSpan, PromptInput
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler

IDS = [5, 6, 7, 9, 9, 9, 9, 8, 3]  # positions 3..6: an audio span's placeholders


def shared_prefix(prompts: list[list[int]]) -> int:
    """Leading positions every prompt has equal, leaving each at least its last one (as the cache does)."""
    n = min(len(p) for p in prompts) - 1
    return next((i for i in range(n) if len({p[i] for p in prompts}) > 1), n)


def _codes(seed: int, frames: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, (frames, 8))


def test_different_audio_behind_equal_ids_shares_only_the_text_before_it():
    a = PromptInput(IDS, (AudioSpan(3, _codes(0)),))
    b = PromptInput(IDS, (AudioSpan(3, _codes(1)),))
    assert a.ids == b.ids
    assert shared_prefix([a.ids, b.ids]) == len(IDS) - 1  # by ids alone they would share all but the last
    assert shared_prefix([a.content, b.content]) == 3


def test_audio_that_differs_in_one_frame_shares_up_to_that_frame():
    codes = _codes(0)
    later = codes.copy()
    later[2, 5] = (later[2, 5] + 1) % 1024
    a, b = PromptInput(IDS, (AudioSpan(3, codes),)), PromptInput(IDS, (AudioSpan(3, later),))
    assert shared_prefix([a.content, b.content]) == 3 + 2


def test_equal_audio_shares_like_equal_text():
    a, b = (PromptInput(IDS, (AudioSpan(3, _codes(0)),)) for _ in range(2))
    assert a.content == b.content and shared_prefix([a.content, b.content]) == len(IDS) - 1
    assert all(k < 0 for k in a.content[3:7]) and a.content[:3] == IDS[:3] and a.content[7:] == IDS[7:]


def test_text_only_content_is_the_ids_and_a_span_must_fit():
    assert PromptInput(IDS).content == IDS
    with pytest.raises(ValueError, match="outside"):
        PromptInput(IDS, (AudioSpan(7, _codes(0)),))


def test_the_prefix_cache_keys_rows_by_content():
    """Through the scheduler's block pool (one position a block) into the engine's batch: a row whose
    audio differs shares only the text before it; a row with the first row's audio shares all but its
    last position; the engine's batch carries those positions as each row's start."""
    pool = BlockPool(64, 1)
    sched = Scheduler(4, 32, blocks=pool)
    reqs = [Request(rid=f"r{i}", prompt=PromptInput(IDS, (AudioSpan(3, _codes(seed)),)),
                    params=SamplingParams(max_new_frames=8), seed=0) for i, seed in enumerate((0, 1, 0))]
    for r in reqs:
        sched.add(r)
    so = sched.schedule()
    assert so.is_prefill and so.requests == reqs
    want = [0, shared_prefix([reqs[0].prompt.content, reqs[1].prompt.content]), len(IDS) - 1]
    assert [r.blocks.cached for r in reqs] == want == [0, 3, 8]
    kv = KVCache.paged(1, 4, 1, 32, 4, torch.float32, torch.device("cpu"), num_blocks=64, block_size=1)
    engine = Engine(torch.nn.Identity(), kv, torch.device("cpu"), blocks=pool)
    fb = engine.build_forward_batch(so)
    assert fb.model_inputs["input_ids"].tolist() == [IDS] * 3 and fb.cached_cpu == want
    assert fb.prompts_cpu == [r.prompt.content for r in reqs]
    for r in reqs:  # each row's table, as the pool handed it out, is on the device
        assert kv.table_gpu[r.slot, : len(r.blocks.table)].tolist() == r.blocks.table


def test_frame_keys_are_each_frames_own_hash_whatever_was_hashed_before():
    """A frame's key is the 63-bit BLAKE2b of its codes (hashlib here), whether or not equal codes
    were keyed before (rows of one voice reuse the keys) and whatever the span's other frames; the
    same bytes in frames of another width are other frames, with other keys."""
    import hashlib

    def own(codes):
        return [-1 - (int.from_bytes(hashlib.blake2b(np.ascontiguousarray(r, dtype=np.int64).tobytes(),
                                                     digest_size=8).digest(), "little") >> 1) for r in codes]

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1024, (12, 8))
    first = AudioSpan(0, codes).frame_keys()
    assert first == own(codes) and AudioSpan(3, codes.copy()).frame_keys() == first  # a second row's equal span
    changed = codes.copy()
    changed[5, 2] += 1
    keys = AudioSpan(0, changed).frame_keys()
    assert keys == own(changed) and keys[:5] == first[:5] and keys[5] != first[5] and keys[6:] == first[6:]
    narrow = codes.reshape(24, 4)  # the same bytes as frames of 4 streams
    assert AudioSpan(0, narrow).frame_keys() == own(narrow) and len(own(narrow)) == 24
    assert AudioSpan(0, codes[:, :1].astype(np.int32)).frame_keys() == own(codes[:, :1])  # int32 codes key as int64
