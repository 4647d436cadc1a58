"""--devices: one worker process per device on this host, one output folder.

The parent reads and checks every row and flag (nothing loads), locks the output folder and
starts one worker per device (multiprocessing's spawn context: CUDA-safe). Worker i runs the
one-process job (run_generate) on share i: the rows whose id hashes there (omni_cli/shard.py,
with n = the number of devices), on its device (CUDA_VISIBLE_DEVICES=<id>, so the worker's
device is cuda:0 and nothing it runs can touch another GPU). Workers write audio and npz into
the folder themselves; their manifest lines, step counts and messages come to the parent over
a pipe each (a killed worker cannot wedge a shared queue), and the parent alone writes
metadata.jsonl: appended as lines arrive, rewritten in input order at the end, as one process.

A worker that dies (killed, crashed) is reported; its share runs again, once, with --resume's
rules (its finished rows kept), on the next device whose worker finished; a share that dies
twice leaves its unfinished rows recorded failed for --resume (exit 3). Workers ignore SIGINT
and SIGTERM: the parent takes them and passes the first on as SIGUSR1, the second as well, and
exits. A worker whose parent is gone exits.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path

from omni_cli.errors import OmniError
from omni_cli.job_io import LocalIO, NoLock
from omni_cli.output import OutputWriter
from omni_cli.progress import Progress
from omni_cli.shard import shard_of

RERUNS = 1  # a dead worker's share runs again this many times
STEP_REPORT_S = 0.25  # a worker sends its step counts at most this often


def parse_devices(spec: str | None) -> tuple[str, ...] | None:
    """--devices: all (every visible GPU), or a list of cpu, N, cuda:N; OmniError naming the flag otherwise."""
    if spec is None:
        return None
    items = [s.strip() for s in spec.split(",")]
    count = None
    if items == ["all"]:
        count = cuda_count()
        if count == 0:
            raise OmniError("--devices all: no CUDA device is visible")
        return tuple(f"cuda:{i}" for i in range(count))
    devices = []
    for item in items:
        if item == "cpu":
            devices.append("cpu")
            continue
        n = item[5:] if item.startswith("cuda:") else item
        if not n.isdigit():
            raise OmniError(f"--devices: unknown device {item!r} (expected all, or a list of cpu, N, cuda:N)")
        count = cuda_count() if count is None else count
        if int(n) >= count:
            raise OmniError(f"--devices: {item} does not exist ({count} CUDA devices visible)")
        if f"cuda:{int(n)}" in devices:
            raise OmniError(f"--devices: cuda:{int(n)} is named twice (one worker per GPU)")
        devices.append(f"cuda:{int(n)}")
    return tuple(devices)


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


@dataclass
class WorkerSpec:
    serial: int  # the parent's number for this worker process
    share: int  # rows whose id hashes to share (of count)
    count: int
    attempt: int  # 0; 1 for a dead worker's rerun
    device: str  # as --devices named it
    opts: object  # GenerateOptions
    rows: list
    parent: int  # the parent's pid


# ---- the worker side ----

class _Link:
    """The worker's end of its pipe, shared by its writer threads and main thread."""

    def __init__(self, conn):
        self.conn, self._lock = conn, threading.Lock()

    def send(self, *msg) -> None:
        with self._lock:
            self.conn.send(msg)


class RelayWriter(OutputWriter):
    """Files into the shared folder; manifest lines to the parent (kept rows' first, flagged)."""

    def __init__(self, link: _Link, *args):
        self._link = link
        super().__init__(*args)

    def _open_manifest(self) -> int:
        for row in sorted(self._lines):
            self._link.send("line", row, self._lines[row], True)
        return -1

    def _emit(self, row: int, line: str) -> None:
        self._link.send("line", row, line, False)

    def close(self) -> None:
        pass


