"""What is checked before a model loads: every row, the run's flags, the output format.

The model's limits come from its checkpoint's config alone (ModelFamily.limits), so a
value the device cannot run (a token id outside the vocabulary, a window past the context)
is found here, named with its row and field, and never reaches the device. `omni validate`
runs the same checks and prints every problem without loading anything.
"""

from __future__ import annotations


from dataclasses import replace
from pathlib import Path

from omni_cli.config import ModelConfig, load_config
from omni_cli.errors import OmniError, RowError
from omni_cli.output import check_format
from omni_cli.prompts import PromptRow, read_prompts
from omni_cli.runners.family import FamilyLimits, family_class
from omni_cli.runners.sampling.params import SamplingParams, limit_problems
from omni_cli.voice_bank import read_bank_file


def check_rows(rows: list[PromptRow], base_params: SamplingParams, config: ModelConfig,
               limits: FamilyLimits) -> None:
    """Give each valid row whose sampling values (its own over the run's) the model cannot run
    its error, naming the row and the field."""
    for r in rows:
        if r.error is not None:
            continue
        problems = [(f, _unused(f)) for f in limits.unused_fields if f in r.overrides and r.overrides[f] != _DEFAULTS[f]]
        problems = problems or _problems(base_params.with_overrides(**r.overrides), config, limits)
        if problems:
            field, reason = problems[0]
            r.error = str(RowError(r.row, field, reason))


def _problems(params: SamplingParams, config: ModelConfig, limits: FamilyLimits) -> list[tuple[str, str]]:
    return limit_problems(params, limits.vocab_size, limits.control_ids, config.max_seq_len, limits.min_audio_frames)


_DEFAULTS = {f: getattr(SamplingParams(), f) for f in SamplingParams.__dataclass_fields__}


def _unused(field: str) -> str:
    return f"this model does not use {field} (it has no code predictor)" if field.startswith("subtalker_") \
        else f"this model does not use {field}"


def check_run(rows: list[PromptRow], base_params: SamplingParams, config: ModelConfig, limits: FamilyLimits,
              fmt: str) -> None:
    """The run's own values (the YAML's and the flags') against the model's limits, and the
    output format: an OmniError (exit 2) before anything loads. Then each row's."""
    check_format(fmt)
    if limits.max_positions is not None and config.max_seq_len > limits.max_positions:
        raise OmniError(f"{config.path}: key 'max_seq_len': {config.max_seq_len} is longer than the checkpoint's "
                        f"context ({limits.max_positions} positions, its max_position_embeddings)")
    for field, reason in _problems(base_params, config, limits):
        raise OmniError(f"--{field.replace('_', '-')} (or the config's sampling.{field}): {reason}")
    for field in limits.unused_fields:
        if getattr(base_params, field) != _DEFAULTS[field]:
            raise OmniError(f"--{field.replace('_', '-')} (or the config's sampling.{field}): {_unused(field)}")
    check_rows(rows, base_params, config, limits)


def check_prompts(rows: list[PromptRow], prompter, base_params: SamplingParams, config: ModelConfig,
                  clips: dict, chunk_method: str) -> None:
    """Every valid row's prompt rendered and tokenized as the run will build it, and held against
    the context, from the tokenizer and configs alone (prompter: ModelFamily.prompter): a long
    row's chunks each alone, a reference as codes of the length its clip encodes to. A row that
    fails here would fail the same way after the load; it fails now, naming its field."""
    import numpy as np

    from omni_cli.longform import plan_chunks
    from omni_cli.runners.family import AudioTurn, PromptFieldError
    from omni_cli.runners.resample import resampled_length

    pending = []  # (row, its params, its reference frames, its rendered prompts)
    for r in rows:
        if r.error is not None:
            continue
        params = base_params.with_overrides(**r.overrides)
        system = r.system if r.system is not None else config.system_prompt
        problems = prompter.field_problems(r.fields, r.ref_audio is not None or r.voice is not None,
                                           r.ref_text is not None or r.voice is not None)
        if [p for p in problems if not p.warning]:
            first = next(p for p in problems if not p.warning)
            r.error = str(RowError(r.row, first.field, first.message))
            continue
        r.warnings += [f"row {r.row}, field '{p.field}': {p.message}" for p in problems]
        context, ref_frames = (), 0
        if r.reference is not None:
            voice, sha = r.reference
            clip = clips[sha]
            samples = resampled_length(len(clip.samples), clip.rate, prompter.sample_rate)
            ref_frames = prompter.reference_frames(samples)
            if ref_frames == 0:
                field = "voice" if voice.name else "ref_audio"
                r.error = str(RowError(r.row, field, f"{voice.path}: {len(clip.samples) / clip.rate:.4f} s of audio "
                                                     "is too short for the codec's encoder to make one frame"))
                continue
            speaker = np.zeros(1, dtype=np.float32)  # a stand-in: the prompt's length does not depend on it
            context = (AudioTurn(voice.text, np.zeros((ref_frames, prompter.num_streams), dtype=np.int64), speaker),)
        texts = plan_chunks(r.text, r.chunk or chunk_method, params.max_new_frames, prompter.frame_rate)
        try:
            rendered = [prompter.render_prompt(t, system, r.scene, context, r.fields) for t in texts]
        except PromptFieldError as e:
            r.error = str(RowError(r.row, e.field, e.message))
            continue
        pending.append((r, params, ref_frames, rendered))
    prompts = iter(encode_each(prompter, [x for p in pending for x in p[3]]))
    for r, params, ref_frames, rendered in pending:
        for k, prompt in ((k, next(prompts)) for k in range(len(rendered))):
            if r.error is None:
                r.error = _prompt_problem(r, k, len(rendered), prompt, params.max_new_frames, ref_frames, config,
                                          prompter.frame_rate)


