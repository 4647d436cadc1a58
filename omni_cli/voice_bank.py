"""The voice bank: names for reference voices, from a model config's ``voices:`` or a ``--voices`` file.

Each entry is a reference clip and its transcript; a row says ``voice: NAME``
instead of giving ``ref_audio``/``ref_text`` (omni_cli/voices.py reads and encodes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from omni_cli.errors import ConfigError


@dataclass(frozen=True)
class Voice:
    path: Path  # the audio file, absolute
    text: str  # its transcript
    name: str | None = None  # the bank's name; None for a row's own ref_audio


def parse_bank(raw: object, source: Path, key: str = "voices") -> dict[str, Voice]:
    """A YAML mapping name -> {audio, text}; audio paths relative to ``source``'s folder."""
    if not isinstance(raw, dict):
        raise ConfigError(source, key, "must be a mapping of voice names to {audio, text}")
    bank = {}
    for name, entry in raw.items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError(source, where, "a voice name must be a non-empty string")
        if not isinstance(entry, dict) or set(entry) - {"audio", "text"}:
            raise ConfigError(source, where, "must be a mapping with the keys audio and text")
        for field in ("audio", "text"):
            if not isinstance(entry.get(field), str) or not entry[field].strip():
                raise ConfigError(source, f"{where}.{field}", "must be a non-empty string")
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", entry["audio"]):
            raise ConfigError(source, f"{where}.audio", f"{entry['audio']!r} is a URL: omni reads local files; "
                              "download the clip and give its path (relative to this file)")
        bank[name] = Voice((source.parent / Path(entry["audio"]).expanduser()).resolve(), entry["text"], name)
    return bank


def read_bank_file(path: Path) -> dict[str, Voice]:
    """``--voices voices.yaml``: a file whose top level is ``voices:``, or the mapping itself."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(path, None, f"cannot read the voice bank: {e}") from None
    if isinstance(raw, dict) and set(raw) == {"voices"}:
        return parse_bank(raw["voices"], path.resolve())
    return parse_bank(raw, path.resolve(), key="")
