"""`omni generate --ray ADDRESS` and run_ray(): the job as a Ray Data pipeline (pip install
'omni-cli[ray]'), the way vLLM's offline batch inference runs.

The driver reads and checks every row (nothing loads) and locks the output folder, which must be
on a path every node shares. Then: read (a Datasource over the checked rows) -> map_batches onto
an actor pool, one actor per GPU holding a loaded engine, each batch run as the one-process job
(run_generate with the actor's io: its files written into the shared folder, its manifest lines
returned) -> write_json of the lines under OUT/.ray/manifest. Ray Data's row-level checkpointing
(CheckpointConfig, OUT/.ray/checkpoint) is keyed on a column `key`: the row's number and id and
a digest of its input and the run's settings, so a restarted job (--resume) skips the rows
already committed, and a row whose content changed is run again. Each batch also runs under
--resume's rules against the earlier manifest lines, so a row whose files are intact is never
generated twice. At the end the driver writes metadata.jsonl in input order and run.json.
Placement and restarts are Ray's.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import time
from dataclasses import replace
from pathlib import Path

import ray  # absolute (Python 3): the ray package, not this module
import ray.data
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from omni_cli.errors import OmniError
from omni_cli.job_io import LocalIO, NoLock
from omni_cli.output import OutputWriter
from omni_cli.progress import Progress

STATE = ".ray"  # under OUT: Ray's manifest parts and checkpoint
BATCHES_PER_SLOTS = 4  # rows per actor call: this many times --max-batch-size


class _Rows(Datasource):
    """The checked rows as blocks of (key, row, payload, earlier); a Read, so checkpoints filter it."""

    def __init__(self, table: list[dict], blocks: int):
        self._table, self._blocks = table, max(1, blocks)

    def estimate_inmemory_data_size(self):
        return None

    def get_read_tasks(self, parallelism: int, **kwargs) -> list:
        import pyarrow as pa

        n = min(self._blocks, len(self._table)) or 1
        size = -(-len(self._table) // n)
        tasks = []
        for part in (self._table[i:i + size] for i in range(0, len(self._table), size)):
            cols = {k: [r[k] for r in part] for k in ("key", "row", "payload", "earlier")}
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

    def lines(self) -> dict[int, str]:
        with self._lock:
            return dict(self._lines)


class _ActorIO(LocalIO):
    def __init__(self, rows: list, earlier: dict, model):
        self.rows, self._earlier, self._model, self.writer_ = rows, earlier, model, None

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

    def writer(self, out, fmt, sample_rate, kept, on_row):
        self.writer_ = _CollectWriter(out, fmt, sample_rate, kept)
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
        if config.device in ("cpu", "auto"):
            import os

            import torch

            # Ray sets OMP_NUM_THREADS to the actor's CPUs; the CPU codec's rounding follows the thread
            # count (measured: other wav bytes at 1 thread than at 2), so take a plain process's count
            torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.model = family_class(config.family, config.path).load(load_spec(config, self.opts))

    def __call__(self, batch: dict) -> dict:
        from omni_cli.generate import run_generate

        rows = [pickle.loads(p) for p in batch["payload"]]
        earlier = {r.id: json.loads(line) for r, line in zip(rows, batch["earlier"]) if line}
        io = _ActorIO(rows, earlier, self.model)
        run_generate(replace(self.opts, resume=True, overwrite=False, quiet=True, jsonl_stdout=False), io)
        lines = io.writer_.lines() if io.writer_ is not None else {}
        return {"key": list(batch["key"]), "row": list(batch["row"]),
                "line": [lines.get(int(r), "") for r in batch["row"]]}


def _key(r, settings: str) -> str:
    """The checkpoint id: unique per input row, and new when the row or the run's settings change."""
    from omni_cli.results import input_fields

    content = json.dumps([r.row, r.id, input_fields(r, None), r.error, r.reference and r.reference[1], settings],
                         sort_keys=True, default=str)
    return f"{r.row}:{r.id}:{hashlib.sha256(content.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def _earlier_lines(out: Path) -> dict[str, str]:
    """The lines finished rows left: the manifest's, then Ray's parts (oldest first), the last per id."""
    found: dict[str, str] = {}
    sources = [out / "metadata.jsonl"] + sorted((out / STATE / "manifest").glob("*.json"),
                                                key=lambda p: p.stat().st_mtime)
    for path in sources:
        if not path.is_file():
            continue
        for raw in path.read_text(encoding="utf-8").split("\n"):
            try:
                rec = json.loads(raw)
                line = rec["line"] if path.name != "metadata.jsonl" else raw + "\n"
                found[json.loads(line)["id"]] = line
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short, or a row with no line
    return found


