"""The output folder is one run's: the lock, --overwrite, an earlier run's results, problems found
before the model loads (exit 2)."""

from __future__ import annotations

import fcntl
import os

import pytest

from tests.conftest import read_manifest, run_cli, write_jsonl

FAST = ("--max-new-frames", "9", "--seed", "1", "-q")


@pytest.fixture
def no_load(monkeypatch):
    """A run that reaches the model load fails the test: these problems must be found before it."""
    from omni_cli.job_io import LocalIO

    def refuse(*a, **k):
        raise AssertionError("the model family was loaded")

    monkeypatch.setattr(LocalIO, "load", refuse)


def test_a_second_run_into_a_locked_folder_is_refused(tmp_path, no_load):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "hi"}])
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".omni.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running omni holds it
    try:
        res = run_cli("generate", prompts, "-o", out, *FAST)
    finally:
        os.close(fd)
    assert res.exit_code == 2
    assert "in use by another omni run" in res.output
    assert not (out / "metadata.jsonl").exists()


def test_unwritable_folder_and_unknown_format_fail_before_loading(tmp_path, no_load):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "hi"}])
    (tmp_path / "file").write_text("")
    res = run_cli("generate", prompts, "-o", tmp_path / "file" / "out", *FAST)  # under a file: not creatable
    assert res.exit_code == 2 and "cannot write to the output folder" in res.output
    res = run_cli("generate", prompts, "-o", tmp_path / "o2", "--format", "mp3", *FAST)
    assert res.exit_code == 2 and "--format" in res.output


def test_earlier_results_need_resume_or_overwrite(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "hi"}])
    out = tmp_path / "out"
    assert run_cli("generate", prompts, "-o", out, *FAST).exit_code == 0
    res = run_cli("generate", prompts, "-o", out, *FAST)
    assert res.exit_code == 2 and "--resume" in res.output and "--overwrite" in res.output


def test_overwrite_removes_only_what_the_previous_run_wrote(tmp_path):
    out = tmp_path / "out"
    first = write_jsonl(tmp_path / "p1.jsonl", [{"id": "old1", "text": "hi"}, {"id": "old2", "text": "there"}])
    assert run_cli("generate", first, "-o", out, *FAST).exit_code == 0
    planted = [out / "notes.txt", out / "audio" / "mine.wav", out / "logprobs" / "mine.npz"]
    for p in planted:
        p.write_bytes(b"not omni's")
    (out / "audio" / ".old1.partial.wav").write_bytes(b"half")  # a temporary a killed run left
    second = write_jsonl(tmp_path / "p2.jsonl", [{"id": "new", "text": "again"}])
    res = run_cli("generate", second, "-o", out, "--overwrite", *FAST)
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in read_manifest(out)] == ["new"]
    assert sorted(p.name for p in (out / "audio").iterdir()) == ["mine.wav", "new.wav"]
    assert sorted(p.name for p in (out / "logprobs").iterdir()) == ["mine.npz", "new.npz"]
    assert all(p.read_bytes() == b"not omni's" for p in planted)
