"""Prompt construction from the checkpoint's own tokenizer and chat template.

The conversation is [system, scene (optional), user]; the template's
generation prompt opens the assistant turn and must end in <|audio_out_bos|>.
The ids equal what HiggsAudioV2Processor.apply_chat_template builds from the
same conversation (tests compare them), without loading the processor, whose
audio tokenizer would need torchaudio, or transformers (runners/chat_template.py).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import OmniError
from ..chat_template import ChatTokenizer


class PromptBuilder:
    def __init__(self, folder: Path, audio_bos_token_id: int, default_template: str | None = None):
        self.tokenizer = ChatTokenizer(folder, default_template)
        self.audio_bos_token_id = audio_bos_token_id
        # literal special tokens in user text would be parsed as control tokens
        self._specials = sorted(self.tokenizer.specials, key=len, reverse=True)

    def conversation(self, text: str, system: str, scene: str | None) -> list[dict]:
        conv = [{"role": "system", "content": [{"type": "text", "text": system}]}]
        if scene:
            conv.append({"role": "scene", "content": [{"type": "text", "text": scene}]})
        conv.append({"role": "user", "content": [{"type": "text", "text": text}]})
        return conv

    def build(self, text: str, system: str, scene: str | None) -> list[int]:
        """Token ids of the prompt. Raises ValueError(field, message) for bad content."""
        return self.encode_all([self.render(text, system, scene)])[0]

    def render(self, text: str, system: str, scene: str | None) -> str:
        """The prompt as the chat template writes it. Raises ValueError(field, message) for bad content."""
        for field, value in (("text", text), ("system", system), ("scene", scene)):
            for special in self._specials:
                if value and special in value:
                    raise ValueError(field, f"contains the special token {special!r}")
        try:
            return self.tokenizer.render(self.conversation(text, system, scene), add_generation_prompt=True)
        except ValueError as e:  # the template's raise_exception
            raise ValueError("text", f"the checkpoint's chat template refused this row: {e}") from None

    def encode_all(self, rendered: list[str]) -> list[list[int]]:
        """Token ids of rendered prompts, in one batch: the tokenizer spreads a batch over the
        machine's cores, outside the GIL, several times faster than one by one (BENCHMARKS.md,
        prompts tokenized in one batch)."""
        ids = self.tokenizer.encode_batch(rendered)
        for one in ids:
            if not one or one[-1] != self.audio_bos_token_id:
                raise OmniError("the checkpoint's chat template does not end its generation prompt in <|audio_out_bos|>")
        return ids
