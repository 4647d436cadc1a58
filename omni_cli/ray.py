"""`omni generate --ray ADDRESS` and run_ray(): the job as a Ray Data pipeline (pip install
'omni-cli[ray]'), the way vLLM's offline batch inference runs. This is the driver; the actor
side is omni_cli/ray_actor.py.

The driver reads and checks every row (nothing loads) and locks the output folder, which must
be on a path every node shares; rows that fail those checks it records itself. The rest: read
(RowSource) -> map_batches onto a pool of OmniActor (one per GPU, each holding a loaded engine;
a batch runs as the one-process job under --resume's rules) -> write_json of the manifest lines
under OUT/.ray/manifest. Ray Data's row-level checkpoint (OUT/.ray/checkpoint) is keyed on a
column `key`: the row's number and id and a digest of its input and the run's settings, so a
restarted job skips committed rows and a changed row runs again. A row an earlier job committed
counts only while its line is ok and its files still match it (a later job may have replaced
them); the others run again in a second pass without the checkpoint. The driver writes
metadata.jsonl in input order and run.json. Placement and restarts are Ray's.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import ray  # absolute (Python 3): the ray package, not this module
import ray.data

from omni_cli.errors import OmniError
from omni_cli.folder import row_intact
from omni_cli.job_io import LocalIO
from omni_cli.output import OutputWriter, StdoutLines
from omni_cli.ray_actor import OmniActor, RowSource
from omni_cli.signals import SignalGuard, exit_code

STATE = ".ray"  # under OUT: Ray's manifest parts and checkpoint
BATCHES_PER_SLOTS = 4  # rows per actor call: this many times --max-batch-size
LIGHT_CPUS = 0.1  # reading rows and writing lines: the CPUs are the actors' and the checkpoint filter's


def run_ray(opts, actors: int | None = None, actor_cpus: float | None = None, actor_gpus: float | None = None,
            batch_rows: int | None = None):
    """The job on Ray: a RunSummary, as run_generate's. opts.ray is the address (None or local:
    start one here unless this process already joined one; auto: the running cluster); actors,
    actor_cpus, actor_gpus: the pool (default: one actor per GPU, else one per two CPUs);
    batch_rows: rows per actor call."""
    from omni_cli.folder import prepare_out_dir
    from omni_cli.job_settings import check_job

    from omni_cli.job_settings import with_family_defaults

    t0 = time.perf_counter()
    if opts.shard is not None or opts.devices is not None:
        raise OmniError("--ray excludes --shard and --devices: Ray places the rows")
    opts = with_family_defaults(opts)
    config, rows, info = check_job(opts)
    out = Path(opts.out)
    with SignalGuard() as guard:  # the first SIGINT/SIGTERM: Ray's finished rows kept, the rest interrupted
        lock = prepare_out_dir(out, opts.overwrite, opts.resume)
        try:
            _check_state(out, opts)
            LocalIO().clear_temporaries(out)
            job = _Job(opts, config, rows, out, batch_rows, guard)
            job.prompt_info = info
            job.run(actors, actor_cpus, actor_gpus)
            return job.finish(t0)
        except KeyboardInterrupt as e:  # before the job started: nothing to record
            from omni_cli.generate import nothing_ran

            return nothing_ran(len(rows), exit_code(e))
        finally:
            lock.release()


def _check_state(out: Path, opts) -> None:
    state = out / STATE
    if opts.overwrite:
        shutil.rmtree(state, ignore_errors=True)
    elif not opts.resume and any((state / "manifest").glob("*")):
        raise OmniError(f"{out} holds a Ray job's results ({state}); pass --resume to continue that job, "
                        "--overwrite to replace it, or choose another folder")


class _Job:
    def __init__(self, opts, config, rows: list, out: Path, batch_rows: int | None, guard: SignalGuard):
        self.opts, self.config, self.rows, self.out, self.guard = opts, config, rows, out, guard
        self.prompt_info: dict = {}  # the prompt file's identity (run.json: prompts)
        self.todo = [r for r in rows if r.error is None]  # the others failed the checks: the driver records them
        self.old_parts = set(_parts(out))  # earlier jobs' lines
        self.per_call = batch_rows or BATCHES_PER_SLOTS * config.max_batch_size
        self.keys: dict[int, str] = {}  # input row -> its checkpoint id
        self.pool: dict = {}
        self.stopped: BaseException | None = None  # a signal
        self.fault: Exception | None = None  # Ray gave up, or the job itself failed
        self._good: dict[tuple, bool] = {}  # (part, line) -> ok with its files intact

    def run(self, actors, actor_cpus, actor_gpus) -> None:
        try:
            if self.todo:
                earlier = _lines_by_id(self.out) if self.opts.resume else {}
                _connect(self.opts.ray)
                settings = json.dumps({k: str(v) for k, v in self.opts.__dict__.items()
                                       if k not in ("out", "quiet", "jsonl_stdout", "resume", "overwrite", "ray")}
                                      | {"config": self.config.as_dict()}, sort_keys=True, default=str)
                self.keys = {r.row: _key(r, settings) for r in self.todo}
                self.pool = _pool(actors, actor_cpus, actor_gpus)
                self._pipeline(self.todo, earlier, checkpoint=True)
                redo = [r for r in self.todo if r.row not in self._collect()]
                if redo:  # committed by an earlier job, but not ok or its files replaced since
                    self._pipeline(redo, _lines_by_id(self.out), checkpoint=False)
        except KeyboardInterrupt as e:  # SIGINT, SIGTERM (omni_cli/signals.py)
            self.stopped = e
        except Exception as e:  # noqa: BLE001  (recorded: every row still ends in the manifest)
            self.fault = e
        finally:
            self.guard.may_raise = False  # from here a first signal is only recorded

    def _pipeline(self, rows: list, earlier: dict[str, str], checkpoint: bool) -> None:
        from ray.data.checkpoint import CheckpointConfig

        table = [{"key": self.keys[r.row], "row": r.row, "payload": pickle.dumps(r),
                  "earlier": earlier.get(r.id, "")} for r in rows]
        state = self.out / STATE
        ctx = ray.data.DataContext.get_current()
        saved = ctx.checkpoint_config
        ctx.checkpoint_config = CheckpointConfig(id_column="key", checkpoint_path=str((state / "checkpoint").resolve()),
                                                 delete_checkpoint_on_success=False) if checkpoint else None
        try:
            ds = ray.data.read_datasource(RowSource(table, -(-len(table) // self.per_call)), num_cpus=LIGHT_CPUS)
            ds = ds.map_batches(OmniActor, fn_constructor_args=(pickle.dumps(replace(self.opts, ray=None)),),
                                batch_size=self.per_call, concurrency=self.pool["actors"],
                                num_cpus=self.pool["actor_cpus"], num_gpus=self.pool["actor_gpus"])
            ds.write_json(str((state / "manifest").resolve()), ray_remote_args={"num_cpus": LIGHT_CPUS})
        finally:
            ctx.checkpoint_config = saved

    def _collect(self) -> dict[int, tuple[str, bool]]:
        """Each row's line by its key (the newest part holding it) and whether this job wrote it.
        An earlier job's line counts only while ok with its files intact."""
        found = _lines_by_key(self.out)
        lines = {}
        for r in self.todo:
            line, part = found.get(self.keys.get(r.row), ("", None))
            if not line:
                continue
            fresh = part not in self.old_parts
            if not fresh and (part, line) not in self._good:
                rec = json.loads(line)
                self._good[part, line] = row_intact(self.out, rec)  # ok or rejected, its files whole
            if fresh or self._good[part, line]:
                lines[r.row] = (line, fresh)
        return lines

    def finish(self, t0: float):
        """metadata.jsonl in input order and run.json; a RunSummary."""
        from omni_cli.generate import EXIT_OK, EXIT_ROWS_FAILED, EXIT_RUN_FAILED, RunSummary

        found = self._collect()
        lines = self._write_manifest(found)
        recs = {row: json.loads(line) for row, line in lines.items()}
        ok = sum(rec.get("status") == "ok" for rec in recs.values())
        rejected = sum(rec.get("status") == "rejected" for rec in recs.values())
        signum = None if self.stopped is None else exit_code(self.stopped) - 128
        signum = signum or self.guard.signum  # a signal while finishing counts too
        if signum is not None:
            code = 128 + signum
        elif self.fault is not None or len(found) < len(self.todo):
            code = EXIT_RUN_FAILED
        else:
            code = EXIT_OK if ok + rejected == len(self.rows) else EXIT_ROWS_FAILED
        stdout = StdoutLines() if self.opts.jsonl_stdout else None
        for row in sorted(lines):  # this run's lines: all but an earlier job's, as one process keeps those
            if not found.get(row, ("", True))[1]:
                continue
            error = recs[row].get("error") if recs[row].get("status") == "failed" else None
            if error:  # errors are printed even under --quiet, naming the row
                where = "" if error.startswith(f"row {row}") else f"row {row} (id {recs[row].get('id')}): "
                print(f"omni: {where}{error}", file=sys.stderr, flush=True)
            if stdout is not None:
                stdout(lines[row])
        wall = time.perf_counter() - t0
        self._record(list(recs.values()), ok, code, signum is not None, sum(not fresh for _, fresh in found.values()),
                     wall)
        if self.fault is not None:
            print(f"omni: error: the Ray job failed: {type(self.fault).__name__}: {self.fault}", file=sys.stderr)
        if not self.opts.quiet:
            print(f"omni: {'interrupted: ' if signum else ''}{ok}/{len(self.rows)} rows ok in {wall:.1f}s on Ray",
                  file=sys.stderr, flush=True)
        if stdout is not None and stdout.note():
            print(f"omni: {stdout.note()}", file=sys.stderr, flush=True)
        return RunSummary(total=len(self.rows), ok=ok, failed=len(self.rows) - ok - rejected,
                          interrupted=signum is not None, exit_code=code, rejected=rejected)

    def _write_manifest(self, found: dict) -> dict[int, str]:
        """Every row's line: Ray's, else the checks' error, else why it did not finish."""
        from omni_cli.results import input_fields

        writer = OutputWriter(self.out, self.opts.fmt, 0, {row: line for row, (line, _) in found.items()})
        if self.stopped is not None:
            status, why = "interrupted", "interrupted before it finished"
        else:
            cause = f"the Ray job failed: {type(self.fault).__name__}: {self.fault}" if self.fault else \
                "the Ray job did not write it"
            status, why = "failed", f"not finished: {cause}; rerun with --resume"
        for r in self.rows:
            if r.error is not None:  # as one process records a row the checks failed
                writer.write_failed(r.row, r.id, input_fields(r, None), r.error)
            elif r.row not in found:
                system = r.system if r.system is not None else self.config.system_prompt
                writer.write_failed(r.row, r.id, input_fields(r, system), why, status=status)
        lines = writer.lines()
        writer.close()
        return lines

    def _record(self, recs: list[dict], ok: int, code: int, interrupted: bool, kept: int, wall: float) -> None:
        from omni_cli.output import write_run_json
        from omni_cli.run_record import versions

        write_run_json(self.out, {
            "versions": versions(), "config": self.config.as_dict(), "device": "ray", "dtype": self.config.dtype,
            "command": {k: (str(v) if isinstance(v, Path) else v) for k, v in self.opts.__dict__.items()},
            "prompts": self.prompt_info,
            "totals": {"rows": len(self.rows), "ok": ok, "interrupted": interrupted,
                       **{key: sum(rec.get("status") == status for rec in recs) for key, status in
                          (("failed", "failed"), ("rejected", "rejected"), ("interrupted_rows", "interrupted"),
                           ("skipped_rows", "skipped"))},
                       "frames": sum(rec.get("frames") or 0 for rec in recs),
                       "audio_s": round(sum(rec.get("duration_s") or 0.0 for rec in recs), 3),
                       "kept": kept,  # rows an earlier job committed, skipped by the checkpoint
                       "exit_code": code,
                       "run_error": None if self.fault is None else f"{type(self.fault).__name__}: {self.fault}"},
            "timings": {"wall_s": round(wall, 3)},
            "ray": {"address": self.opts.ray, **self.pool, "batch_rows": self.per_call,
                    "resources": ray.cluster_resources() if ray.is_initialized() else None},
        })


