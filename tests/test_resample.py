"""runners/resample.py against analytic results, and (on the device) against torchaudio itself."""

from __future__ import annotations

import math

import pytest
import torch

from omni_cli.runners.resample import resample, resampled_length

RATE_PAIRS = [(24000, 16000), (44100, 24000), (16000, 24000), (22050, 24000)]
# Sines at or below 3 kHz: under 40% of the lower Nyquist (8 kHz) of every pair, inside the
# filter's passband (cutoff 0.99 of that Nyquist), where a Hann-windowed sinc of 6 zero
# crossings is flat to about 1e-3; a half-sample misalignment would be off by 0.3 at 3 kHz.
FREQS = [110.0, 440.0, 1234.5, 3000.0]
SINE_BOUND = 2e-3
EDGE_S = 0.05  # the filter reads zeros past the ends: compare only inside


def _sines(rate: int, length: int) -> torch.Tensor:
    t = torch.arange(length, dtype=torch.float64) / rate
    return sum(math.sin(0.7 * k + 0.3) * torch.sin(2 * math.pi * f * t + k) for k, f in enumerate(FREQS)) / len(FREQS)


@pytest.mark.parametrize("orig,new", RATE_PAIRS)
def test_band_limited_sines_land_on_the_new_grid(orig, new):
    x = _sines(orig, orig)  # one second
    y = resample(x.float(), orig, new).double()
    expected = _sines(new, y.shape[-1])  # the same continuous signal sampled at the new rate
    edge = int(EDGE_S * new)
    err = (y - expected)[edge:-edge].abs().max().item()
    assert err < SINE_BOUND, (orig, new, err)


@pytest.mark.parametrize("orig,new", RATE_PAIRS)
@pytest.mark.parametrize("length", [1, 2, 147, 1000, 24001, 44099])
def test_length_is_the_ceiling_of_new_times_length_over_orig(orig, new, length):
    # torchaudio's rule: ceil(new * length / orig); exact here (the quotient is far below 2^20)
    expected = -(-new * length // orig)
    assert resampled_length(length, orig, new) == expected
    assert resample(torch.zeros(length), orig, new).shape == (expected,)


def test_length_keeps_torchaudios_float32_rounding():
    # 44100 -> 24000 reduces to 147 -> 80. For length 2000003, 80 L / 147 = 1088437 + 1/147;
    # torchaudio takes the ceiling of that quotient as a float32, whose spacing at 2^20 is
    # 1/8: 1/147 rounds away and the length is 1088437, one short of the exact ceiling.
    length = 2000003
    assert (80 * length) % 147 == 1 and 2**20 <= 80 * length // 147 < 2**21
    assert resampled_length(length, 44100, 24000) == 80 * length // 147
    assert resample(torch.zeros(length), 44100, 24000).shape == (80 * length // 147,)


def test_leading_dimensions_resample_independently():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4410, generator=g)
    y = resample(x, 44100, 24000)
    assert y.shape == (2, 3, 2400)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(y[i, j], resample(x[i, j], 44100, 24000), rtol=0, atol=1e-6)


def test_equal_rates_return_the_input():
    x = torch.randn(100)
    assert resample(x, 24000, 24000) is x


def test_bad_rates_and_dtypes_are_errors():
    with pytest.raises(ValueError):
        resample(torch.zeros(10), 0, 16000)
    with pytest.raises(TypeError):
        resample(torch.zeros(10, dtype=torch.int16), 24000, 16000)


def _real_torchaudio():
    try:
        import torchaudio.functional as taf
        import torchaudio
    except Exception:
        return None
    if str(getattr(torchaudio, "__version__", "")).endswith("+standin"):  # tests/torchaudio_standin: ours
        return None
    return taf


# Same algorithm, same float32 operations in the same order: the only differences allowed
# are a convolution's summation order (none expected), far below this on signals in [-4, 4].
TORCHAUDIO_BOUND = 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("orig,new", RATE_PAIRS + [(48000, 24000), (8000, 24000), (24000, 24000)])
def test_matches_real_torchaudio(device, orig, new):
    taf = _real_torchaudio()
    if taf is None:
        pytest.skip("the real torchaudio does not import here")
    g = torch.Generator().manual_seed(orig + new)
    for shape in [(orig // 3 + 7,), (2, orig + 1)]:
        x = torch.randn(*shape, generator=g).to(device)
        ours, theirs = resample(x, orig, new), taf.resample(x, orig, new)
        assert ours.shape == theirs.shape
        diff = (ours - theirs).abs().max().item()
        assert diff <= TORCHAUDIO_BOUND, (device, orig, new, shape, diff)


@pytest.mark.gpu
def test_length_rule_matches_real_torchaudio():
    taf = _real_torchaudio()
    if taf is None:
        pytest.skip("the real torchaudio does not import here")
    for length in [1, 2, 147, 44099, 2000003]:
        x = torch.zeros(length, device="cuda")
        assert resample(x, 44100, 24000).shape == taf.resample(x, 44100, 24000).shape, length
