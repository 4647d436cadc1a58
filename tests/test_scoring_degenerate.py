"""Degenerate-output detectors on synthetic rows, each with a control that must not trigger
(runners/scoring/degenerate.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from omni_cli import longform
from omni_cli.output import min_window_logprob
from omni_cli.runners.scoring import ScoreInput, broken, default_rules
from omni_cli.runners.scoring.degenerate import (CHARS_PER_S, LOGPROB_WINDOW, THRESHOLDS, WIDE_CHARS_PER_S,
                                                 DegenerateScorer, longest_loop, text_chars)
from tests.scoring_checkpoints import tone

SR = 24000
RULES = default_rules(["degenerate"])
TEXT = "The quick brown fox jumps over the lazy dog."  # 44 characters: about 2.9 s at 15 a second


def _row(audio, text=TEXT, **kw) -> ScoreInput:
    return ScoreInput(audio=np.asarray(audio, np.float32), sample_rate=SR, text=text, **kw)


def _codes(frames: int, seed: int = 0, streams: int = 8):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1024, (frames, streams))
    logprobs = rng.uniform(-4.0, -1.0, (frames, streams)).astype(np.float32)
    mask = np.ones((frames, streams), bool)
    for k in range(streams):  # Higgs's delay ramp and EOS staircase: not real codes
        mask[:k + 1, k] = False
        mask[frames - streams + k:, k] = False
    return codes, logprobs, mask


def _score(row):
    got = DegenerateScorer().score([row])[0]
    return got, {b.split("=")[0] for b in broken(RULES, got)}


def speech(seconds: float) -> np.ndarray:
    return tone(seconds, 140, rate=SR, noise=0.0)


def silence(seconds: float, level: float = 0.0) -> np.ndarray:
    return (level * np.random.default_rng(1).standard_normal(int(seconds * SR))).astype(np.float32)


def test_control_row_triggers_nothing():
    codes, logprobs, mask = _codes(90)
    row = _row(speech(3.0), codes=codes, logprobs=logprobs, mask=mask, frame_rate=25.0, max_new_frames=1024,
               finish_reason="stop")
    got, hit = _score(row)
    assert hit == set(), got
    assert got["silence_frac"] < 0.05 and got["leading_silence_s"] == 0 and got["trailing_silence_s"] == 0
    assert got["clipped_frac"] == 0 and got["hit_max_frames"] == 0 and got["loop_s"] == 0
    assert got["seconds_per_char"] == pytest.approx(3.0 / 44, rel=1e-9)
    assert set(got) == set(DegenerateScorer.score_names) and got.reasons == {}


def test_silence_leading_and_trailing():
    audio = np.concatenate([silence(1.5, 1e-4), speech(2.0), silence(2.5)])  # a -80 dB floor counts as silence
    got, hit = _score(_row(audio))
    assert got["leading_silence_s"] == pytest.approx(1.5, abs=0.02)
    assert got["trailing_silence_s"] == pytest.approx(2.5, abs=0.02)
    assert got["silence_frac"] == pytest.approx(4.0 / 6.0, abs=0.02)
    assert got["seconds_per_char"] == pytest.approx(2.0 / 44, abs=0.02 / 44)  # the speech span only
    assert {"silence_frac", "leading_silence_s", "trailing_silence_s"} <= hit
    quiet = speech(3.0) * 10 ** (-30 / 20)  # 30 dB down is quiet speech, not silence
    got, hit = _score(_row(quiet))
    assert got["silence_frac"] < 0.05 and not hit & {"silence_frac", "leading_silence_s", "trailing_silence_s"}
    got, _ = _score(_row(silence(2.0)))  # digital silence throughout
    assert (got["silence_frac"], got["leading_silence_s"], got["trailing_silence_s"]) == (1.0, 2.0, 2.0)
    assert got["chars_per_second"] is None and got.reasons["chars_per_second"].startswith("no speech")


def test_clipping():
    loud = np.clip(speech(3.0) * 4, -1.0, 1.0)
    got, hit = _score(_row(loud))
    assert got["clipped_frac"] > 0.1 and "clipped_frac" in hit
    got, hit = _score(_row(speech(3.0) / np.abs(speech(3.0)).max() * 0.95))  # control: loud, never full scale
    assert got["clipped_frac"] == 0 and "clipped_frac" not in hit


def test_speaking_rate_counts_cjk_as_longform_does():
    assert (CHARS_PER_S, WIDE_CHARS_PER_S) == (longform.CHARS_PER_S, longform.WIDE_CHARS_PER_S)
    for text in (TEXT, "今天天气很好，我们去公园散步。", "Mixed 中文 text"):  # our count is longform's estimate
        seconds = text_chars(text) / CHARS_PER_S + longform.OVERHEAD_S
        assert math.ceil(seconds * 25 - 1e-9) == longform.estimate_frames(text)
    _, hit = _score(_row(speech(12.0), text="Hi there."))  # babble: 12 s for 9 characters
    assert "seconds_per_char" in hit and "chars_per_second" not in hit
    _, hit = _score(_row(speech(0.5), text=TEXT))  # 44 characters in half a second: words skipped
    assert "chars_per_second" in hit and "seconds_per_char" not in hit
    got, hit = _score(_row(speech(3.5), text="今天天气很好，我们去公园散步。"))  # 15 wide: 3.3 s at 4.5 a second
    assert not hit & {"seconds_per_char", "chars_per_second"}, got
    got, _ = _score(_row(speech(1.0), text="   "))
    assert got["seconds_per_char"] is None and got.reasons["seconds_per_char"] == "the row has no text"


def test_frame_loop():
    codes, logprobs, mask = _codes(300, seed=2)
    clean = _row(speech(3.0), codes=codes, logprobs=logprobs, mask=mask, frame_rate=25.0)
    got, hit = _score(clean)
    assert got["loop_s"] == 0 and "loop_s" not in hit
    looped = codes.copy()
    looped[100:210] = np.tile(codes[100:107], (16, 1))[:110]  # a 7-frame pattern, 110 frames: 4.4 s
    got, hit = _score(_row(speech(3.0), codes=looped, logprobs=logprobs, mask=mask, frame_rate=25.0))
    assert got["loop_s"] == pytest.approx(110 / 25) and "loop_s" in hit
    assert longest_loop(looped[8:-8], 250) == (110, 7)
    stuck = codes.copy()
    stuck[40:80] = codes[40]  # one frame held for 40 frames (1.6 s): under the 2 s bar
    got, hit = _score(_row(speech(3.0), codes=stuck, logprobs=logprobs, mask=mask, frame_rate=25.0))
    assert got["loop_s"] == pytest.approx(40 / 25) and "loop_s" not in hit
    near = looped.copy()
    for j, i in enumerate(range(100, 210, 7)):  # each copy's first frame differs in one stream: no whole-frame loop
        near[i, 3] += j + 1
    assert longest_loop(near[8:-8], 250)[0] < 14


def _loop_by_definition(frames: np.ndarray, max_period: int) -> tuple[int, int]:
    """The oracle, plainly: for each period and start, how many frames in a row equal the frame a period on."""
    n, best = len(frames), (0, 0)
    for period in range(1, min(max_period, n // 2) + 1):
        for start in range(n - period):
            k = 0
            while start + k + period < n and np.array_equal(frames[start + k], frames[start + k + period]):
                k += 1
            if k >= period and k + period > best[0]:
                best = (k + period, period)
    return best


@pytest.mark.parametrize("cells", [1 << 20, 7])
def test_loop_search_matches_its_definition_on_random_rows(cells, monkeypatch):
    """longest_loop (every period at once; `cells` small: a few periods a block) against the definition, on
    rows of a few distinct frames (so repeats of every period occur by chance), with planted loops, and
    periods capped below n // 2."""
    from omni_cli.runners.scoring import degenerate

    monkeypatch.setattr(degenerate, "LOOP_SEARCH_CELLS", cells)
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 60))
        frames = rng.integers(0, 2 + trial % 3, size=(n, 2))
        if n > 20 and trial % 2:
            p = int(rng.integers(1, 6))
            frames[5:5 + 3 * p] = np.tile(frames[5:5 + p], (3, 1))
        cap = int(rng.integers(1, 30))
        assert longest_loop(frames, cap) == _loop_by_definition(frames, cap), (trial, n, cap)


