"""The KV cache in blocks, and attention over it (the engine's device memory).

Layout: k/v [num_layers, num_blocks, num_kv_heads, block_size, head_dim], and a block table
[num_slots, max_seq_len / block_size] int32: position p of the request in slot s lives in block
table[s, p // block_size] at p % block_size. Two layouts share this form:
  - paged (``paged(...)``): blocks of a few positions that the host's BlockPool hands out
    (runners/kv_blocks.py), shared by rows whose prompts open with the same content; the last
    block is scratch, where every table entry no row owns points (padding rows, right padding
    past a row's blocks), so a stray write never lands in another row's keys;
  - one block a slot (the constructor): block_size = max_seq_len and table[s] = [s], the slot
    cache, bit for bit, for tests and benches that place rows themselves.
Prefill writes positions P..P+T-1 of each row, P = 0 unless the row's first P positions came
from the prefix cache (runners/engine.py); rows are right padded to T; the padding positions
hold garbage that is overwritten before any query can see it, because keys at or beyond a
row's length are masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .device import upload


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
                 dtype: torch.dtype, device: torch.device, num_blocks: int | None = None,
                 block_size: int | None = None):
        """One block a slot (the slot cache) unless num_blocks and block_size are given (see ``paged``)."""
        paged = num_blocks is not None
        self.block_size = block_size if paged else max_seq_len
        width = -(-max_seq_len // self.block_size)  # table entries a row
        blocks = num_blocks + 1 if paged else num_slots  # paged: + the scratch block
        shape = (num_layers, blocks, num_kv_heads, self.block_size, head_dim)
        self.k_gpu = torch.zeros(shape, dtype=dtype, device=device)
        self.v_gpu = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len
        self.num_slots = num_slots
        self.paged = paged
        self.scratch = blocks - 1 if paged else None
        first = torch.full((num_slots, width), blocks - 1) if paged else torch.arange(num_slots)[:, None]
        self.table_host = first.to(torch.int32).numpy()  # [S, width]: the host's copy (cascade plans read it)
        self.table_gpu = torch.from_numpy(self.table_host).to(device)
        self.assigned = 0  # how many assign calls so far (what a plan of the tables is keyed on)
        self.spare_slot = num_slots - 1  # the padding rows' slot (no request owns it)

    @classmethod
    def paged(cls, num_layers: int, num_slots: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
              dtype: torch.dtype, device: torch.device, num_blocks: int, block_size: int) -> "KVCache":
        return cls(num_layers, num_slots, num_kv_heads, max_seq_len, head_dim, dtype, device, num_blocks, block_size)

    def assign(self, slots: list[int], tables: list[list[int]]) -> None:
        """The row in slots[i] holds blocks tables[i] (position order); the rest of its table points at
        scratch. One copy to the device for all rows (outside the decode loop: at a prefill)."""
        rows = np.full((len(slots), self.table_gpu.shape[1]), self.scratch, dtype=np.int32)
        for i, blocks in enumerate(tables):
            rows[i, : len(blocks)] = blocks
        dev = self.table_gpu.device
        self.table_host[slots] = rows
        self.table_gpu[upload(slots, dev)] = upload(rows, dev)
        self.assigned += 1

    def write(self, layer: int, slots_gpu: torch.Tensor, positions_gpu: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """k/v [B, KVH, T, D] stored at positions_gpu [B, T] of each row's slot."""
        bs = self.block_size
        blocks = self.table_gpu[slots_gpu[:, None], positions_gpu // bs].long()  # [B, T]
        at = positions_gpu % bs
        self.k_gpu[layer][blocks, :, at] = k.transpose(1, 2)  # indexed [B, T, KVH, D]
        self.v_gpu[layer][blocks, :, at] = v.transpose(1, 2)

    def gather(self, layer: int, slots_gpu: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0..length-1 of each row: [B, KVH, length, D] each, a copy."""
        bs = self.block_size
        n = -(-length // bs)
        kc, vc = self.k_gpu[layer], self.v_gpu[layer]
        if n == 1:  # slice first, then gather: kc[blocks] would copy every position of the block
            blocks = self.table_gpu[slots_gpu, 0].long()
            return kc[:, :, :length][blocks], vc[:, :, :length][blocks]
        blocks = self.table_gpu[slots_gpu, :n].long()  # [B, n]

        def rows(cache: torch.Tensor) -> torch.Tensor:
            x = cache[blocks]  # [B, n, KVH, bs, D]
            return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], n * bs, x.shape[4])[:, :, :length]

        return rows(kc), rows(vc)


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
    # decode with lengths_gpu: rows grouped by the prompt blocks they share (runners/cascade_attention.py:
    # CascadeInputs), their shared keys attended once a group; None: every row on its own
    cascade: object | None = None

    def _mask(self) -> torch.Tensor:
        if self.mask_gpu is None and self.mask_fn is not None:
            self.mask_gpu = self.mask_fn()
        return self.mask_gpu

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D], k/v [B, KVH, T, D] -> [B, H, T, D]; stores k/v in the cache."""
        if self.is_prefill:
            p = self.prefix_len
            self.kv.write(layer, self.slots_gpu, self.positions_gpu, k, v)
            keys, values = k, v  # a prompt attends to itself, and to its prefix in the cache:
            if p:
                keys, values = self.kv.gather(layer, self.slots_gpu, p + q.shape[2])
        else:
            self.kv.write(layer, self.slots_gpu, self.positions_gpu[:, :1], k, v)
            if self.lengths_gpu is not None:
                from .decode_attention import decode_attention

                kc, vc = self.kv.k_gpu[layer], self.kv.v_gpu[layer]
                return decode_attention(q, kc, vc, self.kv.table_gpu, self.slots_gpu, self.lengths_gpu,
                                        cascade=self.cascade)
            keys, values = self.kv.gather(layer, self.slots_gpu, self.kv_len)
            if self.deterministic:
                return self._blockwise(q, keys, values)
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
        keys, values = self.kv.gather(layer, self.slots_gpu, t)  # [B, KVH, P + T, D]
        if self.prefix_len:
            # NOTE: imported here: torch.nn.attention.bias imports torch._dynamo, seconds of every process's start
            from torch.nn.attention.bias import causal_lower_right

            causal = {"attn_mask": causal_lower_right(q.shape[2], t)}
        else:
            causal = {"is_causal": True}
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

    def _blockwise(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Attention over fixed-size key blocks with an exact running softmax.

        q [B, H, 1, D]; keys/values [B, KVH, kv_len, D] (gathered from the cache).
        Each block is made contiguous on its own, so its matmul sees the same
        [B, KVH, block, D] operand whatever kv_len is.

        Every block is one fixed-shape matmul, and a block whose keys are all
        masked changes nothing, bit for bit: its max is -inf, so the running
        max stays, the rescale factor is exp(0) = 1 and it adds exact zeros. A
        row's result therefore depends only on its own keys, never on how many
        key positions the batch attends over, which lets deterministic decode
        use the batch's key-length bucket instead of all max_seq_len positions.
        Needs one valid key per row in the first block (position 0 always is).
        """
        b, h, t, d = q.shape
        qf, mask = self._fold_gqa(q, keys.shape[1])
        scale = d ** -0.5
        m = torch.full((*qf.shape[:3], 1), float("-inf"), device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qf.shape, dtype=torch.float32, device=q.device)
        for start in range(0, self.kv_len, DET_KEY_BLOCK):
            blk = slice(start, min(start + DET_KEY_BLOCK, self.kv_len))
            kb, vb = keys[:, :, blk].contiguous(), values[:, :, blk].contiguous()
            s = (qf @ kb.transpose(-1, -2)).float() * scale
            s = s.masked_fill(~mask[..., blk], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + (p.to(vb.dtype) @ vb).float()
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
