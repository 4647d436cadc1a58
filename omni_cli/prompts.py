"""Reading prompt files: JSONL, CSV, plain text lines, or '-' for stdin.

Every input row becomes a PromptRow, valid or not. A row that fails validation
carries its error (naming the row and the field) and is written to the
manifest as failed; the other rows still run.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_cli.errors import OmniError, RowError
from omni_cli.runners.sampling.params import FIELD_NAMES, check_field, check_seed

ROW_FIELDS = ("id", "text", "scene", "system", "seed", "ref_audio", "ref_text", "voice", "chunk") + FIELD_NAMES
_CSV_INTS = ("seed", "top_k", "max_new_frames", "min_new_frames", "ras_win_len", "ras_win_max_num_repeat")
_CSV_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty")
# ids become file names: keep them portable and unambiguous
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass
class PromptRow:
    row: int  # 1-based position in the input (line number for JSONL / text)
    id: str
    text: str = ""
    scene: str | None = None
    system: str | None = None
    seed: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # per-row sampling values
    error: str | None = None  # set when the row is invalid
    ref_audio: str | None = None  # a reference clip's path, relative to the prompt file
    ref_text: str | None = None  # its transcript
    voice: str | None = None  # a name in the voice bank (instead of ref_audio)
    reference: tuple | None = None  # (omni_cli.voices.Voice, its clip's sha256), once checked
    context: tuple = ()  # earlier turns (runners.family.AudioTurn) the job attaches: a reference voice
    chunk: str | None = None  # long-form chunking of this row (omni_cli/longform.py); None: the run's


def _check_row(row: int, data: dict[str, Any]) -> PromptRow:
    unknown = [k for k in data if k not in ROW_FIELDS]
    if unknown:
        raise RowError(row, unknown[0], f"unknown field (known: {', '.join(ROW_FIELDS)})")
    rid = data.get("id", row)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise RowError(row, "id", f"must be a string or an integer, got {rid!r}")
    rid = str(rid)
    if not _ID_RE.fullmatch(rid):  # fullmatch: `$` would let a trailing newline through
        raise RowError(row, "id", f"{rid!r} is not a usable file name (letters, digits, '.', '_', '-'; up to 200)")
    out = PromptRow(row=row, id=rid)
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        raise RowError(row, "text", f"must be a non-empty string, got {text!r}")
    out.text = text
    for key in ("scene", "system"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise RowError(row, key, f"must be a string, got {value!r}")
        setattr(out, key, value)
    _check_reference(row, data, out)
    for key in ("text", "scene", "system", "ref_text"):
        value = data.get(key)
        if value is not None and (bad := _unencodable(value)):
            raise RowError(row, key, bad)
    if data.get("seed") is not None:
        try:
            out.seed = check_seed(data["seed"])
        except ValueError as e:
            raise RowError(row, "seed", str(e)) from None
    out.chunk = _check_chunk(row, data.get("chunk"))
    for key in FIELD_NAMES:
        if data.get(key) is not None:
            try:
                out.overrides[key] = check_field(key, data[key])
            except ValueError as e:
                raise RowError(row, key, str(e)) from None
    return out


def _check_reference(row: int, data: dict[str, Any], out: PromptRow) -> None:
    """ref_audio with its ref_text, or a voice name; never both."""
    for key in ("ref_audio", "ref_text", "voice"):
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise RowError(row, key, f"must be a non-empty string, got {value!r}")
    if data.get("voice") is not None and data.get("ref_audio") is not None:
        raise RowError(row, "voice", "give either voice or ref_audio, not both")
    if data.get("ref_audio") is not None and data.get("ref_text") is None:
        raise RowError(row, "ref_text", "ref_audio needs ref_text, the transcript of the reference")
    if data.get("ref_text") is not None and data.get("ref_audio") is None:
        field = "voice" if data.get("voice") is not None else "ref_text"
        raise RowError(row, field, "ref_text goes with ref_audio (a bank voice has its own text)")
    out.ref_audio, out.ref_text, out.voice = data.get("ref_audio"), data.get("ref_text"), data.get("voice")


def _check_chunk(row: int, value: Any) -> str | None:
    """The row's `chunk` field: a method of omni_cli/longform.py, or None (the run's --chunk-method)."""
    from omni_cli.longform import CHUNK_METHODS

    if value is not None and value not in CHUNK_METHODS:
        raise RowError(row, "chunk", f"must be one of {', '.join(CHUNK_METHODS)}, got {value!r}")
    return value


def _unencodable(value: str) -> str | None:
    """Why a string cannot reach the tokenizer (a lone surrogate, a NUL), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a character that is not valid Unicode text ({value[e.start]!r} at {e.start})"
    if "\x00" in value:
        return f"holds a NUL character at {value.index(chr(0))}"
    return None


