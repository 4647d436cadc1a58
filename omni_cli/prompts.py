"""Reading prompt files: JSONL, a JSON array, CSV, plain text lines, or '-' for stdin.

Every input row becomes a PromptRow, valid or not. A row that fails validation
carries its error (naming the row and the field) and is written to the
manifest as failed, its input fields kept; the other rows still run. Ids are
file names and unique: a row without a usable id, or with one an earlier row
took, gets one no row of the file gives (the whole file is read first).
"""

from __future__ import annotations

import hashlib
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omni_cli.errors import OmniError, RowError
from omni_cli.prompt_formats import (INPUT_FORMATS, SUFFIXES, csv_records, decode, json_array_records,
                                     jsonl_records, sniff, text_records)
from omni_cli.runners.sampling.params import FIELD_NAMES, check_field, check_seed, seed_masked, short_repr

ROW_FIELDS = ("id", "text", "scene", "system", "seed", "ref_audio", "ref_text", "voice", "chunk") + FIELD_NAMES
# ids become file names: keep them portable and unambiguous
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # http://, s3://, file://: a scheme, not a path
# text a voice can say holds a letter, digit, punctuation or symbol: not only spaces, controls,
# zero-width (format) characters or lone combining marks
_SPOKEN = ("L", "N", "P", "S")


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
    given_id: Any = None  # the id as the input gives it (None: none given); `id` differs where it was unusable
    raw: dict = field(default_factory=dict)  # the row's known input fields as given: a failed row keeps them
    warnings: list = field(default_factory=list)  # what the run should say about the row (a masked seed)
    fields: dict = field(default_factory=dict)  # the model family's own row fields (ModelFamily.row_fields)


def _check_row(row: int, rid: str, data: dict[str, Any], extra: dict[str, type]) -> PromptRow:
    """A row's fields checked (RowError names the first bad one); rid: its id, already given;
    extra: the model family's own fields and their types."""
    unknown = [k for k in data if k not in ROW_FIELDS and k not in extra]
    if unknown:
        raise RowError(row, unknown[0], f"unknown field (known: {', '.join(ROW_FIELDS + tuple(extra))})")
    if "id" in data and not usable_id(data["id"]):
        raise RowError(row, "id", f"{short_repr(data['id'])} is not a usable file name (a string or an integer of "
                                  "letters, digits, '.', '_', '-'; up to 200)")
    out = PromptRow(row=row, id=rid)
    text = data.get("text")
    if not isinstance(text, str) or not spoken(text):
        raise RowError(row, "text", f"must be a non-empty string with something to say, got {short_repr(text)}")
    out.text = text
    for key in ("scene", "system"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise RowError(row, key, f"must be a string, got {short_repr(value)}")
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
        if (why := seed_masked(data["seed"])) is not None:
            out.warnings.append(f"row {row}, field 'seed': {why}")
    out.chunk = _check_chunk(row, data.get("chunk"))
    for key, kind in extra.items():
        value = data.get(key)
        if value is None:
            continue
        if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):  # a CSV cell
            value = value.lower() == "true"
        if not isinstance(value, kind) or (kind is str and not spoken(value)):
            wanted = "true or false" if kind is bool else "a non-empty string"
            raise RowError(row, key, f"must be {wanted}, got {short_repr(value)}")
        if kind is str and (bad := _unencodable(value)):
            raise RowError(row, key, bad)
        out.fields[key] = value
    for key in FIELD_NAMES:
        if data.get(key) is not None:
            try:
                out.overrides[key] = check_field(key, data[key])
            except ValueError as e:
                raise RowError(row, key, str(e)) from None
    return out


def usable_id(value: Any) -> bool:
    """An id that can be a file name as given: a string or integer matching _ID_RE."""
    return isinstance(value, (str, int)) and not isinstance(value, bool) and bool(_ID_RE.fullmatch(str(value)))


def spoken(text: str) -> bool:
    """Whether a text holds something to say (see _SPOKEN): '\u200b\u200b' and ' ' do not."""
    return any(unicodedata.category(c)[0] in _SPOKEN for c in text)


def _check_reference(row: int, data: dict[str, Any], out: PromptRow) -> None:
    """ref_audio with its ref_text, or a voice name; never both."""
    for key in ("ref_audio", "ref_text", "voice"):
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not spoken(value)):
            raise RowError(row, key, f"must be a non-empty string, got {short_repr(value)}")
    if isinstance(data.get("ref_audio"), str) and _URL.match(data["ref_audio"]):
        raise RowError(row, "ref_audio", f"{short_repr(data['ref_audio'])} is a URL: omni reads local files; "
                                         "download the clip and give its path (relative to the prompt file)")
    if data.get("voice") is not None and data.get("ref_audio") is not None:
        raise RowError(row, "voice", "give either voice or ref_audio, not both")
    if data.get("ref_text") is not None and data.get("ref_audio") is None:
        field = "voice" if data.get("voice") is not None else "ref_text"
        raise RowError(row, field, "ref_text goes with ref_audio (a bank voice has its own text)")
    out.ref_audio, out.ref_text, out.voice = data.get("ref_audio"), data.get("ref_text"), data.get("voice")


