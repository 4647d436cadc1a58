"""Batch-invariant decode projections: one Triton tensor-core GEMM for any row count (CUDA; the interpreter in tests).

cuBLAS picks its algorithm, tiles and split-K from the row count, so a row's
float32 sums, and its bf16 result, change with the batch it runs in. This
kernel fixes what decides a row's arithmetic: a program owns BLOCK_M rows by
BLOCK_N output columns and walks its reduction in BLOCK_K steps, in
order, into one float32 accumulator (no row-dependent split-K). The tensor cores add an
element's products 16 columns an instruction, in k order, whatever the
tile, so the tile (rows, columns, reduction step, warps, stages) follows the
row count for speed without changing a row's bits: measured on the H200 for
every tile the sweep tries, against cuBLAS, whose rows do change
(benchmarks/invariant_mm.py; BENCHMARKS.md, batch-invariant projections).
tests/test_gpu_kernels.py holds the tiles in use to it.

Program order is M-fastest: the M tiles that share an N tile run side by
side, so its weight tile comes from memory once a step and from L2 after.

Epilogues round as the PyTorch ops they replace (F.linear: the bias added in
float32, one rounding; then silu_mul's).

Split K (`invariant_mm_parts`): o_proj and down have too few column tiles to fill
the GPU at one row or at 256. Their reduction is cut into SPLITS[kind] fixed
k ranges, a fixed number for the projection, never chosen from the row count,
each summed in order into its own float32 partial [S, m, n]; the consumer
(fused_ops.add_rmsnorm with parts) adds the S partials in index order, so the
order of a row's sums is again fixed by the row alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .device import pdl_launch
from .fused_ops import _wait_predecessor


@triton.jit
def _inv_mm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, m, n, k, stride_x,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
                   SPLITS: tl.constexpr, TMA: tl.constexpr):
    # x [m, k] (row stride stride_x); w [n, k], or [2n, k] for EPILOGUE 2 (gate rows, then up rows);
    # TMA: x_ptr and w_ptr are tensor descriptors of [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K] boxes;
    # y [m, n] contiguous; (k / SPLITS) % BLOCK_K == 0. EPILOGUE: 0 none, 2 silu(gate) * up,
    # 3 the float32 partial of k range `split` into y [SPLITS, m, n]
    _wait_predecessor(PDL)  # launched early (one row): nothing is read before the kernel before ends
    m_tiles = tl.cdiv(m, BLOCK_M)
    n_tiles = tl.cdiv(n, BLOCK_N)
    pid = tl.program_id(0)
    split = pid // (m_tiles * n_tiles)  # the split outermost: its k range is fixed, [split, split + 1) * k_len
    pid = pid % (m_tiles * n_tiles)
    k_len = k // SPLITS
    offs_m = (pid % m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid // m_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < m
    n_ok = offs_n < n
    k0 = split * k_len
    if not TMA:  # a static branch: its names stay defined below
        x_tile = x_ptr + offs_m.to(tl.int64)[:, None] * stride_x + k0 + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
        w_tile = w_ptr + offs_n.to(tl.int64)[:, None] * k + k0 + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = acc
    m0, n0 = (pid % m_tiles) * BLOCK_M, (pid // m_tiles) * BLOCK_N
    for start in range(0, k_len, BLOCK_K):  # the one reduction order: k ascending, BLOCK_K a step
        if TMA:  # rows past m read as zeros; the gate's past n are up rows, never stored
            xt = x_ptr.load([m0, k0 + start])
            wt = w_ptr.load([n0, k0 + start])
        else:
            xt = tl.load(x_tile + start, mask=m_ok[:, None], other=0.0)
            wt = tl.load(w_tile + start, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc, input_precision=PRECISION)
        if EPILOGUE == 2:
            if TMA:
                wt2 = w_ptr.load([n + n0, k0 + start])
            else:
                wt2 = tl.load(w_tile + n.to(tl.int64) * k + start, mask=n_ok[:, None], other=0.0)
            acc2 = tl.dot(xt, tl.trans(wt2), acc2, input_precision=PRECISION)
    out = offs_m.to(tl.int64)[:, None] * n + offs_n[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if EPILOGUE == 3:  # the raw float32 sum of this k range: bias and rounding are the consumer's
        tl.store(y_ptr + split.to(tl.int64) * m * n + out, acc, mask=out_ok)
    else:
        dt = b_ptr.dtype.element_ty  # the activations' dtype (b_ptr is x when there is no bias)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if EPILOGUE == 2:
                acc2 += tl.load(b_ptr + n + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y = acc.to(dt)  # F.linear's rounding
        if EPILOGUE == 2:  # silu(gate) rounded, times up, rounded
            g32 = y.to(tl.float32)
            s = (g32 / (1.0 + tl.exp(-g32))).to(dt)
            y = (s.to(tl.float32) * acc2.to(dt).to(tl.float32)).to(dt)
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=out_ok)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, TMA) per projection and row bucket, for speed only
# (see the module docstring): the H200's fastest in benchmarks/invariant_mm.py's sweeps at 1, 16,
# 64 and 256 rows; 32 rows take 64's tile with 32-row blocks, 128 rows 256's. TMA: the tiles come
# in through tensor descriptors (Hopper's bulk copies), not pointer loads
Tile = tuple[int, int, int, int, int, bool]
_TILES: dict[str, dict[int, Tile]] = {
    "qkv": {16: (16, 64, 256, 4, 4, False), 64: (64, 32, 128, 4, 4, True), 256: (64, 64, 64, 4, 4, True)},
    "o_proj": {16: (16, 64, 256, 4, 4, False), 64: (64, 32, 128, 4, 4, True), 256: (64, 64, 64, 4, 4, True)},
    "gate_up": {16: (16, 64, 256, 4, 3, True), 64: (64, 32, 128, 4, 3, False), 256: (128, 128, 64, 8, 4, True)},
    "down": {16: (16, 64, 256, 4, 4, False), 64: (64, 64, 256, 4, 3, True), 256: (64, 64, 64, 4, 4, True)},
    "head": {16: (16, 64, 256, 4, 4, False), 64: (64, 64, 256, 4, 3, True), 256: (64, 128, 64, 4, 4, True)},
}
# k ranges of the projections whose partials the next kernel sums (module docstring)
SPLITS = {"o_proj": 2, "down": 2}


def pick_tile(m: int, kind: str, k: int) -> Tile:
    """The tile of a call of m rows of projection `kind` with a reduction of k columns (a split's)."""
    table = _TILES[kind]
    bm, bn, bk, warps, stages, tma = table[16] if m <= 16 else table[64] if m <= 64 else table[256]
    if 16 < m <= 32:
        bm = 32
    return bm, bn, min(bk, k & -k), warps, stages, tma  # the step divides k: the loop runs unmasked


def _launch(x, weight, y, bias, epilogue, splits, tile: Tile) -> None:
    m, k = x.shape
    n = y.shape[-1]
    bm, bn, bk, warps, stages, tma = tile
    assert (k // splits) % bk == 0, "the k loop is unmasked: the step divides a split's k"
    xa, wa = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk])) if tma \
        else (x, weight)
    early = pdl_launch(x.device, m)
    _inv_mm_kernel[(splits * triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
        xa, wa, bias if bias is not None else x, y,
        m, n, k, x.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=bias is not None,
        EPILOGUE=epilogue, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PDL=bool(early), SPLITS=splits, TMA=tma, num_warps=warps, num_stages=stages, **early)


def _tile(x: torch.Tensor, kind: str, k: int, tile: Tile | None) -> Tile:
    bm, bn, bk, warps, stages, tma = tile or pick_tile(x.shape[0], kind, k)
    if x.dtype == torch.float32 and tile is None:  # 4-byte tiles: the 16-bit ones overflow shared memory
        bn, bk, stages = min(bn, 64), min(bk, 32), 2
    return bm, bn, bk, warps, stages, tma


def invariant_mm(x: torch.Tensor, weight: torch.Tensor, *, bias: torch.Tensor | None = None,
                 silu_mul: bool = False, out_dtype: torch.dtype | None = None,
                 kind: str = "qkv", tile: Tile | None = None) -> torch.Tensor:
    """x [m, k] -> [m, n]: x @ weight.T (+ bias) rounded to x's dtype, stored as out_dtype.
      silu_mul: weight [2n, k] (bias [2n]), gate rows then up rows; returns silu(gate) * up
      kind: which projection's tiles (a key of _TILES); tile (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, TMA)
      overrides them (probes, and the tests' negative control)"""
    m, k = x.shape
    assert k % 16 == 0, "tensor-core tiles: k a multiple of 16"
    n = weight.shape[0] // (2 if silu_mul else 1)
    x = x.contiguous()
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m:
        _launch(x, weight, y, bias, 2 if silu_mul else 0, 1, _tile(x, kind, k, tile))
    return y


def invariant_mm_parts(x: torch.Tensor, weight: torch.Tensor, *, kind: str, splits: int | None = None,
                       tile: Tile | None = None) -> torch.Tensor:
    """x [m, k] -> float32 [S, m, n]: partial s is x[:, s*k/S:(s+1)*k/S] @ weight[:, that range].T, summed
    in k order (S = SPLITS[kind], or `splits`); their sum in index order, + bias, rounded, is the
    projection (fused_ops.add_rmsnorm(parts=...))."""
    m, k = x.shape
    splits = splits or SPLITS[kind]
    assert k % (16 * splits) == 0, "tensor-core tiles: each split's k a multiple of 16"
    x = x.contiguous()
    y = torch.empty((splits, m, weight.shape[0]), dtype=torch.float32, device=x.device)
    if m:
        _launch(x, weight, y, None, 3, splits, _tile(x, kind, k // splits, tile))
    return y
