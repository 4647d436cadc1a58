"""A residual unit of the codec's DAC decoder as one Triton kernel (CUDA; Triton's interpreter in tests).

A unit is x + conv1x1(snake2(conv7_dilated(s))), s = snake1(x), on [B, C, L]
signals. At the decoder's high-rate end (32-128 channels at 4-24 kHz) cuDNN
reads those few channels well below bandwidth and each step is a pass over the
whole signal: the two convolutions, the second Snake and the add took a large
share of a call (BENCHMARKS.md, "Codec decode"). Here one
program takes BLOCK_L positions of one row, every channel: the seven dilated
taps as tensor-core dots, the bias, the Snake, the 1x1 dot and the residual
add, the intermediate signal never leaving the program. The convolutions
around it stay cuDNN's, on [B, C, L] (in channels last cuDNN's choices were
far slower at some shapes, depending on what ran before: BENCHMARKS.md,
channels last). The whole masked call then ran well ahead of transformers'
decode (BENCHMARKS.md, the residual-unit kernel).
Rounding follows the modules' forward in 16-bit: each convolution's sum rounded,
then its bias added and rounded (as ATen adds a cuDNN convolution's bias), the
Snake's steps (fused_ops.snake_value), the residual add; sums in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fused_ops import snake_value

# The widths the kernel takes, in whole power-of-two channel tiles: the released decoder's
# narrow units (128, 64, 32 channels), those measured. Wider units keep cuDNN (their
# [BLOCK_L, C] tiles would not fit), and so do narrower ones, which only test decoders have.
MIN_CHANNELS, MAX_CHANNELS = 32, 128
# (positions a program, warps) per width: the fastest of those timed at a drain call's shapes
# (32 rows x 192 frames, bf16: BENCHMARKS.md, the residual-unit kernel); a tile does
# not change a value (the same dots per position)
UNIT_TILES = {128: (64, 4), 64: (128, 8), 32: (128, 8)}
HEAD_TILE = (128, 4)  # the last convolution's kernel: (positions a program, warps), the fastest timed


@triton.jit
def _unit_kernel(s_ptr, x_ptr, w1_ptr, b1_ptr, a2_ptr, w2_ptr, b2_ptr, out_ptr, lengths_ptr, L, rate, dil,
                 C: tl.constexpr, BLOCK_L: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    # s, x, out [B, C, L]; w1 [7, C in, C out] (tap-major); w2 [C in, C out]; one row's BLOCK_L positions
    row = tl.program_id(1).to(tl.int64)
    pos = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    ch = tl.arange(0, C)
    base = row * C * L
    w_offs = ch[:, None] * C + ch[None, :]
    acc = tl.zeros((BLOCK_L, C), dtype=tl.float32)
    for tap in tl.static_range(7):  # the dilated kernel's taps; zero padding outside the row
        src = pos + (tap - 3) * dil
        tile = tl.load(s_ptr + base + ch[None, :] * L + src[:, None], mask=((src >= 0) & (src < L))[:, None],
                       other=0.0)  # [BLOCK_L, C in], positions contiguous
        acc = tl.dot(tile, tl.load(w1_ptr + tap * C * C + w_offs), acc, input_precision=PRECISION)
    dt = s_ptr.dtype.element_ty
    y = (acc.to(dt).to(tl.float32) + tl.load(b1_ptr + ch).to(tl.float32)[None, :]).to(dt)
    a2 = tl.load(a2_ptr + ch).to(tl.float32)[None, :]
    y = snake_value(y, a2, a2)
    if MASKED:  # the 1x1 convolution reads nothing past the row's length
        y = tl.where((pos < tl.load(lengths_ptr + row) * rate)[:, None], y, 0.0).to(dt)
    z = tl.dot(y, tl.load(w2_ptr + w_offs), input_precision=PRECISION)
    z = (z.to(dt).to(tl.float32) + tl.load(b2_ptr + ch).to(tl.float32)[None, :]).to(dt)
    here = base + ch[None, :] * L + pos[:, None]
    ok = (pos < L)[:, None]
    x = tl.load(x_ptr + here, mask=ok, other=0.0)
    tl.store(out_ptr + here, (x.to(tl.float32) + z.to(tl.float32)).to(dt), mask=ok)


@triton.jit
def _head_kernel(s_ptr, w_ptr, b_ptr, out_ptr, L, C: tl.constexpr, BLOCK: tl.constexpr):
    # s [B, C, L] (the last Snake's output, zero past each row's length); w [C, 7]; out [B, 1, L]
    row = tl.program_id(1).to(tl.int64)
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ch = tl.arange(0, C)
    acc = tl.zeros((C, BLOCK), dtype=tl.float32)  # per channel: one reduction at the end, not one a tap
    for tap in tl.static_range(7):  # kernel 7, padding 3: zero outside the row
        src = pos + tap - 3
        tile = tl.load(s_ptr + row * C * L + ch[:, None] * L + src[None, :],
                       mask=((src >= 0) & (src < L))[None, :], other=0.0)  # [C, BLOCK]
        acc += tile.to(tl.float32) * tl.load(w_ptr + ch * 7 + tap).to(tl.float32)[:, None]
    dt = s_ptr.dtype.element_ty
    y = (tl.sum(acc, axis=0).to(dt).to(tl.float32) + tl.load(b_ptr).to(tl.float32)).to(dt)
    tl.store(out_ptr + row * L + pos, y, mask=pos < L)


class FusedHead:
    """The decoder's last convolution (C channels -> 1, kernel 7) for _head_kernel: faster
    than cuDNN's at a drain call's 32 rows (BENCHMARKS.md, codec decode).
    Both are far from the one read of the signal it needs: the taps' shifted loads
    are not aligned, so they are not vectorized."""

    def __init__(self, conv):
        assert conv.out_channels == 1 and conv.kernel_size[0] == 7 and conv.padding[0] == 3
        self.w = conv.weight.detach()[0].contiguous()  # [1, C, 7] -> [C, 7]
        self.b = conv.bias.detach().contiguous()

    def __call__(self, s: torch.Tensor) -> torch.Tensor:
        """s [B, C, L] -> [B, 1, L], in s's dtype."""
        b, c, length = s.shape
        s = s.contiguous()
        out = torch.empty(b, 1, length, dtype=s.dtype, device=s.device)
        block, warps = HEAD_TILE
        _head_kernel[(triton.cdiv(length, block), b)](s, self.w, self.b, out, length, C=c, BLOCK=block,
                                                      num_warps=warps)
        return out


