"""Qwen3-TTS runner hooks: codebook 0 from the talker, codebooks 1-15 from the code predictor, in
one step (design.md section 8).

A step's device body (a decode step's ``_decode_device``, and the prefill's frame 0), with no
host sync and fixed shapes, so a decode graph captures all of it:
  compute_logits' output -> talker.split_output: logits [B, V] (V: the talker's codec vocabulary,
    codes then control ids) and the last hidden [B, H]
  -> process_logits: every control id but codec EOS masked (the reference's suppress_tokens), and
     codec EOS before max(min_new_frames, the reference's min_new_tokens) frames
  -> the base class's Sampler draws stream 0 only (first=0: position frame x 16): repetition
     penalty over codebook 0's history (greedy too, as transformers' processors), the row's
     suppress_tokens, temperature / top-k / top-p, the seeded draw
  -> talker.predict_frame: 15 predictor sub-steps, sub-step k drawn by a second Sampler at
     first=k (position frame x 16 + k) with the row's subtalker_* values (no penalty, no suppress,
     no RAS, min_p 0: the reference's predictor generate)
  -> publish: the frame's summed code embeddings into frame_embed_gpu[slot] (the next step's
     codec input) and the payload [B, 16 codes | 16 logprobs | stop (| 16 raw logprobs)].
A frame whose code 0 is codec EOS stops its row and is not one of its frames (StepCollect.keep).
before_decode gathers the next input per row (the slot's summed embedding, its trailing text id
at that step); the talker embeds the text inside its forward.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..base import BatchResult, ModelRunner, StepCollect
from ..batch import ForwardBatch
from ..device import upload
from ..engine import Engine
from ..sampling.sampler import SLOT_PARAMS, SampleFlags, Sampler
from .config import GenerationDefaults, Qwen3TTSConfig
from .predictor import PredictorBuffers
from .prompt import TalkerPrompt, prefill_arrays, trailing_table
from .talker import CODEC_NONE

# the predictor's draws: no penalty, no suppress, no RAS (constant, so a graph's key is the talker's flags)
SUB_FLAGS = SampleFlags(penalty=False, suppress=False, ras_window=0, history=0)
# sub-sampler table values no subtalker_* field sets
SUB_NEUTRAL = {"min_p": 0.0, "penalty": 1.0, "ras_win_len": 0, "ras_max_repeat": 2, "min_new_frames": 0,
               "ras_seed": 0}


def sub_defaults(gen: GenerationDefaults) -> tuple[float, int, float]:
    """(temperature, top_k, top_p) of the predictor where a row sets none: generation_config.json's
    (temperature 0 where subtalker_dosample is false)."""
    return (gen.subtalker_temperature if gen.subtalker_dosample else 0.0), gen.subtalker_top_k, gen.subtalker_top_p


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _rows_view(t: torch.Tensor, dim: int, rows: int) -> torch.Tensor:
    """A contiguous tensor of t's shape with ``rows`` at ``dim``, over the start of t's storage: the
    same strides as a fresh buffer of that many rows, so a row's arithmetic never sees the maximum."""
    shape = list(t.shape)
    shape[dim] = rows
    return t.view(-1)[: math.prod(shape)].view(shape)


