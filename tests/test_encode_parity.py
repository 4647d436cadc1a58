"""Codec encode (runners/higgs_audio_v2/encoder.py) against transformers' HiggsAudioV2TokenizerModel.encode.

The oracle is the reference model loaded from the same folder, in float32 on the CPU. Its
torchaudio is the test stand-in, whose resample is ours (tests/torchaudio_standin.py): these
tests check everything after the resampling, tests/test_resample.py the resampler.

Two codecs: the embedded tiny one as shipped, and a copy whose encode path is re-initialised
so codes follow the audio (tests/tiny_checkpoint.py drive_encoder): with transformers' init
a few seconds encode to two or three distinct codes a quantizer, which would hide most bugs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests import torchaudio_standin

torchaudio_standin.install()  # before transformers' tokenizer model is imported

from transformers import HiggsAudioV2TokenizerModel  # noqa: E402

from omni_cli.runners.checkpoint import read_safetensors  # noqa: E402
from omni_cli.runners.errors import ConfigError  # noqa: E402
from omni_cli.runners.higgs_audio_v2 import encoder as encoder_module  # noqa: E402
from omni_cli.runners.higgs_audio_v2.encoder import HiggsCodecEncoder  # noqa: E402
from omni_cli.runners.resample import resample  # noqa: E402
from tests.conftest import TINY  # noqa: E402
from tests.tiny_checkpoint import drive_encoder  # noqa: E402

CODEC = TINY / "codec"
SR = 24000
NUM_QUANTIZERS = 8


def _clip(seconds: float, rate: int = SR, seed: int = 0) -> np.ndarray:
    """Noise plus three sines, peaks well inside [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.1 * rng.standard_normal(t.size) + 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1375 * t + 1)
    return (x + 0.1 * np.sin(2 * np.pi * 3100 * t) * np.sin(2 * np.pi * 2 * t)).astype(np.float32)


def _reference_codes(ref: HiggsAudioV2TokenizerModel, clip: np.ndarray) -> np.ndarray:
    """codes [frames, Q] of the reference's encode at its top bandwidth (the processor's call)."""
    with torch.no_grad():
        codes = ref.encode(torch.from_numpy(clip)[None, None]).audio_codes  # [1, Q, frames]
    return codes[0].T.numpy()


@pytest.fixture(scope="module")
def codecs(tmp_path_factory):
    """{name: (reference, ours)} for the shipped tiny codec and its driven copy."""
    out = {}
    shipped = HiggsAudioV2TokenizerModel.from_pretrained(CODEC).eval()
    out["shipped"] = (shipped, HiggsCodecEncoder.load(CODEC, torch.float32, "cpu", NUM_QUANTIZERS))
    driven_dir = tmp_path_factory.mktemp("driven-codec")
    drive_encoder(HiggsAudioV2TokenizerModel.from_pretrained(CODEC).eval()).save_pretrained(driven_dir)
    driven = HiggsAudioV2TokenizerModel.from_pretrained(driven_dir).eval()
    out["driven"] = (driven, HiggsCodecEncoder.load(driven_dir, torch.float32, "cpu", NUM_QUANTIZERS))
    return out


