"""The Ray side of `omni generate --ray` (omni_cli/ray.py is the driver): the rows as a Ray Data
Datasource, and the actor that holds a loaded engine and runs each batch as the one-process job."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path

from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from omni_cli.job_io import LocalIO, NoLock
from omni_cli.output import OutputWriter
from omni_cli.progress import Progress

COLUMNS = ("key", "row", "payload", "earlier")  # checkpoint id, input row, pickled PromptRow, its earlier line


class RowSource(Datasource):
    """The checked rows as blocks of COLUMNS; a Read, so Ray Data's checkpoint filters it."""

    def __init__(self, table: list[dict], blocks: int):
        self._table, self._blocks = table, max(1, blocks)

    def estimate_inmemory_data_size(self):
        return None

    def get_read_tasks(self, parallelism: int, **kwargs) -> list:
        import pyarrow as pa

        size = max(1, -(-len(self._table) // self._blocks))
        tasks = []
        for part in (self._table[i:i + size] for i in range(0, len(self._table), size)):
            cols = {k: [r[k] for r in part] for k in COLUMNS}
            meta = BlockMetadata(num_rows=len(part), size_bytes=None, input_files=None, exec_stats=None)
            tasks.append(ReadTask(lambda cols=cols: [pa.table(cols)], meta))
        return tasks


class _CollectWriter(OutputWriter):
    """Files into the shared folder; the manifest lines stay here, for the batch's output."""

    def _open_manifest(self) -> int:
        return -1

    def _emit(self, row: int, line: str) -> None:
        pass

    def close(self) -> None:
        pass


class _ActorIO(LocalIO):
    """A batch's rows, the loaded model and the batch's earlier lines; no lock, no handlers."""

    def __init__(self, rows: list, earlier: dict, model, scorer_cache: dict):
        self.rows, self._earlier, self._model, self.writer_ = rows, earlier, model, None
        self._scorer_cache = scorer_cache  # the actor's: scorers load once, on its first call

    def scorers(self, settings, device: str) -> tuple[dict, float]:
        if "built" not in self._scorer_cache:
            self._scorer_cache["built"] = super().scorers(settings, device)[0]
        return self._scorer_cache["built"], 0.0

    def done_scoring(self, scorers: dict) -> None:
        pass  # kept for the actor's next call

    def guard(self):
        from omni_cli.signals import SignalGuard

        return SignalGuard(())  # Ray stops actors; no handler of ours

    def lock(self, opts):
        return NoLock()

    def load(self, family, spec):
        return self._model

    def earlier(self, out: Path) -> dict:
        return self._earlier

    def clear_temporaries(self, out: Path) -> None:
        pass  # other actors write theirs meanwhile

    def writer(self, out, fmt, sample_rate, kept, on_row, frame_rate: float = 25.0):
        self.writer_ = _CollectWriter(out, fmt, sample_rate, kept, None, frame_rate)
        return self.writer_

    def progress(self, total: int, quiet: bool):
        return Progress(total, quiet=True)

    def record(self, out, record: dict) -> None:
        pass


class OmniActor:
    """One per GPU (or CPU share): the engine loaded once; each call runs a batch of rows."""

    def __init__(self, opts_blob: bytes):
        from omni_cli.job_settings import load_spec, settings
        from omni_cli.runners.family import family_class

        self.opts = pickle.loads(opts_blob)
        config, _ = settings(self.opts)
        if config.device in ("cpu", "auto"):  # as one process: Ray set the actor's threads to its CPU share
            from omni_cli.runners.device import use_all_cpu_threads

            use_all_cpu_threads()
        self.model = family_class(config.family, config.path).load(load_spec(config, self.opts))
        self.scorer_cache: dict = {}

    def __call__(self, batch: dict) -> dict:
        from omni_cli.generate import run_generate

        rows = [pickle.loads(p) for p in batch["payload"]]
        earlier = {r.id: json.loads(line) for r, line in zip(rows, batch["earlier"]) if line}
        io = _ActorIO(rows, earlier, self.model, self.scorer_cache)
        # --resume's rules against the batch's earlier lines: a row whose files are intact is kept
        run_generate(replace(self.opts, resume=True, overwrite=False, quiet=True, jsonl_stdout=False), io)
        lines = io.writer_.lines() if io.writer_ is not None else {}
        return {"key": list(batch["key"]), "row": list(batch["row"]),
                "line": [lines.get(int(r), "") for r in batch["row"]]}
