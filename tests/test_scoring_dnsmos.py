"""DNSMOS against the speechmos reference implementation (runners/scoring/dnsmos.py)."""

from __future__ import annotations

import numpy as np
import pytest

from omni_cli.runners.scoring import ScoreInput
from omni_cli.runners.scoring.base import to_rate
from omni_cli.runners.scoring.dnsmos import (RATE, WINDOW, DnsmosScorer, clip_scores, p808_features,
                                             window_starts)
from tests.scoring_checkpoints import one_thread, tone  # noqa: F401 (one_thread: autouse)

NAMES = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808")
KEYS = ("sig_mos", "bak_mos", "ovrl_mos", "p808_mos")  # speechmos's names, in the same order


@pytest.fixture(scope="module")
def dnsmos():
    pytest.importorskip("speechmos.dnsmos")  # the reference imports librosa too
    from speechmos import dnsmos

    return dnsmos


@pytest.fixture(scope="module")
def ours():
    return DnsmosScorer()


def _row(audio: np.ndarray, rate: int = RATE) -> ScoreInput:
    return ScoreInput(audio=audio, sample_rate=rate, text="")


def _theirs(dnsmos, audio: np.ndarray) -> tuple[float, ...]:
    got = dnsmos.run(audio.copy(), RATE)
    return tuple(float(got[k]) for k in KEYS)


def test_equal_to_speechmos_where_its_windowing_is_right_in_any_batch(dnsmos, ours):
    clips = {3.0: tone(3.0, 180, seed=1), 9.5: tone(9.5, 240, noise=0.05, seed=2)}  # 3 windows (repeated), 1 window
    expected = {s: _theirs(dnsmos, c) for s, c in clips.items()}
    assert expected[3.0] != expected[9.5]
    ours.window_batch = 2  # the 9.5 s clip's window shares a group with the 3 s clip's first; the rest another
    try:
        batched = ours.score([_row(clips[9.5]), _row(clips[3.0])])
    finally:
        ours.window_batch = 16
    for got, s in zip(batched, (9.5, 3.0)):
        assert tuple(got[n] for n in NAMES) == expected[s]  # bit for bit
    assert 1.0 < expected[3.0][2] < 5.0


def test_24s_clip_every_window_scored_where_speechmos_skips_eight(dnsmos, ours):
    clip = tone(24.0, 200, noise=0.03, seed=3)
    assert len(ours.windows(clip)) == 15
    p835, p808 = ours.row_windows([_row(clip)])[0]  # what score() averages
    assert p835.shape == (15, 3) and p808.shape == (15,) and len(np.unique(p835[:, 2])) == 15
    got = clip_scores(p835, p808)
    theirs = _theirs(dnsmos, clip)
    # speechmos scored windows 0..6 only: its numbers are exactly the mean of our first seven
    assert theirs == tuple(clip_scores(p835[:7], p808[:7])[n] for n in NAMES)
    assert tuple(got[n] for n in NAMES) != theirs
    assert got["dnsmos_ovrl"] == pytest.approx(p835[:, 2].mean(), abs=1e-12)


class _Recorder:
    """Stands in for an onnxruntime session: records each input, answers zeros."""

    def __init__(self, width: int):
        self.width, self.inputs = width, []

    def run(self, _names, feeds):
        self.inputs.append(feeds["input_1"])
        return [np.zeros((1, self.width), np.float32)]


@pytest.mark.parametrize("seconds, skipped", [(3.0, []), (9.0, [7, 8]), (9.5, []), (24.0, list(range(7, 15))),
                                              (24.3, list(range(7, 15)))])
def test_which_windows_speechmos_scores(dnsmos, seconds, skipped):
    clip = tone(seconds, 300, seed=4)
    ref = dnsmos.DNSMOS.__new__(dnsmos.DNSMOS)
    ref.onnx_sess, ref.p808_onnx_sess = _Recorder(3), _Recorder(1)
    ref(clip.copy(), RATE, False)  # the reference's own windowing, no model run
    lengthened = clip
    while len(lengthened) < WINDOW:
        lengthened = np.concatenate([lengthened, lengthened])
    ours = [lengthened[s:s + WINDOW] for s in window_starts(len(lengthened))]
    kept = [k for k in range(len(ours)) if k not in skipped]
    assert len(ref.onnx_sess.inputs) == len(kept)
    for k, fed in zip(kept, ref.onnx_sess.inputs):
        assert np.array_equal(fed[0], ours[k])


def test_p808_features_equal_librosa():
    librosa = pytest.importorskip("librosa")
    segment = tone(9.01, 210, seed=5)[:WINDOW - 160]
    mel = librosa.feature.melspectrogram(y=segment, sr=RATE, n_fft=321, hop_length=160, n_mels=120)
    expected = ((librosa.power_to_db(mel, ref=np.max) + 40) / 40).T
    got = p808_features(segment)
    assert got.shape == (900, 120) and got.dtype == np.float32
    assert np.array_equal(got, expected)


