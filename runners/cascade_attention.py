"""Cascade decode attention: rows whose prompts share cached blocks (a voice, a system prompt) attend
to those blocks once per group and step, not once per row.

Paged KV (runners/kv_blocks.py) lets rows hold the same blocks, but the per-row kernel
(runners/decode_attention.py) still reads and scores a shared prefix once for every row that holds
it. Here a step's rows are grouped by the deepest block they share (runners/kv_blocks.py: cascade_plan, on
the host, once per batch composition); a first kernel takes a tile of up to TILE_ROWS rows of one group, their query
heads of one KV head stacked as the rows of one matrix, and runs the online softmax over the
group's shared positions, leaving each row and head its partial state (running max, sum and
unnormalised output, float32). Two ways to join the parts (BESIDE):
  - after: the per-row kernel starts from that state at the row's first unshared position, which is
    the log-sum-exp merge without a third kernel; the first kernel's few programs run alone first;
  - beside (CUDA): the first kernel runs on a side stream (captured into the decode graph as a
    parallel branch) while the per-row kernel attends each row's own positions from scratch and
    leaves a grouped row's state in partials of its own; a third kernel merges the two by
    log-sum-exp. The first kernel is a chain of dependent block loads per program, latency more
    than bandwidth, so it hides under the per-row kernel's reads.

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

from .device import role_stream
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
    stride_qb, stride_qh, stride_tb, stride_cs, stride_ch, stride_ct,
    scale,
    H: tl.constexpr, REP: tl.constexpr, ROWS: tl.constexpr, M_PAD: tl.constexpr, D: tl.constexpr,
    BLOCK: tl.constexpr, USE_DOT: tl.constexpr, PRECISION: tl.constexpr, BS: tl.constexpr,
):
    # program (tile, kv head): the tile's rows x REP query heads as M_PAD matrix rows (row-major: matrix row
    # i is tile row i // REP, head kvh * REP + i % REP) over the group's shared positions, read through the
    # first row's table. Partials [B, H] (m, l) and [B, H, D] (acc), float32.
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    length = tl.load(tile_len_ptr + tile)
    if length > 0:
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
        for start in range(0, length, BLOCK):
            n = start + tl.arange(0, BLOCK)
            key_ok = n < length
            offs = base + kv_offset(table_ptr, stride_tb, slot, n, stride_cs, stride_ct, BS, key_ok)[:, None] + d[None, :]
            k = tl.load(k_ptr + offs, mask=key_ok[:, None], other=0.0)  # [BLOCK, D]
            m, l, p, alpha = _scores(q, k, key_ok, m, l, scale, USE_DOT, PRECISION)
            v = tl.load(v_ptr + offs, mask=key_ok[:, None], other=0.0)
            acc = _values(p, alpha, v, acc, USE_DOT, PRECISION)
        part = row * H + head
        tl.store(m_ptr + part, m, mask=ok)
        tl.store(l_ptr + part, l, mask=ok)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=ok[:, None])


@triton.jit
def _merge_kernel(out_ptr, shared_ptr, m_a, l_a, acc_a, m_b, l_b, acc_b, stride_ob, stride_oh,
                  H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr):
    # program (row): a grouped row's two partial states [H] / [H, D] (its group's, its own) -> its output
    row = tl.program_id(0)
    if tl.load(shared_ptr + row) > 0:
        h = tl.arange(0, H_PAD)
        d = tl.arange(0, D)
        ok = h < H
        part = row * H + h
        ma = tl.load(m_a + part, mask=ok, other=0.0)
        mb = tl.load(m_b + part, mask=ok, other=0.0)  # -inf where the row has no own keys yet: beta 0
        m = tl.maximum(ma, mb)
        alpha, beta = tl.exp(ma - m), tl.exp(mb - m)
        l = tl.load(l_a + part, mask=ok, other=1.0) * alpha + tl.load(l_b + part, mask=ok, other=0.0) * beta
        at = part[:, None] * D + d[None, :]
        acc = (tl.load(acc_a + at, mask=ok[:, None], other=0.0) * alpha[:, None]
               + tl.load(acc_b + at, mask=ok[:, None], other=0.0) * beta[:, None])
        tl.store(out_ptr + row * stride_ob + h[:, None] * stride_oh + d[None, :],
                 (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=ok[:, None])


# The parts joined beside (a side stream and a merge) or after (the per-row kernel continues): see the
# docstring; beside is the faster (benchmarks/cascade_attention.py, BENCHMARKS.md: reference voices)
BESIDE = True


def _side_stream(device: torch.device):
    """The first kernel's stream on a CUDA device (high priority: its few programs are placed first); None elsewhere."""
    return role_stream(device, "cascade", priority=-1) if device.type == "cuda" else None


def cascade_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                      slots: torch.Tensor, cascade: CascadeInputs, block: int, precision: str, per_row,
                      out: torch.Tensor) -> None:
    """Decode attention of a planned step into out [B, H, 1, D]: per_row(shared, partials, mode) launches
    runners/decode_attention.py's per-row kernel (mode 1: continue from the partials; 2: leave its own)."""
    b, h, _, d = q.shape
    if not BESIDE:
        per_row(cascade.shared_gpu, shared_prefix(q, k_cache, v_cache, table, slots, cascade, block, precision), 1)
        return
    side = _side_stream(q.device)
    if side is None:  # the interpreter: the same kernels in order
        group = shared_prefix(q, k_cache, v_cache, table, slots, cascade, block, precision)
    else:
        # NOTE: the side stream reads q and writes the group partials; the join below orders the merge after
        # it, and every later use of those buffers (the next layer's kernels) after the merge
        main = torch.cuda.current_stream(q.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            group = shared_prefix(q, k_cache, v_cache, table, slots, cascade, block, precision)
    own = partials(q.device, b, h, d, "own")
    per_row(cascade.shared_gpu, own, 2)
    if side is not None:
        main.wait_stream(side)
    _merge_kernel[(b,)](out, cascade.shared_gpu, *group, *own, out.stride(0), out.stride(1), H=h,
                        H_PAD=triton.next_power_of_2(h), D=d, num_warps=4)


# (device, rows, H, D, which) -> the partial maxima, sums and outputs [rows, H] / [rows, H, D] float32:
# "group" (the first kernel's), "own" (the per-row kernel's, joined beside)
_PARTIALS: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def partials(device: torch.device, rows: int, h: int, d: int,
             which: str = "group") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    key = (device, rows, h, d, which)
    if key not in _PARTIALS:
        # Hazard: made inside a graph capture it would come from the graph's private pool; the decode
        # graphs run every shape eagerly before they capture it (runners/cuda_graphs.py)
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), "made before capture"
        _PARTIALS[key] = (torch.empty(rows, h, device=device), torch.empty(rows, h, device=device),
                          torch.empty(rows, h, d, device=device))
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
    _shared_prefix_kernel[(tiles, kvh)](
        q, k_cache, v_cache, slots, table, cascade.tile_rows_gpu, cascade.tile_len_gpu, m, l, acc,
        q.stride(0), q.stride(1), table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        d ** -0.5, H=h, REP=rep, ROWS=TILE_ROWS, M_PAD=max(16, triton.next_power_of_2(TILE_ROWS * rep)), D=d,
        BLOCK=block, USE_DOT=d >= 16, PRECISION=precision, BS=k_cache.shape[2], num_warps=4)
    return m, l, acc
