"""speech_tokenizer/config.json: the 12 Hz speech tokenizer's config (Qwen3TTSTokenizerV2Config),
with its class defaults for keys the file leaves out; errors name the file and the dotted key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import TOKENIZER_MODEL_TYPE, _head_dim, _Reader, _silu, read_json


@dataclass(frozen=True)
class CodecDecoderConfig:
    """speech_tokenizer/config.json decoder_config: RVQ, the sliding-window transformer, the vocoder."""

    codebook_size: int
    codebook_dim: int
    hidden_size: int
    latent_dim: int
    rope_theta: float
    max_position_embeddings: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool
    sliding_window: int
    intermediate_size: int
    rms_norm_eps: float
    num_hidden_layers: int
    num_quantizers: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    decoder_dim: int

    @classmethod
    def read(cls, r: _Reader) -> "CodecDecoderConfig":
        _silu(r)
        hidden, heads = r.get("hidden_size", int, 1024), r.get("num_attention_heads", int, 16)
        return cls(codebook_size=r.get("codebook_size", int, 2048), codebook_dim=r.get("codebook_dim", int),
                   hidden_size=hidden, latent_dim=r.get("latent_dim", int, 1024),
                   rope_theta=r.get("rope_theta", float, 10000.0),
                   max_position_embeddings=r.get("max_position_embeddings", int, 8000), num_attention_heads=heads,
                   num_key_value_heads=r.get("num_key_value_heads", int, 16), head_dim=_head_dim(r, hidden, heads),
                   attention_bias=r.get("attention_bias", bool, False), sliding_window=r.get("sliding_window", int, 72),
                   intermediate_size=r.get("intermediate_size", int, 3072),
                   rms_norm_eps=r.get("rms_norm_eps", float, 1e-5),
                   num_hidden_layers=r.get("num_hidden_layers", int, 8),
                   num_quantizers=r.get("num_quantizers", int, 16),
                   upsample_rates=r.ints("upsample_rates", (8, 5, 4, 3)),
                   upsampling_ratios=r.ints("upsampling_ratios", (2, 2)), decoder_dim=r.get("decoder_dim", int, 1536))

    @property
    def total_upsample(self) -> int:
        out = 1
        for f in self.upsample_rates + self.upsampling_ratios:
            out *= f
        return out


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    decoder: CodecDecoderConfig
    encoder_config: dict[str, Any] = field(hash=False)  # MimiConfig's keyword arguments, as written
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920
    path: Path = field(default=Path("."), compare=False)

    @classmethod
    def from_file(cls, path: Path) -> "SpeechTokenizerConfig":
        r = _Reader(read_json(path), Path(path))
        kind = r.get("model_type", str, None)
        if kind != TOKENIZER_MODEL_TYPE:
            r._fail("model_type", f"is {kind!r}; the 12 Hz speech tokenizer's is {TOKENIZER_MODEL_TYPE!r}")
        dec = CodecDecoderConfig.read(r.sub("decoder_config"))
        out = cls(decoder=dec, encoder_config=dict(r.get("encoder_config", dict, {})),
                  encoder_valid_num_quantizers=r.get("encoder_valid_num_quantizers", int, 16),
                  input_sample_rate=r.get("input_sample_rate", int, 24000),
                  output_sample_rate=r.get("output_sample_rate", int, 24000),
                  decode_upsample_rate=r.get("decode_upsample_rate", int, 1920),
                  encode_downsample_rate=r.get("encode_downsample_rate", int, 1920), path=Path(path))
        if dec.total_upsample != out.decode_upsample_rate:
            r._fail("decode_upsample_rate", f"is {out.decode_upsample_rate}; the decoder's rates multiply to "
                    f"{dec.total_upsample}")
        return out
