"""Greedy parity with transformers' HiggsAudioV2ForConditionalGeneration.generate.

Four prompts of different lengths go through `omni generate --temperature 0
--max-batch-size 2`, so two requests join mid-flight while others decode.
Each row's codes must equal the reference's (run alone, unpadded) frame for
frame; its logprobs must equal log_softmax of the reference's processed
scores; its audio must equal the reference codec's decode of the same codes.
The "eos" checkpoint runs a second time with every prefill sharing its rows'
common prompt prefix (the system turn; runners/engine.py), which a 2-row
prefill of these prompts is otherwise too small to do.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.audio_controls import change_one_frame
from tests.conftest import TINY, read_manifest, run_cli, write_config, write_jsonl

TEXTS = [
    "Hi.",
    "The sun rises in the east.",
    "A much longer sentence that goes on and on, to make this prompt longer than the others.",
    "Medium length prompt here!",
]
SCENES = [None, "Audio is recorded from a quiet room.", None, None]
MAX_FRAMES = 80


def _run_omni(tmp_path, ckpt):
    cfg = write_config(tmp_path / "model.yaml", ckpt, max_seq_len=256)
    rows = [{"id": f"r{i}", "text": t} | ({"scene": s} if s else {}) for i, (t, s) in enumerate(zip(TEXTS, SCENES))]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "--model", cfg, "--temperature", "0",
                  "--max-batch-size", "2", "--max-new-frames", str(MAX_FRAMES), "--quiet")
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def reference_runs(eos_ckpt):
    from tests.reference import Reference

    runs = {}
    for name, ckpt in (("eos", eos_ckpt), ("default", TINY)):
        ref = Reference(ckpt)
        runs[name] = (ref, [ref.generate_greedy(t, MAX_FRAMES, s) for t, s in zip(TEXTS, SCENES)])
    return runs


@pytest.mark.parametrize("which", ["eos", "default", "eos-unshared"])
def test_codes_logprobs_audio_match_reference(tmp_path, eos_ckpt, reference_runs, which, monkeypatch):
    """The rows share their system prompt's KV blocks (runners/kv_blocks.py); eos-unshared: with the
    prefix cache off, each row computes its whole prompt."""
    if which == "eos-unshared":
        from omni_cli.runners.kv_blocks import BlockPool

        monkeypatch.setattr(BlockPool, "prefix_hashes", lambda self, content: [])
        which = "eos"
    ckpt = eos_ckpt if which == "eos" else TINY
    out = _run_omni(tmp_path, ckpt)
    ref, results = reference_runs[which]
    manifest = read_manifest(out)
    assert [m["id"] for m in manifest] == [f"r{i}" for i in range(4)]
    for i, (codes_ref, scores_ref) in enumerate(results):
        z = np.load(out / "logprobs" / f"r{i}.npz")
        codes_ref = codes_ref.numpy()
        # codes: identical, frame for frame, BOS ramp and EOS staircase included
        np.testing.assert_array_equal(z["tokens"], codes_ref)
        # logprobs: of the sampled token under the reference's processed scores
        lp_ref = scores_ref.log_softmax(-1).gather(-1, torch.from_numpy(codes_ref)[:, :, None])[..., 0].numpy()
        np.testing.assert_allclose(z["logprobs"], lp_ref, atol=1e-5, rtol=0)
        assert z["mask"].dtype == bool
        np.testing.assert_array_equal(z["mask"], (codes_ref != 1024) & (codes_ref != 1025))
        # audio: the reference codec's decode of the same codes. The file is
        # 16-bit PCM, so the stated bound is one quantisation step (1/32767 of full scale)
        wav, sr = sf.read(out / manifest[i]["file_name"], dtype="float32")
        wav_ref = ref.decode(torch.from_numpy(codes_ref)).numpy()
        assert sr == 24000
        assert wav.shape == wav_ref.shape
        assert np.abs(wav_ref).max() > 100 / 32767  # enough signal for the bound to mean something
        np.testing.assert_allclose(wav, np.clip(wav_ref, -1, 1), atol=1 / 32767, rtol=0)
        # control: the reference's decode of these codes with one codec frame changed fails that bound
        wav_other = ref.decode(torch.from_numpy(change_one_frame(codes_ref))).numpy()
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(wav, np.clip(wav_other, -1, 1), atol=1 / 32767, rtol=0)
        # duration: reverted frames x 960 / 24000; the reverted count is the
        # frames strictly between the BOS frame and the all-EOS frame, minus 7
        stopped = bool((codes_ref == 1025).all(axis=1).any())
        inner = len(codes_ref) - 1 - (1 if stopped else 0)
        assert manifest[i]["duration_s"] == pytest.approx((inner - 7) * 960 / 24000)
        assert manifest[i]["finish_reason"] == ("stop" if stopped else "length")
        assert manifest[i]["frames"] == len(codes_ref)
    if which == "eos":
        # the pushed checkpoint stops rows at different frames, one runs to the limit
        reasons = [m["finish_reason"] for m in manifest]
        assert reasons.count("stop") >= 2 and "length" in reasons
        assert len({m["frames"] for m in manifest}) == 4


def test_prompt_ids_equal_processor(reference_runs):
    """Our prompt ids equal HiggsAudioV2Processor.apply_chat_template's for the same conversation."""
    from omni_cli.runners.higgs_audio_v2.prompt import PromptBuilder

    ref, _ = reference_runs["default"]
    builder = PromptBuilder(TINY / "model", ref.model.config.audio_bos_token_id)
    cases = [
        ("Hello world.", None, "Generate audio following instruction."),
        ("Ünïcödé — and emoji 🎉, tabs\tand\nnewlines.", "A noisy café.", "Speak slowly."),
        ("  padded text  ", "  padded scene ", "  padded system "),
    ]
    for text, scene, system in cases:
        ids_ref = ref.inputs(text, scene, system)["input_ids"][0].tolist()
        assert builder.build(text, system, scene) == ids_ref
