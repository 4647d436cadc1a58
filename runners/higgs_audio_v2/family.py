"""Higgs Audio v2 as a ModelFamily (runners/family.py): loading, prompts, the codec's rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..device import Laps, default_dtype
from ..budget import KVShape, build_engine
from ..checkpoint import INDEX, PTH, SINGLE, resolve_file, resolve_folder, resolve_meta, stream_into, weight_files
from ..codec_stage import CodecStage
from ..family import AudioTurn, FamilyLimits, LoadSpec, ModelFamily, PromptFieldError, RenderedPrompt
from ..prompt_input import PromptInput
from ..sampling.params import SUBTALKER_FIELDS
from .codec import HiggsCodecDecoder
from .codec_layout import frame_config
from .config import HiggsConfig
from .encoder import HiggsCodecEncoder
from .layouts import ORIGINAL, chat_template_fallback, lm_key, lm_layout, read_config
from .model import HiggsAudioV2LM
from .prompt import HiggsPrompter, PromptBuilder
from .runner import HiggsRunner

# present in released checkpoints, unused for generation (as in transformers,
# which lists it in _keys_to_ignore_on_load_unexpected)
IGNORED_KEYS = ("text_lm_head.weight",)
# a codec call's peak device memory a frame in bf16 (twice that in float32): the released
# codec's measured peak, rounded up (benchmarks/codec_decode.py)
CODEC_FRAME_BYTES = 350 << 10


class HiggsCodec:
    """The codec stage's view of Higgs's rows (a RowCodec).

    Generated frames [T, C] -> codec codes [C, T'], as HiggsAudioV2Processor.batch_decode:
    drop everything up to the last all-BOS frame and from the first all-EOS frame on
    (``span``), revert the delay pattern (codebook k read k frames later) and clip stream
    tokens into the code range (``codes_into``). T' = T_inner - C + 1, or 0."""

    def __init__(self, cfg: HiggsConfig, decoder: HiggsCodecDecoder):
        if decoder.num_quantizers != cfg.num_codebooks:
            raise ValueError(f"codec has {decoder.num_quantizers} quantizers, the model {cfg.num_codebooks} codebooks")
        self.decoder = decoder
        self.num_streams = cfg.num_codebooks
        self.sample_rate = decoder.sample_rate
        self.hop_length = decoder.hop_length
        self._bos, self._eos = cfg.audio_stream_bos_id, cfg.audio_stream_eos_id

    def span(self, tokens: np.ndarray) -> tuple[int, int]:
        """(first, n) for generated frames [T, C]: the inner frames (after the last all-BOS frame,
        before the first all-EOS one after it) start at `first`, and give n codec frames."""
        all_bos = np.flatnonzero((tokens == self._bos).all(axis=1))
        start = int(all_bos[-1]) if all_bos.size else 0
        all_eos = np.flatnonzero((tokens[start:] == self._eos).all(axis=1))
        end = start + int(all_eos[0]) if all_eos.size else len(tokens)
        first = start + 1
        return first, max(end - first - self.num_streams + 1, 0)

    def codes_into(self, out: np.ndarray, tokens: np.ndarray, first: int, n: int) -> None:
        """out [C, >= n] int64: codebook k's codes are tokens[first + k : first + k + n, k] (the
        delay pattern reverted), clipped into the code range; written in place."""
        for k in range(self.num_streams):
            np.clip(tokens[first + k: first + k + n, k], 0, self._bos - 1, out=out[k, :n])

    def decode(self, codes_gpu: torch.Tensor, lengths_gpu: torch.Tensor | None) -> torch.Tensor:
        return self.decoder.decode(codes_gpu, lengths_gpu)

    @staticmethod
    def frame_bytes(dtype: torch.dtype) -> int:
        return CODEC_FRAME_BYTES * (torch.finfo(dtype).bits // 8) // 2


class HiggsAudioV2(ModelFamily):
    def __init__(self, cfg: HiggsConfig, runner: HiggsRunner, codec: HiggsCodec, prompts: HiggsPrompter,
                 device: torch.device):
        self.cfg = cfg
        self.runner = runner
        self.row_codec = codec
        self.codec = CodecStage(codec, device)
        self.prompts = prompts
        self.num_streams = cfg.num_codebooks
        self.sample_rate = codec.sample_rate
        self.frame_rate = codec.sample_rate / codec.hop_length
        self.kv_budget: dict | None = None
        self.load_phases: dict[str, float] = {}
        self.codec_dir: Path | None = None  # set by load: the encoder is read from it on first use
        self.encoder_dtype = torch.float32  # the encoder's, whatever the LM's
        self._encoder: HiggsCodecEncoder | None = None

    @classmethod
    def load(cls, spec: LoadSpec) -> "HiggsAudioV2":
        laps = Laps(spec.device)  # where start-up goes (run.json: timings.load_phases)
        lm_dir = resolve_folder(spec.checkpoint, "checkpoint")
        codec_dir = resolve_folder(spec.codec, "codec", pth=True)
        cfg = HiggsConfig.from_file(lm_dir / "config.json")
        read = None
        if spec.encode_references:  # the encoder's tensors read beside the LM's load
            pool = ThreadPoolExecutor(1, thread_name_prefix="omni-encoder-read")
            read = pool.submit(HiggsCodecEncoder.read, codec_dir)
            pool.shutdown(wait=False)
        with torch.device(spec.device), default_dtype(spec.dtype):
            # built where and as it will run: a 5.4 B-parameter model initialised in float32 on
            # the host would dominate start-up
            model = HiggsAudioV2LM(cfg, spec.max_seq_len)
        laps("model_s")  # the first CUDA work: includes creating the context
        rename = lm_key if cfg.layout == ORIGINAL else None  # the original's keys, renamed as they stream
        stream_into(model, lm_dir, ignore=IGNORED_KEYS, rename=rename)  # into the tensors just made, on the device
        laps("weights_s")
        model = model.to_runtime(spec.device, spec.dtype)
        laps("fuse_s")
        codec = HiggsCodec(cfg, HiggsCodecDecoder.load(codec_dir, spec.dtype, spec.device))
        laps("codec_s")
        encoder = None
        if read is not None:  # built here, before the KV budget (which counts its memory): modules take the
            # process's default dtype, which the LM's load sets. NOTE: never build modules off the main thread
            try:
                encoder = HiggsCodecEncoder.from_state(*read.result(), torch.float32, spec.device, cfg.num_codebooks,
                                                       codec_dir)
            except Exception:  # noqa: BLE001  (encode_audio loads it again and raises: the references' rows fail)
                encoder = None
            laps("encoder_s")
            if encoder is not None:
                encoder.warm_up()  # before the KV budget reads free memory: its caches are counted
                laps("encoder_warmup_s")
        graphed_codec = spec.device.type == "cuda" and not spec.deterministic
        kv_shape = KVShape(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
        engine, slots, budget = build_engine(spec, kv_shape, model,
                                             CodecStage.call_bytes(codec, spec.dtype, graphed_codec))
        laps("kv_budget_s")
        runner = HiggsRunner(engine, cfg, slots, spec.max_seq_len, spec.device, spec.raw_logprobs)
        laps("cache_s")
        prompts = _prompter(lm_dir, cfg, codec_dir / "config.json")
        laps("tokenizer_s")
        family = cls(cfg, runner, codec, prompts, spec.device)
        family.kv_budget = budget
        family.load_phases = laps.done
        family.codec_dir = codec_dir
        family._encoder = encoder
        return family

    @classmethod
    def limits(cls, checkpoint: str) -> FamilyLimits:
        path = resolve_file(checkpoint, "config.json", "checkpoint")
        raw = read_config(path)
        if lm_layout(raw, path) == ORIGINAL:  # its config is read with its tokenizer (layouts.py)
            resolve_file(checkpoint, "tokenizer.json", "checkpoint")
        cfg = HiggsConfig.from_file(path)
        positions = (raw.get("text_config") or {}).get("max_position_embeddings") or raw.get("max_position_embeddings")
        # the BOS frame, then num_codebooks - 1 frames of the delay ramp before codebook 0's first code is whole
        return FamilyLimits(num_streams=cfg.num_codebooks, vocab_size=cfg.codebook_size,
                            control_ids=(cfg.audio_stream_bos_id, cfg.audio_stream_eos_id),
                            min_audio_frames=cfg.num_codebooks + 1,
                            max_positions=positions if isinstance(positions, int) else None,
                            unused_fields=SUBTALKER_FIELDS)

    @classmethod
    def prompter(cls, checkpoint: str, codec: str) -> HiggsPrompter:
        """The tokenizer, chat template and configs only: a hub id fetches no weights."""
        lm_dir = resolve_meta(checkpoint, "checkpoint")
        return _prompter(lm_dir, HiggsConfig.from_file(lm_dir / "config.json"),
                         resolve_file(codec, "config.json", "codec"))

    def render_prompt(self, text: str, system: str, scene: str | None, context: tuple[AudioTurn, ...] = (),
                      fields: dict | None = None) -> RenderedPrompt:
        return self.prompts.render_prompt(text, system, scene, context, fields)

    def encode_prompts(self, rendered: list[RenderedPrompt]) -> list[PromptInput]:
        return self.prompts.encode_prompts(rendered)

    def encode_audio(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """Mono float32 clips at sample_rate -> codes [frames, num_streams] int64 each. The encoder
        (HuBERT included) loads with the model where the job asked (LoadSpec.encode_references), else
        on the first call, so runs without references pay nothing."""
        if self._encoder is None:
            if self.codec_dir is None:
                raise NotImplementedError("this HiggsAudioV2 was not loaded from a codec folder: no encoder")
            self._encoder = HiggsCodecEncoder.load(self.codec_dir, self.encoder_dtype, self.runner.device,
                                                   expect_quantizers=self.num_streams)
        return self._encoder.encode(clips)

    def codec_files(self) -> list[Path]:
        """config.json and the weight files read_codec loads (stale files beside them do not count)."""
        if self.codec_dir is None:
            raise NotImplementedError("this HiggsAudioV2 was not loaded from a codec folder")
        return codec_files(self.codec_dir)

    @classmethod
    def codec_files_of(cls, spec: LoadSpec) -> list[Path]:
        return codec_files(resolve_folder(spec.codec, "codec", pth=True))

    def real_code_mask(self, tokens: np.ndarray) -> np.ndarray:
        """True where a sampled entry is an audio code, not stream BOS/EOS."""
        return (tokens != self.cfg.audio_stream_bos_id) & (tokens != self.cfg.audio_stream_eos_id)


def _prompter(lm_dir: Path, cfg: HiggsConfig, codec_config: Path) -> HiggsPrompter:
    builder = PromptBuilder(lm_dir, cfg.audio_bos_token_id, chat_template_fallback(lm_dir, cfg.layout),
                            (cfg.audio_token_id, cfg.audio_delay_token_id, cfg.audio_stream_bos_id,
                             cfg.audio_stream_eos_id))
    return HiggsPrompter(builder, frame_config(codec_config), cfg.num_codebooks)


def codec_files(folder: Path) -> list[Path]:
    """A codec folder's config.json and the weight files it loads from (as read_codec picks them)."""
    loaded = weight_files(folder) if (folder / SINGLE).is_file() or (folder / INDEX).is_file() else [folder / PTH]
    return [folder / "config.json", *loaded]
