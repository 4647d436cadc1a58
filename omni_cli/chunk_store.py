"""A long row's finished chunks on disk, so that --resume goes on from the last one.

OUT/.chunks/<id>/row.json   the row's row_hash and seed when its first chunk was kept
OUT/.chunks/<id>/<k>.npz    chunk k: tokens, logprobs (raw_logprobs), samples, finish reason

Each chunk is written (under a partial name, then renamed) as soon as its audio is decoded, on a
writer thread; the row's folder is removed once the row's files are written. --resume takes the
longest run of chunks 0..j-1 of a row whose row_hash matches (the chunk texts, the buffer, the
sampling values and the model are in it) and its recorded seed, and queues chunk j after them:
chunk j's prompt holds their codes as an uninterrupted run's would, so under --deterministic the
row comes out byte-identical. The last chunk is never taken from here (a row killed after it is
redone from it), so a resumed row always has a chunk to run.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from omni_cli.folder import CHUNKS as FOLDER


class ChunkStore:
    def __init__(self, out: Path):
        self.root = out / FOLDER

    def save(self, rid: str, digest: str, seed: int, k: int, part: tuple, finish_reason: str) -> None:
        """part: (tokens, logprobs, raw logprobs or None, int16 samples). An OSError (a full disk) only
        costs a later --resume this chunk."""
        tokens, logprobs, raw, samples = part
        folder = self.root / rid
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if k == 0 or not (folder / "row.json").is_file():
                _atomic(folder / "row.json", json.dumps({"row_hash": digest, "seed": seed}).encode())
            arrays = {"tokens": tokens, "logprobs": logprobs, "samples": samples,
                      "finish_reason": np.array(finish_reason)}
            if raw is not None:
                arrays["raw_logprobs"] = raw
            tmp = folder / f".{k}.partial.npz"
            np.savez(tmp, **arrays)
            os.replace(tmp, folder / f"{k}.npz")
        except OSError:
            pass

    def load(self, rid: str, digest: str, n: int) -> tuple[int, list[tuple], list[str]] | None:
        """(seed, parts of chunks 0..j-1, their finish reasons) for a row whose kept chunks match its
        row_hash, j < n; None when there are none (a changed row's are removed)."""
        folder = self.root / rid
        try:
            meta = json.loads((folder / "row.json").read_text())
        except (OSError, ValueError):
            return None
        if meta.get("row_hash") != digest or not isinstance(meta.get("seed"), int):
            self.clear(rid)
            return None
        parts, reasons = [], []
        for k in range(n - 1):
            try:
                with np.load(folder / f"{k}.npz", allow_pickle=False) as z:
                    raw = z["raw_logprobs"] if "raw_logprobs" in z.files else None
                    parts.append((z["tokens"], z["logprobs"], raw, z["samples"]))
                    reasons.append(str(z["finish_reason"]))
            except (OSError, ValueError, KeyError):
                break
        return (meta["seed"], parts, reasons) if parts else None

    def clear(self, rid: str) -> None:
        shutil.rmtree(self.root / rid, ignore_errors=True)

    def clear_all(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)
