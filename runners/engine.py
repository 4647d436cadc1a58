"""The engine (the seed's ``tp_worker`` role): model weights, KV cache, forward.

Its interface is deliberately narrow, so another backend (an sglang-backed
engine, say) can stand in for it:
  build_forward_batch(scheduler_output) -> ForwardBatch | None
  forward(forward_batch) -> logits of each row's last position [B, ...]
The runner decides what goes in ``forward_batch.model_inputs`` (through its
hooks); the engine decides how attention and the KV cache work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runners.attention import AttentionContext, KVCache


@dataclass
class ForwardBatch:
    is_prefill: bool
    rids: list[str]
    slots_cpu: list[int]
    slots_gpu: torch.Tensor  # [B]
    lengths_cpu: list[int]  # per row: tokens in the slot after this forward
    positions_gpu: torch.Tensor  # [B, T]
    attn: AttentionContext
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.rids)


class Engine:
    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device):
        self.model = model
        self.kv = kv
        self.device = device

    def _tensor(self, data, dtype=torch.int64) -> torch.Tensor:
        # host list -> device; a pinned host copy is not worth it at these sizes
        return torch.tensor(data, dtype=dtype).to(self.device, non_blocking=True)

    def build_forward_batch(self, scheduler_output) -> ForwardBatch | None:
        reqs = scheduler_output.requests
        if not reqs:
            return None
        slots = [r.slot for r in reqs]
        if scheduler_output.is_prefill:
            lens = [len(r.prompt_ids) for r in reqs]
            t = max(lens)
            ids = [r.prompt_ids + [0] * (t - len(r.prompt_ids)) for r in reqs]
            positions = [list(range(t)) for _ in reqs]
            ar = torch.arange(t)
            # causal within the row, and never onto the row's right padding
            valid = ar[None, :] < torch.tensor(lens)[:, None]  # [B, K]
            mask = (ar[None, :, None] >= ar[None, None, :]) & valid[:, None, :]  # [B, T, K]
            model_inputs = {"input_ids": self._tensor(ids)}
            kv_len = t
        else:
            # the newest frame is fed at position seq_len (its KV slot index)
            pos = [r.seq_len for r in reqs]
            lens = [p + 1 for p in pos]
            kv_len = max(lens)
            positions = [[p] for p in pos]
            mask = (torch.arange(kv_len)[None, :] < torch.tensor(lens)[:, None])[:, None, :]  # [B, 1, K]
            model_inputs = {}
        slots_gpu = self._tensor(slots)
        positions_gpu = self._tensor(positions)
        attn = AttentionContext(
            kv=self.kv,
            is_prefill=scheduler_output.is_prefill,
            slots_gpu=slots_gpu,
            positions_gpu=positions_gpu,
            mask_gpu=mask[:, None].to(self.device, non_blocking=True),
            kv_len=kv_len,
        )
        return ForwardBatch(
            is_prefill=scheduler_output.is_prefill,
            rids=[r.rid for r in reqs],
            slots_cpu=slots,
            slots_gpu=slots_gpu,
            lengths_cpu=lens,
            positions_gpu=positions_gpu,
            attn=attn,
            model_inputs=model_inputs,
        )

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        hidden = self.model(fb.attn, **fb.model_inputs)  # [B, T, H]
        if fb.is_prefill:
            last = self._tensor([n - 1 for n in fb.lengths_cpu])
            hidden = hidden[torch.arange(fb.batch_size, device=hidden.device), last]
        else:
            hidden = hidden[:, 0]
        return self.model.compute_logits(hidden)
