"""The embedded default's codec decodes audio that the codes drive (issue 31).

Every test that compares decoded audio within a bound (bf16 rounding, an int16 step, equal
bytes) can tell 'decoded these codes' from 'decoded other codes' only if other codes give
audio far outside that bound. transformers' init made the tiny codec's audio its biases
(codes changed a few LSBs); tests/tiny_checkpoint.py's drive_by_codes fixes that, and this
holds the shipped checkpoint to it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_cli.runners.audio import pcm16
from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder
from tests.audio_controls import change_codec_frame
from tests.conftest import TINY


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())


@pytest.fixture(scope="module")
def codec():
    return HiggsCodecDecoder.load(TINY / "codec", torch.float32, torch.device("cpu"))


def test_embedded_codec_audio_is_mostly_its_codes(codec):
    """Two random code sequences [1, 8, T] decode to audio whose difference has at least half
    the RMS of either (independent signals: about sqrt(2); audio that is mostly bias: about 0),
    at several pairs and lengths; and the audio stays clear of int16's clipping."""
    g = torch.Generator().manual_seed(0)
    ratios, levels, clipped = [], [], 0
    for t in (12, 50, 50, 100):
        a, b = (torch.randint(0, 1024, (1, codec.num_quantizers, t), generator=g) for _ in range(2))
        ya, yb = codec.decode(a), codec.decode(b)
        ratios.append(_rms(ya - yb) / min(_rms(ya), _rms(yb)))
        levels.append((_rms(ya), max(float(ya.abs().max()), float(yb.abs().max()))))
        clipped += int(((pcm16(torch.cat([ya, yb])) == 32767) | (pcm16(torch.cat([ya, yb])) == -32768)).sum())
    print("code sensitivity rms(a - b) / min(rms a, rms b):", [f"{r:.3f}" for r in ratios])
    assert min(ratios) >= 0.5, ratios
    assert all(0.01 < rms and peak < 0.7 for rms, peak in levels), levels  # audible in 16 bits, far from full scale
    assert clipped == 0


def test_one_changed_frame_changes_the_audio_around_it(codec):
    """Other codes at one frame change that frame's audio by about its own level, and leave the
    audio beyond the decoder's receptive field (about ten frames each way) as it was."""
    hop = codec.hop_length
    codes = torch.randint(0, 1024, (1, codec.num_quantizers, 60), generator=torch.Generator().manual_seed(1))
    changed = change_codec_frame(codes, frame=30)
    a, b = codec.decode(codes)[0], codec.decode(changed)[0]
    at = slice(30 * hop, 31 * hop)
    assert _rms(a[at] - b[at]) >= 0.5 * _rms(a[at]), (_rms(a[at] - b[at]), _rms(a[at]))
    far = torch.cat([a[: 15 * hop] - b[: 15 * hop], a[46 * hop:] - b[46 * hop:]])
    assert float(far.abs().max()) <= 1e-6 * float(a.abs().max())
    diff = np.flatnonzero((a - b).abs().numpy() > 1e-3 * float(a.abs().max())) / hop
    assert 15 <= diff.min() <= 30 < diff.max() < 46, (diff.min(), diff.max())
