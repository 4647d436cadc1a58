"""What is checked before a model loads: every row, the run's flags, the output format.

The model's limits come from its checkpoint's config alone (ModelFamily.limits), so a
value the device cannot run (a token id outside the vocabulary, a window past the context)
is found here, named with its row and field, and never reaches the device. `omni validate`
runs the same checks and prints every problem without loading anything.
"""

from __future__ import annotations


from pathlib import Path

from omni_cli.config import ModelConfig, load_config
from omni_cli.errors import OmniError, RowError
from omni_cli.output import check_format
from omni_cli.prompts import PromptRow, read_prompts
from omni_cli.runners.family import FamilyLimits, family_class
from omni_cli.runners.sampling.params import SamplingParams, limit_problems
from omni_cli.voice_bank import read_bank_file
from omni_cli.voices import check_references, prompt_base


def check_rows(rows: list[PromptRow], base_params: SamplingParams, config: ModelConfig,
               limits: FamilyLimits) -> None:
    """Give each valid row whose sampling values (its own over the run's) the model cannot run
    its error, naming the row and the field."""
    for r in rows:
        if r.error is not None:
            continue
        params = base_params.with_overrides(**r.overrides)
        try:
            params.check_consistent()
            problems = limit_problems(params, limits.vocab_size, limits.control_ids, config.max_seq_len)
        except ValueError as e:
            problems = [("min_new_frames", str(e))]
        if problems:
            field, reason = problems[0]
            r.error = str(RowError(r.row, field, reason))


def check_run(rows: list[PromptRow], base_params: SamplingParams, config: ModelConfig, limits: FamilyLimits,
              fmt: str) -> None:
    """The run's own values (the YAML's and the flags') against the model's limits, and the
    output format: an OmniError (exit 2) before anything loads. Then each row's."""
    check_format(fmt)
    for field, reason in limit_problems(base_params, limits.vocab_size, limits.control_ids, config.max_seq_len):
        if field == "max_new_frames":
            continue  # a default rows may override: each row that keeps it fails alone (check_rows)
        raise OmniError(f"--{field.replace('_', '-')} (or the config's sampling.{field}): {reason}")
    check_rows(rows, base_params, config, limits)


def run_validate(prompts: str, model: str | None, voices: Path | None = None) -> list[PromptRow]:
    """Every row of ``prompts`` checked as `omni generate` checks it before loading; the bad ones."""
    config = load_config(model)
    bank = {**config.voices, **(read_bank_file(voices) if voices is not None else {})}
    rows = read_prompts(prompts)
    limits = family_class(config.family, config.path).limits(config.checkpoint)
    check_run(rows, config.sampling, config, limits, "wav")
    check_references(rows, bank, prompt_base(prompts))
    return [r for r in rows if r.error is not None]
