"""The Qwen3-TTS talker: the engine's model (the contract of runners/engine.py).

A Qwen3 decoder (per-head q/k norms, grouped-query attention, SwiGLU, RMSNorm) over inputs that
are the sum of two tracks per position (prompt.py lays them out):
  text track   text_projection(text_embedding(id)): a two-layer MLP from the text width into the
               talker's; every prompt position has one (the role and instruct tokens, the text,
               tts_pad / tts_bos / tts_eos)
  codec track  codec_embedding(id) of a control id (think, language, speaker, pad, BOS), or a
               reference frame (its 16 codes' embeddings summed), or the speaker x-vector, or
               nothing (the role and instruct positions)
A decode step's input is the previous frame's 16 code embeddings summed (code 0 through this
table, codes 1-15 through the predictor's tables) plus the text track at that step.

Rope: the reference's interleaved MRoPE (sections from talker_config.rope_scaling) takes three
position components, and for speech they are all the row's own index (its get_rope_index: the
attention mask's cumsum, expanded three times; decode: cache position plus the left-padding
delta). With the three equal, each rotary pair reads the same angle whichever component the
interleave assigns it, so it is plain rope over ``ctx.positions_gpu`` [B, T]; the parity tests
hold it to the reference's logits.

``compute_logits`` returns the codec logits and, after them, the final hidden state: the code
predictor starts each frame from it (design.md section 8), and the engine hands a decode step's
``post`` only what compute_logits returns. ``split_output`` separates the two.

Parameter names equal qwen-tts's Qwen3TTSTalkerForConditionalGeneration under ``talker.``
(``model.layers.N...``, ``model.codec_embedding``, ``model.text_embedding``, ``text_projection``,
``codec_head``, ``code_predictor...``), so its model.safetensors loads as it is.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import AttentionContext
from .blocks import DecoderLayer, RMSNorm, rope_tables
from .config import Qwen3TTSConfig
from .predictor import CodePredictor, PredictorBuffers, Draw, greedy_draw

# codec-track markers in prefill inputs (prompt.py): no codec input, the x-vector, a reference frame
CODEC_NONE, CODEC_SPEAKER, CODEC_FRAME = -1, -2, -3


class TextProjection(nn.Module):
    """The reference's ResizeMLP: fc2(silu(fc1(x))), with biases."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBackbone(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        t = cfg.talker
        self.layers = nn.ModuleList(
            DecoderLayer(t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads,
                         t.head_dim, t.attention_bias, t.rms_norm_eps, i) for i in range(t.num_hidden_layers))
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        self.codec_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        self.text_embedding = nn.Embedding(t.text_vocab_size, t.text_hidden_size)


