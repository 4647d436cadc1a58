"""Prompt files to records: JSONL, a JSON array, CSV, text lines; which one a file or stdin is.

A record is (its row number, the fields as given or the RowError that kept them from being
read, the raw fields kept for the manifest). omni_cli/prompts.py checks the fields and gives
ids. Row numbers are the file's lines (JSONL, text), a CSV record's place after the header, a
JSON array's index from 1.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Callable

from omni_cli.errors import OmniError, RowError

INPUT_FORMATS = ("jsonl", "json", "csv", "txt")
# extension -> format; any other extension (or none) is sniffed from the content
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".txt": "txt"}
CSV_INTS = ("seed", "top_k", "max_new_frames", "min_new_frames", "ras_win_len", "ras_win_max_num_repeat")
CSV_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty")

Record = tuple[int, Any, dict]  # (row number, dict of fields | RowError, raw fields as given)


def lines_of(text: str) -> list[str]:
    """Physical lines: split on \\n only (str.splitlines also splits inside a JSON string at
    U+2028 and friends), a trailing \\r dropped, so row numbers are the file's line numbers."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def jsonl_records(text: str) -> list[Record]:
    out = []
    for n, line in enumerate(lines_of(text), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as e:  # ValueError: an integer of 4,300+ digits; Recursion: deep nesting
            out.append((n, RowError(n, None, f"not valid JSON: {_json_problem(e)}"), {"input_line": line}))
            continue
        if not isinstance(data, dict):
            out.append((n, RowError(n, None, "must be a JSON object"), {"input_line": line}))
            continue
        out.append((n, data, data))
    return out


def json_array_records(text: str, source: str) -> list[Record]:
    """A .json file holding an array of row objects; a row's number is its place in the array."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise OmniError(f"{source} is not valid JSON: {_json_problem(e, lines=True)}") from None
    if not isinstance(data, list):
        raise OmniError(f"{source}: a .json prompt file must hold an array of row objects (JSONL: one object a line)")
    return [(n, item if isinstance(item, dict) else RowError(n, None, "must be a JSON object"),
             item if isinstance(item, dict) else {"input": item}) for n, item in enumerate(data, start=1)]


def _json_problem(e: Exception, lines: bool = False) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at {'line ' + str(e.lineno) + ', ' if lines else ''}column {e.colno}"
    if isinstance(e, RecursionError):
        return "nested too deep"
    return str(e).split(";")[0]  # Python's limit on an integer's digits


def text_records(text: str) -> list[Record]:
    """One prompt a line; the id is the line number (prompts.py gives it)."""
    return [(n, {"text": line}, {"text": line}) for n, line in enumerate(lines_of(text), start=1) if line.strip()]


def csv_records(text: str) -> list[Record]:
    try:
        return _csv_records(text)
    except csv.Error as e:  # e.g. a bare carriage return inside a field: the file cannot be read as CSV
        raise OmniError(f"CSV input cannot be read: {e}") from None


def _csv_records(text: str) -> list[Record]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None or "text" not in reader.fieldnames:
        raise OmniError("CSV input needs a header row with at least a 'text' column")
    out = []
    for n, rec in enumerate(reader, start=1):
        raw = {k: v for k, v in rec.items() if k is not None and v not in (None, "")}
        try:
            if None in rec:
                raise RowError(n, None, "has more cells than the header")
            out.append((n, {k: csv_value(n, k, v) for k, v in raw.items()}, raw))
        except RowError as e:
            out.append((n, e, raw))  # the row keeps its cells as given
    return out


def csv_value(n: int, key: str, value: str) -> Any:
    """A CSV cell as the JSON field of the same name would be: integers, numbers, id lists."""
    if key in CSV_INTS:
        try:
            return int(value)
        except ValueError:
            raise RowError(n, key, f"must be an integer, got {value!r}") from None
    if key == "suppress_tokens":  # token ids separated by spaces or semicolons
        try:
            return [int(t) for t in value.replace(";", " ").split()]
        except ValueError:
            raise RowError(n, key, f"must be token ids separated by spaces, got {value!r}") from None
    if key in CSV_FLOATS:
        try:
            return float(value)
        except ValueError:
            raise RowError(n, key, f"must be a number, got {value!r}") from None
    return value


def decode(data: bytes, source: str) -> str:
    """UTF-8 (a leading byte-order mark dropped), or an error naming the line of the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        name = "stdin" if source == "-" else source
        raise OmniError(f"{name} is not UTF-8 text: byte {data[e.start]:#04x} at line {line}") from None
    return text[1:] if text.startswith("\ufeff") else text


def sniff(text: str, known_fields: tuple[str, ...], warn: Callable[[str], None], source: str) -> str:
    """The format of an input with no telling extension, from its content. A format is taken
    only when its first record reads as one: JSONL when the first non-blank line is a JSON
    object, a JSON array when the whole text is one, CSV when the first line is a header of
    known column names with `text` among them and the next record has no more cells; else text
    lines, with a warning where the first line looked like another format."""
    first = next((ln.strip() for ln in lines_of(text) if ln.strip()), "")
    looks = None
    if first.startswith("{"):
        looks = "jsonl"
        if _parses(lambda: isinstance(json.loads(first), dict)):
            return "jsonl"
    elif first.startswith("["):
        looks = "json"
        if _parses(lambda: isinstance(json.loads(text), list)):
            return "json"
    elif "," in first:
        header = [c.strip() for c in next(csv.reader([first]))]
        if "text" in header:
            looks = "csv"
            if set(header) <= set(known_fields) and len(set(header)) == len(header) and _csv_first_fits(text):
                return "csv"
    if looks is not None:
        name = "stdin" if source == "-" else source
        warn(f"{name} looks like {looks.upper()} but its first record does not read as {looks.upper()}: "
             f"read as text lines, one prompt a line (give --input-format {looks} to read it as {looks.upper()})")
    return "txt"


def _parses(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except (ValueError, RecursionError):  # json's JSONDecodeError is a ValueError
        return False


def _csv_first_fits(text: str) -> bool:
    """Whether the record after the header has no more cells than the header."""
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader)
        row = next(reader, None)
    except csv.Error:
        return False
    return row is None or len(row) <= len(header)
