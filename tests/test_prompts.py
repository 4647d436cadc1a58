"""Prompt files: JSONL, text, CSV, stdin; bad rows fail alone, naming row and field."""

from __future__ import annotations

import io
import sys

import pytest

from omni_cli.errors import OmniError
from omni_cli.prompts import read_prompts


def _w(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_jsonl_rows_and_errors(tmp_path):
    src = _w(tmp_path, "p.jsonl", "\n".join([
        '{"id": "a", "text": "hello", "seed": 5, "temperature": 0.7, "top_k": 3, "top_p": 0.9, "max_new_frames": 9}',
        '{"id": "b", "text": ""}',
        '{"id": "c", "text": "x", "temperature": -1}',
        '{"id": "d", "text": "x", "top_p": 0}',
        'not json',
        '',
        '{"id": "a", "text": "dup"}',
        '{"id": "e", "text": "x", "colour": "red"}',
        '{"id": "../evil", "text": "x"}',
        '{"id": 7, "text": "int id", "scene": "room", "system": "sys"}',
    ]))
    rows = read_prompts(src)
    by = {r.row: r for r in rows}
    assert by[1].error is None and by[1].seed == 5
    assert by[1].overrides == {"temperature": 0.7, "top_k": 3, "top_p": 0.9, "max_new_frames": 9}
    assert "row 2, field 'text'" in by[2].error
    assert "row 3, field 'temperature'" in by[3].error
    assert "row 4, field 'top_p'" in by[4].error
    assert "row 5" in by[5].error and "not valid JSON" in by[5].error
    assert 6 not in by  # blank line skipped, numbering kept
    assert "row 7, field 'id'" in by[7].error and "duplicate" in by[7].error
    assert "row 8, field 'colour'" in by[8].error
    assert "row 9, field 'id'" in by[9].error
    assert by[10].error is None and by[10].id == "7" and by[10].scene == "room" and by[10].system == "sys"


def test_seed_is_masked_to_31_bits(tmp_path):
    rows = read_prompts(_w(tmp_path, "p.jsonl", '{"id": "a", "text": "x", "seed": -1}\n{"id": "b", "text": "y", "seed": 4294967301}\n'))
    assert rows[0].seed == (-1) & 0x7FFFFFFF == 0x7FFFFFFF
    assert rows[1].seed == 4294967301 & 0x7FFFFFFF == 5


def test_text_lines_ids_are_line_numbers(tmp_path):
    rows = read_prompts(_w(tmp_path, "p.txt", "first\n\nthird line\n"))
    assert [(r.id, r.text) for r in rows] == [("1", "first"), ("3", "third line")]


def test_csv(tmp_path):
    rows = read_prompts(_w(tmp_path, "p.csv", "id,text,seed,temperature\nx,hello,3,\ny,world,abc,0.5\n"))
    assert rows[0].error is None and rows[0].seed == 3 and rows[0].overrides == {}
    assert "row 2, field 'seed'" in rows[1].error
    with pytest.raises(OmniError, match="'text' column"):
        read_prompts(_w(tmp_path, "q.csv", "id,words\n1,hi\n"))


@pytest.mark.parametrize("data, ids", [('{"id": "s", "text": "hi"}\n', ["s"]), ("one\ntwo\n", ["1", "2"])])
def test_stdin(monkeypatch, data, ids):
    monkeypatch.setattr(sys, "stdin", io.StringIO(data))
    assert [r.id for r in read_prompts("-")] == ids


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(OmniError, match="does not exist"):
        read_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(OmniError, match="no prompts"):
        read_prompts(_w(tmp_path, "e.jsonl", "\n\n"))
