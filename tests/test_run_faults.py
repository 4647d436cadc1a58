"""A row's fault fails that row alone; a fault of the whole run is exit 3 with every row recorded;
--max-failures, --quiet, the manifest's strict JSON, the summary after an interrupt."""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import read_manifest, run_cli, write_jsonl

FAST = ("--max-new-frames", "9", "--seed", "1")


def strict_rows(out) -> list[dict]:
    def refuse(name):
        raise ValueError(f"non-JSON constant {name}")

    return [json.loads(line, parse_constant=refuse) for line in (out / "metadata.jsonl").read_text().splitlines()]


def test_a_run_fault_is_exit_3_with_every_row_recorded(tmp_path, monkeypatch):
    from omni_cli import generate

    real_loop = generate.run_loop

    class Failing:  # the runner, until its 4th step: then the device is lost
        def __init__(self, runner):
            self._runner, self._n = runner, 0

        def __getattr__(self, name):
            return getattr(self._runner, name)

        def execute(self, so):
            self._n += 1
            if self._n == 4:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return self._runner.execute(so)

    monkeypatch.setattr(generate, "run_loop", lambda sched, runner, *a: real_loop(sched, Failing(runner), *a))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}"} for i in range(6)])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "--max-batch-size", "2", "--no-async-decode", *FAST)
    assert res.exit_code == 3, res.output
    assert "the run failed" in res.output
    rows = strict_rows(out)
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(6)]
    unfinished = [r for r in rows if r["status"] != "ok"]
    assert unfinished and all("illegal memory access" in r["error"] and r["text"] for r in unfinished)
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["exit_code"] == 3 and "illegal memory access" in run["totals"]["run_error"]


def test_a_fault_before_the_loop_is_exit_3_with_every_row_recorded(tmp_path, monkeypatch):
    """The warm-up (graph captures, first codec calls) fails: every row is recorded failed with the
    run's error and run.json is written, as for a fault mid-run (not a crash that hides the error)."""
    from omni_cli import generate

    def failing_warm_up(*a):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(generate, "_warm_up", failing_warm_up)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}"} for i in range(3)])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FAST)
    assert res.exit_code == 3, res.output
    assert "the run failed" in res.output and "stream is capturing" in res.output
    rows = strict_rows(out)
    assert [r["id"] for r in rows] == ["r0", "r1", "r2"]
    assert all(r["status"] == "failed" and "stream is capturing" in r["error"] for r in rows)
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["exit_code"] == 3 and "stream is capturing" in run["totals"]["run_error"]
    # the whole traceback, down to the frame that raised (the message alone did not say where)
    assert "failing_warm_up" in "".join(run["totals"]["run_traceback"])


def test_one_rows_write_fault_fails_that_row_alone(tmp_path, monkeypatch):
    from omni_cli.output import OutputWriter

    real = OutputWriter.encode_ok

    def encode_ok(self, rid, *a, **k):
        if rid == "r1":
            raise KeyError("something no one expected")  # not an OSError: still this row's alone
        return real(self, rid, *a, **k)

    monkeypatch.setattr(OutputWriter, "encode_ok", encode_ok)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}", "top_k": 7} for i in range(4)])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FAST)
    assert res.exit_code == 1, res.output
    rows = {r["id"]: r for r in strict_rows(out)}
    assert rows["r1"]["status"] == "failed" and "row 2" in rows["r1"]["error"]
    assert rows["r1"]["text"] == "row 1" and rows["r1"]["top_k"] == 7  # its input kept, to fix it from there
    assert [rows[i]["status"] for i in ("r0", "r2", "r3")] == ["ok"] * 3


def test_a_lone_surrogate_fails_its_row_only(tmp_path):
    # json.dumps escapes the surrogate as \ud800: a valid JSON line whose text Python cannot encode
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "fine"}, {"id": "b", "text": "bad \ud800"},
                                                 {"id": "c", "text": "fine too"}])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FAST, "-q")
    assert res.exit_code == 1, res.output
    rows = strict_rows(out)
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert "row 2" in rows[1]["error"]


