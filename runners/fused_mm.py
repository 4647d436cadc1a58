"""Decode projections of 2..MAX_ROWS rows as one Triton tensor-core kernel each (CUDA only).

A decode step of a few dozen rows still reads every weight once: at 64 rows
the 3B model's 5.4 GB a step take 1.27 ms at the H200's copy bandwidth, but
its cuBLAS GEMMs took 1.83 ms (~2.9 TB/s: BENCHMARKS.md, step profile). Here
a program owns BLOCK_N output columns for every row: it streams its
[BLOCK_N, k] slice of the weight through a software pipeline of STAGES
tiles while the rows' activations [M_PAD, BLOCK_K] (a few hundred KB in all,
L2-resident) ride along, and multiplies them on the tensor cores. The
neighbours of the projection come in as epilogues, as in the one-row GEMV
(runners/fused_gemv.py): the residual add after o_proj and down, silu·up
after gate/up (two accumulators over the gate and the up rows).

Rounding follows the PyTorch ops it replaces: the product is rounded to the
activations' dtype once (F.linear's rounding), then the epilogue rounds as
add_rmsnorm's sum or silu_mul. A row's float32 sums run in the same order
whatever the other rows are, so a row's result never depends on its batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 64  # the widest decode step that takes these kernels (cuBLAS above; benchmarks/mm_probe.py)
# per program: output columns, reduction columns a loop step, warps, pipeline stages, slices of
# the reduction (float32 inputs multiply in full precision, as cuBLAS does by default, not TF32)
TILE = (32, 128, 4, 4, 2)
PAIRED_TILE = (64, 128, 4, 4, 1)  # silu_mul: two weight tiles (gate, up) a loop step


@triton.jit
def _mm_kernel(x_ptr, w_ptr, res_ptr, y_ptr, part_ptr, count_ptr, m, n, k, stride_x, stride_y,
               M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
               EPILOGUE: tl.constexpr, PRECISION: tl.constexpr):
    # x [m, k] (row stride stride_x); w [n, k] ([2n, k] for EPILOGUE 2: gate rows, then up rows);
    # y, res [m, n] (row stride stride_y). Program (i, j): columns i * BLOCK_N.., reduction slice j
    # of SPLIT; (k / SPLIT) % BLOCK_K == 0 (asserted by the caller). With SPLIT > 1, part [SPLIT,
    # M_PAD, n] float32 takes each slice's sums and count [n tiles] int32 (zero between calls)
    # counts the slices done: the last one adds them up, in slice order whichever came last.
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < n
    m_ok = offs_m < m
    k_len = k // SPLIT
    k0 = tl.program_id(1) * k_len
    x_tile = x_ptr + offs_m[:, None] * stride_x + (k0 + offs_k)[None, :]  # [M_PAD, BLOCK_K]
    w_tile = w_ptr + offs_n.to(tl.int64)[:, None] * k + (k0 + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    acc2 = acc
    for start in range(0, k_len, BLOCK_K):  # software-pipelined over num_stages tiles
        xt = tl.load(x_tile + start, mask=m_ok[:, None], other=0.0)
        wt = tl.load(w_tile + start, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc, input_precision=PRECISION)
        if EPILOGUE == 2:
            wt2 = tl.load(w_tile + n.to(tl.int64) * k + start, mask=n_ok[:, None], other=0.0)
            acc2 = tl.dot(xt, tl.trans(wt2), acc2, input_precision=PRECISION)
    out_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:  # (EPILOGUE != 2: the caller keeps silu_mul whole)
        part = part_ptr + offs_m[:, None] * n + offs_n[None, :]  # [M_PAD, BLOCK_N] of slice 0
        tl.store(part + tl.program_id(1) * M_PAD * n, acc, mask=out_ok)
        # acq_rel: this slice's sums are visible before its count, the others' after it
        if tl.atomic_add(count_ptr + pid_n, 1) != SPLIT - 1:
            return
        acc = tl.load(part, mask=out_ok, other=0.0)
        for j in range(1, SPLIT):
            acc += tl.load(part + j * M_PAD * n, mask=out_ok, other=0.0)
        tl.store(count_ptr + pid_n, 0)  # for the next call (kernels of one stream run in order)
    dt = x_ptr.dtype.element_ty
    y = acc.to(dt)  # F.linear's rounding
    if EPILOGUE == 1:  # residual + product, rounded (add_rmsnorm's sum)
        res = tl.load(res_ptr + offs_m[:, None] * stride_y + offs_n[None, :], mask=out_ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(dt)
    if EPILOGUE == 2:  # silu_mul: silu(gate) rounded, times up, rounded
        g32 = y.to(tl.float32)
        s = (g32 / (1.0 + tl.exp(-g32))).to(dt)
        y = (s.to(tl.float32) * acc2.to(dt).to(tl.float32)).to(dt)
    tl.store(y_ptr + offs_m[:, None] * stride_y + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=out_ok)


_COUNTS: dict[torch.device, torch.Tensor] = {}


def _counts(device: torch.device, tiles: int) -> torch.Tensor:
    """The split kernels' per-tile slice counts, zero between calls (the last slice resets its
    tile's). Made on a first eager call: a graph capture may not allocate what outlives it."""
    counts = _COUNTS.get(device)
    if counts is None or counts.numel() < tiles:
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), "run once before capture"
        counts = _COUNTS[device] = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
    return counts


def mm(x: torch.Tensor, weight: torch.Tensor, *, residual: torch.Tensor | None = None, silu_mul: bool = False,
       out_dtype: torch.dtype | None = None, tile: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x [m, k] (m <= MAX_ROWS) -> [m, n]: x @ weight.T for weight [n, k], rounded to x's dtype,
    stored as out_dtype (default x's).
      residual [m, n]: returns residual + x @ weight.T
      silu_mul: weight is [2n, k], gate rows then up rows; returns silu(gate) * up [m, n]
      tile (output columns, reduction columns, warps, stages, reduction slices) per program:
      TILE (PAIRED_TILE with silu_mul) unless a probe sweeps it"""
    m, k = x.shape
    assert m <= MAX_ROWS, "wider batches take cuBLAS"
    n = weight.shape[0] // (2 if silu_mul else 1)
    block_n, block_k, warps, stages, split = tile or (PAIRED_TILE if silu_mul else TILE)
    assert k % (block_k * split) == 0, "the reduction runs unmasked"
    assert split == 1 or not silu_mul, "silu_mul needs both sums whole"
    x = x.contiguous()
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if residual is not None:
        assert residual.shape == (m, n) and residual.stride(0) == n
    m_pad, tiles = max(16, triton.next_power_of_2(m)), triton.cdiv(n, block_n)
    part = torch.empty((split, m_pad, n), dtype=torch.float32, device=x.device) if split > 1 else y
    _mm_kernel[(tiles, split)](
        x, weight, residual if residual is not None else y, y, part, _counts(x.device, tiles) if split > 1 else y,
        m, n, k, x.stride(0), n, M_PAD=m_pad, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split,
        EPILOGUE=2 if silu_mul else 1 if residual is not None else 0,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages)
    return y
