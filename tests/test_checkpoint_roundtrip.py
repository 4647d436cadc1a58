"""Checkpoints saved by transformers load in our engine with no missing or unexpected keys."""

from __future__ import annotations

import json

import pytest
import torch

from omni_cli.errors import OmniError
from omni_cli.runners.attention import AttentionContext, KVCache
import omni_cli.runners.checkpoint as checkpoint
from safetensors.torch import load_file, save_file

from omni_cli.runners.checkpoint import load_into, read_safetensors, stream_into
from omni_cli.runners.higgs_audio_v2.family import IGNORED_KEYS
from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder
from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from tests.reference import HiggsAudioV2ForConditionalGeneration, HiggsAudioV2TokenizerModel
from tests.audio_controls import change_codec_frame
from tests.tiny_checkpoint import build_tokenizer, drive_by_codes, tiny_codec, tiny_codec_config, tiny_lm_config


def _prefill_logits(model: HiggsAudioV2LM, ids: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    t = ids.shape[1]
    kv = KVCache(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, 64, cfg.head_dim, torch.float32, torch.device("cpu"))
    ar = torch.arange(t)
    ctx = AttentionContext(kv=kv, is_prefill=True, slots_gpu=torch.tensor([0]), positions_gpu=ar[None],
                           mask_gpu=(ar[:, None] >= ar[None, :])[None, None], kv_len=t)
    with torch.no_grad():
        return model.compute_logits(model(ctx, input_ids=ids)[0])


def test_lm_roundtrip_keys_and_logits(tmp_path):
    # a shape unlike the shipped one (3 layers, MHA, no GQA), saved with the
    # optional text head that released checkpoints carry
    torch.manual_seed(3)
    tok = build_tokenizer()
    cfg = tiny_lm_config(tok, num_hidden_layers=3, num_key_value_heads=4, hidden_size=48, head_dim=12)
    ref = HiggsAudioV2ForConditionalGeneration(cfg, use_text_head=True).eval()
    ref.save_pretrained(tmp_path)
    assert "text_lm_head.weight" in read_safetensors(tmp_path)
    ours = HiggsAudioV2LM(HiggsConfig.from_file(tmp_path / "config.json"), max_seq_len=64)
    stream_into(ours, tmp_path, ignore=IGNORED_KEYS)  # raises on any missing/unexpected key
    ids = torch.randint(0, 200, (1, 17))
    with torch.no_grad():
        want = ref(input_ids=ids).logits[0].float()
    torch.testing.assert_close(_prefill_logits(ours, ids), want, atol=1e-5, rtol=1e-5)


def test_lm_load_names_missing_and_unexpected(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_lm_config(build_tokenizer())
    HiggsAudioV2ForConditionalGeneration(cfg).save_pretrained(tmp_path)
    state = read_safetensors(tmp_path)
    state.pop("audio_lm_head.weight")
    state["model.extra.weight"] = torch.zeros(1)
    ours = HiggsAudioV2LM(HiggsConfig.from_file(tmp_path / "config.json"), max_seq_len=16)
    with pytest.raises(OmniError, match=r"missing \['audio_lm_head.weight'\].*unexpected \['model.extra.weight'\]"):
        load_into(ours, state, tmp_path)


def _saved_tiny_lm(folder, dtype=torch.float32, **save):
    torch.manual_seed(1)
    ref = HiggsAudioV2ForConditionalGeneration(tiny_lm_config(build_tokenizer())).to(dtype)
    ref.save_pretrained(folder, **save)
    return HiggsAudioV2LM(HiggsConfig.from_file(folder / "config.json"), max_seq_len=16)


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_stream_into_holds_what_safetensors_reads(tmp_path, monkeypatch, stored):
    """Every tensor streamed into the model equals what the safetensors library reads from the
    files (converted to the model's float32 where stored in bf16), with windows far smaller
    than the tensors, of a size no tensor boundary falls on, and the staging buffers
    recycled many times; over a sharded checkpoint."""
    monkeypatch.setattr(checkpoint, "STAGE_BYTES", 4099)
    ours = _saved_tiny_lm(tmp_path, stored, max_shard_size="200KB")
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) > 1
    want = {k: v for f in files for k, v in load_file(f).items()}
    assert {v.dtype for v in want.values()} == {stored}
    stream_into(ours, tmp_path)
    got = ours.state_dict()
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == torch.float32
        assert torch.equal(got[k], v.float()), k


def test_stream_into_names_what_does_not_fit(tmp_path):
    ours = _saved_tiny_lm(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    head = state.pop("audio_lm_head.weight")
    save_file({**state, "model.extra.weight": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(OmniError, match=r"missing \['audio_lm_head.weight'\].*unexpected \['model.extra.weight'\]"):
        stream_into(ours, tmp_path)
    save_file({**state, "audio_lm_head.weight": head[:, :-1].contiguous()}, tmp_path / "model.safetensors")
    with pytest.raises(OmniError, match=r"'audio_lm_head.weight' has shape \[.*\] in model.safetensors, the "
                                        r"model's config makes it"):
        stream_into(ours, tmp_path)


def _raw_safetensors(path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)


def test_stream_into_refuses_files_the_safetensors_library_refuses(tmp_path):
    """A cut file, a Git LFS pointer, a tensor given other bytes than its shape's, overlapping
    tensors, a key in two files: each an error naming the file (and the tensor)."""
    ours = _saved_tiny_lm(tmp_path)
    f = tmp_path / "model.safetensors"
    whole = f.read_bytes()
    f.write_bytes(whole[:-100])
    with pytest.raises(OmniError, match=r"model.safetensors: tensor '.*' has bytes \["):
        stream_into(ours, tmp_path)
    f.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    with pytest.raises(OmniError, match="not a safetensors file .*Git LFS pointer"):
        stream_into(ours, tmp_path)
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json" + bytes(8))
    with pytest.raises(OmniError, match=r"model.safetensors: not a readable safetensors file"):
        stream_into(ours, tmp_path)
    _raw_safetensors(f, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, bytes(16))
    with pytest.raises(OmniError, match=r"tensor 'a' has bytes \[0, 8\) for shape \[4\] of F32"):
        stream_into(ours, tmp_path)
    _raw_safetensors(f, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12))
    with pytest.raises(OmniError, match="the bytes of tensors 'a' and 'b' overlap"):
        stream_into(ours, tmp_path)
    # a key in two of the shards an index names (a stale file beside the single one is not read)
    f.rename(tmp_path / "a.safetensors")
    f.write_bytes(whole)
    save_file({"audio_lm_head.weight": ours.state_dict()["audio_lm_head.weight"].clone()}, tmp_path / "b.safetensors")
    stream_into(ours, tmp_path)
    f.unlink()
    (tmp_path / "a.safetensors").write_bytes(whole)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"audio_lm_head.weight": "b.safetensors", "model.norm.weight": "a.safetensors"}}))
    with pytest.raises(OmniError, match="'audio_lm_head.weight' is in both b.safetensors and a.safetensors"):
        stream_into(ours, tmp_path)


