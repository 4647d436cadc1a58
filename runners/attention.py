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
from torch.nn.attention import SDPBackend, sdpa_kernel


# SDPA backends, in order of preference. The CPU has only MATH (and FLASH for
# no-mask cases); on CUDA, masks rule out FLASH, so EFFICIENT runs.
_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_DETERMINISTIC_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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
    # Deterministic mode pins SDPA's memory-efficient kernel at fixed shapes.
    # Measured on an H200 (torch 2.11): the backend SDPA picks by default
    # there (cuDNN) gives different bits when rows are permuted and from one
    # run to the next, and spends ~2 ms of host time per call when kv_len
    # changes every step; so it is never used.
    deterministic: bool = False

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
            # slice first, then gather: kc[slots] would copy all max_seq_len positions
            keys = kc[:, :, : self.kv_len][self.slots_gpu]
            values = vc[:, :, : self.kv_len][self.slots_gpu]
        return self._sdpa(q, keys, values)

    def _sdpa(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention as plain attention over the KV heads.

        The `rep` query heads that share a KV head become `rep` query rows of
        that head: q [B, H, T, D] -> [B, KVH, rep * T, D] (query head h uses KV
        head h // rep, as transformers' repeat_kv). K/V are never expanded, and
        the fused kernels, which need equal head counts, stay available.
        """
        b, h, t, d = q.shape
        kvh = keys.shape[1]
        rep = h // kvh
        q = q.reshape(b, kvh, rep * t, d)
        mask = self.mask_gpu.expand(b, 1, t, -1).repeat(1, 1, rep, 1)  # row r*T + i <- mask row i
        backends = _DETERMINISTIC_BACKENDS if self.deterministic else _BACKENDS
        with sdpa_kernel(backends):
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return out.reshape(b, h, t, d)