class RelayProgress(Progress):
    """No display: the step counts go to the parent, and the lines to print."""

    def __init__(self, link: _Link, total: int):
        super().__init__(total, quiet=True)
        self._link, self._sent = link, 0.0

    def step(self, frames: int, hits: int = 0, misses: int = 0, sync_routed: int = 0) -> None:
        super().step(frames, hits, misses, sync_routed)
        if time.perf_counter() - self._sent > STEP_REPORT_S:
            self._report()

    def _report(self) -> None:
        self._sent = time.perf_counter()
        self._link.send("steps", (self.frames, self.hits, self.misses, self.sync_routed))

    def print_line(self, text: str) -> None:
        self._link.send("print", text)

    def __exit__(self, *exc) -> None:
        self._report()


class WorkerIO(LocalIO):
    def __init__(self, link: _Link, rows: list):
        self.link, self.rows, self.run = link, rows, None

    def guard(self):
        from omni_cli.signals import SignalGuard

        return SignalGuard((signal.SIGUSR1,))

    def lock(self, opts):
        return NoLock()

    def clear_temporaries(self, out: Path) -> None:
        pass  # the parent's, before and after the workers: others write theirs meanwhile

    def writer(self, out, fmt, sample_rate, kept, on_row):
        return RelayWriter(self.link, out, fmt, sample_rate, kept)

    def progress(self, total: int, quiet: bool):
        return RelayProgress(self.link, total)

    def record(self, out, record: dict) -> None:
        self.run = record


def _watch_parent(parent: int) -> None:
    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)  # files are whole or absent; the lines went to the parent

    threading.Thread(target=watch, daemon=True, name="omni-parent-watch").start()


def worker_main(conn, spec: WorkerSpec) -> None:
    """A worker process: the one-process job on its share of rows."""
    for s in (signal.SIGINT, signal.SIGTERM):  # the parent's to take; it passes them on as SIGUSR1
        signal.signal(s, signal.SIG_IGN)
    if spec.device.startswith("cuda:"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        index = int(spec.device[5:])
        # ids count within the parent's own CUDA_VISIBLE_DEVICES, as torch's do
        os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index].strip() if visible else str(index)
        device = "cuda:0"
    else:
        device = spec.device
    os.environ["OMNI_WORKER"] = f"{spec.share}/{spec.count}:{spec.attempt}"  # who this is, for test hooks
    _watch_parent(spec.parent)
    link = _Link(conn)
    from omni_cli.generate import run_generate

    io = WorkerIO(link, spec.rows)
    opts = replace(spec.opts, devices=(device,), quiet=True, jsonl_stdout=False, shard=None,
                   resume=spec.opts.resume or spec.attempt > 0, overwrite=False)
    try:
        summary = run_generate(opts, io)
        link.send("done", io.run, summary.exit_code)
    except OmniError as e:
        link.send("error", str(e), e.exit_code)
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which records the rows)
        link.send("error", f"{type(e).__name__}: {e}", 3)
    conn.close()


# ---- the parent side ----

@dataclass
class _Worker:
    spec: WorkerSpec
    slot: int  # index into the device list
    proc: object
    conn: object
    end: tuple | None = None  # ("done", record, code) or ("error", message, code)
    finished: bool = False  # exited, and its pipe read to the end
    rows_done: set = field(default_factory=set)


