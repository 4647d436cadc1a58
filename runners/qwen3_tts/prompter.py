"""Qwen3-TTS's Prompter (runners/family.py): a row's fields -> its TalkerPrompt, and what is wrong
with a row's fields, from the checkpoint's configs and tokenizer alone (no weights).

Row fields are named as the reference's API names them (``row_fields``): language, speaker
(CustomVoice), instruct (VoiceDesign, 1.7B CustomVoice), x_vector_only_mode (Base),
non_streaming_mode (default: true for CustomVoice and VoiceDesign, false for Base). A Base row's
reference is the prompt's first AudioTurn: its codes (in-context cloning), its transcript
(ref_text) and its x-vector (AudioTurn.speaker). ``system`` and ``scene`` are Higgs's chat turns,
which the reference has no equivalent of: they are ignored. Later AudioTurns (a long row's
earlier chunks) are ignored too: the reference conditions on one voice, never on earlier turns.
"""

from __future__ import annotations

import numpy as np

from ..family import AudioTurn, FieldProblem, PromptFieldError, RenderedPrompt
from ..prompt_input import AudioSpan, PromptInput
from .codec_config import SpeechTokenizerConfig
from .config import Qwen3TTSConfig
from .encoder import reference_frames
from .prompt import PromptBuilder, TalkerPrompt, assistant_text, instruct_block, ref_text_block
from .tokenizer import TextTokenizer

ROW_FIELDS = {"language": str, "speaker": str, "instruct": str, "x_vector_only_mode": bool,
              "non_streaming_mode": bool}


class Qwen3Prompter:
    def __init__(self, cfg: Qwen3TTSConfig, tokenizer: TextTokenizer, codec_cfg: SpeechTokenizerConfig):
        self.cfg = cfg
        self.builder = PromptBuilder(cfg, tokenizer)
        self.sample_rate = codec_cfg.output_sample_rate
        self.frame_rate = codec_cfg.output_sample_rate / codec_cfg.decode_upsample_rate
        self.num_streams = cfg.num_streams
        self._downsample = codec_cfg.encode_downsample_rate

    def render_prompt(self, text: str, system: str, scene: str | None, context: tuple[AudioTurn, ...] = (),
                      fields: dict | None = None) -> RenderedPrompt:
        """The row's TalkerPrompt (RenderedPrompt.data); ``text`` there is what was tokenized, for
        reading only. PromptFieldError names the field the reference would refuse."""
        f = fields or {}
        kw = dict(text=text, language=f.get("language") or "Auto", speaker=f.get("speaker"),
                  instruct=f.get("instruct"), x_vector_only_mode=bool(f.get("x_vector_only_mode", False)),
                  non_streaming_mode=f.get("non_streaming_mode"))
        ref = context[0] if context else None
        if ref is not None and self.cfg.tts_model_type == "base":
            kw.update(x_vector=ref.speaker, ref_codes=np.asarray(ref.codes, dtype=np.int64), ref_text=ref.text)
        try:
            prompt = self.builder.build(**kw)
        except ValueError as e:
            raise PromptFieldError(*e.args) from None
        shown = [instruct_block(kw["instruct"])] if kw["instruct"] and not self.cfg.instruct_ignored else []
        if prompt.ref_codes is not None:
            shown.append(ref_text_block(kw["ref_text"]))
        shown.append(assistant_text(text))
        audio = () if prompt.ref_codes is None else (prompt.ref_codes,)
        return RenderedPrompt("".join(shown), audio, prompt)

    def encode_prompts(self, rendered: list[RenderedPrompt]) -> list[PromptInput]:
        """Each row's text track as ids, its reference frames as an AudioSpan (the engine lays them out
        as prompt_codes), the TalkerPrompt as ``extra`` and its content() as the key (rows share KV only
        where both tracks, frames and x-vectors are equal)."""
        out = []
        for r in rendered:
            p = r.data
            if not isinstance(p, TalkerPrompt):
                raise TypeError("a Qwen3-TTS prompt is rendered by Qwen3TTS.render_prompt")
            spans = () if p.ref_codes is None else (AudioSpan(p.ref_start, p.ref_codes),)
            out.append(PromptInput([int(i) for i in p.text_ids], spans, extra=p, key=tuple(p.content())))
        return out

    def reference_frames(self, samples: int) -> int:
        return reference_frames(samples, self._downsample)

    def field_problems(self, fields: dict, reference: bool, ref_text: bool) -> list[FieldProblem]:
        """Errors name a value the checkpoint does not list, a field its type cannot use, a missing
        reference or transcript; warnings name a field the reference silently ignores."""
        cfg, kind = self.cfg, self.cfg.tts_model_type
        out: list[FieldProblem] = []
        err = lambda field, msg: out.append(FieldProblem(field, msg))  # noqa: E731
        warn = lambda field, msg: out.append(FieldProblem(field, msg, warning=True))  # noqa: E731
        language, speaker = fields.get("language"), fields.get("speaker")
        instruct, x_only = fields.get("instruct"), bool(fields.get("x_vector_only_mode", False))
        if language is not None and language.lower() not in cfg.languages:
            err("language", f"{language!r} is not one of this checkpoint's languages ({', '.join(cfg.languages)})")
        if kind == "custom_voice":
            listed = ", ".join(cfg.speakers) or "none"
            if not speaker:
                err("speaker", f"is required by a CustomVoice checkpoint: one of {listed}")
            elif speaker.lower() not in cfg.talker.spk_id:
                err("speaker", f"{speaker!r} is not one of this checkpoint's speakers ({listed})")
            if instruct and cfg.instruct_ignored:
                warn("instruct", "is ignored: the reference drops instruct on 0.6B CustomVoice checkpoints")
        elif speaker:
            err("speaker", f"a {kind} checkpoint has no preset speakers (CustomVoice checkpoints do)")
        if kind == "base":
            if instruct:
                err("instruct", "a Base checkpoint takes no instruction")
            if not reference:
                err("ref_audio", "a Base checkpoint clones a reference voice: give ref_audio (or voice)")
            elif not x_only and not ref_text:
                err("ref_text", "is required for in-context cloning (or set x_vector_only_mode)")
            elif x_only and ref_text:
                warn("ref_text", "is ignored with x_vector_only_mode (the reference uses the x-vector alone)")
        else:
            if reference:
                err("ref_audio", f"a {kind} checkpoint does not clone voices (only Base checkpoints do)")
            if x_only:
                err("x_vector_only_mode", f"a {kind} checkpoint does not clone voices (only Base checkpoints do)")
        return out
