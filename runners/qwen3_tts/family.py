"""Qwen3-TTS-12Hz as a ModelFamily (runners/family.py): loading, limits, prompts, the codec's rows,
reference voices (docs/design.md section 8).

The checkpoint is the released folder as it is (loading.py); its speech tokenizer is
``speech_tokenizer/`` inside it, so a config names only ``checkpoint`` (LoadSpec.codec is the
checkpoint, or an error). Sampling defaults come from generation_config.json (``limits``); the
talker's draw is the base Sampler's, the predictor's a second one (runner.py).

In-context cloning (Base): the reference returns the reference's codes decoded before the row's
and the audio from ``int(ref / total * samples)`` on; ``codec_prefix`` and ``prefix_cut`` give the
job's audio stage the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..device import Laps
from ..budget import KVShape, build_engine
from ..checkpoint import resolve_meta
from ..codec_stage import CodecStage
from ..errors import ConfigError
from ..family import AudioTurn, FamilyLimits, LoadSpec, ModelFamily, RenderedPrompt
from ..prompt_input import PromptInput
from .codec import Qwen3Codec
from .codec_config import SpeechTokenizerConfig
from .config import GenerationDefaults, Qwen3TTSConfig
from .encoder import SpeechEncoder
from .loading import (SPEECH_TOKENIZER, load_codec, load_encoder, load_speaker_encoder, load_talker, load_tokenizer,
                      read_checkpoint_limits, read_configs, resolve_checkpoint)
from .prompt import TalkerPrompt
from .prompter import ROW_FIELDS, Qwen3Prompter
from .runner import Qwen3Runner, slot_extra_bytes, sub_defaults
from .speaker import SpeakerEncoder


@dataclass(frozen=True)
class TalkerKVShape(KVShape):
    """The talker's KV shape; a slot's bytes also count its per-slot state beside the KV (predictor
    buffers, the next-input and trailing-text tables), so the budget keeps room for them."""

    extra_slot_bytes: int = 0

    def slot_bytes(self, max_seq_len: int, dtype: torch.dtype) -> int:
        return super().slot_bytes(max_seq_len, dtype) + self.extra_slot_bytes


def sampling_defaults(gen: GenerationDefaults) -> tuple:
    """generation_config.json's values as SamplingParams fields (temperature 0 where do_sample is
    false, at either level); max_new_tokens is not one: a run's max_new_frames stays the YAML's."""
    sub_t, sub_k, sub_p = sub_defaults(gen)
    return (("temperature", gen.temperature if gen.do_sample else 0.0), ("top_k", gen.top_k), ("top_p", gen.top_p),
            ("repetition_penalty", gen.repetition_penalty), ("subtalker_temperature", sub_t),
            ("subtalker_top_k", sub_k), ("subtalker_top_p", sub_p))


class Qwen3TTS(ModelFamily):

    # the reference generates a row whole, and its prompts take no system message or scene
    default_chunk_method = "none"
    unused_row_fields = ("scene", "system")
    def __init__(self, cfg: Qwen3TTSConfig, runner: Qwen3Runner, codec: Qwen3Codec, prompts: Qwen3Prompter,
                 folder: Path, codec_cfg: SpeechTokenizerConfig, device: torch.device):
        self.cfg = cfg
        self.runner = runner
        self.row_codec = codec
        self.codec = CodecStage(codec, device)
        self.prompts = prompts
        self.folder = folder  # the checkpoint: encoders load from it on first use
        self.codec_cfg = codec_cfg
        self.num_streams = cfg.num_streams
        self.sample_rate = codec.sample_rate
        self.frame_rate = codec.sample_rate / codec.hop_length
        self.kv_budget: dict | None = None
        self.load_phases: dict[str, float] = {}
        self._encoder: SpeechEncoder | None = None
        self._speaker: SpeakerEncoder | None = None

    @classmethod
    def load(cls, spec: LoadSpec) -> "Qwen3TTS":
        laps = Laps(spec.device)  # where start-up goes (run.json: timings.load_phases)
        if spec.codec and spec.codec != spec.checkpoint:
            raise ConfigError(spec.source, "codec", f"Qwen3-TTS reads its codec from {SPEECH_TOKENIZER}/ inside the "
                              f"checkpoint; leave codec out (got {spec.codec!r})")
        folder = resolve_checkpoint(spec.checkpoint)
        cfg, gen, codec_cfg = read_configs(folder)
        # built on the device in its dtype, then filled from model.safetensors in place
        talker = load_talker(folder, cfg, spec.max_seq_len, spec.dtype, spec.device)
        laps("weights_s")
        codec = load_codec(folder, cfg, codec_cfg, spec.dtype, spec.device)
        laps("codec_s")
        encoder = None
        if spec.encode_references:  # before the KV budget, which counts its memory
            try:
                encoder = load_encoder(folder, codec_cfg, spec.device)
            except Exception:  # noqa: BLE001  (encode_audio loads it again and raises: the references' rows fail)
                encoder = None
            laps("encoder_s")
        graphed_codec = spec.device.type == "cuda" and not spec.deterministic
        t = cfg.talker
        kv_shape = TalkerKVShape(t.num_hidden_layers, t.num_key_value_heads, t.head_dim,
                                 slot_extra_bytes(cfg, spec.max_seq_len, spec.dtype))
        engine, slots, budget = build_engine(spec, kv_shape, talker,
                                             CodecStage.call_bytes(codec, spec.dtype, graphed_codec))
        laps("kv_budget_s")
        runner = Qwen3Runner(engine, cfg, gen, slots, spec.max_seq_len, spec.device, spec.raw_logprobs)
        laps("cache_s")
        prompts = Qwen3Prompter(cfg, load_tokenizer(folder), codec_cfg)
        laps("tokenizer_s")
        family = cls(cfg, runner, codec, prompts, folder, codec_cfg, spec.device)
        family.kv_budget = budget
        family.load_phases = laps.done
        family._encoder = encoder
        return family

    @classmethod
    def limits(cls, checkpoint: str) -> FamilyLimits:
        """From config.json and generation_config.json. vocab_size is the code vocabulary (what a
        row's suppress_tokens may name; codebook 0's draw is over the talker's codec vocabulary,
        whose control ids the runner masks itself); codec EOS is the one control id it emits."""
        lim = read_checkpoint_limits(checkpoint)
        return FamilyLimits(num_streams=lim.num_streams, vocab_size=lim.code_vocab, control_ids=lim.control_ids,
                            min_audio_frames=1, max_positions=lim.max_positions,
                            sampling_defaults=sampling_defaults(lim.generation),
                            unused_fields=("ras_win_len", "ras_win_max_num_repeat"))

    @classmethod
    def prompter(cls, checkpoint: str, codec: str) -> Qwen3Prompter:
        """Configs and tokenizer only (a hub id fetches no weights); ``codec`` is not read."""
        folder = resolve_meta(checkpoint, "checkpoint")
        cfg = Qwen3TTSConfig.from_file(folder / "config.json")
        codec_cfg = SpeechTokenizerConfig.from_file(folder / SPEECH_TOKENIZER / "config.json")
        return Qwen3Prompter(cfg, load_tokenizer(folder), codec_cfg)

    @classmethod
    def row_fields(cls) -> dict[str, type]:
        return dict(ROW_FIELDS)

    def render_prompt(self, text: str, system: str, scene: str | None, context: tuple[AudioTurn, ...] = (),
                      fields: dict | None = None) -> RenderedPrompt:
        """``system`` and ``scene`` are ignored (prompter.py): the reference has no such turns."""
        return self.prompts.render_prompt(text, system, scene, context, fields)

    def encode_prompts(self, rendered: list[RenderedPrompt]) -> list[PromptInput]:
        return self.prompts.encode_prompts(rendered)

    def real_code_mask(self, tokens: np.ndarray) -> np.ndarray:
        """Entries below the code vocabulary (a row's frames never hold its EOS frame)."""
        return tokens < self.cfg.code_vocab

    # ---- reference voices (Base) ----
    def encode_audio(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """Mono float32 clips at sample_rate -> codes [frames, 16] int64 (the 12 Hz encoder, float32,
        loaded on the first call)."""
        if self._encoder is None:
            self._encoder = load_encoder(self.folder, self.codec_cfg, self.runner.device)
        return self._encoder.encode(clips)

    def speaker_embeddings(self, clips: list[np.ndarray]) -> list[np.ndarray] | None:
        """Base: each clip's x-vector [hidden] float32 (the speaker encoder in the talker's dtype, as
        the reference runs it inside its model); other checkpoints take none."""
        if self.cfg.tts_model_type != "base":
            return None
        if self._speaker is None:
            dtype = self.runner.model.codec_head.weight.dtype
            self._speaker = load_speaker_encoder(self.folder, self.cfg, self.runner.device, dtype)
        return [self._speaker.embed(c).float().cpu().numpy() for c in clips]

    def codec_files(self) -> list[Path]:
        """speech_tokenizer/'s config.json and model.safetensors."""
        return _codec_files(self.folder)

    @classmethod
    def codec_files_of(cls, spec: LoadSpec) -> list[Path]:
        return _codec_files(resolve_checkpoint(spec.checkpoint))

    def codec_prefix(self, prompt: PromptInput) -> np.ndarray | None:
        """An in-context row's reference codes [R, 16], decoded before its frames."""
        p = prompt.extra
        return p.ref_codes if isinstance(p, TalkerPrompt) and p.ref_codes is not None else None

    def prefix_cut(self, prefix_frames: int, total_frames: int, samples: int) -> int:
        """The reference's cut: int(ref_len / max(total_len, 1) * samples)."""
        return int(prefix_frames / max(total_frames, 1) * samples)


def _codec_files(folder: Path) -> list[Path]:
    tokenizer = folder / SPEECH_TOKENIZER
    return [tokenizer / "config.json", tokenizer / "model.safetensors"]
