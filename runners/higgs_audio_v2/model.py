"""Higgs Audio v2 language model: a plain forward pass, no cache management.

A Llama-3 backbone in which every decoder layer has a second set of norms and
a second MLP for audio positions ("dual FFN"): text positions use
``input_layernorm``/``mlp``, audio positions ``audio_input_layernorm``/``audio_mlp``.
Audio input is the sum of 8 codebook embeddings (one table of 8 x codebook_size
rows, offset per codebook); the head ``audio_lm_head`` predicts 8 x codebook_size.

Parameter names equal transformers' HiggsAudioV2ForConditionalGeneration
state-dict keys, so its safetensors load as they are.

On CUDA with Triton, decode runs a fused path (``_decode_fused``): q/k/v and
gate/up are one GEMM each (the modules' weights become views of one fused
tensor, so no memory is added), and norms, rotary embedding with the KV
write, and silu-times-up are single kernels (runners/fused_ops.py). Prefill
and the CPU always run the plain modules.
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


def _fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
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


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # [2 * inter, hidden] once fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def fuse(self) -> None:
        self.gate_up_weight, _ = _fuse_linears([self.gate_proj, self.up_proj])

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        from runners.fused_ops import silu_mul

        return self.down_proj(silu_mul(F.linear(x, self.gate_up_weight)))


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
        self.qkv_weight: torch.Tensor | None = None  # [(H + 2 KVH) * D, hidden] once fused
        self.qkv_bias: torch.Tensor | None = None

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

    def fuse(self) -> None:
        self.qkv_weight, self.qkv_bias = _fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def decode_fused(self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                     ctx: AttentionContext) -> torch.Tensor:
        """x [B, hidden] (one decode token per row) -> [B, hidden]."""
        from runners.decode_attention import decode_attention
        from runners.fused_ops import rope_kv_write

        kc, vc = ctx.kv.k_gpu[self.layer], ctx.kv.v_gpu[self.layer]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q = rope_kv_write(qkv, rope_cos, rope_sin, ctx.positions_gpu[:, 0], ctx.slots_gpu, kc, vc,
                          self.n_heads, self.n_kv)
        out = decode_attention(q, kc, vc, ctx.slots_gpu, ctx.lengths_gpu)  # [B, H, 1, D]
        return self.o_proj(out.reshape(x.shape[0], -1))


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

    def decode_fused(self, x, delta, rope_cos, rope_sin, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """The audio path of one decode token per row, x [B, hidden]. The residual
        add of the previous layer's MLP output (delta) is fused into this layer's
        first norm; returns (residual, this layer's MLP output)."""
        from runners.fused_ops import add_rmsnorm

        n1, n2 = self.audio_input_layernorm, self.audio_post_attention_layernorm
        x, h = add_rmsnorm(x, delta, n1.weight, n1.eps)
        x, h = add_rmsnorm(x, self.self_attn.decode_fused(h, rope_cos, rope_sin, ctx), n2.weight, n2.eps)
        return x, self.audio_mlp.forward_fused(h)


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
        self.fused = False  # set by to_runtime: decode through _decode_fused
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
        from runners.attention import fused_kernels_available

        self.to(device=device, dtype=dtype)
        self._set_rope(device)
        if fused_kernels_available(device):
            # last: the fused weights are shared storage, which a later .to() would copy apart
            for layer in self.model.layers:
                layer.self_attn.fuse()
                layer.audio_mlp.fuse()
            self.fused = True
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
            if self.fused and ctx.lengths_gpu is not None:
                return self._decode_fused(x, ctx)
        cos = self.rope_cos[ctx.positions_gpu].to(x.dtype)
        sin = self.rope_sin[ctx.positions_gpu].to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, ctx, audio_mask)
        return self.model.norm(x)

    def _decode_fused(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """x [B, 1, hidden] audio embeddings -> final hidden [B, 1, hidden] (CUDA decode)."""
        from runners.fused_ops import add_rmsnorm

        x, delta = x[:, 0], None
        for layer in self.model.layers:
            x, delta = layer.decode_fused(x, delta, self.rope_cos, self.rope_sin, ctx)
        norm = self.model.norm
        return add_rmsnorm(x, delta, norm.weight, norm.eps)[1][:, None]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] -> float32 logits [B, C * codebook_size]."""
        return self.audio_lm_head(hidden).float()
