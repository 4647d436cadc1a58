"""The talker's and the code predictor's decode on CUDA kernels (Triton; the interpreter in tests).

A frame is the talker's step and 15 predictor sub-steps: 28 + 75 decoder layers over one token a
row, each a few KB of activations against up to 25 MB of weights. The plain modules run about
fifty kernels a layer (norms as eight, the per-head q/k norms, rope, cat and copies); here a
layer is the Higgs fused path's kernels (runners/higgs_audio_v2/model.py) with Qwen3's per-head
q/k RMSNorm inside the rope and KV write (fused_ops.rope_kv_write(qk_norm=...)). Three modes,
one arithmetic up to float32 summation order:
  gemv        one row: each projection one GEMV with the norm before it and the residual add
              or silu·up after it inside (runners/fused_gemv.py), six kernels a layer
  fused       2+ rows: add_rmsnorm, cuBLAS q/k/v, rope, attention, cuBLAS o, add_rmsnorm,
              gate/up with silu·up (runners/fused_mm.py up to 64 rows), cuBLAS down
  invariant   deterministic mode: every projection runners/invariant_mm.py, attention with the
              fixed block, so a row's bits do not depend on the rows beside it
The layer's keys live where its caller keeps them (``StepKV``): the talker's block cache at
each row's position, or the predictor's per-frame buffers (one block a row) at the sub-step's position, where
rope, KV write and attention over its at most 16 keys are one kernel (runners/short_attention.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..fusion import Pending, add_norm, fuse_linears

class StepKV(NamedTuple):
    """Where a decode step's layers read and write keys: one query token a row."""

    k_gpu: torch.Tensor  # [layers, N, KVH, BS, D]: blocks (runners/attention.py: KVCache)
    v_gpu: torch.Tensor
    table_gpu: torch.Tensor  # [S, width] int32: each slot's blocks
    slots_gpu: torch.Tensor  # [B] int64: the row's slot in the cache
    positions_gpu: torch.Tensor  # [B] int64: rope position and write position
    lengths_gpu: torch.Tensor  # [B] int64: keys the row attends to, this one included
    cos_gpu: torch.Tensor  # [L, D] float32 rope tables
    sin_gpu: torch.Tensor
    max_keys: int = 0  # > 0: no row has more keys (the predictor's frame): one kernel rotates and attends
    cascade: object | None = None  # rows' shared prompt blocks (runners/cascade_attention.py: CascadeInputs)


def fuse_layer(layer: nn.Module) -> None:
    """q/k/v and gate/up of a blocks.DecoderLayer as one weight each (the modules keep views)."""
    a, mlp = layer.self_attn, layer.mlp
    a.qkv_weight, a.qkv_bias = fuse_linears([a.q_proj, a.k_proj, a.v_proj])
    mlp.gate_up_weight, _ = fuse_linears([mlp.gate_proj, mlp.up_proj])


def pick_mode(rows: int, invariant: bool, bias: bool) -> str:
    """The kernels a step of this many rows takes (the GEMVs have no bias input)."""
    from ..fused_gemv import MAX_ROWS

    return "invariant" if invariant else "gemv" if rows <= MAX_ROWS and not bias else "fused"


def _qk_norm(a) -> tuple[torch.Tensor, torch.Tensor, float]:
    return a.q_norm.weight, a.k_norm.weight, a.q_norm.eps


def _attend(a, qkv: torch.Tensor, kv: StepKV, layer: int, invariant: bool) -> torch.Tensor:
    """Fused qkv [B, (H + 2 KVH) D] -> attention output [B, H * D] (k and v written first)."""
    from ..decode_attention import decode_attention
    from ..fused_ops import rope_kv_write

    kc, vc = kv.k_gpu[layer], kv.v_gpu[layer]
    if kv.max_keys:
        from ..short_attention import short_attention

        return short_attention(qkv, kv.cos_gpu, kv.sin_gpu, kv.positions_gpu, kv.slots_gpu, kv.lengths_gpu, kc, vc,
                               a.n_heads, a.n_kv, _qk_norm(a), kv.max_keys)
    q = rope_kv_write(qkv, kv.cos_gpu, kv.sin_gpu, kv.positions_gpu, kv.slots_gpu, kc, vc, kv.table_gpu, a.n_heads,
                      a.n_kv, qk_norm=_qk_norm(a))
    out = decode_attention(q, kc, vc, kv.table_gpu, kv.slots_gpu, kv.lengths_gpu, invariant=invariant,
                           cascade=kv.cascade)  # [B, H, 1, D]
    return out.reshape(qkv.shape[0], -1)


