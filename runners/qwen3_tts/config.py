"""The fields of a released Qwen3-TTS-12Hz checkpoint's configs that the native model needs.

Three files, read as the ``qwen-tts`` package reads them (its config classes' defaults for
keys a file leaves out):
  config.json                   Qwen3TTSConfig: talker_config (with code_predictor_config
                                nested), speaker_encoder_config, tts_model_type / size,
                                the text-track special ids
  generation_config.json        the sampling defaults its generate merges in
  speech_tokenizer/config.json  Qwen3TTSTokenizerV2Config (codec_config.py)
A missing or mistyped key is a ConfigError naming the file and the dotted key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

MODEL_TYPE = "qwen3_tts"
TOKENIZER_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
MODEL_TYPES = ("base", "custom_voice", "voice_design")  # tts_model_type
_MISSING = object()


def read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(path, None, f"cannot read it: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(path, None, "is not a JSON object")
    return raw


class _Reader:
    """Typed reads of one JSON object of a file; errors name the file and the dotted key."""

    def __init__(self, raw: Any, path: Path, prefix: str = ""):
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(path, prefix.rstrip(".") or None, "is not a JSON object")
        self.raw, self.path, self.prefix = raw, path, prefix

    def _fail(self, key: str, message: str):
        raise ConfigError(self.path, self.prefix + key, message)

    def get(self, key: str, kind, default=_MISSING):
        value = self.raw.get(key, _MISSING)
        if value is None or value is _MISSING:
            if default is _MISSING:
                self._fail(key, "is required")
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            self._fail(key, f"must be an integer, not {value!r}")
        if not isinstance(value, kind):
            self._fail(key, f"must be {getattr(kind, '__name__', kind)}, not {value!r}")
        return value

    def ints(self, key: str, default=_MISSING) -> tuple[int, ...]:
        value = self.get(key, (list, tuple), default)
        if any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            self._fail(key, f"must be a list of integers, not {value!r}")
        return tuple(value)

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.raw.get(key), self.path, f"{self.prefix}{key}.")


def _head_dim(r: _Reader, hidden: int, heads: int) -> int:
    # the reference's getattr(config, "head_dim", hidden // heads)
    return r.get("head_dim", int, hidden // heads)


def _silu(r: _Reader) -> None:
    act = r.get("hidden_act", str, "silu")
    if act != "silu":
        r._fail("hidden_act", f"is {act!r}; the native Qwen3-TTS model implements silu")


@dataclass(frozen=True)
class PredictorConfig:
    """talker_config.code_predictor_config: the 5-layer code predictor (codebooks 1..G-1)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    num_code_groups: int

    @classmethod
    def read(cls, r: _Reader) -> "PredictorConfig":
        _silu(r)
        hidden, heads = r.get("hidden_size", int, 1024), r.get("num_attention_heads", int, 16)
        if r.get("rope_scaling", dict, None):
            r._fail("rope_scaling", "is set; the native code predictor implements plain rope only")
        groups = r.get("num_code_groups", int, 32)
        window = r.get("sliding_window", int, None) if r.get("use_sliding_window", bool, False) else None
        if window is not None and window < groups:
            r._fail("sliding_window", f"is {window}, shorter than a frame's {groups} positions")
        return cls(vocab_size=r.get("vocab_size", int, 2048), hidden_size=hidden,
                   intermediate_size=r.get("intermediate_size", int, 3072),
                   num_hidden_layers=r.get("num_hidden_layers", int, 5), num_attention_heads=heads,
                   num_key_value_heads=r.get("num_key_value_heads", int, 8),
                   head_dim=r.get("head_dim", int, 128), rms_norm_eps=r.get("rms_norm_eps", float, 1e-6),
                   rope_theta=r.get("rope_theta", float, 10000.0), attention_bias=r.get("attention_bias", bool, False),
                   num_code_groups=groups)


