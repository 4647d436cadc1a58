"""Model configs: YAML files under configs/, loaded into frozen dataclasses.

Every key is checked at load time. An unknown key, a wrong type or a missing
file is a ConfigError that names the YAML file and the key, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from omni_cli.errors import ConfigError
from omni_cli.quality.settings import parse_section
from omni_cli.voice_bank import parse_bank
from omni_cli.runners.sampling.params import FIELD_NAMES, INT_MAX, SamplingParams, check_field, short_repr


def _config_dir() -> Path:
    """configs/: inside the package where installed from a wheel, else beside it (a checkout)."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = "tiny-higgs-audio-v2"

DTYPES = ("float32", "bfloat16", "float16")
MAX_BATCH_SIZE = 1 << 16  # rows decoded at once: far past what one device's memory holds at any context


@dataclass(frozen=True)
class ModelConfig:
    path: Path  # the YAML file this came from
    family: str  # runner family, e.g. "higgs_audio_v2"
    checkpoint: str  # absolute local folder, or a hub id
    codec: str  # absolute local folder, or a hub id (a family whose checkpoint holds its codec: the checkpoint)
    dtype: str = "float32"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    max_batch_size: int = 8  # decode rows, and KV slots
    max_seq_len: int = 2048  # tokens per KV slot: prompt + generated frames
    async_decode: bool = False
    deterministic: bool = False  # batch-shape-invariant arithmetic (see runners/engine.py)
    system_prompt: str = "Generate audio following instruction."
    sampling: SamplingParams = field(default_factory=SamplingParams)
    sampling_set: tuple[str, ...] = ()  # the sampling keys the YAML sets (the checkpoint's defaults fill the rest)
    voices: dict = field(default_factory=dict)  # the voice bank: name -> omni_cli.voices.Voice
    quality: dict = field(default_factory=dict)  # the `quality:` section, keys checked (omni_cli/quality/settings.py)

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__
             if k not in ("path", "sampling", "voices", "sampling_set")}
        d["path"] = str(self.path)
        d["voices"] = {n: {"audio": str(v.path), "text": v.text} for n, v in self.voices.items()}
        d["sampling"] = self.sampling.as_record()
        return d


_TOP_KEYS = {
    "family": str,
    "checkpoint": str,
    "codec": str,
    "dtype": str,
    "device": str,
    "max_batch_size": int,
    "max_seq_len": int,
    "async_decode": bool,
    "deterministic": bool,
    "system_prompt": str,
    "sampling": dict,
    "voices": dict,
    "quality": dict,
}
_REQUIRED = ("family", "checkpoint")
# families whose codec is a folder of its own (Qwen3-TTS's is speech_tokenizer/ inside its checkpoint)
_SEPARATE_CODEC = ("higgs_audio_v2",)


def find_config(spec: str | Path | None) -> Path:
    """``--model`` takes a path to a YAML file or the name of a file in configs/."""
    spec = str(spec) if spec is not None else DEFAULT_CONFIG
    direct = Path(spec).expanduser()
    if direct.is_file():
        return direct.resolve()
    for name in (spec, f"{spec}.yaml", f"{spec}.yml"):
        candidate = CONFIG_DIR / name
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError(spec, None, f"no such config file, and no config of that name in {CONFIG_DIR} (known: {', '.join(known)})")


def _type_name(t: type) -> str:
    return {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping"}[t]


def _resolve_location(path: Path, key: str, value: str) -> str:
    """A folder relative to the YAML file, an absolute folder, or a hub id (owner/name[@revision])."""
    looks_local = value.startswith((".", "/", "~")) or (path.parent / value).exists()
    if looks_local:
        folder = (path.parent / Path(value).expanduser()).resolve()
        if not folder.is_dir():
            raise ConfigError(path, key, f"folder {folder} does not exist")
        return str(folder)
    repo, at, revision = value.partition("@")  # owner/name@revision: a commit, branch or tag
    if repo.count("/") != 1 or any(not part for part in repo.split("/")) or (at and not revision):
        raise ConfigError(path, key, f"{value!r} is neither an existing folder nor a hub id of the form "
                          f"owner/name or owner/name@revision")
    return value


def load_config(spec: str | Path | None) -> ModelConfig:
    path = find_config(spec)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(path, None, f"not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(path, None, "must be a mapping of keys to values")

    for key, value in raw.items():
        if key not in _TOP_KEYS:
            raise ConfigError(path, str(key), f"unknown key (known: {', '.join(_TOP_KEYS)})")
        want = _TOP_KEYS[key]
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if not ok:
            raise ConfigError(path, key, f"must be {_type_name(want)}, got {value!r}")
    for key in _REQUIRED + (("codec",) if raw.get("family") in _SEPARATE_CODEC else ()):
        if key not in raw:
            raise ConfigError(path, key, "is required")

    if raw.get("dtype", "float32") not in DTYPES:
        raise ConfigError(path, "dtype", f"must be one of {', '.join(DTYPES)}, got {raw['dtype']!r}")
    device = raw.get("device", "auto")
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(path, "device", f"must be auto, cpu, cuda or cuda:N, got {device!r}")
    for key, top in (("max_batch_size", MAX_BATCH_SIZE), ("max_seq_len", INT_MAX)):
        if key in raw and not 1 <= raw[key] <= top:
            raise ConfigError(path, key, f"must be from 1 to {top}, got {short_repr(raw[key])}")

    sampling = SamplingParams()
    for key, value in (raw.get("sampling") or {}).items():
        if key not in FIELD_NAMES:
            raise ConfigError(path, f"sampling.{key}", f"unknown key (known: {', '.join(FIELD_NAMES)})")
        try:
            sampling = sampling.with_overrides(**{key: value})
        except ValueError as e:
            raise ConfigError(path, f"sampling.{key}", str(e)) from None
    try:
        sampling.check_consistent()
    except ValueError as e:
        raise ConfigError(path, "sampling.min_new_frames", str(e)) from None

    values = {k: v for k, v in raw.items() if k not in ("sampling", "voices", "quality")}
    values["quality"] = parse_section(raw["quality"], path) if raw.get("quality") is not None else {}
    values["sampling_set"] = tuple(raw.get("sampling") or {})
    values["voices"] = parse_bank(raw["voices"], path) if raw.get("voices") else {}
    values["checkpoint"] = _resolve_location(path, "checkpoint", raw["checkpoint"])
    values["codec"] = _resolve_location(path, "codec", raw["codec"]) if "codec" in raw else values["checkpoint"]
    return ModelConfig(path=path, sampling=sampling, **values)


__all__ = ["ModelConfig", "load_config", "find_config", "check_field", "CONFIG_DIR", "DEFAULT_CONFIG"]
