"""SIGINT and SIGTERM (what Slurm, Kubernetes and docker send) end a run the same way.

The first signal raises Interrupted in the main thread while the run may stop
(the load, the loop); once the run is finishing (the rows in flight written,
the manifest rewritten, run.json) it is only recorded, and the run exits
130/143 after. A second signal exits at once: every file is written under a
temporary name and renamed, and manifest lines are appended whole, so nothing
on disk is left corrupt (temporaries are removed by --resume or --overwrite).
"""

from __future__ import annotations

import os
import signal
import threading


class Interrupted(KeyboardInterrupt):
    """A signal ended the run; exit_code is 128 + its number (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


def exit_code(exc: BaseException) -> int:
    return getattr(exc, "exit_code", 128 + signal.SIGINT)  # a plain KeyboardInterrupt: Ctrl-C


class SignalGuard:
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signals = signals  # a --devices worker's: SIGUSR1, which its parent sends (omni_cli/workers.py)
        self.signum: int | None = None  # the first signal received
        self.may_raise = True  # False while the run finishes: the signal is only recorded
        self._old: dict[int, object] = {}

    def __enter__(self) -> "SignalGuard":
        if threading.current_thread() is threading.main_thread():  # handlers install only there
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # the second signal: at once, no cleanup (nothing on disk is half-written)
            show_cursor()  # the live display hid it; nothing else will show it again
            os._exit(128 + signum)
        self.signum = signum
        if self.may_raise:
            raise Interrupted(signum)

    @property
    def exit_code(self) -> int | None:
        return None if self.signum is None else 128 + self.signum


def show_cursor() -> None:
    """Show the terminal's cursor (rich's live display hides it while it draws)."""
    try:
        if os.isatty(2):
            os.write(2, b"\x1b[?25h")
    except OSError:
        pass
