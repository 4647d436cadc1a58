"""Higgs Audio v2 language model: a plain forward pass, no cache management.

A Llama-3 backbone in which every decoder layer has a second set of norms and
a second MLP for audio positions ("dual FFN"): text positions use
``input_layernorm``/``mlp``, audio positions ``audio_input_layernorm``/``audio_mlp``.
Audio input is the sum of 8 codebook embeddings (one table of 8 x codebook_size
rows, offset per codebook); the head ``audio_lm_head`` predicts 8 x codebook_size.

Parameter names equal transformers' HiggsAudioV2ForConditionalGeneration
state-dict keys, so its safetensors load as they are.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from runners.attention import AttentionContext
from runners.higgs_audio_v2.config import HiggsConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(cfg: HiggsConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2], with Llama-3 scaling when rope_type is llama3."""
    rp = cfg.rope_parameters
    dim = cfg.head_dim
    inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rp.get("rope_type", "default") == "default":
        return inv
    if rp["rope_type"] != "llama3":
        raise ValueError(f"unsupported rope_type {rp['rope_type']!r}")
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old_ctx = rp["original_max_position_embeddings"]
    lo_wavelen, hi_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < hi_wavelen) & ~(wavelen > lo_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: HiggsConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = ctx.attend(self.layer, q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HiggsConfig, layer: int):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.audio_mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.audio_input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.audio_post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)

    def forward(self, x, cos, sin, ctx, audio_mask: torch.Tensor | None) -> torch.Tensor:
        # audio_mask None: every position is audio (decode). Else [B, T] bool (prefill).
        if audio_mask is None:
            h = self.audio_input_layernorm(x)
        else:
            m = audio_mask[..., None]
            h = torch.where(m, self.audio_input_layernorm(x), self.input_layernorm(x))  # norms are per token
        x = x + self.self_attn(h, cos, sin, ctx)
        if audio_mask is None:
            return x + self.audio_mlp(self.audio_post_attention_layernorm(x))
        # MLPs on their own subsets, as the reference does (prefill only: the
        # boolean indexing syncs with the host)
        out = x.clone()
        text = ~audio_mask
        out[text] = x[text] + self.mlp(self.post_attention_layernorm(x[text]))
        out[audio_mask] = x[audio_mask] + self.audio_mlp(self.audio_post_attention_layernorm(x[audio_mask]))
        return out


class AudioEmbeddings(nn.Module):
    def __init__(self, cfg: HiggsConfig):
        super().__init__()
        self.embed_audio_tokens = nn.Embedding(cfg.num_codebooks * cfg.codebook_size, cfg.hidden_size)
        self.register_buffer("offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_size, persistent=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, C] -> [B, T, hidden]: the C codebook embeddings summed."""
        return self.embed_audio_tokens(codes + self.offsets).sum(dim=-2)


class Backbone(nn.Module):
    def __init__(self, cfg: HiggsConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_audio_tokens = AudioEmbeddings(cfg)


class HiggsAudioV2LM(nn.Module):
    def __init__(self, cfg: HiggsConfig, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.audio_lm_head = nn.Linear(cfg.hidden_size, cfg.num_codebooks * cfg.codebook_size, bias=False)
        self.max_seq_len = max_seq_len
        self._set_rope(torch.device("cpu"))

    def _set_rope(self, device: torch.device) -> None:
        # tables [max_seq_len, head_dim] in float32, cast per forward like the
        # reference's rotary embedding (casting the table itself to bf16 first
        # would round the angles, not just the result)
        freqs = torch.arange(self.max_seq_len, dtype=torch.int64).float()[:, None] * rope_inv_freq(self.cfg)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos().to(device), persistent=False)
        self.register_buffer("rope_sin", emb.sin().to(device), persistent=False)

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> "HiggsAudioV2LM":
        """Weights to ``dtype`` on ``device``; rope tables stay float32."""
        self.to(device=device, dtype=dtype)
        self._set_rope(device)
        return self.eval()

    def forward(self, ctx: AttentionContext, input_ids: torch.Tensor | None = None,
                audio_codes: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill: input_ids [B, T] text tokens. Decode: audio_codes [B, 1, C]. Returns hidden [B, T, H]."""
        cfg = self.cfg
        if input_ids is not None:
            x = self.model.embed_tokens(input_ids)
            audio_mask = (input_ids == cfg.audio_token_id) | (input_ids == cfg.audio_delay_token_id)
        else:
            x = self.model.embed_audio_tokens(audio_codes)
            audio_mask = None
        cos = self.rope_cos[ctx.positions_gpu].to(x.dtype)
        sin = self.rope_sin[ctx.positions_gpu].to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, ctx, audio_mask)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] -> float32 logits [B, C * codebook_size]."""
        return self.audio_lm_head(hidden).float()
