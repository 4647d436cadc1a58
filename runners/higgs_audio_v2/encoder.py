"""Codec encode for Higgs Audio v2 (voice cloning): audio -> RVQ codes, without torchaudio.

The same computation as transformers' HiggsAudioV2TokenizerModel.encode at its top bandwidth:
  audio [B, 1, T] at sample_rate
    semantic: resample to semantic_sample_rate (runners/resample.py, torchaudio's algorithm),
              pad 160 each side, HuBERT, mean of the hidden states of all its layers (the
              embeddings' output included), every semantic_downsample_factor-th frame kept,
              encoder_semantic (ELU residual units and convolutions)  -> [B, semantic, T']
    acoustic: the DAC encoder, on the audio padded hop/2 each side where the unpadded
              audio would not give T' frames                         -> [B, acoustic, T']
  cat (acoustic first) -> fc -> residual VQ: each quantizer projects the residual in, takes
  the nearest codebook entry (the reference's distance formula), and subtracts that entry
  projected back out                                                  -> codes [B, Q, T']
HuBERT is runners/higgs_audio_v2/hubert.py (transformers' HubertModel's computation, without
importing transformers), built from the codec config's semantic_model_config; the rest is
written here with the reference's module names, so the checkpoint's keys load as they are.
The DAC encoder reuses the decoder's Snake and residual unit (runners/higgs_audio_v2/codec.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoint import fold_weight_norm, load_into
from ..errors import ConfigError
from ..resample import resample, resampled_length
from .codec import DEFAULT_BANDWIDTHS, HIGGS_ACOUSTIC_DEFAULTS, Snake1d, _ResidualUnit, num_quantizers
from .codec import _Quantizer as _DecodeQuantizer
from .codec_layout import read_codec
from .hubert import Hubert, fold_hubert_weight_norm

# HiggsAudioV2TokenizerConfig's defaults for what a codec config.json may leave out
CODEC_DEFAULTS = {"sample_rate": 24000, "semantic_sample_rate": 16000, "downsample_factor": 320,
                  "kernel_size": 3, "channel_ratios": [1, 1], "strides": [1, 1], "block_dilations": [1, 1],
                  "unit_kernel_size": 3, "codebook_size": 1024, "codebook_dim": 64,
                  "target_bandwidths": DEFAULT_BANDWIDTHS}
ACOUSTIC_DEFAULTS = {**HIGGS_ACOUSTIC_DEFAULTS, "encoder_hidden_size": 64}
SEMANTIC_DEFAULTS = {"mask_time_prob": 0.0}
SEMANTIC_PAD = 160  # samples at the semantic rate, each side (the reference's constant)
PREFIXES = ("semantic_model.", "encoder_semantic.", "acoustic_encoder.", "fc.", "quantizer.")
# tensors under those prefixes that encoding never reads (codebook training statistics, HuBERT's mask embedding)
UNUSED = ("codebook.inited", "codebook.cluster_size", "codebook.embed_avg", "semantic_model.masked_spec_embed")


# HubertConfig's feature extractor (HuBERT base's): a config that names none has these
HUBERT_CONV_KERNEL = (10, 3, 3, 3, 3, 2, 2)
HUBERT_CONV_STRIDE = (5, 2, 2, 2, 2, 2, 2)


def encoded_frames(config: dict, samples: int) -> int:
    """Codec frames HiggsCodecEncoder.encode gives a clip of `samples` at the codec's rate, from
    its transformers-layout config alone (0: too short for HuBERT's convolutions). The semantic
    branch sets the count: resampled, padded SEMANTIC_PAD each side, each feature convolution's
    valid length in turn, then every semantic_downsample_factor-th frame."""
    cfg = {**CODEC_DEFAULTS, **config}
    sem = cfg.get("semantic_model_config") or {}
    rate, semantic_rate = int(cfg["sample_rate"]), int(cfg["semantic_sample_rate"])
    hop = int(np.prod([int(r) for r in (cfg.get("acoustic_model_config") or {}).get(
        "downsampling_ratios", ACOUSTIC_DEFAULTS["downsampling_ratios"])]))
    length = resampled_length(samples, rate, semantic_rate) + 2 * SEMANTIC_PAD if samples > 0 else 0
    for kernel, stride in zip(sem.get("conv_kernel", HUBERT_CONV_KERNEL), sem.get("conv_stride", HUBERT_CONV_STRIDE)):
        if length < kernel:
            return 0
        length = (length - kernel) // stride + 1
    factor = int(hop / (rate / semantic_rate) / int(cfg["downsample_factor"]))
    return -(-length // factor) if factor > 1 else length


class _SemanticUnit(nn.Module):
    """x + conv1x1(elu(conv_k_dilated(elu(x)))); no biases; length kept."""

    def __init__(self, channels: int, kernel: int, dilation: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2 * dilation, dilation=dilation,
                               bias=False)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.elu(self.conv1(F.elu(x))))


class _SemanticBlock(nn.Module):
    """Residual units, then a convolution of `stride` (kernel 3 at stride 1, else 2 * stride)."""

    def __init__(self, cin: int, cout: int, stride: int, kernel: int, dilations: list[int]):
        super().__init__()
        self.res_units = nn.ModuleList(_SemanticUnit(cin, kernel, d) for d in dilations)
        k = 3 if stride == 1 else 2 * stride
        self.conv = nn.Conv1d(cin, cout, kernel_size=k, stride=stride, padding=(k - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class _SemanticEncoder(nn.Module):
    """[B, semantic hidden, T'] -> [B, semantic hidden * channel_ratios[-1], T' / prod(strides)]."""

    def __init__(self, hidden: int, cfg: dict):
        super().__init__()
        if len(cfg["strides"]) != len(cfg["channel_ratios"]):
            raise ValueError("the codec config's strides and channel_ratios differ in length")
        k = int(cfg["kernel_size"])
        self.conv = nn.Conv1d(hidden, hidden, k, 1, k // 2, bias=False)
        blocks, cin = [], hidden
        for stride, ratio in zip(cfg["strides"], cfg["channel_ratios"]):
            cout = int(hidden * ratio)
            blocks.append(_SemanticBlock(cin, cout, int(stride), int(cfg["unit_kernel_size"]),
                                         [int(d) for d in cfg["block_dilations"]]))
            cin = cout
        self.conv_blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


class _DownBlock(nn.Module):
    """Three residual units (dilations 1, 3, 9), Snake, a convolution that makes the signal
    `stride` times shorter and doubles the channels."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.res_unit1 = _ResidualUnit(channels, 1)
        self.res_unit2 = _ResidualUnit(channels, 3)
        self.res_unit3 = _ResidualUnit(channels, 9)
        self.snake1 = Snake1d(channels)
        self.conv1 = nn.Conv1d(channels, 2 * channels, kernel_size=2 * stride, stride=stride,
                               padding=math.ceil(stride / 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(self.snake1(self.res_unit3(self.res_unit2(self.res_unit1(x)))))


class _AcousticEncoder(nn.Module):
    """DAC's encoder: audio [B, 1, T] -> [B, hidden, ~T / prod(strides)]."""

    def __init__(self, channels: int, strides: list[int], hidden: int):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, kernel_size=7, padding=3)
        self.block = nn.ModuleList(_DownBlock(channels * 2**i, s) for i, s in enumerate(strides))
        top = channels * 2 ** len(strides)
        self.snake1 = Snake1d(top)
        self.conv2 = nn.Conv1d(top, hidden, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))

    def output_length(self, length: int) -> int:
        """Frames for `length` samples: every convolution's output length in turn, as the
        reference's _get_conv1d_output_lengths counts them (int() of the float quotient)."""
        for m in self.modules():
            if isinstance(m, nn.Conv1d):
                length = int((length + 2 * m.padding[0] - m.dilation[0] * (m.kernel_size[0] - 1) - 1)
                             / m.stride[0] + 1)
        return length


class _Quantizer(_DecodeQuantizer):
    """The decode side's quantizer (codebook, project_out) with the encode side's project_in."""

    def __init__(self, size: int, dim: int, hidden: int):
        super().__init__(size, dim, hidden)
        self.project_in = nn.Linear(hidden, dim)

    def encode(self, residual: torch.Tensor) -> torch.Tensor:
        """residual [B, T, hidden] -> nearest entries [B, T]: argmax of -(|h|^2 - 2 h.e + |e|^2)."""
        h = self.project_in(residual)
        shape = h.shape
        h = h.reshape(-1, shape[-1])
        embed = self.codebook.embed.t()
        dist = -(h.pow(2).sum(1, keepdim=True) - 2 * h @ embed + embed.pow(2).sum(0, keepdim=True))
        return dist.max(dim=-1).indices.view(*shape[:-1])

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, hidden]
        return self.project_out(F.embedding(codes, self.codebook.embed))


