"""The 12 Hz speech tokenizer's encoder: 24 kHz audio -> reference codes [frames, 16].

The reference's encoder is transformers' Mimi (4.57) without its decoder parts, written here
natively with Mimi's module names (the checkpoint's ``encoder.*`` tensors load as they are):
  audio [B, 1, n] -> SEANet: causal convs, ELU resnet blocks, strided downsampling convs
                  -> a causal transformer (LayerNorm, rope, full causal attention: 4.57's Mimi
                     passes its sliding window only to flash attention, so eager and SDPA
                     attend to every earlier frame), layer scales, GELU MLP      [B, hidden, 25 Hz]
                  -> a strided conv (replicate padding) to 12.5 Hz
                  -> split RVQ: the semantic quantizer and the acoustic ones each quantize the
                     same embeddings residually (nearest entry by torch.cdist, as Mimi)
  -> the first ``encoder_valid_num_quantizers`` codes, ceil(n / 1920) frames (as the reference trims).
transformers 5.x's Mimi is not used: it masks its encoder attention to the sliding window,
which the reference does not. Everything is causal, so a clip's codes never depend on padding
after it; ``encode`` runs each clip alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoint import load_into, read_safetensors
from ..errors import ConfigError
from .blocks import apply_rope, gqa_sdpa, rope_tables
from .codec_config import SpeechTokenizerConfig

# MimiConfig's defaults (transformers 4.57) for keys an encoder_config leaves out
MIMI_DEFAULTS = {"sampling_rate": 24000, "frame_rate": None, "audio_channels": 1, "hidden_size": 512,
                 "num_filters": 64, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7,
                 "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2, "use_causal_conv": True,
                 "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0, "codebook_size": 2048,
                 "codebook_dim": 256, "num_quantizers": 32, "use_conv_shortcut": False,
                 "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1, "num_hidden_layers": 8,
                 "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": None,
                 "hidden_act": "gelu", "norm_eps": 1e-5, "rope_theta": 10000.0, "layer_scale_initial_scale": 0.01,
                 "attention_bias": False}
# the Mimi decoder's parts the reference's encoder drops, should a file still hold them
_DECODER_PARTS = ("upsample.", "decoder_transformer.", "decoder.")


class _Conv(nn.Module):
    """MimiConv1d, causal: padded left by (effective kernel - stride) and right by what completes
    the last window, in ``pad_mode`` (zeros, or the edge value repeated)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.span = stride, (kernel - 1) * dilation + 1
        self.pad_total, self.pad_mode = self.span - stride, pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = math.ceil((length - self.span + self.pad_total) / self.stride + 1) - 1
        extra = frames * self.stride + self.span - self.pad_total - length
        return self.conv(F.pad(x, (self.pad_total, extra), mode=self.pad_mode))


