"""Tiny Qwen3-TTS-12Hz checkpoints in the released folder layout (golden generator helper).

Imported by make_qwen3_tts.py, which runs in the reference venv (see README.md).
Field names follow qwen-tts 0.1.1's config classes and inference code; values are
shrunk. Codec ids keep the release's layout shifted down: a codec id here is the
release's id minus (2048 - CODES), so control ids stay in the top 1024 of the
talker vocabulary, which is the only rule the reference relies on.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib

import regex

CODES = 32  # codes per codebook (release: 2048); talker vocab = CODES + 1024 control ids
SHIFT = 2048 - CODES
QK_NORM = 3.0  # q_norm / k_norm weight level
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
               r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# The split transformers 4.57.3 swaps in under fix_mistral_regex=True (vocabularies over 100000).
MISTRAL_FIX_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                     r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                     r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3's added tokens in release order (151643...); the last five are this generator's guess.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
            "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
            "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
            "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
            "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
            "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
            "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"]
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"}
LANGS = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
         "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
         "beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
            "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECT = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
# Per checkpoint: (tts_model_size, talker hidden, talker layers, predictor hidden, text hidden, seed).
SHAPES = {"base": ("0b6", 32, 2, 32, 32, 105),
          "custom_voice": ("1b7", 32, 1, 16, 32, 202),
          "voice_design": ("1b7", 32, 1, 16, 32, 305)}


def byte_table() -> dict[int, str]:
    """GPT-2's reversible byte-to-unicode map, in Qwen2 vocabulary order (printable bytes first)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + len(table) - len(printable))
    return table


def byte_encode(text: str) -> str:
    table = byte_table()
    return "".join(table[b] for b in text.encode("utf-8"))


def build_bpe(corpus: list[str], whole: list[str]) -> tuple[dict, list[str]]:
    """vocab.json / merges.txt content: bytes, then left-to-right merges of corpus pieces.

    Ordinary pieces get at most 4 merges (so words span several tokens). Pieces of
    `whole`, split by both regexes, are merged whole: the role header must be 3 tokens
    ("<|im_start|>", "assistant", "\n") as the reference slices it, and the rule texts
    then show the split rule in their ids.
    """
    vocab = {c: i for i, c in enumerate(byte_table().values())}
    merges: list[str] = []
    pieces = [(p, 4) for t in corpus for p in regex.findall(QWEN2_SPLIT, t)]
    pieces += [(p, 64) for t in whole for pat in (QWEN2_SPLIT, MISTRAL_FIX_SPLIT)
               for p in regex.findall(pat, t)]
    for piece, cap in pieces:
        sym = byte_encode(piece)
        left = sym[0]
        for ch in sym[1:1 + cap]:
            if left + ch not in vocab:
                vocab[left + ch] = len(vocab)
                merges.append(f"{left} {ch}")
            left += ch
    return vocab, merges


def tokenizer_config(first_special: int) -> dict:
    """tokenizer_config.json as the release's Qwen2Tokenizer config lays it out."""
    added = {str(first_special + i): {"content": tok, "lstrip": False, "normalized": False,
                                      "rstrip": False, "single_word": False,
                                      "special": tok not in NOT_SPECIAL}
             for i, tok in enumerate(SPECIALS)}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                                          "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                                          "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                                          "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                          "<|video_pad|>"],
            "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
            "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def text_ids(first_special: int) -> dict:
    pos = {tok: first_special + i for i, tok in enumerate(SPECIALS)}
    return {"im_start_token_id": pos["<|im_start|>"], "im_end_token_id": pos["<|im_end|>"],
            "tts_pad_token_id": pos["<tts_pad>"], "tts_bos_token_id": pos["<tts_text_bos>"],
            "tts_eos_token_id": pos["<tts_text_eod>"]}


def model_config(kind: str, first_special: int) -> dict:
    """config.json for one checkpoint type (release field names, tiny sizes)."""
    size, hid, layers, cp_hid, text_hid, _ = SHAPES[kind]
    text_vocab = -(-(first_special + len(SPECIALS)) // 64) * 64  # padded like the release's 151936
    cp = {"vocab_size": CODES, "hidden_size": cp_hid, "intermediate_size": 2 * cp_hid,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
          "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
          "rope_theta": 1000000, "rope_scaling": None, "attention_bias": False,
          "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
          "max_window_layers": 28, "layer_types": ["full_attention"], "num_code_groups": 16,
          "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": False,
          "model_type": "qwen3_tts_talker_code_predictor"}
    talker = {"code_predictor_config": cp, "vocab_size": CODES + 1024, "hidden_size": hid,
              "intermediate_size": 2 * hid, "num_hidden_layers": layers, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 128, "hidden_act": "silu",
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
              "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20],
                               "rope_type": "default", "type": "default"},
              "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
              "sliding_window": None, "num_code_groups": 16, "text_hidden_size": text_hid,
              "text_vocab_size": text_vocab, "codec_eos_token_id": 2150 - SHIFT,
              "codec_think_id": 2154 - SHIFT, "codec_nothink_id": 2155 - SHIFT,
              "codec_think_bos_id": 2156 - SHIFT, "codec_think_eos_id": 2157 - SHIFT,
              "codec_pad_id": 2148 - SHIFT, "codec_bos_id": 2149 - SHIFT,
              "codec_language_id": {k: v - SHIFT for k, v in LANGS.items()},
              "spk_id": {}, "spk_is_dialect": {}, "initializer_range": 0.02, "use_cache": True,
              "tie_word_embeddings": False, "model_type": "qwen3_tts_talker"}
    if kind == "custom_voice":
        talker["spk_id"] = {k: v - SHIFT for k, v in SPEAKERS.items()}
        talker["spk_is_dialect"] = {k: DIALECT.get(k, False) for k in SPEAKERS}
    spk = {"mel_dim": 128, "enc_dim": hid, "enc_channels": [16, 16, 16, 16, 48],
           "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
           "enc_attention_channels": 8, "enc_res2net_scale": 8, "enc_se_channels": 8,
           "sample_rate": 24000}
    return {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
            "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": size,
            "tts_model_type": kind, **text_ids(first_special),
            "speaker_encoder_config": spk, "talker_config": talker, "torch_dtype": "float32",
            "transformers_version": "4.57.3"}


