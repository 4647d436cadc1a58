"""Slow checks started at collection and run one at a time on a background thread, so they use the
second core while the suite runs on the first (CI has two); their tests, ordered last
(conftest.py), then only collect the results, and from the first such wait (the suite's own tests
done) the checks not started yet run on every core. A check is a script of tests/ run as a
subprocess (the kernel checks in Triton's interpreter, the fresh-venv install): the same work its
test would do, in a process of its own, so neither its outcome nor the suite's depends on when it ran."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# NOTE: the background threads only wait on subprocesses: a library a check imported into this
# process could change process-wide state (MKL's thread count) under the tests running beside it
_jobs: dict[str, Future] = {}
_queue: deque[str] = deque()  # queued checks not started yet, in order
_lock = threading.Lock()  # guards _queue and _threads
_threads = 0  # background threads running
_current: list[subprocess.Popen] = []  # the runs under way (list.append and .remove are atomic)


def command(script: str) -> tuple[list[str], dict]:
    """tests/<script>.py as a subprocess; a kernel check (interpret_*) in Triton's CPU interpreter."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if script.startswith("interpret_"):
        env["TRITON_INTERPRET"] = "1"
    return [sys.executable, "-m", f"tests.{script}"], env


def start(scripts: list[str]) -> None:
    """Queue the scripts' runs on the background thread, in order."""
    _spawn([s for s in scripts if s not in _jobs], 1)


def result(script: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """The script's finished run (started now if it was not queued). Only results are awaited from
    here on: the queued checks may take every core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _spawn([] if script in _jobs else [script], cores)
    return _jobs[script].result(timeout=timeout)


def _spawn(todo: list[str], threads: int) -> None:
    """Queue todo; start threads up to `threads` running in all, none idle."""
    global _threads
    with _lock:
        for s in todo:
            _jobs[s] = Future()
            _queue.append(s)
        for _ in range(min(threads - _threads, len(_queue))):
            _threads += 1
            threading.Thread(target=_run_all, daemon=True, name="omni-test-background").start()


def _run_all() -> None:
    global _threads
    while True:
        with _lock:
            if not _queue:
                _threads -= 1
                return
            script = _queue.popleft()
        cmd, env = command(script)
        proc = None
        try:
            # niced: the suite's own torch threads come first (an OpenMP barrier waits for its slowest thread)
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=lambda: os.nice(19))
            _current.append(proc)
            out, err = proc.communicate(timeout=900)
            _jobs[script].set_result(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
        except Exception as e:  # noqa: BLE001  (the test reports it)
            _jobs[script].set_exception(e)
        finally:
            if proc is not None:
                _current.remove(proc)


@atexit.register
def _stop() -> None:
    for proc in list(_current):  # a run cut short (pytest -x): leave no orphan behind
        proc.kill()
