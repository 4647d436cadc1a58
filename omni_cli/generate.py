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
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

from omni_cli.audio_stage import AudioStage
from omni_cli.chunk_store import ChunkStore
from omni_cli.chunked import ChunkedRows, LongRow, first_chunk
from omni_cli.config import ModelConfig
from omni_cli.errors import RowError
from omni_cli.folder import KEPT_STATUSES, row_hash, row_intact
from omni_cli.job_io import LocalIO
from omni_cli.job_settings import check_flags, load_spec, model_identity, print_warnings, prompt_warnings
from omni_cli.loop import run_loop
from omni_cli.output import StdoutLines
from omni_cli.options import EXIT_OK, EXIT_ROWS_FAILED, EXIT_RUN_FAILED, GenerateOptions, RunSummary  # re-exported
from omni_cli.prompts import PromptRow, read_prompts
from omni_cli.quality.job import quality_record, start_stage
from omni_cli.quality.settings import quality_settings
from omni_cli.results import RowResults, input_fields
from omni_cli.run_record import async_summary, run_record
from omni_cli.runners.device import deterministic_cpu_threads, pick_device
from omni_cli.runners.family import ModelFamily, PromptFieldError, family_class
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.runners.sampling.seeds import row_seed
from omni_cli.scheduler import Request, Scheduler
from omni_cli.signals import SignalGuard, exit_code
from omni_cli.validate import check_inputs, encode_each
from omni_cli.voices import attach_references, encodes_any, queue_order, too_long
from omni_cli.warmup import warm_up_lm


class _MaxFailures(Exception):
    """--max-failures reached: the loop stops at this step."""


def run_generate(opts: GenerateOptions, io: LocalIO | None = None) -> RunSummary:
    """io: where rows come from and results go (omni_cli/job_io.py); a worker's or an actor's own."""
    io = io or LocalIO()
    t = {"start": time.perf_counter()}
    config, base_params = check_flags(opts)
    family = family_class(config.family, config.path)  # the family's imports
    opts = replace(opts, chunk_method=opts.chunk_method or family.default_chunk_method)
    t["family"] = time.perf_counter()
    info: dict = {}  # the prompt file's identity (run.json: prompts), as one process reads it
    if io.rows is None:
        rows = read_prompts(opts.prompts, opts.input_format, prompt_warnings(opts), info, family.row_fields())
    else:
        rows = io.rows
    t["prompts"] = info
    if opts.shard is not None:
        rows = opts.shard.select(rows)
    t["read"] = time.perf_counter()
    with io.guard() as guard:
        try:  # every row and flag checked before the folder is touched or a weight loads
            clips = check_inputs(rows, family, config, base_params, opts)
            t["checked"] = time.perf_counter()
            if not opts.quiet:
                print_warnings(opts, rows)
        except KeyboardInterrupt as e:
            return nothing_ran(len(rows), exit_code(e))
        lock = io.lock(opts)  # before the weights load
        try:
            with deterministic_cpu_threads(pick_device(config.device), config.deterministic):
                return _run(opts, config, base_params, rows, family, clips, t, guard, io)
        except KeyboardInterrupt as e:  # before any row ran (the load): nothing to record
            return nothing_ran(len(rows), exit_code(e))
        finally:
            lock.release()


def nothing_ran(total: int, code: int) -> RunSummary:
    """A signal came before any row ran: nothing recorded, exit 130/143."""
    print("omni: interrupted before any row ran", file=sys.stderr, flush=True)
    return RunSummary(total=total, ok=0, failed=0, interrupted=True, exit_code=code)


