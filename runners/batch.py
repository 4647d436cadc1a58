"""ForwardBatch: one step's rows as the engine runs them (its own module: the engine and its
graphs both read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
            prompts_cpu=self.prompts_cpu[start:stop], slots_cpu=self.slots_cpu[start:stop])
