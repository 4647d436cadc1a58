"""The output folder is one run's: its lock, what --overwrite removes, what --resume keeps.

OUT/.omni.lock      flock'ed for the whole run: a second run into the folder is refused. The
                    run removes it while still holding it; a run that locked the file just as
                    it went finds the path no longer names its file and takes the lock anew.
                    A lock file left behind is a run killed before it let go.
temporaries         *.tmp and .*.partial.* files: what a killed run left mid-write
OUT/.chunks/        a long row's finished chunks until its files are written (--resume goes on after them)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_cli.errors import OmniError

LOCK_NAME = ".omni.lock"
MANIFEST = "metadata.jsonl"
CHUNKS = ".chunks"  # long rows' finished chunks (omni_cli/chunk_store.py), kept for --resume


def read_manifest_lenient(path: Path) -> list[dict[str, Any]]:
    """A manifest's rows; a line a kill cut short (only ever the last) is ignored."""
    rows = []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return rows
    for line in data.split(b"\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            rows.append(obj)
    return rows


def temporaries(out: Path) -> list[Path]:
    """Files a killed run left mid-write: the manifest's and run.json's *.tmp, the files' .partial names."""
    found = []
    chunks = out / CHUNKS
    for d in (out, out / "audio", out / "logprobs", *(chunks.iterdir() if chunks.is_dir() else ())):
        if d.is_dir():
            found += [p for p in d.iterdir() if p.is_file() and (p.name.endswith(".tmp") or ".partial." in p.name)]
    return found


@dataclass
class FolderLock:
    fd: int
    out: Path
    created: bool = False  # this run made the folder: left empty, it is removed again

    def release(self) -> None:
        try:
            (self.out / LOCK_NAME).unlink(missing_ok=True)  # still held: see the module's docstring
        except OSError:
            pass
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
        if self.created:
            _remove_if_empty(self.out)


def _remove_if_empty(out: Path) -> None:
    """A folder this run made and wrote nothing into (an error before the first row): gone again."""
    try:
        for sub in ("audio", "logprobs"):
            if (out / sub).is_dir() and not any((out / sub).iterdir()):
                (out / sub).rmdir()
        if not any(out.iterdir()):
            out.rmdir()
    except OSError:
        pass


def lock_existing(out: Path) -> FolderLock:
    """The lock of a folder that exists (omni score): held as a run holds it; in use: an OmniError."""
    return FolderLock(_lock(out), out)


def _lock(out: Path) -> int:
    """An fd holding the folder's lock file flock'ed; OmniError while another run holds it."""
    path = out / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OmniError(f"cannot write to the output folder {out}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OmniError(f"{out} is in use by another omni run (it holds {path}); "
                            "wait for it or choose another folder") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the run before removed the file we locked: lock the path's new file


def lock_held(out: Path) -> bool:
    """Whether a live run holds the folder's lock (omni merge refuses such a folder)."""
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def prepare_out_dir(out: Path, overwrite: bool, resume: bool) -> FolderLock:
    """Check, lock and clear the output folder before the model loads; OmniError (exit 2) when it cannot be used.
    Returns the lock, held until the run ends (closing it, or the process ending, releases it)."""
    if overwrite and resume:
        raise OmniError("--overwrite and --resume exclude each other: --resume keeps the finished rows")
    if out.exists() and not out.is_dir():
        raise OmniError(f"{out} exists and is not a folder")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OmniError(f"cannot write to the output folder {out}: {e.strerror or e}") from None
    try:
        lock = FolderLock(_lock(out), out, created)
    except OmniError:
        if created:
            _remove_if_empty(out)
        raise
    try:
        _check_writable(out)
        manifest = out / MANIFEST
        earlier = read_manifest_lenient(manifest)
        if overwrite:
            remove_previous(out, earlier)
        elif not resume and earlier:
            raise OmniError(f"{out} already holds results ({manifest}); pass --resume to continue that run, "
                            "--overwrite to replace it, or choose another folder")
        elif not earlier and not resume:
            # an empty manifest (a run killed before its first row) holds nothing to keep
            for p in temporaries(out):
                p.unlink(missing_ok=True)
            shutil.rmtree(out / CHUNKS, ignore_errors=True)
    except BaseException:
        lock.release()
        raise
    return lock


def _check_writable(out: Path) -> None:
    probe = out / f".omni-probe-{os.getpid()}.tmp"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OmniError(f"cannot write to the output folder {out}: {e.strerror or e}") from None


def remove_previous(out: Path, earlier: list[dict[str, Any]]) -> None:
    """--overwrite: the files the previous manifest names, temporaries, run.json and the manifest; nothing else."""
    root = out.resolve()
    for row in earlier:
        for key in ("file_name", "logprobs_file"):
            rel = row.get(key)
            if not isinstance(rel, str):
                continue
            p = (out / rel).resolve()
            if p.parent.parent == root and p.parent.name in ("audio", "logprobs"):  # never outside the folder
                p.unlink(missing_ok=True)
    for p in temporaries(out):
        p.unlink(missing_ok=True)
    shutil.rmtree(out / CHUNKS, ignore_errors=True)
    (out / "run.json").unlink(missing_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)


def file_digest(path: Path) -> tuple[int, str] | None:
    """(bytes, sha256) of a file, None when it is missing."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return f.tell(), h.hexdigest()
    except OSError:
        return None


KEPT_STATUSES = ("ok", "rejected")  # rows that came out with files: --resume keeps them as they are


def row_intact(out: Path, entry: dict[str, Any]) -> bool:
    """An ok (or rejected: scored, its files kept) manifest row whose two files are on disk with the
    recorded size and sha256."""
    if entry.get("status") not in KEPT_STATUSES:
        return False
    for rel, size, digest in ((entry.get("file_name"), entry.get("audio_bytes"), entry.get("audio_sha256")),
                              (entry.get("logprobs_file"), entry.get("logprobs_bytes"), entry.get("logprobs_sha256"))):
        if not isinstance(rel, str) or file_digest(out / rel) != (size, digest):
            return False
    return True


def row_hash(content: dict[str, Any]) -> str:
    """sha256 of a row's content as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
