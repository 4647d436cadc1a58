"""The two layouts of released Higgs Audio v2 LM checkpoints, read as one.

Boson published the LM first in its own layout (``model_type: higgs_audio``: the Llama
backbone's fields nested in ``text_config``, keys without the ``model.`` prefix, three
shards), then rewrote the hub repo into transformers' (``model_type: higgs_audio_v2``). The
original is translated here, in memory at load, as transformers' conversion script
(models/higgs_audio_v2/convert_higgs_audio_v2_to_hf.py) translates it: the config to the
flat form, the keys by its renames (``lm_key``, handed to stream_into so the weights are
still read once, straight into the model), and the chat template it embeds where the folder
has none. The codec's two layouts are codec_layout.py's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError, OmniError

TRANSFORMERS = "higgs_audio_v2"  # model_type of transformers' layout
ORIGINAL = "higgs_audio"  # model_type of Boson's original layout
# the token HiggsAudioV2Processor marks delayed codebooks with; its id is the tokenizer's
DELAY_TOKEN = "<|reserved_special_token_6|>"
# the id transformers' converted config gives eos_token_id (its class default): this token's
EOS_TOKEN = "<|eot_id|>"
# the chat template the conversion script gives the processor (the original layout has none)
ORIGINAL_TEMPLATE = Path(__file__).with_name("chat_template_original.jinja")
# audio adapters whose every listed layer is a dual-FFN layer, as transformers' decoder layer is
DUAL_FFN = ("dual_ffn", "dual_ffn_fast_forward")

# the conversion script's key renames, applied in order (re.sub on each key)
_RENAMES = (
    (re.compile(r"^audio_codebook_embeddings\."), "model.embed_audio_tokens.embed_audio_tokens."),
    (re.compile(r"^(embed_tokens|layers|norm)"), r"model.\1"),
    (re.compile(r"^audio_decoder_proj\."), ""),
)
# tensors the conversion script drops (rotary tables are recomputed; codebook weights unused)
_DROPPED = ("audio_codebook_weights", "rotary_emb.inv_freq", "rotary_emb.original_inv_freq")
# the original's partially frozen tables, which the conversion concatenates: not streamable as is
_SPLIT = (".embedding_frozen.", ".embedding_trainable.", ".linear_frozen.", ".linear_trainable.")


def read_config(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(path, None, f"cannot read checkpoint config: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(path, None, "is not a JSON object")
    return raw


def lm_layout(raw: dict, path: Path) -> str:
    """TRANSFORMERS or ORIGINAL, from config.json's model_type; any other is an error saying what to do."""
    kind = raw.get("model_type")
    if kind in (TRANSFORMERS, ORIGINAL):
        return kind
    raise ConfigError(path, "model_type", f"is {kind!r}: omni loads Higgs Audio v2 checkpoints in transformers' "
                      f"layout ({TRANSFORMERS!r}, the hub's bosonai/higgs-audio-v2-generation-3B-base) or Boson's "
                      f"original one ({ORIGINAL!r}, that repo's revisions before April 2026); point 'checkpoint' "
                      f"at one of those")


def lm_key(key: str) -> str | None:
    """An original-layout key under transformers' name (None: the conversion drops it)."""
    if key.endswith(_DROPPED):
        return None
    if any(part in key for part in _SPLIT):
        raise OmniError(f"weight {key!r} is a partially frozen table of Boson's training code; convert the "
                        f"checkpoint with transformers' convert_higgs_audio_v2_to_hf.py, which concatenates them")
    for pattern, replacement in _RENAMES:
        key = pattern.sub(replacement, key)
    return key


def token_id(folder: Path, token: str) -> int | None:
    """The id the folder's tokenizer.json gives ``token`` (None where it has none)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path)).token_to_id(token)
    except Exception as e:  # tokenizers raises its own exception type; a missing file too
        raise OmniError(f"{path}: cannot load the tokenizer ({e}); the original Higgs layout's config names no "
                        f"{token} id, which omni takes from the checkpoint's tokenizer") from None


def translate_lm_config(raw: dict, path: Path) -> dict[str, Any]:
    """An original-layout config.json as the flat transformers-layout dict the conversion makes.

    The delay and eos ids come from the checkpoint's tokenizer (tokenizer.json beside
    ``path``), as HiggsAudioV2Processor finds the delay token's."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(path, "text_config", "is required in the original Higgs layout (the backbone's fields)")
    for key in ("audio_num_codebooks", "audio_codebook_size", "audio_out_token_idx", "audio_out_bos_token_id"):
        if not isinstance(raw.get(key), int):
            raise ConfigError(path, key, "is required (an integer) in the original Higgs layout")
    layers = int(text.get("num_hidden_layers", 0))
    adapter = raw.get("audio_adapter_type", "dual_ffn")
    dual = raw.get("audio_dual_ffn_layers")
    if adapter not in DUAL_FFN or (dual is not None and sorted(dual) != list(range(layers))):
        raise ConfigError(path, "audio_dual_ffn_layers", f"adapter {adapter!r} on layers {dual}: transformers' "
                          f"Higgs Audio v2 (and omni) has the dual audio FFN on every layer, 0..{layers - 1}")
    if raw.get("use_audio_out_self_attention"):
        raise ConfigError(path, "use_audio_out_self_attention", "audio self-attention layers are not in "
                          "transformers' Higgs Audio v2, nor in omni")
    ffn = raw.get("audio_ffn_intermediate_size", text.get("intermediate_size"))
    if ffn != text.get("intermediate_size"):
        raise ConfigError(path, "audio_ffn_intermediate_size", f"{ffn} differs from text_config's intermediate_size "
                          f"{text.get('intermediate_size')}; transformers' audio FFN has the backbone's width")
    folder = Path(path).parent
    delay = token_id(folder, DELAY_TOKEN)
    if delay is None:
        raise ConfigError(folder / "tokenizer.json", DELAY_TOKEN, "is not in the tokenizer; Higgs Audio v2 marks "
                          "delayed codebooks with it (HiggsAudioV2Processor reads its id there)")
    eos = token_id(folder, EOS_TOKEN)
    out = dict(text)  # vocab_size, hidden_size, ..., rope_theta + rope_scaling (HiggsConfig reads both)
    out.update(
        model_type=TRANSFORMERS,
        num_codebooks=raw["audio_num_codebooks"],
        # the original counts codes only; its tables hold two more rows a codebook (stream BOS/EOS)
        codebook_size=raw["audio_codebook_size"] + 2,
        audio_token_id=raw["audio_out_token_idx"],
        audio_bos_token_id=raw["audio_out_bos_token_id"],
        audio_delay_token_id=delay,
        audio_stream_bos_id=raw.get("audio_stream_bos_id", raw["audio_codebook_size"]),
        audio_stream_eos_id=raw.get("audio_stream_eos_id", raw["audio_codebook_size"] + 1),
        eos_token_id=eos if eos is not None else text.get("eos_token_id"),
    )
    return out


def chat_template_fallback(folder: Path, layout: str) -> str | None:
    """The template the conversion script embeds, for an original-layout folder (which ships
    none); None for transformers' layout, whose folder must hold its own."""
    if layout != ORIGINAL:
        return None
    return ORIGINAL_TEMPLATE.read_text(encoding="utf-8")
