"""Speaker similarity: our batched x-vectors against WavLMForXVector on each clip alone
(runners/scoring/speaker.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_cli.runners.scoring import ScoreInput
from omni_cli.runners.scoring.base import to_rate
from omni_cli.runners.scoring.speaker import RATE, SpeakerScorer, cosine
from tests.scoring_checkpoints import one_thread, tone, wavlm  # noqa: F401 (one_thread: autouse)

CLIPS = [tone(s, f, seed=i) for i, (s, f) in enumerate([(1.0, 120), (2.3, 210), (0.7, 330), (1.6, 95)])]


def _alone(folder, clip: np.ndarray) -> np.ndarray:
    """transformers' own embedding of one clip, as its docs run it."""
    from transformers import AutoFeatureExtractor, WavLMForXVector

    fe = AutoFeatureExtractor.from_pretrained(folder)
    model = WavLMForXVector.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**fe(clip, sampling_rate=RATE, return_tensors="pt")).embeddings[0].numpy()


@pytest.fixture(scope="module", params=["layer", "group"])
def ckpt(request, tmp_path_factory):
    return wavlm(tmp_path_factory.mktemp(f"wavlm-{request.param}"), norm=request.param)


def test_batched_embeddings_equal_each_clip_alone(ckpt):
    expected = np.stack([_alone(ckpt, c) for c in CLIPS])
    assert np.abs(expected).max() > 0.1 and np.abs(expected[0] - expected[1]).max() > 0.01
    scorer = SpeakerScorer(ckpt, batch_size=16)
    whole = scorer.embed(CLIPS)  # one batch, padded to the longest (2.3 s)
    scorer.batch_size = 3
    split = scorer.embed(CLIPS[::-1])[::-1]  # other batch-mates, other padding
    for got in (whole, split):
        assert np.abs(got - expected).max() < 1e-5
    assert np.array_equal(scorer.embed(CLIPS[2:3])[0], scorer.embed(CLIPS[2:3])[0])


def test_transformers_own_batch_pooling_sees_padding(ckpt):
    """Why the scorer pools itself: WavLMForXVector on a padded batch averages frames that saw padding."""
    from transformers import AutoFeatureExtractor, WavLMForXVector

    fe = AutoFeatureExtractor.from_pretrained(ckpt)
    model = WavLMForXVector.from_pretrained(ckpt).eval()
    with torch.no_grad():
        batch = model(**fe(CLIPS[:2], sampling_rate=RATE, return_tensors="pt", padding=True)).embeddings.numpy()
    assert np.abs(batch[0] - _alone(ckpt, CLIPS[0])).max() > 1e-3  # the shorter, padded clip moves


def test_similarity_reference_cache_and_reasons(ckpt):
    scorer = SpeakerScorer(ckpt)
    ref = tone(2.0, 120, seed=9)
    ref_24k = to_rate(ref, RATE, 24000)
    rows = [ScoreInput(audio=to_rate(c, RATE, 24000), sample_rate=24000, text="x", reference=ref_24k,
                       reference_rate=24000) for c in CLIPS[:2]]
    rows.append(ScoreInput(audio=CLIPS[2], sample_rate=RATE, text="x"))  # no reference voice
    rows.append(ScoreInput(audio=CLIPS[3][:300], sample_rate=RATE, text="x", reference=ref, reference_rate=RATE))
    a, b, none, short = scorer.score(rows)
    want = [cosine(_alone(ckpt, to_rate(to_rate(c, RATE, 24000), 24000, RATE)),
                   _alone(ckpt, to_rate(ref_24k, 24000, RATE))) for c in CLIPS[:2]]
    assert abs(a["speaker_sim"] - want[0]) < 1e-5 and abs(b["speaker_sim"] - want[1]) < 1e-5
    assert a["speaker_sim"] != b["speaker_sim"] and -1 <= a["speaker_sim"] <= 1
    assert none == {"speaker_sim": None} and none.reasons["speaker_sim"] == "no reference voice"
    assert short["speaker_sim"] is None and "the clip is shorter than" in short.reasons["speaker_sim"]
    assert (scorer.cache.misses, scorer.cache.hits) == (1, 1)  # the shared reference embedded once
    again = scorer.score(rows[:1])[0]  # alone now: batched float rounding only
    assert abs(again["speaker_sim"] - a["speaker_sim"]) < 1e-6 and (scorer.cache.misses, scorer.cache.hits) == (1, 2)
    same = ScoreInput(audio=ref, sample_rate=RATE, text="x", reference=ref, reference_rate=RATE)
    assert scorer.score([same])[0]["speaker_sim"] == pytest.approx(1.0, abs=1e-6)
