"""`omni generate` end to end on the embedded default, in-process."""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf

from tests.conftest import read_manifest, run_cli, write_jsonl


def test_bad_rows_fail_alone_and_are_recorded(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "text": "hello"},
        {"id": "b", "text": "x", "top_p": 2},
        {"id": "c", "text": "has <|AUDIO_OUT|> inside"},
        {"id": "d", "text": "too long", "max_new_frames": 100000},
        {"id": "e", "text": "world"},
    ])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "--seed", "1", "--max-new-frames", "12")
    assert res.exit_code == 1  # some rows failed; the rest were written
    m = {r["id"]: r for r in read_manifest(out)}
    assert [r["id"] for r in read_manifest(out)] == ["a", "b", "c", "d", "e"]  # input order
    assert m["a"]["status"] == m["e"]["status"] == "ok"
    assert (out / "audio/a.wav").is_file() and (out / "logprobs/e.npz").is_file()
    assert m["b"]["status"] == "failed" and "row 2, field 'top_p'" in m["b"]["error"]
    assert "row 3, field 'text'" in m["c"]["error"] and "special token" in m["c"]["error"]
    assert "row 4, field 'max_new_frames'" in m["d"]["error"] and "max_seq_len" in m["d"]["error"]
    assert not (out / "audio/b.wav").exists()
    assert "row 2, field 'top_p'" in res.output


def test_refuses_to_overwrite_results(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    out = tmp_path / "out"
    assert run_cli("generate", prompts, "-o", out, "--max-new-frames", "10", "-q").exit_code == 0
    res = run_cli("generate", prompts, "-o", out, "--max-new-frames", "10", "-q")
    assert res.exit_code == 2 and "already holds results" in res.output
    assert run_cli("generate", prompts, "-o", out, "--max-new-frames", "10", "-q", "--overwrite").exit_code == 0


def test_usage_errors_exit_2(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    res = run_cli("generate", prompts, "-o", tmp_path / "o1", "--model", "no-such-model")
    assert res.exit_code == 2 and "no such config file" in res.output
    res = run_cli("generate", prompts, "-o", tmp_path / "o2", "--temperature", "-1")
    assert res.exit_code == 2 and "temperature" in res.output
    res = run_cli("generate", prompts, "-o", tmp_path / "o3", "--format", "mp3")
    assert res.exit_code == 2 and "--format" in res.output
    res = run_cli("generate", tmp_path / "missing.jsonl", "-o", tmp_path / "o4")
    assert res.exit_code == 2 and "does not exist" in res.output


def test_flac_and_stdin(tmp_path):
    out = tmp_path / "out"
    res = run_cli("generate", "-", "-o", out, "--format", "flac", "-q", "--temperature", "0",
                  stdin='{"id": "s1", "text": "from stdin", "max_new_frames": 20}\n')
    assert res.exit_code == 0, res.output
    (row,) = read_manifest(out)
    assert row["file_name"] == "audio/s1.flac"
    audio, sr = sf.read(out / row["file_name"])
    assert sr == 24000 and len(audio) == round(row["duration_s"] * sr)
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["ok"] == 1 and run["totals"]["frames"] == row["frames"] == 20
    assert {"torch", "transformers", "omni_cli"} <= set(run["versions"])
    z = np.load(out / "logprobs/s1.npz")
    assert z["tokens"].shape == z["logprobs"].shape == z["mask"].shape == (20, 8)


def test_a_row_whose_files_cannot_be_written_fails_alone(tmp_path, monkeypatch):
    import omni_cli.output as output

    real_write = output.sf.write

    def write(path, *a, **k):
        if ".b.partial" in str(path):
            raise OSError(28, "No space left on device")
        return real_write(path, *a, **k)

    monkeypatch.setattr(output.sf, "write", write)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": i, "text": f"row {i}"} for i in ("a", "b", "c")])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "-q", "--max-new-frames", "10")
    assert res.exit_code == 1
    m = {r["id"]: r for r in read_manifest(tmp_path / "out")}
    assert m["a"]["status"] == m["c"]["status"] == "ok"
    assert m["b"]["status"] == "failed" and "row 2: writing its outputs failed" in m["b"]["error"]
    assert "No space left" in m["b"]["error"]
