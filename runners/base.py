"""The model runner: one scheduler step in, one ModelRunnerOutput out.

Two ways to run a decode step: ``execute`` (synchronous) and the one-step
lookahead ``execute_launch`` / ``execute_resolve`` (async decode; see below).

``execute`` is the synchronous pipeline every model family shares:
  1. the engine builds the forward batch (nothing to run -> empty output);
  2. ``before_prefill`` / ``before_decode`` set model inputs and device state;
  3. ``custom_*_forward`` may own the forward; returning None uses the engine's;
  4. sample (a prefill only if ``sample_before_post`` says so; a decode step
     always) and, for a decode step, ``publish`` the step on the device;
  5. ``post_prefill`` / ``post_decode``: the model's collect (its one host sync);
  6. ``_finalize``: sample if not done yet, extract per-request outputs, and do
     the per-request step bookkeeping.
A decode step's device work (3-4: forward, logit processing, the draw and
the publish) is one body, ``_decode_device``, which the engine runs inside
the step's CUDA graph where it captures graphs: no kernel of it is launched
from Python then. Host-side choices the body makes (which processors run,
the RAS window) come from the requests as a SampleFlags and key the graph.
Shared logit processing and the draw, after the model's ``process_logits``,
are the Sampler's (runners/sampling/sampler.py): repetition penalty over each
request's earlier output, suppress tokens, then the seeded draw and the
logprob of the sampled token. The runner holds one, ``self.sampler``.

Async decode: ``execute_launch`` enqueues a decode step (forward, sampling,
the model's device-side publish in ``post_decode_launch``, which also starts
the copy of what the host needs into pinned staging) and records an event;
the caller holds the returned _PendingStep and, after launching the next
step, passes it to ``execute_resolve``, which counts an event-query hit or
waits (a miss), lets ``post_decode_resolve`` read the staging, and finalizes.
Host staging alternates between two buffers: resolve(N) reads one while
launch(N+1)'s copy fills the other (one stream orders device work, but not a
CPU read against a later device write). Requests that finished while a step
was in flight get nothing from it: their rows are dropped.

A launched prefill (a refill behind the decode step beside it, omni_cli/scheduler.py:
``beside``, or a first wave's alone): ``execute_prefill_launch`` enqueues it
(forward, the draw of frame 0, ``post_prefill_launch``'s publish and copy
into a staging pair of its own) and returns a _PendingStep that
``execute_resolve`` consumes like a decode step's. Its rows' slots are not
the decode step's, so the two never touch each other's device state.

Rows: a request contributes ``num_streams`` distributions per step (Higgs: 8
codebooks), each over ``vocab_size`` entries; the sampler's per-slot tables
hold each request's sampling parameters (sampler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .device import host_buffer, new_event
from .engine import Engine, ForwardBatch
from .sampling.sampler import SampleFlags, Sampler
from .step_trace import StepTrace


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
    raw_logprobs_gpu: torch.Tensor | None = None  # [B, num_streams]: unprocessed model logprobs
    payload_gpu: torch.Tensor | None = None  # what ``publish`` made of a decode step for the host, [B, ...]
    host: np.ndarray | None = None  # the model's collected payload, [B, ...]


@dataclass
class StepCollect:
    """One request's share of a step, on the host."""

    tokens: np.ndarray  # [num_streams] int64
    logprobs: np.ndarray  # [num_streams] float32
    raw_logprobs: np.ndarray | None  # [num_streams] float32, with --raw-logprobs
    stopped: bool
    keep: bool = True  # False: the stop frame is not one of the row's frames (Qwen3-TTS's codec EOS)


@dataclass
class _PendingStep:
    """A decode step or a prefill launched on the device and not yet consumed on the host."""

    event: object  # recorded right after post_decode_launch published the step
    launch_buf: object  # what post_decode_launch returned: host staging or a device snapshot
    host_staged: bool  # launch_buf is one of the host staging buffers (its copy overlaps the next forward)
    scheduler_output: object
    forward_batch: ForwardBatch
    batch_result: BatchResult
    n_real: int  # rows that are real requests


