"""Higgs Audio v2 runner hooks: the delay pattern and the stop rule.

Delay pattern (as transformers' HiggsAudioV2DelayPatternLogitsProcessor and
``_sample``): codebook k lags k frames.
- Start ramp: per slot a counter ``bos_delay`` [C] starts at
  delay - (distance of the prompt's <|audio_out_bos|> from its end), i.e.
  [0, 1, ..., 7] for a prompt that ends in it. While a codebook's counter is
  >= 0 it is forced to stream-BOS, then the counter drops by one.
- EOS staircase: ``eos_delay`` [C] starts at [1, ..., 8] (less, if the prompt
  ends in delay tokens). Once any codebook of a row has emitted stream-EOS
  (the reference then feeds the text token ``audio_delay_token_id``), every
  later step lowers the counters by one, and codebooks whose counter is <= 0
  are forced to stream-EOS: codebook 0 first, then 1, ... a staircase.
- Stop: a row ends when all codebooks emit stream-EOS in one frame.
Each step feeds back the previous frame's codes (8 embeddings summed).
"""

from __future__ import annotations

import numpy as np
import torch

from ..attention import fused_kernels_available
from ..base import BatchResult, ModelRunner, StepCollect
from ..device import upload
from ..engine import Engine, ForwardBatch
from .config import HiggsConfig


