"""Qwen3-TTS-12Hz shapes for random-weight benchmarks: no checkpoint needed.

  qwen3-tts-12hz-0.6b, qwen3-tts-12hz-1.7b  the released config.json's talker and code predictor
                                            dims, and the released speech tokenizer's
  tiny-qwen3-tts                            configs/tiny-qwen3-tts as it is
A release shape is the tiny checkpoint's config.json with the release's dims and codec ids laid
over it; its text-track ids stay the tiny tokenizer's, so configs/tiny-qwen3-tts's vocab.json and
merges.txt can serve a random checkpoint of it (a speed run reads no real text).

``frame_bytes``: what one decode frame must read (the floor of omni bench), ``frame_flops``: what it
must compute; ``write_random_checkpoint``: the released folder layout with random weights.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .config import Qwen3TTSConfig

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-qwen3-tts"
SHAPES = ("qwen3-tts-12hz-0.6b", "qwen3-tts-12hz-1.7b", "tiny-qwen3-tts")
# talker_config (hidden, intermediate) and tts_model_size of the released config.json files
_RELEASE = {"qwen3-tts-12hz-0.6b": (1024, 3072, "0b6"), "qwen3-tts-12hz-1.7b": (2048, 6144, "1b7")}
_TALKER = dict(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=3072,
               text_hidden_size=2048, text_vocab_size=151936)
_PREDICTOR = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=2048)
# the release's codec ids (2048 codes, then control ids); a shape with fewer codes shifts them down
_CODEC_IDS = dict(codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155, codec_think_bos_id=2156,
                  codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149)
_LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
              "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
              "beijing_dialect": 2074, "sichuan_dialect": 2062}
_SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
             "sohee": 2864, "eric": 2875, "dylan": 2878}
_DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
# speech_tokenizer/config.json of the release: Mimi encoder and 12 Hz decoder widths
_ENCODER = dict(sampling_rate=24000, frame_rate=12.5, audio_channels=1, hidden_size=512, num_filters=64,
                num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3,
                residual_kernel_size=3, dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant",
                compress=2, trim_right_ratio=1.0, codebook_size=2048, codebook_dim=256, num_quantizers=32,
                use_conv_shortcut=False, vector_quantization_hidden_dimension=256, num_semantic_quantizers=1,
                upsample_groups=512, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8,
                num_key_value_heads=8, head_dim=64, hidden_act="gelu", max_position_embeddings=8000, norm_eps=1e-5,
                use_cache=False, use_streaming=False, rope_theta=10000.0, sliding_window=250,
                layer_scale_initial_scale=0.01, attention_bias=False, model_type="mimi")
_DECODER = dict(codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024, max_position_embeddings=8000,
                rope_theta=10000, num_attention_heads=16, num_key_value_heads=16, head_dim=64, attention_bias=False,
                sliding_window=72, intermediate_size=1024, hidden_act="silu", layer_scale_initial_scale=0.01,
                rms_norm_eps=1e-5, num_hidden_layers=8, num_quantizers=16, upsample_rates=[8, 5, 4, 3],
                upsampling_ratios=[2, 2], decoder_dim=1536, attention_dropout=0.0)
MODEL_TYPES = ("custom_voice", "voice_design")  # what write_random_checkpoint makes (Base needs a speaker encoder)


def _check(name: str) -> None:
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r} (known: {', '.join(SHAPES)})")


def config_dict(name: str, model_type: str = "custom_voice") -> dict:
    """config.json of a shape: CustomVoice with the release's nine speakers, or VoiceDesign (none)."""
    _check(name)
    cfg = json.loads((TINY / "config.json").read_text())
    t, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    if name in _RELEASE:
        hidden, inter, size = _RELEASE[name]
        t.update(_TALKER, hidden_size=hidden, intermediate_size=inter, **_CODEC_IDS)
        t["codec_language_id"] = dict(_LANGUAGES)
        cp.update(_PREDICTOR, layer_types=["full_attention"] * _PREDICTOR["num_hidden_layers"])
        cfg["tts_model_size"] = size
        cfg["speaker_encoder_config"].update(enc_dim=hidden, enc_channels=[512, 512, 512, 512, 1536],
                                             enc_attention_channels=128, enc_se_channels=128)
    shift = 2048 - cp["vocab_size"]  # the tiny checkpoint's codec ids sit this far below the release's
    cfg["tts_model_type"] = model_type
    if model_type == "custom_voice":
        t["spk_id"] = {k: v - shift for k, v in _SPEAKERS.items()}
        t["spk_is_dialect"] = {k: _DIALECTS.get(k, False) for k in _SPEAKERS}
    else:
        t["spk_id"], t["spk_is_dialect"] = {}, {}
    return cfg


def speech_tokenizer_dict(name: str) -> dict:
    """speech_tokenizer/config.json of a shape (the tiny one's widths for tiny-qwen3-tts)."""
    _check(name)
    cfg = json.loads((TINY / "speech_tokenizer" / "config.json").read_text())
    if name in _RELEASE:
        cfg["encoder_config"], cfg["decoder_config"] = copy.deepcopy(_ENCODER), copy.deepcopy(_DECODER)
    return cfg


def shape_config(name: str, model_type: str = "custom_voice") -> Qwen3TTSConfig:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config_dict(name, model_type)))
        return Qwen3TTSConfig.from_file(path)


