"""The two layouts of released Higgs audio tokenizer (codec) checkpoints, read as one.

transformers' layout: config.json with ``model_type: higgs_audio_v2_tokenizer`` and
model.safetensors (HiggsAudioV2TokenizerModel's keys). Boson's original: config.json holding
HiggsAudioTokenizer's constructor arguments (``n_filters``, ``D``, ``ratios``, ``bins``,
``n_q``, ``codebook_dim``, ``target_bandwidths``, ``semantic_techer``, ...) and model.pth
(xcodec/DAC module names, weight-norm pairs). ``read_codec`` gives either as the
transformers-layout config dict and state dict, translating the original as transformers'
convert_higgs_audio_v2_tokenizer_to_hf.py does: weight-norm pairs folded, keys renamed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import INDEX, PTH, SINGLE, read_safetensors
from ..errors import ConfigError, OmniError
from .layouts import read_config

TRANSFORMERS = "higgs_audio_v2_tokenizer"
# fields of the original config.json that only HiggsAudioTokenizer's constructor takes
ORIGINAL_FIELDS = ("D", "ratios", "bins", "n_q")
# the semantic teachers of Boson's code that are HuBERT models (its other teachers are not Higgs's)
HUBERT_TEACHERS = ("hubert_base", "hubert_base_general")
# HiggsAudioTokenizer's semantic downsampling constant (transformers: downsample_factor)
SEMANTIC_DOWNSAMPLE = 320
# a residual unit's layers in DAC's Sequential order (the conversion's INNER_LAYER_NAMES)
_UNIT = ("snake1", "conv1", "snake2", "conv2")


def _acoustic_rules(blocks: int) -> list[tuple[re.Pattern, Any]]:
    """The conversion's renames of DAC's Sequential indices, for ``blocks`` strided blocks
    (the script writes them out for the release's five: final Snake at 6, last conv at 7)."""
    end = blocks + 1  # index of the final Snake; the last convolution follows it
    rules = [
        (r"^encoder\.block\.0\.", "acoustic_encoder.conv1."),
        (rf"^encoder\.block\.{end}\.", "acoustic_encoder.snake1."),
        (rf"^encoder\.block\.{end + 1}\.", "acoustic_encoder.conv2."),
        # encoder block: three residual units (0-2), then Snake (3) and the downsampling conv (4)
        (r"^encoder\.block\.(\d+)\.block\.([012])\.block\.([0123])\.",
         lambda m: f"acoustic_encoder.block.{int(m[1]) - 1}.res_unit{int(m[2]) + 1}.{_UNIT[int(m[3])]}."),
        (r"^encoder\.block\.(\d+)\.block\.3\.", lambda m: f"acoustic_encoder.block.{int(m[1]) - 1}.snake1."),
        (r"^encoder\.block\.(\d+)\.block\.4\.", lambda m: f"acoustic_encoder.block.{int(m[1]) - 1}.conv1."),
        (r"^decoder_2\.model\.0\.", "acoustic_decoder.conv1."),
        (rf"^decoder_2\.model\.{end}\.", "acoustic_decoder.snake1."),
        (rf"^decoder_2\.model\.{end + 1}\.", "acoustic_decoder.conv2."),
        # decoder block: Snake (0), the upsampling transposed conv (1), three residual units (2-4)
        (r"^decoder_2\.model\.(\d+)\.block\.0\.", lambda m: f"acoustic_decoder.block.{int(m[1]) - 1}.snake1."),
        (r"^decoder_2\.model\.(\d+)\.block\.1\.", lambda m: f"acoustic_decoder.block.{int(m[1]) - 1}.conv_t1."),
        (r"^decoder_2\.model\.(\d+)\.block\.([234])\.block\.([0123])\.",
         lambda m: f"acoustic_decoder.block.{int(m[1]) - 1}.res_unit{int(m[2]) - 1}.{_UNIT[int(m[3])]}."),
    ]
    return [(re.compile(p), r) for p, r in rules]


_OTHER_RULES = [(re.compile(p), r) for p, r in (
    (r"^quantizer\.vq\.layers\.", "quantizer.quantizers."),
    (r"\._codebook\.", ".codebook."),
    (r"^fc_prior\.", "fc."),
    (r"^fc_post1\.", "fc1."),
    (r"^fc_post2\.", "fc2."),
    # the semantic encoder/decoder wrap their convolutions in a module of their own
    (r"\.conv\.conv\.", ".conv."),
    (r"\.conv1\.conv\.", ".conv1."),
    (r"\.conv2\.conv\.", ".conv2."),
)]


def codec_key(key: str, blocks: int) -> str | None:
    """An original-layout key under transformers' name (None: the conversion drops it)."""
    if key.startswith("fc1."):  # unused in the forward pass (the conversion drops it)
        return None
    for pattern, replacement in _acoustic_rules(blocks) + _OTHER_RULES:
        key = pattern.sub(replacement, key)
    return key


def codec_layout(folder: Path) -> tuple[str, dict]:
    """("transformers" | "original", raw config); anything else an error saying what it found."""
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(path, None, f"no codec config.json in {folder}: point 'codec' at a Higgs audio tokenizer "
                          f"folder (bosonai/higgs-audio-v2-tokenizer, either layout)")
    raw = read_config(path)
    if raw.get("model_type") == TRANSFORMERS:
        return "transformers", raw
    if "model_type" not in raw and all(k in raw for k in ORIGINAL_FIELDS):
        if not (folder / PTH).is_file():
            raise OmniError(f"{folder}: config.json is Boson's original codec layout, whose weights are {PTH}; "
                            f"there is none (download it with the config, or use the transformers layout)")
        return "original", raw
    raise ConfigError(path, "model_type", f"is {raw.get('model_type')!r} and the original layout's fields "
                      f"{list(ORIGINAL_FIELDS)} are not all there: not a Higgs audio tokenizer in transformers' "
                      f"layout ({TRANSFORMERS!r}) or Boson's original; point 'codec' at one")


def frame_config(path: Path) -> dict[str, Any]:
    """What encoded_frames (encoder.py) reads, from a codec's config.json alone (validation, before
    any weight is fetched): transformers' layout as it is; the original's rates and ratios, its
    HuBERT taken as HuBERT base (the release's teacher)."""
    raw = read_config(path)
    if raw.get("model_type") == TRANSFORMERS or not all(k in raw for k in ORIGINAL_FIELDS):
        return raw
    return {"sample_rate": int(raw.get("sample_rate", 24000)),
            "semantic_sample_rate": int(raw.get("semantic_sample_rate") or 16000),
            "downsample_factor": SEMANTIC_DOWNSAMPLE,
            "acoustic_model_config": {"downsampling_ratios": [int(r) for r in raw["ratios"]]}}


def read_codec(folder: Path, prefixes: tuple[str, ...] | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, state) of a codec folder in either layout: the config as a transformers-layout
    config.json dict, the state under HiggsAudioV2TokenizerModel's key names (encoder side
    included). ``prefixes`` keeps only keys (transformers' names) starting with one of them."""
    folder = Path(folder)
    layout, raw = codec_layout(folder)
    if layout == "transformers":
        if not (folder / SINGLE).is_file() and not (folder / INDEX).is_file() and (folder / PTH).is_file():
            raise OmniError(f"{folder}: config.json is transformers' codec layout but the weights are {PTH}; "
                            f"that layout's weights are {SINGLE}")
        return raw, read_safetensors(folder, prefixes)
    path = folder / PTH
    try:  # mmap: only the tensors kept are read
        stored = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception as e:  # torch raises many types for a file it cannot read
        raise OmniError(f"{path}: cannot read it as a state dict ({e})") from None
    if isinstance(stored, dict) and isinstance(stored.get("state_dict"), dict):
        stored = stored["state_dict"]
    if not isinstance(stored, dict) or not all(isinstance(v, torch.Tensor) for v in stored.values()):
        raise OmniError(f"{path}: not a state dict of tensors")
    blocks = len(raw["ratios"])
    state: dict[str, torch.Tensor] = {}
    for key, value in _fold_weight_g(stored).items():
        new = codec_key(key, blocks)
        if new is not None and (prefixes is None or new.startswith(prefixes)):
            state[new] = value
    return translate_codec_config(raw, stored, folder / "config.json"), state


def _fold_weight_g(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torch.nn.utils.weight_norm's pairs (DAC's convolutions, dim 0) folded: w = g v / ||v||, the
    norm over all dims but 0, as the conversion folds them; HuBERT's parametrized pos_conv (dim 2)
    is left as stored, as the conversion leaves it."""
    out = {}
    for key, value in stored.items():
        if key.endswith(".weight_g"):
            base = key[: -len("weight_g")]
            v = stored[base + "weight_v"]
            out[base + "weight"] = value * v / v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
        elif not key.endswith(".weight_v"):
            out[key] = value
    return out


def _shape(stored: dict, key: str, path: Path) -> torch.Size:
    for name in (key + ".weight", key + ".weight_v", key + ".parametrizations.weight.original1"):
        if name in stored:
            return stored[name].shape
    raise OmniError(f"{path.parent / PTH}: no {key}.weight (nor its weight-norm pair); the config's 'ratios' "
                    f"says it should be there")


def translate_codec_config(raw: dict, stored: dict, path: Path) -> dict[str, Any]:
    """The transformers-layout config of an original-layout codec. Boson's code fixes some widths
    (encoder 64, decoder 1024, HuBERT-base semantic teacher 768): they are read from the
    weights' shapes, which give the same numbers for the release and any other size."""
    teacher = raw.get("semantic_techer", "hubert_base_general")  # sic: Boson's spelling
    if teacher not in HUBERT_TEACHERS:
        raise ConfigError(path, "semantic_techer", f"{teacher!r}: transformers' Higgs audio tokenizer has a "
                          f"HuBERT semantic model ({', '.join(HUBERT_TEACHERS)})")
    if not isinstance(raw["bins"], int):
        raise ConfigError(path, "bins", f"{raw['bins']!r}: an FSQ quantizer; Higgs's codec is an RVQ (an integer)")
    ratios = [int(r) for r in raw["ratios"]]
    sample_rate = int(raw.get("sample_rate", 24000))
    frame_rate = math.ceil(sample_rate / math.prod(ratios))
    nbits = math.ceil(math.log2(raw["bins"]))
    n_q = int(raw["n_q"])

    def quantizers(bandwidth: float) -> int:  # HiggsAudioV2TokenizerConfig.num_quantizers's rule
        return int(1000 * bandwidth // (frame_rate * nbits))

    # the model holds n_q quantizers; transformers sizes its RVQ by the last bandwidth, so keep
    # those n_q covers ([0.5, 1, 1.5, 2, 4] at n_q 8 -> [0.5, 1, 1.5, 2], as released converted)
    bandwidths = [b for b in raw.get("target_bandwidths", []) if quantizers(b) <= n_q]
    if not bandwidths or quantizers(bandwidths[-1]) != n_q:
        bandwidths.append(n_q * frame_rate * nbits / 1000)
    semantic = _hubert_config(stored, path)
    return {
        "model_type": TRANSFORMERS,
        "acoustic_model_config": {
            "model_type": "dac",
            "encoder_hidden_size": int(_shape(stored, "encoder.block.0", path)[0]),
            "downsampling_ratios": ratios,
            "decoder_hidden_size": int(_shape(stored, "decoder_2.model.0", path)[0]),
            "upsampling_ratios": ratios,
            "hidden_size": int(raw["D"]),
        },
        "semantic_model_config": semantic,
        "target_bandwidths": bandwidths,
        "sample_rate": sample_rate,
        "codebook_size": int(raw["bins"]),
        "codebook_dim": int(raw.get("codebook_dim") or int(raw["D"]) + semantic["hidden_size"]),
        "semantic_sample_rate": int(raw.get("semantic_sample_rate") or 16000),
        "downsample_factor": SEMANTIC_DOWNSAMPLE,
        # the semantic encoder/decoder's constructor defaults in Boson's code, as transformers'
        "kernel_size": 3, "channel_ratios": [1, 1], "strides": [1, 1], "block_dilations": [1, 1],
        "unit_kernel_size": 3,
    }


def _hubert_config(stored: dict, path: Path) -> dict[str, Any]:
    """The semantic model's HubertConfig fields as the weights give them (the rest are
    HubertConfig's defaults, HuBERT base's, as the conversion leaves them)."""
    prefix = "semantic_model."
    try:
        hidden = stored[prefix + "feature_projection.projection.weight"].shape[0]
        layers = len({k.split(".")[3] for k in stored if k.startswith(prefix + "encoder.layers.")})
        inter = stored[prefix + "encoder.layers.0.feed_forward.intermediate_dense.weight"].shape[0]
        convs = [stored[f"{prefix}feature_extractor.conv_layers.{i}.conv.weight"].shape
                 for i in range(len({k.split(".")[3] for k in stored
                                     if k.startswith(prefix + "feature_extractor.conv_layers.")}))]
        pos = _shape(stored, prefix + "encoder.pos_conv_embed.conv", path)  # [hidden, hidden / groups, k]
    except KeyError as e:
        raise OmniError(f"{path.parent / PTH}: no semantic model weight {e}; the original codec layout holds "
                        f"its HuBERT under semantic_model.*") from None
    return {
        "model_type": "hubert",
        "mask_time_prob": 0.0,  # HiggsAudioV2TokenizerConfig's default for its HuBERT
        "hidden_size": int(hidden),
        "num_hidden_layers": layers,
        # HuBERT base's heads are 64 wide; the count is in no weight's shape
        "num_attention_heads": max(1, int(hidden) // 64),
        "intermediate_size": int(inter),
        "conv_dim": [int(s[0]) for s in convs],
        "conv_kernel": [int(s[2]) for s in convs],
        "num_feat_extract_layers": len(convs),
        "num_conv_pos_embeddings": int(pos[2]),
        "num_conv_pos_embedding_groups": int(pos[0]) // int(pos[1]),
    }
