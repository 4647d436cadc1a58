"""Prompt construction from the checkpoint's own tokenizer and chat template.

The conversation is [system, scene (optional), (user, assistant audio) per
earlier turn, user]; the template's generation prompt opens the assistant turn
and must end in <|audio_out_bos|>. An earlier turn's audio (a reference voice,
or a long row's previous chunk) is its codec codes, placed as
HiggsAudioV2Processor places them: wrapped in stream BOS/EOS, delayed (codebook
k lags k frames), and fed at the template's <|AUDIO_OUT|>, which expands into
(delayed frames - (C - 1)) audio tokens and C - 1 delay tokens. The ids equal
what the processor builds from the same conversation (tests compare them),
without loading the processor, whose audio tokenizer would need torchaudio, or
transformers (runners/chat_template.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import OmniError
from ..chat_template import ChatTokenizer
from ..family import AudioTurn, FieldProblem, PromptFieldError, RenderedPrompt
from ..prompt_input import AudioSpan, PromptInput
from .encoder import encoded_frames

AUDIO_OUT = "<|AUDIO_OUT|>"  # the template's placeholder for an assistant turn's audio


def delay_pattern(codes: np.ndarray, bos: int, eos: int) -> np.ndarray:
    """codes [T, C] -> the model's input frames [T + 2 + C - 1, C]: stream BOS and EOS around
    the codes, codebook k shifted k frames later (BOS before it, EOS after it)."""
    t, c = codes.shape
    wrapped = np.concatenate([np.full((1, c), bos), codes, np.full((1, c), eos)]).astype(np.int64)
    out = np.empty((t + 2 + c - 1, c), dtype=np.int64)
    for k in range(c):
        out[:k, k] = bos
        out[k: k + t + 2, k] = wrapped[:, k]
        out[k + t + 2:, k] = eos
    return out


class PromptBuilder:
    def __init__(self, folder: Path, audio_bos_token_id: int, default_template: str | None = None,
                 audio: tuple[int, int, int, int] | None = None):
        """``audio``: (audio token id, delay token id, stream BOS, stream EOS), for prompts with audio turns."""
        self.tokenizer = ChatTokenizer(folder, default_template)
        self.audio_bos_token_id = audio_bos_token_id
        self.audio_token_id, self.audio_delay_token_id, self.stream_bos, self.stream_eos = audio or (-1, -1, -1, -1)
        # literal special tokens in user text would be parsed as control tokens
        self._specials = sorted(self.tokenizer.specials, key=len, reverse=True)

    def conversation(self, text: str, system: str, scene: str | None, context: tuple = ()) -> list[dict]:
        """``context``: earlier (text, audio) turns, each a user turn and an assistant audio turn."""
        conv = [{"role": "system", "content": [{"type": "text", "text": system}]}]
        if scene:
            conv.append({"role": "scene", "content": [{"type": "text", "text": scene}]})
        for turn in context:
            conv.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
            conv.append({"role": "assistant", "content": [{"type": "audio", "audio": AUDIO_OUT}]})
        conv.append({"role": "user", "content": [{"type": "text", "text": text}]})
        return conv

    def build(self, text: str, system: str, scene: str | None) -> list[int]:
        """Token ids of the prompt. Raises ValueError(field, message) for bad content."""
        return self.encode_all([self.render(text, system, scene)])[0]

    def render(self, text: str, system: str, scene: str | None, context: tuple = ()) -> str:
        """The prompt as the chat template writes it, one <|AUDIO_OUT|> an earlier turn (unexpanded).
        Raises ValueError(field, message) for bad content."""
        fields = [("text", text), ("system", system), ("scene", scene)]
        fields += [("ref_text" if i == 0 else "text", t.text) for i, t in enumerate(context)]
        for field, value in fields:
            for special in self._specials:
                if value and special in value:
                    raise ValueError(field, f"contains the special token {special!r}")
        try:
            rendered = self.tokenizer.render(self.conversation(text, system, scene, context), add_generation_prompt=True)
        except ValueError as e:  # the template's raise_exception
            raise ValueError("text", f"the checkpoint's chat template refused this row: {e}") from None
        if rendered.count(AUDIO_OUT) != len(context):
            raise OmniError(f"the checkpoint's chat template wrote {rendered.count(AUDIO_OUT)} {AUDIO_OUT} "
                            f"for {len(context)} audio turns")
        return rendered

    def encode_inputs(self, prompts: list[tuple[str, tuple]]) -> list[PromptInput]:
        """(rendered text, each turn's codes) -> PromptInputs, tokenized in one batch.

        Each <|AUDIO_OUT|> stands for its turn's codes [T, C], delayed (as the processor places them):
        (delayed frames - (C - 1)) audio tokens and C - 1 delay tokens. Both are special tokens, which
        the tokenizer splits out before anything else, so the text around them tokenizes the same
        whatever stands there: the placeholder's one id is replaced by the turn's ids after tokenizing
        (tokenizing a few hundred special tokens a row cost more than the rest of the prompt)."""
        delayed = [[delay_pattern(np.asarray(c), self.stream_bos, self.stream_eos) for c in audio]
                   for _, audio in prompts]
        out = []
        for ids, turns in zip(self.encode_all([text for text, _ in prompts]), delayed):
            full, spans, at = [], [], 0
            for frames in turns:  # each turn's placeholder, in order
                i = ids.index(self.audio_token_id, at)
                full += ids[at:i]
                c = frames.shape[1]
                spans.append(AudioSpan(len(full), frames))
                full += [self.audio_token_id] * (len(frames) - (c - 1)) + [self.audio_delay_token_id] * (c - 1)
                at = i + 1
            out.append(PromptInput(full + ids[at:], tuple(spans)))
        return out

    def encode_all(self, rendered: list[str]) -> list[list[int]]:
        """Token ids of rendered prompts, in one batch: the tokenizer spreads a batch over the
        machine's cores, outside the GIL, several times faster than one by one (BENCHMARKS.md,
        prompts tokenized in one batch)."""
        ids = self.tokenizer.encode_batch(rendered)
        for one in ids:
            if not one or one[-1] != self.audio_bos_token_id:
                raise OmniError("the checkpoint's chat template does not end its generation prompt in <|audio_out_bos|>")
        return ids


class HiggsPrompter:
    """Higgs's Prompter (runners/family.py): prompts from the tokenizer and chat template, and a
    reference clip's frame count from the codec's config; the loaded family renders through it."""

    def __init__(self, builder: PromptBuilder, codec_config: dict, num_streams: int):
        self.builder = builder
        self.codec_config = codec_config  # transformers' layout, or codec_layout.frame_config's part of it
        self.sample_rate = int(codec_config.get("sample_rate", 24000))
        ratios = (codec_config.get("acoustic_model_config") or {}).get("downsampling_ratios", [8, 5, 4, 2, 3])
        self.frame_rate = self.sample_rate / int(np.prod([int(r) for r in ratios]))
        self.num_streams = num_streams

    def render_prompt(self, text: str, system: str, scene: str | None, context: tuple[AudioTurn, ...] = (),
                      fields: dict | None = None) -> RenderedPrompt:
        try:
            rendered = self.builder.render(text, system, scene, context)
        except ValueError as e:
            raise PromptFieldError(*e.args) from None
        return RenderedPrompt(rendered, tuple(np.asarray(t.codes, dtype=np.int64) for t in context))

    def encode_prompts(self, rendered: list[RenderedPrompt]) -> list[PromptInput]:
        return self.builder.encode_inputs([(r.text, r.audio) for r in rendered])

    def reference_frames(self, samples: int) -> int:
        return encoded_frames(self.codec_config, samples)

    def field_problems(self, fields: dict, reference: bool, ref_text: bool) -> list[FieldProblem]:
        """Higgs has no fields of its own; a reference clip is an earlier turn, which needs its words."""
        if reference and not ref_text:
            return [FieldProblem("ref_text", "ref_audio needs ref_text, the transcript of the reference")]
        return []
