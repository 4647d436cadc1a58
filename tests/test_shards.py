"""--shard i/n and `omni merge`: sharded runs merged are one unsharded run, byte for byte.

The oracle for shard membership is the blake2b formula, computed here from hashlib; the
oracle for the merge is an unsharded run of the same prompt file under --deterministic.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import read_manifest, run_cli, write_jsonl

N = 3
FLAGS = ("--deterministic", "--seed", "5", "--max-new-frames", "9")


def formula(rid: str, n: int) -> int:
    return int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest(), "little") % n


def _rows() -> list[dict]:
    rows = [{"id": f"utt-{i:03d}", "text": "word " * (1 + i % 5) + "end."} for i in range(10)]
    rows[3]["max_new_frames"] = 9  # a row's own fields travel with it
    rows.insert(5, {"id": "bad-row", "text": ""})  # fails validation: still in its shard's manifest
    rows.insert(7, {"text": "No id: the line number is its id."})
    return rows


def _files(out: Path) -> dict[str, bytes]:
    """Every result file of an output folder, by relative path: not run.json (per run: its timings, its
    out path), nor the run's empty lock file (.omni.lock, which merge does not copy)."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name not in ("run.json", ".omni.lock")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("shards")
    prompts = write_jsonl(tmp / "prompts.jsonl", _rows())
    res = run_cli("generate", prompts, "-o", tmp / "all", *FLAGS, "-q")
    assert res.exit_code == 1  # the bad row
    shards = []
    for i in range(N):
        res = run_cli("generate", prompts, "-o", tmp / f"shard{i}", "--shard", f"{i}/{N}", *FLAGS, "-q",
                      "--max-batch-size", str(i + 2))  # batching must not matter under --deterministic
        assert res.exit_code in (0, 1), res.output
        shards.append(tmp / f"shard{i}")
    return {"tmp": tmp, "prompts": prompts, "all": tmp / "all", "shards": shards}


@pytest.mark.parametrize("spec", ["3/3", "1/0", "-1/2", "a/b", "1", "0/3/1", ""])
def test_bad_shard_flag_exits_2_before_anything(tmp_path, spec):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--shard", spec)
    assert res.exit_code == 2 and "--shard" in res.output
    assert not (tmp_path / "out").exists()


def test_shard_of_is_the_blake2b_formula_and_covers_every_id_once():
    from omni_cli.shard import Shard, parse_shard, shard_of

    ids = [f"id-{i}" for i in range(500)] + ["1", "row-7", "a.b_c-d", "x" * 200]
    for n in (1, 2, 3, 7, 64):
        assert [shard_of(rid, n) for rid in ids] == [formula(rid, n) for rid in ids]

        class R:  # anything with an id
            def __init__(self, rid):
                self.id = rid

        rows = [R(rid) for rid in ids]
        picked = [r.id for i in range(n) for r in Shard(i, n).select(rows)]
        assert sorted(picked) == sorted(ids)  # each id in exactly one shard
    assert parse_shard(" 2 / 5 ") == Shard(2, 5) and str(Shard(2, 5)) == "2/5"
    # not a salted hash: the same ids land in the same shards in another interpreter
    import subprocess
    import sys

    code = "from omni_cli.shard import shard_of; print([shard_of(f'id-{i}', 7) for i in range(50)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=Path(__file__).parent.parent)
    assert json.loads(other.stdout) == [formula(f"id-{i}", 7) for i in range(50)]


def test_each_shard_holds_its_rows_and_records_its_shard(runs):
    everything = read_manifest(runs["all"])
    assert len(everything) == len(_rows())
    for i, out in enumerate(runs["shards"]):
        ids = [m["id"] for m in read_manifest(out)]
        assert ids == [m["id"] for m in everything if formula(m["id"], N) == i]
        run = json.loads((out / "run.json").read_text())
        assert run["command"]["shard"] == f"{i}/{N}" and run["totals"]["rows"] == len(ids)
        assert {p.stem for p in (out / "audio").iterdir()} == {m["id"] for m in read_manifest(out)
                                                                if m["status"] == "ok"}
    assert sorted(m["id"] for out in runs["shards"] for m in read_manifest(out)) == \
        sorted(m["id"] for m in everything)


