"""The model-family contract: what a family provides, and the registry from a config's ``family:``.

The job (omni_cli) calls only what is declared here. A family is a package under
runners/ with a ``ModelFamily`` subclass; Higgs Audio v2 is the first
(runners/higgs_audio_v2/family.py). docs/design.md shows how Qwen3-TTS's parts
map onto it.

What a family provides:
- loading from a ``LoadSpec`` (the config's values, passed down: runners never
  reads the YAML), on the device, in its real checkpoint format;
- its runner: a ``ModelRunner`` (runners/base.py) with the model's hooks;
- prompt building from a row's fields (``render_prompt``, ``encode_prompts``):
  text now, reference audio later, as ``PromptInput`` (runners/prompt_input.py);
- its frame layout: streams a frame, frames a second, the sample rate, and
  which sampled entries are real codes;
- its codec as a ``RowCodec``: where a row's codes are and how to decode a
  padded batch, which the generic codec stage (runners/codec_stage.py) batches;
  optionally encoding reference audio to codes (``encode_audio``, keyed for caches
  by ``codec_identity``);
- its inputs to the memory budget (runners/budget.py): the KV shape, the model
  to measure a prefill on, the codec's bytes a frame.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from .base import ModelRunner
from .codec_stage import CodecStage
from .device import describe, priority_stream
from .errors import ConfigError
from .prompt_input import PromptInput

# family name (the YAML's `family:`) -> its module under runners/ and its ModelFamily class
_REGISTRY = {"higgs_audio_v2": (".higgs_audio_v2.family", "HiggsAudioV2"),
             "qwen3_tts": (".qwen3_tts.family", "Qwen3TTS")}


@dataclass(frozen=True)
class LoadSpec:
    """What loading needs from the job's config and flags."""

    source: str  # where these settings came from (the YAML's path), for error messages
    checkpoint: str  # a local folder or a hub id
    codec: str  # a local folder or a hub id
    dtype: torch.dtype
    device: torch.device
    max_batch_size: int  # KV slots wanted (the budget may grant fewer)
    max_seq_len: int  # KV positions a slot
    deterministic: bool  # batch-invariant shapes (runners/engine.py)
    raw_logprobs: bool = False  # also report the unprocessed model logprobs
    # some row's reference has no codes in the job's cache: the encoder loads with the model (beside
    # its weights where the family can, and before the KV budget, which then counts its memory)
    encode_references: bool = False


@dataclass(frozen=True)
class FamilyLimits:
    """What a family's checkpoint allows, read from its config alone (no weights): rows and flags
    are checked against it before anything loads."""

    num_streams: int  # sampled entries a frame
    vocab_size: int  # entries a stream samples from, control ids included
    control_ids: tuple[int, ...]  # ids the model forces itself (Higgs: stream BOS/EOS), never suppressed
    min_audio_frames: int = 1  # the fewest generated frames that hold one frame of audio (Higgs: its delay ramp)
    max_positions: int | None = None  # the longest context the checkpoint names (max_position_embeddings)
    sampling_defaults: tuple = ()  # (field, value) the checkpoint's generation config sets, under the YAML's
    unused_fields: tuple[str, ...] = ()  # sampling fields this model does not read: setting one is an error


@dataclass(frozen=True)
class AudioTurn:
    """An earlier turn of a prompt's conversation: the words, and the voice saying them as codec
    codes (a reference clip, or a long row's previous chunk)."""

    text: str | None  # None: a voice given by its sound alone (Qwen3-TTS's x_vector_only_mode)
    codes: np.ndarray  # [frames, num_streams] int64 codec codes (no stream BOS/EOS, no delay)
    speaker: np.ndarray | None = None  # [D] float32: the voice's speaker embedding, where the family takes one


@dataclass(frozen=True)
class RenderedPrompt:
    """A row's prompt before tokenizing: the chat template's text, and each audio turn's codes in order."""

    text: str
    audio: tuple[np.ndarray, ...] = ()
    data: object = None  # a family's own rendering beside the text (Qwen3-TTS: its talker prompt)


@dataclass(frozen=True)
class FieldProblem:
    field: str
    message: str
    warning: bool = False  # the row runs, and its manifest entry says so (the reference ignores the field)