class _ResnetBlock(nn.Module):
    def __init__(self, dim: int, kernel: int, dilation: int, compress: int, pad_mode: str):
        super().__init__()
        hidden = dim // compress
        self.block = nn.ModuleList([nn.ELU(), _Conv(dim, hidden, kernel, dilation=dilation, pad_mode=pad_mode),
                                    nn.ELU(), _Conv(hidden, dim, 1, pad_mode=pad_mode)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for m in self.block:
            h = m(h)
        return x + h


class _SEANet(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        pm = c["pad_mode"]
        layers: list[nn.Module] = [_Conv(c["audio_channels"], c["num_filters"], c["kernel_size"], pad_mode=pm)]
        scale = 1
        for ratio in reversed(c["upsampling_ratios"]):
            dim = scale * c["num_filters"]
            for j in range(c["num_residual_layers"]):
                layers.append(_ResnetBlock(dim, c["residual_kernel_size"], c["dilation_growth_rate"] ** j,
                                           c["compress"], pm))
            layers += [nn.ELU(), _Conv(dim, dim * 2, ratio * 2, stride=ratio, pad_mode=pm)]
            scale *= 2
        layers += [nn.ELU(), _Conv(scale * c["num_filters"], c["hidden_size"], c["last_kernel_size"], pad_mode=pm)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.layers:
            x = m(x)
        return x


class _Attention(nn.Module):
    def __init__(self, c: dict, head_dim: int):
        super().__init__()
        hid, bias = c["hidden_size"], c["attention_bias"]
        self.heads, self.kv, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], head_dim
        self.q_proj = nn.Linear(hid, self.heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hid, self.kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(hid, self.kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * head_dim, hid, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.head_dim).transpose(1, 2)
        out = gqa_sdpa(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=t > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class _MLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.fc1 = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.fc2 = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Scale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class _Layer(nn.Module):
    def __init__(self, c: dict, head_dim: int):
        super().__init__()
        hid = c["hidden_size"]
        self.self_attn = _Attention(c, head_dim)
        self.mlp = _MLP(c)
        self.input_layernorm = nn.LayerNorm(hid, eps=c["norm_eps"])
        self.post_attention_layernorm = nn.LayerNorm(hid, eps=c["norm_eps"])
        self.self_attn_layer_scale = _Scale(hid)
        self.mlp_layer_scale = _Scale(hid)

    def forward(self, x, cos, sin):
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class _Transformer(nn.Module):
    def __init__(self, c: dict, head_dim: int):
        super().__init__()
        self.theta, self.head_dim = c["rope_theta"], head_dim
        self.layers = nn.ModuleList(_Layer(c, head_dim) for _ in range(c["num_hidden_layers"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, hidden], no final norm (Mimi's)
        cos, sin = rope_tables(self.theta, self.head_dim, x.shape[1], x.device)
        cos, sin = cos.to(x.dtype)[None, None], sin.to(x.dtype)[None, None]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def embed(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = _Codebook(size, dim)


class _RVQ(nn.Module):
    def __init__(self, c: dict, n: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(c["codebook_size"], c["codebook_dim"]) for _ in range(n))
        vq_dim = c["vector_quantization_hidden_dimension"]
        if vq_dim != c["hidden_size"]:
            self.input_proj = nn.Conv1d(c["hidden_size"], vq_dim, 1, bias=False)
            self.output_proj = nn.Conv1d(vq_dim, c["hidden_size"], 1, bias=False)  # decode only
        else:
            self.input_proj = self.output_proj = None

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x [B, hidden, T] -> codes [n, B, T]: each quantizer takes the residual's nearest entry."""
        residual = self.input_proj(x) if self.input_proj is not None else x
        codes = []
        for vq in self.layers[:n]:
            flat = residual.permute(0, 2, 1)
            b, t, d = flat.shape
            table = vq.codebook.embed()
            idx = torch.cdist(flat.reshape(-1, d)[None].float(), table[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(b, t)
            residual = residual - F.embedding(idx, table).permute(0, 2, 1)
            codes.append(idx)
        return torch.stack(codes)


class _SplitRVQ(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.semantic_n = c["num_semantic_quantizers"]
        self.semantic_residual_vector_quantizer = _RVQ(c, self.semantic_n)
        self.acoustic_residual_vector_quantizer = _RVQ(c, c["num_quantizers"] - self.semantic_n)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.semantic_n)
        if n > self.semantic_n:
            codes = torch.cat([codes, self.acoustic_residual_vector_quantizer.encode(x, n - self.semantic_n)])
        return codes


class MimiEncoder(nn.Module):
    """Mimi's encode path under its names (encoder, encoder_transformer, downsample, quantizer)."""

    def __init__(self, raw: dict, path: Path):
        super().__init__()
        c = {**MIMI_DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k == "frame_rate"}}
        if not c.get("use_causal_conv", True):
            raise ConfigError(path, "encoder_config.use_causal_conv", "is false; the 12 Hz encoder is causal")
        if c.get("use_conv_shortcut"):
            raise ConfigError(path, "encoder_config.use_conv_shortcut", "is true; the 12 Hz encoder has none")
        hop = int(np.prod(c["upsampling_ratios"]))
        encodec_rate = math.ceil(c["sampling_rate"] / hop)
        frame_rate = c["frame_rate"] if c["frame_rate"] is not None else c["sampling_rate"] / hop / 2
        head_dim = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        self.num_quantizers = c["num_quantizers"]
        self.encoder = _SEANet(c)
        self.encoder_transformer = _Transformer(c, head_dim)
        self.downsample = None
        if frame_rate != encodec_rate:
            self.downsample = _Conv(c["hidden_size"], c["hidden_size"], 2 * int(encodec_rate / frame_rate), stride=2,
                                    bias=False, pad_mode="replicate")
        self.quantizer = _SplitRVQ(c)

    def forward(self, audio: torch.Tensor, n: int) -> torch.Tensor:
        """audio [B, 1, samples] -> codes [B, n, frames]."""
        h = self.encoder_transformer(self.encoder(audio).transpose(1, 2)).transpose(1, 2)
        if self.downsample is not None:
            h = self.downsample(h)
        return self.quantizer.encode(h, n).transpose(0, 1)


def reference_frames(samples: int, downsample: int = 1920) -> int:
    """Frames a clip of this many samples encodes to: every strided layer rounds its length up,
    and the reference keeps ceil(samples / downsample) of them."""
    return -(-samples // downsample) if samples > 0 else 0


class SpeechEncoder:
    """Reference clips -> codes, as Qwen3TTSTokenizer.encode (float32)."""

    def __init__(self, mimi: MimiEncoder, cfg: SpeechTokenizerConfig):
        self.mimi, self.cfg = mimi, cfg
        self.num_streams = cfg.encoder_valid_num_quantizers
        self.sample_rate = cfg.input_sample_rate

    @classmethod
    def load(cls, folder: Path, cfg: SpeechTokenizerConfig, device: torch.device,
             dtype: torch.dtype = torch.float32) -> "SpeechEncoder":
        """From speech_tokenizer/ (its ``encoder.*`` tensors)."""
        state = read_safetensors(Path(folder), prefixes=("encoder.",))
        state = {k[len("encoder."):]: v for k, v in state.items()}
        state = {k: v for k, v in state.items() if not k.startswith(_DECODER_PARTS)}
        mimi = MimiEncoder(cfg.encoder_config, cfg.path)
        if mimi.num_quantizers < cfg.encoder_valid_num_quantizers:
            raise ConfigError(cfg.path, "encoder_valid_num_quantizers",
                              f"is {cfg.encoder_valid_num_quantizers}; the encoder has {mimi.num_quantizers}")
        load_into(mimi, state, Path(folder))
        return cls(mimi.to(device=device, dtype=dtype).eval(), cfg)

    @torch.inference_mode()
    def encode(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """Mono float32 clips at sample_rate -> codes [ceil(samples / 1920), 16] int64 each."""
        p = next(self.mimi.parameters())
        out = []
        for clip in clips:
            wav = torch.from_numpy(np.ascontiguousarray(clip, dtype=np.float32)).to(p.device, p.dtype)
            codes = self.mimi(wav[None, None], self.num_streams)[0]  # [16, frames]
            frames = reference_frames(len(clip), self.cfg.encode_downsample_rate)
            out.append(codes[:, :frames].T.cpu().numpy().astype(np.int64))
        return out
