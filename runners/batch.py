"""ForwardBatch: one step's rows as the engine runs them (its own module: the engine and its
graphs both read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .device import upload


@dataclass
class ForwardBatch:
    is_prefill: bool
    rids: list[str]
    slots_gpu: torch.Tensor  # [B]
    lengths_cpu: list[int]  # per row: tokens in the slot after this forward
    steps_cpu: list[int]  # per row: index of the frame this step samples
    steps_gpu: torch.Tensor  # [B]
    positions_gpu: torch.Tensor  # [B, T]
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    # prefill: each row's prompt content (runners/prompt_input.py: ids, audio positions keyed by
    # their codes), what prefix sharing and prefill graphs compare; [] if not given
    prompts_cpu: list[list[int]] = field(default_factory=list)
    slots_cpu: list[int] = field(default_factory=list)  # each row's slot, as slots_gpu; [] if not given
    # prefill with a block pool: each row's first positions taken from cached blocks (its prompt runs
    # from there) and its block table (runners/kv_blocks.py); [] if not given
    cached_cpu: list[int] = field(default_factory=list)
    tables_cpu: list[list[int]] = field(default_factory=list)
    # decode: the rows' groups by shared prompt blocks (runners/cascade_attention.py: CascadePlan), or None
    cascade_cpu: object | None = None

    @property
    def batch_size(self) -> int:
        return len(self.rids)

    def rows(self, start: int, stop: int) -> "ForwardBatch":
        """Rows start..stop-1 as a batch of their own (views of the device tensors)."""
        return ForwardBatch(
            is_prefill=self.is_prefill, rids=self.rids[start:stop], slots_gpu=self.slots_gpu[start:stop],
            lengths_cpu=self.lengths_cpu[start:stop], steps_cpu=self.steps_cpu[start:stop],
            steps_gpu=self.steps_gpu[start:stop], positions_gpu=self.positions_gpu[start:stop],
            model_inputs={k: v[start:stop] for k, v in self.model_inputs.items()},
            prompts_cpu=self.prompts_cpu[start:stop], slots_cpu=self.slots_cpu[start:stop],
            cached_cpu=self.cached_cpu[start:stop], tables_cpu=self.tables_cpu[start:stop])

    def select(self, rows: list[int]) -> "ForwardBatch":
        """A prefill's rows (indices, in this order) as a batch of their own, cut to their longest prompt
        (copies of the device tensors)."""
        t = max(self.lengths_cpu[i] for i in rows)
        idx = upload(rows, self.slots_gpu.device)
        pick = lambda xs: [xs[i] for i in rows] if xs else []  # noqa: E731
        return ForwardBatch(
            is_prefill=self.is_prefill, rids=pick(self.rids), slots_gpu=self.slots_gpu[idx],
            lengths_cpu=pick(self.lengths_cpu), steps_cpu=pick(self.steps_cpu), steps_gpu=self.steps_gpu[idx],
            positions_gpu=self.positions_gpu[idx, :t],
            model_inputs={k: v[idx, :t] for k, v in self.model_inputs.items()},
            prompts_cpu=pick(self.prompts_cpu), slots_cpu=pick(self.slots_cpu), cached_cpu=pick(self.cached_cpu),
            tables_cpu=pick(self.tables_cpu))