class PromptFieldError(ValueError):
    """A row field the family cannot build a prompt from: (field, message)."""

    def __init__(self, field: str, message: str):
        super().__init__(field, message)
        self.field, self.message = field, message


class Prompter(Protocol):
    """A family's prompt building, from its checkpoint's config and tokenizer alone (no weights):
    what the loaded family renders and tokenizes with, and what validation checks rows with
    before anything loads."""

    sample_rate: int  # the codec's audio samples a second (reference clips are resampled to it)
    frame_rate: float  # codec frames a second
    num_streams: int  # codes a frame

    def render_prompt(self, text: str, system: str, scene: str | None, context: tuple[AudioTurn, ...] = (),
                      fields: dict | None = None) -> RenderedPrompt:
        """As ModelFamily.render_prompt."""

    def encode_prompts(self, rendered: list[RenderedPrompt]) -> list[PromptInput]:
        """As ModelFamily.encode_prompts."""

    def field_problems(self, fields: dict, reference: bool, ref_text: bool) -> list["FieldProblem"]:
        """What is wrong with a row's family fields (``row_fields``), given whether it has a reference
        clip and a transcript of it: errors fail the row, warnings go into its manifest entry."""

    def reference_frames(self, samples: int) -> int:
        """Codec frames that encoding a clip of this many samples (at sample_rate) gives; 0 where it
        is too short to encode."""


class RowCodec(Protocol):
    """A family's codec, as the codec stage sees it. Rows are generated frames [T, num_streams]."""

    num_streams: int
    sample_rate: int  # audio samples a second
    hop_length: int  # audio samples a codec frame

    def span(self, tokens: np.ndarray) -> tuple[int, int]:
        """(first, n): the row's codes start at generated frame `first` and give n codec frames (0: no audio)."""

    def codes_into(self, out: np.ndarray, tokens: np.ndarray, first: int, n: int) -> None:
        """Write the row's codec codes into out [num_streams, >= n] int64, in place."""

    def decode(self, codes_gpu: torch.Tensor, lengths_gpu: torch.Tensor | None) -> torch.Tensor:
        """codes [B, num_streams, T] (valid lengths [B], or None: all T) -> audio [B, T * hop_length] float."""

    def frame_bytes(self, dtype: torch.dtype) -> int:
        """Peak device memory a codec frame takes in a batched call (the memory budget's input)."""


