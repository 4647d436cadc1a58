"""The Qwen3 decoder pieces the talker, the code predictor and the codec's transformer share.

Parameter names equal the reference's (``qwen-tts``), so its safetensors load as they are:
``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm`` (per head, Qwen3), ``mlp.{gate,up,down}_proj``,
``input_layernorm``, ``post_attention_layernorm``. How attention reads its keys differs per user
(the engine's slot cache, the predictor's static per-frame buffers, the codec's sliding window), so
a layer takes it as a callable.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..norms import RMSNorm

# (q [B, H, T, D], k [B, KVH, T, D], v [B, KVH, T, D]) -> attention output [B, H, T, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """Default rope's inverse frequencies [head_dim / 2], float32 (transformers' formula)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_tables(theta: float, head_dim: int, length: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim] float32 for positions 0..length-1 (both halves equal); cast
    per use to the activations' dtype, as the reference casts its float32 tables."""
    freqs = torch.arange(length, dtype=torch.int64).float()[:, None] * rope_inv_freq(theta, head_dim)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, 1, T, D] (or broadcastable) in x's dtype."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Projections, per-head q/k RMSNorm (Qwen3; absent in the codec's transformer), rope."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool, eps: float | None,
                 layer: int = 0):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        if eps is not None:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, hidden] -> q [B, H, T, D], k, v [B, KVH, T, D], q and k rotated."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        b, t, _ = x.shape
        out = attend(*self.qkv(x, cos, sin))  # [B, H, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer (attention, SwiGLU)."""

    def __init__(self, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, bias: bool, eps: float,
                 layer: int, qk_norm: bool = True):
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, bias, eps if qk_norm else None, layer)
        self.mlp = GatedMLP(hidden, inter)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


def gqa_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
             causal: bool = False) -> torch.Tensor:
    """Grouped-query attention over keys as given: q [B, H, T, D], k/v [B, KVH, K, D]; query head h
    reads KV head h // (H / KVH), as transformers' repeat_kv (inside the kernel: no repeated copy).
    mask [B or 1, 1, T, K] bool (True: may attend) or None; causal: among T == K positions."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                          enable_gqa=q.shape[1] != k.shape[1])
