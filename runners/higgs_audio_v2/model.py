"""Higgs Audio v2 language model: a plain forward pass, no cache management.

A Llama-3 backbone in which every decoder layer has a second set of norms and
a second MLP for audio positions ("dual FFN"): text positions use
``input_layernorm``/``mlp``, audio positions ``audio_input_layernorm``/``audio_mlp``.
Audio input is the sum of 8 codebook embeddings (one table of 8 x codebook_size
rows, offset per codebook); the head ``audio_lm_head`` predicts 8 x codebook_size.

Parameter names equal transformers' HiggsAudioV2ForConditionalGeneration
state-dict keys, so its safetensors load as they are.

On CUDA with Triton, decode and (outside deterministic mode) prefill run a
fused path (``_decode_fused``, ``_prefill_fused``): q/k/v and gate/up are one
GEMM each (the modules' weights become views of one fused tensor, so no
memory is added), and norms, rotary embedding with the KV write, and
silu-times-up are single kernels (runners/fused_ops.py). A decode step of a
single row goes further: its projections are GEMVs with the norms, residual
adds, rope with the KV write and silu-times-up inside them, five kernels a
layer (runners/fused_gemv.py); up to 64 rows (tokens), gate/up and
silu-times-up are one Triton kernel (runners/fused_mm.py). The CPU and
deterministic prefill run the plain modules.

Prefill routes each token to its layer's text or audio norms and MLP by
index lists that are read to the host once per forward (``TokenSplit``): a
per-layer boolean index would sync with the device twice a layer, which made
a prefill much slower (BENCHMARKS.md, prefill).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import AttentionContext
from ..device import upload
from ..fusion import fuse_linears
from ..norms import RMSNorm
from .config import HiggsConfig


class TokenSplit:
    """Which flattened prefill tokens take a layer's text path and which its audio path.

    Built from the audio mask [B, T] with one host sync; ``route`` then runs a
    per-token function on each subset through index_select/index_copy, which
    never sync. Without audio tokens (a plain TTS prompt), or in decode where
    every token is audio, the whole batch takes one path with no indexing."""

    def __init__(self, audio_mask: torch.Tensor | None, all_audio: bool = True, device: torch.device | None = None):
        """audio_mask [B, T] bool, on the device (one host sync) or on the host (none: the engine's
        prefills, ``prefill_inputs``) with ``device`` the forward's; None: every token takes one path
        (``all_audio`` says which)."""
        self.text_gpu = self.audio_gpu = None  # flat token indices [n]; None when that path is empty
        self.all_audio = all_audio  # decode: every position is an audio frame
        if audio_mask is None:
            return
        flat_cpu = audio_mask.reshape(-1).cpu()
        self.all_audio = bool(flat_cpu.all())
        if not self.all_audio and bool(flat_cpu.any()):
            dev = device or audio_mask.device
            self.text_gpu = upload((~flat_cpu).nonzero()[:, 0], dev, pin=True)
            self.audio_gpu = upload(flat_cpu.nonzero()[:, 0], dev, pin=True)

    def route(self, text_fn, audio_fn, *inputs):
        """inputs [N, ...] (None passes through) -> the outputs of text_fn / audio_fn per token,
        each [N, ...]; the functions take and return tuples and act on every token alone."""
        if self.text_gpu is None:
            return (audio_fn if self.all_audio else text_fn)(*inputs)
        pick = lambda idx: [None if x is None else x.index_select(0, idx) for x in inputs]  # noqa: E731
        text_out, audio_out = text_fn(*pick(self.text_gpu)), audio_fn(*pick(self.audio_gpu))
        outs = []
        for t, a in zip(text_out, audio_out):
            out = t.new_empty((inputs[0].shape[0], *t.shape[1:]))
            out.index_copy_(0, self.text_gpu, t)
            out.index_copy_(0, self.audio_gpu, a)
            outs.append(out)
        return tuple(outs)


_TEXT_ONLY = TokenSplit(None, all_audio=False)  # every prefill token on the text path


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
        self.gate_up_weight, _ = fuse_linears([self.gate_proj, self.up_proj])

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> [N, hidden]; up to fused_mm.MAX_ROWS rows (16-bit), gate/up and
        silu·up are one kernel (runners/fused_mm.py), else a cuBLAS GEMM and silu_mul."""
        from .. import fused_mm
        from ..fused_ops import silu_mul

        if fused_mm.takes(x):
            return self.down_proj(fused_mm.mm(x, self.gate_up_weight, silu_mul=True))
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
        self.qkv_weight, self.qkv_bias = fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def decode_fused(self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                     ctx: AttentionContext) -> torch.Tensor:
        """x [B, hidden] (one decode token per row) -> [B, hidden]."""
        from ..decode_attention import decode_attention
        from ..fused_ops import rope_kv_write

        kc, vc = ctx.kv.k_gpu[self.layer], ctx.kv.v_gpu[self.layer]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q = rope_kv_write(qkv, rope_cos, rope_sin, ctx.positions_gpu[:, 0], ctx.slots_gpu, kc, vc, ctx.kv.table_gpu,
                          self.n_heads, self.n_kv)
        out = decode_attention(q, kc, vc, ctx.kv.table_gpu, ctx.slots_gpu, ctx.lengths_gpu,
                               cascade=ctx.cascade)  # [B, H, 1, D]
        return self.o_proj(out.reshape(x.shape[0], -1))

    def prefill_fused(self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                      positions: torch.Tensor, slots: torch.Tensor, ctx: AttentionContext, b: int) -> torch.Tensor:
        """x [B * T, hidden] (row-major tokens); positions, slots [B * T] -> [B * T, hidden]."""
        from ..fused_ops import rope_kv_write

        kc, vc = ctx.kv.k_gpu[self.layer], ctx.kv.v_gpu[self.layer]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q = rope_kv_write(qkv, rope_cos, rope_sin, positions, slots, kc, vc, ctx.kv.table_gpu, self.n_heads, self.n_kv)
        q = q.reshape(b, -1, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        out = ctx.attend_cached_causal(self.layer, q)  # [B, H, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], -1))


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

    def forward(self, x, cos, sin, ctx, split: TokenSplit) -> torch.Tensor:
        """x [B, T, hidden]; each token takes the text or the audio norms and MLP (``split``)."""
        b, t, n = x.shape
        flat = x.reshape(b * t, n)
        h = split.route(lambda y: (self.input_layernorm(y),), lambda y: (self.audio_input_layernorm(y),), flat)[0]
        flat = flat + self.self_attn(h.view(b, t, n), cos, sin, ctx).reshape(b * t, n)
        delta = split.route(lambda y: (self.mlp(self.post_attention_layernorm(y)),),
                            lambda y: (self.audio_mlp(self.audio_post_attention_layernorm(y)),), flat)[0]
        return (flat + delta).view(b, t, n)

    def decode_fused(self, x, delta, rope_cos, rope_sin, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """The audio path of one decode token per row, x [B, hidden]. The residual
        add of the previous layer's MLP output (delta) is fused into this layer's
        first norm; returns (residual, this layer's MLP output)."""
        from ..fused_ops import add_rmsnorm

        n1, n2 = self.audio_input_layernorm, self.audio_post_attention_layernorm
        x, h = add_rmsnorm(x, delta, n1.weight, n1.eps)
        x, h = add_rmsnorm(x, self.self_attn.decode_fused(h, rope_cos, rope_sin, ctx), n2.weight, n2.eps)
        return x, self.audio_mlp.forward_fused(h)

    def decode_gemv(self, x, rope_cos, rope_sin, ctx) -> torch.Tensor:
        """decode_fused's arithmetic for one row in five kernels (runners/fused_gemv.py):
        x [1, hidden] the residual in -> the residual out."""
        from ..decode_attention import decode_attention
        from ..fused_gemv import gemv, qkv_rope

        a, mlp = self.self_attn, self.audio_mlp
        n1, n2 = self.audio_input_layernorm, self.audio_post_attention_layernorm
        kc, vc = ctx.kv.k_gpu[a.layer], ctx.kv.v_gpu[a.layer]
        q = qkv_rope(x, a.qkv_weight, (n1.weight, n1.eps), rope_cos, rope_sin, ctx.positions_gpu[:, 0], ctx.slots_gpu,
                     kc, vc, ctx.kv.table_gpu, a.n_heads, a.n_kv)
        attn = decode_attention(q, kc, vc, ctx.kv.table_gpu, ctx.slots_gpu, ctx.lengths_gpu)  # [1, H, 1, D]
        x = gemv(attn.reshape(1, -1), a.o_proj.weight, residual=x)
        h = gemv(x, mlp.gate_up_weight, norm=(n2.weight, n2.eps), silu_mul=True)
        return gemv(h, mlp.down_proj.weight, residual=x)

    def prefill_fused(self, x, delta, rope_cos, rope_sin, positions, slots, ctx, split: TokenSplit, b: int):
        """decode_fused's prefill twin over flattened tokens x [B * T, hidden], each token
        on its text or audio norms and MLP."""
        from ..fused_ops import add_rmsnorm

        def norms(text: RMSNorm, audio: RMSNorm):  # (residual + delta, its norm) per path
            return (lambda y, d: add_rmsnorm(y, d, text.weight, text.eps),
                    lambda y, d: add_rmsnorm(y, d, audio.weight, audio.eps))

        x, h = split.route(*norms(self.input_layernorm, self.audio_input_layernorm), x, delta)
        attn = self.self_attn.prefill_fused(h, rope_cos, rope_sin, positions, slots, ctx, b)
        x, h = split.route(*norms(self.post_attention_layernorm, self.audio_post_attention_layernorm), x, attn)
        delta = split.route(lambda y: (self.mlp.forward_fused(y),), lambda y: (self.audio_mlp.forward_fused(y),), h)[0]
        return x, delta


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
        from ..attention import fused_kernels_available

        self.to(device=device, dtype=dtype)
        self._set_rope(device)
        if fused_kernels_available(device):
            # last: the fused weights are shared storage, which a later .to() would copy apart
            for layer in self.model.layers:
                layer.self_attn.fuse()
                layer.mlp.fuse()
                layer.audio_mlp.fuse()
            self.fused = True
        return self.eval()

    def _audio_ids(self) -> tuple[int, int]:
        return self.cfg.audio_token_id, self.cfg.audio_delay_token_id  # prompt tokens on the audio path

    def prefill_graph_inputs(self, prompts: list[list[int]]) -> dict | None:
        """The engine's prefill-graph contract: a prefill of these prompts (host content) replays
        a graph on the fused path with every token on the text path, passed as a fixed routing
        (a graph cannot route tokens by their values); None where any token is audio (an audio
        or delay token id, or an audio-code position, keyed below zero)."""
        if not self.fused or any(self._on_audio_path(p).any() for p in prompts):
            return None
        return {"split": _TEXT_ONLY}

    def _on_audio_path(self, content: list[int]) -> np.ndarray:
        """Which of these content positions take the audio path: an audio or delay id, or an audio-code
        position (keyed below zero); what ``input_ids`` gives on the device. [n] bool."""
        a, d = self._audio_ids()
        row = np.asarray(content, dtype=np.int64)
        return (row < 0) | (row == a) | (row == d)

    def prefill_inputs(self, prompts: list[list[int]], start: int, t: int, device: torch.device) -> dict:
        """The engine's eager-prefill contract: for positions start..start+t-1 of these prompts (host
        content, right padded), the routing of each token (audio or delay id, or an audio-code position,
        keyed below zero: what ``input_ids`` gives on the device), so the forward never syncs."""
        mask = np.zeros((len(prompts), t), dtype=bool)
        for i, p in enumerate(prompts):
            row = p[start: start + t]
            mask[i, : len(row)] = self._on_audio_path(row)
        return {"split": TokenSplit(torch.from_numpy(mask), device=device)}

    def forward(self, ctx: AttentionContext, input_ids: torch.Tensor | None = None,
                audio_codes: torch.Tensor | None = None, split: TokenSplit | None = None,
                prompt_codes: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill: input_ids [B, T] text tokens, and prompt_codes [B, T, C] where a prompt holds audio
        turns (their codes at the audio and delay token positions; anything elsewhere). Decode:
        audio_codes [B, 1, C]. Returns hidden [B, T, H]. ``split``: the prefill's routing, if known
        on the host (else read from input_ids, one sync)."""
        if input_ids is not None:
            x = self.model.embed_tokens(input_ids)
            if prompt_codes is not None:  # as transformers: audio placeholders take the codes' summed embeddings
                a, d = self._audio_ids()
                at = ((input_ids == a) | (input_ids == d))[..., None]
                x = torch.where(at, self.model.embed_audio_tokens(prompt_codes), x)
            if split is None:
                a, d = self._audio_ids()
                split = TokenSplit((input_ids == a) | (input_ids == d))
            if self.fused and not ctx.deterministic:
                return self._prefill_fused(x, ctx, split)
        else:
            x = self.model.embed_audio_tokens(audio_codes)
            split = TokenSplit(None)
            if self.fused and ctx.lengths_gpu is not None:
                return self._decode_fused(x, ctx)
        cos = self.rope_cos[ctx.positions_gpu].to(x.dtype)
        sin = self.rope_sin[ctx.positions_gpu].to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, ctx, split)
        return self.model.norm(x)

    def _prefill_fused(self, x: torch.Tensor, ctx: AttentionContext, split: TokenSplit) -> torch.Tensor:
        """x [B, T, hidden] prompt embeddings -> final hidden [B, T, hidden] (CUDA prefill).
        Deterministic mode keeps the plain path: its prefill attention is pinned to a
        kernel measured bit-stable at fixed shapes (runners/attention.py)."""
        from ..fused_ops import add_rmsnorm

        b, t, n = x.shape
        positions = ctx.positions_gpu.reshape(-1)  # [B * T]
        slots = ctx.slots_gpu.repeat_interleave(t)  # [B * T]
        x, delta = x.reshape(b * t, n), None
        for layer in self.model.layers:
            x, delta = layer.prefill_fused(x, delta, self.rope_cos, self.rope_sin, positions, slots, ctx, split, b)
        norm = self.model.norm
        return add_rmsnorm(x, delta, norm.weight, norm.eps)[1].view(b, t, n)

    def _gemv_rows(self, rows: int) -> bool:
        """Whether a forward of this many rows takes the GEMV kernels (which have no bias)."""
        if not self.fused or self.cfg.attention_bias:
            return False  # and Triton may be missing: no import
        from ..fused_gemv import MAX_ROWS

        return rows <= MAX_ROWS

    def _decode_fused(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """x [B, 1, hidden] audio embeddings -> final hidden [B, 1, hidden] (CUDA decode)."""
        from ..fused_ops import add_rmsnorm

        x, delta = x[:, 0], None
        if ctx.deterministic:  # batch-invariant kernels at any row count (invariant_step.py)
            from .invariant_step import add_norm, decode_layer

            pending = None
            for layer in self.model.layers:
                x, pending = decode_layer(layer, x, pending, self.rope_cos, self.rope_sin, ctx)
            return add_norm(x, pending, self.model.norm)[1][:, None]
        if self._gemv_rows(x.shape[0]):
            for layer in self.model.layers:
                x = layer.decode_gemv(x, self.rope_cos, self.rope_sin, ctx)
        else:
            for layer in self.model.layers:
                x, delta = layer.decode_fused(x, delta, self.rope_cos, self.rope_sin, ctx)
        norm = self.model.norm
        return add_rmsnorm(x, delta, norm.weight, norm.eps)[1][:, None]

    def compute_logits(self, hidden: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """hidden [B, H] -> float32 logits [B, C * codebook_size] (bf16-rounded where the weights are bf16);
        invariant: a row's bits whatever B (deterministic decode on the fused path)."""
        if invariant and self.fused:
            from .invariant_step import head

            return head(self.audio_lm_head, hidden)
        if self._gemv_rows(hidden.shape[0]):
            from ..fused_gemv import gemv

            return gemv(hidden, self.audio_lm_head.weight, out_dtype=torch.float32)
        return self.audio_lm_head(hidden).float()