def _layer(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """A Qwen3 decoder layer's parameters: q, k, v, o, per-head q/k norms, SwiGLU, two RMSNorms."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 2 * head_dim
    return attn + 3 * hidden * inter + 2 * hidden


@dataclass(frozen=True)
class FrameParams:
    """Parameters one decode frame reads: ``shared`` once whatever the batch, ``per_row`` for each row."""

    shared: int  # talker layers, norm, codec_head, text MLP; 15 x (predictor layers, norm, projection, a head)
    per_row: int  # one text-embedding row and 16 code-embedding rows
    predictor_step: int  # what each of the 15 predictor sub-steps reads (inside shared)


def _parts(cfg: Qwen3TTSConfig) -> dict[str, int]:
    t, p = cfg.talker, cfg.predictor
    proj = t.hidden_size * p.hidden_size + p.hidden_size if p.hidden_size != t.hidden_size else 0
    return {"talker_layers": t.num_hidden_layers * _layer(t.hidden_size, t.intermediate_size, t.num_attention_heads,
                                                          t.num_key_value_heads, t.head_dim),
            "text_mlp": t.text_hidden_size * (t.text_hidden_size + 1) + t.hidden_size * (t.text_hidden_size + 1),
            "codec_head": t.hidden_size * t.vocab_size,
            "pred_layers": p.num_hidden_layers * _layer(p.hidden_size, p.intermediate_size, p.num_attention_heads,
                                                        p.num_key_value_heads, p.head_dim),
            "pred_head": p.hidden_size * p.vocab_size, "proj": proj}


def frame_params(cfg: Qwen3TTSConfig) -> FrameParams:
    t, p = cfg.talker, cfg.predictor
    n = _parts(cfg)
    step = n["pred_layers"] + p.hidden_size + n["proj"] + n["pred_head"]
    shared = n["talker_layers"] + t.hidden_size + n["codec_head"] + n["text_mlp"] + (cfg.num_streams - 1) * step
    return FrameParams(shared, t.text_hidden_size + cfg.num_streams * t.hidden_size, step)


def param_count(cfg: Qwen3TTSConfig) -> int:
    """Every parameter of the talker with its code predictor (what model.safetensors' talker.* holds)."""
    t, p = cfg.talker, cfg.predictor
    n, g = _parts(cfg), cfg.num_streams
    talker = n["talker_layers"] + t.hidden_size + n["codec_head"] + n["text_mlp"] + t.vocab_size * t.hidden_size \
        + t.text_vocab_size * t.text_hidden_size
    predictor = n["pred_layers"] + p.hidden_size + n["proj"] + (g - 1) * (n["pred_head"] + p.vocab_size * t.hidden_size)
    return talker + predictor


def kv_bytes(cfg: Qwen3TTSConfig, batch: int, seq: int, elem: int) -> int:
    """KV a frame reads: the talker's over `seq` positions a row, the predictor's over its 16 (one frame's)."""
    t, p = cfg.talker, cfg.predictor
    talker = t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * seq
    predictor = p.num_hidden_layers * p.num_key_value_heads * p.head_dim * 2 * cfg.num_streams
    return batch * (talker + predictor) * elem


def frame_bytes(cfg: Qwen3TTSConfig, batch: int, seq: int, elem: int) -> int:
    """Bytes one decode frame of `batch` rows at `seq` talker positions must read at least."""
    f = frame_params(cfg)
    return (f.shared + batch * f.per_row) * elem + kv_bytes(cfg, batch, seq, elem)


def frame_flops(cfg: Qwen3TTSConfig, batch: int) -> int:
    """Matmul FLOPs of a frame: the talker at one position, the predictor at its 16 (2 + 14 sub-steps)."""
    n, g = _parts(cfg), cfg.num_streams
    talker = n["talker_layers"] + n["codec_head"] + n["text_mlp"]
    predictor = g * (n["pred_layers"] + n["proj"]) + (g - 1) * n["pred_head"]
    return 2 * batch * (talker + predictor)


def write_random_checkpoint(root: Path, name: str, model_type: str, dtype, device, seed: int = 0) -> None:
    """The released folder with random weights: config.json, generation_config.json, the tiny
    tokenizer's files, model.safetensors (talker.* in dtype), speech_tokenizer/ (encoder.* and
    decoder.*, float32 as released)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from ..device import default_dtype
    from .codec import CodecDecoder
    from .codec_config import SpeechTokenizerConfig
    from .encoder import MimiEncoder
    from .talker import Talker

    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r}: one of {', '.join(MODEL_TYPES)}")
    root = Path(root)
    (root / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config_dict(name, model_type), indent=2))
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(speech_tokenizer_dict(name), indent=2))
    for f in ("generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json",
              "preprocessor_config.json"):
        shutil.copy(TINY / f, root / f)
    shutil.copy(TINY / "speech_tokenizer" / "preprocessor_config.json", root / "speech_tokenizer")
    cfg = Qwen3TTSConfig.from_file(root / "config.json")
    codec_cfg = SpeechTokenizerConfig.from_file(root / "speech_tokenizer" / "config.json")
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        talker = Talker(cfg, 16)
    state = {f"talker.{k}": v.detach().cpu().contiguous() for k, v in talker.state_dict().items()}
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    del talker, state
    with torch.device(device), default_dtype(torch.float32):
        dec = CodecDecoder(codec_cfg.decoder)
        enc = MimiEncoder(codec_cfg.encoder_config, codec_cfg.path)
    state = {f"decoder.{k}": v for k, v in dec.state_dict().items()}
    state.update({f"encoder.{k}": v for k, v in enc.state_dict().items()})
    for k, v in state.items():
        if k.endswith("embedding_sum") or k.endswith("embed_sum"):
            state[k] = torch.randn_like(v)  # codebook entries: zeros would decode every code alike
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
              str(root / "speech_tokenizer" / "model.safetensors"),
              metadata={"format": "pt"})
