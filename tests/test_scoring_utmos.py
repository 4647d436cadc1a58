"""UTMOS (runners/scoring/utmos.py) against utmos-pytorch, the reference it loads weights for: a small
random UTMOS22 strong learner built by the reference's own modules (2 encoder layers instead of 12, every
other width the release's), saved as its state dict, scored clip by clip by both; the scorer in
`omni generate` and its refusals."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch

from omni_cli.runners.scoring.base import ScoreInput, to_rate
from tests.conftest import read_manifest, run_cli, write_jsonl

ut = pytest.importorskip("utmos_pytorch.utmos_torch")


@contextlib.contextmanager
def small_encoder():
    """The reference's modules with 2 encoder layers of FFN width 256 (its class builds the release's 12)."""
    from utmos_pytorch.wav2vec2 import Wav2Vec2Config

    real = ut.Wav2Vec2Config
    ut.Wav2Vec2Config = lambda: Wav2Vec2Config(encoder_layers=2, encoder_ffn_embed_dim=256)
    try:
        yield
    finally:
        ut.Wav2Vec2Config = real


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A folder with utmos_state_dict.pt of a random small model; its weights drawn at each layer's fan-in
    scale, so every part moves the score."""
    with small_encoder():
        torch.manual_seed(0)
        model = ut.UTMOSModel()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight_g"):
                continue  # the pos-conv's weight-norm gains keep their init (the norms of weight_v)
            fan_in = p[0].numel() if p.dim() > 1 else 1
            p.normal_(0, fan_in ** -0.5 if p.dim() > 1 else 0.1)
    folder = tmp_path_factory.mktemp("utmos")
    torch.save(model.state_dict(), folder / "utmos_state_dict.pt")
    return folder


def clips(rate: int = 16000):
    g = np.random.default_rng(3)
    t = np.arange(int(3.2 * rate)) / rate
    tone = (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    return [(0.1 * g.standard_normal(rate)).astype(np.float32), tone[: int(1.7 * rate)], tone]


def test_scores_equal_the_reference_clip_by_clip(weights):
    from omni_cli.runners.scoring.utmos import UtmosScorer

    with small_encoder():
        reference = ut.UTMOSScoreTorch(ckpt_path=str(weights / "utmos_state_dict.pt"))
    ours = UtmosScorer(weights)
    got = [ours.predict(c) for c in clips()]
    want = [float(reference.score(torch.from_numpy(c)[None])[0]) for c in clips()]
    assert np.allclose(got, want, atol=1e-5, rtol=0), (got, want)
    assert max(want) - min(want) > 1e-3  # control: the clips score apart (100 x the bound), not a constant


def test_rows_are_scored_at_16khz_alone_and_short_clips_get_a_reason(weights):
    from omni_cli.runners.scoring.utmos import MIN_SAMPLES, UtmosScorer

    ours = UtmosScorer(weights)
    rows = [ScoreInput(audio=c, sample_rate=24000, text="x") for c in clips(24000)]
    rows.append(ScoreInput(audio=np.zeros(MIN_SAMPLES - 1, np.float32), sample_rate=16000, text="x", id="short"))
    scored = ours.score(rows)
    for row, s in zip(rows[:3], scored):
        assert s["utmos"] == ours.predict(to_rate(row.audio, 24000, 16000))  # one row's score whatever the batch
    assert scored[3]["utmos"] is None and "shorter than 400 samples" in scored[3].reasons["utmos"]
    assert [s["utmos"] for s in ours.score(rows[1:3])] == [s["utmos"] for s in scored[1:3]]


def test_generate_scores_every_row_with_utmos(tmp_path, weights):
    from omni_cli.runners.scoring.utmos import UtmosScorer

    rows = [{"id": f"u{i}", "text": f"row number {i} to score", "max_new_frames": 12} for i in range(3)]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "-q", "--seed", "3",
                  "--score", "utmos", "--utmos-model", weights, "--reject", "none")
    assert res.exit_code == 0, res.output
    ours = UtmosScorer(weights)
    for m in read_manifest(out):
        import soundfile as sf

        pcm, rate = sf.read(out / m["file_name"], dtype="float32")
        assert m["status"] == "ok" and math.isfinite(m["scores"]["utmos"])
        # the stage scored the row's float samples; the file holds them as 16-bit PCM
        assert abs(m["scores"]["utmos"] - ours.predict(to_rate(pcm, rate, 16000))) < 1e-2
    record = json.loads((out / "run.json").read_text())["quality"]
    assert record["scorers"] == ["utmos"] and record["utmos_model"] == str(weights.resolve())


def test_utmos_without_its_weights_stops_before_loading(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "hello"}])
    res = run_cli("generate", prompts, "-o", tmp_path / "o", "--score", "utmos")
    assert res.exit_code == 2 and "--utmos-model" in res.output and "utmos_state_dict.pt" in res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_cli("generate", prompts, "-o", tmp_path / "o2", "--score", "utmos", "--utmos-model", empty)
    assert res.exit_code != 0 and "--utmos-model" in res.output and "holds no utmos_state_dict.pt" in res.output
