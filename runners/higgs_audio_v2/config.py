"""The fields of a Higgs Audio v2 config.json that the native model needs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .layouts import ORIGINAL, TRANSFORMERS, lm_layout, read_config, translate_lm_config

# transformers' HiggsAudioV2Config defaults, for keys a config.json may omit
_DEFAULT_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 0.125,
    "high_freq_factor": 0.5,
    "original_max_position_embeddings": 1024,
}


@dataclass(frozen=True)
class HiggsConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_parameters: dict[str, Any]
    attention_bias: bool
    num_codebooks: int
    codebook_size: int  # per codebook, stream BOS/EOS included (1026 in the release)
    audio_token_id: int
    audio_bos_token_id: int
    audio_delay_token_id: int
    audio_stream_bos_id: int
    audio_stream_eos_id: int
    eos_token_id: int
    layout: str = field(default=TRANSFORMERS, compare=False)  # the checkpoint's (layouts.py), as read

    @classmethod
    def from_file(cls, path: Path) -> "HiggsConfig":
        """transformers' layout as it is; Boson's original (layouts.py) translated as the
        conversion script does, which reads the tokenizer.json beside ``path``."""
        raw = read_config(path)
        layout = lm_layout(raw, path)
        if layout == ORIGINAL:
            raw = translate_lm_config(raw, path)
        values = dict(raw)
        values["layout"] = layout
        values.setdefault("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
        values.setdefault("num_key_value_heads", raw["num_attention_heads"])
        values.setdefault("attention_bias", False)
        values.setdefault("rms_norm_eps", 1e-5)
        # older configs spell rope as rope_theta + rope_scaling
        rope = raw.get("rope_parameters") or raw.get("rope_scaling")
        rope = dict(rope) if rope else dict(_DEFAULT_ROPE)
        rope.setdefault("rope_theta", raw.get("rope_theta", _DEFAULT_ROPE["rope_theta"]))
        rope.setdefault("rope_type", rope.pop("type", "default"))
        values["rope_parameters"] = rope
        eos = values.get("eos_token_id")
        values["eos_token_id"] = eos[0] if isinstance(eos, list) else eos
        for key in ("num_codebooks", "codebook_size", "audio_token_id", "audio_bos_token_id",
                    "audio_delay_token_id", "audio_stream_bos_id", "audio_stream_eos_id"):
            if key not in values:
                raise ConfigError(path, key, "is required for Higgs Audio v2")
        if values["codebook_size"] <= values["audio_stream_eos_id"]:
            # the class default of 1024 leaves no room for stream BOS/EOS (the release has 1026)
            raise ConfigError(path, "codebook_size", f"{values['codebook_size']} must exceed audio_stream_eos_id "
                              f"{values['audio_stream_eos_id']} (the released config has 1026)")
        names = {f.name for f in fields(cls)}
        missing = [n for n in names if n not in values]
        if missing:
            raise ConfigError(path, missing[0], "is required")
        return cls(**{k: values[k] for k in names})