class Qwen3Runner(ModelRunner):
    def __init__(self, engine: Engine, cfg: Qwen3TTSConfig, gen: GenerationDefaults, num_slots: int,
                 max_seq_len: int, device: torch.device, raw_logprobs: bool = False):
        t = cfg.talker
        self.cfg, self.gen = cfg, gen
        self.num_streams = cfg.num_streams
        self.vocab_size = t.vocab_size  # codebook 0 draws over the talker's whole codec vocabulary
        self.code_vocab = cfg.code_vocab
        self.eos_id = t.codec_eos_token_id
        self.ras_excluded_tokens = (self.eos_id,)
        super().__init__(engine, num_slots, max_seq_len, device, raw_logprobs)
        self.model = engine.model
        self.max_seq_len = max_seq_len
        self.sub_defaults = sub_defaults(gen)
        # streams 1..15; its own history would never be read (no penalty, no RAS): it writes into the
        # main table's streams 1..15, which the main sampler (stream 0 only) leaves alone
        self.sub_sampler = Sampler(num_slots, self.num_streams, self.code_vocab, 1, device,
                                   raw_logprobs=raw_logprobs, invariant=engine.deterministic)
        self.sub_sampler.history_gpu = self.sampler.history_gpu
        s, dtype = num_slots + 1, self.model.codec_head.weight.dtype
        self.frame_embed_gpu = torch.zeros(s, t.hidden_size, dtype=dtype, device=device)  # the next step's codec input
        self.trailing_gpu = torch.full((s, max_seq_len), cfg.tts_pad_token_id, dtype=torch.int64, device=device)
        banned = torch.zeros(self.vocab_size, dtype=torch.bool)
        banned[list(cfg.suppressed_ids())] = True
        self._banned_gpu = banned.to(device)  # [V]
        self._eos_col_gpu = (torch.arange(self.vocab_size) == self.eos_id).to(device)  # [V]
        # one set of predictor buffers at the widest batch a step runs (a graph bucket); steps take views
        self._predictor = self.model.new_predictor_buffers(_next_pow2(num_slots))
        self._views: dict[int, PredictorBuffers] = {}

    # ---- per-step pieces -------------------------------------------------
    def _buffers(self, rows: int) -> PredictorBuffers:
        if rows not in self._views:
            m = self._predictor
            if rows > m.rows:
                raise ValueError(f"a step of {rows} rows over predictor buffers of {m.rows}")
            self._views[rows] = m.view(rows, _rows_view)
        return self._views[rows]

    def process_logits(self, logits_gpu: torch.Tensor, fb: ForwardBatch, requests) -> torch.Tensor:
        """logits [B, V] -> scores [B, 1, V]: control ids but codec EOS never; codec EOS not before
        max(min_new_frames, min_new_tokens) frames (the reference's MinNewTokensLength)."""
        least = self.slot_gpu["min_new_frames"][fb.slots_gpu].clamp(min=self.gen.min_new_tokens)
        early = (fb.steps_gpu < least)[:, None]  # [B, 1]
        scores = logits_gpu.masked_fill(self._banned_gpu, float("-inf"))
        return scores.masked_fill(early & self._eos_col_gpu, float("-inf"))[:, None]

    def _frame(self, fb: ForwardBatch, out_gpu: torch.Tensor, flags: SampleFlags) -> dict[str, torch.Tensor]:
        """One frame of fb's rows from compute_logits' output [B, V + H]: tokens [B, 16], logprobs
        [B, 16] (raw [B, 16]) and the payload; writes the slots' next input."""
        logits, hidden = self.model.split_output(out_gpu)
        slots, steps = fb.slots_gpu, fb.steps_gpu
        first = self.sampler.sample(self.process_logits(logits, fb, None), logits, slots, steps, flags)
        logprobs = [first.logprobs[:, 0]]
        raws = None if first.raw is None else [first.raw[:, 0]]

        def draw(k: int, sub_logits: torch.Tensor) -> torch.Tensor:  # [B, code vocab] -> codes [B]
            got = self.sub_sampler.sample(sub_logits[:, None], sub_logits, slots, steps, SUB_FLAGS, first=k)
            logprobs.append(got.logprobs[:, 0])
            if raws is not None:
                raws.append(got.raw[:, 0])
            return got.tokens[:, 0]

        bufs = self._buffers(fb.batch_size)
        codes = self.model.predict_frame(hidden, first.tokens[:, 0], bufs, draw, self.engine.deterministic).clone()
        self.frame_embed_gpu[slots] = bufs.frame_embed_gpu
        lp = torch.stack(logprobs, dim=1)
        parts = [codes.float(), lp, (codes[:, :1] == self.eos_id).float()]  # codes exact in float32 (< 2^24)
        outs = {"tokens": codes, "logprobs": lp}
        if raws is not None:
            outs["raw"] = torch.stack(raws, dim=1)
            parts.append(outs["raw"])
        outs["payload"] = torch.cat(parts, dim=1)
        return outs

    def _decode_device(self, fb: ForwardBatch, logits_gpu: torch.Tensor, flags: SampleFlags) -> dict[str, torch.Tensor]:
        return self._frame(fb, logits_gpu, flags)

    @torch.inference_mode()
    def _sample(self, result: BatchResult, fb: ForwardBatch, requests, flags: SampleFlags | None = None) -> None:
        """The prefill's frame 0 (the base class samples a prefill here). In deterministic mode with
        fixed decode rows (the CPU) the frame runs in chunks of that many rows, as decode steps do,
        so a row's frame 0 does not depend on the prefill's batch."""
        flags = flags or self.sampler.flags(requests, fb.steps_cpu)
        shapes = self.engine.fixed_shapes
        rows = shapes.decode_rows if shapes is not None and shapes.decode_rows else fb.batch_size
        n = fb.batch_size
        parts = [self._frame(*self._chunk(fb, result.logits_gpu, i, rows), flags) for i in range(0, n, rows)]
        outs = {k: torch.cat([p[k] for p in parts])[:n] for k in parts[0]}
        result.next_token_ids_gpu, result.logprobs_gpu = outs["tokens"], outs["logprobs"]
        result.raw_logprobs_gpu, result.payload_gpu = outs.get("raw"), outs["payload"]

    def _chunk(self, fb: ForwardBatch, out_gpu: torch.Tensor, start: int, rows: int):
        """Rows start..start+rows-1 of a prefill as a batch of exactly ``rows`` (padding rows on the
        spare slot, at step 0, with zero logits)."""
        part = fb.rows(start, start + rows)
        pad = rows - part.batch_size
        if not pad:
            return part, out_gpu[start: start + rows]
        dev = out_gpu.device
        slots = torch.cat([part.slots_gpu, torch.full((pad,), self.num_slots, dtype=torch.int64, device=dev)])
        steps = torch.cat([part.steps_gpu, torch.zeros(pad, dtype=torch.int64, device=dev)])
        padded = ForwardBatch(is_prefill=True, rids=part.rids + [""] * pad, slots_gpu=slots, lengths_cpu=[],
                              steps_cpu=[], steps_gpu=steps, positions_gpu=part.positions_gpu)
        return padded, torch.cat([out_gpu[start: start + rows], out_gpu.new_zeros(pad, out_gpu.shape[1])])

    # ---- hooks -----------------------------------------------------------
    def before_prefill(self, fb: ForwardBatch, requests) -> None:
        """The prompts' codec track (and x-vectors) as per-position inputs; the slots' trailing text
        and predictor sampling tables."""
        prompts = [self._talker_prompt(r.prompt) for r in requests]
        t = fb.model_inputs["input_ids"].shape[1]
        arrays = prefill_arrays(prompts, t, self.num_streams, self.model.hidden_size)
        fb.model_inputs["codec_ids"] = upload(arrays["codec_ids"], self.device)
        if "speaker_embeds" in arrays:
            fb.model_inputs["speaker_embeds"] = upload(arrays["speaker_embeds"], self.device)
        s = fb.slots_gpu
        self.trailing_gpu.index_fill_(0, s, self.cfg.tts_pad_token_id)  # no scalar copy: Sampler.install says why
        width = min(max(len(p.trailing_ids) for p in prompts), self.max_seq_len)
        if width:
            self.trailing_gpu[s, :width] = upload(trailing_table(prompts, width), self.device)
        self._install_sub(s, requests)

    def _install_sub(self, slots_gpu: torch.Tensor, requests) -> None:
        temp, top_k, top_p = self.sub_defaults
        pick = lambda v, d: d if v is None else v  # noqa: E731
        given = {"temperature": [pick(r.params.subtalker_temperature, temp) for r in requests],
                 "top_k": [pick(r.params.subtalker_top_k, top_k) for r in requests],
                 "top_p": [pick(r.params.subtalker_top_p, top_p) for r in requests],
                 "seed": [r.seed for r in requests]}
        for name, (dtype, _) in SLOT_PARAMS.items():
            values = given[name] if name in given else [SUB_NEUTRAL[name]] * len(requests)
            self.sub_sampler.slot_gpu[name][slots_gpu] = upload(values, self.device, dtype)
        self.sub_sampler.suppress_gpu.index_fill_(0, slots_gpu, False)

    def before_decode(self, fb: ForwardBatch, requests) -> None:
        """Step s feeds frame s-1's summed embeddings and the trailing text id of decode step s-1."""
        s = fb.slots_gpu
        fb.model_inputs["frame_embeds"] = self.frame_embed_gpu[s][:, None]  # [B, 1, H]
        fb.model_inputs["text_ids"] = self.trailing_gpu[s, (fb.steps_gpu - 1).clamp(min=0)][:, None]  # [B, 1]

    def sample_before_post(self, is_prefill: bool) -> bool:
        return True  # the prefill's frame 0 is whole before its collect

    def post_prefill(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        result.host = result.payload_gpu.cpu().numpy()

    def post_decode(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        result.host = result.payload_gpu.cpu().numpy()

    def post_decode_launch(self, result: BatchResult, fb: ForwardBatch, requests) -> torch.Tensor:
        return self.stage_payload(result, fb)

    def post_decode_resolve(self, launch_buf: torch.Tensor, result: BatchResult, fb: ForwardBatch, requests) -> None:
        self.unstage_payload(launch_buf, result, fb)

    def _talker_prompt(self, prompt) -> TalkerPrompt:
        """A request's TalkerPrompt; a prompt of ids alone (a warm-up's) as a text-only one."""
        if isinstance(prompt.extra, TalkerPrompt):
            return prompt.extra
        ids = np.asarray(prompt.ids, dtype=np.int64)
        return TalkerPrompt(text_ids=ids, codec_ids=np.full(len(ids), CODEC_NONE, dtype=np.int64),
                            trailing_ids=np.zeros(0, dtype=np.int64), tts_pad_id=self.cfg.tts_pad_token_id)

    def collect_outputs(self, result: BatchResult, fb: ForwardBatch, requests) -> list[StepCollect]:
        c, h = self.num_streams, result.host
        raw = h.shape[1] > 2 * c + 1
        out = []
        for i in range(len(requests)):
            stopped = bool(h[i, 2 * c])
            out.append(StepCollect(tokens=h[i, :c].astype(np.int64), logprobs=h[i, c: 2 * c].astype(np.float32),
                                   raw_logprobs=h[i, 2 * c + 1:].astype(np.float32) if raw else None,
                                   stopped=stopped, keep=not stopped))
        return out


def predictor_row_bytes(cfg: Qwen3TTSConfig, dtype: torch.dtype) -> int:
    """Device bytes a row of predictor buffers takes (PredictorBuffers)."""
    p, g, h = cfg.predictor, cfg.num_streams, cfg.talker.hidden_size
    size = torch.finfo(dtype).bits // 8
    return 2 * p.num_hidden_layers * p.num_key_value_heads * g * p.head_dim * size + (g + 1) * h * size + g * 8


def slot_extra_bytes(cfg: Qwen3TTSConfig, max_seq_len: int, dtype: torch.dtype) -> int:
    """Per-slot device bytes beside the talker's KV: predictor rows (twice: rounded up to a power of
    two), the next-input table, the trailing text table, the sub-sampler's tables."""
    size = torch.finfo(dtype).bits // 8
    return (2 * predictor_row_bytes(cfg, dtype) + cfg.talker.hidden_size * size + 8 * max_seq_len
            + cfg.code_vocab + 8 * len(SLOT_PARAMS))
