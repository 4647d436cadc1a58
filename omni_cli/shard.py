"""--shard i/n: split one prompt file's rows over n runs by a hash of each row's id.

A row belongs to shard int.from_bytes(blake2b(id, digest_size=8), 'little') % n:
the same on every run, machine and Python version (Python's hash() is salted
per process). Each shard's folder holds only its rows; `omni merge` joins them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, TypeVar

from omni_cli.errors import OmniError

T = TypeVar("T")
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, rid: str) -> bool:
        return shard_of(rid, self.count) == self.index

    def select(self, rows: Iterable[T]) -> list[T]:
        """The rows (anything with an ``id``) of this shard, in their order."""
        return [r for r in rows if self.holds(r.id)]


def shard_of(rid: str, count: int) -> int:
    """The shard (0 <= shard < count) of a row id."""
    digest = hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % count


def parse_shard(spec: str | None) -> Shard | None:
    """'i/n' with 0 <= i < n, or None; an OmniError (exit 2) names the flag otherwise."""
    if spec is None:
        return None
    m = _SPEC.match(spec)
    if not m:
        raise OmniError(f"--shard: expected i/n (e.g. 0/4), got {spec!r}")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 0 <= index < count:
        raise OmniError(f"--shard {spec}: needs 0 <= i < n (n >= 1)")
    return Shard(index, count)
