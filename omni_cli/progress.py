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

CHUNK_LINE_S = 10.0  # plain output: a long row's chunk progress at most this often


class Progress:
    def __init__(self, total: int, quiet: bool):
        self.total = total
        self.quiet = quiet
        self.done = 0
        self.failed = 0  # rows that failed on their own
        self.interrupted = self.skipped = 0  # rows a signal or --max-failures stopped: not failures of theirs
        self.frames = 0
        self.audio_s = 0.0
        self.hits = self.misses = self.sync_routed = 0
        self.prefix = None  # the prefix cache's counts (runners/kv_blocks.py: PrefixStats), if the run has one
        self.note: str | None = None  # how the run ended, when not by finishing (e.g. "interrupted")
        self.chunks_total = self.chunks_done = self.long = 0  # long rows' chunks (omni_cli/chunked.py)
        self._last_chunk_line = 0.0
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

    def step(self, frames: int, hits: int = 0, misses: int = 0, sync_routed: int = 0, prefix=None) -> None:
        with self._lock:
            self.frames += frames
            self.hits, self.misses, self.sync_routed = hits, misses, sync_routed
            self.prefix = prefix
            self._maybe_draw()

    def long_rows(self, chunks: int, resumed: int, rows: int) -> None:
        """The run's long rows: their chunks, of which an earlier run finished `resumed` (--resume)."""
        with self._lock:
            self.chunks_total, self.chunks_done, self.long = chunks, resumed, rows

    def chunk_done(self) -> None:
        """A long row's chunk is generated: the live display counts it; plain output says so at most
        every CHUNK_LINE_S seconds (a long row may run for minutes before its row is done)."""
        with self._lock:
            self.chunks_done += 1
            self._maybe_draw()
            now = time.perf_counter()
            plain = self._live is None and not self.quiet and now - self._last_chunk_line >= CHUNK_LINE_S
            if plain:
                self._last_chunk_line = now
        if plain:
            print(f"omni: {self._chunk_text()}, {self.done}/{self.total} rows done", file=sys.stderr, flush=True)

    def _chunk_text(self) -> str:
        return f"long rows: {self.chunks_done}/{self.chunks_total} chunks of {self.long} rows"

    def print_line(self, text: str) -> None:
        """A line on stderr (rich markup allowed), above the live display when there is one."""
        self._console.print(text, highlight=False, soft_wrap=True)  # one line, however long

    def row_done(self, audio_s: float, status: bool | str) -> None:
        """status: the manifest's (ok, failed, interrupted, skipped); a bool: ok or failed."""
        status = {True: "ok", False: "failed"}.get(status, status)
        with self._lock:
            self.done += 1
            self.failed += status == "failed"
            self.interrupted += status == "interrupted"
            self.skipped += status == "skipped"
            self.audio_s += audio_s
            self._maybe_draw()

    def _counts(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.failed, "failed"), (self.interrupted, "interrupted"),
                                               (self.skipped, "skipped")) if n]
        return f" ({', '.join(parts)})" if parts else ""

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
        counts = self._counts() or " (0 failed)"
        return ((f"{self.note}: " if self.note else "") + f"{self.done}/{self.total} rows{counts} "
                f"in {elapsed:.1f}s, {fps:.1f} frames/s, {asps:.2f} audio-s/s")

    def _render(self) -> Table:
        elapsed, fps, asps = self.rates()
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else float("nan")
        t = Table.grid(padding=(0, 2))
        t.add_row("requests", f"{self.done}/{self.total}{self._counts()}")
        if self.chunks_total:
            t.add_row("chunks", self._chunk_text().removeprefix("long rows: "))
        t.add_row("frames/s", f"{fps:,.1f}")
        t.add_row("audio-s/s", f"{asps:,.2f}")
        t.add_row("elapsed", f"{elapsed:.1f}s")
        t.add_row("ETA", "-" if eta != eta else f"{eta:.1f}s")
        if self.hits + self.misses:
            rate = 100 * self.hits / (self.hits + self.misses)
            t.add_row("async hit rate", f"{rate:.1f}% ({self.hits}/{self.hits + self.misses}), "
                      f"{self.sync_routed} steps routed to sync")
        p = self.prefix
        if p is not None and p.prefilled_positions + p.reused_positions:
            share = 100 * p.reused_positions / (p.prefilled_positions + p.reused_positions)
            t.add_row("prompt reuse", f"{share:.1f}% of prompt positions from the prefix cache "
                      f"({p.reused_positions:,} reused, {p.prefilled_positions:,} prefilled)")
        return t
