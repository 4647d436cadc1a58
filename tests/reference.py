"""The transformers reference (the oracle), loaded with the torchaudio stand-in."""

from __future__ import annotations

from pathlib import Path

import torch

from tests import torchaudio_standin

torchaudio_standin.install()

from transformers import (  # noqa: E402
    AutoTokenizer,
    DacFeatureExtractor,
    HiggsAudioV2ForConditionalGeneration,
    HiggsAudioV2Processor,
    HiggsAudioV2TokenizerModel,
)

SYSTEM = "Generate audio following instruction."


class Reference:
    def __init__(self, ckpt: Path):
        self.model = HiggsAudioV2ForConditionalGeneration.from_pretrained(str(ckpt / "model")).eval()
        tok = AutoTokenizer.from_pretrained(str(ckpt / "model"))
        self.codec = HiggsAudioV2TokenizerModel.from_pretrained(str(ckpt / "codec")).eval()
        self.processor = HiggsAudioV2Processor(
            DacFeatureExtractor(sampling_rate=24000, hop_length=960), tok, self.codec,
            chat_template=(ckpt / "model" / "chat_template.jinja").read_text(),
        )

    @staticmethod
    def conversation(text: str, scene: str | None = None, system: str = SYSTEM) -> list[dict]:
        conv = [{"role": "system", "content": [{"type": "text", "text": system}]}]
        if scene:
            conv.append({"role": "scene", "content": [{"type": "text", "text": scene}]})
        conv.append({"role": "user", "content": [{"type": "text", "text": text}]})
        return conv

    def inputs(self, text: str, scene: str | None = None, system: str = SYSTEM):
        return self.processor.apply_chat_template(
            self.conversation(text, scene, system), add_generation_prompt=True, tokenize=True,
            return_dict=True, return_tensors="pt",
        )

    @torch.no_grad()
    def generate_greedy(self, text: str, max_new_frames: int, scene: str | None = None):
        """-> (codes [frames, 8] int64, processed scores [frames, 8, V] float32)."""
        out = self.model.generate(**self.inputs(text, scene), max_new_tokens=max_new_frames, do_sample=False,
                                  return_dict_in_generate=True, output_scores=True)
        return out.audio_sequences[0], torch.stack(out.scores, dim=0)[:, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.processor.batch_decode(codes[None])[0]
