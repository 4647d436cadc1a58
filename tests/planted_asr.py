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


def run_twice(tmp, rows: list[dict], flags: tuple) -> tuple:
    """`omni generate` of rows under flags into tmp/a and tmp/b with the planted ASR: (prompts, a, b)."""
    from tests.conftest import run_cli, write_jsonl

    prompts = write_jsonl(tmp / "p.jsonl", rows)
    with planted_asr():
        for name in ("a", "b"):
            res = run_cli("generate", prompts, "-o", tmp / name, *flags)
            assert res.exit_code == 0, res.output
    return prompts, tmp / "a", tmp / "b"


def killed_then_resumed(prompts, out, flags: tuple, kill: str) -> None:
    """`omni generate` with the planted ASR in a subprocess that SIGKILLs itself at `kill` (tests/killing.py),
    then the same command with --resume, which must finish."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, OMNI_TEST_PLANTED_ASR="1", OMNI_TEST_KILL=kill, TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "tests.killing", "generate", str(prompts), "-o", str(out), *flags]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == -9, res.stderr
    res = subprocess.run(cmd + ["--resume"], cwd=REPO, env=dict(env, OMNI_TEST_KILL=""), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
