"""Tiny random Whisper and WavLMForXVector checkpoints in the real format (save_pretrained), for
the scorer tests. No hub: the Whisper tokenizer is a byte-level BPE with no merges, Whisper's
special tokens and its 1,501 timestamp tokens, built here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

LANGS = ("en", "zh", "de", "ja", "ko", "fr")
SPECIALS = (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{code}|>" for code in LANGS]
            + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
               "<|notimestamps|>"])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models on one torch thread: their ops are too small to share, and two threads beside
    another busy process spin-wait (a 30x slowdown measured on the 2-core CI machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def whisper(folder: Path, text_only: bool = True, seed: int = 0, layers: int = 1, positions: int = 64) -> Path:
    """A Whisper of `layers` layers (d_model 16) with a 40-token limit and `positions` decoder positions
    (448, a real Whisper's, for faster-whisper, which reads no generation limit). text_only: every token
    but lower-case letters, the space and end-of-text is suppressed (readable transcripts); else timestamps and
    all may come (for long-form decoding, which needs timestamps)."""
    from tokenizers import AddedToken
    from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                              WhisperProcessor, WhisperTokenizer)

    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    tok = WhisperTokenizer(vocab=vocab, merges=[])
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=False, special=False)
                    for i in range(1501)])
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    cfg = WhisperConfig(vocab_size=len(tok), num_mel_bins=80, d_model=16, encoder_layers=layers, decoder_layers=layers,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        max_source_positions=1500, max_target_positions=positions, init_std=0.5,
                        decoder_start_token_id=sot, pad_token_id=eot, eos_token_id=eot, bos_token_id=eot)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    allowed = {vocab[c] for c in "abcdefghijklmnopqrstuvwxyz"} | {vocab[chars[ord(" ")]], eot}
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot, max_length=40,
        no_timestamps_token_id=ids["<|notimestamps|>"], is_multilingual=True,
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGS},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        begin_suppress_tokens=[vocab[chars[ord(" ")]]],
        suppress_tokens=[i for i in range(len(tok)) if i not in allowed] if text_only else [])
    model.save_pretrained(folder)
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=tok).save_pretrained(folder)
    return folder


def wavlm(folder: Path, norm: str = "layer", seed: int = 0) -> Path:
    """A 2-layer WavLMForXVector (hidden 32, x-vector 8) whose TDNN dilates as the released ones do.
    norm: 'layer' (stable layer norm, as wavlm-large) or 'group' (group norm front, as the base models)."""
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    cfg = WavLMConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      conv_dim=(16,) * 7, conv_stride=(5, 2, 2, 2, 2, 2, 2), conv_kernel=(10, 3, 3, 3, 3, 2, 2),
                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, feat_extract_norm=norm,
                      do_stable_layer_norm=norm == "layer", tdnn_dim=(16, 16, 16, 16, 32), tdnn_kernel=(5, 3, 3, 1, 1),
                      tdnn_dilation=(1, 2, 3, 1, 1), xvector_output_dim=8, num_buckets=32, max_bucket_distance=100,
                      initializer_range=0.2)
    torch.manual_seed(seed)
    WavLMForXVector(cfg).eval().save_pretrained(folder)
    Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                             return_attention_mask=True).save_pretrained(folder)
    return folder


def tone(seconds: float, freq: float, rate: int = 16000, noise: float = 0.02, seed: int = 0) -> np.ndarray:
    """A speech-like test clip: a harmonic tone under a 3 Hz syllable envelope, plus a little noise."""
    t = np.arange(int(round(seconds * rate))) / rate
    voiced = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, 5))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    rng = np.random.default_rng(seed)
    return (0.25 * envelope * voiced + noise * rng.standard_normal(len(t))).astype(np.float32)