def run_ray(opts, actors: int | None = None, actor_cpus: float | None = None, actor_gpus: float | None = None,
            batch_rows: int | None = None):
    """The job on Ray: a RunSummary, as run_generate's. opts.ray is the address (None or local:
    start one here unless this process already joined one; auto: the running cluster); actors,
    actor_cpus, actor_gpus: the pool (default: one actor per GPU, else per CPU but one);
    batch_rows: rows per actor call."""
    from omni_cli.folder import prepare_out_dir
    from omni_cli.generate import EXIT_OK, EXIT_ROWS_FAILED, RunSummary
    from omni_cli.output import write_run_json
    from omni_cli.run_record import versions
    from omni_cli.job_settings import check_job

    t0 = time.perf_counter()
    if opts.shard is not None or opts.devices is not None:
        raise OmniError("--ray excludes --shard and --devices: Ray places the rows")
    config, rows = check_job(opts)
    out = Path(opts.out)
    lock = prepare_out_dir(out, opts.overwrite, opts.resume)
    try:
        state = out / STATE
        if opts.overwrite:
            shutil.rmtree(state, ignore_errors=True)
        elif not opts.resume and any((state / "manifest").glob("*")):
            raise OmniError(f"{out} holds a Ray job's results ({state}); pass --resume to continue that job, "
                            "--overwrite to replace it, or choose another folder")
        LocalIO().clear_temporaries(out)
        earlier = _earlier_lines(out) if opts.resume else {}
        _connect(opts.ray)
        settings = json.dumps({k: str(v) for k, v in opts.__dict__.items()
                               if k not in ("out", "quiet", "jsonl_stdout", "resume", "overwrite", "ray")}
                              | {"config": config.as_dict()}, sort_keys=True, default=str)
        table = [{"key": _key(r, settings), "row": r.row, "payload": pickle.dumps(r),
                  "earlier": earlier.get(r.id, "")} for r in rows]
        per_call = batch_rows or BATCHES_PER_SLOTS * config.max_batch_size
        gpus = ray.cluster_resources().get("GPU", 0)
        cpus = ray.cluster_resources().get("CPU", 1)
        # no GPU: half the CPUs to the actors; the reads, the checkpoint filter and the writes need the rest
        if actors is None:
            actors = int(gpus) if gpus >= 1 else max(1, int(cpus) // 2)
        if actor_gpus is None:
            actor_gpus = 1 if gpus >= 1 else 0
        if actor_cpus is None:
            actor_cpus = 1 if gpus >= 1 else 0.5
        from ray.data.checkpoint import CheckpointConfig

        ctx = ray.data.DataContext.get_current()
        saved = ctx.checkpoint_config
        ctx.checkpoint_config = CheckpointConfig(id_column="key", checkpoint_path=str((state / "checkpoint").resolve()),
                                                 delete_checkpoint_on_success=False)
        try:
            light = {"num_cpus": 0.1}  # reading and writing lines: the CPUs are the actors' and the filter's
            ds = ray.data.read_datasource(_Rows(table, -(-len(table) // per_call)), num_cpus=light["num_cpus"])
            ds = ds.map_batches(OmniActor, fn_constructor_args=(pickle.dumps(replace(opts, ray=None)),),
                                batch_size=per_call, concurrency=actors, num_cpus=actor_cpus, num_gpus=actor_gpus)
            ds.write_json(str((state / "manifest").resolve()), ray_remote_args=light)
        finally:
            ctx.checkpoint_config = saved
        found = _earlier_lines(out)  # this run's parts, over the earlier lines
        writer, recs = OutputWriter(out, opts.fmt, 0), []
        for r in rows:
            line = found.get(r.id)
            if line is not None and json.loads(line).get("row") == r.row:
                writer.add_line(r.row, line)
                recs.append(json.loads(line))
            else:  # no actor wrote it (Ray gave up on its batch)
                from omni_cli.results import input_fields

                writer.write_failed(r.row, r.id, input_fields(r, None), "not finished: the Ray job did not "
                                    "write it; rerun with --resume")
        writer.close()
        ok = sum(rec.get("status") == "ok" for rec in recs)
        code = EXIT_OK if ok == len(rows) else EXIT_ROWS_FAILED
        write_run_json(out, {
            "versions": versions(), "config": config.as_dict(), "device": "ray", "dtype": config.dtype,
            "command": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()},
            "totals": {"rows": len(rows), "ok": ok, "failed": len(rows) - ok, "interrupted": False,
                       "frames": sum(rec.get("frames") or 0 for rec in recs),
                       "audio_s": round(sum(rec.get("duration_s") or 0.0 for rec in recs), 3), "exit_code": code},
            "timings": {"wall_s": round(time.perf_counter() - t0, 3)},
            "ray": {"address": opts.ray, "actors": actors, "actor_cpus": actor_cpus, "actor_gpus": actor_gpus,
                    "batch_rows": per_call, "resources": ray.cluster_resources()},
        })
        return RunSummary(total=len(rows), ok=ok, failed=len(rows) - ok, interrupted=False, exit_code=code)
    finally:
        lock.release()


def _connect(address: str | None) -> None:
    """Ray's address forms: local (or None) starts a cluster here, auto joins the running one,
    ray://host:port a remote one. A process that already joined one keeps it."""
    if ray.is_initialized():
        return
    ray.init(address=None if address in (None, "local") else address, include_dashboard=False,
             log_to_driver=False)
