"""Row seeds, with sglang-omni's scheme so a seed means the same in both tools.

derive(namespace, seed, label) = BLAKE2b-64 of "namespace:seed[:label]" (UTF-8),
read little-endian, masked to 31 bits.
"""

from __future__ import annotations

import hashlib
import secrets

from .params import SEED_MASK

ROW_NAMESPACE = "omni-cli-row"


def derive_seed(namespace: str, seed: int, label: str | None = None) -> int:
    parts = [namespace, str(seed)] + ([label] if label is not None else [])
    digest = hashlib.blake2b(":".join(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & SEED_MASK


def row_seed(row_seed_value: int | None, run_seed: int | None, row_id: str) -> int:
    """The row's own seed, else one derived from (run seed, row id), else fresh random bits."""
    if row_seed_value is not None:
        return row_seed_value & SEED_MASK
    if run_seed is not None:
        return derive_seed(ROW_NAMESPACE, run_seed & SEED_MASK, row_id)
    return secrets.randbits(31)
