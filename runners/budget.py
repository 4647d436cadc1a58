"""The memory budget: how many KV blocks fit beside everything else a run keeps.

Generic over model families: a family gives its KV shape, its model (to measure
the widest prefill's activations) and its codec's per-call bytes
(runners/family.py: ``Budget``); this decides the number of KV blocks (at most
what max_batch_size rows of max_seq_len positions take) and builds the paged
cache, its block pool and the engine. Rows are admitted as their own positions
(prompt and max_new_frames) fit in the pool (omni_cli/scheduler.py), so the
rows that run at once follow their real lengths, not max_seq_len.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .attention import KVCache
from .batch import ForwardBatch
from .device import RUNTIME_SLACK_BYTES, free_memory, host_available, kv_slots_within, peak_bytes
from .engine import DETERMINISTIC_SHAPES, Engine
from .errors import OmniError
from .kv_blocks import BLOCK_SIZE, BlockPool


def prefill_token_budget(max_seq_len: int) -> int:
    """Padded tokens one prefill forward may hold (the scheduler admits within it; the budget keeps room
    for it). Wide enough that a batch of 256 short prompts is one prefill forward: each forward's eager
    launches cost host time that a small one's GPU work does not cover (BENCHMARKS.md, reference voices)."""
    return max(max_seq_len, PREFILL_TOKENS)


