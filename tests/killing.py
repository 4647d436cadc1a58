"""Run `omni generate` in a subprocess that kills itself at a chosen moment (tests/test_resume.py,
tests/test_signals.py): the kill comes from inside, at a point named by OMNI_TEST_KILL, so the
moment is exact, not a race against a timer.

OMNI_TEST_KILL:
  before        SIGKILL once the empty manifest exists, before any row was run
  mid:N         SIGKILL after the N-th row's files and manifest line were written
  chunk:N       SIGKILL after the N-th chunk of a long row was written (its store entry, or its row)
  rewrite       SIGKILL during the final manifest rewrite (its temporary half written)
  term:N        SIGTERM after the N-th row was written (the run's own handler takes it)
  term2:N       SIGTERM and SIGINT there (the same signal twice would merge into one while
                pending): the second handled exits at once

OMNI_TEST_PLANTED_ASR=1: --score asr transcribes with tests/planted_asr.py (no Whisper).

OMNI_TEST_WORKER_KILL=SHARE:ATTEMPTS:N (--devices, tests/test_devices.py): a worker process of
share SHARE, on an attempt listed in ATTEMPTS (0: the first run, 1: its rerun; e.g. 0 or 0,1),
SIGKILLs itself after its N-th row's files and manifest line were written.
OMNI_TEST_WORKER_TERM=SHARE:OUT: share SHARE's worker, as it starts loading the model, waits for
the first line in OUT/metadata.jsonl (another worker's row), sends its parent SIGTERM, and waits
there for the signal the parent passes on.
Worker processes import this module as __mp_main__ (multiprocessing's spawn), which installs the
hooks there.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def _install(spec: str) -> None:
    from omni_cli import output, results

    mode, _, n = spec.partition(":")
    if mode == "before":
        init = output.OutputWriter.__init__

        def killing_init(self, *a, **k):
            init(self, *a, **k)
            os.kill(os.getpid(), signal.SIGKILL)

        output.OutputWriter.__init__ = killing_init
    elif mode in ("mid", "term", "term2"):
        write, count, lock = results.RowResults._write, [0], threading.Lock()
        sig = signal.SIGKILL if mode == "mid" else signal.SIGTERM

        def counting_write(self, *a, **k):
            write(self, *a, **k)
            with lock:
                count[0] += 1
                if count[0] == int(n):
                    os.kill(os.getpid(), sig)
                    if mode == "term2":
                        os.kill(os.getpid(), signal.SIGINT)

        results.RowResults._write = counting_write
    elif mode == "chunk":
        from omni_cli import chunked

        written, count, lock = chunked.ChunkedRows._chunk_written, [0], threading.Lock()

        def counting_chunk(self, *a, **k):
            written(self, *a, **k)
            with lock:
                count[0] += 1
                if count[0] == int(n):
                    os.kill(os.getpid(), signal.SIGKILL)

        chunked.ChunkedRows._chunk_written = counting_chunk
    elif mode == "rewrite":
        atomic = output._atomic_write

        def killing_write(path, data):
            if path.name == "metadata.jsonl" and b"\n" in data and killing_write.armed:
                path.with_name(path.name + ".tmp").write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            atomic(path, data)

        killing_write.armed = False  # the writer's first call (the manifest's start) passes
        init = output.OutputWriter.__init__

        def arming_init(self, *a, **k):
            init(self, *a, **k)
            killing_write.armed = True

        output._atomic_write = killing_write
        output.OutputWriter.__init__ = arming_init
    else:
        raise SystemExit(f"unknown OMNI_TEST_KILL {spec!r}")


def _install_worker_kill(spec: str) -> None:
    from omni_cli import results

    share, attempts, n = spec.split(":")
    victims = {f"{share}:{a}" for a in attempts.split(",")}
    write, count, lock = results.RowResults._write, [0], threading.Lock()

    def counting_write(self, *a, **k):
        write(self, *a, **k)
        who = os.environ.get("OMNI_WORKER", "")  # set by the worker: SHARE/COUNT:ATTEMPT
        with lock:
            count[0] += 1
            if count[0] == int(n) and f"{who.split('/')[0]}:{who.rpartition(':')[2]}" in victims:
                os.kill(os.getpid(), signal.SIGKILL)

    results.RowResults._write = counting_write


def _install_worker_term(spec: str) -> None:
    import time
    from pathlib import Path

    from omni_cli import job_io

    share, _, out = spec.partition(":")
    load = job_io.LocalIO.load

    def signalling_load(self, *a, **k):
        if os.environ.get("OMNI_WORKER", "").split("/")[0] == share:  # set by the worker: SHARE/COUNT:ATTEMPT
            manifest, deadline = Path(out) / "metadata.jsonl", time.monotonic() + 60
            while b"\n" not in manifest.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getppid(), signal.SIGTERM)
            time.sleep(60)  # the parent's SIGUSR1 ends this
        return load(self, *a, **k)

    job_io.LocalIO.load = signalling_load


if __name__ == "__mp_main__" and os.environ.get("OMNI_TEST_WORKER_KILL"):
    _install_worker_kill(os.environ["OMNI_TEST_WORKER_KILL"])
if __name__ == "__mp_main__" and os.environ.get("OMNI_TEST_WORKER_TERM"):
    _install_worker_term(os.environ["OMNI_TEST_WORKER_TERM"])

if __name__ == "__main__":
    if os.environ.get("OMNI_TEST_KILL"):
        _install(os.environ["OMNI_TEST_KILL"])
    if os.environ.get("OMNI_TEST_PLANTED_ASR"):  # --score asr with tests/planted_asr.py's transcripts
        from tests.planted_asr import install

        install()
    from omni_cli.cli import app

    app(sys.argv[1:], prog_name="omni")
