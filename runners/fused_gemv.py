"""Batch-1 decode projections as one Triton GEMV each, with their neighbours fused in (CUDA only).

At one row a decode step of the 3B model is weight reads (5.4 GB a step),
but cuBLAS's GEMMs fall short of the copy bandwidth and the step ran hundreds
of kernels (split-K reduces, norms, silu·up), each with a ramp-up and a tail
in which the memory system idles (BENCHMARKS.md, few-row projections). This
kernel streams a weight matrix once for one row and absorbs the elementwise
work around it, so a decoder layer is five kernels:

  norm + QKV + rope + KV write   qkv_rope: rmsnorm(x) * g in, rotated q out, k and v to the cache
  attention                      runners/decode_attention.py
  o_proj + residual              x + W a (EPILOGUE 1)
  norm + gate/up + silu·up       silu(W_gate h) * (W_up h) (NORM, EPILOGUE 2)
  down + residual                x + W a (EPILOGUE 1)

A program keeps two weight tiles in flight: the next one is loaded before
the current one's products. The kernels launch early where the GPU can
(runners/device.py: pdl_launch) and load their first tile before they wait
for their predecessor, so one matrix's reads start in the tail of the kernel
before. The two-tile kernels read 1024 of the 3072 columns there, twice
their loop's tile, which shortens the step; the one-matrix kernels gain
nothing from it, and 4096 columns (fewer programs resident) lose time
(BENCHMARKS.md, few-row projections).

Rounding follows the PyTorch ops it replaces (runners/fused_ops.py): each
bf16 result is rounded once, the norm and the dot products accumulate in
float32. Only the order of the float32 sums differs from cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import pdl_launch
from .fused_ops import _rope_store

MAX_ROWS = 1  # the widest decode step on these kernels (cuBLAS above: BENCHMARKS.md, few-row projections)
# per program: rows of the weight, columns a loop step, warps, columns read ahead of the wait
# (BENCHMARKS.md, few-row projections); PAIRED_TILE for the kernels that read two tiles a
# step (gate and up; the two halves of a head)
TILE = (4, 1024, 4, 1024)
PAIRED_TILE = (4, 512, 4, 1024)


@triton.jit
def _input(x_ptr, g_ptr, cols, c_ok, rstd, NORM: tl.constexpr):
    """The input columns `cols` as a float32 row [1, C]: x, or rmsnorm(x) * g with NORM (as
    add_rmsnorm: the normed value rounded, then times the weight, rounded)."""
    xc = tl.load(x_ptr + cols, mask=c_ok, other=0.0)
    if NORM:
        normed = (xc.to(tl.float32) * rstd).to(xc.dtype)
        gw = tl.load(g_ptr + cols, mask=c_ok, other=0.0)
        xc = (gw.to(tl.float32) * normed.to(tl.float32)).to(xc.dtype)
    return xc.to(tl.float32)[None, :]


@triton.jit
def _dots(x_ptr, g_ptr, w_rows, w2_rows, row_ok, k, eps, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr,
          K_POW2: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr, PDL: tl.constexpr):
    """The dot products of one program: acc [R] = w_rows[R, :k] . h, and acc2 likewise over
    w2_rows when TWO; h = x [k], or rmsnorm(x) * g with NORM. float32."""
    # columns 0..PRE_K as one tile ahead of the wait: weights are never written, so these
    # reads may overlap the kernel before (masked past k: no reads)
    offs_p = tl.arange(0, PRE_K)
    p_ok = row_ok[:, None] & (offs_p < k)[None, :]
    wp = tl.load(w_rows + offs_p[None, :], mask=p_ok, other=0.0)
    wp2 = wp
    if TWO:
        wp2 = tl.load(w2_rows + offs_p[None, :], mask=p_ok, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rstd = 1.0
    if NORM:  # the whole row once for its rms (k <= K_POW2; the row sits in L2 for every program)
        kk = tl.arange(0, K_POW2)
        xr = tl.load(x_ptr + kk, mask=kk < k, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xr * xr, 0) / k + eps)
    offs_k = tl.arange(0, BLOCK_K)
    # then BLOCK_K columns at a time, the next tile(s) in flight while this one's products run
    cols = PRE_K + offs_k
    w_ok = row_ok[:, None] & (cols < k)[None, :]
    w = tl.load(w_rows + cols[None, :], mask=w_ok, other=0.0)
    w2 = w
    if TWO:
        w2 = tl.load(w2_rows + cols[None, :], mask=w_ok, other=0.0)
    xp = _input(x_ptr, g_ptr, offs_p, offs_p < k, rstd, NORM)  # [1, PRE_K]
    acc = tl.sum(wp.to(tl.float32) * xp, 1)
    acc2 = acc
    if TWO:
        acc2 = tl.sum(wp2.to(tl.float32) * xp, 1)
    for start in range(PRE_K, k, BLOCK_K):
        cols = start + offs_k
        nxt = cols + BLOCK_K
        nxt_ok = row_ok[:, None] & (nxt < k)[None, :]
        w_next = tl.load(w_rows + nxt[None, :], mask=nxt_ok, other=0.0)
        w2_next = w_next
        if TWO:
            w2_next = tl.load(w2_rows + nxt[None, :], mask=nxt_ok, other=0.0)
        xf = _input(x_ptr, g_ptr, cols, cols < k, rstd, NORM)
        acc += tl.sum(w.to(tl.float32) * xf, 1)
        if TWO:
            acc2 += tl.sum(w2.to(tl.float32) * xf, 1)
        w, w2 = w_next, w2_next
    return acc, acc2


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, g_ptr, res_ptr, y_ptr, n, k, eps,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr,
                 K_POW2: tl.constexpr, NORM: tl.constexpr, EPILOGUE: tl.constexpr, PDL: tl.constexpr):
    # x [k]; w [n, k] ([2n, k] for EPILOGUE 2: gate rows, then up rows); y, res [n]
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * k  # [BLOCK_N, 1]
    acc, acc2 = _dots(x_ptr, g_ptr, w_rows, w_rows + n.to(tl.int64) * k, n_ok, k, eps,
                      BLOCK_K, PRE_K, K_POW2, NORM, EPILOGUE == 2, PDL)
    dt = x_ptr.dtype.element_ty
    y = acc.to(dt)  # F.linear's rounding
    if EPILOGUE == 1:  # residual + delta, rounded (add_rmsnorm's sum)
        res = tl.load(res_ptr + offs_n, mask=n_ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(dt)
    if EPILOGUE == 2:  # silu_mul: silu(gate) rounded, times up, rounded
        g32 = y.to(tl.float32)
        s = (g32 / (1.0 + tl.exp(-g32))).to(dt)
        y = (s.to(tl.float32) * acc2.to(dt).to(tl.float32)).to(dt)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _qkv_rope_kernel(x_ptr, w_ptr, g_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                     table_ptr, k, eps, stride_tb, stride_cs, stride_ch, stride_ct,
                     H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr, K_POW2: tl.constexpr,
                     PDL: tl.constexpr):
    # one row. Program p: head p // (D / 2 / BLOCK_N) of the H + 2 KVH (queries, keys, values),
    # dims j..j+BLOCK_N of both halves of it, the pairs the rotary embedding mixes
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    per_head: tl.constexpr = D // 2 // BLOCK_N
    head = tl.program_id(0) // per_head
    half = (tl.program_id(0) % per_head) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] in 0..D/2
    w_rows = w_ptr + (head * D + half).to(tl.int64)[:, None] * k
    a1, a2 = _dots(x_ptr, g_ptr, w_rows, w_rows + (D // 2) * k, half < D // 2, k, eps,
                   BLOCK_K, PRE_K, K_POW2, True, True, PDL)
    dt = x_ptr.dtype.element_ty
    x1, x2 = a1.to(dt), a2.to(dt)  # F.linear's rounding, then rope_kv_write's arithmetic
    _rope_store(x1, x2, half, head, tl.load(pos_ptr), tl.load(slot_ptr).to(tl.int64), cos_ptr, sin_ptr,
                q_ptr + head * D, k_cache_ptr, v_cache_ptr, table_ptr, stride_tb, stride_cs, stride_ch, stride_ct,
                H, KVH, D, BS)


def _tile(tile, k: int) -> tuple[int, int, int, int]:
    block_n, block_k, warps, pre_k = tile
    fit = lambda c: max(16, min(c, triton.next_power_of_2(k)))  # noqa: E731
    return block_n, fit(block_k), warps, fit(pre_k)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, norm: tuple[torch.Tensor, float] | None = None,
         residual: torch.Tensor | None = None, silu_mul: bool = False, out_dtype: torch.dtype | None = None,
         tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [1, k] -> [1, n]: x @ weight.T for weight [n, k], rounded to x's dtype, stored as
    out_dtype (default x's).
      norm (g, eps): the input is rmsnorm(x) * g instead of x
      residual [1, n]: returns residual + x @ weight.T
      silu_mul: weight is [2n, k], gate rows then up rows; returns silu(gate) * up [1, n]
      tile (rows of w, columns, warps, columns ahead of the wait) per program: TILE (PAIRED_TILE
      with silu_mul) unless a probe sweeps it"""
    assert x.shape[0] == 1, "one row: wider batches take cuBLAS"
    k = x.shape[1]
    n = weight.shape[0] // (2 if silu_mul else 1)
    y = torch.empty((1, n), dtype=out_dtype or x.dtype, device=x.device)
    block_n, block_k, warps, pre_k = _tile(tile or (PAIRED_TILE if silu_mul else TILE), k)
    early = pdl_launch(x.device, 1)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x.contiguous(), weight, norm[0] if norm else x, residual if residual is not None else x, y,
        n, k, norm[1] if norm else 0.0,
        BLOCK_N=block_n, BLOCK_K=block_k, PRE_K=pre_k, K_POW2=triton.next_power_of_2(k), NORM=norm is not None,
        EPILOGUE=2 if silu_mul else 1 if residual is not None else 0, PDL=bool(early), num_warps=warps, **early)
    return y


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, norm: tuple[torch.Tensor, float], cos_table: torch.Tensor,
             sin_table: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, table: torch.Tensor, n_heads: int, n_kv: int,
             tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """One row's attention input in one kernel: the fused QKV projection of rmsnorm(x) * g, then
    rope_kv_write (runners/fused_ops.py). x [1, hidden]; weight [(H + 2 KVH) * D, hidden];
    cos/sin tables [max_seq_len, D] float32; positions, slots [1]; k/v_cache one layer's blocks and
    table as rope_kv_write's. Writes k (rotated) and v at the row's position; returns rotated q
    [1, H, 1, D]."""
    assert x.shape[0] == 1, "one row: wider batches take cuBLAS"
    d, k = cos_table.shape[1], x.shape[1]
    block_n, block_k, warps, pre_k = _tile(tile or PAIRED_TILE, k)
    assert (d // 2) % block_n == 0, "a program's dims stay within one head"
    q = torch.empty((1, 1, n_heads, d), dtype=x.dtype, device=x.device)
    early = pdl_launch(x.device, 1)
    _qkv_rope_kernel[((n_heads + 2 * n_kv) * (d // 2 // block_n),)](
        x.contiguous(), weight, norm[0], cos_table, sin_table, positions, slots, q, k_cache, v_cache, table,
        k, norm[1], table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), H=n_heads, KVH=n_kv,
        D=d, BS=k_cache.shape[2],
        BLOCK_N=block_n, BLOCK_K=block_k, PRE_K=pre_k, K_POW2=triton.next_power_of_2(k), PDL=bool(early),
        num_warps=warps, **early)
    return q.transpose(1, 2)
