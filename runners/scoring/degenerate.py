"""Degenerate output, with no model: what the audio and the row's own codes show.

From the audio (20 ms frames at the row's rate):
- `silence_frac`: the fraction of silent frames. A frame is silent when its RMS is below
  max(the loudest frame's RMS - 40 dB, -60 dBFS); an all-zero clip is all silence;
- `leading_silence_s`, `trailing_silence_s`: the silent run at either end, in seconds;
- `clipped_frac`: the fraction of samples at full scale (|x| >= 0.999);
- `seconds_per_char`, `chars_per_second`: the speech span (first to last non-silent frame)
  against the text's length, a CJK (east Asian wide) character counted as
  CHARS_PER_S / WIDE_CHARS_PER_S = 15 / 4.5 narrow ones, as omni_cli/longform.py estimates
  (15 characters a second is the nominal rate, 1/15 = 0.067 s a character).
From the row's generation:
- `hit_max_frames`: 1 where the row ran to max_new_frames without its stop
  (finish_reason "length"), else 0;
- `mean_logprob`: the mean logprob of the real codes (the manifest's `mean_logprob`);
- `min_window_logprob`: the lowest mean over any 25 consecutive frames (the manifest's
  `min_window_logprob`): a collapse in one stretch that the mean hides;
- `loop_s`: the longest stretch of whole frames (every stream a real code) that repeats one
  n-gram of frames back to back, at least twice, in seconds (periods up to MAX_LOOP_PERIOD_S).
  Sampling never repeats whole frames by chance; a model stuck in a loop does.
A row without codes (a folder scored after the fact) gets None for the last four, with the reason.
"""

from __future__ import annotations

import unicodedata
from typing import Sequence

import numpy as np

from .base import RowScores, ScoreInput, Scorer

FRAME_S = 0.02  # analysis frame of the audio measures
SILENCE_BELOW_PEAK_DB = 40.0
SILENCE_FLOOR_DBFS = -60.0
CLIP_LEVEL = 0.999  # |sample| at or above: full scale (16-bit PCM's largest is 0.99997)
CHARS_PER_S, WIDE_CHARS_PER_S = 15, 4.5  # omni_cli/longform.py's reading rates (tests hold them equal)
LOGPROB_WINDOW = 25  # frames: omni_cli/output.py's min_window_logprob window
MAX_LOOP_PERIOD_S = 10.0  # longest loop period searched
LOOP_SEARCH_CELLS = 1 << 20  # periods x frames the loop search holds at once

# name -> (direction, threshold, why): reject where the value is above (">") or below ("<") it
THRESHOLDS = {
    "silence_frac": (">", 0.5, "more silence than speech; read speech pauses for about 15-25% of its time"),
    "leading_silence_s": (">", 1.0, "a second of nothing before the first word: a false start"),
    "trailing_silence_s": (">", 1.5, "1.5 s of nothing after the last word: the row did not stop when done"),
    "clipped_frac": (">", 0.001, "one sample in a thousand at full scale is audible distortion"),
    "seconds_per_char": (">", 0.25, "slower than 4 characters a second, 3.75x the nominal 15: babble, "
                         "stretched or repeated words (Emilia-Pipe drops speech-rate outliers by IQR)"),
    "chars_per_second": (">", 40.0, "faster than 40 characters a second, 2.7x the nominal 15: skipped words "
                         "or a row that stopped early"),
    "hit_max_frames": (">", 0.5, "the row ran to max_new_frames without its stop: cut off or looping"),
    "mean_logprob": ("<", -5.5, "provisional, not calibrated on real output: near log(1/1024) = -6.93, the "
                     "model has no idea which code comes; depends on the model and the sampling values"),
    "min_window_logprob": ("<", -6.0, "provisional, as mean_logprob: one second sampled almost uniformly"),
    "loop_s": (">", 2.0, "two seconds of whole frames repeating a pattern: a stuck decoder, never sampling "
               "noise (a frame is 8 codes of 1024 on Higgs)"),
}
AUDIO_SCORES = ("silence_frac", "leading_silence_s", "trailing_silence_s", "clipped_frac",
                "seconds_per_char", "chars_per_second")
