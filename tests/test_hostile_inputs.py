"""Hostile input, round two (issue 43): one test per class of defect. Each names the class; each
would fail on the tree before the fix (the defect's symptom is what it asserts against)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import REPO, read_manifest, run_cli, write_jsonl

FAST = ("--max-new-frames", "9", "--seed", "1", "-q")
HUGE = 10**30  # past int64, as a user's typo makes it


def _blocked_load(monkeypatch):
    from omni_cli.job_io import LocalIO

    def load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(LocalIO, "load", load)


# ---- 1: an integer past what the device holds fails its row (field) or the job (flag), never the run ----

@pytest.mark.parametrize("field", ["top_k", "ras_win_len", "ras_win_max_num_repeat", "max_new_frames",
                                   "min_new_frames", "suppress_tokens", "temperature", "top_p", "min_p",
                                   "repetition_penalty"])
def test_an_integer_of_any_size_in_any_numeric_field_fails_its_row_alone(tmp_path, field):
    value = [HUGE] if field == "suppress_tokens" else HUGE
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "good", "text": "Fine."}, {"id": "bad", "text": "x", field: value},
                                                 {"id": "good2", "text": "Fine too."}])
    res = run_cli("validate", prompts)
    assert res.exit_code == 2 and f"id 'bad': row 2, field '{field}'" in res.output, res.output
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FAST)
    assert res.exit_code == 1, res.output  # not 3: the run went on
    m = {r["id"]: r for r in read_manifest(out)}
    assert m["good"]["status"] == m["good2"]["status"] == "ok"
    assert m["bad"]["status"] == "failed" and m["bad"]["error"].startswith(f"row 2, field '{field}'")
    assert m["bad"][field] == value  # the input as given, kept


@pytest.mark.parametrize("flag", ["--top-k", "--ras-win-len", "--ras-win-max-num-repeat", "--max-new-frames",
                                  "--min-new-frames", "--max-batch-size", "--temperature"])
def test_an_integer_flag_past_its_range_refuses_the_job_before_anything_loads(tmp_path, monkeypatch, flag):
    _blocked_load(monkeypatch)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", flag, str(10**20), "-q")
    assert res.exit_code == 2 and flag in res.output, res.output
    assert not (tmp_path / "out").exists()  # refused before the folder was made


# ---- 2: omni bench's default shape is refused at once without CUDA ----

def test_bench_refuses_the_3b_shape_without_a_gpu_and_says_what_runs(monkeypatch):
    import torch

    import omni_cli.bench as bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "random_model", lambda *a, **k: pytest.fail("a model was built"))
    res = run_cli("bench")
    assert res.exit_code == 2 and "--shape tiny-higgs-audio-v2 --device cpu" in res.output, res.output
    monkeypatch.setattr("omni_cli.runners.device.host_available", lambda: 8 << 30)  # 8 GiB free
    res = run_cli("bench", "--device", "cpu", "--batch", "1")
    assert res.exit_code == 2 and "GiB is available" in res.output, res.output


# ---- 4: a closed stdout ends the NDJSON lines, not the run ----

def test_jsonl_stdout_into_head_finishes_every_row(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}"} for i in range(12)])
    out = tmp_path / "out"
    cmd = (f"cat {prompts} | {sys.executable} -m omni_cli generate - -o {out} --jsonl-stdout --max-new-frames 9 "
           f"--seed 1 | head -2")
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr  # omni's own status: every row ok
    assert len(res.stdout.splitlines()) == 2
    assert [m["status"] for m in read_manifest(out)] == ["ok"] * 12
    assert "stdout closed after" in res.stderr and "Traceback" not in res.stderr
    assert json.loads((out / "run.json").read_text())["totals"]["failed"] == 0


# ---- 5: a write fault at the end is exit 3, one line, no temporaries; --resume completes ----

def test_a_full_disk_at_the_end_is_exit_3_and_resume_completes(tmp_path, monkeypatch):
    import errno

    from pathlib import Path

    from omni_cli import output

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"row {i}"} for i in range(4)])
    out = tmp_path / "out"
    real_write, real_close = Path.write_bytes, output.OutputWriter.close
    full = {"on": False}

    def write_bytes(self, data):  # the disk fills halfway through a temporary
        if full["on"] and self.name.endswith(".tmp"):
            real_write(self, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, data)

    def close(self):  # from the final manifest rewrite on
        full["on"] = True
        real_close(self)

    with monkeypatch.context() as mp:
        mp.setattr(Path, "write_bytes", write_bytes)
        mp.setattr(output.OutputWriter, "close", close)
        res = run_cli("generate", prompts, "-o", out, "--max-new-frames", "9", "--seed", "1")
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output and "rewriting the manifest in input order failed: No space left" in res.output
    assert not list(out.rglob("*.tmp")) and not list(out.rglob("*partial*"))
    assert sorted(m["id"] for m in read_manifest(out)) == [f"r{i}" for i in range(4)]  # as it stood, appended
    res = run_cli("generate", prompts, "-o", out, "--max-new-frames", "9", "--seed", "1", "--resume", "-q")
    assert res.exit_code == 0, res.output
    assert [m["id"] for m in read_manifest(out)] == [f"r{i}" for i in range(4)]
    assert json.loads((out / "run.json").read_text())["totals"]["kept"] == 4


# ---- 6: ids the tool makes up never take one the file gives ----

def test_generated_ids_never_collide_with_given_ones(tmp_path):
    lines = ['{"id": "a/b", "text": "bad id"}', '{"id": "row-1", "text": "given row-1"}',
             '{"text": "no id on line 3"}', '{"id": "3", "text": "given 3"}', '{"id": "3", "text": "dup"}']
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    res = run_cli("validate", prompts)
    assert "id 'a/b' (written as " in res.output and "id '3' (written as " in res.output, res.output
    out = tmp_path / "out"
    run_cli("generate", prompts, "-o", out, *FAST)
    m = read_manifest(out)
    ids = [r["id"] for r in m]
    assert len(set(ids)) == 5 and ids[1] == "row-1" and ids[3] == "3"  # given ids kept, every id unique
    assert m[2]["status"] == m[3]["status"] == "ok" and m[1]["status"] == "ok"
    assert m[0]["given_id"] == "a/b" and m[4]["given_id"] == "3" and "duplicate" in m[4]["error"]
    assert len(list((out / "audio").iterdir())) == 3  # one file per ok row: none overwritten


# ---- 7: a failed row keeps its input whatever the format ----

def test_a_csv_row_with_a_bad_cell_keeps_its_input(tmp_path):
    path = tmp_path / "p.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerows([["id", "text", "top_k", "scene"], ["x", "hello", "5", ""], ["y", "keep me", "lots", "a hall"]])
    out = tmp_path / "out"
    run_cli("generate", path, "-o", out, *FAST)
    bad = read_manifest(out)[1]
    assert bad["status"] == "failed" and bad["id"] == "y"
    assert bad["text"] == "keep me" and bad["scene"] == "a hall" and bad["top_k"] == "lots"


# ---- 8: a row never comes out ok with no audio ----

def test_too_few_frames_for_audio_are_refused_with_the_smallest_that_gives_some(tmp_path, monkeypatch):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}, {"id": "b", "text": "x", "max_new_frames": 8}])
    res = run_cli("generate", prompts, "-o", tmp_path / "o1", "--max-new-frames", "8", "-q")
    assert res.exit_code == 2 and "at least 9" in res.output
    out = tmp_path / "o2"
    res = run_cli("generate", prompts, "-o", out, *FAST)
    m = {r["id"]: r for r in read_manifest(out)}
    assert m["b"]["status"] == "failed" and "at least 9" in m["b"]["error"]
    assert m["a"]["status"] == "ok" and sf.info(out / m["a"]["file_name"]).frames > 0


def test_a_row_that_ends_before_its_first_frame_of_audio_fails(tmp_path):
    from omni_cli.output import OutputWriter
    from omni_cli.progress import Progress
    from omni_cli.prompts import PromptRow
    from omni_cli.results import RowResults
    from omni_cli.runners.sampling.params import SamplingParams

    writer = OutputWriter(tmp_path, "wav", 24000)
    results = RowResults(writer, Progress(1, True), lambda t: np.ones(t.shape, bool), True)
    tokens = np.full((9, 8), 1024)
    ok = results.write_row(PromptRow(row=1, id="a", text="Hi."), "sys", "h", 1, "stop", SamplingParams(), tokens,
                           np.zeros((9, 8), np.float32), None, np.zeros(0, np.int16))
    writer.close()
    assert not ok and results.failed == 1 and not (tmp_path / "audio" / "a.wav").exists()
    assert "generated no audio" in read_manifest(tmp_path)[0]["error"]


# ---- 9: what validate passes, generate never fails for a reason known before the load ----

def _clip(path, seconds: float, rate: int = 24000, subtype: str = "PCM_16"):
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, subtype=subtype)
    return path.name


def test_validate_and_generate_agree_on_references(tmp_path):
    good = _clip(tmp_path / "good.wav", 0.5)
    long = _clip(tmp_path / "long.wav", 600, rate=1000, subtype="PCM_U8")  # 600 s: the context takes ~19 s
    full = (tmp_path / "good.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(full[:100])  # a copy cut short: 28 samples of a promised 12,000
    short = _clip(tmp_path / "short.wav", 0.004)  # too short for the encoder's first frame
    rows = [{"id": "plain", "text": "Hello."}, {"id": "ref", "text": "Hi.", "ref_audio": good, "ref_text": "A."},
            {"id": "long", "text": "Hi.", "ref_audio": long, "ref_text": "A."},
            {"id": "cut", "text": "Hi.", "ref_audio": "cut.wav", "ref_text": "A."},
            {"id": "short", "text": "Hi.", "ref_audio": short, "ref_text": "A."},
            {"id": "url", "text": "Hi.", "ref_audio": "https://example.com/a.wav", "ref_text": "A."},
            {"id": "words", "text": "word " * 600}, {"id": "special", "text": "say <|AUDIO_OUT|> now"}]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    res = run_cli("validate", prompts, "--chunk-method", "none")
    said = {line.split("'")[1]: line for line in res.output.splitlines() if line.startswith("id '")}
    assert set(said) == {"long", "cut", "short", "url", "words", "special"}, res.output
    assert "context" in said["long"] and "cut short" in said["cut"] and "too short" in said["short"]
    assert "is a URL" in said["url"] and "/https:" not in said["url"]
    out = tmp_path / "out"
    run_cli("generate", prompts, "-o", out, *FAST, "--chunk-method", "none")
    failed = {r["id"] for r in read_manifest(out) if r["status"] != "ok"}
    assert failed == set(said)  # generate fails exactly what validate named: nothing new after the load


# ---- 10: impossible flags refuse the job, as --temperature -1 does ----

@pytest.mark.parametrize("flags, named", [(("--max-new-frames", "1000000000"), "max_seq_len"),
                                          (("--min-new-frames", "50", "--max-new-frames", "20"), "exceeds")])
def test_impossible_flags_exit_2_before_loading(tmp_path, monkeypatch, flags, named):
    _blocked_load(monkeypatch)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", *flags)
    assert res.exit_code == 2 and named in res.output and not (tmp_path / "out").exists()


# ---- 11: stdin is read as a file is, and sniffed only when its first record parses ----

@pytest.mark.parametrize("text, looks", [("text, the first line\nsecond\n", "CSV"), ("{not json\nsecond\n", "JSONL"),
                                         ("[not a list\n", "JSON")])
def test_stdin_that_only_looks_structured_is_read_as_text_lines(monkeypatch, capsys, text, looks):
    from omni_cli.prompts import read_prompts

    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    rows = read_prompts("-")
    assert [r.text for r in rows] == [ln for ln in text.splitlines() if ln] and all(r.error is None for r in rows)
    assert f"looks like {looks}" in capsys.readouterr().err


def test_input_format_forces_a_reading(tmp_path):
    from omni_cli.prompts import read_prompts

    path = tmp_path / "p.data"
    path.write_text('{"id": "a", "text": "hi"}\n')
    assert read_prompts(str(path))[0].id == "a"  # sniffed: a JSON object
    assert read_prompts(str(path), "txt")[0].text == '{"id": "a", "text": "hi"}'
    res = run_cli("validate", path, "--input-format", "yaml")
    assert res.exit_code == 2 and "--input-format must be one of" in res.output


# ---- 12: a long row says how far it is (its resume after a signal: tests/test_longform.py) ----

def test_a_long_row_reports_its_chunks_as_they_finish(tmp_path, monkeypatch):
    from omni_cli import progress

    monkeypatch.setattr(progress, "CHUNK_LINE_S", 0.0)  # every chunk's line, not one in ten seconds
    text = " ".join(f"Sentence number {i} is here." for i in range(4))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "long", "text": text, "chunk": "sentence"}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--max-new-frames", "9", "--seed", "1")
    assert res.exit_code == 0, res.output
    said = [line for line in res.output.splitlines() if "long rows:" in line]
    assert [line.split("long rows: ")[1].split(" ")[0] for line in said] == ["1/4", "2/4", "3/4", "4/4"]


# ---- 13: small things a user notices ----

def test_a_finished_run_leaves_no_lock_and_a_refusal_no_folder(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi."}])
    out = tmp_path / "out"
    assert run_cli("generate", prompts, "-o", out, *FAST).exit_code == 0
    assert not (out / ".omni.lock").exists()
    res = run_cli("generate", prompts, "-o", tmp_path / "o2", "--suppress-tokens", "1024", "-q")
    assert res.exit_code == 2 and not (tmp_path / "o2").exists()


def test_masked_seeds_warn_and_invisible_text_is_refused(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hi.", "seed": 2**31},
                                                 {"id": "b", "text": "\u200b\u200d\ufeff"}])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "--max-new-frames", "9", "--seed", str(2**31 + 5))
    assert "--seed: seed 2147483653 is outside" in res.output and "row 1, field 'seed'" in res.output
    m = {r["id"]: r for r in read_manifest(out)}
    assert m["a"]["seed"] == 0 and m["b"]["status"] == "failed" and "field 'text'" in m["b"]["error"]


def test_interrupted_rows_are_not_counted_as_failed(tmp_path, monkeypatch):
    from omni_cli import progress

    calls = {"n": 0}
    real = progress.Progress.step

    def step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(progress.Progress, "step", step)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": "Hi."} for i in range(6)])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--max-new-frames", "30", "--max-batch-size", "2")
    assert res.exit_code == 130
    totals = json.loads((tmp_path / "out" / "run.json").read_text())["totals"]
    assert totals["failed"] == 0 and totals["interrupted_rows"] == 6 - totals["ok"] > 0
    assert "0 failed" not in res.output and "interrupted" in res.output


def test_unreadable_audio_is_named_by_its_path():
    from pathlib import Path

    from omni_cli.voices import read_clip

    path = Path(REPO / "README.md")
    with pytest.raises(ValueError) as e:
        read_clip(path)
    assert str(path) in str(e.value) and "BytesIO" not in str(e.value)


def test_help_texts_name_every_format_and_exit_code():
    assert ".ndjson" in run_cli("generate", "--help").output and ".json array" in run_cli("generate", "--help").output
    merge = run_cli("merge", "--help").output
    assert "list[" not in merge and "<path>..." in merge
    assert "Exit codes" in run_cli("verify", "--help").output
