"""The scorers by name, and the checked forms of `--score` and `--reject`.

`--score asr,mos,speaker,degenerate,utmos` -> `parse_scorers` -> the scorer names, in the given order.
`--reject 'wer>0.1,dnsmos_ovrl<3.0'` -> `parse_reject` -> `Rule`s: a score name of an enabled
scorer, one of > >= < <=, a finite number. A row is rejected by a rule where its value is on
the rule's side of the threshold; a None value (the scorer could not score the row) rejects
nothing. Every error names the part of the flag that is wrong.
"""

from __future__ import annotations

import importlib.util
import math
import operator
import re
from dataclasses import dataclass
from typing import Sequence

from ..errors import OmniError
from .asr import AsrScorer
from .base import Scorer
from .degenerate import DegenerateScorer
from .dnsmos import DnsmosScorer
from .speaker import SpeakerScorer
from .utmos import UtmosScorer

SCORERS: dict[str, type[Scorer]] = {
    "asr": AsrScorer,
    "mos": DnsmosScorer,
    "speaker": SpeakerScorer,
    "degenerate": DegenerateScorer,
    "utmos": UtmosScorer,
}
# import names each scorer needs beyond omni-cli's own dependencies (the `quality` extra)
REQUIRES: dict[str, tuple[str, ...]] = {
    "asr": ("jiwer",),
    "mos": ("onnxruntime", "speechmos"),
    "speaker": (),
    "degenerate": (),
    "utmos": (),
}
INSTALL = "pip install 'omni-cli[quality]'"
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_RULE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|>|<)\s*(\S+)\s*$")


class ScoreSpecError(OmniError):
    """A --score or --reject value (or its YAML twin) that does not parse: names the bad part."""


def scorer_class(name: str) -> type[Scorer]:
    if name not in SCORERS:
        raise ScoreSpecError(f"'{name}' is not a scorer; the scorers are {', '.join(SCORERS)}")
    return SCORERS[name]


def score_owners() -> dict[str, str]:
    """score name -> the scorer that produces it."""
    return {score: name for name, cls in SCORERS.items() for score in cls.score_names}


def parse_scorers(spec: str | Sequence[str], flag: str = "--score") -> tuple[str, ...]:
    """'asr,mos' (or a list of names, as YAML gives it) -> ('asr', 'mos')."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for part in parts:
        name = str(part).strip().lower()
        if not name:
            raise ScoreSpecError(f"{flag}: an empty name in {spec!r} (names are separated by single commas)")
        if name not in SCORERS:
            raise ScoreSpecError(f"{flag}: '{part.strip()}' is not a scorer; the scorers are {', '.join(SCORERS)}")
        if name in names:
            raise ScoreSpecError(f"{flag}: '{name}' is named twice")
        names.append(name)
    if not names:
        raise ScoreSpecError(f"{flag}: no scorer named; the scorers are {', '.join(SCORERS)}")
    return tuple(names)


def missing_packages(scorers: Sequence[str]) -> dict[str, list[str]]:
    """scorer -> the packages it needs that do not import here (found without importing them)."""
    out = {}
    for name in scorers:
        absent = [pkg for pkg in REQUIRES[name] if importlib.util.find_spec(pkg) is None]
        if absent:
            out[name] = absent
    return out


def check_installed(scorers: Sequence[str], flag: str = "--score") -> None:
    """Raise before any model loads where an enabled scorer's packages are missing, with the command."""
    missing = missing_packages(scorers)
    if missing:
        what = "; ".join(f"{name} needs {', '.join(pkgs)}" for name, pkgs in missing.items())
        raise ScoreSpecError(f"{flag}: {what}. Install them with: {INSTALL}")


@dataclass(frozen=True)
class Rule:
    """Reject a row where its `name` score is `op` `threshold`."""

    name: str
    op: str
    threshold: float
    why: str = ""

    def rejects(self, value: float | None) -> bool:
        """True where `value` breaks the rule; a None value (not scored) breaks nothing."""
        return value is not None and OPS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.threshold:g}"


def parse_reject(spec: str | Sequence[str], scorers: Sequence[str], flag: str = "--reject") -> tuple[Rule, ...]:
    """'wer>0.1,dnsmos_ovrl<3.0' (or a list of such, as YAML gives it) -> Rules, checked against the
    enabled scorers' score names."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    owners = score_owners()
    rules: list[Rule] = []
    for part in parts:
        text = str(part)
        m = _RULE.match(text)
        if not text.strip():
            raise ScoreSpecError(f"{flag}: an empty rule in {spec!r} (rules are separated by single commas)")
        if m is None:
            raise ScoreSpecError(f"{flag}: '{text.strip()}' is not a rule: write a score name, one of > >= < <=, and "
                                 "a number (wer>0.1)")
        name, op, number = m.group(1).lower(), m.group(2), m.group(3)
        if name not in owners:
            raise ScoreSpecError(f"{flag}: '{text.strip()}': '{name}' is not a score; the scores are "
                                 f"{', '.join(sorted(owners))}")
        if owners[name] not in scorers:
            raise ScoreSpecError(f"{flag}: '{text.strip()}': '{name}' comes from the {owners[name]} scorer, which "
                                 f"--score does not enable (it enables {', '.join(scorers) or 'none'})")
        try:
            threshold = float(number)
        except ValueError:
            threshold = math.nan
        if not math.isfinite(threshold):
            raise ScoreSpecError(f"{flag}: '{text.strip()}': '{number}' is not a finite number")
        rule = Rule(name, op, threshold)
        if rule in rules:
            raise ScoreSpecError(f"{flag}: '{text.strip()}' is given twice")
        rules.append(rule)
    return tuple(rules)


def default_rules(scorers: Sequence[str]) -> tuple[Rule, ...]:
    """The enabled scorers' default thresholds as Rules (each scorer's `thresholds` table)."""
    return tuple(Rule(score, op, float(threshold), why) for name in scorers
                 for score, (op, threshold, why) in scorer_class(name).thresholds.items())


def broken(rules: Sequence[Rule], scores: dict) -> list[str]:
    """The rules a row's scores break, as 'wer=0.25>0.1'; empty: it passes."""
    return [f"{r.name}={scores[r.name]:.4g}{r.op}{r.threshold:g}" for r in rules if r.rejects(scores.get(r.name))]
