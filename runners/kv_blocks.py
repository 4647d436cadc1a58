"""Paged KV's bookkeeping on the host: fixed-size blocks, each row's block table, and a prefix cache
keyed on content (the device side: runners/attention.py, KVCache's block tables).

A row's KV is a list of block ids (its block table), position p in block table[p // block_size]
at p % block_size. A full block whose positions were computed from a prompt's content is
registered under a chained hash of that content (the hash of the block before it, then its
positions' content keys: ``PromptInput.content``, where an audio position holds a key of its
frame's codes), so a later prompt whose first blocks have the same content takes those blocks
instead of computing them again, and rows with different audio never share one. Blocks are
reference counted: a shared block lives while any row holds it; a released block with a hash
stays cached, unreferenced, until a new block is needed and it is the least recently released.
Only whole blocks of a prompt are shared: the block a row's own tokens start in is its own.
A row's prompt blocks are published when it is admitted, before its prefill has run: a row
admitted with it (the same voice in the same wave) shares them at once, and the engine runs the
row that computes them first (runners/engine.py: _prefill_parts). NOTE: a prefill that raises
ends the run (omni_cli/generate.py: a run fault), so a published block is never read unwritten.

Nothing here touches the device: the engine writes and reads the blocks this pool hands out.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

# Positions a block: small, so a shared prompt prefix is shared to within 15 positions (a text-only
# system prompt too); the decode kernels read a row's keys a block at a time (runners/attention.py)
BLOCK_SIZE = 16


def block_hash(parent: int | None, keys: bytes) -> int:
    """A 63-bit BLAKE2b of the parent block's hash and the block's content keys (each little-endian
    signed 64-bit)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(b"root" if parent is None else parent.to_bytes(8, "little"))
    h.update(keys)
    return int.from_bytes(h.digest(), "little") >> 1


