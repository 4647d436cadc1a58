"""ASR round trip: Whisper transcribes each row; WER (or CER) against the row's text.

`WhisperASR` runs `WhisperForConditionalGeneration` from a hub id or folder, batched, and
decodes as transformers' `pipeline("automatic-speech-recognition")` does for one clip alone,
so a row's transcript is the pipeline's:
- audio resampled to 16 kHz (runners/resample.py), the feature extractor's log-mel of each
  clip (padded to Whisper's 30 s, as alone), computed for the batch on the device (`batch_features`);
- the pipeline's generation defaults: `num_beams` 5 unless the checkpoint's generation config
  sets it, `max_new_tokens` 256 unless it sets a length (both can be given);
- the row's language where the checkpoint knows it (rows batch by language), else Whisper
  detects it; the task is the checkpoint's (transcribe);
- with one beam, runners/scoring/whisper_greedy.py decodes as generate does, with a static cache
  (its step a CUDA graph on CUDA);
- text: the generated ids less special tokens and timestamps, decoded;
- a clip over 30 s runs alone through Whisper's sequential long-form decoding, as the
  pipeline runs it.
On CUDA the model runs in float16 (or bfloat16, `dtype`); on the CPU in float32. A CTranslate2
conversion of Whisper as `--asr-model` runs through faster-whisper instead (runners/scoring/faster_whisper.py).

Scores: `wer` or `cer` (runners/scoring/wer.py says which and how the text is normalised; the
other is None with the reason), and the transcript in `RowScores.text["transcript"]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .base import RowScores, ScoreInput, Scorer, chunks, model_dtype, to_rate, torch_device
from .wer import TextScoring, language_code
from .faster_whisper import FasterWhisperASR, is_ctranslate2_folder
from .whisper_greedy import GreedyWhisper

PIPELINE_NUM_BEAMS = 5  # transformers' ASR pipeline default ("follows openai's whisper implementation")
PIPELINE_MAX_NEW_TOKENS = 256  # its default where the checkpoint sets no length


class WhisperASR:
    """Batched Whisper transcription; see the module's doc."""

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str | torch.dtype | None = None,
                 batch_size: int = 16, num_beams: int | None = None, max_new_tokens: int | None = None):
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self.device = torch_device(device)
        self.dtype = model_dtype(self.device, dtype)
        self.batch_size = int(batch_size)
        self.processor = WhisperProcessor.from_pretrained(str(model))
        self.model = WhisperForConditionalGeneration.from_pretrained(str(model), dtype=self.dtype)
        self.model.to(self.device).eval()
        gc = self.model.generation_config
        set_params = gc.to_diff_dict()  # what the checkpoint sets: the pipeline adds defaults only past it
        self.generate_kwargs: dict = {"num_beams": int(num_beams) if num_beams is not None
                                      else (gc.num_beams if "num_beams" in set_params else PIPELINE_NUM_BEAMS)}
        if max_new_tokens is not None:
            self.generate_kwargs["max_new_tokens"] = int(max_new_tokens)
        elif "max_new_tokens" not in set_params and "max_length" not in set_params:
            self.generate_kwargs["max_new_tokens"] = PIPELINE_MAX_NEW_TOKENS
        self.lang_to_id = dict(getattr(gc, "lang_to_id", None) or {}) if getattr(gc, "is_multilingual", False) else {}
        fe = self.processor.feature_extractor
        self.sampling_rate, self.max_samples = int(fe.sampling_rate), int(fe.n_samples)
        # batch_features' constants, on the device once
        self._hann_dev = torch.hann_window(fe.n_fft, device=self.device)
        self._mel_filters_dev = torch.from_numpy(fe.mel_filters).to(self.device, torch.float32).T  # [mels, freq]
        tok = self.processor.tokenizer
        # ids that are never text: special tokens and timestamps (every id past <|notimestamps|>)
        self._not_text = set(tok.all_special_ids)
        self._first_timestamp = (gc.no_timestamps_token_id + 1) if getattr(gc, "no_timestamps_token_id", None) \
            is not None else None
        self.spelling = getattr(tok, "english_spelling_normalizer", None) or {}
        # greedy decoding without generate's per-token host work (runners/scoring/whisper_greedy.py)
        self.greedy = GreedyWhisper(self.model, self.generate_kwargs.get("max_new_tokens")) \
            if self.generate_kwargs["num_beams"] == 1 and GreedyWhisper.eligible(self.model) else None

    def language(self, language: str | None) -> str | None:
        """The Whisper code the model is told for a row's language; None: it detects one."""
        code = language_code(language)
        return code if code is not None and f"<|{code}|>" in self.lang_to_id else None

    def _text(self, ids) -> str:
        keep = [int(t) for t in ids if int(t) not in self._not_text
                and (self._first_timestamp is None or int(t) < self._first_timestamp)]
        return self.processor.tokenizer.decode(keep)

    def _features(self, clip_host: np.ndarray, long_form: bool):
        fe = self.processor.feature_extractor
        extra = {"truncation": False, "padding": "longest"} if long_form else {}
        return fe(clip_host, sampling_rate=self.sampling_rate, return_tensors="pt", return_attention_mask=True,
                  device=str(self.device), **extra)

    def batch_features(self, clips_16k: Sequence[np.ndarray]) -> dict:
        """Clips of up to 30 s -> {"input_features" [B, mels, frames] float32 on the model's device,
        "attention_mask" [B, frames]}: the feature extractor's log-mel of each clip alone (padded to 30 s,
        the clip's own maximum), computed here for the batch on the device. NOTE: the extractor itself
        pads each clip on the host, uploads 30 s, and returns its features to the host."""
        fe = self.processor.feature_extractor
        if getattr(fe, "dither", 0.0):  # its random dither: only the extractor's own draw reproduces it
            feats = [self._features(c, False) for c in clips_16k]
            return {k: torch.cat([f[k] for f in feats]) for k in ("input_features", "attention_mask")}
        wave_dev = torch.zeros((len(clips_16k), self.max_samples), dtype=torch.float32, device=self.device)
        for i, clip in enumerate(clips_16k):  # each clip uploaded as it is, zeros after it (the extractor's padding)
            wave_dev[i, :len(clip)] = torch.from_numpy(np.ascontiguousarray(clip, dtype=np.float32)).to(self.device)
        stft = torch.stft(wave_dev, fe.n_fft, fe.hop_length, window=self._hann_dev, return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()  # [B, freq, frames]: the last frame dropped, as theirs
        mel = self._mel_filters_dev @ power  # [B, mels, frames]
        log = torch.clamp(mel, min=1e-10).log10()
        log = torch.maximum(log, log.amax(dim=(1, 2), keepdim=True) - 8.0)  # each clip's own maximum
        frames = np.arange(log.shape[-1]) * fe.hop_length
        mask = torch.from_numpy(np.stack([frames < len(c) for c in clips_16k]).astype(np.int32))
        return {"input_features": (log + 4.0) / 4.0, "attention_mask": mask}

    @torch.inference_mode()
    def _generate(self, feats, language: str | None) -> list[str]:
        features_gpu = feats["input_features"].to(self.device, self.dtype)  # [B, mels, frames] (on the model's device)
        mask_gpu = feats["attention_mask"].to(self.device)
        kwargs = dict(self.generate_kwargs, **({"language": language} if language else {}))
        out = self.model.generate(input_features=features_gpu, attention_mask=mask_gpu, **kwargs)
        seqs = out["sequences"] if isinstance(out, dict) else out
        return [self._text(s.tolist()) for s in seqs]

    @torch.inference_mode()
    def _greedy(self, feats, language: str | None) -> list[str]:
        features_gpu = feats["input_features"].to(self.device, self.dtype)  # [B, mels, frames]
        enc_gpu = self.model.model.encoder(features_gpu).last_hidden_state  # [B, S, D]
        lang_gpu = None if language is None else \
            torch.full((len(features_gpu),), self.lang_to_id[f"<|{language}|>"], dtype=torch.long, device=self.device)
        return [self._text(ids) for ids in self.greedy.decode(enc_gpu, lang_gpu)]

    def transcribe(self, clips_16k: Sequence[np.ndarray], languages: Sequence[str | None]) -> list[str]:
        """clips [samples] float32 at 16 kHz, each row's language (or None) -> transcripts, in order."""
        out: list[str | None] = [None] * len(clips_16k)
        groups: dict[str | None, list[int]] = {}
        for i, (clip, lang) in enumerate(zip(clips_16k, languages)):
            code = self.language(lang)
            if len(clip) > self.max_samples:  # long-form: alone, as the pipeline runs it
                out[i] = self._generate(self._features(clip, True), code)[0]
            else:
                groups.setdefault(code, []).append(i)
        for code, rows in groups.items():
            for part in chunks(rows, self.batch_size):
                batch = self.batch_features([clips_16k[i] for i in part])
                run = self._greedy if self.greedy is not None else self._generate
                for i, text in zip(part, run(batch, code)):
                    out[i] = text
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class AsrScorer(Scorer):
    """Transcript and WER/CER of each row (the module's doc). `backend`: anything with
    `transcribe(clips_16k, languages)` and `sampling_rate` (a fake in tests); else Whisper
    from `model`."""

    name = "asr"
    score_names = ("wer", "cer")
    thresholds = {
        "wer": (">", 0.1, "the issue's example gate (--reject 'wer>0.1'): one word in ten wrong; a good TTS "
                "row round-trips at or near 0 (Seed-TTS-eval reports corpus WERs of 1-3%)"),
        "cer": (">", 0.1, "the same bar per character, for the languages that do not space their words"),
    }

    def __init__(self, model: str | Path | None = None, device: str = "cpu", dtype=None, batch_size: int = 16,
                 num_beams: int | None = None, max_new_tokens: int | None = None, backend=None):
        if backend is None:
            if model is None:
                raise ValueError("the asr scorer needs a Whisper model: a hub id or a folder (--asr-model)")
            if is_ctranslate2_folder(model):  # a CTranslate2 conversion: faster-whisper (its module's doc)
                backend = FasterWhisperASR(model, device, dtype, num_beams, max_new_tokens)
            else:
                backend = WhisperASR(model, device, dtype, batch_size, num_beams, max_new_tokens)
        self.backend = backend
        self.text = TextScoring(getattr(backend, "spelling", None))

    def score(self, batch: Sequence[ScoreInput]) -> list[RowScores]:
        rate = int(getattr(self.backend, "sampling_rate", 16000))
        live = [i for i, row in enumerate(batch) if len(row.audio)]
        texts = self.backend.transcribe([to_rate(batch[i].audio, batch[i].sample_rate, rate) for i in live],
                                        [batch[i].language for i in live]) if live else []
        transcript = dict(zip(live, texts))
        results = []
        for i, row in enumerate(batch):
            scores = RowScores()
            if i not in transcript:
                results.append(scores.missing(self.score_names, "no audio"))
                continue
            err = self.text.error_rate(row.text, transcript[i], row.language)
            scores.text["transcript"] = transcript[i]
            scores.text["asr_metric"] = err.metric
            scores.text["asr_normalizer"] = err.normalizer
            other = "cer" if err.metric == "wer" else "wer"
            scores[err.metric] = err.value
            if err.value is None:
                scores.reasons[err.metric] = err.reason
            scores.missing([other], f"{err.metric.upper()} scores this row "
                           f"({'per character' if err.metric == 'cer' else 'per word'})")
            results.append(scores)
        return results

    def close(self) -> None:
        if hasattr(self.backend, "close"):
            self.backend.close()
