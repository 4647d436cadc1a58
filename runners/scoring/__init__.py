"""Scorers of finished rows (issue 46): ASR round trip, DNSMOS, speaker similarity, degenerate output.

One contract (`base.py`): a batch of `ScoreInput` (a finished row) in, one `RowScores` per row
out. Scorers run on the CPU or a CUDA device; models load from a hub id or a folder. The job
layer (thresholds applied, retries, manifest fields) lives in omni_cli and only calls these.

Importing this package loads no model and imports neither transformers nor onnxruntime:
each scorer imports what it needs when it is built.
"""

from .base import RowScores, ScoreInput, Scorer
from .registry import (SCORERS, Rule, ScoreSpecError, broken, check_installed, default_rules, parse_reject,
                       parse_scorers, scorer_class, score_owners)

__all__ = ["SCORERS", "RowScores", "Rule", "ScoreInput", "ScoreSpecError", "Scorer", "broken", "check_installed",
           "default_rules", "parse_reject", "parse_scorers", "score_owners", "scorer_class"]