def test_merged_shards_are_byte_identical_to_the_unsharded_run(runs, tmp_path):
    merged = tmp_path / "merged"
    res = run_cli("merge", *runs["shards"], "-o", merged)
    assert res.exit_code == 0, res.output
    want, got = _files(runs["all"]), _files(merged)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []  # metadata.jsonl, every wav and npz
    run = json.loads((merged / "run.json").read_text())
    whole = json.loads((runs["all"] / "run.json").read_text())
    assert {k: run["totals"][k] for k in ("rows", "ok", "failed", "frames")} == \
        {k: whole["totals"][k] for k in ("rows", "ok", "failed", "frames")}
    assert [s["shard"] for s in run["merge"]["sources"]] == [f"{i}/{N}" for i in range(N)]
    # what `omni verify` reads: the first shard's config (batch sizes differed by design)
    assert {**run["config"], "max_batch_size": 0} == {**whole["config"], "max_batch_size": 0}
    assert not list(merged.rglob("*.partial*"))


def test_merge_lists_missing_rows_and_shards(runs, tmp_path):
    res = run_cli("merge", *runs["shards"][:2], "-o", tmp_path / "m")
    assert res.exit_code == 1
    lost = [m["id"] for m in read_manifest(runs["all"]) if formula(m["id"], N) == 2]
    assert lost and all(rid in res.output for rid in lost)
    assert f"missing shards: 2/{N}" in res.output
    run = json.loads((tmp_path / "m" / "run.json").read_text())
    assert run["merge"]["missing"] == lost and run["merge"]["missing_shards"] == [f"2/{N}"]
    # what was there is merged all the same
    assert [m["id"] for m in read_manifest(tmp_path / "m")] == \
        [m["id"] for m in read_manifest(runs["all"]) if formula(m["id"], N) != 2]


def test_merge_duplicates_identical_are_merged_once_differing_are_reported(runs, tmp_path):
    copy = shutil.copytree(runs["shards"][0], tmp_path / "copy0")
    res = run_cli("merge", *runs["shards"], copy, "-o", tmp_path / "same")
    assert res.exit_code == 0, res.output
    assert _files(tmp_path / "same") == _files(runs["all"])
    ok = next(m for m in read_manifest(copy) if m["status"] == "ok")
    audio = copy / ok["file_name"]
    audio.write_bytes(audio.read_bytes()[:-2] + b"\x01\x00")  # one sample differs: another row
    res = run_cli("merge", *runs["shards"], copy, "-o", tmp_path / "differ")
    assert res.exit_code == 1
    assert "1 ids that differ between folders" in res.output and ok["id"] in res.output
    # the first folder's row is the one merged
    assert _files(tmp_path / "differ") == _files(runs["all"])


def test_merge_records_a_row_whose_files_are_gone_as_failed(runs, tmp_path):
    copies = [shutil.copytree(s, tmp_path / s.name) for s in runs["shards"]]
    gone = next(m for m in read_manifest(copies[1]) if m["status"] == "ok")
    (copies[1] / gone["logprobs_file"]).unlink()
    res = run_cli("merge", *copies, "-o", tmp_path / "m")
    assert res.exit_code == 1 and gone["id"] in res.output
    row = next(m for m in read_manifest(tmp_path / "m") if m["id"] == gone["id"])
    assert row["status"] == "failed" and row["text"] == gone["text"] and "omni merge" in row["error"]


def test_merge_refuses_what_is_not_one_job(runs, tmp_path):
    (tmp_path / "empty").mkdir()
    res = run_cli("merge", runs["shards"][0], tmp_path / "empty", "-o", tmp_path / "m1")
    assert res.exit_code == 2 and "not an omni output folder" in res.output
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "zzz", "text": "Another file."}])
    run_cli("generate", other, "-o", tmp_path / "o", *FLAGS, "-q")
    res = run_cli("merge", runs["shards"][0], tmp_path / "o", "-o", tmp_path / "m2")
    assert res.exit_code == 2 and "prompt files differ" in res.output
    res = run_cli("merge", *runs["shards"], "-o", runs["all"])  # a folder holding results
    assert res.exit_code == 2 and "already holds results" in res.output
    res = run_cli("merge", runs["shards"][0], "-o", runs["shards"][0])
    assert res.exit_code == 2
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()


