"""The 12 Hz decoder's vocoder on fused kernels (CUDA; Triton's interpreter in tests).

The vocoder (runners/qwen3_tts/codec.py: a causal conv, four blocks of SnakeBeta, a causal
transposed conv and three residual units, then SnakeBeta and a causal conv to one channel)
is most of a codec call. As modules, each SnakeBeta is seven passes over the signal (two
exps, a multiply, sin, pow, a divide, adds), each causal conv's padding a copy and each
bias an add: elementwise passes were about 60% of a call, and cuDNN took its generic
implicit_convolve_sgemm for the 384-channel units' dilation-9 convolution (BENCHMARKS.md,
the 12 Hz codec). Here each SnakeBeta is one pass (runners/fused_ops.py: snake with beta)
that also adds the bias of the convolution before it and a residual unit's input, and
writes the causal padding of the convolution after it; the convolutions run on cuDNN
without their bias (that one folded, the 1x1 ones as batched matmuls).

Rounding is the modules': every sum and bias add rounded where they round, e^alpha and
e^beta rounded to the weights' dtype as the module computes them; only the order of the
1x1 convolutions' float32 sums differs (and sin's last float32 bit, libdevice's against ATen's).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# NOTE: codec.py imports this module lazily, so nothing here imports codec.py (no cycle); the modules
# below are its SnakeBeta, CausalConv1d, CausalConvTranspose1d, VocoderBlock and ResidualUnit


# (channels, dilation) of the release's residual units whose dilated convolution runs folded (_dilated):
# for 384 channels at dilation 9 cuDNN takes its generic implicit_convolve_sgemm, about ten times slower
# than its neighbours (BENCHMARKS.md, the 12 Hz codec)
FOLDED_CONVS = {(384, 9)}


def _exp(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(e^alpha, e^beta) [C] in the module's dtype, as its forward computes them."""
    return torch.exp(m.alpha.detach()), torch.exp(m.beta.detach())


def _conv(m: nn.Module, x: torch.Tensor, padded: bool) -> torch.Tensor:
    """m(x) without its bias; padded: x already carries m's padding."""
    c = m.conv
    return F.conv1d(x if padded else m.pad(x), c.weight, None, c.stride, 0, c.dilation, c.groups)


def _conv_t(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """m(x) without its bias: the trimmed view of the transposed convolution's output."""
    c = m.conv
    y = F.conv_transpose1d(x, c.weight, None, c.stride, c.padding, c.output_padding, c.groups, c.dilation)
    return y[..., : y.shape[-1] - m.trim] if m.trim > 0 else y


def _dilated(m: nn.Module, s: torch.Tensor, length: int) -> torch.Tensor:
    """m's dilated convolution (kernel k, dilation d) without its bias over s [B, C, (k - 1) d + length
    + r], its causal padding and r <= d - 1 right zeros in place, as an undilated one over the [rows, d]
    view: position p = d i + j reads s at d (i + tap) + j, row i + tap of column j, so a conv2d with a
    (k, 1) kernel makes the same products. -> [B, C out, length] (a view of rows of length + r)."""
    c, d = m.conv, m.conv.dilation[0]
    n, ch, total = s.shape
    y = F.conv2d(s.view(n, ch, total // d, d), c.weight.unsqueeze(-1))
    return y.view(n, c.out_channels, -1)[..., :length]


def vocoder(decoder: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
    """CodecDecoder.decoder's forward on the fused kernels: h [B, latent, L] -> audio [B, 1, L * 480],
    clamped. The residual stream is held as (x, bias, residual) = residual + (x + bias), summed by
    the SnakeBeta that reads it next; x is a fresh convolution output, so that SnakeBeta may write
    the sum over it (keep) for the residual unit's add."""
    from ..fused_ops import snake

    first, blocks, last_act, head = decoder[0], decoder[1:-2], decoder[-2], decoder[-1]
    stream = (_conv(first, h, False), first.conv.bias, None)

    def act(m: nn.Module, pad: tuple[int, int] = (0, 0), keep: bool = False):
        nonlocal stream
        (x, bias, residual), stream = stream, None  # its signals free once this SnakeBeta has read them
        a, b = _exp(m)
        return snake(x, a, bias=bias, residual=residual, keep=keep, beta=b, pad=pad)

    for block in blocks:
        snake_in, up, *units = block.block
        stream = (_conv_t(up, act(snake_in)), up.conv.bias, None)
        for unit in units:
            assert unit.conv2.left == 0  # a 1x1 convolution: no padding
            conv1, length = unit.conv1.conv, stream[0].shape[-1]
            folded = (conv1.in_channels, conv1.dilation[0]) in FOLDED_CONVS
            x, s = act(unit.act1, (unit.conv1.left, -length % conv1.dilation[0] if folded else 0), keep=True)
            y = _dilated(unit.conv1, s, length) if folded else _conv(unit.conv1, s, True)
            del s  # before the second SnakeBeta allocates
            a2, b2 = _exp(unit.act2)
            y = snake(y, a2, bias=conv1.bias, beta=b2)
            # the 1x1 convolution as a batched matmul [C, C] @ [B, C, L] (contiguous, for the next SnakeBeta's
            # sum over it): cuDNN's ran several times slower at 96 channels
            w2 = unit.conv2.conv.weight[:, :, 0]
            stream = (torch.bmm(w2.expand(y.shape[0], *w2.shape), y), unit.conv2.conv.bias, x)
    s = act(last_act, (head.left, 0))
    return F.conv1d(s, head.conv.weight, head.conv.bias).clamp_(-1, 1)