def _lines(text: str) -> list[str]:
    """Physical lines: split on \n only (str.splitlines also splits inside a JSON string at
    U+2028 and friends), a trailing \r dropped, so row numbers are the file's line numbers."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _parse(row: int, fallback_id: str, parse) -> PromptRow:
    """Validate one row; an invalid row keeps its own id when that id is usable."""
    data = None
    try:
        data = parse()
        return _check_row(row, data)
    except RowError as e:
        rid = data.get("id") if isinstance(data, dict) else None
        usable = isinstance(rid, (str, int)) and not isinstance(rid, bool) and _ID_RE.fullmatch(str(rid))
        # a failed row keeps its input, what is not valid Unicode written as escapes
        kept = {k: data[k].encode("utf-8", "backslashreplace").decode("utf-8") for k in ("text", "scene", "system")
                if isinstance(data, dict) and isinstance(data.get(k), str)}
        return PromptRow(row=row, id=str(rid) if usable else fallback_id, error=str(e), **kept)


def _jsonl_rows(text: str) -> list[PromptRow]:
    rows = []
    for n, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue

        def parse(line=line, n=n):
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise RowError(n, None, f"not valid JSON: {e.msg} at column {e.colno}") from None
            if not isinstance(data, dict):
                raise RowError(n, None, "must be a JSON object")
            return data

        rows.append(_parse(n, f"row-{n}", parse))
    return rows


def _text_rows(text: str) -> list[PromptRow]:
    # one prompt a line; the id is the line number
    return [
        _parse(n, str(n), lambda line=line, n=n: {"id": n, "text": line})
        for n, line in enumerate(_lines(text), start=1)
        if line.strip()
    ]


def _json_array_rows(text: str, source: str) -> list[PromptRow]:
    """A .json file holding an array of row objects; a row's number is its place in the array."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise OmniError(f"{source} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(data, list):
        raise OmniError(f"{source}: a .json prompt file must hold an array of row objects (JSONL: one object a line)")

    def parse(item, n):
        if not isinstance(item, dict):
            raise RowError(n, None, "must be a JSON object")
        return item

    return [_parse(n, f"row-{n}", lambda item=item, n=n: parse(item, n)) for n, item in enumerate(data, start=1)]


def _csv_rows(text: str) -> list[PromptRow]:
    try:
        return _csv_records(text)
    except csv.Error as e:  # e.g. a bare carriage return inside a field: the file cannot be read as CSV
        raise OmniError(f"CSV input cannot be read: {e}") from None


def _csv_records(text: str) -> list[PromptRow]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None or "text" not in reader.fieldnames:
        raise OmniError("CSV input needs a header row with at least a 'text' column")
    rows = []
    for n, rec in enumerate(reader, start=1):
        def parse(rec=rec, n=n):
            data: dict[str, Any] = {"id": n}
            for key, value in rec.items():
                if key is None:
                    raise RowError(n, None, "has more cells than the header")
                if value is None or value == "":
                    continue
                if key in _CSV_INTS:
                    try:
                        value = int(value)
                    except ValueError:
                        raise RowError(n, key, f"must be an integer, got {value!r}") from None
                elif key == "suppress_tokens":  # token ids separated by spaces or semicolons
                    try:
                        value = [int(t) for t in value.replace(";", " ").split()]
                    except ValueError:
                        raise RowError(n, key, f"must be token ids separated by spaces, got {value!r}") from None
                elif key in _CSV_FLOATS:
                    try:
                        value = float(value)
                    except ValueError:
                        raise RowError(n, key, f"must be a number, got {value!r}") from None
                data[key] = value
            return data

        rows.append(_parse(n, f"row-{n}", parse))
    return rows


def _decode(data: bytes, source: str) -> str:
    """UTF-8 (a leading byte-order mark dropped), or an error naming the line of the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        name = "stdin" if source == "-" else source
        raise OmniError(f"{name} is not UTF-8 text: byte {data[e.start]:#04x} at line {line}") from None
    return text[1:] if text.startswith("\ufeff") else text


def _sniff(text: str) -> str:
    """The kind of an input without a telling extension, from its first non-blank line."""
    first = next((ln.strip() for ln in _lines(text) if ln.strip()), "")
    if first.startswith("{"):
        return ".jsonl"
    if first.startswith("["):
        return ".json"
    if "," in first and "text" in [c.strip().strip('"') for c in next(csv.reader([first]))]:
        return ".csv"
    return ".txt"


def read_prompts(source: str) -> list[PromptRow]:
    """Read a prompt file by extension (.jsonl/.ndjson, .json array, .csv, else text lines), or
    '-', /dev/stdin or a pipe such as <(cmd), whose kind is told from its content.

    Content is sniffed (no extension to go by): JSONL when the first non-blank line starts
    with '{', a JSON array with '[', CSV when that line is a header with a 'text' column,
    else text lines. Duplicate ids fail the later rows: two rows must never write one file.
    """
    if source == "-":
        stream = sys.stdin  # bytes where it has them: a text wrapper would fail on bad bytes itself
        data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode("utf-8", "surrogatepass")
        suffix = ""
    else:
        path = Path(source)
        if not path.exists():
            raise OmniError(f"prompt file {source} does not exist")
        if path.is_dir():
            raise OmniError(f"prompt file {source} is a folder")
        try:
            data = path.read_bytes()  # a pipe (/dev/stdin, <(cmd)) reads like a file
        except OSError as e:
            raise OmniError(f"prompt file {source} cannot be read: {e}") from None
        suffix = path.suffix.lower() if path.is_file() else ""
    text = _decode(data, source)
    if suffix not in (".jsonl", ".ndjson", ".json", ".csv", ".txt") and not (suffix and Path(source).is_file()):
        suffix = _sniff(text)
    if suffix in (".jsonl", ".ndjson"):
        rows = _jsonl_rows(text)
    elif suffix == ".json":
        rows = _json_array_rows(text, source)
    elif suffix == ".csv":
        rows = _csv_rows(text)
    else:
        rows = _text_rows(text)
    seen: dict[str, int] = {}
    for r in rows:
        if r.error is None:
            if r.id in seen:
                r.error = str(RowError(r.row, "id", f"duplicate id {r.id!r} (first used by row {seen[r.id]})"))
            else:
                seen[r.id] = r.row
    if not rows:
        raise OmniError(f"no prompts in {source}")
    return rows
