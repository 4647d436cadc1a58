"""Attention over a few keys with its rope and KV write in the same kernel (Triton; CUDA only).

The code predictor attends over at most 16 keys (its frame's positions), 75 times a frame. The
general path is two kernels, rope_kv_write then decode_attention (the latter built for long rows:
key blocks, an online softmax, split keys at one row). Here one program per (row, KV head) takes
its query heads, key head and value head out of the fused qkv row, RMS-norms each head (Qwen3's
q_norm / k_norm), rotates q and k, stores k and v at [slot, kv head, position], and attends over
the row's keys: those before the position from the cache, this step's from registers (no other
program reads them, so no barrier). Rounding as rope_kv_write's; the softmax and p @ v in float32
from the 16-bit keys and values, in key order. A program's arithmetic depends only on its row, so
a row's bits do not depend on the batch (deterministic mode takes it as the default mode does).
Hazard: every key but the step's own must be in the cache before the launch: two tokens of one
row in one launch would race (the predictor's first forward takes the two-kernel path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import pdl_launch
from .fused_ops import _wait_predecessor, head_norm, rotate


@triton.jit
def _short_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, slots_ptr, lengths_ptr, qw_ptr, kw_ptr, eps,
                            k_cache_ptr, v_cache_ptr, out_ptr, stride_cs, stride_ch, stride_ct, scale,
                            H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, REP: tl.constexpr,
                            REP_POW2: tl.constexpr, KEYS: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr):
    _wait_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    pos = tl.load(pos_ptr + row)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    length = tl.load(lengths_ptr + row)
    r = tl.arange(0, REP_POW2)[:, None]  # this KV head's query heads, [REP_POW2, 1]
    half = tl.arange(0, D // 2)[None, :]
    src = qkv_ptr + row * (H + 2 * KVH) * D
    q_ok = r < REP
    q_head = src + (kvh * REP + r) * D
    q1 = tl.load(q_head + half, mask=q_ok, other=0.0)
    q2 = tl.load(q_head + D // 2 + half, mask=q_ok, other=0.0)
    k1 = tl.load(src + (H + kvh) * D + half)  # [1, D/2]
    k2 = tl.load(src + (H + kvh) * D + D // 2 + half)
    v1 = tl.load(src + (H + KVH + kvh) * D + half)
    v2 = tl.load(src + (H + KVH + kvh) * D + D // 2 + half)
    if QK_NORM:
        q1, q2 = head_norm(q1, q2, qw_ptr, half, eps, D)
        k1, k2 = head_norm(k1, k2, kw_ptr, half, eps, D)
    q1, q2 = rotate(q1, q2, half, pos, cos_ptr, sin_ptr, D)
    k1, k2 = rotate(k1, k2, half, pos, cos_ptr, sin_ptr, D)
    base = slot * stride_cs + kvh.to(tl.int64) * stride_ch
    tl.store(k_cache_ptr + base + pos * stride_ct + half, k1)
    tl.store(k_cache_ptr + base + pos * stride_ct + D // 2 + half, k2)
    tl.store(v_cache_ptr + base + pos * stride_ct + half, v1)
    tl.store(v_cache_ptr + base + pos * stride_ct + D // 2 + half, v2)
    n = tl.arange(0, KEYS)[:, None]  # key positions [KEYS, 1]
    earlier = n < tl.minimum(length, pos)
    here = n == pos
    at = base + n * stride_ct
    kk1 = tl.where(here, k1, tl.load(k_cache_ptr + at + half, mask=earlier, other=0.0)).to(tl.float32)  # [KEYS, D/2]
    kk2 = tl.where(here, k2, tl.load(k_cache_ptr + at + D // 2 + half, mask=earlier, other=0.0)).to(tl.float32)
    vv1 = tl.where(here, v1, tl.load(v_cache_ptr + at + half, mask=earlier, other=0.0)).to(tl.float32)
    vv2 = tl.where(here, v2, tl.load(v_cache_ptr + at + D // 2 + half, mask=earlier, other=0.0)).to(tl.float32)
    # scores [REP_POW2, KEYS]: q . k over both halves
    s = tl.sum(q1.to(tl.float32)[:, None, :] * kk1[None, :, :], 2) + tl.sum(q2.to(tl.float32)[:, None, :] * kk2[None, :, :], 2)
    keys_ok = tl.arange(0, KEYS)[None, :] < length
    s = tl.where(keys_ok, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]
    o1 = tl.sum(p[:, :, None] * vv1[None, :, :], 1)  # [REP_POW2, D/2]
    o2 = tl.sum(p[:, :, None] * vv2[None, :, :], 1)
    dst = out_ptr + row * H * D + (kvh * REP + r) * D
    tl.store(dst + half, o1.to(out_ptr.dtype.element_ty), mask=q_ok)
    tl.store(dst + D // 2 + half, o2.to(out_ptr.dtype.element_ty), mask=q_ok)


def short_attention(qkv: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                    slots: torch.Tensor, lengths: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    n_heads: int, n_kv: int, qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None,
                    max_keys: int) -> torch.Tensor:
    """rope_kv_write then decode_attention in one kernel, for rows of at most max_keys keys.
    qkv [B, (H + 2 KVH) * D]; cos/sin [L, D] float32; positions, slots, lengths [B] (keys
    0..length-1, this step's at its position); k/v_cache one layer [S, KVH, L, D]; qk_norm
    (q weight, k weight, eps) or None -> attention output [B, H * D] in qkv's dtype."""
    b = qkv.shape[0]
    d = cos_table.shape[1]
    rep = n_heads // n_kv
    out = torch.empty((b, n_heads * d), dtype=qkv.dtype, device=qkv.device)
    qw, kw, eps = qk_norm if qk_norm is not None else (qkv, qkv, 0.0)
    early = pdl_launch(qkv.device, b)
    _short_attention_kernel[(b, n_kv)](
        qkv.contiguous(), cos_table, sin_table, positions, slots, lengths, qw, kw, eps, k_cache, v_cache, out,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), d ** -0.5, H=n_heads, KVH=n_kv, D=d, REP=rep,
        REP_POW2=triton.next_power_of_2(rep), KEYS=triton.next_power_of_2(max_keys), QK_NORM=qk_norm is not None,
        PDL=bool(early), **early)
    return out
