"""Greedy Whisper with a static cache (runners/scoring/whisper_greedy.py) against transformers'
`generate(num_beams=1)`, token for token: given and detected languages, rows ending at different
steps, the length limit, and batch-mates changing nothing."""

from __future__ import annotations

import pytest
import torch

from omni_cli.runners.scoring.asr import WhisperASR
from omni_cli.runners.scoring.whisper_greedy import GreedyWhisper
from tests.scoring_checkpoints import one_thread, tone, whisper  # noqa: F401 (one_thread: autouse)

CLIPS = [tone(s, f, seed=i) for i, (s, f) in enumerate([(2.0, 220), (3.0, 500), (1.0, 150), (4.5, 800), (2.5, 330),
                                                        (1.5, 1200)])]
LANGUAGES = [None, "en", "de"]


@pytest.fixture(scope="module")
def asr(tmp_path_factory):
    """Two layers: each layer's cache and cross-attention (tests/test_scoring_asr.py runs one layer greedily)."""
    asr = WhisperASR(whisper(tmp_path_factory.mktemp("whisper2"), seed=3, layers=2), num_beams=1)
    _push_eos(asr)
    return asr


def _push_eos(asr: WhisperASR) -> None:
    """A random Whisper never ends: its EOS row of the (tied) output projection is moved toward the
    decoder's mean state, as far as makes the clips end at different steps, some not at all."""
    feats = _features(asr)
    w = asr.model.proj_out.weight
    eos = asr.greedy.eos
    with torch.inference_mode():
        enc = asr.model.model.encoder(feats).last_hidden_state
        first = [asr.greedy.sot, asr.lang_to_id["<|en|>"], asr.greedy.task_id, asr.greedy.no_ts]
        prompt = torch.tensor([first] * len(CLIPS))
        state = asr.model.model.decoder(input_ids=prompt, encoder_hidden_states=enc).last_hidden_state.mean((0, 1))
        base = w[eos].clone()
        # searched with the batched decode (fast); the tests hold generate's own tokens to _mixed
        langs = [None if lang is None else torch.full((len(CLIPS),), asr.lang_to_id[f"<|{lang}|>"])
                 for lang in LANGUAGES]
        for push in torch.linspace(0.5, 2.0, 31).tolist():
            w[eos] = base + push * state / state.norm()
            if all(_mixed(asr, asr.greedy.decode(enc, lang)) for lang in langs):
                return
    raise AssertionError("no push of the EOS row made the clips end at different steps")


def _features(asr: WhisperASR) -> torch.Tensor:
    return torch.cat([asr._features(c, False)["input_features"] for c in CLIPS])


def _theirs(asr: WhisperASR, feats: torch.Tensor, language: str | None, **kwargs) -> list[list[int]]:
    """generate's tokens after its prompt and before EOS, each clip alone."""
    out = []
    for i in range(len(feats)):
        with torch.inference_mode():
            seq = asr.model.generate(input_features=feats[i:i + 1], num_beams=1, **kwargs,
                                     **({"language": language} if language else {}))
        seq = (seq["sequences"] if isinstance(seq, dict) else seq)[0].tolist()
        body = seq[seq.index(asr.greedy.no_ts) + 1:] if asr.greedy.no_ts in seq else seq  # the prompt, where returned
        eos = asr.greedy.eos
        out.append(body[: body.index(eos)] if eos in body else body)
    return out


def _mixed(asr: WhisperASR, tokens: list[list[int]]) -> bool:
    """Rows that end at different steps: some stop, some run to the limit."""
    lengths = [len(t) for t in tokens]
    return len(set(lengths)) > 1 and max(lengths) == asr.greedy.new_tokens(4) > min(lengths)


@pytest.mark.parametrize("language", LANGUAGES)
def test_tokens_are_generates_in_one_batch(asr, language):
    feats = _features(asr)
    expected = _theirs(asr, feats, language)
    assert _mixed(asr, expected), f"the rows must end at different steps, or the check is weak: {expected}"
    with torch.inference_mode():
        enc = asr.model.model.encoder(feats).last_hidden_state
    lang = None if language is None else torch.full((len(CLIPS),), asr.lang_to_id[f"<|{language}|>"])
    assert asr.greedy.decode(enc, lang) == expected
    assert [asr.greedy.decode(enc[i:i + 1], None if lang is None else lang[i:i + 1])[0]
            for i in range(len(CLIPS))] == expected


def test_detected_languages_are_detect_languages(asr):
    feats = _features(asr)
    with torch.inference_mode():
        theirs = asr.model.detect_language(input_features=feats).tolist()
        enc = asr.model.model.encoder(feats).last_hidden_state
    assert asr.greedy.detect(enc).tolist() == theirs and set(theirs) <= set(asr.lang_to_id.values())


def test_a_token_limit_is_generates(asr):
    feats = _features(asr)[:3]
    expected = _theirs(asr, feats, "en", max_new_tokens=5)
    limited = GreedyWhisper(asr.model, max_new_tokens=5)
    with torch.inference_mode():
        enc = asr.model.model.encoder(feats).last_hidden_state
    got = limited.decode(enc, torch.full((3,), asr.lang_to_id["<|en|>"]))
    assert got == expected and max(len(t) for t in got) == 5


def test_transcribe_takes_the_greedy_path_only_with_one_beam(asr, tmp_path):
    assert asr.greedy is not None
    five = WhisperASR(whisper(tmp_path / "w"), num_beams=5)
    assert five.greedy is None
