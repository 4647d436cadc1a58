"""The batch-invariant decode step of deterministic mode on CUDA (runners/invariant_mm.py).

Every kernel of it computes a row from that row alone, in an order fixed by
the row, so one launch serves any number of rows and a row's bits do not
depend on its batch-mates, their count or its place among them:
  add_rmsnorm, rope_kv_write   one program per row
  qkv, o_proj, gate/up, down   invariant_mm (o_proj and down add the residual)
  attention                    decode_attention(invariant=True): fixed key blocks
  head                         invariant_mm, float32 out
A layer is eight kernels; the default step's one-row GEMVs and cuBLAS GEMMs
round differently, so the two modes' outputs differ by rounding.
"""

from __future__ import annotations

import torch

from ..decode_attention import decode_attention
from ..fused_ops import add_rmsnorm, rope_kv_write
from ..invariant_mm import invariant_mm


def decode_layer(layer, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, ctx) -> torch.Tensor:
    """One DecoderLayer's audio path for one decode token per row: x [B, hidden] the residual
    in -> the residual out (the same arithmetic as DecoderLayer.decode_fused, other kernels)."""
    a, mlp = layer.self_attn, layer.audio_mlp
    n1, n2 = layer.audio_input_layernorm, layer.audio_post_attention_layernorm
    kc, vc = ctx.kv.k_gpu[a.layer], ctx.kv.v_gpu[a.layer]
    _, h = add_rmsnorm(x, None, n1.weight, n1.eps)
    qkv = invariant_mm(h, a.qkv_weight, bias=a.qkv_bias, kind="qkv")
    q = rope_kv_write(qkv, rope_cos, rope_sin, ctx.positions_gpu[:, 0], ctx.slots_gpu, kc, vc, a.n_heads, a.n_kv)
    attn = decode_attention(q, kc, vc, ctx.slots_gpu, ctx.lengths_gpu, invariant=True)  # [B, H, 1, D]
    x = invariant_mm(attn.reshape(x.shape[0], -1), a.o_proj.weight, bias=a.o_proj.bias, residual=x, kind="o_proj")
    _, h = add_rmsnorm(x, None, n2.weight, n2.eps)
    g = invariant_mm(h, mlp.gate_up_weight, silu_mul=True, kind="gate_up")
    return invariant_mm(g, mlp.down_proj.weight, residual=x, kind="down")


def head(lm_head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [B, H] -> float32 logits, rounded to the weights' dtype first (as compute_logits)."""
    return invariant_mm(hidden, lm_head.weight, bias=lm_head.bias, out_dtype=torch.float32, kind="head")