def test_an_empty_shard_is_a_folder_merge_accepts(tmp_path):
    assert formula("only", 2) == 1  # so shard 0/2 holds no row
    prompts = write_jsonl(tmp_path / "one.jsonl", [{"id": "only", "text": "Just me."}])
    for i in (0, 1):
        res = run_cli("generate", prompts, "-o", tmp_path / f"s{i}", "--shard", f"{i}/2", *FLAGS, "-q")
        assert res.exit_code == 0, res.output
    assert (tmp_path / "s0" / "metadata.jsonl").read_text() == ""
    assert json.loads((tmp_path / "s0" / "run.json").read_text())["totals"]["rows"] == 0
    res = run_cli("merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "m")
    assert res.exit_code == 0, res.output
    assert _files(tmp_path / "m") == _files(tmp_path / "s1")
    res = run_cli("merge", tmp_path / "s0", "-o", tmp_path / "m0")
    assert res.exit_code == 1 and "missing shards: 1/2" in res.output and "only" in res.output


def test_merge_keeps_manifest_lines_byte_for_byte(tmp_path):
    """Fields merge does not know (another version's) and U+2028 inside a string survive unchanged."""
    lines = []
    for i, (rid, text) in enumerate([("b", "one\u2028two"), ("a", "x")], start=1):
        rec = {"file_name": f"audio/{rid}.wav", "id": rid, "status": "failed", "row": 3 - i, "text": text,
               "error": "e", "future_field": {"k": [1, 2]}}
        lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    for name, line in zip(("x", "y"), lines):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metadata.jsonl").write_text(line, encoding="utf-8")
    res = run_cli("merge", tmp_path / "x", tmp_path / "y", "-o", tmp_path / "m")
    # no run.json: runs killed before their end, whose missing rows cannot be counted: merged, not clean
    assert res.exit_code == 1, res.output
    assert "cannot count" in res.output
    assert (tmp_path / "m" / "metadata.jsonl").read_text(encoding="utf-8") == lines[1] + lines[0]


def test_merge_finds_the_rows_a_killed_shard_lost_wherever_it_runs(runs, tmp_path, monkeypatch):
    """A shard SIGKILLed midway (no run.json, its later rows never written) merged with finished ones,
    from another folder: the finished runs' record of the prompt file (absolute path, sha256, rows)
    lists the missing rows while the file is readable and counts them once it is not."""
    folders = [shutil.copytree(s, tmp_path / s.name) for s in runs["shards"]]
    killed = folders[2]
    (killed / "run.json").unlink()
    lines = (killed / "metadata.jsonl").read_text().splitlines(keepends=True)
    (killed / "metadata.jsonl").write_text(lines[0])
    lost = [json.loads(line)["id"] for line in lines[1:]]
    monkeypatch.chdir(tmp_path)
    res = run_cli("merge", *folders, "-o", tmp_path / "m1")
    assert res.exit_code == 1 and f"{len(lost)} missing rows" in res.output and all(r in res.output for r in lost)
    for f in folders[:2]:  # the prompt file's record names a file this machine lacks
        run = json.loads((f / "run.json").read_text())
        run["prompts"]["path"] = "/nowhere/prompts.jsonl"
        (f / "run.json").write_text(json.dumps(run))
    res = run_cli("merge", *folders, "-o", tmp_path / "m2")
    assert res.exit_code == 1 and f"{len(lost)} rows of the prompt file are in no folder" in res.output, res.output


def test_merge_refuses_a_folder_a_live_run_holds(runs, tmp_path):
    import fcntl
    import os

    live = shutil.copytree(runs["shards"][0], tmp_path / "live")
    fd = os.open(live / ".omni.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a running omni holds it
    try:
        res = run_cli("merge", live, runs["shards"][1], "-o", tmp_path / "m")
    finally:
        os.close(fd)
    assert res.exit_code == 2 and "in use by a running omni run" in res.output
    assert not (tmp_path / "m").exists()
