"""--ray / omni_cli.ray.run_ray on a local Ray (ray.init(num_cpus=2), one session for the module).
The oracle is a one-process `omni generate --deterministic` of the same prompt file: audio, npz and
metadata.jsonl equal byte for byte. A job SIGKILLed midway (its driver, joined to this module's
cluster) and started again with --resume writes each row once: every id once in the manifest, and
the rows Ray had committed before the kill are not generated again (their files are the same
inodes, untouched)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import JOB_ROWS, REPO, digests, read_manifest, run_cli, write_jsonl

ray = pytest.importorskip("ray")

ROWS = [*JOB_ROWS[:4], {"id": "bad", "text": ""}, *JOB_ROWS[4:]]  # row 5 fails validation, in every manifest
FLAGS = ("--deterministic", "--seed", "3", "--max-batch-size", "1", "-q")  # 4 rows an actor call


def inodes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (out / "audio").iterdir()}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    prompts = write_jsonl(tmp / "p.jsonl", ROWS)
    res = run_cli("generate", prompts, "-o", tmp / "one", *FLAGS)
    assert res.exit_code == 1, res.output  # the bad row
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield prompts, digests(tmp / "one")
    ray.shutdown()


def test_cli_writes_what_one_process_writes(session, tmp_path):
    prompts, expected = session
    out = tmp_path / "cli"
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--ray", "local")  # joins this module's session
    assert res.exit_code == 1, res.output  # the bad row, as one process
    assert "row 5, field 'text'" in res.output  # its error, named, as one process prints it
    assert digests(out) == expected
    run = json.loads((out / "run.json").read_text())
    assert run["ray"]["actors"] == 1 and run["totals"]["ok"] == len(ROWS) - 1


def committed_ids(out: Path) -> set[str]:
    """The ids in Ray's manifest parts whose checkpoint is committed (2-phase commit: a part whose
    checkpoint is still .pending is deleted when the job restarts)."""
    ckpt = {p.name[:-len(".parquet")] for p in (out / ".ray" / "checkpoint").glob("*.parquet")
            if not p.name.endswith(".pending.parquet")}
    parts = [p for p in (out / ".ray" / "manifest").glob("*.json") if p.stem in ckpt]
    return {json.loads(json.loads(x)["line"])["id"] for p in parts for x in p.read_text().splitlines()}


def test_killed_job_started_again_writes_each_row_once(session, tmp_path):
    """`omni generate --ray ADDRESS` SIGKILLed once Ray has committed a batch, then started again
    through the Python API with 2 actors. One committed row's file is replaced in between, behind
    the checkpoint's back: that row alone runs again."""
    from omni_cli.generate import GenerateOptions
    from omni_cli.ray import run_ray

    prompts, expected = session
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "omni_cli", "generate", str(prompts), "-o", str(out), *FLAGS, "--resume",
           "--ray", ray.get_runtime_context().gcs_address]
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if committed_ids(out):
                break
        except (OSError, ValueError):  # a part being written
            pass
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver: Ray ends its job's actors and tasks
    proc.wait()
    done = sorted(committed_ids(out))
    assert len(done) > 1 and len(done) < len(ROWS) - 1  # midway: some rows committed, not all
    victim, kept = done[0], {f"{rid}.wav": inodes(out)[f"{rid}.wav"] for rid in done[1:]}
    (out / "audio" / f"{victim}.wav").write_bytes(b"not the row's audio")
    opts = GenerateOptions(prompts=str(prompts), out=out, seed=3, max_batch_size=1, deterministic=True,
                           quiet=True, resume=True, ray="local")
    summary = run_ray(opts, actors=2, actor_cpus=0.4)  # 2 CPUs: the checkpoint filter takes one
    assert summary.exit_code == 1 and summary.ok == len(ROWS) - 1
    assert digests(out) == expected  # the victim's file regenerated
    assert [r["id"] for r in read_manifest(out)] == [r.get("id", str(i + 1)) for i, r in enumerate(ROWS)]
    assert {f: inodes(out)[f] for f in kept} == kept  # the other committed rows not redone


@pytest.mark.parametrize("stop, code, status", [("fault", 3, "failed"), ("sigterm", 143, "interrupted")])
def test_a_failed_or_stopped_ray_job_records_every_row(session, tmp_path, monkeypatch, stop, code, status):
    """The pipeline raises (Ray gave up) or SIGTERM lands in it: every row is in the manifest, in input
    order, the bad one with its own error, the rest failed for --resume or interrupted; run.json written."""
    from omni_cli import ray as omni_ray
    from omni_cli.signals import Interrupted

    def pipeline(self, rows, earlier, checkpoint):
        raise RuntimeError("Ray gave up") if stop == "fault" else Interrupted(signal.SIGTERM)

    monkeypatch.setattr(omni_ray._Job, "_pipeline", pipeline)
    prompts, _ = session
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--ray", "local")
    assert res.exit_code == code, res.output
    rows = read_manifest(out)
    assert [r["id"] for r in rows] == [r.get("id", str(i + 1)) for i, r in enumerate(ROWS)]
    assert rows[4]["status"] == "failed" and rows[4]["error"].startswith("row 5, field 'text'")
    assert all(r["status"] == status for r in rows[:4] + rows[5:])
    if stop == "fault":
        assert all("Ray gave up" in r["error"] and "rerun with --resume" in r["error"] for r in rows[:4] + rows[5:])
        assert "row 1 (id r0): not finished" in res.output  # each error printed names its row
    assert json.loads((out / "run.json").read_text())["totals"]["exit_code"] == code
