"""Cascade decode attention: rows whose prompts share cached blocks (a voice, a system prompt) attend
to those blocks once per group and step, not once per row.

Paged KV (runners/kv_blocks.py) lets rows hold the same blocks, but the per-row kernel
(runners/decode_attention.py) still reads and scores a shared prefix once for every row that holds
it. Here a step's rows are grouped by the deepest block they share (runners/kv_blocks.py: cascade_plan, on
the host, once per batch composition); a first kernel takes a tile of up to TILE_ROWS rows of one group, their query
heads of one KV head stacked as the rows of one matrix, and runs the online softmax over the
group's shared positions, spread over up to SHARED_SPLITS programs (whole key blocks each), leaving
each row, head and split its partial state (running max, sum and unnormalised output, float32). The
per-row kernel merges the splits by log-sum-exp and starts from that state at the row's first unshared
position: the merge of the parts without a third kernel.

A row's result depends on its group's shared length (where the first part ends), so a row's bits
follow its batch-mates, as the default mode's already do (the row bucket's key block); deterministic
mode shares no blocks, so it never plans a cascade.

A group is the rows whose last shared block (the deepest prompt block another row of the step also
holds) is the same block, and whose tables agree up to it; a group of one row, or one sharing fewer
than CASCADE_MIN_POSITIONS, runs the plain kernel's way (no first part).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from .fused_ops import kv_offset
from .kv_blocks import TILE_ROWS, CascadePlan
from .online_softmax import _scores, _values


class CascadeInputs(NamedTuple):
    """A plan on the device (static buffers inside a decode graph). Tiles past the plan's have length 0."""

    shared_gpu: torch.Tensor  # [B] int32
    tile_rows_gpu: torch.Tensor  # [T, TILE_ROWS] int32
    tile_len_gpu: torch.Tensor  # [T] int32


def to_device(p: CascadePlan, device: torch.device) -> CascadeInputs:
    """A plan as device tensors of its own size (eager calls and tests; graphs copy into static buffers)."""
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return CascadeInputs(t(p.shared), t(p.tile_rows), t(p.tile_len))


@triton.jit
def _shared_prefix_kernel(
    q_ptr, k_ptr, v_ptr, slots_ptr, table_ptr, tile_rows_ptr, tile_len_ptr, m_ptr, l_ptr, acc_ptr,
    stride_qb, stride_qh, stride_tb, stride_cs, stride_ch, stride_ct, stride_split,
    scale,
    H: tl.constexpr, REP: tl.constexpr, ROWS: tl.constexpr, M_PAD: tl.constexpr, D: tl.constexpr,
    BLOCK: tl.constexpr, USE_DOT: tl.constexpr, PRECISION: tl.constexpr, BS: tl.constexpr, SPLITS: tl.constexpr,
):
    # program (tile, kv head, split): the tile's rows x REP query heads as M_PAD matrix rows (row-major: matrix
    # row i is tile row i // REP, head kvh * REP + i % REP) over the split's part of the group's shared
    # positions (split_span), read through the first row's table. Partials [SPLITS, B, H] (m, l) and
    # [SPLITS, B, H, D] (acc), float32; a split past the shared keys writes nothing (the merge stops before it)
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(tile_len_ptr + tile)
    per = split_span(length, BLOCK, SPLITS)
    first = split * per
    if first < length:
        i = tl.arange(0, M_PAD)
        d = tl.arange(0, D)
        local = i // REP
        row = tl.load(tile_rows_ptr + tile * ROWS + local, mask=local < ROWS, other=-1)
        ok = row >= 0
        row = tl.where(ok, row, 0).to(tl.int64)
        head = kvh * REP + i % REP
        q = tl.load(q_ptr + row[:, None] * stride_qb + head[:, None] * stride_qh + d[None, :], mask=ok[:, None],
                    other=0.0)
        slot = tl.load(slots_ptr + tl.load(tile_rows_ptr + tile * ROWS)).to(tl.int64)
        base = kvh.to(tl.int64) * stride_ch
        m = tl.full([M_PAD], float("-inf"), tl.float32)
        l = tl.zeros([M_PAD], tl.float32)
        acc = tl.zeros([M_PAD, D], tl.float32)
        for start in range(first, tl.minimum(length, first + per), BLOCK):
            n = start + tl.arange(0, BLOCK)
            key_ok = n < length
            offs = base + kv_offset(table_ptr, stride_tb, slot, n, stride_cs, stride_ct, BS, key_ok)[:, None] + d[None, :]
            k = tl.load(k_ptr + offs, mask=key_ok[:, None], other=0.0)  # [BLOCK, D]
            m, l, p, alpha = _scores(q, k, key_ok, m, l, scale, USE_DOT, PRECISION)
            v = tl.load(v_ptr + offs, mask=key_ok[:, None], other=0.0)
            acc = _values(p, alpha, v, acc, USE_DOT, PRECISION)
        part = split * stride_split + row * H + head
        tl.store(m_ptr + part, m, mask=ok)
        tl.store(l_ptr + part, l, mask=ok)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=ok[:, None])


