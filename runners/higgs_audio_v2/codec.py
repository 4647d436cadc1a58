"""Codec decode for Higgs Audio v2 without torchaudio.

transformers' HiggsAudioV2TokenizerModel imports torchaudio at module level
(it only uses it to resample on the encode path), and PyPI's torchaudio does
not load beside a CPU torch. Decoding needs none of that: it is
  codes [B, 8, T] -> sum over quantizers of project_out(codebook[code])   (RVQ)
                  -> fc2 (hidden -> acoustic hidden)
                  -> the DAC acoustic decoder (hop 960: 24 kHz at 25 fps).
The DAC decoder is written here with transformers' module names (so the
checkpoint's acoustic_decoder.* keys load as they are), not imported: its
modeling module pulls in transformers' whole modeling stack, seconds of a
process's start-up (BENCHMARKS.md, start-up). It is loaded with exactly those keys
of the checkpoint's safetensors. The encoder, HuBERT and semantic parts are
not loaded here: runners/higgs_audio_v2/encoder.py has them (voice cloning).

As in the reference, the DAC decoder's transposed convolutions get
output_padding = stride % 2 and the final tanh is dropped. On CUDA with
Triton the Snake activations run as one kernel each (runners/fused_ops.py),
which also adds the bias of the convolution before them and the residual of
a wide unit, and in 16-bit the narrow residual units after their first Snake
and the last convolution too (runners/fused_codec.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from ..attention import fused_kernels_available
from ..checkpoint import fold_weight_norm, load_into
from .codec_layout import read_codec


# what HiggsAudioV2TokenizerConfig puts under a codec config's acoustic_model_config where it
# leaves a key out (transformers 5.17)
HIGGS_ACOUSTIC_DEFAULTS = {"downsampling_ratios": [8, 5, 4, 2], "decoder_hidden_size": 1024,
                           "upsampling_ratios": [8, 5, 4, 2], "hidden_size": 256}


# HiggsAudioV2TokenizerConfig's target_bandwidths (kbps) where a config leaves them out
DEFAULT_BANDWIDTHS = [0.5, 1, 1.5, 2, 4]


def num_quantizers(bandwidths: list[float], frame_rate: int, codebook_size: int) -> int:
    """The codec's RVQ depth: its top bandwidth over the bits a frame of one quantizer costs
    (the rule of HiggsAudioV2TokenizerConfig.num_quantizers)."""
    return int(1000 * bandwidths[-1] // (frame_rate * math.ceil(math.log2(codebook_size))))


class Snake1d(nn.Module):
    """x + sin(alpha x)^2 / (alpha + 1e-9), per channel. x [B, C, T]; alpha [1, C, 1]."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class _ResidualUnit(nn.Module):
    """x + conv1x1(snake(conv7_dilated(snake(x)))); both convolutions keep the length."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.snake1 = Snake1d(channels)
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake1d(channels)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class _UpBlock(nn.Module):
    """Snake, a transposed convolution that makes the signal `stride` times longer (and
    halves the channels), three residual units at dilations 1, 3, 9."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.snake1 = Snake1d(channels)
        self.conv_t1 = nn.ConvTranspose1d(channels, channels // 2, kernel_size=2 * stride, stride=stride,
                                          padding=math.ceil(stride / 2), output_padding=stride % 2)
        self.res_unit1 = _ResidualUnit(channels // 2, 1)
        self.res_unit2 = _ResidualUnit(channels // 2, 3)
        self.res_unit3 = _ResidualUnit(channels // 2, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res_unit3(self.res_unit2(self.res_unit1(self.conv_t1(self.snake1(x)))))


class _AcousticDecoder(nn.Module):
    """DAC's decoder: latent [B, hidden, T] -> audio [B, 1, T * prod(strides)]."""

    def __init__(self, hidden: int, channels: int, strides: list[int]):
        super().__init__()
        self.conv1 = nn.Conv1d(hidden, channels, kernel_size=7, padding=3)
        self.block = nn.ModuleList(_UpBlock(channels // 2**i, s) for i, s in enumerate(strides))
        self.snake1 = Snake1d(channels // 2 ** len(strides))
        self.conv2 = nn.Conv1d(channels // 2 ** len(strides), 1, kernel_size=7, padding=3)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        h = self.conv1(latent)
        for block in self.block:
            h = block(h)
        return self.conv2(self.snake1(h))


class _FusedSnake1d(Snake1d):
    """Snake1d as one Triton kernel (CUDA): the activation is most of the decoder's memory
    traffic at the 24 kHz end, where transformers' version makes seven passes over it."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        from ..fused_ops import snake

        return snake(hidden_states, self.alpha)


class _FusedResidualUnit(_ResidualUnit):
    """A narrow residual unit whose work after its first Snake is one Triton kernel
    (runners/fused_codec.py); `kernel` holds its weights, laid out once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(self.snake1(x), x)


# (channels, dilation) of the residual units whose dilated convolution runs folded on CUDA in
# 16-bit: for the released decoder's 512-channel units at dilation 9 cuDNN's heuristics take
# its generic implicit_convolve_sgemm, several times slower than the fold; at dilation 3, and
# at 256 channels, the fold was slower at some shapes (BENCHMARKS.md, folded dilated convolutions)
FOLDED_CONVS = {(512, 9)}


class _FoldedConv1d(nn.Conv1d):
    """A wide residual unit's dilated convolution (k7, dilation d > 1, length kept) as an
    undilated one over the signal's [L/d, d] view: position p = d i + j and its taps d apart
    are rows i + k of column j, so a conv2d with a (7, 1) kernel on that view makes the same
    products (the length padded with zeros to a multiple of d, as the convolution's own zero
    padding would read them). On CUDA only the convolutions of FOLDED_CONVS run so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.folded(x, self.bias)

    def folded(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # x [B, C, L] -> [B, C out, L]
        d = self.dilation[0]
        n, c, length = x.shape
        pad = -length % d
        if pad:
            x = F.pad(x, (0, pad))
        y = F.conv2d(x.reshape(n, c, -1, d), self.weight.unsqueeze(-1), bias, padding=(self.padding[0] // d, 0))
        y = y.view(n, self.out_channels, length + pad)
        return y[..., :length] if pad else y


def _unbiased(conv: nn.Conv1d | nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """conv(x) without adding its bias (the fused decode adds it in the Snake kernel that
    reads this output next). ATen adds a bias after cuDNN's convolution, so the convolution
    itself is the same call either way."""
    if isinstance(conv, nn.ConvTranspose1d):
        return F.conv_transpose1d(x, conv.weight, None, conv.stride, conv.padding, conv.output_padding, conv.groups,
                                  conv.dilation)
    if isinstance(conv, _FoldedConv1d):
        return conv.folded(x, None)
    return F.conv1d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)


def _keep_mask(h: torch.Tensor, lengths: torch.Tensor, rate: int) -> torch.Tensor:
    """h [B, C, L], L = T * rate -> [B, 1, L] in h's dtype: 1 before each row's lengths[b] * rate, else 0."""
    keep = torch.arange(h.shape[-1], device=h.device)[None, :] < (lengths * rate)[:, None]
    return keep[:, None, :].to(h.dtype)


class _FusedHeadConv(nn.Conv1d):
    """The decoder's last convolution (to one channel) as one Triton kernel
    (runners/fused_codec.py); `kernel` holds its weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)


def use_fused_kernels(dec: _AcousticDecoder) -> None:
    """Swap the acoustic decoder's Snakes, its residual units of 32-128 channels and its last
    convolution for their Triton kernels, and the dilated convolutions of FOLDED_CONVS for their
    folded form (_FoldedConv1d), in the modules' final device and dtype. On CUDA in
    float32 the units and the last convolution stay cuDNN's (TF32), which the kernels'
    full-precision float32 arithmetic would not match in speed or rounding; elsewhere only
    Triton's interpreter runs this (tests), in any dtype."""
    from ..fused_codec import FusedHead, FusedUnit, fits

    p = next(dec.parameters())
    units = p.device.type != "cuda" or p.dtype in (torch.bfloat16, torch.float16)
    for m in dec.modules():
        if isinstance(m, Snake1d):
            m.__class__ = _FusedSnake1d
        elif isinstance(m, _ResidualUnit) and units and fits(m.conv1.in_channels):
            m.__class__ = _FusedResidualUnit
            m.kernel = FusedUnit(m)
        elif isinstance(m, _ResidualUnit) and units and (m.conv1.in_channels, m.conv1.dilation[0]) in FOLDED_CONVS:
            m.conv1.__class__ = _FoldedConv1d
    if units and fits(dec.conv2.in_channels, least=1):
        dec.conv2.__class__ = _FusedHeadConv
        dec.conv2.kernel = FusedHead(dec.conv2)


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("embed", torch.zeros(size, dim))


class _Quantizer(nn.Module):
    def __init__(self, size: int, dim: int, hidden: int):
        super().__init__()
        self.codebook = _Codebook(size, dim)
        self.project_out = nn.Linear(dim, hidden)


class _RVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, hidden: int):
        super().__init__()
        self.quantizers = nn.ModuleList(_Quantizer(size, dim, hidden) for _ in range(n))


class HiggsCodecDecoder(nn.Module):
    def __init__(self, raw: dict, path: Path):
        super().__init__()
        try:
            ac = {**HIGGS_ACOUSTIC_DEFAULTS, **raw["acoustic_model_config"]}
            sem_hidden = raw["semantic_model_config"]["hidden_size"]
            down = ac["downsampling_ratios"]
        except (KeyError, TypeError) as e:
            raise ConfigError(path, str(e), "missing from the codec config") from None
        self.sample_rate = int(raw.get("sample_rate", 24000))
        self.hop_length = int(np.prod(down))
        frame_rate = math.ceil(self.sample_rate / self.hop_length)
        size, dim = int(raw.get("codebook_size", 1024)), int(raw.get("codebook_dim", 64))
        self.num_quantizers = num_quantizers(raw.get("target_bandwidths", DEFAULT_BANDWIDTHS), frame_rate, size)
        acoustic = int(ac["hidden_size"])
        hidden = acoustic + sem_hidden
        self.quantizer = _RVQ(self.num_quantizers, size, dim, hidden)
        self.fc2 = nn.Linear(hidden, acoustic)
        self.acoustic_decoder = _AcousticDecoder(acoustic, int(ac["decoder_hidden_size"]),
                                                 [int(x) for x in ac["upsampling_ratios"]])

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype, device: torch.device) -> "HiggsCodecDecoder":
        # either layout, under transformers' names (codec_layout.py); only the decode path's tensors
        raw, state = read_codec(folder, prefixes=("quantizer.", "fc2.", "acoustic_decoder."))
        dec = cls(raw, folder / "config.json")
        state = fold_weight_norm(state)
        # encode-only (project_in) and training-only (codebook statistics) tensors
        state = {k: v for k, v in state.items()
                 if not k.endswith(("project_in.weight", "project_in.bias", "codebook.inited",
                                    "codebook.cluster_size", "codebook.embed_avg"))}
        load_into(dec, state, folder)
        dec = dec.to(device=device, dtype=dtype).eval()
        if fused_kernels_available(device):
            use_fused_kernels(dec.acoustic_decoder)
        return dec

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """codes [B, Q, T] int64 in [0, codebook) -> audio [B, T * hop_length] float32.

        lengths [B] (on codes' device): row b's codes are codes[b, :, :lengths[b]]
        and the rest is padding. Its audio is then the first lengths[b] * hop
        samples (the rest is to be dropped), equal to decoding the row alone up
        to rounding: every activation past a row's length is zeroed before a
        convolution reads it, as the convolution's own zero padding would be
        there. That lets rows of different lengths share a call, and a call
        keep one shape across many lengths (cuDNN plans each new shape once,
        slowly: BENCHMARKS.md, warm-up)."""
        latent = self.latent(codes)
        if isinstance(self.acoustic_decoder.snake1, _FusedSnake1d):
            return self._decode_fused(latent, lengths)[:, 0].float()
        if lengths is None:
            return self.acoustic_decoder(latent)[:, 0].float()  # no tanh, as in the reference
        return self._decode_masked(latent, lengths)[:, 0].float()

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> the acoustic decoder's input [B, acoustic hidden, T]: the RVQ's sum, then fc2."""
        quantized = 0
        for q, quantizer in enumerate(self.quantizer.quantizers):
            quantized = quantized + quantizer.project_out(F.embedding(codes[:, q], quantizer.codebook.embed))
        return self.fc2(quantized).transpose(1, 2)

    def _decode_fused(self, latent: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """The DAC decoder's forward on its fused kernels (use_fused_kernels), masked as in
        _decode_masked with lengths, whole without. The convolutions that cuDNN runs skip
        their bias: the Snake kernel reading their output adds it, and a wide residual
        unit's add too, each rounded where the modules round, so the values are theirs.
        ATen's separate bias adds were 21 passes over the signal a call, a real share of a
        drain call (BENCHMARKS.md, convolution biases inside the Snakes)."""
        from ..fused_ops import snake

        dec = self.acoustic_decoder
        if lengths is not None:
            latent = latent * _keep_mask(latent, lengths, 1)
        # The residual stream as (x, bias, residual): residual + (x + bias), for the next Snake,
        # which consumes it. x is a convolution's fresh output, so keep may write the sum over
        # it; peak memory then stays at the modules' (three signals at the 24 kHz end).
        rate = 1
        stream = (_unbiased(dec.conv1, latent), dec.conv1.bias, None)

        def act(alpha: torch.Tensor, keep: bool = False):
            nonlocal stream
            (x, bias, residual), stream = stream, None  # its signals free once this Snake has read them
            return snake(x, alpha, lengths, rate, bias=bias, residual=residual, keep=keep)

        def unit_out(unit: _ResidualUnit):  # the stream after a unit; its signals die with this call
            x, s = act(unit.snake1.alpha, keep=True)
            if isinstance(unit, _FusedResidualUnit):
                return unit.kernel(s, x, lengths, rate), None, None  # masks its second Snake itself
            y = _unbiased(unit.conv1, s)
            del s  # before the second Snake allocates
            y = snake(y, unit.snake2.alpha, lengths, rate, bias=unit.conv1.bias)
            return _unbiased(unit.conv2, y), unit.conv2.bias, x

        for block in dec.block:
            stream = (_unbiased(block.conv_t1, act(block.snake1.alpha)), block.conv_t1.bias, None)  # T * stride
            rate *= block.conv_t1.stride[0]
            for unit in (block.res_unit1, block.res_unit2, block.res_unit3):
                stream = unit_out(unit)
        return dec.conv2(act(dec.snake1.alpha))

    def _decode_masked(self, latent: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The DAC decoder's forward (_AcousticDecoder) with every convolution's input zero past each row's
        length, as the convolution's own zero padding would be there. Only the
        residual stream holds garbage past a length, and it reaches a
        convolution only through a Snake, whose output is masked: here by a
        multiply, in _decode_fused inside the Snake kernel (no extra pass over the signal)."""
        dec = self.acoustic_decoder
        keeps: dict[int, torch.Tensor] = {}  # rate -> [B, 1, T * rate], built once per rate

        def valid(h: torch.Tensor, rate: int) -> torch.Tensor:  # h [B, C, L] with L = T * rate
            if rate not in keeps:
                keeps[rate] = _keep_mask(h, lengths, rate)
            return h * keeps[rate]

        def act(snake: Snake1d, h: torch.Tensor, rate: int) -> torch.Tensor:
            return valid(snake(h), rate)

        rate = 1
        h = dec.conv1(valid(latent, rate))
        for block in dec.block:
            h = block.conv_t1(act(block.snake1, h, rate))  # ConvTranspose1d here makes exactly T * stride
            rate *= block.conv_t1.stride[0]
            for unit in (block.res_unit1, block.res_unit2, block.res_unit3):
                h = h + unit.conv2(act(unit.snake2, unit.conv1(act(unit.snake1, h, rate)), rate))
        return dec.conv2(act(dec.snake1, h, rate))
