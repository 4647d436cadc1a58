"""The batch-invariant decode step of deterministic mode on CUDA (runners/invariant_mm.py).

Every kernel of it computes a row from that row alone, in an order fixed by
the row, so one launch serves any number of rows and a row's bits do not
depend on its batch-mates, their count or its place among them:
  add_rmsnorm         one program per row; adds the projection before it from its
                      float32 partials (the first layer's has none)
  qkv, gate/up, head  invariant_mm (gate/up: silu·up; head: float32 out)
  rope_kv_write       one program per row
  attention           decode_attention(invariant=True): fixed key blocks
  o_proj, down        invariant_mm_parts: fixed k ranges, summed by the next add_rmsnorm
A layer is eight kernels; the default step's one-row GEMVs and cuBLAS GEMMs
round differently, so the two modes' outputs differ by rounding.
"""

from __future__ import annotations

import torch

from ..decode_attention import decode_attention
from ..fused_ops import rope_kv_write
from ..fusion import Pending, add_norm
from ..invariant_mm import invariant_mm, invariant_mm_parts


def decode_layer(layer, x: torch.Tensor, pending: Pending | None, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                 ctx) -> tuple[torch.Tensor, Pending]:
    """One DecoderLayer's audio path for one decode token per row (DecoderLayer.decode_fused's
    arithmetic, other kernels): the residual x [B, hidden] and the layer before's pending down
    projection -> the residual and this layer's pending down projection."""
    a, mlp = layer.self_attn, layer.audio_mlp
    kc, vc = ctx.kv.k_gpu[a.layer], ctx.kv.v_gpu[a.layer]
    x, h = add_norm(x, pending, layer.audio_input_layernorm)
    qkv = invariant_mm(h, a.qkv_weight, bias=a.qkv_bias, kind="qkv")
    table = ctx.kv.table_gpu
    q = rope_kv_write(qkv, rope_cos, rope_sin, ctx.positions_gpu[:, 0], ctx.slots_gpu, kc, vc, table, a.n_heads, a.n_kv)
    attn = decode_attention(q, kc, vc, table, ctx.slots_gpu, ctx.lengths_gpu, invariant=True)  # [B, H, 1, D]
    o_parts = invariant_mm_parts(attn.reshape(x.shape[0], -1), a.o_proj.weight, kind="o_proj")
    x, h = add_norm(x, (o_parts, a.o_proj.bias), layer.audio_post_attention_layernorm)
    g = invariant_mm(h, mlp.gate_up_weight, silu_mul=True, kind="gate_up")
    return x, (invariant_mm_parts(g, mlp.down_proj.weight, kind="down"), mlp.down_proj.bias)


def head(lm_head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [B, H] -> float32 logits, rounded to the weights' dtype first (as compute_logits)."""
    return invariant_mm(hidden, lm_head.weight, bias=lm_head.bias, out_dtype=torch.float32, kind="head")