PREFILL_TOKENS = 16384
# A forward after a cached prefix copies its rows' keys and values up to their ends (runners/attention.py:
# KVCache.gather; the widest-prefill measurement has none): the scheduler keeps rows x (prefix + longest)
# of one forward within this many times the token budget, so one layer's copy stays inside the runtime slack
PREFIX_KEYS_PER_TOKEN = 4


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int

    def slot_bytes(self, max_seq_len: int, dtype: torch.dtype) -> int:
        """Keys and values of one request at max_seq_len positions."""
        return 2 * self.layers * self.kv_heads * max_seq_len * self.head_dim * (torch.finfo(dtype).bits // 8)

    def cache(self, slots: int, max_seq_len: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        """One block a slot (runners/attention.py)."""
        return KVCache(self.layers, slots, self.kv_heads, max_seq_len, self.head_dim, dtype, device)

    def paged(self, rows: int, max_seq_len: int, dtype: torch.dtype, device: torch.device, share: bool = True,
              blocks: int | None = None) -> tuple[KVCache, BlockPool]:
        """The paged cache for `rows` rows (and the padding rows' spare slot) and its pool: `blocks`
        blocks, by default what `rows` rows of max_seq_len take. share=False: no prefix cache."""
        blocks = blocks if blocks is not None else rows * -(-max_seq_len // BLOCK_SIZE)
        kv = KVCache.paged(self.layers, rows + 1, self.kv_heads, max_seq_len, self.head_dim, dtype, device,
                           num_blocks=blocks, block_size=BLOCK_SIZE)
        return kv, BlockPool(blocks, BLOCK_SIZE, share=share)


def build_engine(spec, kv_shape: KVShape, model: torch.nn.Module, codec_call_bytes: int) -> tuple[Engine, int, dict | None]:
    """The engine over a paged KV cache of as many blocks as fit, for max_batch_size rows (plus the
    padding rows' spare slot), CUDA graphs on where the device has them. Returns (engine, rows,
    the budget's terms for run.json or None on the CPU). ``spec``: runners/family.py's LoadSpec."""
    slots, budget = kv_slots(spec, kv_shape, model, codec_call_bytes)
    blocks = slots * -(-spec.max_seq_len // BLOCK_SIZE)  # the memory of that many rows at max_seq_len, as blocks
    # deterministic mode shares no prefix: a row's prompt is computed whole, at its own fixed shapes
    kv, pool = kv_shape.paged(spec.max_batch_size, spec.max_seq_len, spec.dtype, spec.device,
                              share=not spec.deterministic, blocks=blocks)
    engine = Engine(model, kv, spec.device, DETERMINISTIC_SHAPES[spec.device.type] if spec.deterministic else None,
                    blocks=pool)
    if spec.device.type == "cuda":
        engine.use_graphs()  # the CPU path stays eager
    if budget is not None:
        budget = {**budget, "kv_mib": round(2 * kv.k_gpu.nbytes / 2**20, 1), "kv_blocks": blocks,
                  "kv_block_size": BLOCK_SIZE}
    return engine, spec.max_batch_size, budget


def kv_slots(spec, kv_shape: KVShape, model: torch.nn.Module, codec_call_bytes: int) -> tuple[int, dict | None]:
    """Rows of max_seq_len positions whose KV fits: max_batch_size, or fewer where that many
    would not fit in the memory left once weights and codec are loaded and room is kept
    for the rest of the run: the widest prefill's activations (measured here), the codec's
    calls beside the loop (``codec_call_bytes``), RUNTIME_SLACK_BYTES. None for the terms
    where there is no budget (the CPU). The cache holds that memory as blocks."""
    per_slot = kv_shape.slot_bytes(spec.max_seq_len, spec.dtype)
    if free_memory(spec.device) is None:
        return host_slots(spec, per_slot), None
    t0 = time.perf_counter()
    prefill = widest_prefill_bytes(spec, kv_shape, model)
    measured_s = time.perf_counter() - t0  # a cold process compiles the prefill's kernels here
    free = free_memory(spec.device)  # after the measurement: the workspaces it created stay
    headroom = prefill + codec_call_bytes + RUNTIME_SLACK_BYTES
    slots = kv_slots_within(free, per_slot, spec.max_batch_size, headroom)
    if slots < 1:
        raise OmniError(f"{spec.source}: not enough free memory on {spec.device} for one request's KV cache at "
                        f"max_seq_len {spec.max_seq_len} ({per_slot / 2**20:.0f} MiB per request, "
                        f"{free / 2**30:.1f} GiB free, {headroom / 2**30:.1f} GiB of it kept for "
                        f"activations, codec and workspaces): lower max_seq_len")
    mib = lambda n: round(n / 2**20, 1)  # noqa: E731
    return slots, {"free_mib": mib(free), "kv_slot_mib": mib(per_slot), "prefill_peak_mib": mib(prefill),
                   "codec_mib": mib(codec_call_bytes), "slack_mib": mib(RUNTIME_SLACK_BYTES),
                   "prefill_measured_in_s": round(measured_s, 3)}


def host_slots(spec, per_slot: int) -> int:
    """The CPU's slots: max_batch_size, or as many as half the host's available memory holds (the
    rest: activations, the codec, the process), so a large max_batch_size or max_seq_len is refused
    or cut down here rather than by the kernel's out-of-memory killer."""
    available = host_available()
    if available is None:
        return spec.max_batch_size
    slots = min(spec.max_batch_size, available // 2 // per_slot - 1)
    if slots < 1:
        raise OmniError(f"{spec.source}: one request's KV cache at max_seq_len {spec.max_seq_len} takes "
                        f"{per_slot / 2**30:.1f} GiB, more than half of the {available / 2**30:.1f} GiB of host memory "
                        "available: lower max_seq_len")
    return slots


def widest_prefill_bytes(spec, kv_shape: KVShape, model: torch.nn.Module) -> int:
    """Activation bytes of the widest prefill a step admits (at most max_batch_size rows,
    rows x the longest prompt within prefill_token_budget), measured by running one at least
    as wide: rows of max_seq_len text tokens, as many as cover the budget (where max_seq_len
    does not divide it, up to one row more than it admits), through the path the run takes
    (fused, or deterministic mode's fixed chunks, which pad to their own row count), on a
    one-slot cache that every row writes (what it then holds, and the logits, are dropped)."""
    t, device = spec.max_seq_len, spec.device
    rows = min(-(-prefill_token_budget(t) // t), spec.max_batch_size)
    kv = kv_shape.cache(1, t, spec.dtype, device)
    engine = Engine(model, kv, device, DETERMINISTIC_SHAPES[device.type] if spec.deterministic else None)
    zeros = torch.zeros(rows, dtype=torch.int64, device=device)
    fb = ForwardBatch(is_prefill=True, rids=[str(i) for i in range(rows)], slots_gpu=zeros, lengths_cpu=[t] * rows,
                      steps_cpu=[0] * rows, steps_gpu=zeros,
                      positions_gpu=torch.arange(t, device=device).expand(rows, t),
                      model_inputs={"input_ids": torch.zeros(rows, t, dtype=torch.int64, device=device)})
    peak = peak_bytes(lambda: engine.forward(fb), device)
    del engine, kv
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the one-slot cache too
    return peak
