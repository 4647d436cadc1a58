"""A stand-in for Whisper in the gate tests: the real AsrScorer (its WER/CER, normalisers and
fields) over a backend whose transcript is the row's own text with an edit planted by the row's
audio, so that some attempts pass and others fail, and each attempt's transcript can be computed
again from its audio file alone (`planted`)."""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np

from omni_cli.runners.scoring.asr import AsrScorer


def planted(text: str, audio: np.ndarray) -> str:
    """The transcript of a clip of `text`: by the first byte of its samples' sha256, the text
    itself (a third of clips), the text less one word, or every word but the first replaced."""
    pick = hashlib.sha256(np.ascontiguousarray(audio, dtype=np.float32).tobytes()).digest()[0]
    words = text.split()
    if pick % 3 == 0 or len(words) < 2:
        return text
    if pick % 3 == 1:
        return " ".join(words[:pick % len(words)] + words[pick % len(words) + 1:])
    return " ".join(words[:1] + ["babble"] * (len(words) - 1))


class _Backend:
    sampling_rate = 16000

    def __init__(self):
        self.batch = []

    def transcribe(self, clips, languages):
        return [planted(row.text, row.audio) for row in self.batch]


class PlantedAsr(AsrScorer):
    def __init__(self):
        super().__init__(backend=_Backend())

    def score(self, batch):
        self.backend.batch = [row for row in batch if len(row.audio)]  # the rows AsrScorer transcribes
        return super().score(batch)


def install() -> None:
    from omni_cli.quality import job

    job.FACTORIES["asr"] = lambda settings, device: PlantedAsr()


@contextlib.contextmanager
def planted_asr():
    """The planted ASR installed for a module-scoped fixture's runs (monkeypatch is per test)."""
    from omni_cli.quality import job

    before = job.FACTORIES["asr"]
    job.FACTORIES["asr"] = lambda settings, device: PlantedAsr()
    try:
        yield
    finally:
        job.FACTORIES["asr"] = before
