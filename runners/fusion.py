"""Weight fusion and the pending residual add shared by the families' fused decode paths (CUDA).

A fused path runs q/k/v as one projection and gate/up as one, so their weights are concatenated
once at load; each nn.Linear keeps a row view of the result, so the plain modules (prefill, the
CPU) read the same storage and no memory is added.

``Pending`` is a projection not yet added to the residual stream, which the next norm adds
(fused_ops.add_rmsnorm): None (already added: the one-row GEMVs' residual epilogue), a tensor
[B, n] in the activations' dtype (a cuBLAS or Triton GEMM's output), or float32 partials
[S, B, n] with a bias (runners/invariant_mm.py's split reductions, deterministic mode).
"""

from __future__ import annotations

import torch
import torch.nn as nn

Pending = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None] | None


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights [and biases] of linears with one input; each module's
    parameters become row views of the result (contiguous, so F.linear is unchanged)."""
    weight = torch.cat([m.weight.data for m in linears])
    bias = torch.cat([m.bias.data for m in linears]) if linears[0].bias is not None else None
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[row: row + n]
        if bias is not None:
            m.bias.data = bias[row: row + n]
        row += n
    return weight, bias


def add_norm(x: torch.Tensor, pending: Pending, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + pending, rmsnorm of that * norm.weight); x [B, hidden], norm an RMSNorm module."""
    from .fused_ops import add_rmsnorm  # Triton: imported where a fused path runs

    if pending is None or isinstance(pending, torch.Tensor):
        return add_rmsnorm(x, pending, norm.weight, norm.eps)
    return add_rmsnorm(x, pending[0], norm.weight, norm.eps, parts=True, bias=pending[1])
