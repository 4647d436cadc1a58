"""Write a tiny checkpoint in Boson's ORIGINAL layout, as the published files have it, from one in
transformers' layout (tests/tiny_checkpoint.py), by the inverse of transformers' conversion
scripts' mappings (convert_higgs_audio_v2_to_hf.py, convert_higgs_audio_v2_tokenizer_to_hf.py):
  model/  config.json (model_type higgs_audio, text_config), three shards + index, tokenizer,
          no chat template
  codec/  config.json (HiggsAudioTokenizer's arguments), model.pth (weight_g/weight_v pairs)
Written independently of runners/higgs_audio_v2/layouts.py and codec_layout.py (which map forward).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# the conversion's INNER_LAYER_NAMES, inverted: a residual unit's layer -> its Sequential index
UNIT = {"snake1": 0, "conv1": 1, "snake2": 2, "conv2": 3}


def original_lm_key(key: str) -> str:
    """transformers' LM key -> Boson's (the conversion's renames, inverted)."""
    if key.startswith("model.embed_audio_tokens.embed_audio_tokens."):
        return "audio_codebook_embeddings." + key[len("model.embed_audio_tokens.embed_audio_tokens."):]
    if key.startswith("model."):
        return key[len("model."):]
    if key in ("audio_lm_head.weight", "text_lm_head.weight"):
        return "audio_decoder_proj." + key
    raise KeyError(key)


def write_original_lm(src: Path, out: Path, text_head: bool = True) -> Path:
    """src: a transformers-layout model folder. Writes out/ in the original layout; returns out."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    state = load_file(src / "model.safetensors")
    if text_head:  # the release carries the text head (unused for audio): random, to be ignored
        g = torch.Generator().manual_seed(11)
        state["text_lm_head.weight"] = torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=g)
    orig = {original_lm_key(k): v for k, v in state.items()}
    keys = sorted(orig)
    shards = [keys[i::3] for i in range(3)]  # three shards, as published
    weight_map = {}
    for i, part in enumerate(shards, 1):
        name = f"model-{i:05d}-of-00003.safetensors"
        save_file({k: orig[k].contiguous() for k in part}, out / name, metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    rope = dict(cfg["rope_parameters"])
    text = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                                "attention_bias", "max_position_embeddings", "bos_token_id")}
    text.update(model_type="llama", eos_token_id=128001, rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    n = cfg["num_hidden_layers"]
    (out / "config.json").write_text(json.dumps({
        "architectures": ["HiggsAudioModel"], "model_type": "higgs_audio", "text_config": text,
        "audio_adapter_type": "dual_ffn_fast_forward", "audio_dual_ffn_layers": list(range(n)),
        "audio_ffn_hidden_size": cfg["hidden_size"], "audio_ffn_intermediate_size": cfg["intermediate_size"],
        "audio_num_codebooks": cfg["num_codebooks"], "audio_codebook_size": cfg["codebook_size"] - 2,
        "audio_stream_bos_id": cfg["audio_stream_bos_id"], "audio_stream_eos_id": cfg["audio_stream_eos_id"],
        "audio_out_token_idx": cfg["audio_token_id"], "audio_out_bos_token_id": cfg["audio_bos_token_id"],
        "audio_in_token_idx": cfg["audio_token_id"] - 1, "use_delay_pattern": True, "skip_audio_tower": True,
        "use_audio_out_self_attention": False, "pad_token_id": cfg["pad_token_id"],
    }, indent=2))
    shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)  # the original ships none
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    return out


def original_codec_key(key: str, blocks: int) -> str:
    """transformers' codec key -> Boson's (the tokenizer conversion's renames, inverted)."""
    m = re.match(r"acoustic_(encoder|decoder)\.(.*)$", key)
    if m:
        side, rest = m.groups()
        top = "encoder.block" if side == "encoder" else "decoder_2.model"
        ends = {"conv1": 0, "snake1": blocks + 1, "conv2": blocks + 2}
        head, _, tail = rest.partition(".")
        if head in ends:
            return f"{top}.{ends[head]}.{tail}"
        b = re.match(r"block\.(\d+)\.(res_unit(\d)\.(\w+)|snake1|conv1|conv_t1)\.(.*)$", rest)
        i, what, unit, layer, tail = b.groups()
        if unit:
            u = int(unit) - 1 if side == "encoder" else int(unit) + 1
            return f"{top}.{int(i) + 1}.block.{u}.block.{UNIT[layer]}.{tail}"
        index = {("encoder", "snake1"): 3, ("encoder", "conv1"): 4, ("decoder", "snake1"): 0,
                 ("decoder", "conv_t1"): 1}[side, what]
        return f"{top}.{int(i) + 1}.block.{index}.{tail}"
    key = re.sub(r"^quantizer\.quantizers\.", "quantizer.vq.layers.", key)
    key = key.replace(".codebook.", "._codebook.")
    key = re.sub(r"^fc\.", "fc_prior.", key)
    key = re.sub(r"^fc1\.", "fc_post1.", key)
    key = re.sub(r"^fc2\.", "fc_post2.", key)
    if key.startswith(("encoder_semantic.", "decoder_semantic.")):
        # Boson's Conv1d wraps an nn.Conv1d as .conv; a residual unit's 1x1 conv2 is a plain nn.Conv1d
        key = re.sub(r"(^[a-z_]+\.conv|\.conv|^decoder_semantic\.conv1|^decoder_semantic\.conv2|\.res_units\.\d+\.conv1)"
                     r"\.(weight|bias)$", r"\1.conv.\2", key)
    return key


def write_original_codec(src: Path, out: Path) -> Path:
    """src: a transformers-layout codec folder. Writes out/config.json and out/model.pth."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    ac = cfg["acoustic_model_config"]
    blocks = len(ac["upsampling_ratios"])
    state = {}
    for key, value in load_file(src / "model.safetensors").items():
        new = original_codec_key(key, blocks)
        acoustic = key.startswith(("acoustic_encoder.", "acoustic_decoder."))
        if acoustic and key.endswith(".weight"):  # DAC's WNConv: torch's weight_norm pair, dim 0
            base = new[: -len("weight")]
            state[base + "weight_g"] = value.flatten(1).norm(dim=1).view(-1, *([1] * (value.dim() - 1)))
            state[base + "weight_v"] = value.clone()
        else:
            state[new] = value.clone()
    torch.save(state, out / "model.pth")
    (out / "config.json").write_text(json.dumps({
        "n_filters": 32, "D": ac["hidden_size"], "target_bandwidths": [0.5, 1, 1.5, 2, 4],
        "ratios": ac["downsampling_ratios"], "sample_rate": cfg["sample_rate"], "bins": cfg["codebook_size"],
        "n_q": 8, "codebook_dim": cfg["codebook_dim"], "normalize": False, "causal": False,
        "semantic_techer": "hubert_base_general", "last_layer_semantic": True, "merge_mode": "concat",
        "downsample_mode": "step_down", "semantic_mode": "classic", "vq_scale": 1, "semantic_sample_rate": 16000,
    }, indent=2))
    return out


def write_original(src: Path, out: Path) -> Path:
    """A checkpoint pair (src/model, src/codec) in transformers' layout -> out/model, out/codec original."""
    write_original_lm(src / "model", out / "model")
    write_original_codec(src / "codec", out / "codec")
    return out