def fits(channels: int, least: int = MIN_CHANNELS) -> bool:
    """Whether a kernel takes this width: a power of two within [least, MAX_CHANNELS] (the last
    convolution's kernel, which has no dots, takes any from 1)."""
    return least <= channels <= MAX_CHANNELS and channels & (channels - 1) == 0


class FusedUnit:
    """A residual unit's weights laid out for _unit_kernel: copies, made from the loaded
    module in its final device and dtype."""

    def __init__(self, unit):
        assert unit.conv1.kernel_size[0] == 7 and unit.conv1.padding[0] == 3 * unit.conv1.dilation[0]
        self.dilation = unit.conv1.dilation[0]
        self.w1 = unit.conv1.weight.detach().permute(2, 1, 0).contiguous()  # [C out, C in, 7] -> [7, C in, C out]
        self.b1 = unit.conv1.bias.detach().contiguous()
        self.w2 = unit.conv2.weight.detach()[:, :, 0].t().contiguous()  # [C out, C in, 1] -> [C in, C out]
        self.b2 = unit.conv2.bias.detach().contiguous()
        self.alpha2 = unit.snake2.alpha.detach().reshape(-1).contiguous()

    def __call__(self, s: torch.Tensor, x: torch.Tensor, lengths: torch.Tensor | None = None,
                 rate: int = 1) -> torch.Tensor:
        """s = snake1(x) (zero from lengths[b] * rate on, with lengths), x [B, C, L] -> the unit's output."""
        b, c, length = x.shape
        x, s = x.contiguous(), s.contiguous()
        out = torch.empty_like(x)
        block, warps = UNIT_TILES[c]
        _unit_kernel[(triton.cdiv(length, block), b)](
            s, x, self.w1, self.b1, self.alpha2, self.w2, self.b2, out, x if lengths is None else lengths, length,
            rate, self.dilation, C=c, BLOCK_L=block, MASKED=lengths is not None,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps)
        return out
