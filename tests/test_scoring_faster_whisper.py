"""The asr scorer's faster-whisper backend (runners/scoring/faster_whisper.py) on a tiny random Whisper
converted by CTranslate2's own converter: it transcribes what faster-whisper's `WhisperModel.transcribe`
gives for each clip alone at the settings the module states, the scorer picks it for a CTranslate2
folder, and a folder it cannot load is refused before anything loads, naming what is missing."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.conftest import run_cli, write_jsonl
from tests.scoring_checkpoints import tone, whisper

faster_whisper = pytest.importorskip("faster_whisper")
ctranslate2 = pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def ct2(tmp_path_factory):
    """The tiny Whisper (tests/scoring_checkpoints.py) converted, with its tokenizer.json and its feature
    extractor's preprocessor_config.json (a hub Whisper's file; transformers 5 saves processor_config.json)."""
    from transformers import WhisperFeatureExtractor

    hf = whisper(tmp_path_factory.mktemp("whisper"), positions=448)
    out = tmp_path_factory.mktemp("ct2") / "model"
    ctranslate2.converters.TransformersConverter(str(hf), copy_files=["tokenizer.json"]).convert(str(out))
    WhisperFeatureExtractor.from_pretrained(hf).to_json_file(out / "preprocessor_config.json")
    return out


CLIPS = [tone(1.0, 220.0, seed=1), tone(2.5, 440.0, seed=2), tone(0.6, 330.0, seed=3)]


def test_transcripts_are_faster_whispers_own_for_each_clip(ct2):
    from omni_cli.runners.scoring.asr import AsrScorer
    from omni_cli.runners.scoring.faster_whisper import FasterWhisperASR

    scorer = AsrScorer(ct2, num_beams=1, max_new_tokens=20)
    assert isinstance(scorer.backend, FasterWhisperASR)
    got = scorer.backend.transcribe(CLIPS, ["English", None, "fr"])
    model = faster_whisper.WhisperModel(str(ct2), device="cpu", compute_type="float32")
    for clip, lang, text in zip(CLIPS, ["en", None, "fr"], got):
        segments, _ = model.transcribe(clip, language=lang, task="transcribe", beam_size=1, temperature=0.0,
                                       without_timestamps=True, vad_filter=False, max_new_tokens=20)
        assert text == "".join(s.text for s in segments).strip()
    assert any(got), "every transcript empty: the comparison shows nothing"


def test_generate_scores_rows_with_a_ctranslate2_model(ct2, tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "hello there"}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--score", "asr", "--reject", "none",
                  "--asr-model", str(ct2), "--max-new-frames", "12", "-q")
    assert res.exit_code == 0, res.output
    from tests.conftest import read_manifest

    (row,) = read_manifest(tmp_path / "out")
    assert isinstance(row["transcript"], str) and row["scores"]["wer"] is not None


def test_a_conversion_without_its_tokenizer_is_refused_before_loading(ct2, tmp_path, monkeypatch):
    from omni_cli.quality import job

    broken = tmp_path / "ct2"
    shutil.copytree(ct2, broken)
    (broken / "tokenizer.json").unlink()
    monkeypatch.setattr(job, "FACTORIES", {})  # building any scorer would fail the test
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "hello"}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--score", "asr", "--asr-model", str(broken), "-q")
    assert res.exit_code == 2 and "tokenizer.json" in res.output and "--asr-model" in res.output
    assert not (tmp_path / "out").exists()