def _run(opts: GenerateOptions, config: ModelConfig, base_params: SamplingParams, rows: list[PromptRow],
         family: type[ModelFamily], clips: dict, t: dict, guard: SignalGuard, io: LocalIO) -> RunSummary:
    spec = load_spec(config, opts)
    quality = quality_settings(config.quality, config.path, opts)
    scorers, t["scorers_s"] = io.scorers(quality, str(spec.device)) if quality.enabled else ({}, 0.0)
    if encodes_any(family, spec, clips):  # the encoder loads with the model, not in the generate phase
        spec = replace(spec, encode_references=True)
    model = io.load(family, spec)
    t["loaded"] = time.perf_counter()
    references = attach_references(rows, model, clips)
    t["references"] = time.perf_counter()

    identity = model_identity(config, spec, opts)
    if quality.enabled:  # the scorers and rules pick which attempt a row keeps
        identity = identity | {"quality": quality.as_record()}
    earlier = io.earlier(opts.out) if opts.resume else {}
    io.clear_temporaries(opts.out)
    scheduler = Scheduler.for_runner(model.runner, config.max_seq_len)
    chunker = ChunkedRows(model, scheduler, opts.chunk_buffer, ChunkStore(opts.out), opts.resume)
    queued, rejected, kept, changed = _queue(rows, model, config, base_params, opts.seed, scheduler,
                                             identity, earlier, opts.out, (chunker, opts.chunk_method))
    stdout = StdoutLines() if opts.jsonl_stdout else None
    writer = io.writer(opts.out, opts.fmt, model.sample_rate, kept, stdout, model.frame_rate)
    progress = io.progress(len(rows) - len(kept), opts.quiet)
    if hasattr(progress, "describe"):
        progress.describe(Path(config.path).stem, str(spec.device))
    results = RowResults(writer, progress, model.real_code_mask, opts.quiet)
    results.rows = queued
    audio = AudioStage(model.codec, model.batched_codec, model)
    chunker.results, chunker.audio, chunker.progress = results, audio, progress
    stage, extra = start_stage(quality, scorers, results, audio, model, queued, clips, scheduler, chunker) \
        if quality.enabled else (None, 0)
    interrupted, stats, fault, stop = False, None, None, None
    code = EXIT_OK
    with progress:
        pool = model.runner.kv_blocks
        if pool is not None and pool.num_blocks * pool.block_size < config.max_batch_size * config.max_seq_len \
                and not opts.quiet:
            progress.print_line(f"omni: device memory holds {pool.num_blocks * pool.block_size} KV positions, "
                                f"max_batch_size {config.max_batch_size} rows of max_seq_len {config.max_seq_len} "
                                "would take more: rows run as many at once as their own lengths fit")
        if opts.resume and not opts.quiet:
            progress.print_line(f"omni: resuming: {len(kept)} finished rows kept, {len(rows) - len(kept)} to do")
        for r in changed:
            progress.print_line(f"[yellow]omni: warning: row {r.row} (id {r.id}) changed since the earlier run: "
                                "redoing it[/yellow]")
        try:
            for r, error in rejected:
                results.fail(r.row, r.id, input_fields(r, None), error)
            t["warmup_s"] = _warm_up(model, audio, scheduler, config)
            rows_per_call = min(model.num_slots, model.codec.rows_per_call(base_params.max_new_frames)) \
                if audio.batched else 1
            long_rows = [q[2] for q in queued.values() if isinstance(q[2], LongRow)]
            progress.long_rows(sum(lr.n for lr in long_rows), sum(lr.resumed for lr in long_rows), len(long_rows))
            audio.start(chunker.write, chunker.requests(len(queued), long_rows) + extra, rows_per_call)

            def stepped(n: int, loop_stats) -> None:
                progress.step(n, model.runner.async_query_hit, model.runner.async_query_miss,
                              loop_stats.sync_routed, pool.stats if pool is not None else None)
                if opts.max_failures is not None and results.failed >= opts.max_failures:
                    raise _MaxFailures

            t["loop"] = time.perf_counter()
            if opts.max_failures is not None and results.failed >= opts.max_failures:
                raise _MaxFailures
            with model.loop_stream():  # ahead of the codec's stream on the GPU
                stats = run_loop(scheduler, model.runner, chunker.finished, stepped, config.async_decode, stage)
        except KeyboardInterrupt as e:  # SIGINT, SIGTERM (omni_cli/signals.py)
            interrupted, code = True, exit_code(e)
        except _MaxFailures:
            stop, code = "skipped", EXIT_ROWS_FAILED
        except Exception as e:  # noqa: BLE001  (a fault of the whole run: the device, memory)
            fault, code = e, EXIT_RUN_FAILED
        finally:
            guard.may_raise = False  # from here the run finishes; a first signal is only recorded
            t.setdefault("warmup_s", 0.0)
            t.setdefault("loop", time.perf_counter())  # a fault in the warm-up: the loop never began
            t["decoded"] = time.perf_counter()
            audio.drain()  # rows still waiting (after Ctrl-C, say), and every file on disk
            if stage is not None:
                stage.close()  # the last attempts scored and written
                io.done_scoring(scorers)
            t["written"] = time.perf_counter()
        try:
            audio.check()
            if stage is not None:
                stage.check()
        except Exception as e:  # noqa: BLE001  (a bug in the codec or writer threads)
            fault, code = fault or e, EXIT_RUN_FAILED
        if guard.signum is not None and not interrupted:  # a signal while finishing
            interrupted, code = True, guard.exit_code
        _record_unfinished(results, queued, interrupted, fault, stop, opts)
        if fault is not None:
            progress.print_line(f"[red]omni: error: the run failed: {type(fault).__name__}: {fault}[/red]")
        progress.note = "interrupted" if interrupted else ("stopped: --max-failures reached" if stop else
                                                          ("run failed" if fault else None))
    written = _attempt(writer.close, "rewriting the manifest in input order")
    if written is not None:  # the manifest stands as appended (lines the disk refused are missing): incomplete
        fault, code = fault or written, EXIT_RUN_FAILED
    t["end"] = time.perf_counter()
    record = run_record(opts, config, model, results, progress, audio, stats, interrupted, t)
    record["references"] = references.as_record()
    record["quality"] = quality_record(quality, stage, t["scorers_s"], progress)
    record["prompts"] = t["prompts"] or None  # the whole file's, a shard's run included
    record["totals"].update(kept=len(kept), exit_code=code,
                            run_error=None if fault is None else f"{type(fault).__name__}: {fault}",
                            run_traceback=None if fault is None else traceback.format_exception(fault))
    recorded = _attempt(lambda: io.record(opts.out, record), "writing run.json")
    for failure in (written, recorded):
        if failure is not None:
            code = EXIT_RUN_FAILED
            progress.print_line(f"[red]omni: error: {failure}; --resume completes the run once there is room[/red]")
    if not opts.quiet:
        progress.print_line(async_summary(config.async_decode, model.runner, stats))
        if stdout is not None and stdout.note():
            progress.print_line(f"omni: {stdout.note()}")
    if code == EXIT_OK and results.failed:
        code = EXIT_ROWS_FAILED
    return RunSummary(total=len(rows), ok=results.ok + len(kept), failed=results.failed,
                      interrupted=interrupted, exit_code=code, rejected=results.rejected)


