"""Writing results: audio files, logprob arrays, the manifest and run.json.

OUT/audio/<id>.wav|flac   soundfile, at the codec's sample rate
OUT/logprobs/<id>.npz     tokens, logprobs, mask: each [frames, codebooks]
OUT/metadata.jsonl        one row per input row, failures included; loadable
                          as a datasets "audiofolder" (file_name column)
OUT/run.json              versions, config, device, totals and timings

The manifest is appended row by row as results complete, each line in one
write(2) on an O_APPEND descriptor, so a kill at any moment leaves whole lines
(readers skip a last line cut short: omni_cli/folder.py); at the end it is
rewritten in input order (a temporary file, then os.replace). Its values are
strict JSON: a non-finite float is written as null and named in "nonfinite".
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
import sys
import threading
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import soundfile as sf

from omni_cli.errors import OmniError

FORMATS = ("wav", "flac")
REJECTED_DIR = "rejected/"  # --drop-rejected: rejected rows' audio/ and logprobs/ go under it


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise OmniError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def strict_json(value: Any, path: str = "", bad: list[str] | None = None) -> Any:
    """value with every NaN/Infinity float replaced by None (their paths appended to bad)."""
    if isinstance(value, float) and not math.isfinite(value):
        if bad is not None:
            bad.append(path)
        return None
    if isinstance(value, dict):
        return {k: strict_json(v, f"{path}.{k}" if path else str(k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v, f"{path}[{i}]", bad) for i, v in enumerate(value)]
    return value


def json_line(record: dict[str, Any]) -> str:
    """One manifest line: strict JSON (allow_nan=False), UTF-8 unless the text holds a lone surrogate."""
    bad: list[str] = []
    record = strict_json(record, "", bad)
    if bad:
        record["nonfinite"] = bad  # these fields were NaN or infinite; written as null
    line = json.dumps(record, ensure_ascii=False, allow_nan=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate cannot be UTF-8: escape it (\udXXX is valid JSON)
        line = json.dumps(record, ensure_ascii=True, allow_nan=False)
    return line + "\n"


def _digest(pieces) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    for piece in pieces:
        h.update(piece)
        n += memoryview(piece).nbytes
    return n, h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """path whole or unchanged: a temporary beside it, renamed; the temporary removed if that fails (a full disk)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class OutputWriter:
    def __init__(self, out: Path, fmt: str, sample_rate: int, kept: dict[int, str] | None = None,
                 on_row: Callable[[str], None] | None = None, frame_rate: float = 25.0):
        """kept: input row number -> the manifest line of a row resumed as it was; on_row(line)
        gets each row written by this run (--jsonl-stdout)."""
        check_format(fmt)
        self.out = out
        self.fmt = fmt
        self.sample_rate = sample_rate
        self.window = max(1, round(frame_rate))  # min_window_logprob's window: a second of frames
        self._lines: dict[int, str] = dict(kept or {})  # input row number -> its manifest line
        self._on_row = on_row
        (out / "audio").mkdir(parents=True, exist_ok=True)
        (out / "logprobs").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # manifest rows come from the writer threads and the main one
        self.append_error: OSError | None = None  # the first line the disk refused (it stays in memory for close)
        self._fd = self._open_manifest()

    def _open_manifest(self) -> int:
        # the kept rows first, whole (temporary file + rename), then this run's appended
        _atomic_write(self.out / "metadata.jsonl", "".join(self._lines[r] for r in sorted(self._lines)).encode("utf-8"))
        return os.open(self.out / "metadata.jsonl", os.O_WRONLY | os.O_APPEND)

    def add_row(self, row: int, record: dict[str, Any]) -> None:
        self.add_line(row, json_line(record))

    def add_line(self, row: int, line: str) -> None:
        """One manifest line (json_line's), appended as one write(2)."""
        with self._lock:
            self._lines[row] = line
            try:
                self._emit(row, line)
            except OSError as e:  # a full disk: the line is kept for close's rewrite, the run goes on
                self.append_error = self.append_error or e
            if self._on_row is not None:
                self._on_row(line)

    def _emit(self, row: int, line: str) -> None:
        data = line.encode("utf-8")
        while data:  # one write(2) for a line of any usual size; a short write continues
            data = data[os.write(self._fd, data):]

    def write_ok(self, row: int, rid: str, samples: np.ndarray, tokens: np.ndarray, logprobs: np.ndarray,
                 mask: np.ndarray, meta: dict[str, Any], raw_logprobs: np.ndarray | None = None,
                 extra: dict[str, np.ndarray] | None = None, subdir: str = "") -> dict[str, Any]:
        """Write one finished request's files and its manifest row; subdir: a folder under out they go in
        (REJECTED_DIR: --drop-rejected's)."""
        files, record = self.encode_ok(rid, samples, tokens, logprobs, mask, meta, raw_logprobs, extra, subdir)
        if subdir:
            for rel, _ in files:
                (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
        for rel, data in files:
            self.publish(rel, data)
        self.add_row(meta["row"], record)
        return record

    def encode_ok(self, rid: str, samples: np.ndarray, tokens: np.ndarray, logprobs: np.ndarray, mask: np.ndarray,
                  meta: dict[str, Any], raw_logprobs: np.ndarray | None = None,
                  extra: dict[str, np.ndarray] | None = None, subdir: str = ""):
        """A finished request's files as bytes, [(path under out, bytes)], and its manifest row.
        samples: the audio as int16 [samples] (runners/audio.py: pcm16); extra: more npz arrays
        (a long row's chunk boundaries)."""
        if samples.dtype != np.int16:
            raise TypeError(f"audio samples must be int16 (runners/audio.py: pcm16), got {samples.dtype}")
        audio_rel = f"{subdir}audio/{rid}.{self.fmt}"
        # 16-bit PCM: float WAV would carry libsndfile's PEAK chunk, whose
        # timestamp makes files of the same audio differ byte for byte.
        # Encoded in memory, then written at once: to a path, libsndfile seeks
        # many times a file and fsyncs it on close, dearer still on a network
        # file system (BENCHMARKS.md, writers). No file of the run is fsynced,
        # the npz and manifest included: what was written survives a crash of
        # the process, not necessarily one of the machine.
        if self.fmt == "wav":
            audio = wav_pcm16(samples, self.sample_rate)
        else:
            encoded = io.BytesIO()
            sf.write(encoded, samples, self.sample_rate, format=self.fmt.upper(), subtype="PCM_16")
            audio = (encoded.getbuffer(),)
        npz_rel = f"{subdir}logprobs/{rid}.npz"
        arrays = {"tokens": tokens.astype(np.int64), "logprobs": logprobs.astype(np.float32), "mask": mask.astype(bool)}
        if raw_logprobs is not None:
            arrays["raw_logprobs"] = raw_logprobs.astype(np.float32)
        arrays.update(extra or {})
        real = logprobs[mask]
        npz = npz_stored(arrays)
        audio_bytes, audio_sha = _digest(audio)
        npz_bytes, npz_sha = _digest(npz)
        record = {
            "file_name": audio_rel,
            "id": rid,
            "status": "ok",
            **meta,
            "frames": int(tokens.shape[0]),
            "duration_s": round(len(samples) / self.sample_rate, 6),
            "mean_logprob": float(real.mean()) if real.size else None,
            "min_window_logprob": min_window_logprob(logprobs, mask, self.window),
            "logprobs_file": npz_rel,
            # what --resume checks before it keeps the row
            "audio_bytes": audio_bytes, "audio_sha256": audio_sha,
            "logprobs_bytes": npz_bytes, "logprobs_sha256": npz_sha,
        }
        return [(audio_rel, audio), (npz_rel, npz)], record

    def publish(self, rel: str, pieces) -> None:
        """One file under out, its bytes-like pieces in order, whole or not at all: written under
        a hidden partial name, then renamed; a partial file whose write or rename failed is removed."""
        path = self.out / rel
        tmp = path.with_name(f".{path.stem}.partial{path.suffix}")
        try:
            with open(tmp, "wb") as f:
                for piece in pieces:
                    f.write(piece)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def write_failed(self, row: int, rid: str, fields: dict[str, Any], error: str, status: str = "failed") -> None:
        """fields: the row's input fields (text, scene, system, seed, its sampling fields), kept so that
        the row can be fixed from the manifest. file_name is where the audio would be, so the manifest
        still loads as an audiofolder; status tells users to filter the row out."""
        self.add_row(row, {"file_name": f"audio/{rid}.{self.fmt}", "id": rid, "status": status, "row": row,
                           **fields, "error": error})

    def has_row(self, row: int) -> bool:
        with self._lock:
            return row in self._lines

    def lines(self) -> dict[int, str]:
        """Input row number -> its manifest line, so far."""
        with self._lock:
            return dict(self._lines)

    def close(self) -> None:
        """Rewrite the manifest in input order. An OSError (a full disk) leaves the appended manifest as
        it stood, whole lines in the order rows finished, and no temporary: --resume completes it."""
        with self._lock:
            os.close(self._fd)
            lines = [self._lines[r] for r in sorted(self._lines)]
        _atomic_write(self.out / "metadata.jsonl", "".join(lines).encode("utf-8"))


class StdoutLines:
    """--jsonl-stdout: each manifest line to stdout, whole and flushed. A reader that closes the
    pipe (`| head -3`) ends the lines, not the run: the rest go to the manifest only."""

    def __init__(self) -> None:
        self.written = 0
        self.closed = False

    def __call__(self, line: str) -> None:
        if self.closed:
            return
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
            self.written += 1
        except (BrokenPipeError, ValueError):  # ValueError: a stdout already closed in this process
            self.closed = True
            try:  # the interpreter's last flush at exit must not raise on the closed pipe either
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass

    def note(self) -> str | None:
        """What the summary says when the reader went away."""
        if not self.closed:
            return None
        return (f"stdout closed after {self.written} lines: --jsonl-stdout stopped there; every row is in "
                "the manifest")


def wav_pcm16(samples: np.ndarray, sample_rate: int) -> tuple[bytes, memoryview]:
    """A mono 16-bit PCM WAV file in two pieces: the 44-byte header libsndfile writes for one
    (the tests hold the file to libsndfile's byte for byte), then the samples' own memory.
    Written here, not through soundfile's in-memory file, whose libsndfile calls back into
    Python for each of its writes and seeks while holding the GIL the other writer threads
    wait on; and not joined into one bytes object: that made two copies of every row's samples
    on the writer threads."""
    data = memoryview(np.ascontiguousarray(samples, dtype="<i2")).cast("B")
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16)  # PCM, 1 channel
    header = b"".join((b"RIFF", struct.pack("<I", 4 + len(fmt) + 8 + len(data)), b"WAVE", fmt,
                       b"data", struct.pack("<I", len(data))))
    return header, data


