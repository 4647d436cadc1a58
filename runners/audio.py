"""The samples the audio files hold: 16-bit PCM, made on the device the codec ran on.

The codec's float audio becomes int16 before it is copied to the host: the
copy is half the bytes, and the writer threads, whose work holds the GIL that
the codec thread needs to launch its calls, no longer convert ~184k samples a
row (7.68 s at 24 kHz), which was most of a row's encoding (BENCHMARKS.md,
int16 samples from the device).
"""

from __future__ import annotations

import torch


def pcm16(audio: torch.Tensor) -> torch.Tensor:
    """float audio [..., samples] -> int16 samples, as libsndfile 1.2 converts float to PCM_16:
    floor(x * 32768), clipped (tests hold it to libsndfile's bytes). Exact in float32, where
    x * 2^15 and its floor are representable; done here, not by libsndfile, so files are the
    same whichever libsndfile is installed."""
    return torch.floor(audio.float() * 32768.0).clamp_(-32768, 32767).to(torch.int16)
