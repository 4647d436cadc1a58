"""DNSMOS (P.835 SIG, BAK, OVRL and P.808) from the ONNX files the `speechmos` wheel ships.

Microsoft's DNSMOS scores 16 kHz speech in windows of 9.01 s (144,160 samples) that start
every second, and averages the windows. This wrapper follows the reference
(DNS-Challenge's dnsmos_local.py, as speechmos 0.0.1.1 packages it) except for its one bug:
- a clip shorter than a window is repeated (the clip appended to itself until it is long
  enough), as the reference does;
- windows: as many as the reference counts (max(whole seconds - 9, 1)), each exactly
  144,160 samples from second k. The reference cuts window k at
  `int((k + 9.01) * 16000)`, which float rounding makes one sample short for k = 7..23 and
  119..122, and then skips the short window: a 24 s clip is scored on 7 of its 15 windows,
  a clip of exactly 9 s (repeated to 18 s) on 7 of 9; from 33 s on, 17 windows are lost
  (21 from 132 s). Here every window is scored;
- per window: `sig_bak_ovr.onnx` on the samples, its three outputs through DNSMOS's
  calibration polynomials; `model_v8.onnx` (P.808) on the log-mel of the window less its last
  160 samples (120 mels, n_fft 321, hop 160, centred with zero padding as librosa >= 0.10
  pads, power in dB below the window's peak, floored 80 dB down, then (dB + 40) / 40);
- the clip: the mean of its windows (P.835 in float64, P.808 in float32, as the reference).
Where the reference's windowing is right, the numbers are the reference's bit for bit.

Samples are clipped to [-1, 1] first (the reference refuses others; a WAV holds no more).
onnxruntime runs on the CPU, or with its CUDA provider for device 'cuda[:N]' (the
onnxruntime-gpu package). On CUDA windows run in groups of exactly `window_batch` (zero
windows fill the last), so a window's arithmetic never depends on what ran beside it; on
the CPU the tests show a group's size changes nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import RowScores, ScoreInput, Scorer, to_rate

RATE = 16000
WINDOW = 144160  # 9.01 s at 16 kHz
HOP = RATE  # a window starts every second
PRIMARY, P808 = "sig_bak_ovr.onnx", "model_v8.onnx"
N_FFT, MEL_HOP, N_MELS = 321, 160, 120
# DNSMOS's calibration of the P.835 model's raw outputs (the model's own constants, highest power first)
POLY_SIG = (-0.08397278, 1.22083953, 0.0052439)
POLY_BAK = (-0.13166888, 1.60915514, -0.39604546)
POLY_OVR = (-0.06766283, 1.11546468, 0.04602535)


def default_model_dir() -> Path | None:
    """speechmos's dnsmos_models folder, found without importing speechmos (it imports librosa)."""
    spec = importlib.util.find_spec("speechmos")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "dnsmos_models"


def window_starts(length: int) -> list[int]:
    """Start samples of a (repeated) clip's windows: the reference's count, every one kept."""
    count = max(length // RATE - 9, 1)
    return [k * HOP for k in range(count)]


def repeat_to_window(audio: np.ndarray) -> np.ndarray:
    """The clip appended to itself until it holds a window, as the reference lengthens short clips."""
    while len(audio) < WINDOW:
        audio = np.concatenate([audio, audio])
    return audio


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:  # Slaney's scale: linear below 1 kHz, log above
    hz = np.asarray(hz, dtype=np.float64)
    step, knee = np.log(6.4) / 27.0, 1000.0 / (200.0 / 3)
    return np.where(hz >= 1000.0, knee + np.log(np.maximum(hz, 1e-10) / 1000.0) / step, hz / (200.0 / 3))


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    step, knee = np.log(6.4) / 27.0, 1000.0 / (200.0 / 3)
    return np.where(mel >= knee, 1000.0 * np.exp(step * (mel - knee)), mel * (200.0 / 3))


def mel_filters() -> np.ndarray:
    """[N_MELS, N_FFT // 2 + 1] float32: triangular Slaney mel filters, area-normalised, 0 to 8 kHz."""
    fft_hz = np.fft.rfftfreq(N_FFT, 1.0 / RATE)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(RATE / 2), N_MELS + 2))
    width = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    filters = np.zeros((N_MELS, len(fft_hz)), dtype=np.float32)
    for m in range(N_MELS):  # float64 per filter, stored as float32, then scaled: librosa's rounding
        filters[m] = np.maximum(0, np.minimum(-ramps[m] / width[m], ramps[m + 2] / width[m + 1]))
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return filters


_HANN = (0.5 + 0.5 * np.cos(np.linspace(-np.pi, np.pi, N_FFT + 1)))[:N_FFT]  # periodic Hann, float64
_MELS = mel_filters()


