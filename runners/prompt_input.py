"""A prompt as the engine runs it: token ids, plus audio codes that stand at some of them.

A reference voice (voice cloning) enters a prompt as placeholder tokens whose
embeddings come from audio codes, so two prompts with the same ids can hold
different audio. Everything that compares prompts (the engine's shared-prefix
KV, the prefill graphs) compares ``content``: the ids, with each audio
position's token replaced by a key of that frame's codes, so rows with
different audio never share KV.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class AudioSpan:
    """Audio codes fed at positions start .. start + len(codes) - 1 of a prompt."""

    start: int
    codes: np.ndarray  # [frames, streams] int64, the model's input codes at those positions

    def frame_keys(self) -> list[int]:
        """One negative int a frame (never a token id), equal for equal codes: a 63-bit BLAKE2b
        of the frame's codes."""
        codes = np.ascontiguousarray(self.codes, dtype=np.int64)
        return list(_frame_keys(codes.tobytes(), codes.shape[1] if codes.ndim == 2 else 1))


@functools.lru_cache(maxsize=256)  # keyed by the bytes: about 12 MB at 256 voices of 30 s
def _frame_keys(raw: bytes, streams: int) -> tuple[int, ...]:
    """frame_keys of the codes whose bytes are raw ([frames, streams] int64), kept for the next span of
    equal codes: every row cloning a voice holds one (a few hundred hashes a row otherwise)."""
    width = 8 * streams
    return tuple(-1 - (int.from_bytes(hashlib.blake2b(raw[i: i + width], digest_size=8).digest(), "little") >> 1)
                 for i in range(0, len(raw), width))


@dataclass(frozen=True)
class PromptInput:
    ids: list[int]  # every position's token id, audio placeholders included
    audio: tuple[AudioSpan, ...] = ()
    # a family's own per-row data beside the ids (Qwen3-TTS: its codec track, speaker, trailing text)
    extra: object = field(default=None, compare=False)
    # a family's content key where the ids alone do not tell prompts apart (equal keys: equal KV)
    key: tuple[int, ...] | None = field(default=None, compare=False)
    # the ids with each audio position replaced by its frame key (computed once), or the family's key
    content: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.key is not None:
            if len(self.key) != len(self.ids):
                raise ValueError(f"a content key of {len(self.key)} positions for a {len(self.ids)}-token prompt")
            object.__setattr__(self, "content", list(self.key))
            return
        content = list(self.ids)
        for span in self.audio:
            if span.start < 0 or span.start + len(span.codes) > len(content):
                raise ValueError(f"audio span at {span.start} of {len(span.codes)} frames outside a "
                                 f"{len(content)}-token prompt")
            content[span.start: span.start + len(span.codes)] = span.frame_keys()
        object.__setattr__(self, "content", content)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, prompt: "PromptInput | list[int]") -> "PromptInput":
        """A PromptInput as is, or a text-only one from token ids."""
        return prompt if isinstance(prompt, PromptInput) else cls(list(prompt))
