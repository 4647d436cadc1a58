"""Attempts and decisions: a row's attempt seeds, which attempt is kept, and what the manifest says.

Attempt 0 of a row is the row as it would run without scoring (its own seed); attempt k > 0
uses a seed derived from (row seed, k), so a run with retries is as reproducible as one without.
Which attempt is kept (BEST_ORDER): one that breaks no rule before one that does, then fewer
rules broken, then the scores in the order of SCORE_ORDER (each toward its better end; an
unscored value counts as the worst), then the earlier attempt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from omni_cli.runners.sampling.seeds import derive_seed
from omni_cli.runners.scoring import Rule, broken

ATTEMPT_NAMESPACE = "omni-cli-attempt"
# score -> +1 where higher is better, -1 where lower is: the tie-breaks after the rules, in this order
SCORE_ORDER: tuple[tuple[str, int], ...] = (
    ("wer", -1), ("cer", -1), ("speaker_sim", +1), ("utmos", +1), ("dnsmos_ovrl", +1), ("dnsmos_p808", +1),
    ("loop_s", -1), ("hit_max_frames", -1), ("silence_frac", -1), ("clipped_frac", -1), ("mean_logprob", +1),
)
BEST_ORDER = ("no rule broken first, then fewer rules broken, then " +
              ", ".join(f"{name} {'higher' if sign > 0 else 'lower'}" for name, sign in SCORE_ORDER) +
              ", then the earlier attempt")


def attempt_seed(row_seed: int, attempt: int) -> int:
    """Attempt `attempt`'s seed: the row's own for attempt 0, else derived from (row seed, attempt)."""
    return row_seed if attempt == 0 else derive_seed(ATTEMPT_NAMESPACE, row_seed, str(attempt))


def attempt_rid(rid: str, attempt: int) -> str:
    """An attempt's request id: the row's for attempt 0; '~' never occurs in a row id (prompts.py)."""
    return rid if attempt == 0 else f"{rid}~{attempt}"


@dataclass
class Attempt:
    index: int
    seed: int
    scores: dict[str, float | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # score -> why it is None
    text: dict[str, str] = field(default_factory=dict)  # the scorers' text (transcript)
    broken: list[str] = field(default_factory=list)  # rules it breaks, as 'wer=0.25>0.1'
    error: str | None = None  # the attempt failed (its decode, its write): no audio to keep
    payload: Any = None  # what writing it needs (omni_cli/quality/stage.py), dropped once decided

    @property
    def passes(self) -> bool:
        return self.error is None and not self.broken

    def judge(self, rules: Sequence[Rule]) -> None:
        self.broken = broken(rules, self.scores)

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"attempt": self.index, "seed": self.seed}
        if self.error is not None:
            return rec | {"status": "failed", "error": self.error}
        rec |= {"status": "rejected" if self.broken else "ok", "scores": _rounded(self.scores)}
        if self.broken:
            rec["rejected_by"] = list(self.broken)
        if "transcript" in self.text:
            rec["transcript"] = self.text["transcript"]
        return rec


def sort_key(a: Attempt) -> tuple:
    """BEST_ORDER as a key: smaller is better."""
    keys: list = [a.error is not None, bool(a.broken), len(a.broken)]
    for name, sign in SCORE_ORDER:
        v = a.scores.get(name)
        good = v is not None and not (isinstance(v, float) and math.isnan(v))
        keys += [not good, -sign * v if good else 0.0]
    return (*keys, a.index)


def choose(attempts: Sequence[Attempt]) -> tuple[Attempt, str]:
    """The attempt kept, and why, in words."""
    best = min(attempts, key=sort_key)
    if len(attempts) == 1:
        return best, "the only attempt"
    if best.error is not None:
        return best, "every attempt failed"
    passing = [a for a in attempts if a.passes]
    if best.passes and len(passing) == 1 and best is attempts[-1]:
        return best, "the first attempt that passes"
    if best.passes:
        return best, f"the best of {len(attempts)} attempts ({len(passing)} pass) by {BEST_ORDER}"
    return best, f"no attempt of {len(attempts)} passes: the best by {BEST_ORDER}"


def manifest_fields(kept: Attempt, attempts: Sequence[Attempt], why: str, several: bool) -> dict[str, Any]:
    """The kept attempt's manifest fields: status, scores (null with the reason in score_notes),
    transcript, the rules it breaks, and, where the run allows more than one attempt, every attempt."""
    out: dict[str, Any] = {"status": "rejected" if kept.broken else "ok", "scores": _rounded(kept.scores)}
    if kept.reasons:
        out["score_notes"] = dict(kept.reasons)
    if "transcript" in kept.text:
        out["transcript"] = kept.text["transcript"]
    if kept.broken:
        out["rejected_by"] = list(kept.broken)
    if several:
        out |= {"attempt": kept.index, "attempts": [a.record() for a in attempts], "chosen_because": why}
    return out


def _rounded(scores: dict[str, float | None]) -> dict[str, float | None]:
    """Scores as the manifest keeps them: finite floats to 6 significant digits, else null."""
    out = {}
    for k, v in scores.items():
        out[k] = None if v is None or not math.isfinite(float(v)) else float(f"{float(v):.6g}")
    return out
