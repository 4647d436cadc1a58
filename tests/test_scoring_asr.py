"""ASR round trip: our batched Whisper against transformers' own pipeline on each clip alone, and
WER/CER against jiwer on planted edits (runners/scoring/asr.py, wer.py)."""

from __future__ import annotations

import jiwer
import numpy as np
import pytest

from omni_cli.runners.scoring import ScoreInput
from omni_cli.runners.scoring.asr import AsrScorer, WhisperASR
from omni_cli.runners.scoring.base import to_rate
from omni_cli.runners.scoring.wer import TextScoring, language_code
from tests.scoring_checkpoints import one_thread, tone, whisper  # noqa: F401 (one_thread: autouse)

CLIPS = [tone(s, f, seed=i) for i, (s, f) in enumerate([(2.0, 220), (3.0, 500), (1.0, 150), (4.5, 800), (2.5, 330)])]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def pipe(ckpt):
    from transformers import pipeline

    return pipeline("automatic-speech-recognition", model=str(ckpt), device="cpu")


@pytest.fixture(scope="module")
def asr(ckpt):
    return WhisperASR(ckpt, batch_size=16)


@pytest.mark.parametrize("language", [None, "en", "english", "de"])
def test_batched_transcripts_are_the_pipelines_for_each_clip_alone(pipe, asr, language):
    kwargs = {"generate_kwargs": {"language": language_code(language)}} if language else {}
    expected = [pipe(clip.copy(), **kwargs)["text"] for clip in CLIPS]
    assert len(set(expected)) == len(CLIPS), "the clips must transcribe differently, or the check is weak"
    assert all(expected), expected
    assert asr.transcribe(CLIPS, [language] * len(CLIPS)) == expected


def test_batch_features_are_the_extractors_for_each_clip_alone(asr):
    """Our batched log-mel (the device path) against transformers' WhisperFeatureExtractor on each clip
    alone: features within float32 rounding, attention masks equal; a 30 s clip and an empty one too."""
    clips = CLIPS + [tone(30.0, 260, seed=9), np.zeros(0, np.float32)]
    got = asr.batch_features(clips)
    for i, clip in enumerate(clips):
        theirs = asr.processor.feature_extractor(clip, sampling_rate=16000, return_tensors="pt",
                                                  return_attention_mask=True)
        np.testing.assert_allclose(got["input_features"][i].numpy(), theirs["input_features"][0].numpy(),
                                   rtol=0, atol=1e-5)
        assert np.array_equal(got["attention_mask"][i].numpy(), theirs["attention_mask"][0].numpy())


def test_batch_size_order_and_languages_change_no_transcript(asr):
    langs = [None, "en", "de", None, "en"]
    whole = asr.transcribe(CLIPS, langs)
    asr.batch_size = 2
    try:
        pairs = asr.transcribe(CLIPS, langs)
        order = [3, 0, 4, 2, 1]
        shuffled = asr.transcribe([CLIPS[i] for i in order], [langs[i] for i in order])
    finally:
        asr.batch_size = 16
    alone = [asr.transcribe([c], [lang])[0] for c, lang in zip(CLIPS, langs)]
    assert whole == pairs == alone
    assert [shuffled[order.index(i)] for i in range(len(CLIPS))] == whole


def test_a_language_the_model_does_not_know_is_detected(asr):
    assert asr.language("english") == "en" and asr.language("zh-CN") == "zh" and asr.language("Chinese") == "zh"
    assert asr.language("sw") is None and asr.language("auto") is None and asr.language("klingon") is None
    assert asr.transcribe(CLIPS[:2], ["sw", "sw"]) == asr.transcribe(CLIPS[:2], [None, None])


def test_long_clip_runs_long_form_as_the_pipeline_does(tmp_path):
    from transformers import pipeline

    ckpt = whisper(tmp_path / "w", text_only=False)  # long-form decoding predicts timestamps
    clip = tone(35.0, 260)
    expected = pipeline("automatic-speech-recognition", model=str(ckpt), device="cpu")(clip.copy())["text"]
    got = WhisperASR(ckpt).transcribe([clip], [None])
    assert got == [expected] and expected


