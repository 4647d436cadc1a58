"""Random-weight scorer checkpoints at release shapes, in the real transformers format, for the
end-to-end benchmark's --score runs (no hub on the device).

Whisper large-v3-turbo's shape (128 mel bins, d_model 1280, 32 encoder and 4 decoder layers, 20
heads, 51,866 tokens) with the test tokenizer (tests/scoring_checkpoints.py: byte-level, Whisper's
special and timestamp tokens). Random weights never stop on their own, so the checkpoint's
generation config caps a transcript at MAX_TEXT_TOKENS, about what an 8 s sentence of English
takes; every token the tokenizer cannot spell is suppressed.
"""

from __future__ import annotations

from pathlib import Path

import torch

MAX_TEXT_TOKENS = 32
TURBO = dict(vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32, decoder_layers=4,
             encoder_attention_heads=20, decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120,
             max_source_positions=1500, max_target_positions=448)


def write_whisper_turbo(folder: Path) -> Path:
    from tokenizers import AddedToken
    from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                              WhisperProcessor, WhisperTokenizer)

    from tests.scoring_checkpoints import LANGS, SPECIALS, _byte_chars

    if (folder / "written").exists():
        return folder
    chars = _byte_chars()
    tok = WhisperTokenizer(vocab={c: i for i, c in enumerate(chars)}, merges=[])
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=False, special=False)
                    for i in range(1501)])
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    cfg = WhisperConfig(**TURBO, decoder_start_token_id=sot, pad_token_id=eot, eos_token_id=eot, bos_token_id=eot)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = WhisperForConditionalGeneration(cfg).to(torch.float16).eval()
    spelled = {i for i, c in enumerate(chars) if c.isalpha() and c.isascii()} | {chars.index(chr(0x120)), eot}
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot,
        max_length=4 + MAX_TEXT_TOKENS, no_timestamps_token_id=ids["<|notimestamps|>"], is_multilingual=True,
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGS},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        suppress_tokens=[i for i in range(cfg.vocab_size) if i not in spelled])
    model.save_pretrained(folder)
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok).save_pretrained(folder)
    (folder / "written").write_text("whisper-large-v3-turbo shape")
    return folder
