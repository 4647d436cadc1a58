"""Progress display: a rich live panel on a terminal, plain lines otherwise.

On a terminal (stderr is a TTY) it redraws requests done/total, frames/s,
audio-seconds/s, elapsed and ETA. When stderr is not a terminal (pipelines,
cluster logs) it prints one plain line at the start and one at the end, and
nothing in between. --quiet prints nothing.
"""

from __future__ import annotations

import sys
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table


class Progress:
    def __init__(self, total: int, quiet: bool):
        self.total = total
        self.quiet = quiet
        self.done = 0
        self.failed = 0
        self.frames = 0
        self.audio_s = 0.0
        self.hits = self.misses = self.sync_routed = 0
        self.note: str | None = None  # how the run ended, when not by finishing (e.g. "interrupted")
        self.start = time.perf_counter()
        self._console = Console(stderr=True)
        self._live: Live | None = None
        self._last_draw = 0.0
        self._lock = threading.Lock()  # rows finish on the writer thread, steps on the loop's

    def __enter__(self) -> "Progress":
        self.start = time.perf_counter()
        if self.quiet:
            return self
        if sys.stderr.isatty():
            self._live = Live(self._render(), console=self._console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        else:
            print(f"omni: generating {self.total} rows", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            if self.note:
                print(f"omni: {self.summary()}", file=sys.stderr, flush=True)
        elif not self.quiet:
            print(f"omni: {self.summary()}", file=sys.stderr, flush=True)

    def step(self, frames: int, hits: int = 0, misses: int = 0, sync_routed: int = 0) -> None:
        with self._lock:
            self.frames += frames
            self.hits, self.misses, self.sync_routed = hits, misses, sync_routed
            self._maybe_draw()

    def print_line(self, text: str) -> None:
        """A line on stderr (rich markup allowed), above the live display when there is one."""
        self._console.print(text, highlight=False, soft_wrap=True)  # one line, however long

    def row_done(self, audio_s: float, ok: bool) -> None:
        with self._lock:
            self.done += 1
            self.failed += 0 if ok else 1
            self.audio_s += audio_s
            self._maybe_draw()

    def _maybe_draw(self) -> None:
        now = time.perf_counter()
        if self._live is not None and now - self._last_draw > 0.25:
            self._last_draw = now
            self._live.update(self._render())

    def rates(self) -> tuple[float, float, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return elapsed, self.frames / elapsed, self.audio_s / elapsed

    def summary(self) -> str:
        elapsed, fps, asps = self.rates()
        return ((f"{self.note}: " if self.note else "") + f"{self.done}/{self.total} rows ({self.failed} failed) "
                f"in {elapsed:.1f}s, {fps:.1f} frames/s, {asps:.2f} audio-s/s")

    def _render(self) -> Table:
        elapsed, fps, asps = self.rates()
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else float("nan")
        t = Table.grid(padding=(0, 2))
        t.add_row("requests", f"{self.done}/{self.total}" + (f" ({self.failed} failed)" if self.failed else ""))
        t.add_row("frames/s", f"{fps:,.1f}")
        t.add_row("audio-s/s", f"{asps:,.2f}")
        t.add_row("elapsed", f"{elapsed:.1f}s")
        t.add_row("ETA", "-" if eta != eta else f"{eta:.1f}s")
        if self.hits + self.misses:
            rate = 100 * self.hits / (self.hits + self.misses)
            t.add_row("async hit rate", f"{rate:.1f}% ({self.hits}/{self.hits + self.misses}), "
                      f"{self.sync_routed} steps routed to sync")
        return t