def test_manifest_is_strict_json():
    from omni_cli.output import json_line

    line = json_line({"id": "x", "mean_logprob": float("nan"), "w": [1.0, float("-inf")], "ok": 0.5})
    row = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert row["mean_logprob"] is None and row["w"] == [1.0, None] and row["ok"] == 0.5
    assert sorted(row["nonfinite"]) == ["mean_logprob", "w[1]"]


def test_hostile_sampling_values_fail_their_rows_and_leave_a_strict_manifest(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "hot", "text": "hi", "temperature": 1e308},
                                                 {"id": "pen", "text": "hi", "repetition_penalty": 1e-300},
                                                 {"id": "pen2", "text": "hi", "repetition_penalty": 1e300},
                                                 {"id": "fine", "text": "hi"}])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FAST, "-q")
    assert res.exit_code == 1
    rows = strict_rows(out)
    assert [(r["id"], r["status"]) for r in rows] == [("hot", "failed"), ("pen", "failed"), ("pen2", "failed"),
                                                      ("fine", "ok")]  # never garbage marked ok
    for i, r in enumerate(rows[:3], 1):
        assert f"row {i}" in r["error"]
    assert np.isfinite(np.load(out / rows[3]["logprobs_file"])["logprobs"]).all()


def test_max_failures_quiet_and_kept_input(tmp_path):
    rows = [{"id": "a", "text": "one"}, {"id": "b", "text": "two", "bogus": 1}, {"id": "c", "text": "three"},
            {"id": "d", "text": "four", "top_p": 0.5}]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FAST, "-q", "--max-failures", "1")
    assert res.exit_code == 1
    assert "row 2" in res.output  # --quiet prints errors
    got = {r["id"]: r for r in strict_rows(out)}
    assert got["b"]["status"] == "failed"
    assert {got[i]["status"] for i in "acd"} == {"skipped"}
    assert got["d"]["top_p"] == 0.5 and got["d"]["text"] == "four"


def test_summary_after_an_interrupt_says_so(tmp_path, monkeypatch):
    from omni_cli import progress

    real_step, calls = progress.Progress.step, [0]

    def step(self, *a, **k):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real_step(self, *a, **k)

    monkeypatch.setattr(progress.Progress, "step", step)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}"} for i in range(4)])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "--max-new-frames", "12", "--max-batch-size", "2")
    assert res.exit_code == 130
    assert "omni: interrupted:" in res.output
    assert len(read_manifest(out)) == 4
    assert np.all([r["status"] in ("ok", "interrupted") for r in read_manifest(out)])


def test_stdin_to_jsonl_stdout_pipeline(tmp_path):
    """cat prompts | omni generate - --jsonl-stdout | a JSON parser: every stdout line is a manifest row."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}"} for i in range(5)]
                          + [{"id": "bad", "text": "x", "top_k": "many"}])
    out = tmp_path / "out"
    parse = "import json,sys; [print(json.loads(l, parse_constant=lambda c: 1/0)['id']) for l in sys.stdin]"
    cmd = (f"cat {prompts} | {sys.executable} -m omni_cli generate - -o {out} --jsonl-stdout "
           f"--max-new-frames 9 --seed 1 | tee {tmp_path / 'stdout'} | {sys.executable} -c \"{parse}\"")
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr  # the bad row failed; the pipeline's status is omni's
    assert sorted(res.stdout.split()) == sorted([f"r{i}" for i in range(5)] + ["bad"])
    lines = (tmp_path / "stdout").read_text().splitlines()
    assert sorted(json.loads(x)["id"] for x in lines) == sorted(r["id"] for r in read_manifest(out))
    assert {json.dumps(json.loads(x), sort_keys=True) for x in lines} == \
        {json.dumps(r, sort_keys=True) for r in read_manifest(out)}  # the manifest's rows, as written
    assert "generating" in res.stderr  # logs stay on stderr
    if shutil.which("jq"):
        jq = subprocess.run(["jq", "-c", ".id"], input="\n".join(lines), capture_output=True, text=True)
        assert jq.returncode == 0 and len(jq.stdout.split()) == len(lines)