@triton.jit
def split_span(length, BLOCK: tl.constexpr, SPLITS: tl.constexpr):
    """Shared positions a split of the first part takes: whole key blocks, the blocks spread over at most
    SPLITS programs (the per-row kernel merges the same splits: both compute it)."""
    return tl.cdiv(tl.cdiv(length, BLOCK), SPLITS) * BLOCK


@triton.jit
def merge_shared(m_ptr, l_ptr, acc_ptr, part, head_ok, d, begin, stride_split, D: tl.constexpr,
                 BLOCK: tl.constexpr, SPLITS: tl.constexpr):
    """A row's running (m, l, acc) after its group's first `begin` keys: the splits that hold keys, merged
    by log-sum-exp in split order. part [REP_PAD]: the row's heads' index into one split's partials."""
    m = tl.load(m_ptr + part, mask=head_ok, other=float("-inf"))
    l = tl.load(l_ptr + part, mask=head_ok, other=0.0)
    acc = tl.load(acc_ptr + part[:, None] * D + d[None, :], mask=head_ok[:, None], other=0.0)
    for s in range(1, tl.cdiv(begin, split_span(begin, BLOCK, SPLITS))):
        at = part + s * stride_split
        m_s = tl.load(m_ptr + at, mask=head_ok, other=float("-inf"))
        l_s = tl.load(l_ptr + at, mask=head_ok, other=0.0)
        acc_s = tl.load(acc_ptr + at[:, None] * D + d[None, :], mask=head_ok[:, None], other=0.0)
        m_new = tl.maximum(m, m_s)
        a = tl.exp(tl.where(head_ok, m - m_new, 0.0))  # padded heads: -inf in both, kept at m -inf, l 0
        b = tl.exp(tl.where(head_ok, m_s - m_new, 0.0))
        l = l * a + l_s * b
        acc = acc * a[:, None] + acc_s * b[:, None]
        m = m_new
    return m, l, acc


# programs a tile's shared positions are spread over: one program walking a 300-position voice was a chain
# of dependent block loads, the step's longest (BENCHMARKS.md, reference voices)
SHARED_SPLITS = 4
# (device, rows, H, D) -> the partial maxima, sums and outputs [SHARED_SPLITS, rows, H] / [.., D] float32
_PARTIALS: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def partials(device: torch.device, rows: int, h: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    key = (device, rows, h, d)
    if key not in _PARTIALS:
        # Hazard: made inside a graph capture it would come from the graph's private pool; the decode
        # graphs run every shape eagerly before they capture it (runners/cuda_graphs.py)
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), "made before capture"
        _PARTIALS[key] = (torch.empty(SHARED_SPLITS, rows, h, device=device),
                          torch.empty(SHARED_SPLITS, rows, h, device=device),
                          torch.empty(SHARED_SPLITS, rows, h, d, device=device))
    return _PARTIALS[key]


def shared_prefix(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                  slots: torch.Tensor, cascade: CascadeInputs, block: int, precision: str):
    """The first part: q [B, H, 1, D] over each tile's shared positions -> partials (m, l, acc) for the
    rows in tiles (others' entries are left as they were: the per-row kernel reads only rows with
    shared > 0)."""
    b, h, _, d = q.shape
    kvh = k_cache.shape[1]
    rep = h // kvh
    m, l, acc = partials(q.device, b, h, d)
    tiles = cascade.tile_len_gpu.shape[0]
    _shared_prefix_kernel[(tiles, kvh, SHARED_SPLITS)](
        q, k_cache, v_cache, slots, table, cascade.tile_rows_gpu, cascade.tile_len_gpu, m, l, acc,
        q.stride(0), q.stride(1), table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), b * h,
        d ** -0.5, H=h, REP=rep, ROWS=TILE_ROWS, M_PAD=max(16, triton.next_power_of_2(TILE_ROWS * rep)), D=d,
        BLOCK=block, USE_DOT=d >= 16, PRECISION=precision, BS=k_cache.shape[2], SPLITS=SHARED_SPLITS, num_warps=4)
    return m, l, acc
