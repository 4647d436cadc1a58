"""The engine (the seed's ``tp_worker`` role): model weights, KV cache, forward.

Its interface is deliberately narrow, so another backend (an sglang-backed
engine, say) can stand in for it:
  build_forward_batch(scheduler_output) -> ForwardBatch | None
  forward(forward_batch) -> logits of each row's last position [B, ...]
The runner decides what goes in ``forward_batch.model_inputs`` (through its
hooks); the engine decides how attention and the KV cache work.

Deterministic mode makes each row's arithmetic independent of its batch-mates
and of the batch size, so outputs are byte-identical however rows are
batched: matmul and attention kernels pick their blocking (and so their
rounding) from the shapes they see, so every shape is fixed, and attention
uses SDPA's math backend (see AttentionContext.deterministic). Prefill runs one
prompt at a time at its own length; decode runs in chunks of exactly
``det_rows`` rows (padding rows use a spare KV slot that no request owns) and
always attends over all ``max_seq_len`` key positions, masked.
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
    steps_cpu: list[int]  # per row: index of the frame this step samples
    steps_gpu: torch.Tensor  # [B]
    positions_gpu: torch.Tensor  # [B, T]
    attn: AttentionContext
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.rids)


class Engine:
    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device, deterministic: bool = False,
                 det_rows: int = 64):
        self.model = model
        self.kv = kv  # deterministic mode: one slot more than requests can own (the padding rows' slot)
        self.device = device
        self.deterministic = deterministic
        self.det_rows = det_rows

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
            # frame s-1 is fed at position prompt_len + s - 1 to sample frame s
            pos = [len(r.prompt_ids) + s - 1 for r, s in zip(reqs, scheduler_output.steps)]
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
        steps = list(scheduler_output.steps)
        return ForwardBatch(
            is_prefill=scheduler_output.is_prefill,
            rids=[r.rid for r in reqs],
            slots_cpu=slots,
            slots_gpu=slots_gpu,
            lengths_cpu=lens,
            steps_cpu=steps,
            steps_gpu=self._tensor(steps),
            positions_gpu=positions_gpu,
            attn=attn,
            model_inputs=model_inputs,
        )

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.deterministic:
            return self._forward_fixed_shapes(fb)
        hidden = self.model(fb.attn, **fb.model_inputs)  # [B, T, H]
        if fb.is_prefill:
            last = self._tensor([n - 1 for n in fb.lengths_cpu])
            hidden = hidden[torch.arange(fb.batch_size, device=hidden.device), last]
        else:
            hidden = hidden[:, 0]
        return self.model.compute_logits(hidden)

    def _forward_fixed_shapes(self, fb: ForwardBatch) -> torch.Tensor:
        out = []
        if fb.is_prefill:
            for i, n in enumerate(fb.lengths_cpu):  # one prompt at a time, at its own length
                ar = torch.arange(n)
                attn = AttentionContext(kv=self.kv, is_prefill=True, slots_gpu=fb.slots_gpu[i: i + 1],
                                        positions_gpu=fb.positions_gpu[i: i + 1, :n],
                                        mask_gpu=(ar[:, None] >= ar[None, :])[None, None].to(self.device), kv_len=n,
                                        deterministic=True)
                inputs = {k: v[i: i + 1, :n] for k, v in fb.model_inputs.items()}
                out.append(self.model.compute_logits(self.model(attn, **inputs)[:, n - 1]))
            return torch.cat(out)
        rows, k = self.det_rows, self.kv.max_seq_len
        pad_slot = self.kv.k_gpu.shape[1] - 1
        for start in range(0, fb.batch_size, rows):
            idx = slice(start, start + rows)
            m = len(fb.lengths_cpu[idx])
            pad = rows - m
            lens = fb.lengths_cpu[idx] + [1] * pad
            slots = torch.cat([fb.slots_gpu[idx], torch.full((pad,), pad_slot, device=self.device)])
            positions = torch.cat([fb.positions_gpu[idx], torch.zeros(pad, 1, dtype=torch.int64, device=self.device)])
            mask = (torch.arange(k)[None, :] < torch.tensor(lens)[:, None])[:, None, None].to(self.device)
            attn = AttentionContext(kv=self.kv, is_prefill=False, slots_gpu=slots, positions_gpu=positions,
                                    mask_gpu=mask, kv_len=k, deterministic=True)
            inputs = {name: torch.cat([v[idx], v.new_zeros((pad, *v.shape[1:]))]) for name, v in fb.model_inputs.items()}
            out.append(self.model.compute_logits(self.model(attn, **inputs)[:, 0])[:m])  # head at the fixed shape too
        return torch.cat(out)
