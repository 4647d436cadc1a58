"""Offline scheduler with continuous batching. Pure Python: never touches the device.

Each step it hands the runner either a prefill batch (newly admitted prompts)
or a decode batch (one frame for every running request). Admission happens
whenever KV slots are free, so requests of very different lengths share the
batch over time and new ones join mid-flight.

KV memory is a fixed pool of ``max_batch_size`` slots of ``max_seq_len``
tokens each (the runner allocates it once). A request holds one slot from its
prefill until it finishes; the slot pool enforces that a slot is freed exactly
once and never handed to two requests.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from omni_cli.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    index: int = 0  # position in the input, for ordering outputs
    status: Status = Status.WAITING
    slot: int | None = None
    # one entry per generated frame, host side: [num_codebooks] int / float32
    frames: list[np.ndarray] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    raw_logprobs: list[np.ndarray] = field(default_factory=list)  # with --raw-logprobs
    finish_reason: str | None = None  # "stop" | "length"

    @property
    def generation_steps(self) -> int:
        return len(self.frames)

    @property
    def seq_len(self) -> int:
        """Tokens in this request's KV slot after its last forward."""
        # the newest frame has been sampled but not yet fed back
        return len(self.prompt_ids) + max(self.generation_steps - 1, 0)

    def kv_tokens_needed(self) -> int:
        """Worst-case KV positions: the prompt plus every frame but the last."""
        return len(self.prompt_ids) + self.params.max_new_frames - 1


@dataclass
class SchedulerOutput:
    is_prefill: bool
    requests: list[Request]  # row order of this step's batch


class SlotPool:
    """Free list of KV slot indices."""

    def __init__(self, n: int):
        self._free = list(range(n - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise RuntimeError(f"KV slot {slot} freed twice or never allocated")
        self._used.remove(slot)
        self._free.append(slot)


class Scheduler:
    def __init__(self, max_batch_size: int, max_seq_len: int, max_prefill_tokens: int | None = None):
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        # bounds the activation memory of one prefill; a longer prompt runs alone
        self.max_prefill_tokens = max_prefill_tokens or max(max_seq_len, 4096)
        self.slots = SlotPool(max_batch_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        """Queue a request. Raises ValueError if it can never fit in a KV slot."""
        need = req.kv_tokens_needed()
        if need > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(req.prompt_ids)} tokens) plus max_new_frames ({req.params.max_new_frames}) "
                f"needs {need} KV positions, over max_seq_len {self.max_seq_len}"
            )
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput | None:
        """Prefill new requests while slots are free, else decode every running one."""
        admitted: list[Request] = []
        tokens = 0
        while self.waiting and self.slots.num_free > 0:
            nxt = self.waiting[0]
            if admitted and tokens + len(nxt.prompt_ids) > self.max_prefill_tokens:
                break
            self.waiting.popleft()
            nxt.slot = self.slots.allocate()
            nxt.status = Status.RUNNING
            tokens += len(nxt.prompt_ids)
            admitted.append(nxt)
        if admitted:
            self.running.extend(admitted)
            return SchedulerOutput(is_prefill=True, requests=admitted)
        if self.running:
            return SchedulerOutput(is_prefill=False, requests=list(self.running))
        return None

    def finish(self, req: Request, reason: str) -> None:
        """Retire a running request and free its slot (exactly once)."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} finished while {req.status.value}")
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.running.remove(req)
        self.slots.free(req.slot)
        req.slot = None
