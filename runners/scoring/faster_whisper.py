"""ASR through faster-whisper (CTranslate2), the second backend of the asr scorer.

Taken where `--asr-model` is a CTranslate2 conversion of Whisper (a folder holding `model.bin`,
as `ct2-transformers-converter` writes it, with the checkpoint's `tokenizer.json` and
`preprocessor_config.json` copied in) and the `faster-whisper` package is installed. Each clip runs
alone through `WhisperModel.transcribe`, with the row's language where the model knows it (else it
detects one), `beam_size` the scorer's beams, and faster-whisper's other defaults but two, pinned for
a dataset's decisions:
- one temperature, 0: faster-whisper's fallback to sampling at higher temperatures draws from an
  unseeded generator, so a rerun could keep another attempt;
- no timestamps and no voice-activity filter: the whole clip is transcribed, as the transformers
  backend does (runners/scoring/asr.py).
The transcript is the segments' text joined. Where faster-whisper is not installed, the run stops
before loading with the command to install it (omni_cli/quality/settings.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import model_dtype, torch_device
from .wer import language_code

INSTALL = "pip install faster-whisper"
FILES = ("model.bin", "config.json", "tokenizer.json", "preprocessor_config.json")


def is_ctranslate2_folder(model: str | Path | None) -> bool:
    """A local folder holding a CTranslate2 model (its `model.bin`): the faster-whisper backend's."""
    return model is not None and (Path(model) / "model.bin").is_file()


def problems(model: str | Path) -> list[str]:
    """What keeps this CTranslate2 folder from loading, in words (empty: nothing): before any model loads."""
    out = [f"needs the faster-whisper package ({INSTALL})"] if importlib.util.find_spec("faster_whisper") is None else []
    # NOTE: without tokenizer.json faster-whisper fetches openai/whisper-tiny's from the hub: another vocabulary
    missing = [f for f in FILES if not (Path(model) / f).is_file()]
    if missing:
        out.append(f"lacks {', '.join(missing)} (ct2-transformers-converter --copy_files tokenizer.json "
                   "preprocessor_config.json)")
    return out


class FasterWhisperASR:
    """The asr scorer's backend over faster-whisper; see the module's doc."""

    sampling_rate = 16000

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str | None = None, num_beams: int | None = None,
                 max_new_tokens: int | None = None):
        from faster_whisper import WhisperModel

        dev = torch_device(device)
        compute = str(model_dtype(dev, dtype)).removeprefix("torch.")  # the transformers backend's dtype rule
        self.model = WhisperModel(str(model), device=dev.type, device_index=dev.index or 0, compute_type=compute)
        self.num_beams = int(num_beams) if num_beams is not None else 5  # faster-whisper's and the pipeline's
        self.max_new_tokens = max_new_tokens
        self.spelling = {}  # no normalizer.json beside a conversion: British spellings count as errors

    def language(self, language: str | None) -> str | None:
        """The Whisper code the model is told for a row's language; None: it detects one."""
        code = language_code(language)
        return code if code is not None and code in self.model.supported_languages else None

    def transcribe(self, clips_16k: Sequence[np.ndarray], languages: Sequence[str | None]) -> list[str]:
        """clips [samples] float32 at 16 kHz, each row's language (or None) -> transcripts, in order."""
        out = []
        for clip, lang in zip(clips_16k, languages):
            segments, _ = self.model.transcribe(np.ascontiguousarray(clip, dtype=np.float32), language=self.language(lang),
                                                task="transcribe", beam_size=self.num_beams, temperature=0.0,
                                                without_timestamps=True, vad_filter=False,
                                                max_new_tokens=self.max_new_tokens)
            out.append("".join(s.text for s in segments).strip())
        return out

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