def _attempt(write, what: str) -> OSError | None:
    """A write at the end of the run; an OSError (a full disk, a folder gone) is returned, named, not raised."""
    try:
        write()
    except OSError as e:
        return OSError(f"{what} failed: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
    return None


def _record_unfinished(results: RowResults, queued: dict, interrupted: bool, fault, stop, opts) -> None:
    """After an interrupt, a run fault or --max-failures: every queued row that did not finish."""
    if interrupted:
        status, error = "interrupted", "interrupted before it finished"
    elif fault is not None:
        status, error = "failed", f"not finished: the run failed: {type(fault).__name__}: {fault}"
    elif stop:
        status, error = "skipped", f"not run: --max-failures {opts.max_failures} reached"
    else:
        return
    for rid, (row, system, req, _) in queued.items():
        if req.finish_reason is None:
            results.fail(row.row, rid, input_fields(row, system), error, status=status)
        elif not results.writer.has_row(row.row):  # finished, but its write never came (a bug in a thread)
            results.fail(row.row, rid, input_fields(row, system), error.replace("not finished", "not written"),
                         status=status)


def _queue(rows: list[PromptRow], model: ModelFamily, config: ModelConfig, base_params: SamplingParams,
           run_seed: int | None, scheduler: Scheduler, identity: dict, earlier: dict[str, dict], out: Path,
           chunking: tuple[ChunkedRows, str] | None = None):
    """Render every valid row's prompt, tokenize them in one batch, queue them in row order. Anything
    raised for one row (rendering, tokenizing, queueing) fails that row alone. Returns (request id ->
    (its row, its system prompt, its request); the rows rejected with their errors; input row ->
    manifest line of each row --resume keeps; the rows changed since the earlier run). A row split
    into chunks (omni_cli/chunked.py) queues its first chunk; its entry holds its LongRow."""
    queued: dict[str, tuple] = {}
    rejected: list[tuple] = []  # (row, error): rows that never reach the scheduler
    rendered: list[tuple] = []  # (row, its system prompt, its sampling params, its prompt's text, its hash)
    kept: dict[int, str] = {}
    changed: list[PromptRow] = []
    for r in rows:
        if r.error is not None:
            rejected.append((r, r.error))
            continue
        system = None if "system" in model.unused_row_fields else r.system if r.system is not None else \
            config.system_prompt
        try:
            params, text = _render(r, system, base_params, model)
            texts, text = first_chunk(r, system, params, model, chunking, text)
            content = {"text": r.text, "scene": r.scene, "system": system, "sampling": params.as_record(),
                       "seed": r.seed, "run_seed": run_seed, "model": identity}
            if r.fields:  # the family's own fields (Qwen3-TTS: language, speaker, instruct, modes)
                content["fields"] = r.fields
            if r.reference is not None:  # the clip's bytes and transcript, not its path or name
                content["reference"] = {"sha256": r.reference[1], "text": r.reference[0].text}
            if len(texts) > 1:  # the chunking decides the row's bytes: a changed one redoes it on --resume
                content["chunks"] = {"texts": texts, "buffer": chunking[0].buffer}
            digest = row_hash(content)
        except RowError as e:
            rejected.append((r, str(e)))
            continue
        except Exception as e:  # noqa: BLE001  (a row the checks let through: it fails alone)
            rejected.append((r, f"row {r.row}: building its prompt failed: {type(e).__name__}: {e}"))
            continue
        before = earlier.get(r.id)
        if before is not None and before.get("status") in KEPT_STATUSES:
            if before.get("row_hash") != digest:
                changed.append(r)
            elif row_intact(out, before):
                kept[r.row] = _kept_line(before, r.row)
                continue
        rendered.append((r, system, params, text, digest, texts))
    # the first row of each voice queues first, then the rest of each voice together (input order
    # within it): the first prefills compute every voice's prompt prefix side by side, one forward for
    # each first uncached position (runners/engine.py: _prefill_parts), and later rows reuse them
    rendered.sort(key=queue_order([x[0] for x in rendered]))
    for (r, system, params, _, digest, texts), prompt in zip(rendered, encode_each(model, [x[3] for x in rendered])):
        if isinstance(prompt, Exception):
            rejected.append((r, f"row {r.row}, field 'text': tokenizing it failed: {type(prompt).__name__}: {prompt}"))
            continue
        entry = None
        try:
            seed = row_seed(r.seed, run_seed, r.id)
            if len(texts) > 1:
                entry = LongRow(r, system, params, seed, texts, digest)
                req = chunking[0].first_request(entry, prompt)
            else:
                req = Request(rid=r.id, prompt=prompt, params=params, seed=seed)
        except Exception as e:  # noqa: BLE001
            rejected.append((r, f"row {r.row}: building its request failed: {type(e).__name__}: {e}"))
            continue
        try:
            scheduler.add(req)
        except ValueError as e:  # the prompt alone, or with its frames, past the context
            field = "text" if len(req.prompt_ids) >= config.max_seq_len else "max_new_frames"
            if r.context:
                field, e = too_long(r, len(prompt), len(r.context[0].codes), params.max_new_frames,
                                    config.max_seq_len, model.frame_rate)
            rejected.append((r, str(RowError(r.row, field, str(e)))))
            continue
        except Exception as e:  # noqa: BLE001
            rejected.append((r, f"row {r.row}: queueing it failed: {type(e).__name__}: {e}"))
            continue
        queued[r.id] = (r, system, entry or req, digest)
    rejected.sort(key=lambda x: x[0].row)
    return queued, rejected, kept, changed


def _kept_line(entry: dict, row: int) -> str:
    """A resumed row's manifest line: its earlier line's values, at its row number in this input."""
    from omni_cli.output import json_line

    return json_line({**entry, "row": row})


def _render(r: PromptRow, system: str, base_params: SamplingParams, model: ModelFamily) -> tuple:
    """One valid prompt row's (sampling params, prompt text); a RowError names the row and field otherwise."""
    params = base_params.with_overrides(**r.overrides)
    try:
        params.check_consistent()
    except ValueError as e:
        raise RowError(r.row, "min_new_frames", str(e)) from None
    try:
        return params, model.render_prompt(r.text, system, r.scene, r.context, r.fields)
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