def test_p808_features_in_torch_equal_librosas_within_float32():
    """The torch runtime's features (batched, on the executor's device) against librosa's, each window alone."""
    import torch

    librosa = pytest.importorskip("librosa")
    from omni_cli.runners.scoring.dnsmos import p808_features_torch

    segments = np.stack([tone(9.01, f, seed=i)[:WINDOW - 160] for i, f in enumerate((210, 95, 1800))])
    segments[2] *= 1e-3  # a quiet window: the floor and the per-window peak
    got = p808_features_torch(torch.from_numpy(segments)).numpy()
    for seg, g in zip(segments, got):
        mel = librosa.feature.melspectrogram(y=seg, sr=RATE, n_fft=321, hop_length=160, n_mels=120)
        expected = ((librosa.power_to_db(mel, ref=np.max) + 40) / 40).T
        assert g.shape == expected.shape and np.abs(g - expected).max() < 1e-5
    assert np.abs(got[0] - got[1]).max() > 0.1  # the windows' features differ: the check sees each


def test_resampled_rows_silence_and_no_audio(ours):
    clip_24k = to_rate(tone(4.6, 180, seed=1), RATE, 24000)  # repeated to 9.2 s: one window
    loud = np.clip(clip_24k * 8, -1.5, 1.5)  # past full scale: clipped to [-1, 1] as a WAV would hold it
    a, b, c = ours.score([_row(clip_24k, 24000), _row(loud, 24000), _row(np.zeros(0, np.float32), 24000)])
    assert all(1.0 < a[n] < 5.0 for n in NAMES) and a != b
    assert c == dict.fromkeys(NAMES) and c.reasons["dnsmos_ovrl"] == "no audio"


def test_torch_runtime_equals_onnxruntime(dnsmos, ours):
    """The torch executor (runners/scoring/onnx_torch.py: DNSMOS on a CUDA device without onnxruntime-gpu)
    scores as onnxruntime does, and as speechmos where its windowing is right, on the CPU."""
    by_torch = DnsmosScorer(runtime="torch")
    assert by_torch.runtime == "torch" and ours.runtime == "onnxruntime"
    clip = tone(9.5, 220, rate=RATE, seed=1)  # one window
    (got,), (ref,) = by_torch.score([_row(clip)]), ours.score([_row(clip)])
    assert [got[n] for n in NAMES] == pytest.approx([ref[n] for n in NAMES], abs=1e-5)
    assert [got[n] for n in NAMES] == pytest.approx(_theirs(dnsmos, clip), abs=1e-5)


def test_windows_cut_on_the_device_are_the_host_windows():
    """The torch runtime's windows (each clip uploaded once, cut by unfold) are the host's, which the
    tests above hold to speechmos's, for a short clip (repeated), one window, and many."""
    import torch

    by_torch = DnsmosScorer(runtime="torch")
    for seconds in (3.0, 9.5, 24.0):
        clip = tone(seconds, 220, rate=RATE, seed=2) * 1.5  # some samples past 1: clipped first
        host, dev = by_torch.windows(clip), by_torch.device_windows(clip)
        assert isinstance(dev, torch.Tensor) and dev.shape == host.shape
        assert np.array_equal(dev.numpy(), host)


def test_half_convolutions_within_a_hundredth_of_onnxruntime(ours):
    """The torch executor's float16 convolutions (its default on CUDA) score within 0.01 of onnxruntime's
    float32, on the CPU; the same graph in float32 scores as onnxruntime (the test above)."""
    half = DnsmosScorer(runtime="torch", half=True)
    assert half.primary.half and half.p808.half
    clips = [tone(9.5, 220, rate=RATE, seed=1), tone(9.5, 700, rate=RATE, seed=4)]  # one window each
    got, ref = half.score([_row(c) for c in clips]), ours.score([_row(c) for c in clips])
    worst = max(abs(g[n] - r[n]) for g, r in zip(got, ref) for n in NAMES)
    assert 0 < worst < 1e-2  # not equal: the half path ran


@pytest.mark.gpu
def test_on_cuda_within_rounding_of_the_cpu(ours):
    """On CUDA (onnxruntime-gpu, else the torch executor) the scores are the CPU's within TF32 rounding."""
    on_cuda = DnsmosScorer(device="cuda")
    clips = [tone(3.0, 220, rate=RATE, seed=1), tone(12.0, 150, rate=RATE, seed=3)]
    got, ref = on_cuda.score([_row(c) for c in clips]), ours.score([_row(c) for c in clips])
    worst = max(abs(g[n] - r[n]) for g, r in zip(got, ref) for n in NAMES)
    # cuDNN runs convolutions in TF32 (torch's default, onnxruntime-gpu's too): about 3e-3 off on the device
    assert worst < 1e-2, f"{on_cuda.runtime}: {worst} off: {[[g[n] for n in NAMES] for g in got]} vs " \
                         f"{[[r[n] for n in NAMES] for r in ref]}"