class ParentManifest(OutputWriter):
    """The workers' manifest lines, appended as they come (the earlier run's lines stay until the
    final rewrite, as --resume needs them)."""

    def __init__(self, out: Path, fmt: str, on_row):
        super().__init__(out, fmt, 0, None, on_row)

    def _open_manifest(self) -> int:
        return os.open(self.out / "metadata.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def rows(self) -> set[int]:
        with self._lock:
            return set(self._lines)


class _ParentSignals:
    """The first SIGINT/SIGTERM stops the workers as a signal stops one run; a second one exits."""

    def __init__(self):
        self.signum, self.workers, self._old = None, [], {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, frame):
        first = self.signum is None
        self.signum = self.signum or signum
        for w in self.workers:
            if w.proc.is_alive():
                os.kill(w.proc.pid, signal.SIGUSR1)
        if not first:
            os._exit(128 + signum)


def check_job(opts) -> tuple:
    """What run_generate checks before anything loads, for a parent that shares the rows out:
    (config, base sampling params, every row, bad ones carrying their errors)."""
    from omni_cli.chunked import check_chunk_flags
    from omni_cli.generate import _settings
    from omni_cli.output import check_format
    from omni_cli.prompts import read_prompts
    from omni_cli.runners.family import family_class
    from omni_cli.validate import check_run
    from omni_cli.voices import check_references, prompt_base

    if opts.max_failures is not None:
        raise OmniError("--max-failures is not supported with --devices or --ray (each worker would count alone)")
    check_format(opts.fmt)
    check_chunk_flags(opts.chunk_method, opts.chunk_buffer)
    config, base_params = _settings(replace(opts, devices=None))
    rows = read_prompts(opts.prompts)
    check_run(rows, base_params, config, family_class(config.family, config.path).limits(config.checkpoint), opts.fmt)
    check_references(rows, config.voices, prompt_base(opts.prompts))
    return config, base_params, rows


def run_devices(opts) -> object:
    """`omni generate --devices`: a RunSummary, as run_generate's."""
    from omni_cli.folder import prepare_out_dir

    t0 = time.perf_counter()
    if opts.shard is not None:
        raise OmniError("--devices and --shard exclude each other: --devices shares the rows out itself")
    config, _, rows = check_job(opts)
    with _ParentSignals() as sig:
        lock = prepare_out_dir(opts.out, opts.overwrite, opts.resume)
        try:
            LocalIO().clear_temporaries(opts.out)
            return _supervise(opts, config, rows, sig, t0)
        finally:
            lock.release()


def _supervise(opts, config, rows: list, sig: _ParentSignals, t0: float):
    from omni_cli.device_progress import DeviceProgress
    from omni_cli.generate import EXIT_OK, EXIT_ROWS_FAILED, EXIT_RUN_FAILED, RunSummary, _stdout_line
    from omni_cli.results import input_fields

    devices, n = opts.devices, len(opts.devices)
    shares = [[r for r in rows if shard_of(r.id, n) == i] for i in range(n)]
    manifest = ParentManifest(opts.out, opts.fmt, _stdout_line if opts.jsonl_stdout else None)
    progress = DeviceProgress(len(rows), opts.quiet, devices)
    ctx = multiprocessing.get_context("spawn")
    todo = deque((i, 0) for i in range(n))
    free = list(range(n))  # device slots with no worker; a dead worker's slot is retired
    workers: list[_Worker] = []
    lost: dict[int, str] = {}  # share -> why its unfinished rows were left
    counted: set[int] = set()  # rows shown as done

    def start(share: int, attempt: int, slot: int) -> None:
        spec = WorkerSpec(len(workers), share, n, attempt, devices[slot], opts, shares[share], os.getpid())
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=worker_main, args=(child_end, spec), name=f"omni-worker-{devices[slot]}")
        proc.start()
        child_end.close()
        w = _Worker(spec, slot, proc, parent_end)
        workers.append(w)
        sig.workers = workers

    def receive(w: _Worker) -> None:
        while True:
            try:
                if not w.conn.poll():
                    return
                msg = w.conn.recv()
            except (EOFError, OSError):
                return
            except Exception:  # noqa: BLE001  (a message cut short by the worker's death)
                return
            kind = msg[0]
            if kind == "line":
                _, row, line, kept = msg
                manifest.add_line(row, line)
                if not kept and row not in counted:
                    counted.add(row)
                    rec = json.loads(line)
                    progress.device_row(w.slot, rec.get("duration_s") or 0.0, rec.get("status") == "ok")
            elif kind == "steps":
                progress.worker_steps(w.spec.serial, w.slot, msg[1])
            elif kind == "print":
                progress.print_line(f"[{progress.figures[w.slot].device}] {msg[1]}")
            else:
                w.end = msg

    with progress:
        while True:
            while todo and free and sig.signum is None:
                share, attempt = todo.popleft()
                start(share, attempt, free.pop(0))
            running = [w for w in workers if not w.finished]
            if not running:
                for share, _ in todo:  # stopped by a signal, or no device left
                    lost.setdefault(share, "not run: no device was left to run it")
                break
            ready = set(wait([w.conn for w in running] + [w.proc.sentinel for w in running], timeout=0.2))
            for w in running:
                if w.conn in ready:
                    receive(w)
                if w.proc.sentinel in ready:
                    w.proc.join()
                    receive(w)
                    w.conn.close()
                    w.finished = True
                    _ended(w, progress, todo, free, lost, sig, shares, manifest)
        errors = [w.end[1] for w in workers if w.end and w.end[0] == "error"]
        for r in rows:
            if r.row in manifest.rows:
                continue
            if sig.signum is not None:
                status, error = "interrupted", "interrupted before it finished"
            else:
                why = lost.get(shard_of(r.id, n)) or (errors[0] if errors else "its worker stopped")
                status, error = "failed", f"not finished: {why}"
            system = r.system if r.system is not None else config.system_prompt
            manifest.write_failed(r.row, r.id, input_fields(r, system), error, status=status)
        if sig.signum is not None:
            progress.note = "interrupted"
    manifest.close()
    LocalIO().clear_temporaries(opts.out)
    if errors and all(w.end and w.end[0] == "error" and w.end[2] == 2 for w in workers) and not counted:
        raise OmniError(errors[0])
    lines = [json.loads(manifest._lines[r]) for r in sorted(manifest._lines)]
    ok = sum(rec.get("status") == "ok" for rec in lines)
    if sig.signum is not None:
        code = 128 + sig.signum
    elif lost or errors:
        code = EXIT_RUN_FAILED
    else:
        code = EXIT_ROWS_FAILED if ok < len(rows) else EXIT_OK
    from omni_cli.run_record import devices_record

    record = devices_record(opts, config, workers, progress, len(rows), ok, code, lost, errors, t0)
    from omni_cli.output import write_run_json

    write_run_json(opts.out, record)
    if not opts.quiet:
        for line in progress.device_lines():
            progress.print_line(f"omni: {line}")
    return RunSummary(total=len(rows), ok=ok, failed=len(rows) - ok, interrupted=sig.signum is not None,
                      exit_code=code)


def _ended(w: _Worker, progress, todo, free, lost, sig, shares, manifest) -> None:
    """A worker process has exited: free its device, or report its death and rerun its share."""
    device = progress.figures[w.slot].device
    if w.end is not None and w.end[0] == "done":
        free.append(w.slot)
        return
    if w.end is not None:  # it raised: the job's error (a config, the device), not a death
        free.append(w.slot)
        progress.print_line(f"[red]omni: error: worker on {device}: {w.end[1]}[/red]")
        lost[w.spec.share] = w.end[1]
        return
    code = w.proc.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    done = manifest.rows
    left = sum(1 for r in shares[w.spec.share] if r.row not in done)
    if sig.signum is None and w.spec.attempt < RERUNS:
        todo.append((w.spec.share, w.spec.attempt + 1))
        then = "rerunning them on the next free device"
    else:
        lost[w.spec.share] = f"its worker process on {device} died ({how}); rerun with --resume"
        then = "left for --resume"
    progress.print_line(f"[red]omni: worker {w.spec.serial} on {device} (pid {w.proc.pid}) died ({how}) "
                        f"with {left} of its {len(shares[w.spec.share])} rows unfinished: {then}[/red]")
