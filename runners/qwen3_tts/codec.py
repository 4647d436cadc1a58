"""The 12 Hz speech tokenizer's decoder (codes -> 24 kHz audio) and its RowCodec.

As the reference's Qwen3TTSTokenizerV2Decoder computes it:
  codes [B, 16, T] -> split RVQ: codebook 0 through ``rvq_first``, 1..15 summed in order through
                     ``rvq_rest`` (each a codebook lookup, embedding_sum / cluster_usage, then
                     a 1x1 output convolution)                          [B, codebook_dim, T]
  -> causal conv (k3) -> transformer (input_proj, layers with rope and a causal sliding window
     of ``sliding_window`` keys, layer scales, RMSNorm, output_proj)       [B, latent, T]
  -> upsample: per ratio a causal transposed conv and a ConvNeXt block       [B, latent, 4T]
  -> vocoder: causal conv, blocks of (SnakeBeta, causal transposed conv, 3 residual units at
     dilations 1, 3, 9), SnakeBeta, causal conv to one channel, clamp [-1, 1]  [B, 1, 1920 T]
Every piece is causal (left padding only; transposed convs trimmed on the right), so a row's
valid samples never depend on the padding after it: rows of different lengths share a call.

The reference decodes in chunks of 300 frames, each after up to 25 frames of left context
(``chunked_decode``); chunk boundaries count from the row's first frame, so they are the same
for a row alone and padded in a batch. ``decode`` does the same.

Module names equal the checkpoint's under ``decoder.`` (speech_tokenizer/model.safetensors).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import fused_kernels_available
from ..checkpoint import load_into, read_safetensors
from .blocks import DecoderLayer, RMSNorm, gqa_sdpa, rope_tables
from .codec_config import CodecDecoderConfig, SpeechTokenizerConfig

CHUNK_FRAMES = 300  # the reference's chunked_decode chunk_size
CHUNK_CONTEXT = 25  # and its left_context_size
# a codec call's peak device memory a frame in float32, rounded up from the peak measured at the
# decoder config class's default widths (codebook_dim 512) on CUDA: about 5 MiB a frame at one
# row, 4 at 8-16 rows; 16-bit weights about half (frame_bytes)
CODEC_FRAME_BYTES = 6 << 20


class CausalConv1d(nn.Module):
    """A Conv1d padded on the left by (effective kernel - stride), and on the right by what makes
    the last window whole (the reference's extra padding; zero at stride 1)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.left = self.span - stride

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = math.ceil((length - self.span + self.left) / self.stride + 1)
        right = (frames - 1) * self.stride + (self.span - self.left) - length
        return F.pad(x, (self.left, right))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.pad(x))


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d with its last (kernel - stride) samples cut: output t reads inputs <= t / stride."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim] if self.trim > 0 else y


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        h = self.norm(self.dwconv(x).permute(0, 2, 1))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.permute(0, 2, 1)


class SnakeBeta(nn.Module):
    """x + sin(x e^alpha)^2 / (e^beta + 1e-9), per channel (log-scale parameters)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha[None, :, None])
        beta = torch.exp(self.beta[None, :, None])
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act2(self.conv1(self.act1(x)))) + x


class VocoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate),
                                    ResidualUnit(cout, 1), ResidualUnit(cout, 3), ResidualUnit(cout, 9)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        """The codebook entries [size, dim] (the reference divides on every call)."""
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _VQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class _RVQ(nn.Module):
    """A group of quantizers: the looked-up entries summed in order, then a 1x1 conv (no bias).
    ``input_proj`` is the encoder's; decoding never reads it."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.vq = _VQLayers(n, size, dim)
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, n, T] -> [B, io_dim, T]
        total = 0.0
        for k, layer in enumerate(self.vq.layers):
            total = total + F.embedding(codes[:, k], layer._codebook.table()).transpose(1, 2)
        return self.output_proj(total)


