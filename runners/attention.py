"""Static slot KV cache and attention over it (the engine's device memory).

Layout: k/v [num_layers, num_slots, num_kv_heads, max_seq_len, head_dim].
A request owns one slot for its lifetime; position p of that request lives at
[:, slot, :, p]. Prefill writes positions P..P+T-1 of each row, P = 0 unless
the rows' shared prompt prefix is already in their slots (runners/engine.py);
rows are right padded to T; the padding positions hold garbage that is
overwritten before any query can see it, because keys at or beyond a row's
length are masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


# Deterministic decode attends in key blocks of this size (see _blockwise).
DET_KEY_BLOCK = 256


def kv_bucket(kv_len: int, max_seq_len: int) -> int:
    """Keys attended for a step whose longest row has kv_len: the next power of two
    >= kv_len (at least one key block), capped at max_seq_len."""
    b = DET_KEY_BLOCK
    while b < kv_len:
        b *= 2
    return min(b, max_seq_len)


# SDPA backends, in order of preference. The CPU has only MATH (and FLASH for
# no-mask cases); on CUDA, masks rule out FLASH, so EFFICIENT runs.
_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_DETERMINISTIC_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def fused_kernels_available(device: torch.device) -> bool:
    """The Triton kernels (decode attention, fused ops) run on CUDA devices where Triton is installed."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        self.k_gpu = torch.zeros(shape, dtype=dtype, device=device)
        self.v_gpu = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len