def _prompt_problem(r: PromptRow, k: int, n: int, prompt, max_new_frames: int, ref_frames: int,
                    config: ModelConfig, frame_rate: float) -> str | None:
    """Why chunk k of n of a row cannot run (its tokenizing failed, or it overflows the context), or None."""
    from omni_cli.voices import too_long

    part = f"chunk {k + 1} of {n}: " if n > 1 else ""
    if isinstance(prompt, Exception):
        return f"row {r.row}, field 'text': {part}tokenizing it failed: {type(prompt).__name__}: {prompt}"
    need = len(prompt.ids) + max_new_frames - 1
    if need <= config.max_seq_len:
        return None
    if ref_frames:
        field, message = too_long(r, len(prompt.ids), ref_frames, max_new_frames, config.max_seq_len, frame_rate)
    else:
        field = "text" if len(prompt.ids) >= config.max_seq_len else "max_new_frames"
        message = (f"prompt ({len(prompt.ids)} tokens) plus max_new_frames ({max_new_frames}) needs {need} KV "
                   f"positions, over max_seq_len {config.max_seq_len}")
    return str(RowError(r.row, field, part + message))


def encode_each(model, rendered: list) -> list:
    """The prompts tokenized at once (on the machine's cores, outside the GIL); where the batch
    raises, one by one, so that only the row that raises fails (its entry: the exception)."""
    if not rendered:
        return []
    try:
        return list(model.encode_prompts(rendered))
    except Exception:  # noqa: BLE001
        pass
    out = []
    for one in rendered:
        try:
            out.append(model.encode_prompts([one])[0])
        except Exception as e:  # noqa: BLE001
            out.append(e)
    return out


def check_inputs(rows: list[PromptRow], family, config: ModelConfig, base_params: SamplingParams, opts) -> dict:
    """Everything knowable before the weights load, on every row (a bad one gets its error) and the
    run's values (an OmniError, exit 2): values against the model's limits, reference clips read
    and checked, each prompt built and tokenized against the context. Returns the clips by sha256."""
    from omni_cli.voices import check_references, prompt_base

    check_run(rows, base_params, config, family.limits(config.checkpoint), opts.fmt)
    for r in rows:
        given = [f for f in family.unused_row_fields if r.error is None and getattr(r, f) is not None]
        if given:
            r.error = str(RowError(r.row, given[0], f"this model's prompts take no {given[0]}"))
    clips = check_references(rows, config.voices, prompt_base(opts.prompts))  # read and checked, not encoded
    prompter = family.prompter(config.checkpoint, config.codec)
    if prompter is not None:
        check_prompts(rows, prompter, base_params, config, clips, opts.chunk_method or family.default_chunk_method)
    return clips


def run_validate(prompts: str, model: str | None, voices: Path | None = None, input_format: str | None = None,
                 chunk_method: str | None = None) -> list[PromptRow]:
    """Every row of ``prompts`` checked as `omni generate` checks it before loading; the bad ones."""
    from types import SimpleNamespace

    from omni_cli.chunked import check_chunk_flags

    check_chunk_flags(chunk_method, 1)
    config = load_config(model)
    bank = {**config.voices, **(read_bank_file(voices) if voices is not None else {})}
    family = family_class(config.family, config.path)
    rows = read_prompts(prompts, input_format, extra_fields=family.row_fields())
    opts = SimpleNamespace(prompts=prompts, fmt="wav", chunk_method=chunk_method or family.default_chunk_method)
    check_inputs(rows, family, replace(config, voices=bank), config.sampling, opts)
    return [r for r in rows if r.error is not None]