def test_scorer_resamples_and_scores_against_the_pipeline(ckpt, pipe):
    scorer = AsrScorer(ckpt)
    clip_24k = to_rate(CLIPS[1], 16000, 24000)
    expected = pipe(to_rate(clip_24k, 24000, 16000), generate_kwargs={"language": "en"})["text"]
    row = ScoreInput(audio=clip_24k, sample_rate=24000, text="hello there", language="en")
    silent = ScoreInput(audio=np.zeros(0, np.float32), sample_rate=24000, text="x")
    got, empty = scorer.score([row, silent])
    assert got.text["transcript"] == expected
    norm = scorer.text.english
    assert got["wer"] == jiwer.wer(norm("hello there").strip(), norm(expected).strip())
    assert got["cer"] is None and "WER scores this row" in got.reasons["cer"]
    assert empty == {"wer": None, "cer": None} and empty.reasons["wer"] == "no audio"


class FakeASR:
    """Returns the row's own text with planted edits, by the clip's length (samples at 16 kHz)."""

    sampling_rate = 16000

    def __init__(self, answers: dict[int, str]):
        self.answers = answers

    def transcribe(self, clips, languages):
        return [self.answers[len(c)] for c in clips]


REF = "The quick brown fox jumps over the lazy dog."
PLANTED = [  # transcript, planted word errors (substitutions + deletions + insertions) of REF's 9 words
    ("the quick brown fox jumps over the lazy dog", 0),  # negative control: case and punctuation only
    ("The quick brown cat jumps over the lazy dog.", 1),
    ("The quick fox jumps over the dog.", 2),
    ("The very quick brown fox jumps over over the lazy dog.", 2),
    ("A quick brown fox jumped over a lazy dog", 3),
    ("", 9),
]


def test_wer_follows_jiwer_on_planted_edits():
    rows = [ScoreInput(audio=np.zeros(1000 + i, np.float32), sample_rate=16000, text=REF, language="en")
            for i in range(len(PLANTED))]
    scorer = AsrScorer(backend=FakeASR({1000 + i: hyp for i, (hyp, _) in enumerate(PLANTED)}))
    norm = scorer.text.english
    for scores, (hyp, errors) in zip(scorer.score(rows), PLANTED):
        assert scores["wer"] == pytest.approx(errors / 9, abs=1e-12)
        assert scores["wer"] == jiwer.wer(norm(REF).strip(), norm(hyp).strip())
        assert scores.text["transcript"] == hyp and scores["cer"] is None


def test_cer_for_chinese_japanese_korean_and_the_normalisers():
    text = TextScoring()
    zh = "今天天气很好，我们去公园散步。"
    got = text.error_rate(zh, "今天天气很好 我们去公园散步", "zh")  # punctuation and Whisper's spaces: no error
    assert (got.metric, got.value, got.normalizer) == ("cer", 0.0, "basic")
    got = text.error_rate(zh, "今天天气不好，我们去公园。", "Chinese")  # one substitution, two deletions of 13
    assert got.value == pytest.approx(3 / 13) and got.value == jiwer.cer(got.reference, got.hypothesis)
    assert text.error_rate("東京に行きます", "東京に行きます", None).metric == "cer"  # unknown language, CJK text
    assert text.error_rate("안녕하세요 여러분", "안녕하세요", "ko").metric == "cer"
    de = text.error_rate("Schöne Grüße aus München!", "schöne grüße aus münchen", "de")
    assert (de.metric, de.value, de.normalizer) == ("wer", 0.0, "basic")  # diacritics kept
    en = text.error_rate("It's 5 o'clock, Mr. Smith.", "it is five o'clock mister smith", None)
    assert (en.metric, en.normalizer, en.value) == ("wer", "english", 0.0)  # plain ASCII: English normaliser
    assert text.error_rate("[music] (laughs)", "hello", "en").value is None  # nothing left to score


def test_fewer_beams_give_the_pipelines_transcripts_with_as_many(ckpt, pipe, tmp_path):
    """quality.asr_beams (1: greedy, faster) reaches Whisper: each transcript is the pipeline's with that many."""
    from types import SimpleNamespace

    from omni_cli.errors import ConfigError
    from omni_cli.quality import job
    from omni_cli.quality.settings import quality_settings

    expected = [pipe(clip.copy(), generate_kwargs={"num_beams": 1})["text"] for clip in CLIPS]
    yaml = tmp_path / "m.yaml"
    settings = quality_settings({"score": "asr", "asr_beams": 1, "asr_model": str(ckpt)}, yaml, SimpleNamespace())
    scorer = job.FACTORIES["asr"](settings, "cpu")
    assert scorer.backend.transcribe(CLIPS, [None] * len(CLIPS)) == expected
    with pytest.raises(ConfigError, match="quality.asr_beams"):
        quality_settings({"score": "asr", "asr_beams": 0}, yaml, SimpleNamespace())
