"""The scoring contract: ScoreInput's checks, RowScores' shape (runners/scoring/base.py)."""

from __future__ import annotations

import numpy as np
import pytest

from omni_cli.runners.scoring import RowScores, ScoreInput
from omni_cli.runners.scoring.base import samples_digest, to_rate
from omni_cli.runners.scoring.degenerate import DegenerateScorer


def test_score_input_checks_and_casts():
    row = ScoreInput(audio=np.zeros(10, np.float64), sample_rate=24000, text="a")
    assert row.audio.dtype == np.float32 and row.duration_s == 10 / 24000
    with pytest.raises(ValueError, match="mono float"):
        ScoreInput(audio=np.zeros((2, 10), np.float32), sample_rate=24000, text="a")
    with pytest.raises(ValueError, match="mono float"):
        ScoreInput(audio=np.zeros(10, np.int16), sample_rate=24000, text="a")
    with pytest.raises(ValueError, match="reference_rate"):
        ScoreInput(audio=np.zeros(10, np.float32), sample_rate=24000, text="a", reference=np.zeros(5, np.float32))
    codes = np.zeros((4, 8), np.int64)
    with pytest.raises(ValueError, match="come together"):
        ScoreInput(audio=np.zeros(10, np.float32), sample_rate=24000, text="a", codes=codes)
    with pytest.raises(ValueError, match="come together"):
        ScoreInput(audio=np.zeros(10, np.float32), sample_rate=24000, text="a", codes=codes,
                   logprobs=np.zeros((4, 7), np.float32), mask=np.ones((4, 8), bool))


def test_row_scores_carry_reasons_and_text():
    scores = RowScores(wer=0.5).missing(["cer"], "WER scores this row")
    scores.text["transcript"] = "hi"
    assert scores == {"wer": 0.5, "cer": None} and scores.reasons == {"cer": "WER scores this row"}
    assert isinstance(scores, dict) and "transcript" in repr(scores)


def test_every_row_gets_every_score_name_in_order():
    rows = [ScoreInput(audio=np.full(2400 * (i + 1), 0.1 * (i + 1), np.float32), sample_rate=24000, text="abc")
            for i in range(3)]
    out = DegenerateScorer().score(rows)
    assert len(out) == 3 and all(set(s) == set(DegenerateScorer.score_names) for s in out)
    assert [s["seconds_per_char"] for s in out] == pytest.approx([0.1 / 3, 0.2 / 3, 0.3 / 3])
    assert all(s[n] is not None or n in s.reasons for s in out for n in s)


def test_digest_and_resample_helpers():
    clip = np.sin(np.arange(4800) / 7).astype(np.float32)
    assert samples_digest(clip, 24000) == samples_digest(clip.astype(np.float64), 24000)
    assert samples_digest(clip, 24000) != samples_digest(clip, 16000)
    assert to_rate(clip, 24000, 24000) is clip and len(to_rate(clip, 24000, 16000)) == 3200