@pytest.mark.parametrize("weight_norm", [False, True])
def test_codec_roundtrip(tmp_path, weight_norm):
    """Our decoder, built from the codec checkpoint, decodes like HiggsAudioV2TokenizerModel.decode.

    With weight_norm the checkpoint stores DAC's weight-norm parametrization
    (as converted DAC checkpoints may); the loader folds it into plain weights.
    """
    torch.manual_seed(5)
    ref = tiny_codec()
    if weight_norm:
        ref.apply_weight_norm()
    ref.save_pretrained(tmp_path)
    if weight_norm:
        assert any("parametrizations" in k or k.endswith("weight_g") for k in read_safetensors(tmp_path))
    ours = HiggsCodecDecoder.load(tmp_path, torch.float32, torch.device("cpu"))
    codes = torch.randint(0, 1024, (2, 8, 13))
    with torch.no_grad():
        want = ref.decode(codes).audio_values[:, 0]
    got = ours.decode(codes)
    assert got.shape == (2, 13 * 960)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # controls: one frame's codes changed, or the rows swapped, fail the same bound
    with pytest.raises(AssertionError):
        torch.testing.assert_close(ours.decode(change_codec_frame(codes, row=1)), want, atol=1e-6, rtol=1e-5)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got.flip(0), want, atol=1e-6, rtol=1e-5)


