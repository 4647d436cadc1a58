"""--ray / omni_cli.ray.run_ray on a local Ray (ray.init(num_cpus=2), one session for the module).
The oracle is a one-process `omni generate --deterministic` of the same prompt file: audio, npz and
metadata.jsonl equal byte for byte. A job SIGKILLed midway (the driver and the Ray cluster it
started, as a process group) and started again with --resume writes each row once: every id once in
the manifest, and the rows Ray had committed before the kill are not generated again (their files
are the same inodes, untouched)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, read_manifest, run_cli, write_jsonl

ray = pytest.importorskip("ray")

ROWS = [{"id": f"r{i}", "text": f"row number {i} says" + " more" * (i % 4), "max_new_frames": 6 + (i * 5) % 17}
        for i in range(12)]
ROWS.insert(4, {"id": "bad", "text": ""})  # fails validation: a failed row in every manifest
FLAGS = ("--deterministic", "--seed", "3", "--max-batch-size", "1", "-q")  # 4 rows an actor call


def results(out: Path) -> dict[str, str]:
    files = [out / "metadata.jsonl", *sorted((out / "audio").iterdir()), *sorted((out / "logprobs").iterdir())]
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    prompts = write_jsonl(tmp / "p.jsonl", ROWS)
    res = run_cli("generate", prompts, "-o", tmp / "one", *FLAGS)
    assert res.exit_code == 1, res.output  # the bad row
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield prompts, results(tmp / "one")
    ray.shutdown()


def test_cli_writes_what_one_process_writes(session, tmp_path):
    prompts, expected = session
    out = tmp_path / "cli"
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--ray", "local")  # joins this module's session
    assert res.exit_code == 1, res.output  # the bad row, as one process
    assert results(out) == expected
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
    """`omni generate --ray local` (a cluster of its own) SIGKILLed with its cluster once Ray has
    committed a batch; then the Python API, under this module's ray.init(num_cpus=2), with 2 actors."""
    from omni_cli.generate import GenerateOptions
    from omni_cli.ray import run_ray

    prompts, expected = session
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "omni_cli", "generate", str(prompts), "-o", str(out), *FLAGS, "--resume",
           "--ray", "local"]
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
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local cluster it started
    proc.wait()
    done = committed_ids(out)
    assert done and len(done) < len(ROWS)  # midway: some rows committed, not all
    before = {rid: os.stat(out / "audio" / f"{rid}.wav").st_ino for rid in done if rid != "bad"}
    opts = GenerateOptions(prompts=str(prompts), out=out, seed=3, max_batch_size=1, deterministic=True,
                           quiet=True, resume=True, ray="local")
    summary = run_ray(opts, actors=2, actor_cpus=0.4)  # 2 CPUs: the checkpoint filter takes one
    assert summary.exit_code == 1 and summary.ok == len(ROWS) - 1
    assert results(out) == expected
    assert [r["id"] for r in read_manifest(out)] == [r.get("id", str(i + 1)) for i, r in enumerate(ROWS)]
    assert {rid: os.stat(out / "audio" / f"{rid}.wav").st_ino for rid in before} == before  # not redone
