"""The parent's display for --devices: one Progress summed over the worker processes, with
each device's rows, rates and async hit rate (omni_cli/workers.py feeds it)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rich.table import Table

from omni_cli.progress import Progress


@dataclass
class DeviceFigures:
    device: str
    rows: int = 0  # rows this run finished here (ok or failed)
    ok: int = 0
    audio_s: float = 0.0
    frames: int = 0  # the workers' decode frames, dead ones' included
    hits: int = 0
    misses: int = 0
    sync_routed: int = 0

    def as_record(self, elapsed: float) -> dict:
        asked = self.hits + self.misses
        return {"device": self.device, "rows": self.rows, "ok": self.ok, "frames": self.frames,
                "audio_s": round(self.audio_s, 3), "frames_per_s": round(self.frames / elapsed, 2),
                "audio_s_per_s": round(self.audio_s / elapsed, 3),
                "async_hit_rate": round(self.hits / asked, 4) if asked else None,
                "query_hits": self.hits, "query_misses": self.misses, "sync_routed_steps": self.sync_routed}


class DeviceProgress(Progress):
    def __init__(self, total: int, quiet: bool, devices: tuple[str, ...]):
        super().__init__(total, quiet)
        self.figures = [DeviceFigures(f"{d}#{i}" if devices.count(d) > 1 else d) for i, d in enumerate(devices)]
        self._steps: dict[int, tuple[int, int, tuple]] = {}  # worker serial -> (its device, its latest counts)

    def __enter__(self) -> "DeviceProgress":
        if not self.quiet and not sys.stderr.isatty():
            print(f"omni: {len(self.figures)} worker processes: "
                  + ", ".join(f.device for f in self.figures), file=sys.stderr, flush=True)
        return super().__enter__()

    def worker_steps(self, serial: int, device: int, counts: tuple[int, int, int, int]) -> None:
        """A worker's cumulative (frames, hits, misses, sync_routed)."""
        with self._lock:
            self._steps[serial] = (device, counts)
            for i, f in enumerate(self.figures):
                mine = [c for d, c in self._steps.values() if d == i]
                f.frames, f.hits, f.misses, f.sync_routed = (sum(c[k] for c in mine) for k in range(4))
            self.frames = sum(f.frames for f in self.figures)
            self.hits, self.misses = sum(f.hits for f in self.figures), sum(f.misses for f in self.figures)
            self.sync_routed = sum(f.sync_routed for f in self.figures)
            self._maybe_draw()

    def device_row(self, device: int, audio_s: float, status: str) -> None:
        f = self.figures[device]
        with self._lock:
            f.rows += 1
            f.ok += status == "ok"
            f.audio_s += audio_s
        self.row_done(audio_s, status)

    def kept(self) -> None:
        """A row an earlier run finished (--resume): not this run's to do."""
        with self._lock:
            self.total -= 1
            self._maybe_draw()

    def records(self) -> list[dict]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return [f.as_record(elapsed) for f in self.figures]

    def device_lines(self) -> list[str]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        out = []
        for f in self.figures:
            asked = f.hits + f.misses
            hit = f", async hit {100 * f.hits / asked:.1f}%" if asked else ""
            out.append(f"{f.device}: {f.rows} rows, {f.frames / elapsed:,.1f} frames/s, "
                       f"{f.audio_s / elapsed:,.2f} audio-s/s{hit}")
        return out

    def _render(self) -> Table:
        t = super()._render()
        for line in self.device_lines():
            device, _, rest = line.partition(": ")
            t.add_row(device, rest)
        return t
