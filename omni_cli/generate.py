"""`omni generate`: prompts in, audio files + logprobs + manifest out.

Rows are validated and queued; omni_cli.loop drives the scheduler and the
runner (sync or with the async lookahead) and hands back the requests that
finish in each step to a codec thread, which decodes their audio on a CUDA
stream of its own, and a pool of writer threads writes their files, while the
loop keeps decoding. Every input row ends in the manifest: ok, failed (with
the error naming the row and field) or, after Ctrl-C, interrupted (the rows
already handed to the codec are written first).
"""

from __future__ import annotations

import importlib
import itertools
import platform
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from rich.markup import escape

from omni_cli import __version__
from omni_cli.config import load_config
from omni_cli.errors import OmniError, RowError
from omni_cli.loop import run_loop
from omni_cli.output import OutputWriter, check_out_dir, write_run_json
from omni_cli.runners.sampling.params import FIELD_NAMES
from omni_cli.progress import Progress
from omni_cli.prompts import read_prompts
from omni_cli.scheduler import Request, Scheduler
from omni_cli.runners.sampling.seeds import row_seed
from omni_cli.warmup import warm_up_lm
from omni_cli.runners.device import priority_stream

FAMILIES = {"higgs_audio_v2": "omni_cli.runners.higgs_audio_v2"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# rows whose files are written at once (soundfile and numpy release the GIL)
WRITER_THREADS = 4


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


@dataclass
class RunSummary:
    total: int
    ok: int
    failed: int
    interrupted: bool


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise OmniError(f"device {spec!r} requested but CUDA is not available")
    return torch.device(spec)


def _versions() -> dict[str, str]:
    # from the installed metadata: importing transformers costs seconds, and a run does not use it
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:  # run.json is written after every row: it must not fail here
            return None

    return {"omni_cli": __version__, "torch": torch.__version__, "transformers": installed("transformers"),
            "tokenizers": installed("tokenizers"), "python": platform.python_version()}


def run_generate(opts: GenerateOptions) -> RunSummary:
    t0 = time.perf_counter()
    config = load_config(opts.model)
    if opts.max_batch_size is not None:
        if opts.max_batch_size < 1:
            raise OmniError(f"--max-batch-size must be >= 1, got {opts.max_batch_size}")
        config = replace(config, max_batch_size=opts.max_batch_size)
    if opts.deterministic is not None:
        config = replace(config, deterministic=opts.deterministic)
    if opts.async_decode is not None:
        config = replace(config, async_decode=opts.async_decode)
    base_params = config.sampling
    for name in FIELD_NAMES:
        value = getattr(opts, name)
        try:
            base_params = base_params.with_overrides(**{name: value})
        except ValueError as e:
            raise OmniError(f"--{name.replace('_', '-')}: {e}") from None
    rows = read_prompts(opts.prompts)
    check_out_dir(opts.out, opts.overwrite)

    device = pick_device(config.device)
    dtype = DTYPES[config.dtype]
    t_read = time.perf_counter()
    family = importlib.import_module(FAMILIES[config.family]) if config.family in FAMILIES else None
    t_family = time.perf_counter()
    if family is None:
        raise OmniError(f"{config.path}: key 'family': unknown family {config.family!r} (known: {', '.join(FAMILIES)})")
    runner, prompt_builder = family.build(config, dtype, device, raw_logprobs=opts.raw_logprobs)
    t_loaded = time.perf_counter()
    # batched on CUDA only: the CPU path stays per row (a batched CPU conv rounds differently too)
    batch_codec = device.type == "cuda" and not config.deterministic
    # The audio of finished rows is decoded on one codec thread (batched on
    # CUDA, except in deterministic mode), on its own CUDA stream, and their
    # files are written by a pool. One codec thread: cuDNN sets up per thread
    # and per input shape (on the H200 machine, 1.5 s for the first call,
    # 60-350 ms for each new shape), and Python launches the codec's kernels
    # under the GIL anyway, so more codec threads add set-up, not speed.
    codec_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omni-codec")

    # the runner may hold fewer KV slots than max_batch_size asked for (free device memory)
    scheduler = Scheduler(runner.num_slots, config.max_seq_len)
    by_rid: dict[str, tuple] = {}
    by_system: dict[str, str] = {}
    rejected: list[tuple] = []  # (row, error): rows that never reach the scheduler
    rendered: list[tuple] = []  # (row, its system prompt, its sampling params, its prompt's text)
    for r in rows:
        if r.error is not None:
            rejected.append((r, r.error))
            continue
        system = r.system if r.system is not None else config.system_prompt
        try:
            rendered.append((r, system, *_render(r, system, base_params, prompt_builder)))
        except RowError as e:
            rejected.append((r, str(e)))
    # tokenized at once (on the machine's cores, outside the GIL), then queued in row order
    for (r, system, params, _), prompt_ids in zip(rendered, prompt_builder.encode_all([text for *_, text in rendered])):
        req = Request(rid=r.id, prompt_ids=prompt_ids, params=params, seed=row_seed(r.seed, opts.seed, r.id))
        try:
            scheduler.add(req)
        except ValueError as e:
            rejected.append((r, str(RowError(r.row, "max_new_frames", str(e)))))
            continue
        by_rid[r.id] = (r, req)
        by_system[r.id] = system
    rejected.sort(key=lambda x: x[0].row)

    t_warm = time.perf_counter()
    if device.type == "cuda" and scheduler.waiting:  # the CPU has no first-use costs worth a warm-up
        with priority_stream(device):  # the stream the loop will run on
            _warm_up(runner, list(itertools.islice(scheduler.waiting, runner.num_slots)), config, codec_thread,
                     batch_codec)
    warmup_s = time.perf_counter() - t_warm

    writer = OutputWriter(opts.out, opts.fmt, runner.sample_rate)
    ok = failed = 0
    interrupted = False
    progress = Progress(len(rows), opts.quiet)

    counts_lock = threading.Lock()  # writer threads finish rows concurrently

    def fail(row: int, rid: str, text: str, error: str) -> None:
        nonlocal failed
        with counts_lock:
            failed += 1
        writer.write_failed(row, rid, text, error)
        progress.row_done(0.0, ok=False)
        if not opts.quiet:
            progress.print_line(f"[red]omni: {escape(error)}[/red]")

    with progress:
        if runner.num_slots < config.max_batch_size and not opts.quiet:
            progress.print_line(f"omni: device memory holds the KV cache of {runner.num_slots} requests at once "
                                f"(max_batch_size {config.max_batch_size}); running that many")
        for r, error in rejected:
            fail(r.row, r.id, r.text, error)

        def write(req: Request, tokens: np.ndarray, samples) -> None:  # on a writer thread: one row's files
            try:
                write_row(req, tokens, samples)
            finally:
                req.release()  # written or failed: a run keeps every Request to its end, not their frames

        def write_row(req: Request, tokens: np.ndarray, samples) -> None:
            nonlocal ok
            row = by_rid[req.rid][0]
            if isinstance(samples, Exception):
                fail(row.row, req.rid, row.text, f"row {row.row}: decoding its audio failed: {samples}")
                return
            t_write = time.perf_counter()
            try:
                record = _write_request(writer, runner, row, req, by_system[req.rid], tokens, samples)
            except (OSError, ValueError) as e:  # a full disk: this row only
                fail(row.row, req.rid, row.text, f"row {row.row}: writing its outputs failed: {e}")
                return
            with counts_lock:
                ok += 1
                write_busy.append(time.perf_counter() - t_write)
            progress.row_done(record["duration_s"], ok=True)

        def decode_and_write(after_loop: bool = False) -> None:  # on the codec thread: every row finished so far
            nonlocal codec_done
            with backlog_lock:
                reqs = backlog[:]
                backlog.clear()
                drain = after_loop or taken >= queued  # the last rows: the loop decodes nothing more
            if not reqs:
                return  # an earlier call took them
            tokens = [r.frames.array for r in reqs]  # [frames, codebooks], as sampled
            t_call = time.perf_counter()
            for i, samples in decode_rows(runner, tokens, batch_codec, drain):  # writes start as each codec call ends
                pending.append(writers.submit(write, reqs[i], tokens[i], samples))
            codec_done = time.perf_counter()
            codec_calls.append(codec_done - t_call)

        writers = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="omni-writer")
        pending = []  # futures, appended by this thread and the codec thread
        codec_calls: list[float] = []  # seconds per decode_and_write call that decoded rows
        codec_done = 0.0  # when the last of them returned (perf_counter)
        write_busy: list[float] = []  # seconds per row written, on the writer threads
        # Rows wait here until the codec thread takes them all at once: when it
        # falls behind, its calls get bigger instead of its queue longer. A call
        # waits for as many rows as one batched codec call holds (or the last
        # rows): batch 1 decodes at less than half the rate of batch 21 (bf16, measured),
        # and in a long run the codec's calls share the GPU with the decode loop.
        backlog: list[Request] = []
        backlog_lock = threading.Lock()
        codec_rows = min(runner.num_slots, runner.codec_rows_per_call(base_params.max_new_frames)) if batch_codec else 1
        queued, taken = len(by_rid), 0  # rows that will reach the codec, and those that did

        def finished(reqs: list[Request]) -> None:
            nonlocal taken
            with backlog_lock:
                backlog.extend(reqs)
                taken += len(reqs)
                ready = len(backlog) >= codec_rows or taken >= queued
            if ready:
                pending.append(codec_thread.submit(decode_and_write))

        def stepped(rows: int, loop_stats) -> None:
            progress.step(rows, runner.async_query_hit, runner.async_query_miss, loop_stats.sync_routed)

        t_loop = time.perf_counter()
        try:
            with priority_stream(device):  # ahead of the codec's stream on the GPU
                stats = run_loop(scheduler, runner, finished, stepped, config.async_decode)
        except KeyboardInterrupt:
            interrupted = True
            stats = None
        finally:
            t_decoded = time.perf_counter()
            pending.append(codec_thread.submit(decode_and_write, True))  # rows still waiting (after Ctrl-C, say)
            codec_thread.shutdown(wait=True)  # every finished request decoded, its files submitted
            writers.shutdown(wait=True)  # and on disk
            t_written = time.perf_counter()
        for f in list(pending):
            f.result()  # a bug in the writer (expected errors fail their row) is raised here
        if interrupted:  # account for the rest
            for rid, (row, req) in by_rid.items():
                if req.finish_reason is None:
                    writer.write_failed(row.row, rid, row.text, "interrupted before it finished", status="interrupted")
    writer.close()
    t_end = time.perf_counter()
    elapsed, fps, asps = progress.rates()
    write_run_json(opts.out, {
        "versions": _versions(),
        "config": config.as_dict(),
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "dtype": config.dtype,
        "kv_slots": runner.num_slots,
        "kv_budget": runner.kv_budget,  # free memory and what was kept from it (CUDA), MiB
        "command": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()},
        "totals": {"rows": len(rows), "ok": ok, "failed": failed, "interrupted": interrupted,
                   "frames": progress.frames, "audio_s": round(progress.audio_s, 3)},
        # generate_s: after the load and the warm-up (both startup), to the last file
        "timings": {"load_s": round(t_loaded - t0, 3), "warmup_s": round(warmup_s, 3),
                    # the load's parts: config and prompt file, the model family's imports, then build's
                    "load_phases": {"inputs_s": round(t_read - t0, 3), "imports_s": round(t_family - t_read, 3),
                                    **runner.load_phases},
                    "generate_s": round(t_end - t_loaded - warmup_s, 3),
                    "wall_s": round(t_end - t0, 3), "frames_per_s": round(fps, 2), "audio_s_per_s": round(asps, 3),
                    # the loop (prefill + decode, files written beside it), then the writers' tail
                    "loop_s": round(t_decoded - t_loop, 3),
                    "prefill_s": round(sum(stats.prefill_ms) / 1e3, 3) if stats else None,
                    "prefill_steps": len(stats.prefill_ms) if stats else None,
                    "write_tail_s": round(t_written - t_decoded, 3),
                    # of that tail: until the codec thread's last call returned (its files submitted;
                    # <= 0 when it returned during the loop), and the writers' busy seconds over the run
                    "tail_codec_s": round(codec_done - t_decoded, 3) if codec_calls else None,
                    "write_busy_s": round(sum(write_busy), 3),
                    # the codec thread: its calls (each every row finished so far), their sum and the longest
                    "codec_calls": len(codec_calls), "codec_s": round(sum(codec_calls), 3),
                    "codec_max_call_s": round(max(codec_calls, default=0.0), 3),
                    "step_ms": stats.percentiles() if stats else {}},
        "async_decode": {"enabled": config.async_decode, "query_hits": runner.async_query_hit,
                         "query_misses": runner.async_query_miss,
                         "sync_routed_steps": stats.sync_routed if stats else 0},
    })
    if not opts.quiet:
        progress.print_line(_async_summary(config.async_decode, runner, stats))
    return RunSummary(total=len(rows), ok=ok, failed=failed, interrupted=interrupted)


