"""The talker's prefill inputs and trailing text, laid out as the reference's generate does.

Every prefill position is the sum of a text track and a codec track (talker.py embeds them):
``text_ids[p]`` is always a text-vocabulary id (projected by the talker's text MLP);
``codec_ids[p]`` is a codec id, or CODEC_NONE (nothing added), CODEC_SPEAKER (the x-vector), or
CODEC_FRAME (a reference frame: its 16 codes' embeddings summed). The reference tokenizes
  A = "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n"  (A[:3] is the role, A[3:-5] the text)
  R = "<|im_start|>assistant\\n{ref_text}<|im_end|>\\n"                      (R[3:-2] the reference transcript)
  I = "<|im_start|>user\\n{instruct}<|im_end|>\\n"                           (all of it)
and lays out, in order (text track / codec track):
  1. instruct, if any (VoiceDesign; 1.7B CustomVoice):  I                        / none
  2. role:                                               A[:3]                    / none
  3. codec prefix, one position per id but the last of
       [think, think_bos, lang, think_eos] (a language; a dialect speaker's dialect under
        Chinese or Auto) or [nothink, think_bos, think_eos] (Auto), then the speaker (a
        CustomVoice spk_id, or the Base x-vector), then [pad, bos]:
                                                         tts_pad ..., tts_bos     / those ids but bos
  4. the text, by mode:
     plain, streaming (non_streaming_mode false):       A[3]                     / bos
         trailing text (fed one a decode step): A[4:-5], tts_eos
     plain, non-streaming:                              A[3:-5], tts_eos         / pad each
                                                         tts_pad                  / bos
         no trailing text
     in-context cloning (Base, ref codes): T = R[3:-2] + A[3:-5] + [tts_eos] (n_t ids),
         C = [bos] + the reference's frames (n_c positions)
       non-streaming:                                   T                        / pad each
                                                         tts_pad each             / C
         no trailing text
       streaming, n_t > n_c:                            T[:n_c]                  / C
         trailing text T[n_c:]
       streaming, n_t <= n_c:                           T, then tts_pad each     / C
         no trailing text
Decode step s (s = 0 feeds frame 0's codes) adds the text track of trailing[s], or of tts_pad
once the trailing text is used up; its codec input is the previous frame's 16 embeddings summed.
Speaker rule (the reference's): Base rows carry the x-vector in both cloning modes; the
in-context mode needs ``ref_text``; x_vector_only_mode ignores the reference codes and text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .config import Qwen3TTSConfig
from .talker import CODEC_FRAME, CODEC_NONE, CODEC_SPEAKER
from .tokenizer import TextTokenizer


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text_block(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_block(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


@dataclass(frozen=True)
class TalkerPrompt:
    """One row's prefill and trailing text (module docstring)."""

    text_ids: np.ndarray  # [T] int64
    codec_ids: np.ndarray  # [T] int64: a codec id or CODEC_NONE / CODEC_SPEAKER / CODEC_FRAME
    trailing_ids: np.ndarray  # [n] int64: text ids fed at decode steps 0..n-1
    tts_pad_id: int
    ref_codes: np.ndarray | None = None  # [frames, 16] int64 at the CODEC_FRAME positions, in order
    ref_start: int = -1  # the first CODEC_FRAME position
    speaker: np.ndarray | None = None  # [hidden] float32 x-vector at the CODEC_SPEAKER position
    speaker_pos: int = -1

    def __len__(self) -> int:
        return len(self.text_ids)

    def prompt_codes(self, streams: int) -> np.ndarray:
        """[T, streams] int64: the reference frames at their positions, zeros elsewhere."""
        out = np.zeros((len(self), streams), dtype=np.int64)
        if self.ref_codes is not None:
            out[self.ref_start: self.ref_start + len(self.ref_codes)] = self.ref_codes
        return out

    def trailing_at(self, step: int) -> int:
        return int(self.trailing_ids[step]) if step < len(self.trailing_ids) else self.tts_pad_id

    def content(self) -> list[int]:
        """A key per position, equal only for equal inputs there (both tracks, the frame's codes, the
        x-vector's bytes): what prefix sharing and prefill graphs must compare."""
        keys = [(int(t) << 16) | (int(c) & 0xFFFF) for t, c in zip(self.text_ids, self.codec_ids)]
        if self.ref_codes is not None:
            for i, row in enumerate(np.ascontiguousarray(self.ref_codes, dtype=np.int64)):
                keys[self.ref_start + i] = _key(row.tobytes(), int(self.text_ids[self.ref_start + i]))
        if self.speaker is not None:
            vec = np.ascontiguousarray(self.speaker, dtype=np.float32).tobytes()
            keys[self.speaker_pos] = _key(vec, int(self.text_ids[self.speaker_pos]))
        return keys