def p808_features(segment: np.ndarray) -> np.ndarray:
    """[samples] float32 -> [frames, N_MELS] float32: the P.808 model's input (module doc)."""
    padded = np.pad(segment.astype(np.float32, copy=False), (N_FFT // 2, N_FFT // 2))
    frames = 1 + (len(padded) - N_FFT) // MEL_HOP
    view = np.lib.stride_tricks.as_strided(padded, (frames, N_FFT), (padded.strides[0] * MEL_HOP, padded.strides[0]))
    spectrum = np.fft.rfft(_HANN * view, axis=-1).astype(np.complex64)  # float64 FFT kept as complex64
    power = (np.abs(spectrum) ** 2).T  # [freq, frames] float32
    mel = np.einsum("ft,mf->mt", power, _MELS, optimize=True)
    db = 10.0 * np.log10(np.maximum(1e-10, mel))
    db -= 10.0 * np.log10(np.maximum(1e-10, mel.max()))
    db = np.maximum(db, db.max() - 80.0)
    return ((db + 40) / 40).T


def p808_features_torch(segments):
    """p808_features of each row of segments [n, samples] (a torch tensor, on its device) -> [n,
    frames, N_MELS] float32: the torch runtime's form (on CUDA the numpy one cost more than both
    models); the same steps and precisions, with the mel sum in a matmul."""
    import torch

    padded = torch.nn.functional.pad(segments.float(), (N_FFT // 2, N_FFT // 2))
    frames = padded.unfold(-1, N_FFT, MEL_HOP)  # [n, frames, N_FFT]
    hann = torch.from_numpy(_HANN).to(segments.device)
    spectrum = torch.fft.rfft(hann * frames.double(), dim=-1).to(torch.complex64)
    power = spectrum.abs() ** 2  # [n, frames, freq] float32
    mel = power @ torch.from_numpy(_MELS).to(segments.device).T  # [n, frames, N_MELS]
    db = 10.0 * torch.log10(torch.clamp(mel, min=1e-10))
    db = db - 10.0 * torch.log10(torch.clamp(mel.amax(dim=(1, 2), keepdim=True), min=1e-10))
    db = torch.maximum(db, db.amax(dim=(1, 2), keepdim=True) - 80.0)
    return (db + 40) / 40


def with_zero_rows(part, rows: int):
    """part [n, ...] (numpy, or a torch tensor on its device) with `rows` zero rows after it."""
    if isinstance(part, np.ndarray):
        return np.concatenate([part, np.zeros((rows, *part.shape[1:]), part.dtype)])
    import torch

    return torch.cat([part, part.new_zeros((rows, *part.shape[1:]))])


def _poly(coeffs: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    y = np.full(x.shape, coeffs[0], dtype=np.float64)
    for c in coeffs[1:]:  # Horner in float64, as numpy's poly1d evaluates a float32 input
        y = y * x.astype(np.float64) + c
    return y


def clip_scores(p835: np.ndarray, p808: np.ndarray) -> RowScores:
    """A clip's windows -> its scores: each column's mean as a contiguous vector (numpy's pairwise
    sum, as the reference's np.mean over its list), P.835 in float64, P.808 in float32."""
    sig, bak, ovr = (float(np.ascontiguousarray(p835[:, j]).mean()) for j in range(3))
    return RowScores(dnsmos_sig=sig, dnsmos_bak=bak, dnsmos_ovrl=ovr, dnsmos_p808=float(p808.mean()))


class DnsmosScorer(Scorer):
    """DNSMOS of each row (the module's doc). `models`: a folder with sig_bak_ovr.onnx and
    model_v8.onnx; default: the installed speechmos's."""

    name = "mos"
    score_names = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808")
    thresholds = {
        "dnsmos_ovrl": ("<", 3.0, "Emilia-Pipe keeps only clips of DNSMOS P.835 OVRL >= 3.0, ITU-T P.835's lowest "
                        "'fair' anchor (Emilia, arXiv 2407.05361 and its extended version)"),
    }

    def __init__(self, models: str | Path | None = None, device: str = "cpu", window_batch: int = 16,
                 threads: int | None = None, runtime: str = "auto", half: bool | None = None):
        """runtime: "onnxruntime", "torch" (runners/scoring/onnx_torch.py), or "auto": onnxruntime, but
        torch on a CUDA device where onnxruntime has no CUDA provider (onnxruntime-gpu not installed).
        half: the torch runtime's convolutions in float16 (default: on CUDA, where each window's graph
        is also replayed from a CUDA graph); scores within 0.01 of float32 (tests/test_scoring_dnsmos.py)."""
        import onnxruntime as ort

        folder = Path(models) if models is not None else default_model_dir()
        if folder is None or not (folder / PRIMARY).is_file() or not (folder / P808).is_file():
            raise FileNotFoundError(f"DNSMOS needs {PRIMARY} and {P808}: {folder or 'speechmos is not installed'} "
                                    "lacks them (pip install speechmos, or give a folder that holds both)")
        if runtime not in ("auto", "onnxruntime", "torch"):
            raise ValueError(f"DNSMOS runtime must be auto, onnxruntime or torch, got {runtime!r}")
        self.window_batch = max(1, int(window_batch))
        self.fixed_groups = str(device).startswith("cuda")  # fixed shapes: a window's score ignores its batch
        cuda_ort = "CUDAExecutionProvider" in ort.get_available_providers()
        if runtime == "torch" or (runtime == "auto" and self.fixed_groups and not cuda_ort):
            from .onnx_torch import TorchGraph

            self.runtime = "torch"
            half = self.fixed_groups if half is None else bool(half)
            self.primary, self.p808 = (TorchGraph(folder / name, device, half=half, graphs=self.fixed_groups)
                                       for name in (PRIMARY, P808))
            return
        self.runtime = "onnxruntime"
        if self.fixed_groups:
            if not cuda_ort:
                raise RuntimeError("DNSMOS on CUDA through onnxruntime needs its CUDA provider (pip install "
                                   f"onnxruntime-gpu); this onnxruntime has {', '.join(ort.get_available_providers())}")
            index = int(str(device).partition(":")[2] or 0)
            providers = [("CUDAExecutionProvider", {"device_id": index, "cudnn_conv_algo_search": "DEFAULT"}),
                         "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = int(threads)
        self.primary = ort.InferenceSession(str(folder / PRIMARY), options, providers=providers)
        self.p808 = ort.InferenceSession(str(folder / P808), options, providers=providers)

    def _run(self, session, inputs) -> np.ndarray:
        """inputs [n, ...] float32 (numpy, or torch on the executor's device) -> outputs [n, k] on the
        host, in groups (fixed-size on CUDA)."""
        outs = []
        for start in range(0, len(inputs), self.window_batch):
            part = inputs[start:start + self.window_batch]
            n = len(part)
            if self.fixed_groups and n < self.window_batch:
                part = with_zero_rows(part, self.window_batch - n)
            outs.append(session.run(None, {"input_1": part})[0][:n])
        return np.concatenate(outs)

    @staticmethod
    def _repeated(audio_16k: np.ndarray) -> np.ndarray:
        return repeat_to_window(np.clip(audio_16k, -1.0, 1.0).astype(np.float32))

    def windows(self, audio_16k: np.ndarray) -> np.ndarray:
        """[samples] at 16 kHz -> [windows, WINDOW] float32."""
        clip = self._repeated(audio_16k)
        return np.stack([clip[s:s + WINDOW] for s in window_starts(len(clip))])

    def device_windows(self, audio_16k: np.ndarray):
        """windows() on the torch executor's device: the clip (repeated) uploaded, its windows cut there."""
        import torch

        clip = self._repeated(audio_16k)
        clip_dev = torch.from_numpy(clip).to(self.p808.device)  # [samples]
        return clip_dev.unfold(0, WINDOW, HOP)[: len(window_starts(len(clip)))]  # [windows, WINDOW], a view

    def window_scores(self, windows) -> tuple[np.ndarray, np.ndarray]:
        """[n, WINDOW] (numpy; for the torch runtime a tensor on its device, which both models and the
        log-mel read) -> (P.835 [n, 3] float64: sig, bak, ovrl, calibrated; P.808 [n] float32)."""
        raw = self._run(self.primary, windows)  # [n, 3] float32
        if self.runtime == "torch":
            mels = p808_features_torch(windows[:, :-160])  # [n, 900, 120]
        else:
            mels = np.stack([p808_features(w[:-160]) for w in windows])  # [n, 900, 120]
        p835 = np.stack([_poly(POLY_SIG, raw[:, 0]), _poly(POLY_BAK, raw[:, 1]), _poly(POLY_OVR, raw[:, 2])], axis=1)
        return p835, self._run(self.p808, mels)[:, 0]

    def row_windows(self, batch: Sequence[ScoreInput]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Each row's per-window scores (P.835 [n, 3], P.808 [n]); None for a row without audio.
        Every row's windows run together, in groups of `window_batch`."""
        live = [i for i, row in enumerate(batch) if len(row.audio)]
        on_device = self.runtime == "torch"
        # NOTE: the torch runtime uploads each clip once and cuts its windows on the device: a call's
        # windows stacked on the host were 7x the audio, copied twice under the GIL and then over PCIe
        cut = self.device_windows if on_device else self.windows
        per_row = [cut(to_rate(batch[i].audio, batch[i].sample_rate, RATE)) for i in live]
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(batch)
        if live:
            if on_device:
                import torch

                p835, p808 = self.window_scores(torch.cat(per_row))
            else:
                p835, p808 = self.window_scores(np.concatenate(per_row))
            at = 0
            for i, w in zip(live, per_row):
                out[i] = (p835[at:at + len(w)], p808[at:at + len(w)])
                at += len(w)
        return out

    def score(self, batch: Sequence[ScoreInput]) -> list[RowScores]:
        return [RowScores().missing(self.score_names, "no audio") if w is None else clip_scores(*w)
                for w in self.row_windows(batch)]

    def close(self) -> None:
        self.primary = self.p808 = None