@pytest.mark.parametrize("name", ["shipped", "driven"])
@pytest.mark.parametrize("seconds", [3.0, 2.0 + 517 / SR])  # a whole number of frames, and not
def test_codes_equal_the_reference_at_24k(codecs, name, seconds):
    ref, ours = codecs[name]
    clip = _clip(seconds)
    got = ours.encode([clip])[0]
    want = _reference_codes(ref, clip)
    assert got.dtype == np.int64 and got.shape == want.shape and got.shape[1] == NUM_QUANTIZERS
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["shipped", "driven"])
def test_codes_equal_the_reference_from_44k1(codecs, name):
    ref, ours = codecs[name]
    at_44k1 = _clip(2.5, rate=44100, seed=1)
    clip = resample(torch.from_numpy(at_44k1), 44100, SR).numpy()  # both sides take the same 24 kHz clip
    assert clip.shape == (-(-SR * at_44k1.size // 44100),)
    np.testing.assert_array_equal(ours.encode([clip])[0], _reference_codes(ref, clip))


def test_driven_codes_follow_the_audio(codecs):
    """Negative control: a parity test over codes that ignore the audio would prove nothing.
    The driven codec's codes vary within a clip, and noise at 1% of full scale moves many."""
    ref, ours = codecs["driven"]
    clip = _clip(3.0)
    codes = _reference_codes(ref, clip)
    assert all(np.unique(codes[:, q]).size >= 10 for q in range(NUM_QUANTIZERS))
    noisy = clip + 0.01 * np.random.default_rng(7).standard_normal(clip.size).astype(np.float32)
    assert (ours.encode([noisy])[0] != codes).sum() >= 50


def test_another_resampler_breaks_parity(codecs, monkeypatch):
    """Negative control: the same encoder with linear interpolation in place of the sinc
    resampler (only on our side) no longer matches the reference."""
    ref, ours = codecs["driven"]
    clip = _clip(3.0)
    want = _reference_codes(ref, clip)

    def linear(x: torch.Tensor, orig: int, new: int) -> torch.Tensor:
        size = -(-new * x.shape[-1] // orig)
        return torch.nn.functional.interpolate(x, size=size, mode="linear", align_corners=False)

    monkeypatch.setattr(encoder_module, "resample", linear)
    assert (ours.encode([clip])[0] != want).sum() >= 20


def test_a_batch_of_equal_lengths_equals_each_alone(codecs):
    _, ours = codecs["driven"]
    a, b, c = _clip(2.0, seed=2), _clip(2.0, seed=3), _clip(1.5, seed=4)
    together = ours.encode([a, c, b])  # a and b share a forward, c runs alone
    alone = [ours.encode([x])[0] for x in (a, c, b)]
    assert len(together) == 3
    for t, s in zip(together, alone):
        np.testing.assert_array_equal(t, s)
    assert not np.array_equal(together[0], together[2])  # different clips, different codes


def _config_and_state():
    return json.loads((CODEC / "config.json").read_text()), read_safetensors(CODEC)


@pytest.mark.parametrize("bandwidths", [[0.5, 1, 1.5, 2, 4], None])  # None: the config class's default
def test_sixteen_quantizers_are_a_clear_error(bandwidths):
    config, state = _config_and_state()
    if bandwidths is None:
        del config["target_bandwidths"]
    else:
        config["target_bandwidths"] = bandwidths
    with pytest.raises(ConfigError, match=r"give 16 quantizers.*expects 8"):
        HiggsCodecEncoder.from_state(config, state, torch.float32, "cpu", expect_quantizers=NUM_QUANTIZERS)


def test_from_state_equals_load():
    config, state = _config_and_state()
    a = HiggsCodecEncoder.from_state(config, state, torch.float32, "cpu", expect_quantizers=NUM_QUANTIZERS)
    b = HiggsCodecEncoder.load(CODEC, torch.float32, "cpu", NUM_QUANTIZERS)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_family_encodes_lazily_and_names_its_codec():
    from omni_cli.config import load_config
    from tests.conftest import load_family

    family = load_family(load_config(None), torch.float32, torch.device("cpu"))
    assert family._encoder is None  # loading the family paid nothing for the encoder
    from tests.test_digest import sha256_of

    ident = family.codec_identity()
    assert ident == "sha256:" + sha256_of(family.codec_files()) and ident == family.codec_identity()
    assert [f.name for f in family.codec_files()] == ["config.json", "model.safetensors"]
    clip = _clip(2.0)
    codes = family.encode_audio([clip])
    assert family._encoder is not None and len(codes) == 1
    ref = HiggsAudioV2TokenizerModel.from_pretrained(family.codec_dir).eval()
    np.testing.assert_array_equal(codes[0], _reference_codes(ref, clip))


def test_codec_digest_follows_the_files(tmp_path):
    import shutil

    from omni_cli.runners.digest import hash_files
    from omni_cli.runners.higgs_audio_v2.family import codec_files

    def digest(folder):
        return hash_files(codec_files(folder))

    copy = tmp_path / "codec"
    shutil.copytree(CODEC, copy)
    assert digest(copy) == digest(CODEC)
    (copy / "old-shard.safetensors").write_bytes(b"stale")  # beside model.safetensors: never loaded
    assert digest(copy) == digest(CODEC)
    cfg = copy / "config.json"
    cfg.write_text(cfg.read_text().replace('"kernel_size": 3', '"kernel_size": 3 '))  # same config, other bytes
    assert digest(copy) != digest(CODEC)


def test_a_codec_whose_hubert_config_has_spec_augment_loads(tmp_path):
    """The released config's HuBERT masks time steps in training (mask_time_prob 0.05), which
    makes transformers' HubertModel hold masked_spec_embed; saved checkpoints omit that tensor."""
    import shutil

    from safetensors import safe_open

    folder = tmp_path / "codec"
    shutil.copytree(CODEC, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["semantic_model_config"]["mask_time_prob"] = 0.05
    (folder / "config.json").write_text(json.dumps(raw))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "semantic_model.masked_spec_embed" not in f.keys()
    clip = _clip(1.0)
    assert np.array_equal(HiggsCodecEncoder.load(folder).encode([clip])[0],
                          HiggsCodecEncoder.load(CODEC).encode([clip])[0])