def _key(data: bytes, text_id: int) -> int:
    """A negative 63-bit key (never a position key of ids) of some bytes and a text id."""
    h = hashlib.blake2b(data + text_id.to_bytes(8, "little", signed=True), digest_size=8).digest()
    return -1 - (int.from_bytes(h, "little") >> 1)


def prefill_arrays(prompts: list[TalkerPrompt], length: int, streams: int, hidden: int) -> dict[str, np.ndarray]:
    """The talker's prefill keyword arguments for rows right-padded to ``length``: input_ids and
    codec_ids [B, length] int64 (padding: id 0, CODEC_NONE), and where any row has them,
    prompt_codes [B, length, streams] int64 and speaker_embeds [B, length, hidden] float32
    (zeros off their positions)."""
    b = len(prompts)
    out = {"input_ids": np.zeros((b, length), np.int64), "codec_ids": np.full((b, length), CODEC_NONE, np.int64)}
    if any(p.ref_codes is not None for p in prompts):
        out["prompt_codes"] = np.zeros((b, length, streams), np.int64)
    if any(p.speaker is not None for p in prompts):
        out["speaker_embeds"] = np.zeros((b, length, hidden), np.float32)
    for i, p in enumerate(prompts):
        out["input_ids"][i, : len(p)] = p.text_ids
        out["codec_ids"][i, : len(p)] = p.codec_ids
        if p.ref_codes is not None:
            out["prompt_codes"][i, p.ref_start: p.ref_start + len(p.ref_codes)] = p.ref_codes
        if p.speaker is not None:
            out["speaker_embeds"][i, p.speaker_pos] = p.speaker
    return out


def trailing_table(prompts: list[TalkerPrompt], width: int) -> np.ndarray:
    """[B, width] int64: each row's trailing text ids, padded with its tts_pad (decode step s reads column s)."""
    out = np.empty((len(prompts), width), dtype=np.int64)
    for i, p in enumerate(prompts):
        out[i] = p.tts_pad_id
        n = min(width, len(p.trailing_ids))
        out[i, :n] = p.trailing_ids[:n]
    return out


