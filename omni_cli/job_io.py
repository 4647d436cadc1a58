"""Where a run's rows come from and its results go: the output folder, its lock, the manifest,
progress and run.json.

`omni generate` in one process owns its output folder (LocalIO). A --devices worker process
(omni_cli/workers.py) and a Ray actor (omni_cli/ray.py) run the same job on their share of the
rows under a parent that owns the folder: they subclass this to take their rows from it, skip the
lock, and send manifest lines, progress and the run record to it.
"""

from __future__ import annotations

from pathlib import Path

from omni_cli.folder import prepare_out_dir, read_manifest_lenient, temporaries
from omni_cli.output import OutputWriter, write_run_json
from omni_cli.progress import Progress
from omni_cli.signals import SignalGuard


class NoLock:
    """The parent holds the folder's lock."""

    def release(self) -> None:
        pass


class LocalIO:
    rows: list | None = None  # None: read from the prompt file

    def guard(self):
        return SignalGuard()

    def lock(self, opts):
        return prepare_out_dir(opts.out, opts.overwrite, opts.resume)

    def load(self, family, spec):
        return family.load(spec)

    def scorers(self, settings, device: str) -> tuple[dict, float]:
        """The enabled scorers, loaded (omni_cli/quality/job.py), and the seconds it took."""
        from omni_cli.quality.job import build_scorers

        return build_scorers(settings, device)

    def done_scoring(self, scorers: dict) -> None:
        for scorer in scorers.values():
            scorer.close()

    def earlier(self, out: Path) -> dict[str, dict]:
        """--resume: the earlier run's manifest rows, by id."""
        return {e["id"]: e for e in read_manifest_lenient(out / "metadata.jsonl")}

    def clear_temporaries(self, out: Path) -> None:
        for p in temporaries(out):  # what a killed run left mid-write
            p.unlink(missing_ok=True)

    def writer(self, out: Path, fmt: str, sample_rate: int, kept: dict, on_row, frame_rate: float = 25.0) -> OutputWriter:
        return OutputWriter(out, fmt, sample_rate, kept, on_row, frame_rate)

    def progress(self, total: int, quiet: bool) -> Progress:
        return Progress(total, quiet)

    def record(self, out: Path, record: dict) -> None:
        write_run_json(out, record)