class ModelFamily(abc.ABC):
    """One model family, loaded. ``load`` builds it; the job uses only these members."""

    default_chunk_method: str = "auto"  # long text's chunking when the run names none (omni_cli/longform.py)
    unused_row_fields: tuple[str, ...] = ()  # common row fields this family's prompts ignore: giving one fails the row

    runner: ModelRunner  # the step hooks (runners/base.py)
    codec: CodecStage  # the family's RowCodec inside the generic codec stage
    num_streams: int  # sampled entries a frame (codebooks)
    frame_rate: float  # frames a second
    sample_rate: int  # audio samples a second
    kv_budget: dict | None  # the memory budget's terms (run.json); None on the CPU
    load_phases: dict[str, float]  # seconds per loading phase (run.json)

    @classmethod
    @abc.abstractmethod
    def load(cls, spec: LoadSpec) -> "ModelFamily":
        """Weights, codec, KV cache and engine on spec.device; the tokenizer."""

    @classmethod
    @abc.abstractmethod
    def limits(cls, checkpoint: str) -> FamilyLimits:
        """The checkpoint's limits from its config file alone: validation reads no weights."""

    @property
    def num_slots(self) -> int:
        """Requests that run at once (the budget may grant fewer than spec.max_batch_size)."""
        return self.runner.num_slots

    # ---- device matters the job asks about, never decides ----
    @property
    def device_name(self) -> str:
        return describe(self.runner.device)

    @property
    def warms_up(self) -> bool:
        """Whether first-use costs (graph captures, kernel compiles, cuDNN plans) are worth a
        warm-up before the first row: on CUDA, not on the CPU."""
        return self.runner.device.type == "cuda"

    @property
    def batched_codec(self) -> bool:
        """Rows go through the codec together (CUDA, default mode); else each alone at its own
        length, so a row's audio bytes never depend on what finished with it (a batched CPU
        conv rounds differently too)."""
        return self.runner.device.type == "cuda" and not self.runner.engine.deterministic

    def loop_stream(self) -> contextlib.AbstractContextManager:
        """Where the decode loop runs: a stream of the highest priority on CUDA, ahead of the codec's."""
        return priority_stream(self.runner.device)

    @classmethod
    def prompter(cls, checkpoint: str, codec: str) -> Prompter | None:
        """Prompt building without weights (validation); None where the family has none."""
        return None

    @classmethod
    def row_fields(cls) -> dict[str, type]:
        """Row fields of this family's own beside the common ones (text, scene, system, the
        reference, sampling), by name, with the type a value must have."""
        return {}

    @abc.abstractmethod
    def render_prompt(self, text: str, system: str, scene: str | None, context: tuple[AudioTurn, ...] = (),
                      fields: dict | None = None) -> RenderedPrompt:
        """A row's prompt (the checkpoint's chat template), after the earlier turns in ``context``,
        with the row's own ``row_fields`` values; PromptFieldError names a bad field."""

    @abc.abstractmethod
    def encode_prompts(self, rendered: list[RenderedPrompt]) -> list[PromptInput]:
        """Rendered prompts -> what the engine runs, in one batch (audio turns as AudioSpans)."""

    @abc.abstractmethod
    def real_code_mask(self, tokens: np.ndarray) -> np.ndarray:
        """tokens [T, num_streams] -> bool, True where an entry is an audio code (not a control token)."""

    def encode_audio(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """Reference audio to codes (voice cloning); optional. clips: mono float32 [samples]
        each, at the family's sample_rate (the caller resamples). Returns codes
        [frames, num_streams] int64 each, in order. NotImplementedError where the family
        cannot encode."""
        raise NotImplementedError(f"{type(self).__name__} does not encode reference audio")

    def speaker_embeddings(self, clips: list[np.ndarray]) -> list[np.ndarray] | None:
        """A speaker embedding [D] float32 of each clip (mono, at sample_rate) where the family's prompts
        take one (AudioTurn.speaker); None where they do not."""
        return None

    def codec_prefix(self, prompt: PromptInput) -> np.ndarray | None:
        """Generated-frame rows [F, num_streams] the codec decodes before a row's own frames (Qwen3-TTS's
        in-context reference), or None; the audio is then cut by ``prefix_cut``."""
        return None

    def prefix_cut(self, prefix_frames: int, total_frames: int, samples: int) -> int:
        """Samples of a decode of prefix + row frames that belong to the prefix (and are dropped)."""
        return prefix_frames * self.codec.hop_length

    def codec_files(self) -> list[Path]:
        """The files whose bytes make the codec (its config, then the weight files it loads), in a
        fixed order: what ``codec_identity`` hashes."""
        raise NotImplementedError(f"{type(self).__name__} does not encode reference audio")

    @classmethod
    def codec_files_of(cls, spec: LoadSpec) -> list[Path]:
        """codec_files from the spec alone, before loading (the job's voice cache is keyed on them)."""
        raise NotImplementedError(f"{cls.__name__} does not encode reference audio")

    def codec_identity(self, store: Path | None = None) -> str:
        """A stable name of the codec's weights and config, "sha256:" + runners/digest.py's digest of
        codec_files, for cache keys of encoded references: equal strings, equal codes for equal
        audio. store: where the digest is remembered across runs (the job's cache folder), so a
        later run reads no file to name the codec. Computed once per loaded family."""
        if self.__dict__.get("_codec_identity") is None:
            self._codec_identity = codec_identity_of(self.codec_files(), store)
        return self._codec_identity


def codec_identity_of(files: list[Path], store: Path | None = None) -> str:
    """ModelFamily.codec_identity of these codec files (before a load: ModelFamily.codec_files_of)."""
    from .digest import files_digest

    return "sha256:" + files_digest(files, store)


def family_names() -> list[str]:
    return sorted(_REGISTRY)


def family_class(name: str, source: object = None) -> type[ModelFamily]:
    """The registered family's class, imported on first use (a family's imports are heavy)."""
    if name not in _REGISTRY:
        raise ConfigError(source, "family", f"unknown family {name!r} (known: {', '.join(family_names())})")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module, __package__), cls)