@dataclass(frozen=True)
class TalkerConfig:
    """talker_config: the Qwen3 LM predicting codebook 0, its text track and codec control ids."""

    vocab_size: int  # codec vocabulary: codebook 0's codes, then control ids
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    attention_bias: bool
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_eos_token_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_pad_id: int
    codec_bos_id: int
    max_position_embeddings: int  # the longest context the checkpoint names
    spk_id: dict[str, int] = field(hash=False)  # speaker name (lower case) -> codec id
    spk_is_dialect: dict[str, Any] = field(hash=False)  # speaker -> False or a dialect (a language key)
    codec_language_id: dict[str, int] = field(hash=False)  # language (lower case) -> codec id

    @classmethod
    def read(cls, r: _Reader) -> "TalkerConfig":
        _silu(r)
        hidden, heads = r.get("hidden_size", int, 1024), r.get("num_attention_heads", int, 16)
        if r.get("use_sliding_window", bool, False):
            r._fail("use_sliding_window", "is true; the native talker attends over the whole sequence")
        rope = r.sub("rope_scaling")
        rope_type = rope.get("rope_type", str, rope.get("type", str, "default"))
        if rope_type != "default":
            rope._fail("rope_type", f"is {rope_type!r}; the native talker implements default (M)RoPE")
        tables = {}
        for key, kind in (("spk_id", int), ("codec_language_id", int)):
            table = r.get(key, dict, {})
            if any(not isinstance(v, int) or isinstance(v, bool) for v in table.values()):
                r._fail(key, "must map names to integer codec ids")
            tables[key] = {str(k).lower(): v for k, v in table.items()}
        dialect = {str(k).lower(): v for k, v in r.get("spk_is_dialect", dict, {}).items()}
        for spk, d in dialect.items():
            if d is not False and str(d).lower() not in tables["codec_language_id"]:
                r._fail("spk_is_dialect", f"speaker {spk!r} names dialect {d!r}, which codec_language_id lacks")
        return cls(vocab_size=r.get("vocab_size", int, 3072), hidden_size=hidden,
                   intermediate_size=r.get("intermediate_size", int, 2048),
                   num_hidden_layers=r.get("num_hidden_layers", int, 20), num_attention_heads=heads,
                   num_key_value_heads=r.get("num_key_value_heads", int, 2), head_dim=_head_dim(r, hidden, heads),
                   rms_norm_eps=r.get("rms_norm_eps", float, 1e-6), rope_theta=r.get("rope_theta", float, 10000.0),
                   mrope_section=rope.ints("mrope_section", ()), mrope_interleaved=rope.get("interleaved", bool, False),
                   attention_bias=r.get("attention_bias", bool, False),
                   text_vocab_size=r.get("text_vocab_size", int), text_hidden_size=r.get("text_hidden_size", int, 2048),
                   num_code_groups=r.get("num_code_groups", int, 32),
                   codec_eos_token_id=r.get("codec_eos_token_id", int, 4198),
                   codec_think_id=r.get("codec_think_id", int, 4202),
                   codec_nothink_id=r.get("codec_nothink_id", int, 4203),
                   codec_think_bos_id=r.get("codec_think_bos_id", int, 4204),
                   codec_think_eos_id=r.get("codec_think_eos_id", int, 4205),
                   codec_pad_id=r.get("codec_pad_id", int, 4196), codec_bos_id=r.get("codec_bos_id", int, 4197),
                   max_position_embeddings=r.get("max_position_embeddings", int, 32768),
                   spk_id=tables["spk_id"], spk_is_dialect=dialect, codec_language_id=tables["codec_language_id"])


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """speaker_encoder_config: the ECAPA-TDNN x-vector model of Base checkpoints."""

    mel_dim: int
    enc_dim: int
    enc_channels: tuple[int, ...]
    enc_kernel_sizes: tuple[int, ...]
    enc_dilations: tuple[int, ...]
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int
    sample_rate: int

    @classmethod
    def read(cls, r: _Reader) -> "SpeakerEncoderConfig":
        out = cls(mel_dim=r.get("mel_dim", int, 128), enc_dim=r.get("enc_dim", int, 1024),
                  enc_channels=r.ints("enc_channels", (512, 512, 512, 512, 1536)),
                  enc_kernel_sizes=r.ints("enc_kernel_sizes", (5, 3, 3, 3, 1)),
                  enc_dilations=r.ints("enc_dilations", (1, 2, 3, 4, 1)),
                  enc_attention_channels=r.get("enc_attention_channels", int, 128),
                  enc_res2net_scale=r.get("enc_res2net_scale", int, 8),
                  enc_se_channels=r.get("enc_se_channels", int, 128),
                  sample_rate=r.get("sample_rate", int, 24000))
        if not len(out.enc_channels) == len(out.enc_kernel_sizes) == len(out.enc_dilations):
            r._fail("enc_channels", "enc_channels, enc_kernel_sizes and enc_dilations must have one length")
        return out


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: TalkerConfig
    predictor: PredictorConfig
    speaker_encoder: SpeakerEncoderConfig
    tts_model_type: str  # base / custom_voice / voice_design
    tts_model_size: str  # "0b6", "1b7"
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    transformers_version: str | None  # the writer's, which decides the tokenizer's split rule (tokenizer.py)
    path: Path = field(compare=False)

    @classmethod
    def from_file(cls, path: Path) -> "Qwen3TTSConfig":
        r = _Reader(read_json(path), Path(path))
        kind = r.get("model_type", str, None)
        if kind != MODEL_TYPE:
            r._fail("model_type", f"is {kind!r}; a Qwen3-TTS checkpoint's is {MODEL_TYPE!r}")
        tokenizer_type = r.get("tokenizer_type", str, TOKENIZER_MODEL_TYPE)
        if tokenizer_type != TOKENIZER_MODEL_TYPE:
            r._fail("tokenizer_type", f"is {tokenizer_type!r}; omni runs the 12 Hz family ({TOKENIZER_MODEL_TYPE})")
        model_type = r.get("tts_model_type", str)
        if model_type not in MODEL_TYPES:
            r._fail("tts_model_type", f"is {model_type!r}; expected one of {', '.join(MODEL_TYPES)}")
        talker_r = r.sub("talker_config")
        talker = TalkerConfig.read(talker_r)
        predictor = PredictorConfig.read(talker_r.sub("code_predictor_config"))
        if predictor.num_code_groups != talker.num_code_groups:
            talker_r._fail("code_predictor_config.num_code_groups",
                           f"is {predictor.num_code_groups}, the talker's {talker.num_code_groups}")
        if predictor.vocab_size > talker.vocab_size:
            talker_r._fail("vocab_size",
                           f"{talker.vocab_size} cannot hold the predictor's {predictor.vocab_size} codes")
        if talker.codec_eos_token_id < predictor.vocab_size or talker.codec_eos_token_id >= talker.vocab_size:
            talker_r._fail("codec_eos_token_id", f"{talker.codec_eos_token_id} is not a control id of the codec "
                           f"vocabulary [{predictor.vocab_size}, {talker.vocab_size})")
        speaker = SpeakerEncoderConfig.read(r.sub("speaker_encoder_config"))
        if model_type == "base" and speaker.enc_dim != talker.hidden_size:
            r._fail("speaker_encoder_config.enc_dim", f"is {speaker.enc_dim}; the talker's width {talker.hidden_size} "
                    "takes the x-vector as a codec embedding")
        return cls(talker=talker, predictor=predictor, speaker_encoder=speaker, tts_model_type=model_type,
                   tts_model_size=r.get("tts_model_size", str, ""),
                   im_start_token_id=r.get("im_start_token_id", int, 151644),
                   im_end_token_id=r.get("im_end_token_id", int, 151645),
                   tts_pad_token_id=r.get("tts_pad_token_id", int, 151671),
                   tts_bos_token_id=r.get("tts_bos_token_id", int, 151672),
                   tts_eos_token_id=r.get("tts_eos_token_id", int, 151673),
                   transformers_version=r.get("transformers_version", str, None), path=Path(path))

    @property
    def num_streams(self) -> int:
        return self.talker.num_code_groups

    @property
    def code_vocab(self) -> int:
        """Codes a codebook holds (below it in the talker's vocabulary: codes; above: control ids)."""
        return self.predictor.vocab_size

    @property
    def languages(self) -> tuple[str, ...]:
        """The ``language`` values the reference accepts (lower case): auto and every non-dialect key."""
        return ("auto",) + tuple(k for k in self.talker.codec_language_id if "dialect" not in k)

    @property
    def speakers(self) -> tuple[str, ...]:
        return tuple(self.talker.spk_id)

    @property
    def instruct_ignored(self) -> bool:
        """The reference drops ``instruct`` on CustomVoice checkpoints whose size string is a
        substring of "0b6" (its ``tts_model_size in "0b6"``)."""
        return self.tts_model_type == "custom_voice" and self.tts_model_size in "0b6"

    def suppressed_ids(self) -> tuple[int, ...]:
        """Talker ids the reference never samples: the last 1024 of the vocabulary but codec EOS."""
        t = self.talker
        return tuple(i for i in range(t.vocab_size - 1024, t.vocab_size) if i != t.codec_eos_token_id)


