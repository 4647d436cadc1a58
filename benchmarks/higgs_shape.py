"""A random-weight Higgs Audio v2 LM of the released 3B shape, for benchmarks (no checkpoint)."""

from __future__ import annotations

import torch

from runners.higgs_audio_v2.config import HiggsConfig
from runners.higgs_audio_v2.model import HiggsAudioV2LM

# config.json of the released 3B model (Llama-3.2-3B backbone, dual audio FFN)
SHAPES = {
    "higgs-audio-v2-3b": dict(
        vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, attention_bias=False, num_codebooks=8,
        codebook_size=1026, audio_token_id=128016, audio_bos_token_id=128013, audio_delay_token_id=128014,
        audio_stream_bos_id=1024, audio_stream_eos_id=1025, eos_token_id=128009,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 0.125,
                         "high_freq_factor": 0.5, "original_max_position_embeddings": 1024},
    ),
}


def random_lm(shape: str, max_seq_len: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> HiggsAudioV2LM:
    cfg = HiggsConfig(**SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):
        model = HiggsAudioV2LM(cfg, max_seq_len)
    return model.to_runtime(device, dtype)
