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
