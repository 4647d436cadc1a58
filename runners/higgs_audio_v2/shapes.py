"""Model shapes for random-weight benchmarks: no checkpoint needed."""

from __future__ import annotations

from pathlib import Path

from .config import HiggsConfig

_TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-higgs-audio-v2" / "model" / "config.json"

# config.json of the released 3B model (Llama-3.2-3B backbone, dual audio FFN)
_3B = dict(
    vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
    num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, attention_bias=False, num_codebooks=8,
    codebook_size=1026, audio_token_id=128016, audio_bos_token_id=128013, audio_delay_token_id=128014,
    audio_stream_bos_id=1024, audio_stream_eos_id=1025, eos_token_id=128009,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 0.125,
                     "high_freq_factor": 0.5, "original_max_position_embeddings": 1024},
)


def shape_config(name: str) -> HiggsConfig:
    if name == "higgs-audio-v2-3b":
        return HiggsConfig(**_3B)
    if name == "tiny-higgs-audio-v2":
        return HiggsConfig.from_file(_TINY)
    raise ValueError(f"unknown shape {name!r} (known: higgs-audio-v2-3b, tiny-higgs-audio-v2)")


def transformers_config(cfg: HiggsConfig):
    """The same shape as a transformers HiggsAudioV2Config (for the reference peer)."""
    from transformers import HiggsAudioV2Config

    return HiggsAudioV2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters=dict(cfg.rope_parameters), num_codebooks=cfg.num_codebooks, codebook_size=cfg.codebook_size,
        audio_token_id=cfg.audio_token_id, audio_bos_token_id=cfg.audio_bos_token_id,
        audio_delay_token_id=cfg.audio_delay_token_id, audio_stream_bos_id=cfg.audio_stream_bos_id,
        audio_stream_eos_id=cfg.audio_stream_eos_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.eos_token_id,
        bos_token_id=cfg.eos_token_id, max_position_embeddings=4096,
    )


def codec_config(name: str):
    """The codec (HiggsAudioV2TokenizerConfig) of a shape: the released tokenizer's
    decoder for higgs-audio-v2-3b (DAC decoder 1024 channels, hop 960, 8 quantizers
    of 1024 x 64, HuBERT-base semantic width 768)."""
    from transformers import HiggsAudioV2TokenizerConfig

    if name != "higgs-audio-v2-3b":
        raise ValueError(f"no codec shape for {name!r} (known: higgs-audio-v2-3b)")
    return HiggsAudioV2TokenizerConfig(
        target_bandwidths=[0.5, 1, 1.5, 2], codebook_size=1024, codebook_dim=64,
        acoustic_model_config=dict(encoder_hidden_size=64, downsampling_ratios=[8, 5, 4, 2, 3],
                                   upsampling_ratios=[8, 5, 4, 2, 3], decoder_hidden_size=1024, hidden_size=256),
    )


def param_counts(cfg: HiggsConfig) -> tuple[int, int]:
    """(all parameters, parameters read by one audio decode step)."""
    h, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    attn = h * cfg.num_attention_heads * cfg.head_dim * 2 + h * cfg.num_key_value_heads * cfg.head_dim * 2
    mlp = 3 * h * f
    norms = 4 * h
    audio_embed = cfg.num_codebooks * cfg.codebook_size * h
    total = cfg.vocab_size * h + L * (attn + 2 * mlp + norms) + h + audio_embed + audio_embed
    # decode reads the audio path only: attention, audio MLP, audio norms, the head, 8 embedding rows
    per_step = L * (attn + mlp + 2 * h) + h + audio_embed
    return total, per_step


def random_codec(name: str, dtype, device):
    """Our codec decoder (runners/higgs_audio_v2/codec.py) with random weights of a shape's codec,
    saved in transformers' format and loaded through the real loading path (the caller seeds)."""
    import tempfile

    from transformers import HiggsAudioV2TokenizerModel

    from .codec import HiggsCodecDecoder

    with tempfile.TemporaryDirectory() as tmp:
        HiggsAudioV2TokenizerModel(codec_config(name)).save_pretrained(tmp)
        return HiggsCodecDecoder.load(Path(tmp), dtype, device)
