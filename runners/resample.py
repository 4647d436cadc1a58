"""Band-limited resampling, the algorithm of torchaudio.functional.resample at its defaults.

The runtime cannot import torchaudio (PyPI's wheels load only beside their own CUDA torch),
but the Higgs tokenizer's semantic branch was trained on torchaudio's resampler, so this is
that algorithm in plain torch (sinc_interp_hann, lowpass_filter_width 6, rolloff 0.99):

  y[j] = sum_i x[i] * scale * sinc(base * (i / orig - j / new)) * hann(...)

with both rates divided by their gcd. y[j + new] uses the filter of y[j] on x shifted by
`orig` samples, so the `new` filters (one a phase) run as one conv1d of stride `orig` whose
output channels are the phases, interleaved afterwards. The kernel is built in the input's
dtype and on its device, as torchaudio builds it when called from its resample.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOWPASS_FILTER_WIDTH = 6  # zero crossings of the sinc kept each side
ROLLOFF = 0.99  # cutoff as a fraction of the lower rate's Nyquist


def _kernel(orig: int, new: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    """Reduced rates -> (kernel [new, 1, 2 * width + orig], width): phase p's filter in row p."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    taps = torch.arange(-width, width + orig, dtype=dtype, device=device)[None, None] / orig  # [1, 1, K]
    phases = torch.arange(0, -new, -1, dtype=dtype, device=device)[:, None, None] / new  # [new, 1, 1]
    t = (phases + taps) * base  # in units of the cutoff's period
    t = t.clamp(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2  # hann over +-width zero crossings
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones((), dtype=dtype, device=device), t.sin() / t)
    return sinc * (window * (base / orig)), width


def resampled_length(length: int, orig_freq: int, new_freq: int) -> int:
    """torchaudio's output length: ceil(new * length / orig) of the reduced rates, the quotient
    rounded to float32 first (torch.as_tensor of a Python float), as torchaudio does: so past a
    few million output samples it can be one less than the exact ceiling."""
    g = math.gcd(int(orig_freq), int(new_freq))
    quotient = (new_freq // g) * length / (orig_freq // g)
    return int(torch.ceil(torch.tensor(quotient, dtype=torch.float32)))


def resample(waveform: torch.Tensor, orig_freq: int, new_freq: int) -> torch.Tensor:
    """waveform [..., time] float at orig_freq -> [..., ceil(new * time / orig)] at new_freq.

    Equal rates return the input itself, as torchaudio does."""
    if orig_freq <= 0 or new_freq <= 0 or int(orig_freq) != orig_freq or int(new_freq) != new_freq:
        raise ValueError(f"sample rates must be positive integers, got {orig_freq} and {new_freq}")
    if not waveform.is_floating_point():
        raise TypeError(f"resample needs a floating-point waveform, got {waveform.dtype}")
    if orig_freq == new_freq:
        return waveform
    g = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // g, int(new_freq) // g
    kernel, width = _kernel(orig, new, waveform.dtype, waveform.device)
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])  # [N, L]
    length = flat.shape[-1]
    padded = F.pad(flat, (width, width + orig))
    phases = F.conv1d(padded[:, None], kernel, stride=orig)  # [N, new, L // orig + 2]
    out = phases.transpose(1, 2).reshape(flat.shape[0], -1)  # phases interleaved: [N, new * frames]
    out = out[:, :resampled_length(length, orig, new)]
    return out.reshape(*shape[:-1], out.shape[-1])