class HiggsRunner(ModelRunner):
    def __init__(self, engine: Engine, cfg: HiggsConfig, num_slots: int, max_seq_len: int, device: torch.device,
                 raw_logprobs: bool = False):
        self.cfg = cfg
        self.num_streams = cfg.num_codebooks
        self.vocab_size = cfg.codebook_size
        self.ras_excluded_tokens = (cfg.audio_stream_bos_id, cfg.audio_stream_eos_id)
        super().__init__(engine, num_slots, max_seq_len, device, raw_logprobs)
        c, s = cfg.num_codebooks, num_slots + 1  # + the padding rows' slot
        self.last_codes_gpu = torch.zeros(s, c, dtype=torch.int64, device=device)
        self.bos_delay_gpu = torch.zeros(s, c, dtype=torch.int64, device=device)
        self.eos_delay_gpu = torch.zeros(s, c, dtype=torch.int64, device=device)
        self.delay_started_gpu = torch.zeros(s, dtype=torch.bool, device=device)
        cols = torch.arange(cfg.codebook_size, device=device)
        self._not_bos_gpu = cols != cfg.audio_stream_bos_id  # [V]
        self._not_eos_gpu = cols != cfg.audio_stream_eos_id
        self._fused = fused_kernels_available(device)  # the two methods below as one kernel each (fused_step.py)

    def _initial_delays(self, prompt_ids: list[int]) -> tuple[list[int], list[int], bool]:
        """bos_delay, eos_delay and delay_started for a prompt, from its last C tokens."""
        c = self.cfg.num_codebooks
        tail = prompt_ids[-c:]
        delay = list(range(1, c + 1))

        def shifted(token_id: int, absent: list[int]) -> list[int]:
            if token_id not in tail:
                return absent
            after = c - tail.index(token_id)  # reference: delay_pattern_size - first index in the tail
            return [d - after for d in delay]

        bos = shifted(self.cfg.audio_bos_token_id, [0] * c)
        eos = shifted(self.cfg.audio_delay_token_id, delay)
        return bos, eos, prompt_ids[-1] == self.cfg.audio_delay_token_id

    # ---- hooks -----------------------------------------------------------
    def before_prefill(self, fb: ForwardBatch, requests) -> None:
        init = [self._initial_delays(r.prompt_ids) for r in requests]
        s = fb.slots_gpu
        self.bos_delay_gpu[s] = upload([i[0] for i in init], self.device)
        self.eos_delay_gpu[s] = upload([i[1] for i in init], self.device)
        self.delay_started_gpu[s] = upload([i[2] for i in init], self.device)

    def before_decode(self, fb: ForwardBatch, requests) -> None:
        fb.model_inputs["audio_codes"] = self.last_codes_gpu[fb.slots_gpu][:, None, :]  # [B, 1, C]

    def sample_before_post(self, is_prefill: bool) -> bool:
        return True  # the collect below needs this step's codes

    def process_logits(self, logits_gpu: torch.Tensor, fb: ForwardBatch, requests) -> torch.Tensor:
        s = fb.slots_gpu
        if self._fused:
            from .fused_step import delay_masks

            return delay_masks(logits_gpu, s, fb.steps_gpu, self.slot_gpu["min_new_frames"], self.bos_delay_gpu,
                               self.eos_delay_gpu, self.delay_started_gpu, self.cfg.audio_stream_bos_id,
                               self.cfg.audio_stream_eos_id)
        scores = logits_gpu.view(fb.batch_size, self.num_streams, self.vocab_size)
        # no stream-EOS before min_new_frames (the staircase only follows a sampled EOS)
        early = (fb.steps_gpu < self.slot_gpu["min_new_frames"][s])[:, None, None]
        scores = scores.masked_fill(early & ~self._not_eos_gpu, float("-inf"))
        bos = self.bos_delay_gpu[s]
        force_bos = bos >= 0  # [B, C]
        scores = scores.masked_fill(force_bos[..., None] & self._not_bos_gpu, float("-inf"))
        self.bos_delay_gpu[s] = torch.where(force_bos, bos - 1, bos)
        eos = self.eos_delay_gpu[s] - self.delay_started_gpu[s][:, None].to(torch.int64)
        self.eos_delay_gpu[s] = eos
        return scores.masked_fill((eos <= 0)[..., None] & self._not_eos_gpu, float("-inf"))

    def publish(self, result: BatchResult, fb: ForwardBatch) -> torch.Tensor:
        """Device half of the collect: advance the slots' state; return the payload for the host.

        The payload packs codes (exact in float32, < 2^24), logprobs, the stop
        flag [, raw logprobs] -> [B, 2C + 1 (+ C)] float32, one copy per step.
        """
        tokens = result.next_token_ids_gpu  # [B, C]
        s = fb.slots_gpu
        if self._fused:
            from .fused_step import publish

            return publish(tokens, result.logprobs_gpu, result.raw_logprobs_gpu, s, self.last_codes_gpu,
                           self.delay_started_gpu, self.cfg.audio_stream_eos_id)
        self.last_codes_gpu[s] = tokens  # the next step's input stays on the device
        is_eos = tokens == self.cfg.audio_stream_eos_id
        self.delay_started_gpu[s] = self.delay_started_gpu[s] | is_eos.any(dim=-1)
        parts = [tokens.float(), result.logprobs_gpu, is_eos.all(dim=-1).float()[:, None]]
        if result.raw_logprobs_gpu is not None:
            parts.append(result.raw_logprobs_gpu)
        return torch.cat(parts, dim=1)

    def post_prefill(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        result.host = self.publish(result, fb).cpu().numpy()

    def post_prefill_launch(self, result: BatchResult, fb: ForwardBatch, requests) -> torch.Tensor:
        result.payload_gpu = self.publish(result, fb)
        return super().post_prefill_launch(result, fb, requests)

    def post_decode(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        result.host = result.payload_gpu.cpu().numpy()  # published by the decode step

    def post_decode_launch(self, result: BatchResult, fb: ForwardBatch, requests) -> torch.Tensor:
        return self.stage_payload(result, fb)

    def post_decode_resolve(self, launch_buf: torch.Tensor, result: BatchResult, fb: ForwardBatch, requests) -> None:
        self.unstage_payload(launch_buf, result, fb)

    def collect_outputs(self, result: BatchResult, fb: ForwardBatch, requests) -> list[StepCollect]:
        c, h = self.num_streams, result.host
        raw = h.shape[1] > 2 * c + 1
        return [StepCollect(tokens=h[i, :c].astype(np.int64), logprobs=h[i, c: 2 * c].astype(np.float32),
                            raw_logprobs=h[i, 2 * c + 1:].astype(np.float32) if raw else None,
                            stopped=bool(h[i, 2 * c]))
                for i in range(len(requests))]