def _check_chunk(row: int, value: Any) -> str | None:
    """The row's `chunk` field: a method of omni_cli/longform.py, or None (the run's --chunk-method)."""
    from omni_cli.longform import CHUNK_METHODS

    if value is not None and value not in CHUNK_METHODS:
        raise RowError(row, "chunk", f"must be one of {', '.join(CHUNK_METHODS)}, got {short_repr(value)}")
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


def read_prompts(source: str, input_format: str | None = None, warn: Callable[[str], None] | None = None,
                 info: dict | None = None, extra_fields: dict[str, type] | None = None) -> list[PromptRow]:
    """Read a prompt file by ``input_format`` (jsonl, json, csv, txt), else by extension
    (.jsonl/.ndjson, .json, .csv, .txt), else sniffed from the content (prompt_formats.sniff):
    a file of another extension, '-' (stdin), /dev/stdin or a pipe such as <(cmd).

    Ids: a row's own when usable and not taken by an earlier row; else a fresh one that no row
    of the file gives (its line number, else row-N, row-N-2, ...). warn(message) gets what the
    reading noticed without failing a row (a sniffed format; default: stderr). extra_fields: the
    model family's own row fields (ModelFamily.row_fields) and their types. info, if given, is
    filled with what identifies the input (run.json's `prompts`; omni merge checks folders by it):
    its absolute path (a regular file's; else as given), sha256, bytes, format, rows and the
    sha256 of its ids in order.
    """
    warn = warn or _stderr_warning
    if input_format is not None and input_format not in INPUT_FORMATS:
        raise OmniError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
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
            raise OmniError(f"prompt file {source} cannot be read: {e.strerror or e}") from None
        suffix = path.suffix.lower() if path.is_file() else ""
    text = decode(data, source)
    extra = dict(extra_fields or {})
    kind = input_format or SUFFIXES.get(suffix) or sniff(text, ROW_FIELDS + tuple(extra), warn, source)
    records = {"jsonl": jsonl_records, "csv": csv_records, "txt": text_records,
               "json": lambda t: json_array_records(t, source)}[kind](text)
    if not records:
        raise OmniError(f"no prompts in {'stdin' if source == '-' else source}")
    rows = _rows(records, extra)
    if info is not None:
        regular = source != "-" and Path(source).is_file()
        info.update(path=str(Path(source).resolve()) if regular else source, sha256=hashlib.sha256(data).hexdigest(),
                    bytes=len(data), format=kind, rows=len(rows), ids_sha256=ids_digest(rows))
    return rows


def ids_digest(rows: list[PromptRow]) -> str:
    """sha256 of the rows' ids in input order, one a line: the same ids in the same order, the same digest."""
    return hashlib.sha256("\n".join(r.id for r in rows).encode("utf-8")).hexdigest()


def _rows(records: list, extra: dict[str, type]) -> list[PromptRow]:
    """Records to PromptRows, with unique ids (see read_prompts)."""
    def own_id(data, raw):  # a row that could not be read keeps the id its raw fields give (a CSV cell)
        return (data if isinstance(data, dict) else raw).get("id")

    given = {str(own_id(d, raw)) for _, d, raw in records if usable_id(own_id(d, raw))}
    taken: set[str] = set()
    first: dict[str, int] = {}
    rows = []
    for n, data, raw in records:
        own = own_id(data, raw)
        rid = str(own) if usable_id(own) and str(own) not in taken else None
        error = None
        if rid is None and usable_id(own):  # a duplicate: the earlier row keeps the id
            error = RowError(n, "id", f"duplicate id {str(own)!r} (first used by row {first[str(own)]})")
        if rid is None:
            rid = _fresh_id(n, given | taken, plain=own is None and not {"input_line", "input"} & set(raw))
        taken.add(rid)
        first.setdefault(rid, n)
        if isinstance(data, RowError):
            error = error or data
        try:
            if error is not None:
                raise error
            row = _check_row(n, rid, data, extra)
        except RowError as e:
            row = _failed_row(n, rid, raw, str(e))
        row.given_id = own
        row.raw = {k: v for k, v in raw.items() if k in ROW_FIELDS or k in extra or k in ("input_line", "input")}
        rows.append(row)
    return rows


def _fresh_id(n: int, taken: set[str], plain: bool) -> str:
    """An id no row gives: the line number for a row without one (text lines, JSONL without an id),
    else row-N; then row-N-2, row-N-3, ... while taken."""
    for candidate in ([str(n)] if plain else []) + [f"row-{n}"] + [f"row-{n}-{k}" for k in range(2, len(taken) + 3)]:
        if candidate not in taken:
            return candidate
    raise AssertionError("unreachable: more candidates than taken ids")


def _failed_row(n: int, rid: str, raw: dict, error: str) -> PromptRow:
    """A row that failed its checks: its text, scene and system kept (what is not valid Unicode
    written as escapes); the other fields stay in raw."""
    kept = {k: raw[k].encode("utf-8", "backslashreplace").decode("utf-8") for k in ("text", "scene", "system")
            if isinstance(raw.get(k), str)}
    return PromptRow(row=n, id=rid, error=error, **kept)


def _stderr_warning(message: str) -> None:
    print(f"omni: warning: {message}", file=sys.stderr, flush=True)
