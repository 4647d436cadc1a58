"""Slow checks started at collection and run one at a time on a background thread, so they use the
second core while the suite runs on the first (CI has two); their tests, ordered last
(conftest.py), then only collect the results. A check is a script of tests/ run as a subprocess
(the kernel checks in Triton's interpreter, the fresh-venv install): the same work its test would
do, in a process of its own, so neither its outcome nor the suite's depends on when it ran."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# NOTE: the background thread only waits on subprocesses: a library a check imported into this
# process could change process-wide state (MKL's thread count) under the tests running beside it
_jobs: dict[str, Future] = {}
_current: list[subprocess.Popen] = []


def command(script: str) -> tuple[list[str], dict]:
    """tests/<script>.py as a subprocess; a kernel check (interpret_*) in Triton's CPU interpreter."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if script.startswith("interpret_"):
        env["TRITON_INTERPRET"] = "1"
    return [sys.executable, "-m", f"tests.{script}"], env


def start(scripts: list[str]) -> None:
    """Queue the scripts' runs on one background thread, in order."""
    todo = [s for s in scripts if s not in _jobs]
    for s in todo:
        _jobs[s] = Future()
    if todo:
        threading.Thread(target=_run_all, args=(todo,), daemon=True, name="omni-test-background").start()


def result(script: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """The script's finished run (started now if it was not queued)."""
    if script not in _jobs:
        start([script])
    return _jobs[script].result(timeout=timeout)


def _run_all(scripts: list[str]) -> None:
    for script in scripts:
        cmd, env = command(script)
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
            _current.clear()


@atexit.register
def _stop() -> None:
    for proc in _current:  # a run cut short (pytest -x): leave no orphan behind
        proc.kill()
