"""Qwen3-TTS-12Hz: the native talker, code predictor, 12 Hz codec (decode and encode), speaker
encoder, text tokenizer and prompt building (docs/design.md section 8)."""
