"""Per-row sampling parameters and their validation.

One frozen dataclass is shared by the YAML defaults, the CLI overrides and the
prompt rows, so a value is checked the same way wherever it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

# Seeds live in 0..2^31-1, masked the way sglang-omni masks them, so a seed
# means the same thing in both tools.
SEED_MASK = 0x7FFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    min_p: float = 0.0  # 0 disables
    repetition_penalty: float = 1.0  # 1 disables
    ras_win_len: int = 0  # repetition-aware sampling window in frames; 0 disables
    ras_win_max_num_repeat: int = 2  # resample a code seen this often in the window
    suppress_tokens: tuple[int, ...] = ()
    max_new_frames: int = 1024
    min_new_frames: int = 0  # stream-EOS is not allowed before this many frames
    # a code predictor's draws inside a frame (Qwen3-TTS's subtalker); None: the model has none, or its default
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_overrides(self, **values: Any) -> "SamplingParams":
        """Copy with the non-None values applied, each checked by ``check_field``."""
        given = {k: check_field(k, v) for k, v in values.items() if v is not None}
        return replace(self, **given)

    def check_consistent(self) -> None:
        """Checks across fields, once all overrides are applied."""
        if self.min_new_frames > self.max_new_frames:
            raise ValueError(f"min_new_frames ({self.min_new_frames}) exceeds max_new_frames ({self.max_new_frames})")

    def as_record(self) -> dict[str, Any]:
        """The values as a manifest records them (enough to regenerate the row); a field a model does
        not use (None) is left out."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        d["suppress_tokens"] = list(self.suppress_tokens)
        return d


FIELD_NAMES = tuple(f.name for f in fields(SamplingParams))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


# Bounds past which the arithmetic stops meaning anything: scores / temperature and a penalty's
# division or product overflow float32 (inf, then NaN logprobs) long before float64 would.
MAX_TEMPERATURE = 100.0
PENALTY_RANGE = (1e-2, 1e2)
# every integer field reaches the device as a table entry; a kernel may read it as int32
INT_MAX = 2**31 - 1

# field -> (kind, valid range, what the message asks for); every number must also be finite
_RULES: dict[str, tuple[type, Any, str]] = {
    "temperature": (float, lambda v: 0 <= v <= MAX_TEMPERATURE,
                    f"a number >= 0 and <= {MAX_TEMPERATURE:g} (0 means greedy)"),
    "top_k": (int, lambda v: 0 <= v <= INT_MAX, f"an integer from 0 to {INT_MAX} (0 disables)"),
    "top_p": (float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (float, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "repetition_penalty": (float, lambda v: PENALTY_RANGE[0] <= v <= PENALTY_RANGE[1],
                           f"a number > 0, from {PENALTY_RANGE[0]:g} to {PENALTY_RANGE[1]:g} (1 disables)"),
    "ras_win_len": (int, lambda v: 0 <= v <= INT_MAX, f"an integer from 0 to {INT_MAX} (0 disables)"),
    "ras_win_max_num_repeat": (int, lambda v: 1 <= v <= INT_MAX, f"an integer from 1 to {INT_MAX}"),
    "max_new_frames": (int, lambda v: 1 <= v <= INT_MAX, f"an integer from 1 to {INT_MAX}"),
    "min_new_frames": (int, lambda v: 0 <= v <= INT_MAX, f"an integer from 0 to {INT_MAX}"),
}
_RULES |= {f"subtalker_{name}": _RULES[name] for name in ("temperature", "top_k", "top_p")}
SUBTALKER_FIELDS = ("subtalker_temperature", "subtalker_top_k", "subtalker_top_p")


def _finite(v: Any) -> bool:
    """A number float64 holds finitely: an integer past float64's range (10**400) is not one."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def check_field(name: str, value: Any) -> Any:
    """Validate one sampling field; returns the normalised value or raises ValueError."""
    if name == "suppress_tokens":
        if not isinstance(value, (list, tuple)) or not all(_is_int(t) and 0 <= t <= INT_MAX for t in value):
            raise ValueError(f"must be a list of token ids from 0 to {INT_MAX}, got {short_repr(value)}")
        return tuple(value)
    if name not in _RULES:
        raise ValueError(f"unknown sampling field {name!r}")
    kind, ok, wanted = _RULES[name]
    typed = _is_int(value) if kind is int else _is_number(value) and _finite(value)  # NaN, inf fail
    if not typed or not ok(value):
        raise ValueError(f"must be {wanted}, got {short_repr(value)}")
    return kind(value)


def short_repr(value: Any, limit: int = 80) -> str:
    """A value's repr for a message, cut short: a 5,000-digit integer must not fill the screen."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300 digits for str()
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def limit_problems(params: "SamplingParams", vocab_size: int, control_ids: tuple[int, ...],
                   max_seq_len: int, min_audio_frames: int = 1) -> list[tuple[str, str]]:
    """(field, reason) for each value a model of this vocabulary and context cannot run: ids
    outside the vocabulary (an index error on the device), control ids (suppressing one breaks
    the frames the model forces, e.g. the stream-BOS ramp), RAS windows past the context (a
    window is allocated per row), more frames than the context holds, fewer than the first
    frame of audio needs (min_audio_frames: Higgs's delay pattern takes 9 for one frame)."""
    out = []
    bad = [t for t in params.suppress_tokens if t >= vocab_size]
    if bad:
        out.append(("suppress_tokens", f"ids {short_repr(bad)} are outside the model's {vocab_size} codes"))
    forced = [t for t in params.suppress_tokens if t in control_ids]
    if forced:
        out.append(("suppress_tokens", f"ids {forced} are control ids the model forces (stream BOS/EOS); "
                                       "suppressing them breaks the frames it must emit"))
    if params.max_new_frames > max_seq_len:
        out.append(("max_new_frames", f"{params.max_new_frames} frames do not fit max_seq_len {max_seq_len}"))
    elif params.max_new_frames < min_audio_frames:
        out.append(("max_new_frames", f"{params.max_new_frames} frames give no audio: this model needs at least "
                                      f"{min_audio_frames} for its first frame of audio"))
    if params.ras_win_len > max_seq_len:
        out.append(("ras_win_len", f"{params.ras_win_len} frames is longer than the context (max_seq_len "
                                   f"{max_seq_len})"))
    if params.min_new_frames > params.max_new_frames:
        out.append(("min_new_frames", f"min_new_frames ({params.min_new_frames}) exceeds max_new_frames "
                                      f"({params.max_new_frames})"))
    return out


def check_seed(value: Any) -> int:
    """A seed is any integer; it is masked to 31 bits like sglang-omni's resolve_row_seed
    (seed_masked says when that changed it)."""
    if not _is_int(value):
        raise ValueError(f"must be an integer, got {short_repr(value)}")
    return value & SEED_MASK


def seed_masked(value: int) -> str | None:
    """Why a seed outside [0, 2^31) means another one (a warning), or None."""
    if 0 <= value <= SEED_MASK:
        return None
    return (f"seed {short_repr(value)} is outside 0..{SEED_MASK}: it is masked to 31 bits, giving {value & SEED_MASK} "
            f"(the same draws as seed {value & SEED_MASK})")