def test_folded_dilated_convolutions_decode_like_the_reference(tmp_path):
    """Every unit's dilated convolution as conv2d over the [L/d, d] view (codec.py:
    _FoldedConv1d, what CUDA runs for some in 16-bit), at lengths no multiple of the dilation:
    the decode equals HiggsAudioV2TokenizerModel.decode's (float32)."""
    from omni_cli.runners.higgs_audio_v2.codec import _FoldedConv1d, _ResidualUnit

    torch.manual_seed(7)
    cfg = tiny_codec_config()
    cfg.acoustic_model_config.decoder_hidden_size = 64
    ref = tiny_codec(cfg)
    ref.save_pretrained(tmp_path)
    ours = HiggsCodecDecoder.load(tmp_path, torch.float32, torch.device("cpu"))
    dilated = [m.conv1 for m in ours.modules() if isinstance(m, _ResidualUnit) and m.conv1.dilation[0] > 1]
    for conv in dilated:
        conv.__class__ = _FoldedConv1d
    codes = torch.randint(0, 1024, (2, 8, 13))  # 13 frames: 104 samples at the first units' rate, not 3k or 9k
    with torch.no_grad():
        want = ref.decode(codes).audio_values[:, 0]
    assert len(dilated) == 2 * len(ours.acoustic_decoder.block) and sorted({c.dilation[0] for c in dilated}) == [3, 9]
    torch.testing.assert_close(ours.decode(codes), want, atol=1e-6, rtol=1e-5)
    with pytest.raises(AssertionError):  # control: one frame's codes changed fails the same bound
        torch.testing.assert_close(ours.decode(change_codec_frame(codes)), want, atol=1e-6, rtol=1e-5)


def test_codec_config_without_decoder_keys_takes_the_references_defaults(tmp_path):
    """A codec config that leaves the acoustic decoder's sizes out builds what
    HiggsAudioV2TokenizerConfig builds from it (its own defaults, not DacConfig's)."""
    from transformers import HiggsAudioV2TokenizerConfig

    torch.manual_seed(6)
    tiny = tiny_codec_config().to_dict()
    cfg = HiggsAudioV2TokenizerConfig(target_bandwidths=tiny["target_bandwidths"], codebook_size=1024, codebook_dim=8,
                                      acoustic_model_config={"encoder_hidden_size": 2},
                                      semantic_model_config=tiny["semantic_model_config"])
    ref = drive_by_codes(HiggsAudioV2TokenizerModel(cfg).eval())
    ref.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("hidden_size", "decoder_hidden_size", "upsampling_ratios", "downsampling_ratios"):
        raw["acoustic_model_config"].pop(key)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ours = HiggsCodecDecoder.load(tmp_path, torch.float32, torch.device("cpu"))
    codes = torch.randint(0, 1024, (1, ours.num_quantizers, 5))
    with torch.no_grad():
        want = ref.decode(codes).audio_values[:, 0]
    torch.testing.assert_close(ours.decode(codes), want, atol=1e-5, rtol=1e-4)
    with pytest.raises(AssertionError):  # control: one frame's codes changed fails the same bound
        torch.testing.assert_close(ours.decode(change_codec_frame(codes)), want, atol=1e-5, rtol=1e-4)
