"""runners/kv_blocks.py: the paged KV's host bookkeeping. Rows get the blocks their positions need;
rows whose prompts begin with the same content share those whole blocks from the first row's
admission on (its prefill runs before theirs: runners/engine.py); a shared block is freed when the last row holding it finishes, kept
as cache until it is the least recently released; different audio never shares a block."""

from __future__ import annotations

import numpy as np
import pytest

from omni_cli.runners.kv_blocks import BlockPool
from omni_cli.runners.prompt_input import AudioSpan, PromptInput

BS = 4


def voice_prompt(codes_seed: int, text: list[int]) -> PromptInput:
    """A cloning prompt: 2 ids, 9 audio placeholders holding a voice's codes, then the row's text."""
    codes = np.random.default_rng(codes_seed).integers(0, 1024, (9, 8))
    return PromptInput([1, 2] + [7] * 9 + text, (AudioSpan(2, codes),))


def holders(pool: BlockPool) -> dict[int, int]:
    """Block -> rows holding it, counted from the rows' tables (the oracle for the pool's counts)."""
    out: dict[int, int] = {}
    for row in pool.rows.values():
        for b in row.table:
            out[b] = out.get(b, 0) + 1
    return out


def check_counts(pool: BlockPool, total: int) -> None:
    held = holders(pool)
    assert all(pool.refs[b] == held.get(b, 0) for b in range(total))
    assert pool.free_blocks == total - len(held)


def test_rows_without_a_shared_prefix_take_their_own_blocks_and_give_them_back():
    pool = BlockPool(16, BS)
    a = pool.admit("a", [5, 6, 7], 10)  # 3 prompt positions, 10 in all: 3 blocks
    b = pool.admit("b", [8, 9, 10, 11, 12], 13)  # 4 blocks
    assert len(a.table) == 3 and len(b.table) == 4 and not set(a.table) & set(b.table)
    assert a.cached == b.cached == 0
    check_counts(pool, 16)
    pool.release("a")
    pool.release("b")
    check_counts(pool, 16)
    assert pool.free_blocks == 16 and pool.stats.reused_positions == 0 and pool.stats.prefilled_positions == 8


def test_a_shared_voice_is_computed_once_and_freed_with_its_last_row():
    pool = BlockPool(32, BS)
    first, second = voice_prompt(0, [40, 41, 42]), voice_prompt(0, [50, 51])
    common = next(i for i, (x, y) in enumerate(zip(first.content, second.content)) if x != y)  # 11
    a = pool.admit("a", first.content, 30)
    assert a.cached == 0  # the first row computes its whole prompt
    b = pool.admit("b", second.content, 30)
    shared = common // BS  # whole blocks of the common prefix
    assert b.cached == shared * BS and b.table[:shared] == a.table[:shared]
    assert not set(b.table[shared:]) & set(a.table)  # the rest is the row's own
    assert pool.stats.reused_positions == shared * BS
    check_counts(pool, 32)
    pool.release("a")  # the shared blocks stay: b holds them
    assert all(pool.refs[x] == 1 for x in b.table[:shared])
    check_counts(pool, 32)
    pool.release("b")  # now unreferenced, but still cached: a third row reuses them
    check_counts(pool, 32)
    c = pool.admit("c", voice_prompt(0, [60]).content, 20)
    assert c.table[:shared] == a.table[:shared] and c.cached == shared * BS


def test_different_audio_never_shares_a_block():
    """Equal ids, other codes in the voice's frames: the content differs from the first audio
    position on, so only the blocks before it could match (here: none reach past it)."""
    pool = BlockPool(32, BS)
    one, other = voice_prompt(0, [40, 41]), voice_prompt(1, [40, 41])
    assert one.ids == other.ids and one.content != other.content
    pool.admit("a", one.content, 20)
    b = pool.admit("b", other.content, 20)
    assert b.cached == 0 and not set(b.table) & set(pool.rows["a"].table)
    same = pool.admit("c", one.content, 20)  # control: the same audio again does share
    assert same.cached > 0


def test_a_row_computes_its_last_prompt_position_itself():
    """A prompt of whole blocks shares all but the block holding its final position (the row's
    first logits come from computing it)."""
    pool = BlockPool(16, BS)
    prompt = list(range(100, 108))  # two whole blocks
    pool.admit("a", prompt, 12)
    b = pool.admit("b", prompt, 12)
    assert b.cached == BS and b.cached < len(prompt)


def test_a_row_that_does_not_fit_is_refused_and_nothing_changes():
    pool = BlockPool(5, BS)
    pool.admit("a", [1, 2, 3], 12)  # 3 blocks
    before = (list(pool.refs), pool.free_blocks, dict(pool.rows))
    assert not pool.can_admit([4, 5], 12)
    with pytest.raises(MemoryError):
        pool.admit("b", [4, 5], 12)
    assert (list(pool.refs), pool.free_blocks, dict(pool.rows)) == before
    assert pool.can_admit([4, 5], 8) and len(pool.admit("b", [4, 5], 8).table) == 2
    with pytest.raises(MemoryError):
        pool.grow("b", 13)  # a fourth block for b: none left
    with pytest.raises(ValueError):
        pool.admit("c", [1, 2, 3], 2)  # fewer positions than its prompt
    with pytest.raises(ValueError):
        pool.admit("a", [1], 4)  # a row admitted twice


def test_cached_blocks_are_evicted_least_recently_released_first():
    pool = BlockPool(6, BS)
    old, new = list(range(200, 209)), list(range(300, 309))  # two whole blocks each (9 positions)
    for rid, prompt in (("old", old), ("new", new)):
        pool.admit(rid, prompt, 12)
    pool.release("old")
    pool.release("new")
    assert pool.free_blocks == 6
    pool.admit("x", [1], 12)  # three blocks: the two never used (each prompt's third), then a cached one
    pool.admit("y", [2], 4)  # one more cached one: both of old's, released first, are the ones taken
    assert pool.stats.evicted_blocks == 2
    pool.release("x")
    pool.release("y")
    assert pool.admit("n", new, 9).cached == 2 * BS  # new's prefix survived
    pool.release("n")
    assert pool.admit("o", old, 9).cached == 0  # old's first block was evicted: no prefix left
    check_counts(pool, 6)


def test_growing_a_row_adds_fresh_blocks():
    pool = BlockPool(8, BS)
    row = pool.admit("a", [1, 2], 4)
    added = pool.grow("a", 9)
    assert len(added) == 2 and row.table[-2:] == added and pool.grow("a", 9) == []
    check_counts(pool, 8)


def test_without_sharing_every_row_computes_its_whole_prompt():
    """Deterministic mode's pool (share=False): the same voice twice takes no cached block."""
    pool = BlockPool(32, BS, share=False)
    pool.admit("a", voice_prompt(0, [40]).content, 20)
    b = pool.admit("b", voice_prompt(0, [50]).content, 20)
    assert b.cached == 0 and not set(b.table) & set(pool.rows["a"].table)
    shared = BlockPool(32, BS)  # control: the sharing pool does share them
    shared.admit("a", voice_prompt(0, [40]).content, 20)
    assert shared.admit("b", voice_prompt(0, [50]).content, 20).cached > 0
