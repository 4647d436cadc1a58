"""Fused elementwise kernels of the CUDA decode step and codec (Triton; CUDA only).

An unfused decode layer runs about 50 kernels (the RMSNorm alone is eight:
cast, square, mean, add, rsqrt, multiply, cast, weight), so a CUDA-graphed
step of the 3B model spends more time between and inside tiny kernels than
in its GEMMs. These kernels do the same arithmetic, rounding where the
PyTorch ops round (every bf16 op result is rounded to bf16; reductions and
the norm run in float32), in one pass each:
  add_rmsnorm     x + delta (rounded), then RMSNorm of the sum: 2 outputs
  rope_kv_write   rotary embedding of q and k from a fused qkv row (Qwen3: each
                  head RMS-normed first), q to a buffer, k and v straight into
                  the slot KV cache
  silu_mul        silu(gate) * up from a fused gate_up row
  snake           the codec's Snake activation (runners/higgs_audio_v2/codec.py),
                  optionally zero past each row's length (its padded batches), of
                  a convolution's output plus its bias and a residual
In a one-row decode step the kernels among them launch early where the GPU
can (runners/device.py: pdl_launch): they wait for their predecessor first thing.
The CPU keeps the PyTorch forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import pdl_launch


@triton.jit
def _wait_predecessor(PDL: tl.constexpr):
    # an early-launched kernel: let the next one launch, then wait until this one's inputs are written
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def _add_rmsnorm_kernel(x_ptr, delta_ptr, bias_ptr, w_ptr, x_out_ptr, h_out_ptr, n, rows, eps,
                        HAS_DELTA: tl.constexpr, PARTS: tl.constexpr, HAS_BIAS: tl.constexpr,
                        BLOCK: tl.constexpr, PDL: tl.constexpr):
    # delta: [rows, n] in x's dtype, or PARTS > 0: float32 partial sums [PARTS, rows, n] of a projection
    _wait_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        if PARTS > 0:  # the partials in index order, + bias, rounded once: F.linear's result
            d = tl.load(delta_ptr + row * n + cols, mask=ok, other=0.0)
            for s in tl.static_range(1, PARTS):
                d += tl.load(delta_ptr + (s * rows + row) * n + cols, mask=ok, other=0.0)
            if HAS_BIAS:
                d += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            d = d.to(x.dtype)
        else:
            d = tl.load(delta_ptr + row * n + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(x_out_ptr + row * n + cols, x, mask=ok)
    x32 = x.to(tl.float32)
    normed = (x32 * tl.rsqrt(tl.sum(x32 * x32, 0) / n + eps)).to(x.dtype)  # rounded, then the weight
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(h_out_ptr + row * n + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=ok)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                parts: bool = False, bias: torch.Tensor | None = None):
    """x, delta [..., n] -> (x + delta, rmsnorm(x + delta) * weight); delta None: (x, rmsnorm(x) * weight).
    parts: delta is float32 [S, rows, n] (invariant_mm_parts), added as sum(delta) + bias rounded to x's dtype."""
    n = x.shape[-1]
    rows = x.numel() // n
    x = x.contiguous()
    h = torch.empty_like(x)
    x_out = torch.empty_like(x) if delta is not None else x
    early = pdl_launch(x.device, rows)
    _add_rmsnorm_kernel[(rows,)](x, delta.contiguous() if delta is not None else x,
                                 bias if bias is not None else x, weight, x_out, h, n, rows, eps,
                                 HAS_DELTA=delta is not None, PARTS=delta.shape[0] if parts else 0,
                                 HAS_BIAS=bias is not None, BLOCK=triton.next_power_of_2(n),
                                 PDL=bool(early), **early)
    return x_out, h