def _layer_gemv(layer, x: torch.Tensor, kv: StepKV) -> torch.Tensor:
    """One row: the residual x [1, hidden] in -> out, six kernels."""
    from ..fused_gemv import gemv

    a, mlp = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    qkv = gemv(x, a.qkv_weight, norm=(n1.weight, n1.eps))
    x = gemv(_attend(a, qkv, kv, a.layer, False), a.o_proj.weight, residual=x)
    h = gemv(x, mlp.gate_up_weight, norm=(n2.weight, n2.eps), silu_mul=True)
    return gemv(h, mlp.down_proj.weight, residual=x)


def _layer_fused(layer, x: torch.Tensor, pending: Pending, kv: StepKV) -> tuple[torch.Tensor, Pending]:
    from .. import fused_mm
    from ..fused_ops import add_rmsnorm, silu_mul

    a, mlp, n2 = layer.self_attn, layer.mlp, layer.post_attention_layernorm
    x, h = add_norm(x, pending, layer.input_layernorm)
    attn = _attend(a, F.linear(h, a.qkv_weight, a.qkv_bias), kv, a.layer, False)
    x, h = add_rmsnorm(x, a.o_proj(attn), n2.weight, n2.eps)
    g = fused_mm.mm(h, mlp.gate_up_weight, silu_mul=True) if fused_mm.takes(h) \
        else silu_mul(F.linear(h, mlp.gate_up_weight))
    return x, mlp.down_proj(g)


def _layer_invariant(layer, x: torch.Tensor, pending: Pending, kv: StepKV) -> tuple[torch.Tensor, Pending]:
    from ..invariant_mm import invariant_mm, invariant_mm_parts

    a, mlp = layer.self_attn, layer.mlp
    x, h = add_norm(x, pending, layer.input_layernorm)
    attn = _attend(a, invariant_mm(h, a.qkv_weight, bias=a.qkv_bias, kind="qkv"), kv, a.layer, True)
    x, h = add_norm(x, (invariant_mm_parts(attn, a.o_proj.weight, kind="o_proj"), a.o_proj.bias),
                    layer.post_attention_layernorm)
    g = invariant_mm(h, mlp.gate_up_weight, silu_mul=True, kind="gate_up")
    return x, (invariant_mm_parts(g, mlp.down_proj.weight, kind="down"), mlp.down_proj.bias)


def decode_layers(layers: nn.ModuleList, x: torch.Tensor, kv: StepKV, mode: str) -> tuple[torch.Tensor, Pending]:
    """The layers over one token a row: x [B, hidden] (the input embeddings) -> (the residual
    stream, the last projection not yet added to it); ``final_norm`` adds it."""
    pending: Pending = None
    for layer in layers:
        if mode == "gemv":
            x = _layer_gemv(layer, x, kv)
        elif mode == "fused":
            x, pending = _layer_fused(layer, x, pending, kv)
        else:
            x, pending = _layer_invariant(layer, x, pending, kv)
    return x, pending


def final_norm(x: torch.Tensor, pending: Pending, norm) -> torch.Tensor:
    return add_norm(x, pending, norm)[1]


def linear(x: torch.Tensor, module: nn.Linear, mode: str, out_dtype: torch.dtype | None = None,
           norm=None, kind: str = "head") -> torch.Tensor:
    """module(x) in the mode's kernels, stored as out_dtype (default x's): x [B, k]. norm (an
    RMSNorm): the input is norm(x), fused into the one-row GEMV (the others norm first)."""
    if mode == "gemv" and module.bias is None:
        from ..fused_gemv import gemv

        return gemv(x, module.weight, norm=(norm.weight, norm.eps) if norm is not None else None, out_dtype=out_dtype)
    if norm is not None:
        x = final_norm(x, None, norm)
    if mode == "invariant":
        from ..invariant_mm import invariant_mm

        return invariant_mm(x, module.weight, bias=module.bias, out_dtype=out_dtype, kind=kind)
    y = module(x)
    return y if out_dtype is None else y.to(out_dtype)
