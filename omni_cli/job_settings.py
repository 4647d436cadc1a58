"""A job's settings: the model config with the flags applied, the load spec, the model identity
a row's hash covers, and the checks made before anything loads. One process (generate.py), a
--devices parent (workers.py) and a Ray driver (ray.py) resolve them the same way."""

from __future__ import annotations

import sys
from dataclasses import replace

from omni_cli import __version__
from omni_cli.chunked import check_chunk_flags
from omni_cli.config import MAX_BATCH_SIZE, ModelConfig, load_config
from omni_cli.errors import OmniError
from omni_cli.output import check_format
from omni_cli.quality.settings import quality_settings
from omni_cli.runners.device import DTYPES, pick_device
from omni_cli.runners.family import LoadSpec
from omni_cli.runners.sampling.params import FIELD_NAMES, SamplingParams
from omni_cli.voice_bank import read_bank_file


def settings(opts) -> tuple[ModelConfig, SamplingParams]:
    """The model config with the flags applied, and the run's sampling defaults (the YAML's, then the flags)."""
    config = load_config(opts.model)
    if opts.voices is not None:
        config = replace(config, voices={**config.voices, **read_bank_file(opts.voices)})
    if opts.max_batch_size is not None:
        if not 1 <= opts.max_batch_size <= MAX_BATCH_SIZE:
            raise OmniError(f"--max-batch-size must be from 1 to {MAX_BATCH_SIZE}, got {opts.max_batch_size}")
        config = replace(config, max_batch_size=opts.max_batch_size)
    if opts.devices is not None and len(opts.devices) == 1:  # a worker's device, over the config's
        config = replace(config, device=opts.devices[0])
    if opts.deterministic is not None:
        config = replace(config, deterministic=opts.deterministic)
    if opts.async_decode is not None:
        config = replace(config, async_decode=opts.async_decode)
    params = base_sampling(config)
    for name in FIELD_NAMES:
        try:
            params = params.with_overrides(**{name: getattr(opts, name)})
        except ValueError as e:
            raise OmniError(f"--{name.replace('_', '-')}: {e}") from None
    return config, params


def base_sampling(config: ModelConfig, limits=None) -> SamplingParams:
    """The run's sampling defaults before the flags: the checkpoint's generation config (Qwen3-TTS's
    generation_config.json), then what the YAML sets."""
    from omni_cli.runners.family import family_class

    limits = limits or family_class(config.family, config.path).limits(config.checkpoint)
    params = SamplingParams().with_overrides(**dict(limits.sampling_defaults))
    return params.with_overrides(**{k: getattr(config.sampling, k) for k in config.sampling_set})


def with_family_defaults(opts):
    """opts with what the run leaves to the model family filled in (--chunk-method), so that run.json
    records what ran."""
    from omni_cli.runners.family import family_class

    if opts.chunk_method is not None:
        return opts
    config = load_config(opts.model)
    return replace(opts, chunk_method=family_class(config.family, config.path).default_chunk_method)


def check_flags(opts) -> tuple[ModelConfig, SamplingParams]:
    """The flags alone (OmniError naming the flag), then settings()."""
    check_format(opts.fmt)
    if opts.max_failures is not None and opts.max_failures < 1:
        raise OmniError(f"--max-failures must be >= 1, got {opts.max_failures}")
    check_chunk_flags(opts.chunk_method, opts.chunk_buffer)
    config, params = settings(opts)
    quality_settings(config.quality, config.path, opts)  # --score and its kin, before anything loads
    return config, params


def check_job(opts) -> tuple:
    """What run_generate checks before anything loads, for a parent that shares the rows out:
    (config, every row read, bad ones carrying their errors, the prompt file's identity)."""
    from omni_cli.prompts import read_prompts
    from omni_cli.runners.family import family_class
    from omni_cli.validate import check_inputs

    if opts.max_failures is not None:
        raise OmniError("--max-failures is not supported with --devices or --ray (each worker would count alone)")
    config, base_params = check_flags(opts)
    info: dict = {}
    family = family_class(config.family, config.path)
    rows = read_prompts(opts.prompts, opts.input_format, prompt_warnings(opts), info, family.row_fields())
    check_inputs(rows, family, config, base_params, opts)
    if not opts.quiet:
        print_warnings(opts, rows)
    return config, rows, info


def print_warnings(opts, rows: list, limit: int = 20) -> None:
    """What the run takes differently from what was given (a seed masked to 31 bits), on stderr."""
    from omni_cli.runners.sampling.params import seed_masked

    lines = [f"--seed: {why}"] if opts.seed is not None and (why := seed_masked(opts.seed)) else []
    lines += [w for r in rows for w in r.warnings]
    for line in lines[:limit]:
        print(f"omni: warning: {line}", file=sys.stderr, flush=True)
    if len(lines) > limit:
        print(f"omni: warning: ... and {len(lines) - limit} more", file=sys.stderr, flush=True)


def load_spec(config: ModelConfig, opts) -> LoadSpec:
    return LoadSpec(source=str(config.path), checkpoint=config.checkpoint, codec=config.codec,
                    dtype=DTYPES[config.dtype], device=pick_device(config.device),
                    max_batch_size=config.max_batch_size, max_seq_len=config.max_seq_len,
                    deterministic=config.deterministic, raw_logprobs=opts.raw_logprobs)


def model_identity(config: ModelConfig, spec: LoadSpec, opts) -> dict:
    """What, besides a row's own content, changes its bytes: the model (checkpoint, codec, dtype,
    the device type, deterministic arithmetic, context), the version, --raw-logprobs and --format.
    Not max_batch_size or async_decode: under --deterministic neither changes a byte, and without
    it a rerun at the same settings need not match either. Not the config's sampling defaults:
    each row's resolved sampling values are hashed instead."""
    d = config.as_dict()
    for k in ("path", "sampling", "max_batch_size", "async_decode", "device", "quality"):
        d.pop(k, None)
    return d | {"device": spec.device.type, "omni_cli": __version__, "raw_logprobs": opts.raw_logprobs,
                "format": opts.fmt}


def prompt_warnings(opts):
    """read_prompts' warn: silent under --quiet (errors only), else its default (stderr)."""
    return (lambda message: None) if opts.quiet else None
