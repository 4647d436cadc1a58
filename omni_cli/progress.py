"""Progress display: a rich progress bar on a terminal, plain lines otherwise.

On a terminal (stderr is a TTY) a rich Live redraws, at most four times a second:
  - a first line naming the model and the device (describe()), once the run has told it;
  - a rich.progress bar: rows done/total, failed and rejected counts, rows/s and audio-s/s,
    elapsed and ETA (from the run's mean rate over the rows done);
  - a table under it: frames/s, long rows' chunks, async hit rate, prompt reuse and the running
    means of the rows' scores (scores()); subclasses add rows to it (omni_cli/device_progress.py).
When stderr is not a terminal (pipelines, cluster logs) it prints one plain line at the start and
one at the end (summary()), and nothing in between but long rows' chunk lines. --quiet prints nothing.
"""

from __future__ import annotations

import math
import sys
import threading
import time

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table
from rich.text import Text

CHUNK_LINE_S = 10.0  # plain output: a long row's chunk progress at most this often
SCORE_NAMES_SHOWN = 6  # the live display's scores line: more names would wrap it


def _sig3(v: float) -> str:
    """3 significant digits; large values whole, not in exponent form."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


class _EtaColumn(TimeRemainingColumn):
    """ETA from the mean time per row so far: rich's windowed speed has no sample while long rows run."""

    def render(self, task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        if not task.completed or task.total is None or elapsed is None:
            return Text("-:--:--", style="progress.remaining")
        left = int(elapsed / task.completed * max(task.total - task.completed, 0))
        minutes, seconds = divmod(left, 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours:d}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


class _Display(Table):
    """The details table, drawn under its head lines (the model line, the bar): a Table, so that
    subclasses' _render() can add_row() to it as before."""

    def __init__(self, head: list):
        super().__init__(show_header=False, show_edge=False, box=None, padding=(0, 2), pad_edge=False,
                         collapse_padding=True)
        self.head = head

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.head
        if self.row_count:
            yield from super().__rich_console__(console, options)


class Progress:
    def __init__(self, total: int, quiet: bool):
        self.total = total
        self.quiet = quiet
        self.done = 0
        self.failed = 0  # rows that failed on their own
        self.rejected = 0  # rows that came out but missed their quality thresholds (counted in done)
        self.interrupted = self.skipped = 0  # rows a signal or --max-failures stopped: not failures of theirs
        self.frames = 0
        self.audio_s = 0.0
        self.hits = self.misses = self.sync_routed = 0
        self.prefix = None  # the prefix cache's counts (runners/kv_blocks.py: PrefixStats), if the run has one
        self.note: str | None = None  # how the run ended, when not by finishing (e.g. "interrupted")
        self.title: str | None = None  # the live display's first line (describe())
        self.chunks_total = self.chunks_done = self.long = 0  # long rows' chunks (omni_cli/chunked.py)
        self._scores: dict[str, list] = {}  # score name -> [sum, rows], in first-seen order
        self._last_chunk_line = 0.0
        self.start = time.perf_counter()
        self._console = Console(stderr=True)
        self._live: Live | None = None
        self._last_draw = 0.0
        self._lock = threading.Lock()  # rows finish on the writer thread, steps on the loop's
        # never started: the bar is drawn inside our own Live, with the table under it
        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[counts]}"), TextColumn("{task.fields[rate]}"),
                                 TimeElapsedColumn(), _EtaColumn(), console=self._console, auto_refresh=False,
                                 get_time=time.perf_counter)
        self._task = self._bar.add_task("rows", total=total, counts="", rate="")

    def __enter__(self) -> "Progress":
        self.start = time.perf_counter()
        self._bar.reset(self._task, start=True, total=self.total, completed=self.done)  # elapsed from here
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

    def describe(self, model: str, device: str) -> None:
        """The live display's first line: the model and the device it runs on."""
        with self._lock:
            self.title = f"model {model} on {device}"
            self._maybe_draw()

    def step(self, frames: int, hits: int = 0, misses: int = 0, sync_routed: int = 0, prefix=None) -> None:
        with self._lock:
            self.frames += frames
            self.hits, self.misses, self.sync_routed = hits, misses, sync_routed
            self.prefix = prefix
            self._maybe_draw()

    def long_rows(self, chunks: int, resumed: int, rows: int) -> None:
        """The run's long rows: their chunks, of which an earlier run finished `resumed` (--resume), beside
        those of --best-of's extra attempts (more_chunks, counted first)."""
        with self._lock:
            self.chunks_total += chunks
            self.chunks_done, self.long = resumed, rows

    def more_chunks(self, n: int) -> None:
        """A long row's scoring attempt runs its n chunks again."""
        with self._lock:
            self.chunks_total += n

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
        """status: the manifest's (ok, rejected, failed, interrupted, skipped); a bool: ok or failed."""
        status = {True: "ok", False: "failed"}.get(status, status)
        with self._lock:
            self.done += 1
            self.failed += status == "failed"
            self.rejected += status == "rejected"
            self.interrupted += status == "interrupted"
            self.skipped += status == "skipped"
            self.audio_s += audio_s
            self._maybe_draw()

    def scores(self, values: dict[str, float | None]) -> None:
        """One scored row's scores: the running mean per name takes its numbers (None, NaN: not scored)."""
        with self._lock:
            for name, v in values.items():
                if v is None or not math.isfinite(v):
                    continue
                acc = self._scores.setdefault(name, [0.0, 0])
                acc[0] += float(v)
                acc[1] += 1
            self._maybe_draw()

    def score_means(self) -> dict[str, float]:
        """Score name -> its mean over the rows that had a number for it, in first-seen order."""
        with self._lock:
            return {name: total / n for name, (total, n) in self._scores.items()}

    def _count_items(self) -> list[tuple[int, str]]:
        return [(n, what) for n, what in ((self.failed, "failed"), (self.rejected, "rejected"),
                                          (self.interrupted, "interrupted"), (self.skipped, "skipped")) if n]

    def _counts(self) -> str:
        parts = [f"{n} {what}" for n, what in self._count_items()]
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
        means = self.score_means()
        scored = ("; mean " + ", ".join(f"{k} {_sig3(v)}" for k, v in means.items())) if means else ""
        return ((f"{self.note}: " if self.note else "") + f"{self.done}/{self.total} rows{counts} "
                f"in {elapsed:.1f}s, {fps:.1f} frames/s, {asps:.2f} audio-s/s{scored}")

    def _render(self) -> Table:
        elapsed, fps, asps = self.rates()
        styles = {"failed": "red", "rejected": "yellow"}
        counts = ", ".join(f"[{styles.get(what, 'dim')}]{n} {what}[/]" for n, what in self._count_items())
        self._bar.update(self._task, total=self.total, completed=self.done, counts=counts,
                         rate=f"{self.done / elapsed:,.2f} rows/s · {asps:,.2f} audio-s/s")
        head = ([Text(self.title, style="bold")] if self.title else []) + [self._bar]
        t = _Display(head)
        t.add_row("frames/s", f"{fps:,.1f}")
        if self.chunks_total:
            t.add_row("chunks", self._chunk_text().removeprefix("long rows: "))
        if self.hits + self.misses:
            rate = 100 * self.hits / (self.hits + self.misses)
            t.add_row("async hit rate", f"{rate:.1f}% ({self.hits}/{self.hits + self.misses}), "
                      f"{self.sync_routed} steps routed to sync")
        p = self.prefix
        if p is not None and p.prefilled_positions + p.reused_positions:
            share = 100 * p.reused_positions / (p.prefilled_positions + p.reused_positions)
            t.add_row("prompt reuse", f"{share:.1f}% of prompt positions from the prefix cache "
                      f"({p.reused_positions:,} reused, {p.prefilled_positions:,} prefilled)")
        shown = list(self._scores.items())[:SCORE_NAMES_SHOWN]
        if shown:
            t.add_row("scores", " · ".join(f"{name} {_sig3(total / n)}" for name, (total, n) in shown))
        return t
