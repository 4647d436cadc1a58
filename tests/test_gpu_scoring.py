"""Scorers on CUDA (issue 46): Whisper batched on the GPU against transformers' pipeline on the
same GPU, WavLM embeddings against the CPU's, and `generate --score` on a CUDA run. Skipped
without CUDA (CI); run on the device machine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import TINY, read_manifest, run_cli, write_config, write_jsonl
from tests.scoring_checkpoints import tone, wavlm, whisper

pytestmark = pytest.mark.gpu

CLIPS = [tone(s, f, seed=i) for i, (s, f) in enumerate([(2.0, 220), (3.0, 500), (1.0, 150), (4.5, 800)])]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return whisper(tmp_path_factory.mktemp("whisper"))


@pytest.mark.parametrize("beams", [1, 5])
def test_cuda_fp32_transcripts_are_the_pipelines_on_cuda(ckpt, beams):
    from transformers import pipeline

    from omni_cli.runners.scoring.asr import WhisperASR

    pipe = pipeline("automatic-speech-recognition", model=str(ckpt), device="cuda", dtype=torch.float32)
    kwargs = {"generate_kwargs": {"language": "en", "num_beams": beams}}
    expected = [pipe(c.copy(), **kwargs)["text"] for c in CLIPS]
    assert len(set(expected)) == len(CLIPS), expected
    ours = WhisperASR(ckpt, device="cuda", dtype=torch.float32, batch_size=4, num_beams=beams)
    assert ours.transcribe(CLIPS, ["en"] * len(CLIPS)) == expected


def test_cuda_half_precision_transcribes_every_clip(ckpt):
    from omni_cli.runners.scoring.asr import WhisperASR

    ours = WhisperASR(ckpt, device="cuda", batch_size=4, num_beams=1)
    assert ours.dtype in (torch.float16, torch.bfloat16)
    got = ours.transcribe(CLIPS, ["en"] * len(CLIPS))
    assert len(got) == len(CLIPS) and all(isinstance(t, str) for t in got)


def test_cuda_speaker_embeddings_within_rounding_of_the_cpu(tmp_path):
    from omni_cli.runners.scoring.speaker import SpeakerScorer

    folder = wavlm(tmp_path / "wavlm")
    on_cpu = SpeakerScorer(folder, batch_size=4).embed(CLIPS)
    on_cuda = SpeakerScorer(folder, device="cuda", dtype=torch.float32, batch_size=4).embed(CLIPS)
    assert np.abs(on_cpu).max() > 0.1
    assert np.abs(on_cuda - on_cpu).max() < 1e-3


def test_generate_scores_every_row_on_cuda(tmp_path):
    cfg = write_config(tmp_path / "m.yaml", TINY, max_seq_len=256)
    cfg.write_text(cfg.read_text().replace("device: cpu", "device: cuda"))
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(["Hi there.", "A longer sentence to say.", "Yes."])]
    out = tmp_path / "out"
    res = run_cli("generate", write_jsonl(tmp_path / "p.jsonl", rows), "-o", out, "--model", cfg, "-q",
                  "--seed", "3", "--max-new-frames", "40", "--score", "mos,degenerate", "--reject", "none")
    assert res.exit_code == 0, res.output
    manifest = read_manifest(out)
    assert [m["status"] for m in manifest] == ["ok"] * len(rows)
    for m in manifest:
        assert m["scores"]["dnsmos_ovrl"] is not None and 1.0 <= m["scores"]["dnsmos_ovrl"] <= 5.0, m
        assert m["scores"]["silence_frac"] is not None, m
    quality = json.loads((out / "run.json").read_text())["quality"]
    assert quality["rows_scored"] == len(rows)
    assert quality["devices"]["mos"].startswith("cuda"), quality