class Talker(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig, max_seq_len: int):
        super().__init__()
        t = cfg.talker
        self.cfg = cfg
        self.vocab_size, self.hidden_size = t.vocab_size, t.hidden_size
        self.num_streams = t.num_code_groups
        self.model = TalkerBackbone(cfg)
        self.text_projection = TextProjection(t.text_hidden_size, t.hidden_size)
        self.codec_head = nn.Linear(t.hidden_size, t.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.predictor, t.hidden_size)
        self.max_seq_len = max_seq_len
        self.fused = False  # set by to_runtime: decode through runners/qwen3_tts/fused.py
        self._set_rope(torch.device("cpu"))

    def _set_rope(self, device: torch.device) -> None:
        t = self.cfg.talker
        cos, sin = rope_tables(t.rope_theta, t.head_dim, self.max_seq_len, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.code_predictor.set_rope(device)

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> "Talker":
        """Weights to ``dtype`` on ``device``; rope tables stay float32. Where the fused kernels run,
        the talker's and the predictor's q/k/v and gate/up become one weight each."""
        from .. import attention
        from .fused import fuse_layer

        self.to(device=device, dtype=dtype)
        self._set_rope(device)
        if attention.fused_kernels_available(device):
            # last: the fused weights are shared storage, which a later .to() would copy apart
            for layer in [*self.model.layers, *self.code_predictor.model.layers]:
                fuse_layer(layer)
            self.fused = self.code_predictor.fused = True
        return self.eval()

    # ---- the two input tracks ----
    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text ids [...] -> the text track [..., hidden]."""
        return self.text_projection(self.model.text_embedding(ids))

    def frame_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes [..., G] of whole frames -> their G embeddings summed [..., hidden]: code 0 through
        the talker's codec table, code k through the predictor's table k - 1."""
        tables = [self.model.codec_embedding] + list(self.code_predictor.model.codec_embedding)
        parts = [tables[k](codes[..., k]) for k in range(codes.shape[-1])]
        return torch.stack(parts, dim=-2).sum(dim=-2)

    def prompt_embeds(self, input_ids: torch.Tensor, codec_ids: torch.Tensor,
                      prompt_codes: torch.Tensor | None = None,
                      speaker_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill inputs [B, T, hidden]: the text track of input_ids [B, T] plus the codec track of
        codec_ids [B, T] (a codec id, or CODEC_NONE / CODEC_SPEAKER / CODEC_FRAME); prompt_codes
        [B, T, G] hold the frames at CODEC_FRAME positions, speaker_embeds [B, T, hidden] the
        x-vector at CODEC_SPEAKER positions (anything elsewhere)."""
        x = self.text_embed(input_ids)
        codec = self.model.codec_embedding(codec_ids.clamp(min=0))
        codec = torch.where((codec_ids >= 0)[..., None], codec, torch.zeros_like(codec))
        if prompt_codes is not None:
            frames = self.frame_embed(prompt_codes.clamp(min=0))
            codec = torch.where((codec_ids == CODEC_FRAME)[..., None], frames, codec)
        if speaker_embeds is not None:
            codec = torch.where((codec_ids == CODEC_SPEAKER)[..., None], speaker_embeds.to(codec.dtype), codec)
        return x + codec

    def decode_embeds(self, codes: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """A decode step's input [B, 1, hidden]: the previous frame's codes [B, G] embedded and
        summed, plus the text track of text_ids [B] (the trailing text at this step, else tts_pad)."""
        return (self.frame_embed(codes) + self.text_embed(text_ids))[:, None]

    def step_embeds(self, frame_embed: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """decode_embeds from a frame's summed code embeddings [B, hidden] (predict_frame leaves them
        in bufs.frame_embed_gpu) and the step's text ids [B] -> [B, 1, hidden]."""
        return (frame_embed + self.text_embed(text_ids))[:, None]

    # ---- the engine's contract ----
    def forward(self, ctx: AttentionContext, input_ids: torch.Tensor | None = None,
                codec_ids: torch.Tensor | None = None, prompt_codes: torch.Tensor | None = None,
                speaker_embeds: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                frame_embeds: torch.Tensor | None = None, text_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill: input_ids and codec_ids [B, T] (prompt_embeds' tracks; codec_ids left out: no
        codec track, as the memory budget's measurement runs it). Decode: frame_embeds [B, 1, hidden]
        (the previous frame's summed code embeddings) and text_ids [B, 1] (this step's text track),
        embedded here so a decode graph captures the text MLP; or inputs_embeds [B, 1, hidden].
        Returns the final hidden [B, T, hidden]."""
        if self.fused and frame_embeds is not None and ctx.lengths_gpu is not None:
            return self._decode_fused(ctx, frame_embeds[:, 0], text_ids[:, 0])
        if inputs_embeds is None and frame_embeds is not None:
            inputs_embeds = frame_embeds + self.text_embed(text_ids)
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("a talker prefill takes input_ids and codec_ids (or inputs_embeds)")
            if codec_ids is None:
                codec_ids = torch.full_like(input_ids, CODEC_NONE)
            inputs_embeds = self.prompt_embeds(input_ids, codec_ids, prompt_codes, speaker_embeds)
        x = inputs_embeds
        cos = self.rope_cos[ctx.positions_gpu].to(x.dtype)[:, None]  # [B, 1, T, D]
        sin = self.rope_sin[ctx.positions_gpu].to(x.dtype)[:, None]
        for layer in self.model.layers:
            x = layer(x, cos, sin, lambda q, k, v, i=layer.self_attn.layer: ctx.attend(i, q, k, v))
        return self.model.norm(x)

    def _decode_fused(self, ctx: AttentionContext, frame_embed: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """A decode step on the fused kernels: frame_embed [B, hidden], text_ids [B] -> the final
        hidden [B, 1, hidden]."""
        from .fused import StepKV, decode_layers, final_norm, linear

        mode = self._mode(frame_embed.shape[0], ctx.deterministic)
        p = self.text_projection
        text = linear(F.silu(linear(self.model.text_embedding(text_ids), p.linear_fc1, mode, kind="qkv")),
                      p.linear_fc2, mode, kind="qkv")
        kv = StepKV(ctx.kv.k_gpu, ctx.kv.v_gpu, ctx.kv.table_gpu, ctx.slots_gpu, ctx.positions_gpu[:, 0],
                    ctx.lengths_gpu, self.rope_cos, self.rope_sin, cascade=ctx.cascade)
        x, pending = decode_layers(self.model.layers, frame_embed + text, kv, mode)
        return final_norm(x, pending, self.model.norm)[:, None]

    def _mode(self, rows: int, invariant: bool) -> str:
        from .fused import pick_mode

        return pick_mode(rows, invariant, self.cfg.talker.attention_bias)

    def compute_logits(self, hidden: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """hidden [B, H] -> float32 [B, vocab + H]: the codec logits, then the hidden itself (the
        code predictor's input; float32 holds any 16-bit value exactly). invariant: a row's bits
        whatever B (deterministic decode on the fused path)."""
        if self.fused:
            from .fused import linear

            logits = linear(hidden, self.codec_head, self._mode(hidden.shape[0], invariant), torch.float32)
        else:
            logits = self.codec_head(hidden).float()
        return torch.cat([logits, hidden.float()], dim=-1)

    def split_output(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """compute_logits' output -> (logits [B, vocab] float32, hidden [B, H] in the weights' dtype)."""
        dtype = self.codec_head.weight.dtype
        return out[:, : self.vocab_size], out[:, self.vocab_size:].to(dtype)

    def prefill_graph_inputs(self, prompts: list[list[int]]) -> dict | None:
        """Prefills stay eager: their inputs are two tracks (and frames, x-vectors) that the
        prompts' token contents alone do not carry."""
        return None

    # ---- the frame's other 15 codebooks ----
    def new_predictor_buffers(self, rows: int) -> PredictorBuffers:
        p = next(self.code_predictor.parameters())
        return self.code_predictor.new_buffers(rows, p.dtype, p.device)

    def predict_frame(self, hidden: torch.Tensor, code0: torch.Tensor, bufs: PredictorBuffers,
                      draw: Draw, invariant: bool = False) -> torch.Tensor:
        """The rest of a frame: hidden [B, H] (this step's, from split_output) and its drawn code 0
        [B] -> codes [B, G] (bufs.codes_gpu; bufs.frame_embed_gpu holds their summed embeddings,
        the next step's codec input). ``draw(k, logits [B, code_vocab]) -> codes [B]`` samples
        codebook k = 1..G-1. invariant: a row's bits whatever B (deterministic mode's kernels)."""
        return self.code_predictor.run_frame(hidden, code0, self.model.codec_embedding(code0), bufs, draw, invariant)

    @torch.inference_mode()
    def greedy_frame(self, hidden: torch.Tensor, code0: torch.Tensor) -> torch.Tensor:
        """predict_frame with argmax draws and buffers of its own (tests; the reference's
        subtalker_dosample=False): codes [B, G]."""
        bufs = self.new_predictor_buffers(hidden.shape[0])
        return self.predict_frame(hidden, code0, bufs, greedy_draw).clone()