class _RVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, hidden: int):
        super().__init__()
        self.quantizers = nn.ModuleList(_Quantizer(size, dim, hidden) for _ in range(n))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> codes [B, Q, T]: each quantizer encodes what the previous left."""
        codes, residual = [], x
        for q in self.quantizers:
            idx = q.encode(residual)
            residual = residual - q.decode(idx)
            codes.append(idx)
        return torch.stack(codes, dim=1)


class HiggsCodecEncoder(nn.Module):
    def __init__(self, config: dict, expect_quantizers: int | None = None, source: object = "codec config"):
        super().__init__()
        try:
            cfg = {**CODEC_DEFAULTS, **config}
            ac = {**ACOUSTIC_DEFAULTS, **cfg["acoustic_model_config"]}
            sem = {**SEMANTIC_DEFAULTS, **cfg["semantic_model_config"]}
            strides = [int(s) for s in ac["downsampling_ratios"]]
        except (KeyError, TypeError) as e:
            raise ConfigError(source, str(e), "missing from the codec config") from None
        self.sample_rate = int(cfg["sample_rate"])
        self.semantic_sample_rate = int(cfg["semantic_sample_rate"])
        self.hop_length = int(np.prod(strides))
        self.pad = self.hop_length // 2
        # semantic frames a codec frame: HubertConfig's conv strides give downsample_factor samples a frame
        self.semantic_downsample_factor = int(self.hop_length / (self.sample_rate / self.semantic_sample_rate)
                                              / int(cfg["downsample_factor"]))
        size, dim = int(cfg["codebook_size"]), int(cfg["codebook_dim"])
        frame_rate = math.ceil(self.sample_rate / self.hop_length)
        bandwidths = list(cfg["target_bandwidths"])
        self.num_quantizers = num_quantizers(bandwidths, frame_rate, size)
        if expect_quantizers is not None and self.num_quantizers != expect_quantizers:
            raise ConfigError(source, "target_bandwidths",
                              f"{bandwidths} give {self.num_quantizers} quantizers at {frame_rate} frames/s and "
                              f"codebook size {size}; the model expects {expect_quantizers}")
        # the reference encodes with as many quantizers as its top bandwidth buys; the same number
        by_bandwidth = max(1, math.floor(bandwidths[-1] / (math.log2(size) * frame_rate / 1000)))
        if by_bandwidth != self.num_quantizers:
            raise ConfigError(source, "target_bandwidths", f"{bandwidths[-1]} kbps buys {by_bandwidth} quantizers "
                              f"in the reference's encode, {self.num_quantizers} in its config: unsupported")
        acoustic, semantic = int(ac["hidden_size"]), int(sem.get("hidden_size", 768))
        hidden = acoustic + semantic
        # eval only: spec augment (training's) has no masked_spec_embed here, which checkpoints omit
        self.semantic_model = Hubert(sem, source)
        self.encoder_semantic = _SemanticEncoder(semantic, cfg)
        self.acoustic_encoder = _AcousticEncoder(int(ac["encoder_hidden_size"]), strides, acoustic)
        self.fc = nn.Linear(hidden, hidden)
        self.quantizer = _RVQ(self.num_quantizers, size, dim, hidden)

    @classmethod
    def from_state(cls, config: dict, state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu", expect_quantizers: int | None = None,
                   source: object = "codec") -> "HiggsCodecEncoder":
        """config: the codec's config.json (transformers' layout); state: its full state dict
        (transformers' key names; weight-norm pairs of the acoustic encoder are folded)."""
        with torch.device("meta"):  # every tensor comes from the state (a strict load): no random init
            enc = cls(config, expect_quantizers, source)
        enc = enc.to_empty(device=device)
        state = {k: v for k, v in state.items() if k.startswith(PREFIXES) and not k.endswith(UNUSED)}
        acoustic = fold_weight_norm({k: v for k, v in state.items() if k.startswith("acoustic_encoder.")})
        state = {**{k: v for k, v in state.items() if not k.startswith("acoustic_encoder.")}, **acoustic}
        state = fold_hubert_weight_norm(state, "semantic_model.")
        load_into(enc, state, Path(str(source)))
        return enc.to(device=device, dtype=dtype).eval()

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
             expect_quantizers: int | None = None) -> "HiggsCodecEncoder":
        config, state = cls.read(folder)
        return cls.from_state(config, state, dtype, device, expect_quantizers, Path(folder))

    @staticmethod
    def read(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
        """The codec's config and the encoder's tensors on the host (either released layout, in
        transformers' form): what a load can do off the main thread."""
        return read_codec(Path(folder), PREFIXES)

    def _semantic(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, 1, T] -> HuBERT's layer-averaged features [B, T', semantic hidden]."""
        x = resample(audio, self.sample_rate, self.semantic_sample_rate)[:, 0, :]
        x = F.pad(x, (SEMANTIC_PAD, SEMANTIC_PAD))
        hidden = self.semantic_model(x)
        features = torch.stack(hidden, dim=1).mean(dim=1)
        if self.semantic_downsample_factor > 1:
            features = features[:, ::self.semantic_downsample_factor, :]
        return features

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, 1, T] in the encoder's dtype -> codes [B, Q, T'] int64."""
        e_semantic = self.encoder_semantic(self._semantic(audio).transpose(1, 2))
        if self.acoustic_encoder.output_length(audio.shape[2]) != e_semantic.shape[2]:
            audio = F.pad(audio, (self.pad, self.pad))
        e_acoustic = self.acoustic_encoder(audio)
        embeddings = torch.cat([e_acoustic, e_semantic], dim=1)  # [B, hidden, T']
        return self.quantizer.encode(self.fc(embeddings.transpose(1, 2)))

    def warm_up(self) -> None:
        """On CUDA, encode a throwaway clip: the first encode of a process pays cuDNN's and cuBLAS's
        set-up and the lazy loading of every kernel it runs, several times the encode itself
        (BENCHMARKS.md, reference voices); paid here it is start-up, like the LM's warm-up."""
        if next(self.parameters()).device.type == "cuda":
            noise = np.random.default_rng(0).standard_normal(2 * self.sample_rate).astype(np.float32)
            self.encode([0.01 * noise])

    def encode(self, audio: list[np.ndarray]) -> list[np.ndarray]:
        """Mono float32 clips at sample_rate -> codes [frames, num_quantizers] int64 each.

        Each clip runs alone, never padded or batched: HuBERT's group norm takes statistics over
        the whole clip, so padding would change every frame, and a batch of equal lengths rounds
        differently from one clip on some CPUs' kernels, which would tie a voice's codes to
        whatever was encoded beside it."""
        p = next(self.parameters())
        out = []
        for i, clip in enumerate(audio):
            if clip.ndim != 1 or clip.size == 0:
                raise ValueError(f"clip {i}: a non-empty mono clip [samples] is needed, got shape {clip.shape}")
        with torch.inference_mode():
            for clip in audio:
                x = torch.from_numpy(np.asarray(clip, dtype=np.float32))[None, None, :]
                codes = self(x.to(device=p.device, dtype=p.dtype)).cpu().numpy()[0]
                out.append(np.ascontiguousarray(codes.T, dtype=np.int64))
        return out