@triton.jit
def rotate(x1, x2, half, pos, cos_ptr, sin_ptr, D: tl.constexpr):
    # the reference: q * cos + rotate_half(q) * sin, each product and the sum
    # rounded to the activation dtype; the float32 tables are cast first.
    # HAZARD: on the H200 the compiled kernel does not round as written: its q differs from
    # that formula in PyTorch in many values of a row, as if the bf16 round trips of the
    # tables and products were folded away and only the sum rounded.
    # The GPU test holds it to float64 rope within three bf16 roundings instead.
    dt = x1.dtype
    c1 = tl.load(cos_ptr + pos * D + half).to(dt).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * D + D // 2 + half).to(dt).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * D + half).to(dt).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * D + D // 2 + half).to(dt).to(tl.float32)
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = ((a1 * c1).to(dt).to(tl.float32) + (-a2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((a2 * c2).to(dt).to(tl.float32) + (a1 * s2).to(dt).to(tl.float32)).to(dt)
    return o1, o2


@triton.jit
def kv_offset(table_ptr, stride_tb, slot, pos, stride_cs, stride_ct, BS: tl.constexpr, ok):
    # where position(s) pos of the row in `slot` live in one layer's block cache [blocks, KVH, BS, D]
    # (kv head 0, dim 0): block table[slot, pos // BS], row pos % BS. ok masks the table read (lanes
    # past a row's length may point past its table)
    block = tl.load(table_ptr + slot * stride_tb + pos // BS, mask=ok, other=0).to(tl.int64)
    return block * stride_cs + (pos % BS) * stride_ct


@triton.jit
def _rope_store(x1, x2, half, head, pos, slot, cos_ptr, sin_ptr, q_dst, k_cache_ptr, v_cache_ptr, table_ptr,
                stride_tb, stride_cs, stride_ch, stride_ct, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
                BS: tl.constexpr):
    # heads of a qkv row, their dims `half` (x1) and D/2 + half (x2). head is a scalar (one head a
    # program) or a column [NH, 1] against half [1, D/2] (every head of the row; heads past
    # H + 2 KVH are padding and store nothing). A query head is rotated to q_dst (the caller
    # points it at that head's D values), a key head rotated into the cache at
    # [slot's block, kv head, pos], a value head stored as it is. Which one is a store mask, not a
    # branch, so both forms share this code; a value head's rotation is computed and dropped.
    is_q = head < H
    is_v = (head >= H + KVH) & (head < H + 2 * KVH)
    is_k = (head >= H) & (head < H + KVH)
    kv_head = head - H - KVH * (head >= H + KVH)
    dst = kv_offset(table_ptr, stride_tb, slot, pos, stride_cs, stride_ct, BS, True) + kv_head.to(tl.int64) * stride_ch
    tl.store(v_cache_ptr + dst + half, x1, mask=is_v)
    tl.store(v_cache_ptr + dst + D // 2 + half, x2, mask=is_v)
    o1, o2 = rotate(x1, x2, half, pos, cos_ptr, sin_ptr, D)
    tl.store(q_dst + half, o1, mask=is_q)
    tl.store(q_dst + D // 2 + half, o2, mask=is_q)
    tl.store(k_cache_ptr + dst + half, o1, mask=is_k)
    tl.store(k_cache_ptr + dst + D // 2 + half, o2, mask=is_k)


@triton.jit
def head_norm(x1, x2, w_ptr, half, eps, D: tl.constexpr):
    # Qwen3's per-head RMSNorm of [NH, D/2] halves: normalised in float32, rounded, times the weight, rounded
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(a1 * a1 + a2 * a2, 1) / D + eps)[:, None]
    w1 = tl.load(w_ptr + half).to(tl.float32)
    w2 = tl.load(w_ptr + D // 2 + half).to(tl.float32)
    n1 = (w1 * (a1 * rstd).to(x1.dtype).to(tl.float32)).to(x1.dtype)
    n2 = (w2 * (a2 * rstd).to(x1.dtype).to(tl.float32)).to(x1.dtype)
    return n1, n2


@triton.jit
def _rope_kv_write_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, slots_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                          table_ptr, qw_ptr, kw_ptr, eps, stride_tb, stride_cs, stride_ch, stride_ct,
                          H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, NH: tl.constexpr, BS: tl.constexpr,
                          QK_NORM: tl.constexpr, PDL: tl.constexpr):
    # one token (row) a program, all of its heads: [NH, D/2] pairs. A program per (row, head) was
    # 10,240 programs of 64 pairs at 256 rows, and slower (BENCHMARKS.md, the rope a row a program).
    _wait_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.arange(0, NH)[:, None]  # 0..H-1 query heads, H..H+KVH-1 key heads, then value heads, padding
    half = tl.arange(0, D // 2)[None, :]
    live = head < H + 2 * KVH
    src = qkv_ptr + row * (H + 2 * KVH) * D + head * D
    x1 = tl.load(src + half, mask=live, other=0.0)
    x2 = tl.load(src + D // 2 + half, mask=live, other=0.0)
    if QK_NORM:  # q heads by q_norm, k heads by k_norm, before the rotation; value heads as they are
        q1, q2 = head_norm(x1, x2, qw_ptr, half, eps, D)
        k1, k2 = head_norm(x1, x2, kw_ptr, half, eps, D)
        x1 = tl.where(head < H, q1, tl.where(head < H + KVH, k1, x1))
        x2 = tl.where(head < H, q2, tl.where(head < H + KVH, k2, x2))
    _rope_store(x1, x2, half, head, tl.load(pos_ptr + row), tl.load(slots_ptr + row).to(tl.int64), cos_ptr, sin_ptr,
                q_out_ptr + row * H * D + head * D, k_cache_ptr, v_cache_ptr, table_ptr, stride_tb, stride_cs,
                stride_ch, stride_ct, H, KVH, D, BS)


def rope_kv_write(qkv: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                  n_heads: int, n_kv: int, qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None
                  ) -> torch.Tensor:
    """One decode token per row. qkv [B, (H + 2 KVH) * D]; cos/sin tables [max_seq_len, D] float32;
    positions, slots [B]; k/v_cache one layer's blocks [N, KVH, BS, D]; table [S, width] int32 each
    slot's blocks (runners/attention.py: KVCache). Writes k (rotated) and v at the row's position;
    returns rotated q [B, H, 1, D]. qk_norm (q weight [D], k weight [D], eps): each q and k head
    RMS-normed first (Qwen3's q_norm / k_norm)."""
    b = qkv.shape[0]
    d = cos_table.shape[1]
    q = torch.empty((b, 1, n_heads, d), dtype=qkv.dtype, device=qkv.device)
    qw, kw, eps = qk_norm if qk_norm is not None else (qkv, qkv, 0.0)
    early = pdl_launch(qkv.device, b)
    _rope_kv_write_kernel[(b,)](
        qkv.contiguous(), cos_table, sin_table, positions, slots, q, k_cache, v_cache, table, qw, kw, eps,
        table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), H=n_heads, KVH=n_kv, D=d,
        NH=triton.next_power_of_2(n_heads + 2 * n_kv), BS=k_cache.shape[2], QK_NORM=qk_norm is not None,
        PDL=bool(early), **early)
    return q.transpose(1, 2)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, f, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < f
    g = tl.load(gu_ptr + row * 2 * f + cols, mask=ok, other=0.0)
    u = tl.load(gu_ptr + row * 2 * f + f + cols, mask=ok, other=0.0)
    g32 = g.to(tl.float32)
    s = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)  # F.silu, rounded
    tl.store(out_ptr + row * f + cols, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2F] (gate first) -> silu(gate) * up [..., F]."""
    f = gate_up.shape[-1] // 2
    gate_up = gate_up.contiguous()
    out = torch.empty((*gate_up.shape[:-1], f), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(gate_up.numel() // (2 * f), triton.cdiv(f, block))](gate_up, out, f, BLOCK=block)
    return out


@triton.jit
def snake_value(x, a, b):
    """x + sin(a x)^2 / (b + 1e-9) of x (any shape, its dtype) with a and b float32, broadcast
    to x: DAC's Snake (b = a = alpha) or SnakeBeta (a = e^alpha, b = e^beta, each already
    rounded to x's dtype), each step rounded to x's dtype where the PyTorch ops round. Shared
    by the Snake kernel below and the codec's residual-unit kernel (runners/fused_codec.py)."""
    dt = x.dtype
    inv = (1.0 / (b + 1e-9).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    sin = tl.sin((a * x.to(tl.float32)).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    sq = (sin * sin).to(dt).to(tl.float32)
    return (x.to(tl.float32) + (inv * sq).to(dt).to(tl.float32)).to(dt)


@triton.jit
def _snake_kernel(x_ptr, alpha_ptr, beta_ptr, out_ptr, lengths_ptr, bias_ptr, res_ptr, channels, t, rate, left,
                  right, x_stride, res_stride, BLOCK: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr, STORE_SUM: tl.constexpr):
    # x, res [B * C rows of t] at their row strides; out [B * C rows of left + t + right], zeros around
    row = tl.program_id(0).to(tl.int64)  # b * channels + c
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK) - left  # the input's columns (< 0: the padding)
    ok = (cols >= 0) & (cols < t)
    x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    dt = x.dtype
    if HAS_BIAS:  # as ATen adds a bias after a cuDNN convolution: in float32, rounded
        x = (x.to(tl.float32) + tl.load(bias_ptr + row % channels).to(tl.float32)).to(dt)
    if HAS_RESIDUAL:
        x = (tl.load(res_ptr + row * res_stride + cols, mask=ok, other=0.0).to(tl.float32) + x.to(tl.float32)).to(dt)
    if STORE_SUM:  # over x: this program read these positions above
        tl.store(x_ptr + row * x_stride + cols, x, mask=ok)
    y = snake_value(x, tl.load(alpha_ptr + row % channels).to(tl.float32),
                    tl.load(beta_ptr + row % channels).to(tl.float32))
    if MASKED:  # zero past the row's length (a select, so garbage there, even inf, leaves nothing)
        y = tl.where(cols < tl.load(lengths_ptr + row // channels) * rate, y, 0.0).to(dt)
    y = tl.where(ok, y, 0.0).to(dt)  # the padding: zeros, as F.pad's
    tl.store(out_ptr + row * (left + t + right) + left + cols, y, mask=cols < t + right)


def snake(x: torch.Tensor, alpha: torch.Tensor, lengths: torch.Tensor | None = None, rate: int = 1, *,
          bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, keep: bool = False,
          beta: torch.Tensor | None = None, pad: tuple[int, int] = (0, 0)):
    """DAC's Snake activation x + sin(alpha x)^2 / (alpha + 1e-9) in one pass (transformers'
    Snake1d runs seven kernels over the whole signal). x [B, C, T]; alpha [1, C, 1] (or [C]).
    With beta [C]: x + sin(alpha x)^2 / (beta + 1e-9), SnakeBeta's form (the caller passes
    its e^alpha and e^beta). With lengths [B]: the output is zero from position lengths[b] * rate
    of row b on. pad (left, right): the output is [B, C, left + T + right], the activation between
    zeros (a causal convolution's input padding, written here instead of by a copy).

    The Snake's input may be v = residual + (x + bias) instead of x, each sum rounded: a
    convolution's output without its bias [C] (ATen adds a bias after cuDNN's convolution as
    one more pass over the signal), and a residual unit's input [B, C, T]. With keep, v is
    written over x (a buffer the caller owns; each position is read before it is written, by
    the same program), which is then returned with the Snake: (x, Snake(v)). x and residual
    may be views with a row stride (a causal transposed convolution's trimmed output)."""
    b, c, t = x.shape

    def rows_of(v: torch.Tensor) -> tuple[torch.Tensor, int]:  # [B, C, T] -> itself (or a copy), row stride
        if v.stride(2) == 1 and v.stride(0) == c * v.stride(1):
            return v, v.stride(1)
        assert not (keep and v is x), "keep writes the sum over x: a buffer of rows"
        return v.contiguous(), t

    x, x_stride = rows_of(x)
    res, res_stride = rows_of(residual) if residual is not None else (x, x_stride)
    left, right = pad
    out = torch.empty((b, c, left + t + right), dtype=x.dtype, device=x.device)
    alpha = alpha.contiguous()
    block = 1024
    _snake_kernel[(b * c, triton.cdiv(left + t + right, block))](
        x, alpha, alpha if beta is None else beta.contiguous(), out, x if lengths is None else lengths,
        x if bias is None else bias.contiguous(), res, c, t, rate, left, right, x_stride, res_stride, BLOCK=block,
        MASKED=lengths is not None, HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
        STORE_SUM=keep and (bias is not None or residual is not None))
    return (x, out) if keep else out


@triton.jit
def _sum_middle_kernel(x_ptr, out_ptr, n, G: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for g in tl.static_range(G):  # in index order, whatever the rows: a row's bits are its own
        acc += tl.load(x_ptr + (row * G + g) * n + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_middle(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """x [B, G, n] -> out [B, n]: the G values summed in float32 in index order, rounded once (as
    torch.sum, whose order may follow the tensor's shape)."""
    b, g, n = x.shape
    block = min(1024, triton.next_power_of_2(n))
    _sum_middle_kernel[(b, triton.cdiv(n, block))](x.contiguous(), out, n, G=g, BLOCK=block)
    return out


@triton.jit
def _embed_into_kernel(ids_ptr, table_ptr, out_ptr, ids_out_ptr, n, stride_out, stride_ids_out,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    _wait_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    i = tl.load(ids_ptr + row)
    if tl.program_id(1) == 0:
        tl.store(ids_out_ptr + row * stride_ids_out, i)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    tl.store(out_ptr + row * stride_out + cols, tl.load(table_ptr + i * n + cols, mask=ok), mask=ok)


def embed_into(ids: torch.Tensor, table: torch.Tensor, out: torch.Tensor, ids_out: torch.Tensor) -> None:
    """out[b] = table[ids[b]] and ids_out[b] = ids[b] in one kernel (an embedding lookup and two
    strided copies in PyTorch): ids [B] int64, table [V, n], out [B, n] and ids_out [B] views
    whose last dim is contiguous."""
    b, n = out.shape
    block = min(1024, triton.next_power_of_2(n))
    early = pdl_launch(ids.device, b)
    _embed_into_kernel[(b, triton.cdiv(n, block))](ids, table, out, ids_out, n, out.stride(0), ids_out.stride(0),
                                                   BLOCK=block, PDL=bool(early), **early)
