"""Content digests of a model's files, remembered across runs (a codec's identity).

Cached reference codes are keyed by the codec's identity: the sha256 of its config and weight
files. Hashing them read the whole codec (800 MB for Higgs's) in every run that encodes a voice.
With a store folder, the digest is written beside each file's resolved path, size, mtime, ctime
and inode; a later call whose files all still match returns it without reading them. Rewriting a
file changes its ctime (which no user call sets), so a match means the same file as hashed.
The digest is unchanged by the store: caches made before it stay valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Sequence


def _stat(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino}


def hash_files(files: Sequence[Path]) -> str:
    """Hex sha256 over each file in order: its name and size, then its bytes (read 1 MiB at a time)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while piece := fh.read(1 << 20):
                h.update(piece)
    return h.hexdigest()


def files_digest(files: Sequence[Path], store: Path | None = None) -> str:
    """hash_files(files), taken from store's record where every file is the one hashed there; a
    fresh digest is recorded (a store that cannot be written is skipped: the digest is still right)."""
    files = [Path(f) for f in files]
    stats = [_stat(f) for f in files]
    record = None
    if store is not None:
        name = hashlib.sha256("\0".join(s["path"] for s in stats).encode()).hexdigest()[:32]
        record = Path(store) / f"{name}.json"
        try:
            kept = json.loads(record.read_text())
            if kept.get("files") == stats and isinstance(kept.get("sha256"), str):
                return kept["sha256"]
        except (OSError, ValueError, AttributeError):
            pass  # none yet, or unreadable: hash again and replace it
    digest = hash_files(files)
    if record is not None and [_stat(f) for f in files] == stats:  # unchanged while it was read
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=record.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                json.dump({"files": stats, "sha256": digest}, fh)
            os.replace(tmp, record)
        except OSError:
            pass
    return digest