def speech_tokenizer_config() -> dict:
    """speech_tokenizer/config.json: a Mimi encoder and the 12 Hz decoder, tiny widths."""
    enc = {"sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1, "hidden_size": 16,
           "num_filters": 2, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4],
           "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3,
           "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant",
           "compress": 2, "trim_right_ratio": 1.0, "codebook_size": CODES, "codebook_dim": 8,
           "num_quantizers": 16, "use_conv_shortcut": False,
           "vector_quantization_hidden_dimension": 8, "num_semantic_quantizers": 1,
           "upsample_groups": 16, "num_hidden_layers": 1, "intermediate_size": 32,
           "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "gelu",
           "max_position_embeddings": 8000, "norm_eps": 1e-05, "use_cache": False,
           "use_streaming": False, "rope_theta": 10000.0, "sliding_window": 250,
           "layer_scale_initial_scale": 0.01, "attention_bias": False, "model_type": "mimi"}
    dec = {"codebook_size": CODES, "codebook_dim": 16, "hidden_size": 16, "latent_dim": 16,
           "max_position_embeddings": 8000, "rope_theta": 10000, "num_attention_heads": 2,
           "num_key_value_heads": 2, "head_dim": 8, "attention_bias": False, "sliding_window": 72,
           "intermediate_size": 32, "hidden_act": "silu", "layer_scale_initial_scale": 0.01,
           "rms_norm_eps": 1e-05, "num_hidden_layers": 1, "num_quantizers": 16,
           "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 16,
           "attention_dropout": 0.0}
    return {"architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
            "encoder_config": enc, "decoder_config": dec, "encoder_valid_num_quantizers": 16,
            "input_sample_rate": 24000, "output_sample_rate": 24000, "decode_upsample_rate": 1920,
            "encode_downsample_rate": 1920, "torch_dtype": "float32",
            "transformers_version": "4.57.3"}


GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0,
                     "top_k": 50, "subtalker_dosample": True, "subtalker_temperature": 0.9,
                     "subtalker_top_p": 1.0, "subtalker_top_k": 50, "max_new_tokens": 8192}
ENCODEC_PREPROCESSOR = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                        "feature_size": 1, "overlap": None, "padding_side": "right",
                        "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000}


def fill_weights(state: dict, seed: int) -> dict:
    """Deterministic values per tensor name (independent of module init order)."""
    import torch

    out = {}
    for name in sorted(state):
        t = state[name]
        g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
        n = torch.randn(t.shape, generator=g, dtype=torch.float64)
        leaf = name.rsplit(".", 1)[-1]
        if not t.is_floating_point():
            v = torch.ones_like(t)  # Mimi's `initialized` flags
        elif "cluster_usage" in name:
            v = 0.5 + n.abs()
        elif "embed_sum" in name or "embedding_sum" in name:
            v = n
        elif leaf in ("alpha", "beta", "bias") or "layer_scale" in name or "scale" == leaf:
            v = 0.1 * n + (0.2 if ("scale" in name) else 0.0)
        elif leaf == "gamma":
            v = 0.3 + 0.1 * n
        elif "q_norm" in name or "k_norm" in name:
            v = QK_NORM + 0.1 * n  # sharper attention, so the whole prompt steers the codes
        elif t.dim() == 1:
            v = 1.0 + 0.1 * n  # norm weights
        elif "embedding" in name or "embed_tokens" in name:
            v = n
        else:
            v = n / (t[0].numel() ** 0.5)  # fan-in scaling keeps activations O(1)
        out[name] = v.to(t.dtype).contiguous()
    return out


def write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_tokenizer(folder: str, vocab: dict, merges: list[str]) -> int:
    """vocab.json, merges.txt, tokenizer_config.json; returns the first added-token id."""
    write_json(os.path.join(folder, "vocab.json"), vocab)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    write_json(os.path.join(folder, "tokenizer_config.json"), tokenizer_config(len(vocab)))
    return len(vocab)


def save_npz(path: str, arrays: dict) -> None:
    """np.savez without its timestamps, so reruns give identical bytes."""
    import numpy as np

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w") as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arrays[key]), allow_pickle=False)
