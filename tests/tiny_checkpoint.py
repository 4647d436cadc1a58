"""Build tiny random Higgs Audio v2 checkpoints in the real transformers format.

A checkpoint is two folders, exactly as the released ones are laid out:
  model/  config.json, generation_config.json, model.safetensors, tokenizer.json,
          tokenizer_config.json, chat_template.jinja   (HiggsAudioV2ForConditionalGeneration)
  codec/  config.json, model.safetensors                (HiggsAudioV2TokenizerModel)

The weights are random (fixed seed) and the tokenizer is a byte-level BPE with
no merges plus the Llama-3 / Higgs special tokens, so the audio is noise but
every code path of the real model runs. The shipped embedded default
(configs/tiny-higgs-audio-v2/) was written by ``python -m tests.tiny_checkpoint``.

Building needs transformers' reference classes, hence the torchaudio stand-in:
this module is test/dev tooling and is never imported by the runtime.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn as nn

from tests import torchaudio_standin

torchaudio_standin.install()

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    HiggsAudioV2Config,
    HiggsAudioV2ForConditionalGeneration,
    HiggsAudioV2TokenizerConfig,
    HiggsAudioV2TokenizerModel,
    PreTrainedTokenizerFast,
)

SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|audio_out_bos|>",
    "<|AUDIO|>",
    "<|AUDIO_OUT|>",
    "<|reserved_special_token_6|>",  # the audio delay token
    "<|scene_desc_start|>",
    "<|scene_desc_end|>",
]

# Our own rendering of the Higgs prompt layout (system, optional scene folded
# into the system turn, then user/assistant turns; the generation prompt opens
# the assistant turn with <|audio_out_bos|>). The released checkpoint ships
# its own template; the runtime always uses whatever the checkpoint carries.
CHAT_TEMPLATE = (
    "{%- macro text_of(m) -%}"
    "{%- if m['content'] is string -%}{{ m['content'] | trim }}"
    "{%- else -%}{%- for c in m['content'] if c['type'] == 'text' -%}{{ c['text'] | trim }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] != 'system' -%}{{ raise_exception('the first message must be the system message') }}{%- endif -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + text_of(messages[0]) -}}"
    "{%- set rest = messages[1:] -%}"
    "{%- if rest and rest[0]['role'] == 'scene' -%}"
    "{{- '\\n\\n<|scene_desc_start|>\\n' + text_of(rest[0]) + '\\n<|scene_desc_end|>' -}}"
    "{%- set rest = rest[1:] -%}"
    "{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- for m in rest -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{%- if m['role'] == 'assistant' -%}{{- '<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' -}}"
    "{%- else -%}{{- text_of(m) -}}{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>' -}}"
    "{%- endif -%}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE over the 256 byte symbols (no merges) plus special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_lm_config(tokenizer: PreTrainedTokenizerFast, **overrides) -> HiggsAudioV2Config:
    ids = tokenizer.convert_tokens_to_ids
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=2048,
        num_codebooks=8,
        codebook_size=1026,  # as the released config.json: 1024 codes + stream BOS/EOS
        bos_token_id=ids("<|begin_of_text|>"),
        eos_token_id=ids("<|eot_id|>"),
        pad_token_id=ids("<|end_of_text|>"),
        audio_token_id=ids("<|AUDIO_OUT|>"),
        audio_bos_token_id=ids("<|audio_out_bos|>"),
        audio_delay_token_id=ids("<|reserved_special_token_6|>"),
    )
    kwargs.update(overrides)
    return HiggsAudioV2Config(**kwargs)


def tiny_codec_config() -> HiggsAudioV2TokenizerConfig:
    return HiggsAudioV2TokenizerConfig(
        # hop 960 -> 25 fps at 24 kHz; bandwidth 2 kbps -> 8 quantizers, as released
        target_bandwidths=[0.5, 1, 1.5, 2],
        codebook_size=1024,
        codebook_dim=8,
        acoustic_model_config=dict(
            encoder_hidden_size=2,
            downsampling_ratios=[8, 5, 4, 2, 3],
            upsampling_ratios=[8, 5, 4, 2, 3],
            decoder_hidden_size=64,
            hidden_size=16,
        ),
        semantic_model_config=dict(
            model_type="hubert",
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            conv_dim=[8, 8, 8, 8, 8, 8, 8],
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
        ),
    )


# rms of drive_by_codes' audio on random codes: its peaks stay near 0.3, far from int16's clip
CODEC_AUDIO_RMS = 0.05


def drive_by_codes(codec: HiggsAudioV2TokenizerModel) -> HiggsAudioV2TokenizerModel:
    """Re-initialise ``codec``'s decode path (RVQ codebooks and project_out, fc2, the DAC
    decoder) from the global RNG so its audio comes from the codes; returns ``codec``.

    transformers' init (std 0.02 weights, zero codebooks) leaves every layer's gain far
    below one: the audio is then its biases, and decoding other codes changes a few LSBs
    (issue 31). Here each layer keeps the signal near unit rms (std 1 / sqrt(fan-in)),
    a residual unit's 1x1 output only adds to the stream (gain 0.3, so five blocks of
    three units grow it a few times, not hundreds: the Snakes' sin stays well-conditioned
    in 16-bit), biases are small but non-zero and Snake alphas differ per channel (so a
    kernel that dropped or misindexed either fails the parity tests), and the last
    convolution is scaled so random codes decode at CODEC_AUDIO_RMS.
    Only the decode path changes; the encoder and semantic parts keep transformers' init.
    """
    n_q = len(codec.quantizer.quantizers)
    with torch.no_grad():
        for q in codec.quantizer.quantizers:
            q.codebook.embed.normal_()  # released codebooks are trained, never zero
            q.project_out.weight.normal_(0.0, 1.0 / math.sqrt(q.project_out.in_features * n_q))  # sum of n_q: rms ~1
            q.project_out.bias.normal_(0.0, 0.1)
        layers = [codec.fc2] + [m for m in codec.acoustic_decoder.modules()
                                if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
        for m in layers:
            w = m.weight
            if isinstance(m, nn.ConvTranspose1d):  # [in, out, k]: each output reads in * k / stride taps
                fan_in = w.shape[0] * w.shape[2] / m.stride[0]
            else:
                fan_in = w[0].numel()
            gain = 0.3 if isinstance(m, nn.Conv1d) and m.kernel_size[0] == 1 else 1.0
            w.normal_(0.0, gain / math.sqrt(fan_in))
            m.bias.normal_(0.0, 0.1)
        for name, p in codec.acoustic_decoder.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.5, 1.5)
        g = torch.Generator().manual_seed(0)  # calibration codes; leaves the global RNG to the caller
        codes = torch.randint(0, codec.config.codebook_size, (2, n_q, 25), generator=g)
        rms = codec.decode(codes).audio_values.float().pow(2).mean().sqrt()
        head = codec.acoustic_decoder.conv2
        head.weight.mul_(CODEC_AUDIO_RMS / rms)
        head.bias.mul_(CODEC_AUDIO_RMS / rms)
    return codec


def drive_encoder(codec: HiggsAudioV2TokenizerModel, seed: int = 0) -> HiggsAudioV2TokenizerModel:
    """Re-initialise ``codec``'s encode path (HuBERT's linear layers, encoder_semantic, the DAC
    encoder, fc, the quantizers' project_in) from a generator of ``seed`` so its codes follow
    the audio; returns ``codec``.

    Under transformers' init (std 0.02 linear and DAC weights) the embeddings are mostly
    biases: a few seconds of audio encode to two or three distinct codes a quantizer, and
    a parity test over them would pass many a wrong encoder. Here each layer keeps the signal
    near unit rms (std 1 / sqrt(fan-in); residual 1x1 convolutions at gain 0.3), biases are
    small but non-zero, and Snake alphas differ per channel. The decode path is untouched."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layers = [codec.fc] + [q.project_in for q in codec.quantizer.quantizers]
        layers += [m for m in codec.semantic_model.encoder.layers.modules() if isinstance(m, nn.Linear)]
        layers += [m for part in (codec.encoder_semantic, codec.acoustic_encoder) for m in part.modules()
                   if isinstance(m, nn.Conv1d)]
        for m in layers:
            w = m.weight
            gain = 0.3 if isinstance(m, nn.Conv1d) and m.kernel_size[0] == 1 else 1.0
            w.copy_(torch.randn(w.shape, generator=g) * gain / math.sqrt(w[0].numel()))
            if m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
        for name, p in codec.acoustic_encoder.named_parameters():
            if name.endswith("alpha"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    return codec


def tiny_codec(config: HiggsAudioV2TokenizerConfig | None = None) -> HiggsAudioV2TokenizerModel:
    """A random codec (global RNG) whose audio the codes drive and whose codes the audio drives:
    what every tiny checkpoint ships."""
    return drive_encoder(drive_by_codes(HiggsAudioV2TokenizerModel(config or tiny_codec_config()).eval()))


def build(out: Path, seed: int = 0, eos_boost: tuple[int, float] | None = None) -> Path:
    """Write model/ and codec/ under ``out``; returns ``out``.

    ``eos_boost=(codebook, scale)`` adds ``scale`` times a fixed random direction
    to that codebook's stream-EOS row of ``audio_lm_head``, so greedy decoding
    hits stream-EOS early and the delay-pattern staircase and stop are exercised.
    """
    out = Path(out)
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    model = HiggsAudioV2ForConditionalGeneration(tiny_lm_config(tokenizer)).eval()
    # transformers initialises with std 0.02. Widen the head so greedy codes
    # vary from frame to frame, and the layers so attention to the prompt
    # matters: then different prompts give different codes, and a runner that
    # mixed up rows or positions could not pass the parity tests.
    with torch.no_grad():
        model.audio_lm_head.weight.mul_(25.0)
        model.model.embed_audio_tokens.embed_audio_tokens.weight.mul_(25.0)
        model.model.embed_tokens.weight.mul_(25.0)
        for name, p in model.model.layers.named_parameters():
            if name.endswith("proj.weight"):
                p.mul_(4.0)
        if eos_boost is not None:
            cb, scale = eos_boost
            cfg = model.config
            row = cb * cfg.codebook_size + cfg.audio_stream_eos_id
            g = torch.Generator().manual_seed(seed + 1)
            model.audio_lm_head.weight[row] += scale * torch.randn(cfg.hidden_size, generator=g)
    model.generation_config.do_sample = False
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")

    torch.manual_seed(seed + 2)
    codec = tiny_codec()
    codec.save_pretrained(out / "codec")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    build(args.out, seed=args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
