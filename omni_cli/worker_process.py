"""A --devices worker process: the one-process job (run_generate) on its share of the rows, on
its own device, under a parent (omni_cli/workers.py) that owns the output folder.

It writes audio and npz into the folder itself (whole files, renamed); its manifest lines, step
counts and messages go to the parent over its own pipe, and the parent alone writes the manifest.
It ignores SIGINT and SIGTERM: the parent takes them and passes them on as SIGUSR1, which the
job's SignalGuard takes as one run takes SIGINT. It exits if its parent is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omni_cli.errors import OmniError
from omni_cli.job_io import LocalIO, NoLock
from omni_cli.output import OutputWriter
from omni_cli.progress import Progress
from omni_cli.signals import SignalGuard

STEP_REPORT_S = 0.25  # a worker sends its step counts at most this often


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

    def step(self, frames: int, hits: int = 0, misses: int = 0, sync_routed: int = 0, prefix=None) -> None:
        super().step(frames, hits, misses, sync_routed, prefix)  # the prefix cache's counts reach run.json only
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
    """The parent's rows, lock and temporaries; lines, progress and the run record go to it."""

    def __init__(self, link: _Link, rows: list):
        self.link, self.rows, self.run = link, rows, None

    def guard(self):
        return SignalGuard((signal.SIGUSR1,))

    def lock(self, opts):
        return NoLock()

    def clear_temporaries(self, out: Path) -> None:
        pass  # the parent's, before and after the workers: others write theirs meanwhile

    def writer(self, out, fmt, sample_rate, kept, on_row, frame_rate: float = 25.0):
        return RelayWriter(self.link, out, fmt, sample_rate, kept, None, frame_rate)

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


def own_device(device: str) -> str:
    """A GPU worker sees its GPU alone, as cuda:0 (CUDA_VISIBLE_DEVICES); cpu stays cpu."""
    if not device.startswith("cuda:"):
        return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = int(device[5:])
    # ids count within the parent's own CUDA_VISIBLE_DEVICES, as torch's do
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index].strip() if visible else str(index)
    return "cuda:0"


def worker_main(conn, spec: WorkerSpec) -> None:
    """A worker process's entry (multiprocessing's spawn): the one-process job on its share."""
    for s in (signal.SIGINT, signal.SIGTERM):  # the parent's to take; it passes them on as SIGUSR1
        signal.signal(s, signal.SIG_IGN)
    device = own_device(spec.device)
    os.environ["OMNI_WORKER"] = f"{spec.share}/{spec.count}:{spec.attempt}"  # who this is, for test hooks
    _watch_parent(spec.parent)
    link = _Link(conn)
    from omni_cli.generate import run_generate

    io = WorkerIO(link, spec.rows)
    # a rerun keeps what its dead predecessor finished: --resume's rules against the manifest
    opts = replace(spec.opts, devices=(device,), quiet=True, jsonl_stdout=False, shard=None,
                   resume=spec.opts.resume or spec.attempt > 0, overwrite=False)
    try:
        summary = run_generate(opts, io)
        link.send("done", io.run or {}, summary.exit_code)  # no record: stopped before any row ran
    except OmniError as e:
        link.send("error", str(e), e.exit_code)
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which records the rows)
        link.send("error", f"{type(e).__name__}: {e}", 3)
    conn.close()
