"""--resume after a kill at any moment, and SIGTERM: the folder ends byte-identical to an
uninterrupted run (--deterministic, --seed), each id once, no temporary left. Subprocesses: the
signals are real (tests/killing.py sends them from inside the run, at exact moments)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import JOB_FLAGS, JOB_ROWS, REPO, digests, read_manifest, run_cli, write_jsonl

ROWS, FLAGS = JOB_ROWS, JOB_FLAGS


def omni(*args, kill: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMNI_TEST_KILL=kill or "", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", "tests.killing", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def leftovers(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.name.endswith(".tmp") or ".partial" in p.name]


@pytest.fixture(scope="module")
def reference(job_oracle):
    return job_oracle


def check_resumed(out: Path, prompts: Path, expected: dict[str, str], resume: bool = True) -> None:
    # in this process: the run after the kill needs no signal, and a subprocess would only add its start-up
    res = run_cli("generate", prompts, "-o", out, *FLAGS, *(["--resume"] if resume else []))
    assert res.exit_code == 0, res.output
    assert digests(out) == expected
    ids = [r["id"] for r in read_manifest(out)]
    assert ids == [r["id"] for r in ROWS]  # each id once, in input order
    assert not leftovers(out)


def loadable(out: Path) -> list[dict]:
    """The manifest as a strict reader sees it: whole lines, strict JSON (no NaN/Infinity)."""
    data = (out / "metadata.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n")

    def refuse(name):
        raise ValueError(f"non-JSON constant {name}")

    return [json.loads(x, parse_constant=refuse) for x in data.splitlines()]


# before the first row (then a plain rerun, no flag: an empty manifest must not block it), mid-run
# after a random number of rows, and during the final manifest rewrite
@pytest.mark.parametrize("kill", ["before", f"mid:{random.Random().randint(1, len(ROWS) - 1)}", "rewrite"])
def test_sigkill_then_resume_is_byte_identical(reference, tmp_path, kill):
    prompts, expected = reference
    out = tmp_path / "out"
    res = omni("generate", prompts, "-o", out, *FLAGS, kill=kill)
    assert res.returncode == -9, (kill, res.returncode, res.stderr)
    loadable(out)  # whatever moment it died at
    check_resumed(out, prompts, expected, resume=kill != "before")


def test_sigterm_finishes_like_sigint_then_resume(reference, tmp_path):
    prompts, expected = reference
    out = tmp_path / "out"
    res = omni("generate", prompts, "-o", out, *FLAGS, kill="term:3")
    assert res.returncode == 143, res.stderr
    rows = loadable(out)
    assert [r["id"] for r in rows] == [r["id"] for r in ROWS]  # every row accounted for
    assert {r["status"] for r in rows} == {"ok", "interrupted"}
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["interrupted"] is True and run["totals"]["exit_code"] == 143
    assert not leftovers(out)
    check_resumed(out, prompts, expected)


def test_second_sigterm_exits_at_once_without_corrupting_files(reference, tmp_path):
    prompts, expected = reference
    out = tmp_path / "out"
    res = omni("generate", prompts, "-o", out, *FLAGS, kill="term2:3")
    assert res.returncode in (130, 143), res.stderr
    assert not (out / "run.json").exists()  # it left at once: the first signal's finishing never ran
    for r in loadable(out):  # every row the manifest calls ok has its whole files
        if r["status"] == "ok":
            assert hashlib.sha256((out / r["file_name"]).read_bytes()).hexdigest() == r["audio_sha256"]
            assert hashlib.sha256((out / r["logprobs_file"]).read_bytes()).hexdigest() == r["logprobs_sha256"]


def test_resume_redoes_changed_and_damaged_rows_only(tmp_path):
    rows = [{"id": f"a{i}", "text": f"short row {i}", "max_new_frames": 9} for i in range(4)]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out"
    flags = ("--deterministic", "--seed", "5", "-q")
    assert run_cli("generate", prompts, "-o", out, *flags).exit_code == 0
    before = {r["id"]: r for r in read_manifest(out)}
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "logprobs").iterdir()}
    rows[1]["text"] = "a different text"  # changed content: redone, with a warning
    write_jsonl(prompts, rows)
    (out / "logprobs" / "a2.npz").write_bytes(b"damaged")  # a file that no longer matches its sha256
    res = run_cli("generate", prompts, "-o", out, *flags, "--resume")
    assert res.exit_code == 0, res.output
    assert "row 2 (id a1) changed" in res.output
    after = {r["id"]: r for r in read_manifest(out)}
    assert after["a1"]["text"] == "a different text" and after["a1"]["row_hash"] != before["a1"]["row_hash"]
    assert hashlib.sha256((out / "logprobs" / "a2.npz").read_bytes()).hexdigest() == before["a2"]["logprobs_sha256"]
    for rid in ("a0", "a3"):  # kept: not rewritten
        assert (out / "logprobs" / f"{rid}.npz").stat().st_mtime_ns == mtimes[f"{rid}.npz"]
        assert after[rid] == before[rid]
