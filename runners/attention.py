"""Static slot KV cache and attention over it (the engine's device memory).

Layout: k/v [num_layers, num_slots, num_kv_heads, max_seq_len, head_dim].
A request owns one slot for its lifetime; position p of that request lives at
[:, slot, :, p]. Prefill writes positions 0..T-1 of each row (rows are right
padded to T; the padding positions hold garbage that is overwritten before any
query can see it, because keys at or beyond a row's length are masked).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        self.k_gpu = torch.zeros(shape, dtype=dtype, device=device)
        self.v_gpu = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len

    @property
    def nbytes(self) -> int:
        return self.k_gpu.numel() * self.k_gpu.element_size() * 2


@dataclass
class AttentionContext:
    kv: KVCache
    is_prefill: bool
    slots_gpu: torch.Tensor  # [B] int64
    positions_gpu: torch.Tensor  # [B, T] int64: rope positions, and cache write positions
    mask_gpu: torch.Tensor  # [B, 1, T, K] bool, True = may attend
    kv_len: int  # K: keys attended per row (host-known: max sequence length in the batch)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D], k/v [B, KVH, T, D] -> [B, H, T, D]; stores k/v in the cache."""
        kc, vc = self.kv.k_gpu[layer], self.kv.v_gpu[layer]
        if self.is_prefill:
            t = q.shape[2]
            kc[self.slots_gpu, :, :t] = k
            vc[self.slots_gpu, :, :t] = v
            keys, values = k, v  # no prefix reuse: a prompt attends only to itself
        else:
            pos = self.positions_gpu[:, 0]
            kc[self.slots_gpu, :, pos] = k[:, :, 0]
            vc[self.slots_gpu, :, pos] = v[:, :, 0]
            keys = kc[self.slots_gpu, :, : self.kv_len]
            values = vc[self.slots_gpu, :, : self.kv_len]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask_gpu, enable_gqa=True)
