"""The code predictor: codebooks 1..G-1 of a frame, from the talker's hidden and code 0.

The reference calls the predictor's own ``generate`` once a frame: a 2-position prefill
[talker hidden, embedding of code 0] (both through ``small_to_mtp_projection``, a Linear where
the talker is wider, identity where not), whose last position's ``lm_head[0]`` scores code 1;
then code k (k >= 1) is fed at position k + 1 through ``codec_embedding[k - 1]`` and
``lm_head[k]`` scores code k + 1. Code G-1 is never fed. Its rope is plain, positions 0..G-1.

Here a frame is ``run_frame`` over a fixed batch of rows: the predictor's short KV lives in
static buffers (``PredictorBuffers``, one set per row bucket) that every frame rewrites from
position 0, and each sub-step hands its logits to a ``draw`` callback, so the engine's sampler
draws codebook k where a full draw would (position frame x G + k). The loop is unrolled in
Python over fixed shapes with no host sync, so the talker step and its G - 1 sub-steps can be
captured as one CUDA graph. ``greedy_draw`` is the reference's subtalker_dosample=False.

Parameter names equal qwen-tts's under ``talker.code_predictor.``: ``model.layers.N...``,
``model.norm``, ``model.codec_embedding.{0..G-2}`` (in the talker's width), ``lm_head.{0..G-2}``,
``small_to_mtp_projection`` (only where the widths differ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from .blocks import DecoderLayer, RMSNorm, gqa_sdpa, rope_tables
from .config import PredictorConfig

# draw(k, logits [B, vocab] float32) -> codes [B] int64: samples codebook k (1..G-1) of the frame
Draw = Callable[[int, torch.Tensor], torch.Tensor]


def greedy_draw(k: int, logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


@dataclass
class PredictorBuffers:
    """A row bucket's static per-frame state, rewritten from position 0 every frame."""

    rows: int
    k_gpu: torch.Tensor  # [layers, rows, kv_heads, G, head_dim]
    v_gpu: torch.Tensor
    codes_gpu: torch.Tensor  # [rows, G] int64: the frame's codes, code 0 first
    embeds_gpu: torch.Tensor  # [rows, G, talker hidden]: each code's input embedding
    frame_embed_gpu: torch.Tensor  # [rows, talker hidden]: their sum (the next talker step's codec input)
    # the fused path's attention indices (constants): a sub-step's row r is slot r at position p
    slots_gpu: torch.Tensor  # [rows] int64: 0..rows-1
    table_gpu: torch.Tensor  # [rows, 1] int32: r (row r's keys are one block of G positions)
    positions_gpu: torch.Tensor  # [G, rows] int64: p
    lengths_gpu: torch.Tensor  # [G, rows] int64: p + 1
    # the frame's first forward, two tokens a row (the talker's hidden, code 0): [2 rows] int64
    first_slots_gpu: torch.Tensor  # r, r
    first_positions_gpu: torch.Tensor  # 0, 1
    first_lengths_gpu: torch.Tensor  # 1, 2

    def view(self, rows: int, take) -> "PredictorBuffers":
        """The buffers of the first ``rows`` rows: take(tensor, dim, rows) for the per-row state,
        prefixes of the index tables (they hold the same values at any width)."""
        return PredictorBuffers(
            rows=rows, k_gpu=take(self.k_gpu, 1, rows), v_gpu=take(self.v_gpu, 1, rows),
            codes_gpu=take(self.codes_gpu, 0, rows), embeds_gpu=take(self.embeds_gpu, 0, rows),
            frame_embed_gpu=take(self.frame_embed_gpu, 0, rows), slots_gpu=self.slots_gpu[:rows],
            table_gpu=self.table_gpu[:rows],
            positions_gpu=self.positions_gpu[:, :rows], lengths_gpu=self.lengths_gpu[:, :rows],
            first_slots_gpu=self.first_slots_gpu[: 2 * rows], first_positions_gpu=self.first_positions_gpu[: 2 * rows],
            first_lengths_gpu=self.first_lengths_gpu[: 2 * rows])


