"""Batch-invariant decode projections: one Triton tensor-core GEMM for any row count (CUDA; the interpreter in tests).

cuBLAS picks its algorithm, tiles and split-K from the row count, so a row's
float32 sums, and its bf16 result, change with the batch it runs in. This
kernel fixes what decides a row's arithmetic: a program owns BLOCK_M rows by
BLOCK_N output columns and walks the whole reduction in BLOCK_K steps, in
order, into one float32 accumulator (no split-K). The tensor cores add an
element's products 16 columns an instruction, in k order, whatever the
tile, so the tile (rows, columns, reduction step, warps, stages) follows the
row count for speed without changing a row's bits: measured on the H200 for
every tile the sweep tries, against cuBLAS, whose rows do change
(benchmarks/invariant_mm.py; BENCHMARKS.md, batch-invariant projections).
tests/test_gpu_kernels.py holds the tiles in use to it.

Program order is M-fastest: the M tiles that share an N tile run side by
side, so its weight tile comes from memory once a step and from L2 after.

Epilogues round as the PyTorch ops they replace (F.linear: the bias added in
float32, one rounding; then silu_mul's or the residual add's rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import pdl_launch
from .fused_ops import _wait_predecessor


@triton.jit
def _inv_mm_kernel(x_ptr, w_ptr, b_ptr, res_ptr, y_ptr, m, n, k, stride_x,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # x [m, k] (row stride stride_x); w [n, k], or [2n, k] for EPILOGUE 2 (gate rows, then up rows);
    # y, res [m, n] contiguous; k % BLOCK_K == 0. EPILOGUE: 0 none, 1 + residual, 2 silu(gate) * up
    _wait_predecessor(PDL)  # launched early (one row): nothing is read before the kernel before ends
    m_tiles = tl.cdiv(m, BLOCK_M)
    pid = tl.program_id(0)
    offs_m = (pid % m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid // m_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < m
    n_ok = offs_n < n
    x_tile = x_ptr + offs_m.to(tl.int64)[:, None] * stride_x + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + offs_n.to(tl.int64)[:, None] * k + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = acc
    for start in range(0, k, BLOCK_K):  # the one reduction order: k ascending, BLOCK_K a step
        xt = tl.load(x_tile + start, mask=m_ok[:, None], other=0.0)
        wt = tl.load(w_tile + start, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc, input_precision=PRECISION)
        if EPILOGUE == 2:
            wt2 = tl.load(w_tile + n.to(tl.int64) * k + start, mask=n_ok[:, None], other=0.0)
            acc2 = tl.dot(xt, tl.trans(wt2), acc2, input_precision=PRECISION)
    dt = x_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE == 2:
            acc2 += tl.load(b_ptr + n + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dt)  # F.linear's rounding
    out = offs_m.to(tl.int64)[:, None] * n + offs_n[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if EPILOGUE == 1:  # residual + delta, rounded (add_rmsnorm's sum)
        res = tl.load(res_ptr + out, mask=out_ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(dt)
    if EPILOGUE == 2:  # silu(gate) rounded, times up, rounded
        g32 = y.to(tl.float32)
        s = (g32 / (1.0 + tl.exp(-g32))).to(dt)
        y = (s.to(tl.float32) * acc2.to(dt).to(tl.float32)).to(dt)
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=out_ok)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) per projection and row bucket, for speed only (see
# the module docstring): the H200's fastest of the first sweep at 1, 16, 64 and 256 rows (a
# second 256-row sweep found tiles a few us faster, not yet timed in a whole step: BENCHMARKS.md,
# --deterministic); 32 rows take 64's tile with 32-row blocks, 128 rows 256's
_TILES = {
    "qkv": {16: (16, 64, 512, 4, 3), 64: (64, 64, 128, 4, 4), 256: (128, 128, 128, 4, 3)},
    "o_proj": {16: (16, 32, 512, 4, 4), 64: (64, 32, 256, 4, 4), 256: (64, 128, 128, 4, 3)},
    "gate_up": {16: (16, 32, 128, 4, 4), 64: (64, 32, 128, 4, 3), 256: (128, 64, 64, 4, 3)},
    "down": {16: (16, 32, 512, 4, 4), 64: (64, 32, 256, 4, 4), 256: (64, 128, 128, 4, 3)},
    "head": {16: (16, 64, 256, 4, 4), 64: (64, 64, 256, 4, 3), 256: (128, 128, 128, 4, 3)},
}


def pick_tile(m: int, kind: str, k: int) -> tuple[int, int, int, int, int]:
    """The tile of a call of m rows of projection `kind` with a reduction of k columns."""
    table = _TILES[kind]
    bm, bn, bk, warps, stages = table[16] if m <= 16 else table[64] if m <= 64 else table[256]
    if 16 < m <= 32:
        bm = 32
    return bm, bn, min(bk, k & -k), warps, stages  # the step divides k: the loop runs unmasked


def invariant_mm(x: torch.Tensor, weight: torch.Tensor, *, bias: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, silu_mul: bool = False, out_dtype: torch.dtype | None = None,
                 kind: str = "qkv", tile: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x [m, k] -> [m, n]: x @ weight.T (+ bias) rounded to x's dtype, stored as out_dtype.
      residual [m, n]: returns residual + that (rounded again)
      silu_mul: weight [2n, k] (bias [2n]), gate rows then up rows; returns silu(gate) * up
      kind: which projection's tiles (a key of _TILES); tile (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
      overrides them (probes, and the tests' negative control)"""
    m, k = x.shape
    assert k % 16 == 0, "tensor-core tiles: k a multiple of 16"
    n = weight.shape[0] // (2 if silu_mul else 1)
    bm, bn, bk, warps, stages = tile or pick_tile(m, kind, k)
    if x.dtype == torch.float32 and tile is None:  # 4-byte tiles: the 16-bit ones overflow shared memory
        bn, bk, stages = min(bn, 64), min(bk, 32), 2
    x = x.contiguous()
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return y
    epilogue = 2 if silu_mul else 1 if residual is not None else 0
    early = pdl_launch(x.device, m)
    _inv_mm_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
        x, weight, bias if bias is not None else x, residual.contiguous() if residual is not None else x, y,
        m, n, k, x.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=bias is not None,
        EPILOGUE=epilogue, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PDL=bool(early), num_warps=warps, num_stages=stages, **early)
    return y
