"""Offline scheduler with continuous batching. Pure Python: never touches the device.

Each step it hands the runner a decode batch (one frame for every running
request) or a prefill batch (newly admitted prompts); with ``beside``, a
prefill admitted while requests decode carries their decode step with it
(``SchedulerOutput.beside``), which the loop launches first, so the running
rows advance a frame during the prefill instead of waiting for it (a first
wave admitted over several prefills still starts decoding together). Requests
of very different lengths share the batch over time and new ones join
mid-flight. Admission waits until an eighth of the slots are free (or the
rest of the queue fits, or nothing else can run): a small prefill is
host-bound, so one prompt costs nearly as much as eight, and a prefill per
freed slot spends most of a run in one-prompt refills (BENCHMARKS.md, prefill).

A request holds one slot (its row of the runner's per-row state) from its
prefill until it finishes; the slot pool enforces that a slot is freed exactly
once and never handed to two requests. With the runner's block pool
(runners/kv_blocks.py) its KV takes blocks for its own positions (prompt plus
max_new_frames), some shared with earlier rows of the same prompt prefix: a
request is admitted only when they fit, in queue order, and gives them back
when it finishes. Without one, every slot holds max_seq_len positions.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from omni_cli.runners.budget import PREFIX_KEYS_PER_TOKEN, prefill_token_budget
from omni_cli.runners.kv_blocks import BlockPool, RowBlocks
from omni_cli.runners.prompt_input import PromptInput
from omni_cli.runners.sampling.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FrameBuffer:
    """A request's per-frame entries (codes, logprobs) on the host, [n] a frame, kept as the rows
    of one [frames, n] array that doubles when full.

    Why not a list of per-frame arrays: each request's list then had to be stacked
    once it finished, and at a one-wave run's end the codec thread stacked all of
    them before its first call, holding the GIL (BENCHMARKS.md, the tail's host side);
    here a frame is written where it stays, on the loop thread between steps, and
    `array` is a view."""

    FIRST_CAPACITY = 64  # frames; then doubled as needed

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._rows: np.ndarray | None = None
        self._n = 0
        self._released = False

    def __len__(self) -> int:
        return self._n

    def append(self, entry: np.ndarray) -> None:
        if self._released:
            raise RuntimeError("frames appended after the request's buffers were released")
        if self._rows is None or self._n == len(self._rows):
            grown = np.empty((max(2 * self._n, self.FIRST_CAPACITY), len(entry)), dtype=self.dtype)
            if self._rows is not None:
                grown[: self._n] = self._rows[: self._n]
            self._rows = grown
        self._rows[self._n] = entry
        self._n += 1

    @property
    def array(self) -> np.ndarray:
        """The entries so far, [frames, n]: a view, valid until the next append that grows it."""
        if self._released:
            raise RuntimeError("the request's frames were released (its files are written)")
        if self._rows is None:
            return np.zeros((0, 0), dtype=self.dtype)
        return self._rows[: self._n]

    def release(self) -> None:
        """Drop the entries (the row's files are written): a run of many rows keeps every
        Request until its end, and a long row's codes and logprobs are its largest host buffer."""
        self._rows = None
        self._released = True


@dataclass(eq=False)
class Request:
    rid: str
    prompt: PromptInput  # token ids are taken as a text-only prompt
    params: SamplingParams
    seed: int
    status: Status = Status.WAITING
    slot: int | None = None
    blocks: RowBlocks | None = None  # its KV blocks while it runs (with a block pool)
    # one entry per generated frame, host side: [num_codebooks] int64 / float32 each
    frames: FrameBuffer = field(default_factory=lambda: FrameBuffer(np.int64))
    logprobs: FrameBuffer = field(default_factory=lambda: FrameBuffer(np.float32))
    raw_logprobs: FrameBuffer = field(default_factory=lambda: FrameBuffer(np.float32))  # with --raw-logprobs
    finish_reason: str | None = None  # "stop" | "length"
    # frames whose step has been scheduled; runs ahead of len(frames) by the
    # steps launched on the device but not yet resolved on the host
    num_scheduled: int = 0

    def __post_init__(self) -> None:
        self.prompt = PromptInput.of(self.prompt)

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.ids

    @property
    def generation_steps(self) -> int:
        return len(self.frames)

    def release(self) -> None:
        """Drop the per-frame entries once the row's files are written."""
        for entries in (self.frames, self.logprobs, self.raw_logprobs):
            entries.release()

    def kv_tokens_needed(self) -> int:
        """Worst-case KV positions: the prompt plus every frame but the last."""
        return len(self.prompt) + self.params.max_new_frames - 1


@dataclass
class SchedulerOutput:
    is_prefill: bool
    requests: list[Request]  # row order of this step's batch
    steps: list[int]  # per row: index of the frame this step samples (0 = the prefill's)
    # a prefill's: the decode step of the requests already running, to run beside it (before it on the
    # device); None when none can run or the scheduler was made without ``beside``
    beside: "SchedulerOutput | None" = None


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
    def __init__(self, max_batch_size: int, max_seq_len: int, max_prefill_tokens: int | None = None,
                 blocks: BlockPool | None = None, beside: bool = False):
        self.max_batch_size = max_batch_size
        self.beside = beside  # a prefill carries the running requests' decode step (the loop runs both)
        self.blocks = blocks
        self.max_seq_len = max_seq_len
        # bounds the activation memory of one prefill, which runs every row at the length of its
        # longest prompt: rows x that length stays within it (a longer prompt runs alone)
        self.max_prefill_tokens = max_prefill_tokens or prefill_token_budget(max_seq_len)
        self.slots = SlotPool(max_batch_size)
        self.refill = max(1, max_batch_size // 8)  # free slots that make a prefill worth its stall
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @classmethod
    def for_runner(cls, runner, max_seq_len: int) -> "Scheduler":
        """As many rows as the runner has slots, admitted through its block pool (if it has one),
        prefills beside decode steps."""
        return cls(runner.num_slots, max_seq_len, blocks=runner.kv_blocks, beside=True)

    def add(self, req: Request) -> None:
        """Queue a request. Raises ValueError if it can never fit in a KV slot."""
        need = req.kv_tokens_needed()
        if need > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(req.prompt_ids)} tokens) plus max_new_frames ({req.params.max_new_frames}) "
                f"needs {need} KV positions, over max_seq_len {self.max_seq_len}"
            )
        if self.blocks is not None and self.blocks.blocks_for(need) > self.blocks.num_blocks:
            raise ValueError(f"prompt ({len(req.prompt_ids)} tokens) plus max_new_frames ({req.params.max_new_frames}) "
                             f"needs {need} KV positions; device memory holds "
                             f"{self.blocks.num_blocks * self.blocks.block_size}")
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput | None:
        """Prefill new requests when enough slots are free (with ``beside``, the running ones' decode
        step rides along as the output's ``beside``), else decode the running ones.

        A running request whose frames up to max_new_frames are all scheduled
        is left out: it only waits for its last step to be resolved. None when
        nothing can run now.
        """
        admitted: list[Request] = []
        # a prefill's forwards (one per first uncached position: runners/engine.py) pad their rows to
        # their longest: each stays within max_prefill_tokens. start -> (rows, their longest)
        forwards: dict[int, tuple[int, int]] = {}
        ready = [r for r in self.running if r.num_scheduled < r.params.max_new_frames]
        free = self.slots.num_free
        admit = free > 0 and (free >= min(self.refill, len(self.waiting)) or not ready)
        if admit and ready and self.blocks is not None and self.waiting:  # where memory, not slots, is short:
            head = self.waiting[0]  # as many free blocks as the same refill of rows like the queue's head takes
            need = self.blocks.blocks_for(head.kv_tokens_needed() - self.blocks.cached_positions(head.prompt.content))
            admit = self.blocks.free_blocks >= min(self.refill, len(self.waiting)) * need
        while admit and self.waiting and self.slots.num_free > 0:
            nxt = self.waiting[0]
            start = self.blocks.cached_positions(nxt.prompt.content) if self.blocks is not None else 0
            rows, longest = forwards.get(start, (0, 0))
            longest = max(longest, len(nxt.prompt_ids) - start)
            if admitted and ((rows + 1) * longest > self.max_prefill_tokens or
                             (rows + 1) * (start + longest) > PREFIX_KEYS_PER_TOKEN * self.max_prefill_tokens):
                break
            if self.blocks is not None:  # its KV must fit now (in queue order: no row overtakes it)
                if not self.blocks.can_admit(nxt.prompt.content, nxt.kv_tokens_needed()):
                    break
                nxt.blocks = self.blocks.admit(nxt.rid, nxt.prompt.content, nxt.kv_tokens_needed())
            self.waiting.popleft()
            nxt.slot = self.slots.allocate()
            nxt.status = Status.RUNNING
            forwards[start] = (rows + 1, longest)
            admitted.append(nxt)
        if admitted:
            self.running.extend(admitted)
            out = self._output(True, admitted)
            # NOTE: not while the running rows are a first wave still being admitted (none past frame 0):
            # rows that start together finish together, in one codec call, not one behind the other
            if self.beside and any(r.num_scheduled > 1 for r in ready):
                out.beside = self._output(False, ready)
            return out
        return self._output(False, ready) if ready else None

    @staticmethod
    def _output(is_prefill: bool, reqs: list[Request]) -> SchedulerOutput:
        steps = [r.num_scheduled for r in reqs]
        for r in reqs:
            r.num_scheduled += 1
        return SchedulerOutput(is_prefill=is_prefill, requests=reqs, steps=steps)

    def finish(self, req: Request, reason: str) -> None:
        """Retire a running request and free its slot (exactly once)."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} finished while {req.status.value}")
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.running.remove(req)
        self.slots.free(req.slot)
        req.slot = None
        if req.blocks is not None:
            self.blocks.release(req.rid)
            req.blocks = None