@dataclass
class AttentionContext:
    kv: KVCache
    is_prefill: bool
    slots_gpu: torch.Tensor  # [B] int64
    positions_gpu: torch.Tensor  # [B, T] int64: rope positions, and cache write positions
    mask_gpu: torch.Tensor | None  # [B, 1, T, K] bool, True = may attend (None with lengths_gpu, or until mask_fn)
    kv_len: int  # K: keys attended per row (host-known: max sequence length in the batch)
    # decode on CUDA: keys per row [B]; attention is then the Triton kernel that
    # reads the slot cache in place up to each row's length (runners/decode_attention.py)
    lengths_gpu: torch.Tensor | None = None
    # Deterministic mode: prefill pins SDPA's memory-efficient kernel at fixed
    # shapes; decode uses _blockwise. SDPA's default CUDA backend (cuDNN, with
    # torch 2.11) gives different bits when rows are permuted and from one run
    # to the next, and spends host time per call when kv_len changes every
    # step (BENCHMARKS.md, --deterministic); so it is never used.
    deterministic: bool = False
    # builds mask_gpu on first use (the default path's engine): the fused CUDA
    # prefill attends causally without one, so it never pays for building it
    mask_fn: Callable[[], torch.Tensor] | None = None
    # prefill: positions [0, prefix_len) of every row's slot already hold that row's
    # keys and values (a shared prompt prefix); this forward's queries start there
    prefix_len: int = 0

    def _mask(self) -> torch.Tensor:
        if self.mask_gpu is None and self.mask_fn is not None:
            self.mask_gpu = self.mask_fn()
        return self.mask_gpu

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D], k/v [B, KVH, T, D] -> [B, H, T, D]; stores k/v in the cache."""
        kc, vc = self.kv.k_gpu[layer], self.kv.v_gpu[layer]
        if self.is_prefill:
            p, t = self.prefix_len, q.shape[2]
            kc[self.slots_gpu, :, p:p + t] = k
            vc[self.slots_gpu, :, p:p + t] = v
            keys, values = k, v  # a prompt attends to itself, and to its prefix in the cache:
            if p:
                keys, values = kc[self.slots_gpu, :, :p + t], vc[self.slots_gpu, :, :p + t]
        else:
            pos = self.positions_gpu[:, 0]
            kc[self.slots_gpu, :, pos] = k[:, :, 0]
            vc[self.slots_gpu, :, pos] = v[:, :, 0]
            if self.lengths_gpu is not None:
                from .decode_attention import decode_attention

                return decode_attention(q, kc, vc, self.slots_gpu, self.lengths_gpu)
            if self.deterministic:
                return self._blockwise(q, kc, vc)
            # slice first, then gather: kc[slots] would copy all max_seq_len positions
            keys = kc[:, :, : self.kv_len][self.slots_gpu]
            values = vc[:, :, : self.kv_len][self.slots_gpu]
        return self._sdpa(q, keys, values)

    def attend_cached_causal(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Prefill attention over keys already in the cache (the fused path wrote them):
        q [B, H, T, D] -> [B, H, T, D].

        Causal alone is exact for right-padded rows: a real query at t < len
        sees keys <= t, never the padding; padding queries see garbage, but
        their outputs are never read and their KV positions are rewritten
        before any query can see them (see the module docstring). Without a
        mask SDPA can take its flash kernel. After a shared prefix of P tokens
        the queries are positions P..P+T-1 over keys 0..P+T-1: causal aligned
        to the last key (lower right), which flash also runs, and which is
        exact for right-padded rows for the same reason."""
        t = self.prefix_len + q.shape[2]
        keys = self.kv.k_gpu[layer][self.slots_gpu, :, :t]  # [B, KVH, P + T, D], a copy
        values = self.kv.v_gpu[layer][self.slots_gpu, :, :t]
        causal = {"is_causal": True} if not self.prefix_len else {"attn_mask": causal_lower_right(q.shape[2], t)}
        # query head h reads KV head h // rep (repeat_kv's order) inside the kernel: no repeated
        # copy of the keys and values (BENCHMARKS.md, prefill)
        with sdpa_kernel(_BACKENDS):
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True, **causal)

    def _fold_gqa(self, q: torch.Tensor, kvh: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, H, T, D] -> [B, KVH, rep * T, D] and the mask expanded to match."""
        b, h, t, d = q.shape
        rep = h // kvh
        mask = self._mask().expand(b, 1, t, -1).repeat(1, 1, rep, 1)  # row r*T + i <- mask row i
        return q.reshape(b, kvh, rep * t, d), mask

    def _blockwise(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
        """Attention over fixed-size key blocks with an exact running softmax.

        q [B, H, 1, D]; kc/vc one layer's cache [slots, KVH, max_seq_len, D].
        Each block is gathered from the cache on its own, so its matmul sees
        the same contiguous [B, KVH, block, D] operand whatever kv_len is.

        Every block is one fixed-shape matmul, and a block whose keys are all
        masked changes nothing, bit for bit: its max is -inf, so the running
        max stays, the rescale factor is exp(0) = 1 and it adds exact zeros. A
        row's result therefore depends only on its own keys, never on how many
        key positions the batch attends over, which lets deterministic decode
        use the batch's key-length bucket instead of all max_seq_len positions.
        Needs one valid key per row in the first block (position 0 always is).
        """
        b, h, t, d = q.shape
        qf, mask = self._fold_gqa(q, kc.shape[1])
        scale = d ** -0.5
        m = torch.full((*qf.shape[:3], 1), float("-inf"), device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qf.shape, dtype=torch.float32, device=q.device)
        for start in range(0, self.kv_len, DET_KEY_BLOCK):
            blk = slice(start, min(start + DET_KEY_BLOCK, self.kv_len))
            keys, values = kc[:, :, blk][self.slots_gpu], vc[:, :, blk][self.slots_gpu]
            s = (qf @ keys.transpose(-1, -2)).float() * scale
            s = s.masked_fill(~mask[..., blk], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + (p.to(values.dtype) @ values).float()
            m = m_new
        return (acc / l).to(q.dtype).reshape(b, h, t, d)

    def _sdpa(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention as plain attention over the KV heads.

        The `rep` query heads that share a KV head become `rep` query rows of
        that head: q [B, H, T, D] -> [B, KVH, rep * T, D] (query head h uses KV
        head h // rep, as transformers' repeat_kv). K/V are never expanded, and
        the fused kernels, which need equal head counts, stay available.
        """
        b, h, t, d = q.shape
        q, mask = self._fold_gqa(q, keys.shape[1])
        backends = _DETERMINISTIC_BACKENDS if self.deterministic else _BACKENDS
        with sdpa_kernel(backends):
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return out.reshape(b, h, t, d)