CODE_SCORES = ("mean_logprob", "min_window_logprob", "loop_s")


def text_chars(text: str) -> float:
    """The text's length in narrow characters: spaces and non-space characters count 1, an east
    Asian wide character CHARS_PER_S / WIDE_CHARS_PER_S (omni_cli/longform.estimate_frames)."""
    wide = sum(unicodedata.east_asian_width(c) in "WF" for c in text)
    narrow = sum(not c.isspace() for c in text) - wide + text.count(" ")
    return narrow + wide * CHARS_PER_S / WIDE_CHARS_PER_S


def silent_frames(audio: np.ndarray, rate: int) -> np.ndarray:
    """[samples] -> [frames] bool: True where a FRAME_S frame is silent (the module's rule)."""
    size = max(1, round(FRAME_S * rate))
    n = -(-len(audio) // size)
    padded = np.zeros(n * size, np.float64)
    padded[:len(audio)] = audio
    counts = np.full(n, size, np.float64)
    counts[-1] = len(audio) - (n - 1) * size  # the last frame's own samples
    rms = np.sqrt((padded.reshape(n, size) ** 2).sum(axis=1) / counts)
    with np.errstate(divide="ignore"):
        db = 20 * np.log10(rms)  # -inf for digital silence
    floor = max(db.max() - SILENCE_BELOW_PEAK_DB, SILENCE_FLOOR_DBFS)
    return db < floor


def audio_scores(audio: np.ndarray, rate: int, text: str) -> RowScores:
    scores = RowScores()
    if not len(audio):
        return scores.missing(AUDIO_SCORES, "no audio")
    silent = silent_frames(audio, rate)
    size = max(1, round(FRAME_S * rate))
    duration = len(audio) / rate
    loud = np.flatnonzero(~silent)
    lead = int(loud[0]) if len(loud) else len(silent)
    trail = len(silent) - 1 - int(loud[-1]) if len(loud) else len(silent)
    scores["silence_frac"] = float(silent.mean())
    scores["leading_silence_s"] = min(lead * size / rate, duration)
    last_frame = len(audio) - (len(silent) - 1) * size  # samples in the (possibly partial) last frame
    scores["trailing_silence_s"] = min(max(trail - 1, 0) * size / rate + (last_frame / rate if trail else 0.0),
                                       duration)
    scores["clipped_frac"] = float(np.mean(np.abs(audio) >= CLIP_LEVEL))
    chars = text_chars(text)
    span = (min((int(loud[-1]) + 1) * size, len(audio)) - int(loud[0]) * size) / rate if len(loud) else 0.0
    if chars <= 0 or not text.strip():
        scores.missing(("seconds_per_char", "chars_per_second"), "the row has no text")
    elif span <= 0:
        scores["seconds_per_char"] = 0.0
        scores.missing(("chars_per_second",), "no speech: the clip is all silence")
    else:
        scores["seconds_per_char"] = span / chars
        scores["chars_per_second"] = chars / span
    return scores


def min_window_mean(logprobs: np.ndarray, mask: np.ndarray, window: int = LOGPROB_WINDOW) -> float | None:
    """Lowest mean of real codes' logprobs over `window` consecutive frames (all frames where the row
    is shorter); windows without real codes skipped; None without any (omni_cli/output.py's rule)."""
    w = min(window, len(logprobs))
    if w == 0:
        return None
    sums = np.where(mask, logprobs, 0.0).sum(axis=1).astype(np.float64)
    counts = mask.sum(axis=1)
    csum, ccount = np.concatenate([[0.0], np.cumsum(sums)]), np.concatenate([[0], np.cumsum(counts)])
    total, n = csum[w:] - csum[:-w], ccount[w:] - ccount[:-w]
    ok = n > 0
    return float((total[ok] / n[ok]).min()) if ok.any() else None


def longest_loop(frames: np.ndarray, max_period: int) -> tuple[int, int]:
    """frames [n, streams] -> (frames covered, period) of the longest stretch that is one n-gram of
    whole frames repeated back to back at least twice; (0, 0) where there is none. Ties: the shortest
    period. Every period at once (a [periods, n] array: no Python loop holding the scoring thread's GIL)."""
    n = len(frames)
    top = min(max_period, n // 2)
    if top < 1:
        return 0, 0
    whole = np.ascontiguousarray(frames)
    rows = whole.view(np.dtype((np.void, whole.dtype.itemsize * whole.shape[1]))).reshape(-1)
    ids = np.unique(rows, return_inverse=True)[1].reshape(-1)  # a frame -> an integer
    at = np.arange(n)
    covered_parts = []
    step = max(1, LOOP_SEARCH_CELLS // n)  # periods a block: its [periods, n] arrays stay small for long rows
    for first in range(1, top + 1, step):
        periods = np.arange(first, min(first + step, top + 1))
        ahead = at[None, :] + periods[:, None]  # [periods, n]: frame i against frame i + period
        same = (ahead < n) & (ids[np.minimum(ahead, n - 1)] == ids[None, :])
        # each position's run of True so far: its index less the last False at or before it
        last_false = np.maximum.accumulate(np.where(same, -1, at[None, :]), axis=1)
        run = (at[None, :] - last_false).max(axis=1)  # [periods]: frame i repeats i + period for `run` frames
        covered_parts.append(np.where(run >= periods, run + periods, 0))
    covered, periods = np.concatenate(covered_parts), np.arange(1, top + 1)
    best = int(np.argmax(covered))  # the first of the longest: the shortest period
    return (int(covered[best]), int(periods[best])) if covered[best] > 0 else (0, 0)


def code_scores(row: ScoreInput) -> RowScores:
    scores = RowScores()
    if row.finish_reason is not None:
        scores["hit_max_frames"] = float(row.finish_reason == "length")
    elif row.codes is not None and row.max_new_frames is not None:
        scores["hit_max_frames"] = float(len(row.codes) >= row.max_new_frames)
    else:
        scores.missing(("hit_max_frames",), "no finish reason (not generated by this run)")
    if row.codes is None:
        return scores.missing(CODE_SCORES, "no codes or logprobs (not generated by this run)")
    mask = np.asarray(row.mask, bool)
    real = np.asarray(row.logprobs)[mask]
    if real.size:
        scores["mean_logprob"] = float(real.mean())
        scores["min_window_logprob"] = min_window_mean(np.asarray(row.logprobs), mask)
    else:
        scores.missing(("mean_logprob", "min_window_logprob"), "no real codes")
    if not row.frame_rate:
        scores.missing(("loop_s",), "no frame rate")
    else:
        whole = np.asarray(row.codes)[mask.all(axis=1)]  # frames where every stream holds a real code
        covered, _ = longest_loop(whole, max(1, int(MAX_LOOP_PERIOD_S * row.frame_rate)))
        scores["loop_s"] = covered / row.frame_rate
    return scores


class DegenerateScorer(Scorer):
    """Every measure of the module's doc, for every row; CPU only, no model."""

    name = "degenerate"
    score_names = AUDIO_SCORES + ("hit_max_frames",) + CODE_SCORES
    thresholds = THRESHOLDS

    def score(self, batch: Sequence[ScoreInput]) -> list[RowScores]:
        results = []
        for row in batch:
            scores = audio_scores(row.audio, row.sample_rate, row.text)
            extra = code_scores(row)
            scores.update(extra)
            scores.reasons.update(extra.reasons)
            results.append(scores)
        return results
