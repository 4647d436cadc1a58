"""`omni generate`: prompts in, audio files + logprobs + manifest out.

Rows are validated and queued; omni_cli.loop drives the scheduler and the
runner (sync or with the async lookahead) and hands back each finished
request to a pool of writer threads, which decode its audio (each on a CUDA
stream of its own) and write its files while the loop keeps decoding. Every input row
ends in the manifest: ok, failed (with the error naming the row and field)
or, after Ctrl-C, interrupted (the rows already handed to the writer are
written first).
"""

from __future__ import annotations

import importlib
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
from omni_cli.params import FIELD_NAMES
from omni_cli.progress import Progress
from omni_cli.prompts import read_prompts
from omni_cli.scheduler import Request, Scheduler
from omni_cli.seeds import row_seed

FAMILIES = {"higgs_audio_v2": "runners.higgs_audio_v2"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# rows written at once: one thread made the writer the bottleneck when a batch
# finishes together (~15 ms a row at the 3B shape, measured on the H200 machine)
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
    import transformers

    return {"omni_cli": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


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
    family = importlib.import_module(FAMILIES[config.family]) if config.family in FAMILIES else None
    if family is None:
        raise OmniError(f"{config.path}: key 'family': unknown family {config.family!r} (known: {', '.join(FAMILIES)})")
    runner, prompt_builder = family.build(config, dtype, device, raw_logprobs=opts.raw_logprobs)
    t_loaded = time.perf_counter()

    writer = OutputWriter(opts.out, opts.fmt, runner.sample_rate)
    # the runner may hold fewer KV slots than max_batch_size asked for (free device memory)
    scheduler = Scheduler(runner.num_slots, config.max_seq_len)
    by_rid: dict[str, tuple] = {}
    by_system: dict[str, str] = {}
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
        for r in rows:
            if r.error is not None:
                fail(r.row, r.id, r.text, r.error)
                continue
            system = r.system if r.system is not None else config.system_prompt
            try:
                req = _request(r, system, base_params, prompt_builder, opts.seed)
                try:
                    scheduler.add(req)
                except ValueError as e:
                    raise RowError(r.row, "max_new_frames", str(e)) from None
            except RowError as e:
                fail(r.row, r.id, r.text, str(e))
                continue
            by_rid[r.id] = (r, req)
            by_system[r.id] = system

        def write(req: Request) -> None:  # on the writer thread
            nonlocal ok
            row, _ = by_rid[req.rid]
            try:
                record = _write_request(writer, runner, row, req, by_system[req.rid])
            except (OSError, RuntimeError, ValueError) as e:  # a full disk, a codec error: this row only
                fail(row.row, req.rid, row.text, f"row {row.row}: writing its outputs failed: {e}")
                return
            with counts_lock:
                ok += 1
            progress.row_done(record["duration_s"], ok=True)

        # several rows at once: a row's codec decode runs alone on its thread's CUDA
        # stream (so its audio does not depend on the others), files in parallel
        pool = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="omni-writer")
        pending_writes = []

        def finished(req: Request) -> None:
            pending_writes.append(pool.submit(write, req))

        def stepped(rows: int, loop_stats) -> None:
            progress.step(rows, runner.async_query_hit, runner.async_query_miss, loop_stats.sync_routed)

        try:
            stats = run_loop(scheduler, runner, finished, stepped, config.async_decode)
        except KeyboardInterrupt:
            interrupted = True
            stats = None
        finally:
            pool.shutdown(wait=True)  # every finished request's files are on disk after this
        for f in pending_writes:
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
        "command": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()},
        "totals": {"rows": len(rows), "ok": ok, "failed": failed, "interrupted": interrupted,
                   "frames": progress.frames, "audio_s": round(progress.audio_s, 3)},
        "timings": {"load_s": round(t_loaded - t0, 3), "generate_s": round(t_end - t_loaded, 3),
                    "wall_s": round(t_end - t0, 3), "frames_per_s": round(fps, 2), "audio_s_per_s": round(asps, 3),
                    "step_ms": stats.percentiles() if stats else {}},
        "async_decode": {"enabled": config.async_decode, "query_hits": runner.async_query_hit,
                         "query_misses": runner.async_query_miss,
                         "sync_routed_steps": stats.sync_routed if stats else 0},
    })
    if not opts.quiet:
        progress.print_line(_async_summary(config.async_decode, runner, stats))
    return RunSummary(total=len(rows), ok=ok, failed=failed, interrupted=interrupted)


def _request(r, system: str, base_params, prompt_builder, run_seed: int | None) -> Request:
    """One valid prompt row as a request; a RowError names the row and field otherwise."""
    params = base_params.with_overrides(**r.overrides)
    try:
        params.check_consistent()
    except ValueError as e:
        raise RowError(r.row, "min_new_frames", str(e)) from None
    try:
        prompt_ids = prompt_builder.build(r.text, system, r.scene)
    except ValueError as e:
        field, message = e.args
        raise RowError(r.row, field, message) from None
    return Request(rid=r.id, prompt_ids=prompt_ids, params=params, seed=row_seed(r.seed, run_seed, r.id))


def _async_summary(enabled: bool, runner, stats) -> str:
    if not enabled:
        return "omni: async decode off (synchronous steps)"
    hits, misses = runner.async_query_hit, runner.async_query_miss
    rate = f"{100 * hits / (hits + misses):.1f}%" if hits + misses else "n/a"
    routed = stats.sync_routed if stats else 0
    return f"omni: async decode on: query hit rate {rate} ({hits} hits, {misses} misses), {routed} steps routed to sync"


def _write_request(writer: OutputWriter, runner, row, req: Request, system: str) -> dict:
    tokens = np.stack(req.frames)  # [frames, codebooks], as sampled (BOS ramp, EOS staircase)
    logprobs = np.stack(req.logprobs)
    raw = np.stack(req.raw_logprobs) if req.raw_logprobs else None
    audio = runner.decode_audio(tokens)
    meta = {"row": row.row, "text": row.text, "scene": row.scene, "system": system, "seed": req.seed,
            "finish_reason": req.finish_reason, **req.params.as_record()}
    return writer.write_ok(row.row, req.rid, audio, tokens, logprobs, runner.real_code_mask(tokens), meta, raw)