def _key(r, settings: str) -> str:
    """The checkpoint id: unique per input row, and new when the row or the run's settings change."""
    from omni_cli.results import input_fields

    content = json.dumps([r.row, r.id, input_fields(r, None), r.reference and r.reference[1], settings],
                         sort_keys=True, default=str)
    return f"{r.row}:{r.id}:{hashlib.sha256(content.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def _pool(actors, actor_cpus, actor_gpus) -> dict:
    """Default: one actor per GPU; with none, one per two CPUs at half a CPU each (the reads, the
    checkpoint filter and the writes need the rest)."""
    gpus = ray.cluster_resources().get("GPU", 0)
    cpus = ray.cluster_resources().get("CPU", 1)
    return {"actors": actors or (int(gpus) if gpus >= 1 else max(1, int(cpus) // 2)),
            "actor_cpus": actor_cpus if actor_cpus is not None else (1 if gpus >= 1 else 0.5),
            "actor_gpus": actor_gpus if actor_gpus is not None else (1 if gpus >= 1 else 0)}


def _parts(out: Path) -> list[Path]:
    """Ray's manifest parts, oldest first."""
    return sorted((out / STATE / "manifest").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)


def _part_lines(path: Path):
    """(key, line) of each whole record of a part; a record cut short is passed over."""
    for raw in path.read_text(encoding="utf-8").split("\n"):
        try:
            rec = json.loads(raw)
            if rec["line"]:
                yield rec["key"], rec["line"]
        except (ValueError, KeyError, TypeError):
            continue


def _lines_by_key(out: Path) -> dict[str, tuple[str, Path]]:
    """Every part's lines by checkpoint key: the newest part's, and which part."""
    return {key: (line, part) for part in _parts(out) for key, line in _part_lines(part)}


def _lines_by_id(out: Path) -> dict[str, str]:
    """The newest line each id has: the manifest's, then Ray's parts, oldest first."""
    found: dict[str, str] = {}
    path = out / "metadata.jsonl"
    for raw in path.read_text(encoding="utf-8").split("\n") if path.is_file() else ():
        try:
            found[json.loads(raw)["id"]] = raw + "\n"
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short
    for part in _parts(out):
        for _, line in _part_lines(part):
            found[json.loads(line)["id"]] = line
    return found


def _connect(address: str | None) -> None:
    """Ray's address forms: local (or None) starts a cluster here, auto joins the running one,
    ray://host:port a remote one. A process that already joined one keeps it."""
    if ray.is_initialized():
        return
    ray.init(address=None if address in (None, "local") else address, include_dashboard=False,
             log_to_driver=False)
