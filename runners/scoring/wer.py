"""Word and character error rates of a transcript against the row's text: no model.

Both sides go through Whisper's text normaliser first (transformers ships OpenAI's):
- English (the row's language is English, or unknown and the text is plain ASCII):
  `EnglishTextNormalizer` (lower case, punctuation out, contractions and spelled numbers
  standardised, British spellings to American from the checkpoint's `normalizer.json` where
  its folder has one, else none);
- every other language: `BasicTextNormalizer` (lower case, bracketed words, symbols and
  punctuation out, whitespace collapsed; diacritics kept).
Then jiwer: WER over space-separated words, CER over characters for Chinese (and Cantonese),
Japanese and Korean, and for Thai, Lao, Burmese and Khmer, which do not space their words
either (the normalised text's whitespace removed first: Whisper spaces such text at will).
A row of unknown language is CER where most of its characters are east Asian wide.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

# languages scored per character (Whisper codes; Cantonese is yue): no spaces between words
CER_LANGUAGES = frozenset({"zh", "yue", "ja", "ko", "th", "lo", "my", "km"})


def language_code(language: str | None) -> str | None:
    """A row's language as a Whisper code ('en', 'zh'), or None (unknown / auto).

    Accepts codes with a region ('zh-CN', 'en_us') and names ('english', 'Chinese',
    Qwen3-TTS's values); a name Whisper does not know gives None."""
    if language is None:
        return None
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    lang = language.strip().lower().replace("_", "-")
    if lang in ("", "auto"):
        return None
    if lang in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[lang]
    base = lang.split("-")[0]
    return base if base in LANGUAGES else None


def mostly_wide(text: str) -> bool:
    """True where most non-space characters are east Asian wide or full width (CJK)."""
    chars = [c for c in text if not c.isspace()]
    wide = sum(unicodedata.east_asian_width(c) in "WF" for c in chars)
    return bool(chars) and wide * 2 > len(chars)


@dataclass(frozen=True)
class ErrorRate:
    metric: str  # "wer" | "cer"
    value: float | None  # None: see reason
    normalizer: str  # "english" | "basic"
    reference: str  # the row's text, normalised
    hypothesis: str  # the transcript, normalised
    reason: str = ""


class TextScoring:
    """Normalisers built once (the English one compiles many patterns)."""

    def __init__(self, spelling: dict[str, str] | None = None):
        from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

        self.english = EnglishTextNormalizer(dict(spelling or {}))
        self.basic = BasicTextNormalizer()

    def plan(self, text: str, language: str | None) -> tuple[str, str]:
        """(metric, normaliser) for a row: see the module's doc."""
        code = language_code(language)
        if code in CER_LANGUAGES or (code is None and mostly_wide(text)):
            return "cer", "basic"
        if code == "en" or (code is None and text.isascii()):
            return "wer", "english"
        return "wer", "basic"

    def error_rate(self, text: str, transcript: str, language: str | None) -> ErrorRate:
        import jiwer

        metric, norm = self.plan(text, language)
        normalise = self.english if norm == "english" else self.basic
        ref, hyp = normalise(text).strip(), normalise(transcript).strip()
        if metric == "cer":
            ref, hyp = "".join(ref.split()), "".join(hyp.split())
        if not ref:
            return ErrorRate(metric, None, norm, ref, hyp, "the row's text is empty after normalisation")
        value = jiwer.cer(ref, hyp) if metric == "cer" else jiwer.wer(ref, hyp)
        return ErrorRate(metric, float(value), norm, ref, hyp)