@dataclass
class PrefixStats:
    """What the cache did, for run.json's ``prefix_cache``."""

    prefilled_positions: int = 0  # prompt positions whose KV a prefill computes
    reused_positions: int = 0  # prompt positions taken from cached blocks instead
    evicted_blocks: int = 0  # cached blocks given to other content

    def as_record(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RowBlocks:
    """A row's blocks: ``table`` in position order; the first ``cached`` positions came from the cache."""

    table: list[int] = field(default_factory=list)
    cached: int = 0
    hashes: list[int] = field(default_factory=list)  # the prompt's full blocks' chained hashes


class BlockPool:
    """num_blocks blocks of block_size positions. Not thread-safe: the scheduler's thread owns it.
    share=False (deterministic mode): no prefix cache, every row computes its whole prompt."""

    def __init__(self, num_blocks: int, block_size: int, share: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool of {num_blocks} blocks of {block_size} positions")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.share = share
        self.refs = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._never_used = list(range(num_blocks - 1, -1, -1))  # popped from the end: block 0 first
        self._idle: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, least recent first
        self.rows: dict[str, RowBlocks] = {}
        self.stats = PrefixStats()
        self._last: tuple[Sequence[int], list[int]] | None = None  # the last content hashed, its hashes

    # ---- queries ---------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks a new row may take: never used, or cached and unreferenced (evictable)."""
        return len(self._never_used) + len(self._idle)

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def prefix_hashes(self, content: Sequence[int]) -> list[int]:
        """The chained hashes of content's full blocks, except a last block that would hold the
        prompt's final position (a row computes at least its last position itself: its logits)."""
        out: list[int] = []
        if not self.share:
            return out
        if self._last is not None and self._last[0] is content:  # admission asks up to three times a row
            return self._last[1]
        parent = None
        whole = (len(content) - 1) // self.block_size
        step = 8 * self.block_size
        keys = np.asarray(content[: whole * self.block_size], dtype="<i8").tobytes()  # one conversion a prompt
        for b in range(whole):
            parent = block_hash(parent, keys[b * step: (b + 1) * step])
            out.append(parent)
        self._last = (content, out)  # the object itself kept: its id cannot be reused while here
        return out

    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks of the longest run of hashes from the first."""
        blocks = []
        for h in hashes:
            b = self._by_hash.get(h)
            if b is None:
                break
            blocks.append(b)
        return blocks

    def cached_positions(self, content: Sequence[int]) -> int:
        """Prompt positions a row of this content would take from the cache now."""
        return len(self.cached_prefix(self.prefix_hashes(content))) * self.block_size

    def can_admit(self, content: Sequence[int], positions: int) -> bool:
        """Whether a row of this prompt content and `positions` positions in all (prompt and the frames
        it may generate) fits now."""
        hit = self.cached_prefix(self.prefix_hashes(content))
        revived = sum(1 for b in hit if self.refs[b] == 0)  # idle blocks the row takes back, not fresh ones
        return self.blocks_for(positions) - len(hit) <= self.free_blocks - revived

    # ---- a row's life ----------------------------------------------------
    def admit(self, rid: str, content: Sequence[int], positions: int) -> RowBlocks:
        """Blocks for a new row: its prompt's cached prefix blocks (shared) and fresh ones for the rest
        of `positions`. Raises MemoryError, changing nothing, when they do not fit (see can_admit)."""
        if rid in self.rows:
            raise ValueError(f"row {rid!r} already holds blocks")
        if positions < len(content):
            raise ValueError(f"row {rid!r}: {positions} positions for a {len(content)}-position prompt")
        if not self.can_admit(content, positions):
            raise MemoryError(f"row {rid!r} needs {self.blocks_for(positions)} blocks; {self.free_blocks} free")
        hashes = self.prefix_hashes(content)
        hit = self.cached_prefix(hashes)
        for b in hit:
            self._hold(b)
        row = RowBlocks(table=list(hit), cached=len(hit) * self.block_size, hashes=hashes)
        row.table += [self._fresh() for _ in range(self.blocks_for(positions) - len(hit))]
        self.rows[rid] = row
        self.stats.reused_positions += row.cached
        self.stats.prefilled_positions += len(content) - row.cached
        for i in range(len(hit), len(hashes)):  # published now: rows admitted after this one share them
            if hashes[i] not in self._by_hash:  # (a child whose parent was evicted keeps the first copy)
                self._hash_of[row.table[i]], self._by_hash[hashes[i]] = hashes[i], row.table[i]
        return row

    def grow(self, rid: str, positions: int) -> list[int]:
        """Fresh blocks so the row holds `positions` positions (a long row past its estimate); MemoryError
        when there are too few."""
        row = self.rows[rid]
        need = self.blocks_for(positions) - len(row.table)
        if need > self.free_blocks:
            raise MemoryError(f"row {rid!r} needs {need} more blocks; {self.free_blocks} free")
        added = [self._fresh() for _ in range(max(need, 0))]
        row.table += added
        return added

    def release(self, rid: str) -> None:
        """The row finished: each block it held loses a reference; a block no row holds is free again,
        kept as cache while it has a hash (last released, last evicted)."""
        for b in reversed(self.rows.pop(rid).table):  # a row's last blocks are its least shareable: evicted first
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if self._hash_of[b] is None:
                    self._never_used.append(b)
                else:
                    self._idle[b] = None

    def forget(self) -> None:
        """Every cached block forgotten and the counts zeroed (after the warm-up: a run's outputs do not
        depend on what the warm-up left). Only while no row holds a block."""
        if self.rows:
            raise RuntimeError(f"{len(self.rows)} rows still hold blocks")
        self._never_used += list(self._idle)
        self._idle.clear()
        self._by_hash.clear()
        self._hash_of = [None] * len(self._hash_of)
        self.stats = PrefixStats()

    # ---- blocks ----------------------------------------------------------
    def _hold(self, b: int) -> None:
        if self.refs[b] == 0:
            self._idle.pop(b, None)
        self.refs[b] += 1

    def _fresh(self) -> int:
        """An unreferenced block for new content: never used first, else the least recently released
        cached one (its hash forgotten)."""
        if self._never_used:
            b = self._never_used.pop()
        else:
            b, _ = self._idle.popitem(last=False)
            del self._by_hash[self._hash_of[b]]
            self._hash_of[b] = None
            self.stats.evicted_blocks += 1
        self.refs[b] = 1
        return b


# ---- cascade decode attention's groups (the kernels: runners/cascade_attention.py) ----
TILE_ROWS = 16  # rows of one group a first-kernel program takes (their REP query heads each: the matrix's rows)
# A group shares at least this many positions, or its rows run the plain kernel's way: below it the first
# kernel's launch costs more than the keys it saves reading (BENCHMARKS.md, cascade attention)
CASCADE_MIN_POSITIONS = 128


class CascadePlan(NamedTuple):
    """One step's groups, host side (numpy int32): the engine builds it, the decode graphs copy it in."""

    shared: np.ndarray  # [B]: positions row i takes from its group's first part (0: none)
    tile_rows: np.ndarray  # [T, TILE_ROWS]: the batch rows of tile t (-1 past its last)
    tile_len: np.ndarray  # [T]: the shared positions of tile t's group


def cascade_plan(table_host: np.ndarray, slots: list[int], shareable: list[int], block_size: int) -> CascadePlan | None:
    """The groups of a decode step's rows, or None where no group is worth a first kernel.

    table_host [S, width] each slot's blocks; slots [B] the rows' slots; shareable [B] how many of each
    row's first blocks are prompt blocks that may be shared (runners/kv_blocks.py: RowBlocks.hashes). A
    row's shared depth is the count of its leading shareable blocks that another row of the step holds
    too (a row takes cached blocks from its first, so sharing is a prefix)."""
    b = len(slots)
    if b < 2:
        return None
    tables = table_host[np.asarray(slots)]  # [B, width]
    ok = np.arange(tables.shape[1])[None, :] < np.asarray(shareable)[:, None]
    holders = np.bincount(tables[ok], minlength=int(tables.max()) + 1)  # rows of this step holding each block
    depth = np.cumprod(ok & (holders[tables] > 1), axis=1).sum(axis=1)  # [B] leading shared blocks
    rows = np.flatnonzero(depth * block_size >= CASCADE_MIN_POSITIONS)
    if len(rows) < 2:
        return None
    key = tables[rows, depth[rows] - 1]  # the last shared block names the group
    order = np.lexsort((rows, key))  # by group, rows in batch order within one
    rows, key = rows[order], key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    shared = np.zeros(b, dtype=np.int32)
    tile_rows: list[np.ndarray] = []
    tile_len: list[int] = []
    for g, s in enumerate(starts):
        members = rows[s: starts[g + 1] if g + 1 < len(starts) else len(rows)]
        d = int(depth[members[0]])
        # NOTE: one block can end equal prefixes held in different blocks (a cached child whose parent
        # was evicted and computed again): the first row's table is read for the group, so only rows
        # whose tables equal it join
        members = members[(tables[members, :d] == tables[members[0], :d]).all(axis=1)]
        if len(members) < 2:
            continue
        shared[members] = d * block_size
        for t in range(0, len(members), TILE_ROWS):
            tile = np.full(TILE_ROWS, -1, dtype=np.int32)
            part = members[t: t + TILE_ROWS]
            tile[: len(part)] = part
            tile_rows.append(tile)
            tile_len.append(d * block_size)
    if not tile_rows:
        return None
    return CascadePlan(shared, np.stack(tile_rows), np.asarray(tile_len, dtype=np.int32))
