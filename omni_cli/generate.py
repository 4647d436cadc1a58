"""`omni generate`: prompts in, audio files + logprobs + manifest out.

A short pipeline: read and validate the rows and flags; load the model family
(runners/family.py, the only thing the job calls below it); render and queue
every valid row; warm up; drive the loop (omni_cli/loop.py), whose finished
rows go to the audio stage (omni_cli/audio_stage.py: codec thread, writers);
write the run record. Every input row ends in the manifest: ok, failed (with
the error naming the row and field) or, after Ctrl-C, interrupted (the rows
already handed to the codec are written first).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omni_cli.audio_stage import AudioStage
from omni_cli.config import ModelConfig, load_config
from omni_cli.errors import OmniError, RowError
from omni_cli.loop import run_loop
from omni_cli.output import OutputWriter, check_out_dir, write_run_json
from omni_cli.progress import Progress
from omni_cli.prompts import PromptRow, read_prompts
from omni_cli.results import RowResults
from omni_cli.run_record import async_summary, run_record
from omni_cli.runners.device import DTYPES, pick_device
from omni_cli.runners.family import LoadSpec, ModelFamily, PromptFieldError, family_class
from omni_cli.runners.sampling.params import FIELD_NAMES, SamplingParams
from omni_cli.runners.sampling.seeds import row_seed
from omni_cli.scheduler import Request, Scheduler
from omni_cli.shard import Shard
from omni_cli.warmup import warm_up_lm


@dataclass(frozen=True)
class GenerateOptions:
    prompts: str
    out: Path
    model: str | None = None
    seed: int | None = None
    max_batch_size: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ras_win_len: int | None = None
    ras_win_max_num_repeat: int | None = None
    suppress_tokens: tuple[int, ...] | None = None
    max_new_frames: int | None = None
    min_new_frames: int | None = None
    deterministic: bool | None = None
    async_decode: bool | None = None
    raw_logprobs: bool = False
    fmt: str = "wav"
    quiet: bool = False
    overwrite: bool = False
    shard: Shard | None = None  # --shard i/n: only the rows whose id hashes to shard i (omni_cli/shard.py)


@dataclass
class RunSummary:
    total: int
    ok: int
    failed: int
    interrupted: bool


def run_generate(opts: GenerateOptions) -> RunSummary:
    t = {"start": time.perf_counter()}
    config, base_params = _settings(opts)
    rows = read_prompts(opts.prompts)
    if opts.shard is not None:
        rows = opts.shard.select(rows)
    check_out_dir(opts.out, opts.overwrite)
    t["read"] = time.perf_counter()
    family = family_class(config.family, config.path)  # the family's imports
    t["family"] = time.perf_counter()
    model = family.load(_load_spec(config, opts))
    t["loaded"] = time.perf_counter()

    scheduler = Scheduler(model.num_slots, config.max_seq_len)  # the budget may grant fewer slots
    results_rows, rejected = _queue(rows, model, config, base_params, opts.seed, scheduler)
    audio = AudioStage(model.codec, model.batched_codec)
    t["warmup_s"] = _warm_up(model, audio, scheduler, config)

    writer = OutputWriter(opts.out, opts.fmt, model.sample_rate)
    progress = Progress(len(rows), opts.quiet)
    results = RowResults(writer, progress, model.real_code_mask, opts.quiet)
    results.rows = results_rows
    interrupted, stats = False, None
    with progress:
        if model.num_slots < config.max_batch_size and not opts.quiet:
            progress.print_line(f"omni: device memory holds the KV cache of {model.num_slots} requests at once "
                                f"(max_batch_size {config.max_batch_size}); running that many")
        for r, error in rejected:
            results.fail(r.row, r.id, r.text, error)
        rows_per_call = min(model.num_slots, model.codec.rows_per_call(base_params.max_new_frames)) \
            if audio.batched else 1
        audio.start(results.write, len(results_rows), rows_per_call)

        def stepped(n: int, loop_stats) -> None:
            progress.step(n, model.runner.async_query_hit, model.runner.async_query_miss, loop_stats.sync_routed)

        t["loop"] = time.perf_counter()
        try:
            with model.loop_stream():  # ahead of the codec's stream on the GPU
                stats = run_loop(scheduler, model.runner, audio.finished, stepped, config.async_decode)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            t["decoded"] = time.perf_counter()
            audio.drain()  # rows still waiting (after Ctrl-C, say), and every file on disk
            t["written"] = time.perf_counter()
        audio.check()
        if interrupted:  # account for the rest
            for rid, (row, _, req) in results_rows.items():
                if req.finish_reason is None:
                    writer.write_failed(row.row, rid, row.text, "interrupted before it finished", status="interrupted")
    writer.close()
    t["end"] = time.perf_counter()
    write_run_json(opts.out, run_record(opts, config, model, results, progress, audio, stats, interrupted, t))
    if not opts.quiet:
        progress.print_line(async_summary(config.async_decode, model.runner, stats))
    return RunSummary(total=len(rows), ok=results.ok, failed=results.failed, interrupted=interrupted)


def _settings(opts: GenerateOptions) -> tuple[ModelConfig, SamplingParams]:
    """The model config with the flags applied, and the run's sampling defaults (the YAML's, then the flags)."""
    config = load_config(opts.model)
    if opts.max_batch_size is not None:
        if opts.max_batch_size < 1:
            raise OmniError(f"--max-batch-size must be >= 1, got {opts.max_batch_size}")
        config = replace(config, max_batch_size=opts.max_batch_size)
    if opts.deterministic is not None:
        config = replace(config, deterministic=opts.deterministic)
    if opts.async_decode is not None:
        config = replace(config, async_decode=opts.async_decode)
    params = config.sampling
    for name in FIELD_NAMES:
        try:
            params = params.with_overrides(**{name: getattr(opts, name)})
        except ValueError as e:
            raise OmniError(f"--{name.replace('_', '-')}: {e}") from None
    return config, params


def _load_spec(config: ModelConfig, opts: GenerateOptions) -> LoadSpec:
    return LoadSpec(source=str(config.path), checkpoint=config.checkpoint, codec=config.codec,
                    dtype=DTYPES[config.dtype], device=pick_device(config.device),
                    max_batch_size=config.max_batch_size, max_seq_len=config.max_seq_len,
                    deterministic=config.deterministic, raw_logprobs=opts.raw_logprobs)


def _queue(rows: list[PromptRow], model: ModelFamily, config: ModelConfig, base_params: SamplingParams,
           run_seed: int | None, scheduler: Scheduler) -> tuple[dict[str, tuple], list[tuple]]:
    """Render every valid row's prompt, tokenize them in one batch, queue them in row order.
    Returns (request id -> (its row, its system prompt, its request), the rows rejected with their errors)."""
    queued: dict[str, tuple] = {}
    rejected: list[tuple] = []  # (row, error): rows that never reach the scheduler
    rendered: list[tuple] = []  # (row, its system prompt, its sampling params, its prompt's text)
    for r in rows:
        if r.error is not None:
            rejected.append((r, r.error))
            continue
        system = r.system if r.system is not None else config.system_prompt
        try:
            rendered.append((r, system, *_render(r, system, base_params, model)))
        except RowError as e:
            rejected.append((r, str(e)))
    # tokenized at once (on the machine's cores, outside the GIL), then queued in row order
    for (r, system, params, _), prompt in zip(rendered, model.encode_prompts([text for *_, text in rendered])):
        req = Request(rid=r.id, prompt=prompt, params=params, seed=row_seed(r.seed, run_seed, r.id))
        try:
            scheduler.add(req)
        except ValueError as e:
            rejected.append((r, str(RowError(r.row, "max_new_frames", str(e)))))
            continue
        queued[r.id] = (r, system, req)
    rejected.sort(key=lambda x: x[0].row)
    return queued, rejected


def _render(r: PromptRow, system: str, base_params: SamplingParams, model: ModelFamily) -> tuple:
    """One valid prompt row's (sampling params, prompt text); a RowError names the row and field otherwise."""
    params = base_params.with_overrides(**r.overrides)
    try:
        params.check_consistent()
    except ValueError as e:
        raise RowError(r.row, "min_new_frames", str(e)) from None
    try:
        return params, model.render_prompt(r.text, system, r.scene)
    except PromptFieldError as e:
        raise RowError(r.row, e.field, e.message) from None


def _warm_up(model: ModelFamily, audio: AudioStage, scheduler: Scheduler, config: ModelConfig) -> float:
    """First-use costs before the first real row (omni_cli/warmup.py), with the first queued
    rows' prompts and the first one's parameters: the LM on this thread, the codec at once on
    its own thread. Returns its seconds (0 where the device has no first-use costs worth it)."""
    t0 = time.perf_counter()
    if model.warms_up and scheduler.waiting:
        queued = list(itertools.islice(scheduler.waiting, model.num_slots))
        with model.loop_stream():  # the stream the loop will run on
            codec = audio.warm(queued[0].params.max_new_frames, model.num_slots)
            warm_up_lm(model.runner, queued, config.max_seq_len, config.async_decode)
            codec.result()
    return time.perf_counter() - t0