class PromptBuilder:
    """Rows' fields -> TalkerPrompts; ValueError(field, message) names a field the reference refuses."""

    def __init__(self, cfg: Qwen3TTSConfig, tokenizer: TextTokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.tts_pad, self.tts_bos, self.tts_eos = cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id

    def default_non_streaming(self) -> bool:
        """The reference's default: true for CustomVoice and VoiceDesign, false for Base."""
        return self.cfg.tts_model_type != "base"

    def language_id(self, language: str | None, speaker: str | None) -> int | None:
        """The codec language id (None: Auto, no dialect) for a row, as the reference picks it."""
        t = self.cfg.talker
        lang = (language or "auto").lower()
        if lang != "auto" and (lang not in t.codec_language_id or lang not in self.cfg.languages):
            raise ValueError("language", f"{language!r} is not one of this checkpoint's languages "
                             f"({', '.join(self.cfg.languages)})")
        out = None if lang == "auto" else t.codec_language_id[lang]
        if lang in ("chinese", "auto") and speaker:
            dialect = t.spk_is_dialect.get(speaker.lower(), False)
            if dialect is not False:
                out = t.codec_language_id[str(dialect).lower()]
        return out

    def build(self, text: str, language: str | None = "Auto", speaker: str | None = None,
              instruct: str | None = None, x_vector: np.ndarray | None = None, ref_codes: np.ndarray | None = None,
              ref_text: str | None = None, x_vector_only_mode: bool = False,
              non_streaming_mode: bool | None = None) -> TalkerPrompt:
        return self.build_many([dict(text=text, language=language, speaker=speaker, instruct=instruct,
                                     x_vector=x_vector, ref_codes=ref_codes, ref_text=ref_text,
                                     x_vector_only_mode=x_vector_only_mode,
                                     non_streaming_mode=non_streaming_mode)])[0]

    def build_many(self, rows: list[dict]) -> list[TalkerPrompt]:
        """Each row's prompt; every text of the batch is tokenized in one call."""
        texts: list[str] = []
        plans = []
        for row in rows:
            plan = self._plan(**row)
            plan["at"] = len(texts)
            texts += plan["texts"]
            plans.append(plan)
        ids = self.tokenizer.encode_batch(texts) if texts else []
        return [self._layout(p, ids[p["at"]: p["at"] + len(p["texts"])]) for p in plans]

    def _plan(self, text, language="Auto", speaker=None, instruct=None, x_vector=None, ref_codes=None, ref_text=None,
              x_vector_only_mode=False, non_streaming_mode=None) -> dict:
        cfg, t = self.cfg, self.cfg.talker
        if not text:
            raise ValueError("text", "is empty")
        kind = cfg.tts_model_type
        if kind == "custom_voice" and cfg.instruct_ignored:
            instruct = None  # the reference drops it on 0.6B CustomVoice
        speaker_id = None
        if kind != "base" and (x_vector is not None or ref_codes is not None):
            raise ValueError("ref_audio", f"a {kind} checkpoint does not clone voices (only Base checkpoints do)")
        if kind != "custom_voice" and speaker:
            raise ValueError("speaker", f"a {kind} checkpoint has no preset speakers (CustomVoice checkpoints do)")
        if kind == "base" and instruct:
            raise ValueError("instruct", "a Base checkpoint takes no instruction")
        if kind == "base":
            if x_vector is None:
                raise ValueError("ref_audio", "a Base checkpoint clones a reference voice: give ref_audio")
            icl = not x_vector_only_mode
            if icl and (ref_codes is None or len(ref_codes) == 0):
                raise ValueError("ref_audio", "in-context cloning needs the reference's codes")
            if icl and not ref_text:
                raise ValueError("ref_text", "is required for in-context cloning (x_vector_only_mode false)")
        else:
            icl = False
            if speaker:
                if speaker.lower() not in t.spk_id:
                    listed = ", ".join(cfg.speakers) or "none"
                    raise ValueError("speaker", f"{speaker!r} is not one of this checkpoint's speakers ({listed})")
                speaker_id = t.spk_id[speaker.lower()]
        lang_id = self.language_id(language, speaker)
        streaming = not (self.default_non_streaming() if non_streaming_mode is None else non_streaming_mode)
        texts = [assistant_text(text)]
        if icl:
            texts.append(ref_text_block(ref_text))
        if instruct:
            texts.append(instruct_block(instruct))
        return dict(texts=texts, lang_id=lang_id, speaker_id=speaker_id, x_vector=x_vector, icl=icl,
                    ref_codes=ref_codes, instruct=bool(instruct), streaming=streaming)

    def _layout(self, plan: dict, ids: list[list[int]]) -> TalkerPrompt:
        t = self.cfg.talker
        a = ids[0]
        if len(a) < 9:
            raise ValueError("text", "tokenizes to nothing")
        text: list[int] = []
        codec: list[int] = []

        def put(text_ids, codec_ids):
            text.extend(text_ids)
            codec.extend(codec_ids)

        if plan["instruct"]:
            put(ids[-1], [CODEC_NONE] * len(ids[-1]))
        put(a[:3], [CODEC_NONE] * 3)
        if plan["lang_id"] is None:
            prefix = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
        else:
            prefix = [t.codec_think_id, t.codec_think_bos_id, plan["lang_id"], t.codec_think_eos_id]
        speaker_pos = -1
        if plan["x_vector"] is not None:
            speaker_pos = len(text) + len(prefix)
            prefix.append(CODEC_SPEAKER)
        elif plan["speaker_id"] is not None:
            prefix.append(plan["speaker_id"])
        prefix += [t.codec_pad_id]  # the bos that closes the list enters with the text below
        put([self.tts_pad] * (len(prefix) - 1) + [self.tts_bos], prefix)
        body = a[3:-5]
        ref_codes, ref_start, trailing = None, -1, []
        if plan["icl"]:
            ref_codes = np.asarray(plan["ref_codes"], dtype=np.int64)
            seq = list(ids[1][3:-2]) + list(body) + [self.tts_eos]
            frames = [t.codec_bos_id] + [CODEC_FRAME] * len(ref_codes)
            if not plan["streaming"]:
                put(seq, [t.codec_pad_id] * len(seq))
                ref_start = len(text) + 1
                put([self.tts_pad] * len(frames), frames)
            elif len(seq) > len(frames):
                ref_start = len(text) + 1
                put(seq[: len(frames)], frames)
                trailing = seq[len(frames):]
            else:
                ref_start = len(text) + 1
                put(seq + [self.tts_pad] * (len(frames) - len(seq)), frames)
        elif plan["streaming"]:
            put([a[3]], [t.codec_bos_id])
            trailing = list(a[4:-5]) + [self.tts_eos]
        else:
            put(list(body) + [self.tts_eos], [t.codec_pad_id] * (len(body) + 1))
            put([self.tts_pad], [t.codec_bos_id])
        x_vector = None if plan["x_vector"] is None else np.asarray(plan["x_vector"], dtype=np.float32)
        return TalkerPrompt(text_ids=np.asarray(text, dtype=np.int64), codec_ids=np.asarray(codec, dtype=np.int64),
                            trailing_ids=np.asarray(trailing, dtype=np.int64), tts_pad_id=self.tts_pad,
                            ref_codes=ref_codes, ref_start=ref_start, speaker=x_vector, speaker_pos=speaker_pos)