def test_hit_max_frames():
    codes, logprobs, mask = _codes(64)
    common = dict(codes=codes, logprobs=logprobs, mask=mask, frame_rate=25.0, max_new_frames=64)
    got, hit = _score(_row(speech(2.5), finish_reason="length", **common))
    assert got["hit_max_frames"] == 1.0 and "hit_max_frames" in hit
    got, hit = _score(_row(speech(2.5), finish_reason="stop", **common))
    assert got["hit_max_frames"] == 0.0 and "hit_max_frames" not in hit


def test_logprobs_collapse_and_the_manifest_fields():
    codes, logprobs, mask = _codes(200, seed=3)
    got, hit = _score(_row(speech(3.0), codes=codes, logprobs=logprobs, mask=mask, frame_rate=25.0))
    assert got["mean_logprob"] == float(logprobs[mask].mean())  # the manifest's mean_logprob
    assert got["min_window_logprob"] == min_window_logprob(logprobs, mask, LOGPROB_WINDOW)  # and its window
    assert not hit & {"mean_logprob", "min_window_logprob"}
    collapsed = logprobs.copy()
    collapsed[120:150] = -6.9  # 1.2 s sampled as if uniformly over 1024 codes
    got, hit = _score(_row(speech(3.0), codes=codes, logprobs=collapsed, mask=mask, frame_rate=25.0))
    assert got["min_window_logprob"] == pytest.approx(-6.9, abs=1e-5)
    assert "min_window_logprob" in hit and "mean_logprob" not in hit  # the mean hides it
    flat = np.full_like(logprobs, -6.5)
    _, hit = _score(_row(speech(3.0), codes=codes, logprobs=flat, mask=mask, frame_rate=25.0))
    assert {"mean_logprob", "min_window_logprob"} <= hit


def test_rows_without_generation_data():
    got, _ = _score(_row(speech(2.0)))
    for name in ("mean_logprob", "min_window_logprob", "loop_s", "hit_max_frames"):
        assert got[name] is None and "not generated by this run" in got.reasons[name]
    empty = DegenerateScorer().score([_row(np.zeros(0))])[0]
    assert empty["silence_frac"] is None and empty.reasons["silence_frac"] == "no audio"


def test_every_threshold_states_its_direction_and_why():
    assert set(THRESHOLDS) == set(DegenerateScorer.score_names)
    for name, (op, threshold, why) in THRESHOLDS.items():
        assert op in (">", "<") and math.isfinite(threshold) and len(why) > 20, name
