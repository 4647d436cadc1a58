"""Decode attention as one Triton kernel that reads the slot KV cache in place (CUDA only).

The PyTorch path gathers each row's keys out of the slot cache (a copy of
B x KVH x K x D per layer, K the batch's key bucket) and then runs SDPA over
it with a mask. This kernel instead reads [slot, kv head, 0:length] straight
from the cache, stops at the row's own length, and never touches another
row's keys: one program per (row, KV head), the `rep` query heads that share
that KV head as the rows of one tile.

Batch invariance comes for free: a program's arithmetic depends only on its
row's query, keys and length (fixed key blocks in a fixed order, an exact
online softmax), never on the batch size, the row's place in it or the key
bucket of its batch-mates. So default and deterministic decode share it, and
CUDA graphs need one capture per row bucket, not per key-length bucket.

Launched early (one-row steps: runners/device.py, pdl_launch), a program
reads its first block of keys and values of earlier steps before it waits
for the kernel that writes this step's: a one-row step took 2.146 ms with
that read ahead of the wait, 2.190 with it after (benchmarks/gemv_step.py
with the read behind a switch, H200).

The CPU has no such kernel; there attention stays in runners/attention.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runners.device import pdl_launch
from runners.fused_ops import _wait_predecessor

BLOCK_N = 64  # keys per loop iteration


@triton.jit
def _attend(q, k, v, key_ok, m, l, acc, scale, USE_DOT: tl.constexpr):
    """One block of keys into the online softmax: q [REP_PAD, D]; k, v [BLOCK, D]; key_ok [BLOCK];
    m, l [REP_PAD] and acc [REP_PAD, D] float32, returned updated."""
    if USE_DOT:
        s = tl.dot(q, tl.trans(k)) * scale  # [REP_PAD, BLOCK] float32
    else:  # head_dim < 16 (test models): tl.dot needs K >= 16
        s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2) * scale
    s = tl.where(key_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    if USE_DOT:
        pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.sum(p.to(v.dtype).to(tl.float32)[:, :, None] * v.to(tl.float32)[None, :, :], 1)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, lengths_ptr,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_cs, stride_ch, stride_ct,
    scale,
    REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, USE_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    # Ahead of the wait for the kernel before (launched early: runners/device.py, pdl_launch), what
    # no kernel of this step writes: the step's slots and lengths (copied in before its first
    # kernel) and the first block's keys and values of earlier steps. Hazard: position length - 1
    # is this step's, written by the kernel before, so it is read after the wait.
    slot = tl.load(slots_ptr + row).to(tl.int64)  # int64: slot * stride_cs can pass 2^31
    length = tl.load(lengths_ptr + row)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK)
    offs = slot * stride_cs + kvh * stride_ch + n[:, None] * stride_ct + d[None, :]  # [BLOCK, D], block 0
    old = (n < length - 1)[:, None]
    k = tl.load(k_ptr + offs, mask=old, other=0.0)
    v = tl.load(v_ptr + offs, mask=old, other=0.0)
    _wait_predecessor(PDL)
    new = (n == length - 1)[:, None]  # this step's key and value, if in block 0
    k = tl.where(new, tl.load(k_ptr + offs, mask=new, other=0.0), k)
    v = tl.where(new, tl.load(v_ptr + offs, mask=new, other=0.0), v)
    r = tl.arange(0, REP_PAD)
    head_ok = r < REP  # tl.dot needs >= 16 rows: the query heads are padded with zero rows
    heads = kvh * REP + r
    q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=head_ok[:, None], other=0.0)
    m = tl.full([REP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([REP_PAD], tl.float32)
    acc = tl.zeros([REP_PAD, D], tl.float32)
    m, l, acc = _attend(q, k, v, n < length, m, l, acc, scale, USE_DOT)
    for start in range(BLOCK, length, BLOCK):
        key_ok = start + n < length
        offs += BLOCK * stride_ct
        k = tl.load(k_ptr + offs, mask=key_ok[:, None], other=0.0)  # [BLOCK, D]
        v = tl.load(v_ptr + offs, mask=key_ok[:, None], other=0.0)
        m, l, acc = _attend(q, k, v, key_ok, m, l, acc, scale, USE_DOT)
    out = acc / l[:, None]  # every row has length >= 1, so l > 0
    tl.store(out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_ok[:, None])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor) -> torch.Tensor:
    """q [B, H, 1, D]; k/v_cache one layer [S, KVH, L, D] (contiguous); slots [B]; lengths [B]
    (keys per row, >= 1, positions 0..length-1 already written) -> [B, H, 1, D]. D a power of two."""
    b, h, _, d = q.shape
    kvh = k_cache.shape[1]
    rep = h // kvh
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    out = torch.empty((b, 1, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)  # o_proj reads [B, 1, H*D]
    early = pdl_launch(q.device, b)
    _decode_attention_kernel[(b, kvh)](
        q, k_cache, v_cache, out, slots, lengths,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        d ** -0.5,
        REP=rep, REP_PAD=max(16, triton.next_power_of_2(rep)), D=d, BLOCK=BLOCK_N, USE_DOT=d >= 16,
        PDL=bool(early), **early,
    )
    return out
