"""runners/kv_blocks.py: cascade_plan, the host side of cascade decode attention. A decode step's rows
are grouped by the prompt blocks they share, each group cut into tiles of at most TILE_ROWS rows;
a row's shared positions are the longest run of whole prompt blocks whose content another row of the
step has too (the oracle: the prompts' content, compared block by block), and only runs of at least
CASCADE_MIN_POSITIONS count. (The kernels: tests/interpret_cascade_attention.py.)"""

from __future__ import annotations

import numpy as np

from omni_cli.runners.kv_blocks import CASCADE_MIN_POSITIONS, TILE_ROWS, BlockPool, cascade_plan
from omni_cli.runners.prompt_input import AudioSpan, PromptInput

BS = 16


def prompt(voice: int | None, text: list[int]) -> PromptInput:
    """2 ids, 150 audio positions holding voice `voice`'s codes (none: text ids), then the row's text."""
    if voice is None:
        return PromptInput([1, 2] + [9] * 150 + text)
    codes = np.random.default_rng(voice).integers(0, 1024, (150, 8))
    return PromptInput([1, 2] + [7] * 150 + text, (AudioSpan(2, codes),))


def common_blocks(a: list, b: list) -> int:
    """Whole blocks of equal content from the first, a prompt's last position never in one."""
    n = 0
    while (n + 1) * BS <= min(len(a), len(b)) - 1 and a[n * BS: (n + 1) * BS] == b[n * BS: (n + 1) * BS]:
        n += 1
    return n


def test_rows_are_grouped_by_the_prompt_blocks_they_share():
    rng = np.random.default_rng(0)
    voices = [0] * 18 + [1] * 3 + [2] + [None] * 2
    prompts = [prompt(v, rng.integers(100, 200, int(rng.integers(5, 40))).tolist()) for v in voices]
    prompts[-1] = PromptInput([1, 2] + [9] * 40 + [5] * 120)  # shares 2 blocks with the row before: too few
    pool = BlockPool(400, BS)
    width = 16
    table = np.full((len(prompts) + 1, width), 400, dtype=np.int32)  # the engine's host tables, scratch past
    order = rng.permutation(len(prompts))  # rows in slots out of order
    for slot, i in zip(order, range(len(prompts))):
        row = pool.admit(str(i), prompts[i].content, len(prompts[i]) + 20)
        table[slot, : len(row.table)] = row.table
    slots = order.tolist()
    shareable = [len(pool.rows[str(i)].hashes) for i in range(len(prompts))]
    plan = cascade_plan(table, slots, shareable, BS)
    content = [p.content for p in prompts]
    for i in range(len(prompts)):
        best = max(common_blocks(content[i], content[j]) for j in range(len(prompts)) if j != i) * BS
        assert plan.shared[i] == (best if best >= CASCADE_MIN_POSITIONS else 0), i
    assert plan.shared[:18].min() > 0 and plan.shared[18:21].min() > 0 and not plan.shared[21:].any()
    # every grouped row in exactly one tile; a tile's rows share its positions and those blocks
    tiled = plan.tile_rows[plan.tile_rows >= 0]
    assert sorted(tiled.tolist()) == np.flatnonzero(plan.shared).tolist()
    assert plan.tile_rows.shape[1] == TILE_ROWS and len(plan.tile_len) == 3  # 18 rows: two tiles, 3 rows: one
    for tile, n in zip(plan.tile_rows, plan.tile_len):
        members = tile[tile >= 0]
        assert (plan.shared[members] == n).all()
        blocks = table[np.asarray(slots)[members], : n // BS]
        assert (blocks == blocks[0]).all()


def test_rows_ending_on_one_block_through_different_blocks_are_not_grouped():
    """Equal content in different blocks before a common one (a cached child whose parent was evicted
    and computed again): only rows whose tables equal the group's first row's up to it join it."""
    a = list(range(9))
    b = a[:4] + [20, 21, 22, 23] + [8]
    table = np.array([a, a, b, b], dtype=np.int32)
    plan = cascade_plan(table, [0, 1, 2, 3], [9] * 4, BS)
    assert plan.shared.tolist() == [9 * BS, 9 * BS, 0, 0]
    assert plan.tile_rows[0][:2].tolist() == [0, 1] and (plan.tile_rows[0][2:] == -1).all()


def test_no_plan_without_a_group_worth_it():
    blocks = list(range(9))
    one = np.array([blocks], dtype=np.int32)
    assert cascade_plan(one, [0], [9], BS) is None  # one row
    two = np.array([blocks, blocks], dtype=np.int32)
    assert cascade_plan(two, [0, 1], [0, 0], BS) is None  # nothing shareable (deterministic mode)
    short = np.array([blocks[:4] + [30], blocks[:4] + [31]], dtype=np.int32)
    assert cascade_plan(short, [0, 1], [5, 5], BS) is None  # 64 shared positions: under the minimum
