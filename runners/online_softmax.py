"""One block of keys into a flash-style online softmax: the steps every decode-attention kernel shares
(runners/decode_attention.py, runners/cascade_attention.py). A query tile's rows are query heads (of one
row, or of a group's rows stacked); the running max, sum and accumulator stay float32."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scores(q, k, key_ok, m, l, scale, USE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One block of keys into the online softmax: q [REP_PAD, D]; k [BLOCK, D]; key_ok [BLOCK];
    m, l [REP_PAD] float32 -> (m, l updated; p [REP_PAD, BLOCK]; alpha [REP_PAD], the old terms' factor)."""
    if USE_DOT:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [REP_PAD, BLOCK] float32
    else:  # head_dim < 16 (test models): tl.dot needs K >= 16
        s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2) * scale
    s = tl.where(key_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l * alpha + tl.sum(p, 1), p, alpha


@triton.jit
def _values(p, alpha, v, acc, USE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """acc [REP_PAD, D] float32 rescaled by alpha, plus p [REP_PAD, BLOCK] @ v [BLOCK, D]."""
    if USE_DOT:
        pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    else:
        pv = tl.sum(p.to(v.dtype).to(tl.float32)[:, :, None] * v.to(tl.float32)[None, :, :], 1)
    return acc * alpha[:, None] + pv
