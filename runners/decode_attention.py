"""Decode attention as Triton kernels that read the block KV cache in place (CUDA only).

The PyTorch path gathers each row's keys out of the cache (a copy of
B x KVH x K x D per layer, K the batch's key bucket) and then runs SDPA over
it with a mask. This kernel instead reads positions 0:length of [kv head]
through the row's block table (runners/attention.py: KVCache) straight from
the cache, stops at the row's own length, and never touches another row's
keys: one program per (row, KV head), the `rep` query heads that share that
KV head as the rows of one tile. Rows whose prompts share cached blocks read
the same blocks (from L2 when the step's rows read them close together).

A program's arithmetic depends only on its row's query, keys and length and
on the key block (the online softmax rescales at block ends), in a fixed
order, never on the rows' count, the row's place among them or its
batch-mates' key lengths; so CUDA graphs need one capture per row bucket, not
per key-length bucket. The default mode's block follows the row bucket
(_tile), so there a row's bits change with its batch's size; deterministic
mode fixes the block (INVARIANT_TILE) at every row count, one row included.

A one-row step of the default mode takes
its own kernel, because there the eight programs, one per KV head, are each
a chain of dependent block loads as long as the row:
- its keys are split over up to ONE_ROW_SPLITS programs per KV head, and the
  last of them to finish merges their softmaxes in split order (an atomic
  count per head). Rows under SPLIT_FROM_BLOCKS blocks stay whole: there
  the merge costs more than it saves (BENCHMARKS.md, decode attention);
- launched early (runners/device.py: pdl_launch), a program reads its first
  block of keys and values of earlier steps before it waits for the kernel
  that writes this step's, which shortens the step (BENCHMARKS.md, decode
  attention).
So a one-row result differs from the same row's in a wider batch by float32
rounding; so did its projections already (runners/fused_gemv.py).

The CPU has no such kernel; there attention stays in runners/attention.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import pdl_launch
from .cascade_attention import cascade_attention
from .fused_ops import _wait_predecessor, kv_offset
from .online_softmax import _scores, _values

BLOCK_N = 64  # keys per loop iteration (the multi-row kernel: _tile)
INVARIANT_TILE = (BLOCK_N, 4)  # (keys a loop step, warps) of deterministic mode at every row count


def _tile(programs: int, device: torch.device) -> tuple[int, int]:
    """(keys a loop step, warps) of a multi-row call of `programs` programs (rows x KV heads).

    64 keys and 4 warps, except where the call has more programs than the GPU has SMs and at
    most four an SM: there 32 keys and 2 warps are the fastest (the H200's 32- and 64-row
    buckets: 256 and 512 programs on 132 SMs; 64 keys' 3-stage pipeline keeps 96 KB of tiles,
    two programs an SM), timed L2-cold as in a step (BENCHMARKS.md, decode attention). At 128
    and 256 rows 64 keys and 4 warps are the fastest or level. The block is part of a row's
    arithmetic (where the online softmax rescales; the warps at most the last bit), so the
    choice depends only on the step's row bucket and the device: deterministic mode, whose
    steps are always 64 rows, always takes the same."""
    if device.type != "cuda":
        return BLOCK_N, 4
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return (32, 2) if sms < programs <= 4 * sms else (BLOCK_N, 4)


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, lengths_ptr, table_ptr, shared_ptr, m_part_ptr, l_part_ptr,
    acc_part_ptr, stride_qb, stride_qh, stride_ob, stride_oh, stride_tb, stride_cs, stride_ch, stride_ct,
    scale,
    REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr, BS: tl.constexpr,
    PDL: tl.constexpr, CASCADE: tl.constexpr,
):
    # rows > 1 in the default mode (one row: _one_row_kernel below), any rows in deterministic mode.
    # Keys are loaded before, values after the scores: loading both first, the first block outside
    # the loop, was slower (BENCHMARKS.md, decode attention)
    _wait_predecessor(PDL)  # launched early (deterministic mode's one row): wait before any read
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)  # int64: slot * stride_cs can pass 2^31
    length = tl.load(lengths_ptr + row)
    r = tl.arange(0, REP_PAD)
    d = tl.arange(0, D)
    head_ok = r < REP  # tl.dot needs >= 16 rows: the query heads are padded with zero rows
    heads = kvh * REP + r
    q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=head_ok[:, None], other=0.0)
    head = kvh.to(tl.int64) * stride_ch
    m = tl.full([REP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([REP_PAD], tl.float32)
    acc = tl.zeros([REP_PAD, D], tl.float32)
    begin = 0
    part = row * (REP * tl.num_programs(1)) + heads  # partials [B, H] (a cascade's)
    if CASCADE > 0:  # the first `begin` keys are the row's group's (runners/cascade_attention.py)
        begin = tl.load(shared_ptr + row)
    if CASCADE == 1:  # attended already: continue from the group's partials
        if begin > 0:
            m = tl.load(m_part_ptr + part, mask=head_ok, other=float("-inf"))
            l = tl.load(l_part_ptr + part, mask=head_ok, other=0.0)
            acc = tl.load(acc_part_ptr + part[:, None] * D + d[None, :], mask=head_ok[:, None], other=0.0)
    for start in range(begin, length, BLOCK):
        n = start + tl.arange(0, BLOCK)
        key_ok = n < length
        at = kv_offset(table_ptr, stride_tb, slot, n, stride_cs, stride_ct, BS, key_ok)  # [BLOCK]
        offs = head + at[:, None] + d[None, :]
        k = tl.load(k_ptr + offs, mask=key_ok[:, None], other=0.0)  # [BLOCK, D]
        m, l, p, alpha = _scores(q, k, key_ok, m, l, scale, USE_DOT, PRECISION)
        v = tl.load(v_ptr + offs, mask=key_ok[:, None], other=0.0)
        acc = _values(p, alpha, v, acc, USE_DOT, PRECISION)
    out = acc / l[:, None]  # every row has length >= 1, so l > 0 (a grouped row's is not stored below)
    store = head_ok
    if CASCADE == 2:  # the group's part runs beside this kernel: a grouped row leaves its own part's state
        grouped = head_ok & (begin > 0)
        tl.store(m_part_ptr + part, m, mask=grouped)
        tl.store(l_part_ptr + part, l, mask=grouped)
        tl.store(acc_part_ptr + part[:, None] * D + d[None, :], acc, mask=grouped[:, None])
        store = head_ok & (begin == 0)
    tl.store(out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=store[:, None])


@triton.jit
def _one_row_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, lengths_ptr, table_ptr, m_part_ptr, l_part_ptr, acc_part_ptr,
    count_ptr, stride_qh, stride_oh, stride_tb, stride_cs, stride_ch, stride_ct,
    scale,
    REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr, BS: tl.constexpr,
    SPLITS: tl.constexpr, SPLIT_FROM: tl.constexpr, PDL: tl.constexpr,
):
    # One row: program (kv head, split) takes `per` blocks of the row's keys; the last of a head's
    # programs to finish merges their softmaxes (in split order, so the result is the same
    # whichever came last).
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    # Ahead of the wait for the kernel before (launched early: runners/device.py, pdl_launch), what
    # no kernel of this step writes: the step's slot and length (copied in before its first
    # kernel; block tables change only between steps) and this program's first block of keys and
    # values of earlier steps. Hazard: position
    # length - 1 is this step's, written by the kernel before, so it is read after the wait.
    slot = tl.load(slots_ptr).to(tl.int64)
    length = tl.load(lengths_ptr)
    blocks = tl.cdiv(length, BLOCK)
    # the split depends on the row's length only; rows of fewer than SPLIT_FROM blocks stay whole
    # (the merge costs more than it saves there)
    per = tl.where(blocks < SPLIT_FROM, blocks, tl.cdiv(blocks, SPLITS))
    parts = tl.cdiv(blocks, per)  # programs of this head that have keys
    first = split * per * BLOCK
    if first < length:
        d = tl.arange(0, D)
        n = first + tl.arange(0, BLOCK)
        k_base = k_ptr + kvh.to(tl.int64) * stride_ch
        v_base = v_ptr + kvh.to(tl.int64) * stride_ch
        at = kv_offset(table_ptr, stride_tb, slot, n, stride_cs, stride_ct, BS, n < length)
        offs = at[:, None] + d[None, :]  # [BLOCK, D]
        old = (n < length - 1)[:, None]
        k = tl.load(k_base + offs, mask=old, other=0.0)
        v = tl.load(v_base + offs, mask=old, other=0.0)
        _wait_predecessor(PDL)
        new = (n == length - 1)[:, None]  # this step's key and value, if in this block
        k = tl.where(new, tl.load(k_base + offs, mask=new, other=0.0), k)
        v = tl.where(new, tl.load(v_base + offs, mask=new, other=0.0), v)
        r = tl.arange(0, REP_PAD)
        head_ok = r < REP
        heads = kvh * REP + r
        q = tl.load(q_ptr + heads[:, None] * stride_qh + d[None, :], mask=head_ok[:, None], other=0.0)
        m, l, p, alpha = _scores(q, k, n < length, tl.full([REP_PAD], float("-inf"), tl.float32),
                                 tl.zeros([REP_PAD], tl.float32), scale, USE_DOT, PRECISION)
        acc = _values(p, alpha, v, tl.zeros([REP_PAD, D], tl.float32), USE_DOT, PRECISION)
        for start in range(first + BLOCK, tl.minimum(length, first + per * BLOCK), BLOCK):
            nb = start + tl.arange(0, BLOCK)
            key_ok = nb < length
            offs = kv_offset(table_ptr, stride_tb, slot, nb, stride_cs, stride_ct, BS, key_ok)[:, None] + d[None, :]
            k = tl.load(k_base + offs, mask=key_ok[:, None], other=0.0)  # [BLOCK, D]
            m, l, p, alpha = _scores(q, k, key_ok, m, l, scale, USE_DOT, PRECISION)
            v = tl.load(v_base + offs, mask=key_ok[:, None], other=0.0)
            acc = _values(p, alpha, v, acc, USE_DOT, PRECISION)
        last = True
        if parts > 1:
            part = (kvh * SPLITS + split) * REP_PAD + r
            tl.store(m_part_ptr + part, m)
            tl.store(l_part_ptr + part, l)
            tl.store(acc_part_ptr + part[:, None] * D + d[None, :], acc)
            tl.debug_barrier()  # every thread's partials stored before the release below
            last = tl.atomic_add(count_ptr + kvh, 1, sem="acq_rel", scope="gpu") == parts - 1
            if last:
                m = tl.full([REP_PAD], float("-inf"), tl.float32)
                l = tl.zeros([REP_PAD], tl.float32)
                acc = tl.zeros([REP_PAD, D], tl.float32)
                for j in range(0, parts):
                    part_j = (kvh * SPLITS + j) * REP_PAD + r
                    # .cg: from L2, where the other programs' stores are; this SM's L1 may hold
                    # an older layer's partials
                    m_j = tl.load(m_part_ptr + part_j, cache_modifier=".cg")
                    m_new = tl.maximum(m, m_j)
                    alpha, beta = tl.exp(m - m_new), tl.exp(m_j - m_new)
                    l = l * alpha + tl.load(l_part_ptr + part_j, cache_modifier=".cg") * beta
                    acc_j = tl.load(acc_part_ptr + part_j[:, None] * D + d[None, :], cache_modifier=".cg")
                    acc = acc * alpha[:, None] + acc_j * beta[:, None]
                    m = m_new
                tl.store(count_ptr + kvh, 0)  # ready for the next call (kernels run in order)
        if last:
            out = acc / l[:, None]  # every row has length >= 1, so l > 0
            tl.store(out_ptr + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
                     mask=head_ok[:, None])


# Splits of a one-row step's keys: at one row the 8 programs (one per KV head) were each a chain of
# dependent block loads as long as the row; split, each has at most a few blocks.
ONE_ROW_SPLITS = 8
SPLIT_FROM_BLOCKS = 3
# (device, KV heads, REP_PAD, D) -> the one-row kernel's partial maxima, sums, outputs, counters
_WORKSPACES: dict[tuple, tuple[torch.Tensor, ...]] = {}


def _workspace(device: torch.device, kvh: int, rep_pad: int, d: int) -> tuple[torch.Tensor, ...]:
    key = (device, kvh, rep_pad, d)
    if key not in _WORKSPACES:
        # Hazard: made inside a graph capture it would come from the graph's private pool; the
        # decode graphs run every shape eagerly before they capture it (runners/cuda_graphs.py)
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), "made before capture"
        n = kvh * ONE_ROW_SPLITS * rep_pad
        _WORKSPACES[key] = (torch.empty(n, device=device), torch.empty(n, device=device),
                            torch.empty(n * d, device=device), torch.zeros(kvh, dtype=torch.int32, device=device))
    return _WORKSPACES[key]


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                     slots: torch.Tensor, lengths: torch.Tensor, invariant: bool = False,
                     cascade=None) -> torch.Tensor:
    """q [B, H, 1, D]; k/v_cache one layer's blocks [N, KVH, BS, D] (contiguous); table [S, width]
    int32, each slot's blocks (runners/attention.py: KVCache); slots [B]; lengths [B] (keys per row,
    >= 1, positions 0..length-1 already written) -> [B, H, 1, D]. D a power of two.
    invariant: a row's bits whatever B (deterministic mode): the multi-row kernel at every B,
    with INVARIANT_TILE, never the row bucket's tile nor the one-row kernel's split keys.
    cascade: runners/cascade_attention.py's CascadeInputs (rows > 1, default mode): grouped rows'
    shared positions attended once a tile of the group, the rest per row."""
    b, h, _, d = q.shape
    kvh = k_cache.shape[1]
    rep = h // kvh
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    out = torch.empty((b, 1, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)  # o_proj reads [B, 1, H*D]
    rep_pad = max(16, triton.next_power_of_2(rep))
    block, warps = INVARIANT_TILE if invariant else (BLOCK_N, 4) if b == 1 else _tile(b * kvh, q.device)
    # float32 (parity runs) multiplies in full precision, not TF32
    shape = dict(REP=rep, REP_PAD=rep_pad, D=d, BLOCK=block, USE_DOT=d >= 16,
                 PRECISION="ieee" if q.dtype == torch.float32 else "tf32", BS=k_cache.shape[2])
    strides = (table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    if b == 1 and not invariant:
        early = pdl_launch(q.device, b)
        _one_row_kernel[(kvh, ONE_ROW_SPLITS)](
            q, k_cache, v_cache, out, slots, lengths, table, *_workspace(q.device, kvh, rep_pad, d), q.stride(1),
            out.stride(1), *strides, d ** -0.5, **shape, SPLITS=ONE_ROW_SPLITS, SPLIT_FROM=SPLIT_FROM_BLOCKS,
            PDL=bool(early), **early)
    else:
        early = pdl_launch(q.device, b) if invariant else {}

        def per_row(shared: torch.Tensor, parts, mode: int) -> None:
            _decode_attention_kernel[(b, kvh)](q, k_cache, v_cache, out, slots, lengths, table, shared, *parts,
                                               q.stride(0), q.stride(1), out.stride(0), out.stride(1), *strides,
                                               d ** -0.5, **shape, PDL=bool(early), CASCADE=mode,
                                               num_warps=warps, **early)

        if cascade is not None and not invariant:
            cascade_attention(q, k_cache, v_cache, table, slots, cascade, block, shape["PRECISION"], per_row, out)
        else:  # without a cascade the kernel reads neither the shared lengths nor the partials (any tensor will do)
            per_row(lengths, (q, q, q), 0)
    return out