class _SplitRVQ(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = _RVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = _RVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        out = self.rvq_first.decode(codes[:, :1])
        return out + self.rvq_rest.decode(codes[:, 1:])


class _Transformer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.window = cfg.sliding_window
        self.cfg = cfg
        self.layers = nn.ModuleList(_TransformerLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.set_rope(torch.device("cpu"))

    def set_rope(self, device: torch.device) -> None:
        """float32 tables [max positions, head_dim] on the device: a forward (a graph capture)
        then copies nothing from the host."""
        cos, sin = rope_tables(self.cfg.rope_theta, self.cfg.head_dim, self.cfg.max_position_embeddings, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, latent] -> [B, T, latent]
        x = self.input_proj(x)
        t = x.shape[1]
        if t > self.rope_cos.shape[0]:
            raise ValueError(f"a codec chunk of {t} frames exceeds max_position_embeddings {self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[:t].to(x.dtype)[None, None], self.rope_sin[:t].to(x.dtype)[None, None]
        pos = torch.arange(t, device=x.device)
        gap = pos[:, None] - pos[None, :]  # query - key
        mask = ((gap >= 0) & (gap < self.window))[None, None]  # causal, the last `window` keys
        attend = lambda q, k, v: gqa_sdpa(q, k, v, mask=mask)  # noqa: E731
        for layer in self.layers:
            x = layer(x, cos, sin, attend)
        return self.output_proj(self.norm(x))


class _LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class _TransformerLayer(DecoderLayer):
    """A Qwen3-style layer without q/k norms, each residual branch scaled per channel."""

    def __init__(self, cfg: CodecDecoderConfig, i: int):
        super().__init__(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.attention_bias, cfg.rms_norm_eps, i, qk_norm=False)
        self.self_attn_layer_scale = _LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = _LayerScale(cfg.hidden_size)

    def forward(self, x, cos, sin, attend):
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class CodecDecoder(nn.Module):
    """Qwen3TTSTokenizerV2Decoder's decode path, under its module names."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.quantizer = _SplitRVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = _Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, f, f), ConvNeXtBlock(cfg.latent_dim)])
            for f in cfg.upsampling_ratios)
        layers: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            layers.append(VocoderBlock(cfg.decoder_dim // 2 ** i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        layers += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(layers)
        self.fused = False  # the vocoder on Triton kernels: set on CUDA by load_decoder (tests: the interpreter)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] in [0, codebook) -> audio [B, T * total_upsample] float, one whole chunk."""
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h.transpose(1, 2)).permute(0, 2, 1)
        for blocks in self.upsample:
            for block in blocks:
                h = block(h)
        if self.fused:  # the vocoder on its fused kernels, clamped there (runners/qwen3_tts/fused_codec.py)
            from .fused_codec import vocoder

            return vocoder(self.decoder, h)[:, 0]
        for layer in self.decoder:
            h = layer(h)
        return h.clamp(min=-1, max=1)[:, 0]

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, chunk: int = CHUNK_FRAMES, left_context: int = CHUNK_CONTEXT) -> torch.Tensor:
        """The reference's chunked_decode: chunks of ``chunk`` frames from frame 0, each decoded after
        up to ``left_context`` frames before it, whose samples are dropped. [B, Q, T] -> [B, T * hop]."""
        hop = self.cfg.total_upsample
        t = codes.shape[-1]
        pieces, start = [], 0
        while start < t:
            end = min(start + chunk, t)
            context = left_context if start - left_context > 0 else start
            pieces.append(self(codes[..., start - context: end])[:, context * hop:])
            start = end
        return torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0]


def load_decoder(folder: Path, cfg: SpeechTokenizerConfig, dtype: torch.dtype, device: torch.device) -> CodecDecoder:
    """The decoder from speech_tokenizer/ (its ``decoder.*`` tensors; the encoder's are not read)."""
    state = read_safetensors(Path(folder), prefixes=("decoder.",))
    state = {k[len("decoder."):]: v for k, v in state.items()}
    dec = CodecDecoder(cfg.decoder)
    load_into(dec, state, Path(folder))
    dec = dec.to(device=device, dtype=dtype).eval()
    dec.pre_transformer.set_rope(device)  # float32 whatever the weights' dtype
    dec.fused = fused_kernels_available(device)
    return dec


class Qwen3Codec:
    """The codec stage's view of Qwen3-TTS rows (a RowCodec, runners/family.py).

    A row's generated frames [T, 16] hold codebook 0 first and no delay pattern; a frame whose
    code 0 is codec EOS ends the row (it and what follows are not audio)."""

    def __init__(self, decoder: CodecDecoder, eos_id: int, sample_rate: int = 24000):
        self.decoder = decoder
        self.num_streams = decoder.cfg.num_quantizers
        self.sample_rate = sample_rate
        self.hop_length = decoder.cfg.total_upsample
        self.codebook_size = decoder.cfg.codebook_size
        self._eos = eos_id

    def span(self, tokens: np.ndarray) -> tuple[int, int]:
        """(0, frames before the first codec EOS on stream 0)."""
        stop = np.flatnonzero(tokens[:, 0] == self._eos)
        return 0, int(stop[0]) if stop.size else len(tokens)

    def codes_into(self, out: np.ndarray, tokens: np.ndarray, first: int, n: int) -> None:
        """out [16, >= n] int64: the frames transposed, clipped into the code range."""
        np.clip(tokens[first: first + n].T, 0, self.codebook_size - 1, out=out[:, :n])

    def decode(self, codes_gpu: torch.Tensor, lengths_gpu: torch.Tensor | None) -> torch.Tensor:
        """codes [B, 16, T] (rows valid up to lengths [B]; the rest padding of any value) -> audio
        [B, T * hop] float32. Padding is clipped into the code range and, the decoder being
        causal, changes no sample before a row's lengths[b] * hop; samples past it are zeroed."""
        codes = codes_gpu.clamp(0, self.codebook_size - 1)
        audio = self.decoder.decode(codes).float()
        if lengths_gpu is not None:
            ends = (lengths_gpu * self.hop_length)[:, None]
            audio = audio * (torch.arange(audio.shape[-1], device=audio.device)[None, :] < ends)
        return audio

    @staticmethod
    def frame_bytes(dtype: torch.dtype) -> int:
        return CODEC_FRAME_BYTES * (torch.finfo(dtype).bits // 8) // 4
