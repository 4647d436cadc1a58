"""The model runner: one scheduler step in, one ModelRunnerOutput out.

``execute`` is the synchronous pipeline every model family shares:
  1. the engine builds the forward batch (nothing to run -> empty output);
  2. ``before_prefill`` / ``before_decode`` set model inputs and device state;
  3. ``custom_*_forward`` may own the forward; returning None uses the engine's;
  4. if ``sample_before_post`` says so, sample now so the post hook sees tokens;
  5. ``post_prefill`` / ``post_decode``: the model's collect (its one host sync);
  6. ``_finalize``: sample if not done yet, extract per-request outputs, and do
     the per-request step bookkeeping.
Shared logit processing lives here too, after the model's ``process_logits``:
repetition penalty over each request's earlier output, suppress tokens, then
the seeded draw and the logprob of the sampled token.

Rows: a request contributes ``num_streams`` distributions per step (Higgs: 8
codebooks), each over ``vocab_size`` entries. Per-request sampling parameters
live in device tables indexed by KV slot, written once at prefill, so a decode
step gathers them without any host->device traffic beyond the slot indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runners.engine import Engine, ForwardBatch
from runners.sampling import apply_repetition_penalty, apply_suppress_tokens, draw


@dataclass
class RequestOutput:
    tokens: np.ndarray  # [num_streams] int64, as sampled
    logprobs: np.ndarray  # [num_streams] float32, under the distribution drawn from
    finish_reason: str | None  # None while running, else "stop" | "length"


@dataclass
class ModelRunnerOutput:
    outputs: dict[str, RequestOutput]
    req_ids: list[str]
    req_id_to_index: dict[str, int]


@dataclass
class BatchResult:
    logits_gpu: torch.Tensor  # [B, num_streams * vocab] float32, last position of each row
    next_token_ids_gpu: torch.Tensor | None = None  # [B, num_streams]
    logprobs_gpu: torch.Tensor | None = None  # [B, num_streams] float32
    host: np.ndarray | None = None  # the model's collected payload, [B, ...]


class ModelRunner:
    num_streams: int
    vocab_size: int

    def __init__(self, engine: Engine, num_slots: int, max_seq_len: int, device: torch.device):
        self.engine = engine
        self.device = device
        s, c, v = num_slots, self.num_streams, self.vocab_size
        self.temperature_gpu = torch.zeros(s, device=device)
        self.top_k_gpu = torch.zeros(s, dtype=torch.int64, device=device)
        self.top_p_gpu = torch.ones(s, device=device)
        self.penalty_gpu = torch.ones(s, device=device)
        self.seed_gpu = torch.zeros(s, dtype=torch.int64, device=device)
        self.suppress_gpu = torch.zeros(s, v, dtype=torch.bool, device=device)
        # every token sampled so far, per slot and stream; -1 = none yet
        self.history_gpu = torch.full((s, c, max_seq_len), -1, dtype=torch.int64, device=device)

    # ---- hooks (model families override) ---------------------------------
    def before_prefill(self, fb: ForwardBatch, requests) -> None:
        pass

    def before_decode(self, fb: ForwardBatch, requests) -> None:
        pass

    def custom_prefill_forward(self, fb: ForwardBatch, requests) -> torch.Tensor | None:
        return None

    def custom_decode_forward(self, fb: ForwardBatch, requests) -> torch.Tensor | None:
        return None

    def sample_before_post(self, is_prefill: bool) -> bool:
        return False

    def process_logits(self, logits_gpu: torch.Tensor, fb: ForwardBatch, requests) -> torch.Tensor:
        """Model-specific logit processing; returns scores [B, num_streams, vocab]."""
        return logits_gpu.view(fb.batch_size, self.num_streams, self.vocab_size)

    def post_prefill(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        pass

    def post_decode(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        pass

    def collect_outputs(self, result: BatchResult, fb: ForwardBatch, requests) -> list[tuple[np.ndarray, np.ndarray, bool]]:
        """Output processor: per request (tokens [C], logprobs [C], stopped)."""
        raise NotImplementedError

    # ---- the pipeline ----------------------------------------------------
    def execute(self, scheduler_output) -> ModelRunnerOutput:
        fb = self.engine.build_forward_batch(scheduler_output)
        if fb is None:
            return ModelRunnerOutput(outputs={}, req_ids=[], req_id_to_index={})
        requests = scheduler_output.requests
        if fb.is_prefill:
            self._install_requests(fb, requests)
            self.before_prefill(fb, requests)
            logits = self.custom_prefill_forward(fb, requests)
        else:
            self.before_decode(fb, requests)
            logits = self.custom_decode_forward(fb, requests)
        if logits is None:
            logits = self.engine.forward(fb)
        result = BatchResult(logits_gpu=logits)
        if self.sample_before_post(fb.is_prefill):
            self._sample(result, fb, requests)
        if fb.is_prefill:
            self.post_prefill(result, fb, requests)
        else:
            self.post_decode(result, fb, requests)
        return self._finalize(result, fb, requests)

    def _install_requests(self, fb: ForwardBatch, requests) -> None:
        """Write each new request's sampling parameters into its slot's tables."""
        s = fb.slots_gpu
        t = lambda vals, dtype=torch.float32: torch.tensor(vals, dtype=dtype).to(self.device)  # noqa: E731
        self.temperature_gpu[s] = t([r.params.temperature for r in requests])
        self.top_k_gpu[s] = t([r.params.top_k for r in requests], torch.int64)
        self.top_p_gpu[s] = t([r.params.top_p for r in requests])
        self.penalty_gpu[s] = t([r.params.repetition_penalty for r in requests])
        self.seed_gpu[s] = t([r.seed for r in requests], torch.int64)
        suppress = torch.zeros(len(requests), self.vocab_size, dtype=torch.bool)
        for i, r in enumerate(requests):
            suppress[i, list(r.params.suppress_tokens)] = True
        self.suppress_gpu[s] = suppress.to(self.device)
        self.history_gpu[s] = -1

    @torch.inference_mode()
    def _sample(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        scores = self.process_logits(result.logits_gpu, fb, requests)  # [B, C, V]
        b, c, v = scores.shape
        rows = scores.reshape(b * c, v)
        slots = fb.slots_gpu.repeat_interleave(c)
        steps_cpu = [r.generation_steps for r in requests]  # index of the frame being sampled
        if any(r.params.repetition_penalty != 1.0 for r in requests):
            hist = self.history_gpu[fb.slots_gpu, :, : max(max(steps_cpu), 1)].reshape(b * c, -1)
            rows = apply_repetition_penalty(rows, hist, self.penalty_gpu[slots])
        if any(r.params.suppress_tokens for r in requests):
            rows = apply_suppress_tokens(rows, self.suppress_gpu[slots])
        steps_gpu = torch.tensor(steps_cpu, dtype=torch.int64).to(self.device, non_blocking=True)
        # draw position = frame_step * num_streams + stream, as sglang-omni's Higgs runner
        positions = (steps_gpu[:, None] * c + torch.arange(c, device=self.device)[None, :]).reshape(-1)
        tokens, logprobs = draw(rows, self.temperature_gpu[slots], self.top_k_gpu[slots], self.top_p_gpu[slots],
                                self.seed_gpu[slots], positions)
        result.next_token_ids_gpu = tokens.view(b, c)
        result.logprobs_gpu = logprobs.view(b, c)
        self.history_gpu[fb.slots_gpu, :, steps_gpu] = result.next_token_ids_gpu

    def _finalize(self, result: BatchResult, fb: ForwardBatch, requests) -> ModelRunnerOutput:
        if result.next_token_ids_gpu is None:
            self._sample(result, fb, requests)
        collected = self.collect_outputs(result, fb, requests)
        outputs: dict[str, RequestOutput] = {}
        for req, (tokens, logprobs, stopped) in zip(requests, collected):
            req.frames.append(tokens)
            req.logprobs.append(logprobs)
            if stopped:
                reason = "stop"
            elif req.generation_steps >= req.params.max_new_frames:
                reason = "length"
            else:
                reason = None
            outputs[req.rid] = RequestOutput(tokens=tokens, logprobs=logprobs, finish_reason=reason)
        rids = [r.rid for r in requests]
        return ModelRunnerOutput(outputs=outputs, req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)})
