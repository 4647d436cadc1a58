"""--devices: one worker process per device on this host, one output folder; this is the parent.

The parent reads and checks every row and flag (nothing loads), locks the output folder and
starts one worker per device (multiprocessing's spawn context: CUDA-safe; the worker's side is
omni_cli/worker_process.py). Worker i runs share i: the rows whose id hashes there
(omni_cli/shard.py, with n = the number of devices). The parent alone writes metadata.jsonl:
appended as the workers' lines arrive, rewritten in input order at the end, as one process.

A worker that dies (killed, crashed) is reported; its share runs again, once, under --resume's
rules (its finished rows kept), on the next device whose worker finished; a share that dies
twice leaves its unfinished rows recorded failed for --resume (exit 3). The first SIGINT or
SIGTERM goes on to the workers as SIGUSR1 (rows in flight written, the rest interrupted); a
second one exits at once.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from omni_cli.errors import OmniError
from omni_cli.job_io import LocalIO
from omni_cli.output import OutputWriter
from omni_cli.shard import shard_of
from omni_cli.worker_process import WorkerSpec, worker_main

RERUNS = 1  # a dead worker's share runs again this many times


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
    from omni_cli.runners.device import visible_gpus

    return visible_gpus()


@dataclass
class Worker:
    spec: WorkerSpec
    slot: int  # index into the device list
    proc: object
    conn: object
    end: tuple | None = None  # ("done", record, code) or ("error", message, code)
    finished: bool = False  # exited, and its pipe read to the end

    def ended(self, kind: str) -> bool:
        return self.end is not None and self.end[0] == kind


class ParentManifest(OutputWriter):
    """The workers' lines, appended as they come. The file is not rewritten at the start: the
    earlier run's lines stay until the final rewrite, as --resume and a rerun read them there."""

    def __init__(self, out: Path, fmt: str, on_row):
        super().__init__(out, fmt, 0, None, on_row)

    def _open_manifest(self) -> int:
        return os.open(self.out / "metadata.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def add_kept(self, row: int, line: str) -> None:
        """A row a worker kept (--resume): its line is in the file already, and is not this run's."""
        with self._lock:
            self._lines[row] = line

    def discard(self, remove: bool) -> None:
        """No row ran: close it unwritten; remove it if this run created it and it is still empty."""
        os.close(self._fd)
        path = self.out / "metadata.jsonl"
        if remove and path.stat().st_size == 0:
            path.unlink()


class _ParentSignals:
    """The first SIGINT/SIGTERM stops the workers as a signal stops one run; a second one exits."""

    def __init__(self, workers: list):
        self.signum, self.workers, self._old = None, workers, {}

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
            self.pass_on(w)
        if not first:
            from omni_cli.signals import show_cursor

            show_cursor()
            os._exit(128 + signum)

    def pass_on(self, w: Worker) -> None:
        try:
            if w.proc.is_alive():
                os.kill(w.proc.pid, signal.SIGUSR1)
        except (ProcessLookupError, ValueError):  # exited meanwhile, or not started yet
            pass


def run_devices(opts):
    """`omni generate --devices`: a RunSummary, as run_generate's."""
    from omni_cli.folder import prepare_out_dir
    from omni_cli.job_settings import check_job

    from omni_cli.job_settings import with_family_defaults

    t0 = time.perf_counter()
    if opts.shard is not None:
        raise OmniError("--devices and --shard exclude each other: --devices shares the rows out itself")
    opts = with_family_defaults(opts)
    config, rows, info = check_job(opts)
    supervisor = _Supervisor(opts, config, rows)
    supervisor.prompt_info = info
    with _ParentSignals(supervisor.workers) as sig:
        lock = prepare_out_dir(opts.out, opts.overwrite, opts.resume)
        try:
            LocalIO().clear_temporaries(opts.out)
            return supervisor.run(sig, t0)
        finally:
            lock.release()


class _Supervisor:
    """Starts the workers, takes their messages, reruns a dead one's share, then the manifest and run.json."""

    def __init__(self, opts, config, rows: list):
        self.opts, self.config, self.rows = opts, config, rows
        self.prompt_info: dict = {}  # the prompt file's identity (run.json: prompts)
        n = len(opts.devices)
        self.shares = [[r for r in rows if shard_of(r.id, n) == i] for i in range(n)]
        self.workers: list[Worker] = []
        self.todo = deque((i, 0) for i in range(n))  # (share, attempt) waiting for a device
        self.free = list(range(n))  # device slots with no worker; a dead worker's slot is retired
        self.lost: dict[int, str] = {}  # share -> why its unfinished rows were left
        self.counted: set[int] = set()  # rows this run finished, shown as done
        self._ctx = multiprocessing.get_context("spawn")

    def run(self, sig: _ParentSignals, t0: float):
        from omni_cli.device_progress import DeviceProgress
        from omni_cli.generate import nothing_ran
        from omni_cli.output import StdoutLines

        self.sig = sig
        path = self.opts.out / "metadata.jsonl"
        created = not path.exists()
        self.stdout = StdoutLines() if self.opts.jsonl_stdout else None
        self.manifest = ParentManifest(self.opts.out, self.opts.fmt, self.stdout)
        self.progress = DeviceProgress(len(self.rows), self.opts.quiet, self.opts.devices)
        with self.progress:
            self._loop()
            if self._failed_to_start():  # e.g. a device that cannot run the model: exit 2, as one process
                self.manifest.discard(remove=created)
                raise OmniError(next(w.end[1] for w in self.workers))
            if sig.signum is not None and not self.counted:  # as one process: nothing to record
                self.manifest.discard(remove=created)
                return nothing_ran(len(self.rows), 128 + sig.signum)
            self._record_unfinished()
            if sig.signum is not None:
                self.progress.note = "interrupted"
        self.manifest.close()
        LocalIO().clear_temporaries(self.opts.out)
        return self._finish(t0)

    def _loop(self) -> None:
        while True:
            while self.todo and self.free and self.sig.signum is None:
                share, attempt = self.todo.popleft()
                self._start(share, attempt, self.free.pop(0))
            running = [w for w in self.workers if not w.finished]
            if not running:
                for share, _ in self.todo if self.sig.signum is None else ():  # no device was left
                    self.lost.setdefault(share, "no device was left to run it; rerun with --resume")
                return
            ready = set(wait([w.conn for w in running] + [w.proc.sentinel for w in running], timeout=0.2))
            for w in running:
                if w.conn in ready:
                    self._receive(w)
                if w.proc.sentinel in ready:
                    w.proc.join()
                    self._receive(w)
                    w.conn.close()
                    w.finished = True
                    self._ended(w)

    def _start(self, share: int, attempt: int, slot: int) -> None:
        device = self.opts.devices[slot]
        spec = WorkerSpec(len(self.workers), share, len(self.shares), attempt, device, self.opts,
                          self.shares[share], os.getpid())
        parent_end, child_end = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=worker_main, args=(child_end, spec), name=f"omni-worker-{device}")
        w = Worker(spec, slot, proc, parent_end)
        self.workers.append(w)  # before start: a signal from here on reaches it
        proc.start()
        child_end.close()
        if self.sig.signum is not None:  # a signal came while it started
            self.sig.pass_on(w)

    def _receive(self, w: Worker) -> None:
        while True:
            try:
                if not w.conn.poll():
                    return
                msg = w.conn.recv()
            except Exception:  # noqa: BLE001  (EOF, or a message cut short by the worker's death)
                return
            kind = msg[0]
            if kind == "line":
                _, row, line, kept = msg
                if kept:
                    self.manifest.add_kept(row, line)
                    if w.spec.attempt == 0:  # an earlier run's row (a rerun's kept rows were counted)
                        self.progress.kept()
                    continue
                self.manifest.add_line(row, line)
                if row not in self.counted:
                    self.counted.add(row)
                    rec = json.loads(line)
                    self.progress.device_row(w.slot, rec.get("duration_s") or 0.0, rec.get("status") or "failed")
                    if rec.get("scores"):  # the workers' scores, for the running means
                        self.progress.scores(rec["scores"])
            elif kind == "steps":
                self.progress.worker_steps(w.spec.serial, w.slot, msg[1])
            elif kind == "print":
                self.progress.print_line(f"[{self.progress.figures[w.slot].device}] {msg[1]}")
            else:
                w.end = msg

    def _ended(self, w: Worker) -> None:
        """A worker process has exited: free its device, or report its death and rerun its share."""
        device = self.progress.figures[w.slot].device
        if w.ended("done"):
            self.free.append(w.slot)
            return
        if w.ended("error"):  # the job's error (a config, the device), not a death
            self.free.append(w.slot)
            self.progress.print_line(f"[red]omni: error: worker on {device}: {w.end[1]}[/red]")
            self.lost[w.spec.share] = f"its worker on {device} failed: {w.end[1]}; rerun with --resume"
            return
        code = w.proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        share = self.shares[w.spec.share]
        done = self.manifest.lines()
        left = sum(1 for r in share if r.row not in done)
        if self.sig.signum is not None:  # stopped by the signal before it could report: rows interrupted
            self.progress.print_line(f"omni: worker on {device} stopped ({how}) with {left} rows unfinished")
            return
        if w.spec.attempt < RERUNS:
            self.todo.append((w.spec.share, w.spec.attempt + 1))
            then = "rerunning them on the next free device"
        else:
            self.lost[w.spec.share] = f"its worker process on {device} died ({how}); rerun with --resume"
            then = "left for --resume"
        self.progress.print_line(f"[red]omni: worker {w.spec.serial} on {device} (pid {w.proc.pid}) died ({how}) "
                                 f"with {left} of its {len(share)} rows unfinished: {then}[/red]")

    def _failed_to_start(self) -> bool:
        """Every worker stopped on a usage or config error (exit 2) before any row."""
        return bool(self.workers) and not self.counted and all(
            w.ended("error") and w.end[2] == 2 for w in self.workers)

    def _record_unfinished(self) -> None:
        """Every row no worker wrote: interrupted, or failed for --resume with why."""
        from omni_cli.results import input_fields

        done = self.manifest.lines()
        n = len(self.shares)
        for r in self.rows:
            if r.row in done:
                continue
            if self.sig.signum is not None:
                status, error = "interrupted", "interrupted before it finished"
            else:
                status, error = "failed", f"not finished: {self.lost.get(shard_of(r.id, n), 'its worker stopped')}"
            system = r.system if r.system is not None else self.config.system_prompt
            self.manifest.write_failed(r.row, r.id, input_fields(r, system), error, status=status)

    def _finish(self, t0: float):
        from omni_cli.generate import EXIT_OK, EXIT_ROWS_FAILED, EXIT_RUN_FAILED, RunSummary
        from omni_cli.output import write_run_json
        from omni_cli.run_record import devices_record

        lines = [json.loads(line) for line in self.manifest.lines().values()]
        statuses = collections.Counter(rec.get("status") for rec in lines)
        ok = statuses["ok"]
        rows, sig = len(self.rows), self.sig.signum
        run_failed = self.lost or any(w.end is not None and w.end[2] == EXIT_RUN_FAILED for w in self.workers)
        if sig is not None:
            code = 128 + sig
        elif run_failed:
            code = EXIT_RUN_FAILED
        else:
            code = EXIT_ROWS_FAILED if ok + statuses["rejected"] < rows else EXIT_OK
        faults = [((w.end[1].get("totals") or {}).get("run_error")) for w in self.workers if w.ended("done")]
        errors = list(dict.fromkeys([*self.lost.values(), *filter(None, faults)]))
        record = devices_record(self.opts, self.config, self.workers, self.progress, rows, statuses, code, errors, t0)
        write_run_json(self.opts.out, record | {"prompts": self.prompt_info})
        if not self.opts.quiet:
            for line in self.progress.device_lines():
                self.progress.print_line(f"omni: {line}")
        if self.stdout is not None and self.stdout.note():
            self.progress.print_line(f"omni: {self.stdout.note()}")
        return RunSummary(total=rows, ok=ok, failed=statuses["failed"], interrupted=sig is not None, exit_code=code,
                          rejected=statuses["rejected"])
