"""The native Qwen3-TTS-12Hz codec pieces (runners/qwen3_tts/codec.py, encoder.py, speaker.py)
against qwen-tts 0.1.1's golden outputs (tests/golden/make_qwen3_tts.py). Each parity check sits
beside a negative control that must fail the same bound. Bounds:
  decoded audio (samples in [-1, 1])    1e-5 absolute
  reference codes                       exact
  x-vector                              1e-5 relative
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_cli.runners.qwen3_tts.loading import load_codec, load_encoder, load_speaker_encoder
from tests.qwen3_reference import GOLDEN, arrays, ckpt, configs, have_goldens, manifest, one_thread, rel  # noqa: F401

pytestmark = pytest.mark.skipif(not have_goldens(), reason="tests/golden/qwen3_tts/ not generated")

AUDIO_ABS = 1e-5
EMBED_REL = 1e-5
LIBROSA_MEL_SHA256 = "634664518adebcf0e280349d8e199250cb2e195d4216f2e7ab725a2d585f4e02"


# ---- codec decoder ----

def _decode_inputs(name):
    z = arrays(name)
    ref = z.get("ref_codes")
    return (z["codes"] if ref is None else np.concatenate([ref, z["codes"]])), (0 if ref is None else len(ref))


def test_decoded_audio_matches_the_reference_batched_with_padding():
    """Three rows of different lengths in one padded call (padding of arbitrary codes): each row's
    samples within AUDIO_ABS of the reference's wav (in-context rows: the reference's codes
    decoded first, cut where its part ends, as the package returns it)."""
    names = ["base_icl_long_stream", "cv_vivian_auto_en", "vd_instruct_english"]
    cfg, _, codec_cfg = configs("base")
    codec = load_codec(ckpt("base"), cfg, codec_cfg, torch.float32, torch.device("cpu"))
    rows = [_decode_inputs(n) for n in names]
    t = max(len(r[0]) for r in rows)
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.code_vocab, (len(rows), 16, t)))
    for i, (c, _) in enumerate(rows):
        codes[i, :, : len(c)] = torch.from_numpy(c.T)
    lengths = torch.tensor([len(c) for c, _ in rows])
    audio = codec.decode(codes, lengths).numpy()
    hop = codec.hop_length
    for i, (name, (c, ref)) in enumerate(zip(names, rows)):
        wav = audio[i, : len(c) * hop]
        cut = int(ref / max(len(c), 1) * len(wav))
        assert np.abs(wav[cut:] - arrays(name)["wav"]).max() < AUDIO_ABS
        assert not audio[i, len(c) * hop:].any()  # past a row's length: zeros
    # negative control: one frame's codes changed
    bad = codes.clone()
    bad[1, 3, 2] = (bad[1, 3, 2] + 1) % cfg.code_vocab
    wav = codec.decode(bad, lengths).numpy()[1, : len(rows[1][0]) * hop]
    assert np.abs(wav - arrays(names[1])["wav"]).max() > AUDIO_ABS


def test_chunked_decode_follows_the_reference_loop():
    """The reference decodes rows over 300 frames in chunks, each after 25 frames of context (no
    golden row is that long): the same loop at chunk 6, context 2 -> windows [0, 6), [4, 12) minus
    2 frames, [10, 14) minus 2; a shorter row padded in the batch equals it decoded alone."""
    cfg, _, codec_cfg = configs("base")
    dec = load_codec(ckpt("base"), cfg, codec_cfg, torch.float32, torch.device("cpu")).decoder
    hop = dec.cfg.total_upsample
    codes = torch.from_numpy(np.random.default_rng(1).integers(0, cfg.code_vocab, (2, 16, 14)))
    got = dec.decode(codes, chunk=6, left_context=2)
    with torch.inference_mode():
        windows = [dec(codes[..., 0:6]), dec(codes[..., 4:12])[:, 2 * hop:], dec(codes[..., 10:14])[:, 2 * hop:]]
        expect = torch.cat(windows, dim=-1)
        alone = dec.decode(codes[1:, :, :9], chunk=6, left_context=2)
    assert got.shape == (2, 14 * hop) and torch.equal(got, expect)
    assert (got[1, : 9 * hop] - alone[0]).abs().max() < AUDIO_ABS
    assert (dec.decode(codes, chunk=14)[0] - got[0]).abs().max() > AUDIO_ABS  # chunking changes samples


def test_row_codec_span_and_layout():
    cfg, _, codec_cfg = configs("voice_design")
    codec = load_codec(ckpt("voice_design"), cfg, codec_cfg, torch.float32, torch.device("cpu"))
    assert (codec.num_streams, codec.sample_rate, codec.hop_length) == (16, 24000, 1920)
    frames = np.arange(5 * 16).reshape(5, 16) % cfg.code_vocab
    eos = cfg.talker.codec_eos_token_id
    with_eos = np.concatenate([frames, np.full((2, 16), eos)])
    assert codec.span(with_eos) == (0, 5) and codec.span(frames) == (0, 5)
    out = np.zeros((16, 8), dtype=np.int64)
    codec.codes_into(out, with_eos, 0, 5)
    assert np.array_equal(out[:, :5], frames.T)


# ---- encoders: reference codes and the x-vector ----

def test_reference_codes_and_speaker_embedding_match_the_reference():
    import soundfile as sf

    audio, sr = sf.read(GOLDEN / manifest()["ref_audio"], dtype="float32")
    assert sr == 24000
    cfg, _, codec_cfg = configs("base")
    z = arrays("base_icl_long_stream")
    enc = load_encoder(ckpt("base"), codec_cfg, torch.device("cpu"))
    codes = enc.encode([audio])[0]
    assert codes.shape == z["ref_codes"].shape and np.array_equal(codes, z["ref_codes"])
    shifted = enc.encode([np.roll(audio, 480)])[0]  # control: the clip a fifth of a frame later
    assert not np.array_equal(shifted, z["ref_codes"])
    spk = load_speaker_encoder(ckpt("base"), cfg, torch.device("cpu"))
    assert rel(spk.embed(audio).numpy(), z["spk_embedding"]) < EMBED_REL
    with torch.no_grad():
        spk.fc.bias.add_(1e-3)  # control: a perturbed output bias
    assert rel(spk.embed(audio).numpy(), z["spk_embedding"]) > EMBED_REL


def test_mel_filterbank_is_librosas():
    """librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)'s bytes (librosa
    0.11; importing it here would cost seconds): the reference's mel basis."""
    import hashlib

    from omni_cli.runners.qwen3_tts.speaker import mel_filters

    got = mel_filters(24000, 1024, 128, 0.0, 12000.0)
    assert got.dtype == np.float32 and got.shape == (128, 513)
    assert hashlib.sha256(got.tobytes()).hexdigest() == LIBROSA_MEL_SHA256