def npz_stored(arrays: dict[str, np.ndarray]) -> list:
    """An .npz file (what np.load reads: a zip of NAME.npy members, stored, not compressed) as
    bytes-like pieces in order, the arrays' own memory among them.

    np.savez makes the same members through zipfile, several times slower, all of it Python
    holding the GIL that the codec thread and the other writers wait on at the end of a run
    (BENCHMARKS.md, npz without zipfile). Deterministic: every member dated 1980-01-01, as
    np.savez's are. A request's arrays (frames x codebooks) stay far below zip's 32-bit sizes
    and offsets."""
    pieces, central, offset = [], [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        header = _npy_header(a)
        data = memoryview(a).cast("B") if a.size else b""
        crc = zlib.crc32(data, zlib.crc32(header))
        size = len(header) + len(data)
        fname = f"{name}.npy".encode()
        assert offset + size < 1 << 31, "npz member past zip's 32-bit offsets"
        # local header: signature, version 2.0, no flags, stored, time 0, date 1980-01-01 (0x21),
        # CRC-32, sizes, name length, no extra field
        local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, size, size, len(fname), 0)
        # its central directory entry: the same fields, plus no comment, disk 0, attributes
        # (a regular file, rw-------, as zipfile's), the local header's offset
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, crc, size, size,
                                   len(fname), 0, 0, 0, 0, 0o600 << 16, offset) + fname)
        pieces += [local + fname, header, data]
        offset += len(local) + len(fname) + size
    directory = b"".join(central)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(directory), offset, 0)
    return pieces + [directory + end]


