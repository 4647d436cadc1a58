"""The scoring contract: a finished row in (`ScoreInput`), named scores out (`RowScores`).

A `Scorer` takes a batch of finished rows and returns, for each row in order, a `RowScores`:
a dict of score name -> float, or None where the scorer could not score that row, with the
reason in `RowScores.reasons` (e.g. "no reference voice"). Text a scorer produces besides
its numbers (ASR's transcript) goes in `RowScores.text`.

Determinism: a row's scores are a function of that row alone. Batching is for throughput:
which rows share a batch, in what order, and how much padding they get never changes a
row's score (each scorer's tests hold it; where a model's arithmetic sees padding, the
scorer keeps that part per clip).
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Sequence

import numpy as np
import torch

from ..resample import resample

# score name -> (direction, threshold, why): a row is rejected when its value is `direction`
# of the threshold (">": above it, "<": below it)
Thresholds = Mapping[str, tuple[str, float, str]]


@dataclass(frozen=True, eq=False)
class ScoreInput:
    """One finished row, as scorers see it. Arrays stay on the host (numpy)."""

    audio: np.ndarray  # [samples] float32 mono, at sample_rate
    sample_rate: int
    text: str  # the row's text (a long row: all its chunks' text)
    language: str | None = None  # as the row gave it ("en", "english", "zh-CN"), None: unknown
    reference: np.ndarray | None = None  # the reference voice's audio [samples] float32 mono, or None
    reference_rate: int | None = None  # its sample rate
    codes: np.ndarray | None = None  # [frames, streams] int: the sampled tokens
    logprobs: np.ndarray | None = None  # [frames, streams] float32: each token's logprob
    mask: np.ndarray | None = None  # [frames, streams] bool: True where a token is a real audio code
    frame_rate: float | None = None  # the codec's frames a second (Higgs 25, Qwen3-TTS 12.5)
    max_new_frames: int | None = None
    finish_reason: str | None = None  # "stop" | "length"
    id: str = ""  # for messages only

    def __post_init__(self):
        audio = np.asarray(self.audio)
        if audio.ndim != 1 or not np.issubdtype(audio.dtype, np.floating):
            raise ValueError(f"row {self.id!r}: audio must be mono float samples [samples], got {audio.dtype} "
                             f"{audio.shape}")
        object.__setattr__(self, "audio", audio.astype(np.float32, copy=False))
        if int(self.sample_rate) <= 0:
            raise ValueError(f"row {self.id!r}: sample_rate must be positive, got {self.sample_rate}")
        if self.reference is not None:
            ref = np.asarray(self.reference)
            if ref.ndim != 1 or not np.issubdtype(ref.dtype, np.floating) or not self.reference_rate:
                raise ValueError(f"row {self.id!r}: reference must be mono float samples with its reference_rate")
            object.__setattr__(self, "reference", ref.astype(np.float32, copy=False))
        arrays = [a for a in (self.codes, self.logprobs, self.mask) if a is not None]
        if arrays and (len(arrays) != 3 or any(np.shape(a) != np.shape(self.codes) or np.ndim(a) != 2
                                               for a in arrays)):
            raise ValueError(f"row {self.id!r}: codes, logprobs and mask come together, each [frames, streams]")

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


class RowScores(dict):
    """score name -> float | None for one row; `reasons`: name -> why it is None; `text`: text outputs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reasons: dict[str, str] = {}
        self.text: dict[str, str] = {}

    def missing(self, names: Sequence[str], reason: str) -> RowScores:
        """Set each of `names` to None for `reason`; returns self."""
        for name in names:
            self[name] = None
            self.reasons[name] = reason
        return self

    def __repr__(self) -> str:
        return f"RowScores({dict(self)!r}, reasons={self.reasons!r}, text={self.text!r})"


class Scorer(abc.ABC):
    """Scores finished rows. `score_names`: what `score` sets for every row (a number or None);
    `thresholds`: this scorer's default rejection rules, for the names that have one."""

    name: ClassVar[str]
    score_names: ClassVar[tuple[str, ...]]
    thresholds: ClassVar[Thresholds] = {}

    @abc.abstractmethod
    def score(self, batch: Sequence[ScoreInput]) -> list[RowScores]:
        """One RowScores per row, in order; every name of `score_names` set in each."""

    def close(self) -> None:
        """Drop the models (device memory); the scorer is unusable afterwards."""


def torch_device(device: str | torch.device) -> torch.device:
    """'cpu', 'cuda', 'cuda:N' -> torch.device; CUDA asked for where there is none is an error."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"scoring device {device!r}: this machine has no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"scoring device must be cpu or cuda[:N], got {device!r}")
    return dev


def model_dtype(dev: torch.device, dtype: str | torch.dtype | None) -> torch.dtype:
    """float32 on the CPU; on CUDA the given half type (default float16)."""
    if dev.type == "cpu":
        return torch.float32
    if dtype is None:
        return torch.float16
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dt not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"scoring dtype must be float16, bfloat16 or float32, got {dtype!r}")
    return dt


def to_rate(audio: np.ndarray, rate: int, new_rate: int) -> np.ndarray:
    """Mono float32 [samples] at `rate` -> [samples'] float32 at `new_rate` (runners/resample.py:
    torchaudio's default resampler), on the host: each clip alone, so no clip sees another."""
    if int(rate) == int(new_rate):
        return audio
    clip_host = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
    return resample(clip_host, int(rate), int(new_rate)).numpy()


def samples_digest(audio: np.ndarray, rate: int) -> str:
    """sha256 of a clip's float32 samples and its rate: the key of a cached embedding."""
    h = hashlib.sha256(f"{int(rate)}\0".encode())
    h.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    return h.hexdigest()


def chunks(items: Sequence, size: int):
    """Consecutive slices of at most `size` items."""
    for start in range(0, len(items), max(1, int(size))):
        yield items[start:start + max(1, int(size))]


@dataclass
class EmbeddingCache:
    """digest -> embedding [D] float32 (host), for clips embedded once per run (reference voices)."""

    store: dict[str, np.ndarray] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