class ModelRunner:
    num_streams: int
    vocab_size: int
    ras_excluded_tokens: tuple[int, ...] = ()  # never counted as repeats (stream BOS/EOS)

    def __init__(self, engine: Engine, num_slots: int, max_seq_len: int, device: torch.device,
                 raw_logprobs: bool = False):
        self.engine = engine
        self.device = device
        self.num_slots = num_slots
        # the per-slot sampling state and the draw (one Triton kernel on CUDA, PyTorch elsewhere)
        self.sampler = Sampler(num_slots, self.num_streams, self.vocab_size, max_seq_len, device,
                               ras_excluded_tokens=self.ras_excluded_tokens, raw_logprobs=raw_logprobs,
                               invariant=engine.deterministic)
        # async decode: two host staging buffers in ping-pong, and the counters
        # ping-pong pairs: "decode" (resolve(N) reads one while launch(N+1) fills the other) and
        # "prefill" (a launched prefill; two may be in flight, as for decode steps)
        self._host_staging: dict[str, list[torch.Tensor]] = {}
        self._staging_slot = {"decode": 0, "prefill": 0}
        self.async_query_hit = 0
        self.async_query_miss = 0
        self.step_trace = StepTrace.from_env(device)  # None unless OMNI_TRACE_STEPS (runners/step_trace.py)

    @property
    def kv_blocks(self):
        """The paged cache's block pool (runners/kv_blocks.py): the scheduler admits rows through it;
        None where the engine keeps one block a slot."""
        return self.engine.blocks

    # the sampler's state, as model families read it (e.g. Higgs' min_new_frames table)
    @property
    def slot_gpu(self) -> dict[str, torch.Tensor]:
        return self.sampler.slot_gpu

    @property
    def suppress_gpu(self) -> torch.Tensor:
        return self.sampler.suppress_gpu

    @property
    def history_gpu(self) -> torch.Tensor:
        return self.sampler.history_gpu

    @property
    def raw_logprobs(self) -> bool:
        return self.sampler.raw_logprobs

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

    def publish(self, result: BatchResult, fb: ForwardBatch) -> torch.Tensor | None:
        """Device half of a decode step's collect, after sampling: advance model state on the
        device and return the payload the host reads (part of the step's CUDA graph)."""
        return None

    def process_logits(self, logits_gpu: torch.Tensor, fb: ForwardBatch, requests) -> torch.Tensor:
        """Model-specific logit processing; returns scores [B, num_streams, vocab]."""
        return logits_gpu.view(fb.batch_size, self.num_streams, self.vocab_size)

    def post_prefill(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        pass

    def post_decode(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        pass

    def collect_outputs(self, result: BatchResult, fb: ForwardBatch, requests) -> list[StepCollect]:
        """Output processor: per request, this step's collected values."""
        raise NotImplementedError

    def lookahead_eligible(self, scheduler_output) -> bool:
        """False sends a decode batch down the synchronous path (its collect needs host-side history)."""
        return True

    def post_decode_launch(self, result: BatchResult, fb: ForwardBatch, requests):
        """Device half of post_decode: publish the step; return what resolve will read."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support async decode: it needs post_decode_launch and "
            "post_decode_resolve (its synchronous post_decode reads buffers the next launch overwrites)"
        )

    def post_decode_resolve(self, launch_buf, result: BatchResult, fb: ForwardBatch, requests) -> None:
        """Host half of post_decode: read ``launch_buf`` into ``result.host``."""
        raise NotImplementedError(f"{type(self).__name__} does not support async decode")

    def post_prefill_launch(self, result: BatchResult, fb: ForwardBatch, requests):
        """A launched prefill's post_prefill, device half (after the draw): start the copy of frame 0's
        payload (``result.payload_gpu``; a family whose publish makes it sets it first) to the host;
        return what resolve reads."""
        return self.stage_payload(result, fb, "prefill")

    def post_prefill_resolve(self, launch_buf, result: BatchResult, fb: ForwardBatch, requests) -> None:
        """Host half: ``launch_buf`` into ``result.host``."""
        self.unstage_payload(launch_buf, result, fb)

    def stage_payload(self, result: BatchResult, fb: ForwardBatch, pair: str = "decode") -> torch.Tensor:
        """post_decode_launch for a family whose publish packs the host's share in one payload
        [B, n]: its non-blocking copy into the pair's next host staging buffer, which is returned."""
        payload = result.payload_gpu
        staging = self.next_host_staging((self.num_slots, payload.shape[1]), payload.dtype, pair)
        staging[: fb.batch_size].copy_(payload, non_blocking=True)
        return staging

    def unstage_payload(self, launch_buf: torch.Tensor, result: BatchResult, fb: ForwardBatch) -> None:
        """post_decode_resolve's twin of stage_payload: the rows copied out (the buffer is refilled by
        the launch after next) into ``result.host``."""
        result.host = launch_buf[: fb.batch_size].numpy().copy()

    def next_host_staging(self, shape: tuple[int, ...], dtype: torch.dtype, pair: str = "decode") -> torch.Tensor:
        """One of the pair's two host staging buffers, alternating per call (allocated on first use)."""
        if pair not in self._host_staging:
            self._host_staging[pair] = [host_buffer(shape, dtype, self.device) for _ in range(2)]
        buf = self._host_staging[pair][self._staging_slot[pair]]
        self._staging_slot[pair] ^= 1
        return buf

    # ---- the pipeline ----------------------------------------------------
    def execute(self, scheduler_output) -> ModelRunnerOutput:
        if self.step_trace is not None:
            self.step_trace.gap_break()
        fb = self.engine.build_forward_batch(scheduler_output)
        if fb is None:
            return ModelRunnerOutput(outputs={}, req_ids=[], req_id_to_index={})
        requests = scheduler_output.requests
        if fb.is_prefill:
            result = self._prefill_forward(fb, requests)
            if self.sample_before_post(True):
                self._sample(result, fb, requests)
            self.post_prefill(result, fb, requests)
        else:
            result = self._decode_step(fb, requests)
            self.post_decode(result, fb, requests)
        return self._finalize(result, fb, requests)

    def _prefill_forward(self, fb: ForwardBatch, requests) -> BatchResult:
        """A prefill's new rows installed (sampling tables, the family's state) and its forward enqueued."""
        self.sampler.install(fb.slots_gpu, requests)
        self.before_prefill(fb, requests)
        logits = self.custom_prefill_forward(fb, requests)
        return BatchResult(logits_gpu=self.engine.forward(fb) if logits is None else logits)

    def _decode_step(self, fb: ForwardBatch, requests) -> BatchResult:
        """Enqueue a decode step's device work: forward, sampling, publish (one graph where captured)."""
        self.before_decode(fb, requests)
        logits = self.custom_decode_forward(fb, requests)
        graphed = self.engine.captures_graphs()
        flags = self.sampler.flags(requests, fb.steps_cpu, graphed)
        post = lambda sfb, logits_gpu: self._decode_device(sfb, logits_gpu, flags)  # noqa: E731
        outs = post(fb, logits) if logits is not None else self.engine.forward(fb, post=post, post_key=flags)
        return BatchResult(logits_gpu=None, next_token_ids_gpu=outs["tokens"], logprobs_gpu=outs["logprobs"],
                           raw_logprobs_gpu=outs.get("raw"), payload_gpu=outs.get("payload"))

    def _decode_device(self, fb: ForwardBatch, logits_gpu: torch.Tensor, flags: SampleFlags) -> dict[str, torch.Tensor]:
        """The device half of a decode step after the forward. Inside a graph ``fb`` is the
        graph's static batch: only its device tensors and batch_size may be read."""
        result = BatchResult(logits_gpu=logits_gpu)
        self._sample(result, fb, None, flags)
        outs = {"tokens": result.next_token_ids_gpu, "logprobs": result.logprobs_gpu}
        if result.raw_logprobs_gpu is not None:
            outs["raw"] = result.raw_logprobs_gpu
        payload = self.publish(result, fb)
        if payload is not None:
            outs["payload"] = payload
        return outs

    def execute_launch(self, scheduler_output) -> _PendingStep | None:
        """Enqueue a decode step and return its pending record; does not wait for the device."""
        fb = self.engine.build_forward_batch(scheduler_output)
        if fb is None:
            return None
        if fb.is_prefill:
            raise ValueError("the async lookahead launches decode steps only")
        requests = scheduler_output.requests
        start = self.step_trace.start() if self.step_trace is not None else None
        result = self._decode_step(fb, requests)  # tokens stay on the device: the next launch needs them
        return self._pending(self.post_decode_launch(result, fb, requests), scheduler_output, fb, result, start)

    def execute_prefill_launch(self, scheduler_output) -> _PendingStep | None:
        """Enqueue a prefill (behind the decode step launched beside it, if any) and return its pending
        record, which execute_resolve consumes; does not wait for the device."""
        fb = self.engine.build_forward_batch(scheduler_output)
        if fb is None:
            return None
        requests = scheduler_output.requests
        start = self.step_trace.start() if self.step_trace is not None else None
        result = self._prefill_forward(fb, requests)
        self._sample(result, fb, requests)  # frame 0 on the device, before the publish
        return self._pending(self.post_prefill_launch(result, fb, requests), scheduler_output, fb, result, start)

    def _pending(self, launch_buf, scheduler_output, fb: ForwardBatch, result: BatchResult,
                 trace_start=None) -> _PendingStep:
        event = new_event(self.device)
        event.record()  # after the publish: query() true means launch_buf is ready
        if trace_start is not None:
            self.step_trace.end(trace_start, fb.is_prefill)
        staged = any(launch_buf is buf for pair in self._host_staging.values() for buf in pair)
        return _PendingStep(event=event, launch_buf=launch_buf, host_staged=staged, scheduler_output=scheduler_output,
                            forward_batch=fb, batch_result=result, n_real=len(scheduler_output.requests))

    def execute_resolve(self, pending: _PendingStep | None) -> ModelRunnerOutput | None:
        """Consume a launched step: wait on its event, collect, finalize."""
        if pending is None:
            return None
        fb = pending.forward_batch
        if pending.event.query():
            self.async_query_hit += not fb.is_prefill  # the hit rate is the decode steps'
        else:
            pending.event.synchronize()
            self.async_query_miss += not fb.is_prefill
        requests = pending.scheduler_output.requests
        # requests that finished while this step was in flight: drop their rows
        skip = {r.rid for r in requests if r.finish_reason is not None}
        resolve = self.post_prefill_resolve if fb.is_prefill else self.post_decode_resolve
        resolve(pending.launch_buf, pending.batch_result, fb, requests)
        return self._finalize(pending.batch_result, pending.forward_batch, requests, skip)

    @torch.inference_mode()
    def _sample(self, result: BatchResult, fb: ForwardBatch, requests, flags: SampleFlags | None = None) -> None:
        """The model's logit processing, then the sampler's, all on the device: [B, C] tokens and
        logprobs. With ``flags`` given, ``requests`` is not read (it is None inside a graph)."""
        flags = flags or self.sampler.flags(requests, fb.steps_cpu)
        scores = self.process_logits(result.logits_gpu, fb, requests)  # [B, C, V]
        drawn = self.sampler.sample(scores, result.logits_gpu, fb.slots_gpu, fb.steps_gpu, flags)
        result.next_token_ids_gpu, result.logprobs_gpu, result.raw_logprobs_gpu = drawn

    def _finalize(self, result: BatchResult, fb: ForwardBatch, requests, skip: set[str] = frozenset()) -> ModelRunnerOutput:
        if result.next_token_ids_gpu is None:
            self._sample(result, fb, requests)
        collected = self.collect_outputs(result, fb, requests)
        outputs: dict[str, RequestOutput] = {}
        for req, got in zip(requests, collected):
            if req.rid in skip:
                continue
            if got.keep:
                req.frames.append(got.tokens)
                req.logprobs.append(got.logprobs)
                if got.raw_logprobs is not None:
                    req.raw_logprobs.append(got.raw_logprobs)
            if got.stopped:
                reason = "stop"
            elif req.generation_steps >= req.params.max_new_frames:
                reason = "length"
            else:
                reason = None
            outputs[req.rid] = RequestOutput(tokens=got.tokens, logprobs=got.logprobs, finish_reason=reason)
        rids = [r.rid for r in requests if r.rid not in skip]
        return ModelRunnerOutput(outputs=outputs, req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)})
