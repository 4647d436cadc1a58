"""The gate/up projection with silu·up of 2..MAX_ROWS decode rows, as one Triton tensor-core kernel (CUDA only).

A decode step of a few dozen rows still reads every weight once, as one row
does. The fused gate/up weight of the 3B model is 96 MB a layer; this kernel
streams it faster than cuBLAS's GEMM and the silu_mul kernel after it, at 8
rows as at 64 (BENCHMARKS.md, few-row projections). A program owns
BLOCK_N output columns for every row: it streams the matching gate rows and
up rows of the weight, BLOCK_K columns a step, through a software pipeline of
num_stages tiles, while the rows' activations [M_PAD, BLOCK_K] (L2-resident:
64 rows are 384 KB) ride along, and multiplies both on the tensor cores into
two accumulators. For QKV, o_proj, down and the head the same kernel
(without SILU_MUL) was slower than cuBLAS, with or without a split
reduction (BENCHMARKS.md, few-row projections), so those stay cuBLAS; so
does every projection above 64 rows, where these tiles run out of registers.

Rounding follows the PyTorch ops it replaces: each product rounded to the
activations' dtype (F.linear's rounding), then silu_mul's. A row's float32
sums run in the same order whatever the other rows hold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 64  # the widest decode step on this kernel (cuBLAS above: BENCHMARKS.md, few-row projections)
# per program: output columns, reduction columns a loop step, warps, pipeline stages
TILE = (64, 128, 4, 4)


@triton.jit
def _mm_kernel(x_ptr, w_ptr, y_ptr, m, n, k, stride_x,
               M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU_MUL: tl.constexpr,
               PRECISION: tl.constexpr):
    # x [m, k] (row stride stride_x); w [n, k], or [2n, k] with SILU_MUL (gate rows, then up rows);
    # y [m, n] contiguous; k % BLOCK_K == 0 (the caller's choice of BLOCK_K)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < n
    m_ok = offs_m < m
    x_tile = x_ptr + offs_m[:, None] * stride_x + offs_k[None, :]  # [M_PAD, BLOCK_K]
    w_tile = w_ptr + offs_n.to(tl.int64)[:, None] * k + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    acc2 = acc
    for start in range(0, k, BLOCK_K):  # software-pipelined over num_stages tiles
        xt = tl.load(x_tile + start, mask=m_ok[:, None], other=0.0)
        wt = tl.load(w_tile + start, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc, input_precision=PRECISION)
        if SILU_MUL:
            wt2 = tl.load(w_tile + n.to(tl.int64) * k + start, mask=n_ok[:, None], other=0.0)
            acc2 = tl.dot(xt, tl.trans(wt2), acc2, input_precision=PRECISION)
    dt = x_ptr.dtype.element_ty
    y = acc.to(dt)  # F.linear's rounding
    if SILU_MUL:  # silu(gate) rounded, times up, rounded
        g32 = y.to(tl.float32)
        s = (g32 / (1.0 + tl.exp(-g32))).to(dt)
        y = (s.to(tl.float32) * acc2.to(dt).to(tl.float32)).to(dt)
    out_ok = m_ok[:, None] & n_ok[None, :]
    tl.store(y_ptr + offs_m[:, None] * n + offs_n[None, :], y, mask=out_ok)


def takes(x: torch.Tensor) -> bool:
    """Whether mm runs these activations x [m, k]: up to MAX_ROWS rows, k % 16 == 0 (tensor-core
    tiles), and on CUDA 16-bit: the tiles are sized for it (float32 at TILE would not fit in
    shared memory, and its full-precision products would not use the tensor cores; it takes
    cuBLAS). On the CPU only Triton's interpreter runs the kernel (tests), in any dtype."""
    m, k = x.shape
    tiles_fit = x.device.type != "cuda" or x.dtype in (torch.bfloat16, torch.float16)
    return 0 < m <= MAX_ROWS and k % 16 == 0 and tiles_fit


def mm(x: torch.Tensor, weight: torch.Tensor, *, silu_mul: bool = False,
       tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [m, k] (m <= MAX_ROWS) -> [m, n] in x's dtype: x @ weight.T for weight [n, k]; with
    silu_mul, weight is [2n, k], gate rows then up rows, and the result silu(gate) * up.
    tile (output columns, reduction columns, warps, stages) per program: TILE unless a probe
    sweeps it. float32 inputs (the interpreter's) multiply in full precision, not TF32."""
    m, k = x.shape
    assert takes(x), "wider batches (and float32 on CUDA) take cuBLAS"
    n = weight.shape[0] // (2 if silu_mul else 1)
    block_n, block_k, warps, stages = tile or TILE
    block_k = min(block_k, k & -k)  # the reduction runs unmasked: a power of two dividing k
    x = x.contiguous()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _mm_kernel[(triton.cdiv(n, block_n),)](
        x, weight, y, m, n, k, x.stride(0), M_PAD=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n,
        BLOCK_K=block_k, SILU_MUL=silu_mul, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages)
    return y
