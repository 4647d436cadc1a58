"""Issue 32's hostile inputs, each checked before the model loads (omni_cli/validate.py,
omni_cli/prompts.py): a bad value fails its own row with the row's line, id and field, never
the run; a file that cannot be read at all is refused (exit 2); `omni validate` loads nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from omni_cli.errors import OmniError
from omni_cli.prompts import read_prompts
from tests.conftest import REPO, read_manifest, run_cli

HOSTILE = {  # id -> (row fields beyond id/text, the field its error must name)
    "sup5000": ({"suppress_tokens": [5000]}, "suppress_tokens"),
    "supbos": ({"suppress_tokens": [1024]}, "suppress_tokens"),  # the stream-BOS ramp the model forces
    "ras": ({"ras_win_len": 1_000_000_000}, "ras_win_len"),
    "t308": ({"temperature": 1e308}, "temperature"),
    "pen-lo": ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    "pen-hi": ({"repetition_penalty": 1e300}, "repetition_penalty"),
    "frames": ({"max_new_frames": 100_000}, "max_new_frames"),
}


def _hostile_file(tmp_path) -> str:
    lines = [json.dumps({"id": "ok1", "text": "Fine."})]
    lines += [json.dumps({"id": rid, "text": "x", **fields}) for rid, (fields, _) in HOSTILE.items()]
    lines.append('{"id": "tinf", "text": "x", "temperature": Infinity}')  # Python's json reads it
    lines.append('{"id": "surr", "text": "bad \\ud800 text"}')  # a lone surrogate
    lines.append('{"id": "nl\\n", "text": "x"}')  # an id ending in a newline
    lines.append(json.dumps({"id": "ok2", "text": "Fine \u2028 too."}, ensure_ascii=False))  # U+2028 inside a row
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _blocked_load(monkeypatch):
    from omni_cli.runners.higgs_audio_v2.family import HiggsAudioV2

    def load(cls, spec):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(HiggsAudioV2, "load", classmethod(load))


def test_validate_reports_every_hostile_row_by_line_id_and_field_and_loads_nothing(tmp_path, monkeypatch):
    _blocked_load(monkeypatch)
    res = run_cli("validate", _hostile_file(tmp_path))
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("id ")]
    want = {**{rid: (n, field) for n, (rid, (_, field)) in enumerate(HOSTILE.items(), start=2)},
            "tinf": (len(HOSTILE) + 2, "temperature"), "surr": (len(HOSTILE) + 3, "text")}
    for rid, (line, field) in want.items():
        assert any(ln.startswith(f"id {rid!r}: row {line}, field '{field}'") for ln in lines), (rid, lines)
    # the id with a newline is reported at its own line; the U+2028 row is valid, on line 12
    assert any(f"row {len(HOSTILE) + 4}, field 'id'" in ln for ln in lines)
    assert len(lines) == len(want) + 1


def test_generate_fails_hostile_rows_alone(tmp_path):
    out = tmp_path / "out"
    res = run_cli("generate", _hostile_file(tmp_path), "-o", out, "-q", "--max-new-frames", "9", "--seed", "1")
    assert res.exit_code == 1, res.output
    rows = {m["id"]: m for m in read_manifest(out)}
    assert rows["ok1"]["status"] == rows["ok2"]["status"] == "ok"
    assert (out / rows["ok2"]["file_name"]).is_file() and rows["ok2"]["text"] == "Fine \u2028 too."
    for rid, (_, field) in HOSTILE.items():
        assert rows[rid]["status"] == "failed" and f"field '{field}'" in rows[rid]["error"], rows[rid]
    assert rows["surr"]["text"] == "bad \\ud800 text"  # kept, escaped: the manifest stays UTF-8 JSON
    assert len(rows) == len(HOSTILE) + 5  # every input row, each once


@pytest.mark.parametrize("fmt_or_flag", [["--format", "mp3"], ["--suppress-tokens", "5000"], ["--ras-win-len", "99999"]])
def test_bad_flags_are_refused_before_loading(tmp_path, monkeypatch, fmt_or_flag):
    _blocked_load(monkeypatch)
    src = tmp_path / "p.txt"
    src.write_text("hello\n")
    res = run_cli("generate", src, "-o", tmp_path / "out", *fmt_or_flag)
    assert res.exit_code == 2 and "error" in res.output, res.output


def test_too_long_prompt_is_blamed_on_its_text(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"id": "long", "text": "word " * 2000}) + "\n" + json.dumps({"id": "s", "text": "hi"}))
    out = tmp_path / "out"
    res = run_cli("generate", src, "-o", out, "-q", "--max-new-frames", "9")
    assert res.exit_code == 1
    rows = {m["id"]: m for m in read_manifest(out)}
    assert "field 'text'" in rows["long"]["error"] and rows["s"]["status"] == "ok"


def test_bom_is_read_in_jsonl_csv_and_text(tmp_path):
    for name, body in (("p.jsonl", '{"id": "a", "text": "hi"}\n'), ("p.csv", "id,text\na,hi\n"), ("p.txt", "hi\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + body.encode())
        rows = read_prompts(str(path))
        assert [r.error for r in rows] == [None] and rows[0].text == "hi", name


def test_json_array_file_is_rows_not_text(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"id": "a", "text": "one"}, {"id": "b", "text": "two", "seed": 3}, "nope"]))
    rows = read_prompts(str(path))
    assert [(r.id, r.text) for r in rows[:2]] == [("a", "one"), ("b", "two")] and rows[1].seed == 3
    assert rows[2].error.startswith("row 3")
    path.write_text('{"id": "a", "text": "one"}')
    with pytest.raises(OmniError, match="array"):
        read_prompts(str(path))


def test_non_utf8_input_is_refused_naming_the_line(tmp_path, monkeypatch):
    path = tmp_path / "p.txt"
    path.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(OmniError, match="not UTF-8 text: byte 0xff at line 2"):
        read_prompts(str(path))
    proc = subprocess.run([sys.executable, "-m", "omni_cli", "generate", "-", "-o", str(tmp_path / "o")],
                          input=b"ok\n\xfe\n", capture_output=True, cwd=REPO)
    assert proc.returncode == 2 and b"not UTF-8 text" in proc.stderr and b"Traceback" not in proc.stderr


@pytest.mark.parametrize("how", ["dev-stdin", "process-substitution"])
def test_dev_stdin_and_process_substitution_read_as_files(tmp_path, how):
    src = tmp_path / "p.csv"
    src.write_text("id,text\nr1,hello\nr2,there\n")
    arg = "/dev/stdin" if how == "dev-stdin" else f"<(cat {src})"
    cmd = f"{sys.executable} -m omni_cli validate {arg}" + (f" < {src}" if how == "dev-stdin" else "")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "every row is valid" in proc.stderr, proc.stderr


def test_stdin_csv_is_recognised_by_its_header(monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"id,text,seed\nx,hello,4\n")))
    rows = read_prompts("-")
    assert [(r.id, r.text, r.seed) for r in rows] == [("x", "hello", 4)]  # not the header spoken as a row
