"""--devices: worker processes on one host, one output folder. The oracle is a one-process
`omni generate --deterministic` of the same prompt file: audio, npz and metadata.jsonl must be
equal byte for byte (run.json differs by design: devices, workers, timings). A SIGKILLed worker
is a real kill of a real worker process (tests/killing.py's hook SIGKILLs it from inside, at an
exact row), and no row is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import JOB_FLAGS, JOB_ROWS, REPO, digests, read_manifest, run_cli, write_jsonl

ROWS, FLAGS = JOB_ROWS, JOB_FLAGS


@pytest.mark.parametrize("args, names", [
    (("--devices", "cpu,cpu", "--shard", "0/2"), "--devices and --shard"),
    (("--ray", "local", "--devices", "cpu,cpu"), "--ray and --devices"),
    (("--devices", "gpu7"), "--devices: unknown device 'gpu7'"),
    (("--devices", "cpu,,cpu"), "--devices: unknown device ''"),
])
def test_bad_devices_flags_exit_2_before_anything(tmp_path, args, names):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", *args)
    assert res.exit_code == 2 and names in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_cuda_devices_that_are_not_there_exit_2(tmp_path):
    import torch

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}])
    have = torch.cuda.device_count()
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--devices", f"0,{have}")
    assert res.exit_code == 2 and f"--devices: {have} does not exist" in res.output, res.output
    if not have:
        res = run_cli("generate", prompts, "-o", tmp_path / "out", "--devices", "all")
        assert res.exit_code == 2 and "--devices all: no CUDA device" in res.output


def test_worker_device_is_its_own_gpu(monkeypatch):
    """--devices 2,3 under CUDA_VISIBLE_DEVICES=4,5,6,7: worker 1 sees physical GPU 7 alone, as cuda:0."""
    import signal

    from omni_cli import worker_process
    from omni_cli.errors import OmniError
    from omni_cli.generate import GenerateOptions

    seen = {}

    def fake_run(opts, io):
        seen.update(visible=os.environ["CUDA_VISIBLE_DEVICES"], devices=opts.devices)
        raise OmniError("stop here")

    class Conn:
        def send(self, msg):
            seen["msg"] = msg

        def close(self):
            pass

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("OMNI_WORKER", "")  # the worker sets it: restored after
    monkeypatch.setattr("omni_cli.generate.run_generate", fake_run)
    monkeypatch.setattr(worker_process, "_watch_parent", lambda pid: None)
    spec = worker_process.WorkerSpec(1, 1, 2, 0, "cuda:3", GenerateOptions(prompts="p", out=Path("o")), [],
                                     os.getpid())
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker_process.worker_main(Conn(), spec)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert seen["visible"] == "7" and seen["devices"] == ("cuda:0",)
    assert seen["msg"] == ("error", "stop here", 2)


def test_two_cpu_workers_write_what_one_process_writes(job_oracle, tmp_path):
    prompts, expected = job_oracle
    out = tmp_path / "two"
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--devices", "cpu,cpu")
    assert res.exit_code == 0, res.output
    assert digests(out) == expected
    run = json.loads((out / "run.json").read_text())
    assert [w["share"] for w in run["workers"]] == ["0/2", "1/2"] and run["device"] == ["cpu", "cpu"]
    assert sum(d["rows"] for d in run["devices"]) == len(ROWS) and run["totals"]["ok"] == len(ROWS)
    assert all(d["rows"] > 0 and d["frames"] > 0 for d in run["devices"])


def omni(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.killing", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=180, env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **env})


def test_a_sigkilled_worker_loses_no_row(job_oracle, tmp_path):
    """Share 1's worker is SIGKILLed after its 2nd row: its share reruns on the survivor's device,
    keeping the 2 rows; the folder ends as one process writes it, and --jsonl-stdout printed each
    row's line once."""
    prompts, expected = job_oracle
    out = tmp_path / "killed"
    res = omni("generate", prompts, "-o", out, *FLAGS, "--devices", "cpu,cpu", "--jsonl-stdout",
               env={"OMNI_TEST_WORKER_KILL": "1:0:2"})
    assert res.returncode == 0, res.stderr
    assert "died (killed by SIGKILL)" in res.stderr and "rerunning them" in res.stderr
    assert digests(out) == expected
    manifest = (out / "metadata.jsonl").read_text(encoding="utf-8")
    assert sorted(res.stdout.splitlines()) == sorted(manifest.splitlines())
    run = json.loads((out / "run.json").read_text())
    ends = [(w["share"], w["attempt"], w["end"]) for w in run["workers"]]
    assert ("1/2", 0, "died: SIGKILL") in ends and ("1/2", 1, "done") in ends
    rerun = next(w for w in run["workers"] if w["attempt"] == 1)
    assert rerun["totals"]["kept"] == 2  # the dead worker's finished rows were not redone


def test_a_share_killed_twice_is_left_for_resume(job_oracle, tmp_path):
    """Share 1's worker and its rerun are both SIGKILLed: its unfinished rows are recorded failed
    (exit 3), every row in input order; --resume then completes the folder as one process writes it."""
    prompts, expected = job_oracle
    out = tmp_path / "twice"
    res = omni("generate", prompts, "-o", out, *FLAGS, "--devices", "cpu,cpu", env={"OMNI_TEST_WORKER_KILL": "1:0,1:1"})
    assert res.returncode == 3, res.stderr
    assert "left for --resume" in res.stderr
    rows = read_manifest(out)
    assert [r["id"] for r in rows] == [r["id"] for r in ROWS]  # every row recorded, in input order
    left = [r for r in rows if r["status"] != "ok"]
    assert left and all("rerun with --resume" in r["error"] for r in left)
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--resume")
    assert res.exit_code == 0, res.output
    assert digests(out) == expected


def test_sigterm_while_a_worker_loads(job_oracle, tmp_path):
    """SIGTERM reaches the parent once share 0 wrote a row, while share 1's worker still loads: the
    workers stop, every row is recorded ok or interrupted, run.json says so (exit 143); --resume
    then completes the folder."""
    prompts, expected = job_oracle
    out = tmp_path / "term"
    res = omni("generate", prompts, "-o", out, *FLAGS, "--devices", "cpu,cpu", env={"OMNI_TEST_WORKER_TERM": f"1:{out}"})
    assert res.returncode == 143, res.stderr
    assert "Traceback" not in res.stderr
    rows = read_manifest(out)
    assert [r["id"] for r in rows] == [r["id"] for r in ROWS]
    statuses = [r["status"] for r in rows]
    assert set(statuses) == {"ok", "interrupted"}, statuses
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["interrupted"] and run["totals"]["exit_code"] == 143
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--resume")
    assert res.exit_code == 0, res.output
    assert digests(out) == expected