def _npy_header(a: np.ndarray) -> bytes:
    """The .npy header (format 1.0) numpy writes for a C-ordered array, from numpy's own writer."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, np.lib.format.header_data_from_array_1_0(a))
    return out.getvalue()


def min_window_logprob(logprobs: np.ndarray, mask: np.ndarray, window: int = 25) -> float | None:
    """The lowest mean logprob of real codes over any `window` consecutive frames (a second: 25 at
    Higgs's 25 frames a second, 12 at Qwen3-TTS's 12.5).

    logprobs, mask [frames, codebooks]. Shorter outputs use their one window;
    windows without real codes are skipped; None when there are none at all.
    """
    n = len(logprobs)
    w = min(window, n)
    if w == 0:
        return None
    vals = np.where(mask, logprobs, 0.0).sum(axis=1).astype(np.float64)
    counts = mask.sum(axis=1)
    csum, ccnt = np.concatenate([[0.0], np.cumsum(vals)]), np.concatenate([[0], np.cumsum(counts)])
    sums, cnts = csum[w:] - csum[:-w], ccnt[w:] - ccnt[:-w]
    ok = cnts > 0
    return float((sums[ok] / cnts[ok]).min()) if ok.any() else None


def write_run_json(out: Path, info: dict[str, Any]) -> None:
    info = strict_json(json.loads(json.dumps(info, default=str)))  # paths etc. as text, NaN as null
    _atomic_write(out / "run.json", (json.dumps(info, indent=2, allow_nan=False) + "\n").encode("utf-8"))