@dataclass(frozen=True)
class GenerationDefaults:
    """generation_config.json merged over the package's hard defaults (its _merge_generate_kwargs)."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048  # talker tokens: at most max_new_tokens - 1 frames come out
    min_new_tokens: int = 2  # the reference's generate fixes it: no codec EOS for the first two frames

    @classmethod
    def from_file(cls, path: Path) -> "GenerationDefaults":
        """The file's values where it has them; a missing file gives the hard defaults."""
        if not Path(path).is_file():
            return cls()
        r = _Reader(read_json(path), Path(path))
        base = cls()
        kinds = {"do_sample": bool, "subtalker_dosample": bool, "top_k": int, "subtalker_top_k": int,
                 "max_new_tokens": int, "top_p": float, "temperature": float, "repetition_penalty": float,
                 "subtalker_top_p": float, "subtalker_temperature": float}
        return cls(**{k: r.get(k, kind, getattr(base, k)) for k, kind in kinds.items()})


@dataclass(frozen=True)
class Qwen3TTSLimits:
    """What a checkpoint allows, from config.json and generation_config.json alone (no weights)."""

    num_streams: int
    vocab_size: int  # the talker's codec vocabulary (codebook 0 samples from it)
    code_vocab: int  # codes a codebook holds (streams 1.. sample from these)
    control_ids: tuple[int, ...]  # ids the model emits itself and which are never suppressed: codec EOS
    tts_model_type: str
    tts_model_size: str
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    dialects: dict[str, str] = field(hash=False)  # speaker -> its dialect's language key
    instruct_ignored: bool = False
    max_positions: int | None = None  # talker_config.max_position_embeddings
    generation: GenerationDefaults = GenerationDefaults()


def read_limits(folder: Path) -> Qwen3TTSLimits:
    """The checkpoint folder's limits: config.json (required) and generation_config.json (optional)."""
    cfg = Qwen3TTSConfig.from_file(Path(folder) / "config.json")
    return limits_of(cfg, GenerationDefaults.from_file(Path(folder) / "generation_config.json"))


def limits_of(cfg: Qwen3TTSConfig, generation: GenerationDefaults) -> Qwen3TTSLimits:
    t = cfg.talker
    dialects = {s: str(d).lower() for s, d in t.spk_is_dialect.items() if d is not False}
    return Qwen3TTSLimits(num_streams=cfg.num_streams, vocab_size=t.vocab_size, code_vocab=cfg.code_vocab,
                          control_ids=(t.codec_eos_token_id,), tts_model_type=cfg.tts_model_type,
                          tts_model_size=cfg.tts_model_size, speakers=cfg.speakers, languages=cfg.languages,
                          dialects=dialects, instruct_ignored=cfg.instruct_ignored,
                          max_positions=t.max_position_embeddings, generation=generation)
