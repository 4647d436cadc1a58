"""The few device objects whose CUDA and CPU versions differ: events and host staging.

On the CPU every operation has finished when it returns, so an event is
complete as soon as it is recorded, and host staging needs no pinning. The
async-decode logic above this module is the same on both, so CI runs it.
"""

from __future__ import annotations

import torch


class CpuEvent:
    """Stands in for torch.cuda.Event on the CPU: complete once recorded."""

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def new_event(device: torch.device):
    return torch.cuda.Event() if device.type == "cuda" else CpuEvent()


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host memory a device->host copy can fill asynchronously (pinned, on CUDA)."""
    return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=device.type == "cuda")


# KV headroom: prefill activations (a 32-prompt chunk of 2048-token buckets at
# the 3B width peaks near 2 GiB), the graph pool, the codec and the allocator's slack
KV_HEADROOM_BYTES = 4 << 30


def kv_slots_within(free_bytes: int, per_slot_bytes: int, wanted: int, headroom: int = KV_HEADROOM_BYTES) -> int:
    """How many KV slots (one running request each, plus the padding slot) fit in free memory."""
    return min(wanted, max((free_bytes - headroom) // per_slot_bytes - 1, 0))


def free_memory(device: torch.device) -> int | None:
    """Free device memory in bytes, after what is loaded so far; None on the CPU (no budget)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]