def _render(r, system: str, base_params, prompt_builder) -> tuple:
    """One valid prompt row's (sampling params, prompt text); a RowError names the row and field otherwise."""
    params = base_params.with_overrides(**r.overrides)
    try:
        params.check_consistent()
    except ValueError as e:
        raise RowError(r.row, "min_new_frames", str(e)) from None
    try:
        return params, prompt_builder.render(r.text, system, r.scene)
    except ValueError as e:
        field, message = e.args
        raise RowError(r.row, field, message) from None


def _warm_up(runner, queued: list[Request], config, codec_thread, batch_codec: bool) -> None:
    """First-use costs before the first real row (omni_cli/warmup.py), with the first queued
    rows' prompts and the first one's parameters: the LM on this thread, the codec at once
    on its own thread."""
    frames = queued[0].params.max_new_frames
    codec = codec_thread.submit(runner.warm_codec, frames, runner.num_slots, batch_codec)
    warm_up_lm(runner, queued, config.max_seq_len, config.async_decode)
    codec.result()


def decode_rows(runner, tokens: list[np.ndarray], batched: bool, drain: bool = False):
    """Yields (row index, its audio as int16 samples or the error that kept it from being
    decoded) for every row, each codec call's rows as soon as that call completes
    (``drain``: the decode loop has stopped, so calls are smaller: runner.decode_audio_calls).

    When a call fails (a batch out of memory, say), the rows not yet yielded
    are retried one by one, so that only a row that fails alone is lost."""
    done: set[int] = set()
    try:
        for rows, waves in runner.decode_audio_calls(tokens, batched=batched, drain=drain):
            for i, wave in zip(rows, waves):
                done.add(i)
                yield i, wave
        return
    except (RuntimeError, ValueError) as e:  # a codec error
        if len(tokens) == 1:
            yield 0, e
            return
    for i in sorted(set(range(len(tokens))) - done):
        try:
            yield i, runner.decode_audio([tokens[i]], batched=False)[0]
        except (RuntimeError, ValueError) as e:
            yield i, e


def _async_summary(enabled: bool, runner, stats) -> str:
    if not enabled:
        return "omni: async decode off (synchronous steps)"
    hits, misses = runner.async_query_hit, runner.async_query_miss
    rate = f"{100 * hits / (hits + misses):.1f}%" if hits + misses else "n/a"
    routed = stats.sync_routed if stats else 0
    return f"omni: async decode on: query hit rate {rate} ({hits} hits, {misses} misses), {routed} steps routed to sync"


def _write_request(writer: OutputWriter, runner, row, req: Request, system: str, tokens: np.ndarray,
                   samples: np.ndarray) -> dict:
    logprobs = req.logprobs.array
    raw = req.raw_logprobs.array if len(req.raw_logprobs) else None
    meta = {"row": row.row, "text": row.text, "scene": row.scene, "system": system, "seed": req.seed,
            "finish_reason": req.finish_reason, **req.params.as_record()}
    return writer.write_ok(row.row, req.rid, samples, tokens, logprobs, runner.real_code_mask(tokens), meta, raw)