class PredictorModel(nn.Module):
    def __init__(self, cfg: PredictorConfig, talker_hidden: int):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.attention_bias, cfg.rms_norm_eps, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden)
                                             for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: PredictorConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.groups = cfg.num_code_groups
        self.talker_hidden = talker_hidden
        self.model = PredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                                     for _ in range(cfg.num_code_groups - 1))
        # the reference makes it a Linear only where the widths differ (no parameters otherwise)
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
                                        if cfg.hidden_size != talker_hidden else nn.Identity())
        self.fused = False  # set by Talker.to_runtime: frames through runners/qwen3_tts/fused.py
        self.set_rope(torch.device("cpu"))

    def set_rope(self, device: torch.device) -> None:
        cos, sin = rope_tables(self.cfg.rope_theta, self.cfg.head_dim, self.groups, device)
        self.register_buffer("rope_cos", cos, persistent=False)  # [G, D] float32
        self.register_buffer("rope_sin", sin, persistent=False)

    def new_buffers(self, rows: int, dtype: torch.dtype, device: torch.device) -> PredictorBuffers:
        c = self.cfg
        kv = (c.num_hidden_layers, rows, c.num_key_value_heads, self.groups, c.head_dim)
        positions = torch.arange(self.groups)[:, None].expand(self.groups, rows)
        return PredictorBuffers(
            rows=rows, k_gpu=torch.zeros(kv, dtype=dtype, device=device),
            v_gpu=torch.zeros(kv, dtype=dtype, device=device),
            codes_gpu=torch.zeros((rows, self.groups), dtype=torch.int64, device=device),
            embeds_gpu=torch.zeros((rows, self.groups, self.talker_hidden), dtype=dtype, device=device),
            frame_embed_gpu=torch.zeros((rows, self.talker_hidden), dtype=dtype, device=device),
            slots_gpu=torch.arange(rows, device=device), positions_gpu=positions.contiguous().to(device),
            table_gpu=torch.arange(rows, dtype=torch.int32, device=device)[:, None],
            lengths_gpu=(positions + 1).contiguous().to(device),
            first_slots_gpu=torch.arange(rows).repeat_interleave(2).to(device),
            first_positions_gpu=torch.tensor([0, 1]).repeat(rows).to(device),
            first_lengths_gpu=torch.tensor([1, 2]).repeat(rows).to(device))

    def _forward(self, x: torch.Tensor, start: int, bufs: PredictorBuffers) -> torch.Tensor:
        """x [B, T, talker hidden] fed at positions start..start+T-1 (their K/V written into bufs,
        attending to positions 0..start+T-1) -> the last position's codebook logits [B, vocab]
        float32 from lm_head[start + T - 2] (the head runs over all T positions, as the reference's)."""
        t = x.shape[1]
        end = start + t
        x = self.small_to_mtp_projection(x)
        cos = self.rope_cos[start:end].to(x.dtype)[None, None]  # [1, 1, T, D]
        sin = self.rope_sin[start:end].to(x.dtype)[None, None]
        for layer in self.model.layers:
            i = layer.self_attn.layer

            def attend(q, k, v, i=i):
                bufs.k_gpu[i, :, :, start:end] = k
                bufs.v_gpu[i, :, :, start:end] = v
                keys, values = bufs.k_gpu[i, :, :, :end], bufs.v_gpu[i, :, :, :end]
                # a prefill attends causally among its own positions; one position sees all before it
                return gqa_sdpa(q, keys, values, causal=t > 1)

            x = layer(x, cos, sin, attend)
        return self.lm_head[start + t - 2](self.model.norm(x))[:, -1].float()

    def _forward_fused(self, x: torch.Tensor, start: int, bufs: PredictorBuffers, invariant: bool) -> torch.Tensor:
        """_forward on the fused kernels (runners/qwen3_tts/fused.py): x [B, T, talker hidden] with
        T = 2 at start 0 (the frame's first forward, two tokens a row) or T = 1 -> [B, vocab] float32."""
        from .fused import StepKV, decode_layers, final_norm, linear, pick_mode

        b, t, _ = x.shape
        if t == 2:
            idx = (bufs.first_slots_gpu, bufs.first_positions_gpu, bufs.first_lengths_gpu)
        else:
            idx = (bufs.slots_gpu, bufs.positions_gpu[start], bufs.lengths_gpu[start])
        x, proj = x.reshape(b * t, -1), self.small_to_mtp_projection
        if isinstance(proj, nn.Linear):  # the 1.7B talker's width into the predictor's
            x = linear(x, proj, pick_mode(b * t, invariant, True), kind="qkv")
        mode = pick_mode(b * t, invariant, self.cfg.attention_bias)
        # NOTE: the first forward's two tokens a row are two programs of one launch, and the second reads
        # the first's keys: there short_attention would race (its keys come from the cache), so two kernels
        kv = StepKV(bufs.k_gpu, bufs.v_gpu, bufs.table_gpu, *idx, self.rope_cos, self.rope_sin,
                    max_keys=0 if t == 2 else self.groups)
        x, pending = decode_layers(self.model.layers, x, kv, mode)
        head = self.lm_head[start + t - 2]
        if t == 2:  # the head reads the last token of each row only
            return linear(final_norm(x, pending, self.model.norm).view(b, t, -1)[:, -1], head,
                          pick_mode(b, invariant, False), torch.float32)
        if pending is None:  # the one-row GEMVs: the norm inside the head's
            return linear(x, head, mode, torch.float32, norm=self.model.norm)
        return linear(final_norm(x, pending, self.model.norm), head, mode, torch.float32)

    def run_frame(self, hidden: torch.Tensor, code0: torch.Tensor, code0_embed: torch.Tensor,
                  bufs: PredictorBuffers, draw: Draw, invariant: bool = False) -> torch.Tensor:
        """hidden [B, talker hidden] (the talker's final hidden at this step), code0 [B] and its
        talker embedding [B, talker hidden], B == bufs.rows -> codes [B, G] (bufs.codes_gpu, code 0
        first); bufs.frame_embed_gpu gets the G embeddings' sum. No host sync, fixed shapes.
        invariant: a row's bits whatever B (the fused path's deterministic kernels)."""
        if hidden.shape[0] != bufs.rows:
            raise ValueError(f"{hidden.shape[0]} rows for predictor buffers of {bufs.rows}")
        forward = (lambda x, start: self._forward_fused(x, start, bufs, invariant)) if self.fused \
            else (lambda x, start: self._forward(x, start, bufs))
        codes, embeds = bufs.codes_gpu, bufs.embeds_gpu
        codes[:, 0] = code0
        embeds[:, 0] = code0_embed
        logits = forward(torch.stack([hidden.to(embeds.dtype), code0_embed], dim=1), 0)
        for k in range(1, self.groups):
            code = draw(k, logits)
            if self.fused:
                from ..fused_ops import embed_into

                embed_into(code, self.model.codec_embedding[k - 1].weight, embeds[:, k], codes[:, k])
            else:
                codes[:, k] = code
                embeds[:, k] = self.model.codec_embedding[k - 1](code)
            if k + 1 < self.groups:  # the last code is never fed
                logits = forward(embeds[:, k: k + 1], k + 1)
        if self.fused:
            from ..fused_ops import sum_middle

            sum_middle(embeds, bufs.frame_embed_gpu)
        else:
            torch.sum(embeds, dim=1, out=bufs.frame_embed_gpu)
        return codes
