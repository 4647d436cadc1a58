"""runners/higgs_audio_v2/hubert.py against transformers' HubertModel (the oracle, float32, CPU):
every hidden state the codec's semantic branch averages, from both weight-norm namings; layouts
it does not compute are refused by name; and a voice's encode imports no transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from omni_cli.runners.errors import ConfigError
from omni_cli.runners.higgs_audio_v2.hubert import Hubert, fold_hubert_weight_norm
from tests.conftest import TINY

SMALL = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 24,
         "conv_dim": [8] * 7, "num_conv_pos_embedding_groups": 2}


def _pair(config: dict, old_names: bool):
    """transformers' HubertModel (random weights, eval) and ours loaded from its state dict, the
    positional conv's weight norm stored as parametrizations or as weight_g / weight_v."""
    from transformers import HubertConfig, HubertModel

    torch.manual_seed(0)
    ref = HubertModel(HubertConfig(**config)).eval()
    state = {k: v for k, v in ref.state_dict().items() if k != "masked_spec_embed"}
    if old_names:
        conv = "encoder.pos_conv_embed.conv."
        state[conv + "weight_g"] = state.pop(conv + "parametrizations.weight.original0")
        state[conv + "weight_v"] = state.pop(conv + "parametrizations.weight.original1")
    ours = Hubert(config)
    ours.load_state_dict(fold_hubert_weight_norm(state, ""), strict=True)
    return ref, ours.eval()


@pytest.mark.parametrize("config, old_names", [(SMALL, False), (SMALL, True),
                                               ({**SMALL, "num_conv_pos_embeddings": 7, "conv_bias": True}, False),
                                               ({**SMALL, "feat_proj_layer_norm": False}, True)])
def test_hidden_states_equal_transformers(config, old_names):
    ref, ours = _pair(config, old_names)
    audio = torch.randn(2, 6400, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = ref(audio, output_hidden_states=True).hidden_states
        got = ours(audio)
    assert len(got) == len(want) == config["num_hidden_layers"] + 1
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key, value", [("do_stable_layer_norm", True), ("feat_extract_norm", "layer"),
                                        ("hidden_act", "relu"), ("conv_pos_batch_norm", True)])
def test_a_layout_it_does_not_compute_is_an_error_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"semantic_model_config.{key}"):
        Hubert({**SMALL, key: value}, "codec/config.json")


def test_encoding_a_voice_imports_no_transformers():
    """Its import was most of a cold run's encoder load (BENCHMARKS.md, reference voices)."""
    code = ("import sys, numpy as np, torch\n"
            "from omni_cli.runners.higgs_audio_v2.encoder import HiggsCodecEncoder\n"
            f"enc = HiggsCodecEncoder.load({str(TINY / 'codec')!r})\n"
            "codes = enc.encode([np.random.default_rng(0).standard_normal(24000).astype(np.float32) * 0.1])\n"
            "assert codes[0].ndim == 2 and len(codes[0]) > 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
