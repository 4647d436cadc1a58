"""What omni bench's families share: the card's ceilings and the floor, one timed run through the
scheduler loop, the table and the plot."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omni_cli.loop import LoopStats, run_loop
from omni_cli.scheduler import Request, Scheduler
from omni_cli.warmup import warm_up_lm

# what `--peers` may name: omni's sync and async loops, the async loop under --deterministic
# (batch-invariant arithmetic), and each family's reference: transformers generate (Higgs), qwen-tts (Qwen3-TTS)
PEERS = ("sync", "async", "deterministic", "transformers", "qwen-tts")
# device-copy bytes/s (read plus written) by card name, first match: the H200's measured
# (shared/design/facts.md); the H100 SXM's (HBM3, rated 3.35 TB/s) as a torch copy measured it, about 3.0
CARD_BYTES_PER_S = (("H200", 4.27e12), ("H100 80GB HBM3", 3.0e12))
# bf16 matmul FLOP/s: the H200's measured (shared/design/facts.md); the H100 SXM is the same chip
MATMUL_FLOPS = 801e12
H200_BYTES_PER_S, H200_FLOPS = CARD_BYTES_PER_S[0][1], MATMUL_FLOPS


@dataclass
class BenchRow:
    peer: str
    batch: int
    ms_per_step: float
    audio_s_per_s: float
    floor_ms: float | None

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["of_floor"] = round(self.floor_ms / self.ms_per_step, 3) if self.floor_ms else None
        return d


_MEASURED: dict[str, float | None] = {}  # device -> its measured copy rate, once a process


def card_bytes_per_s(device: torch.device) -> float | None:
    """The device-copy rate the floor uses: CARD_BYTES_PER_S's for the cards it names, else this
    card's own copy rate measured once (measured_copy_bytes_per_s); None without CUDA."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    known = next((bw for key, bw in CARD_BYTES_PER_S if key in name), None)
    if known is not None:
        return known
    if str(device) not in _MEASURED:
        _MEASURED[str(device)] = measured_copy_bytes_per_s(device)
    return _MEASURED[str(device)]


def floor_ms(read_bytes: int, flops: int, device: torch.device) -> float | None:
    """A step's bytes read at the card's copy rate, or its FLOPs at the matmul rate, whichever is longer."""
    bw = card_bytes_per_s(device)
    return None if bw is None else 1e3 * max(read_bytes / bw, flops / MATMUL_FLOPS)


def measured_copy_bytes_per_s(device: torch.device, size: int = 1 << 30) -> float | None:
    """This card's device copy, bytes read plus written a second, best of five copies of `size` bytes."""
    if device.type != "cuda":
        return None
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * size / best


def failed_note(peer: str, batch: int, e: BaseException) -> str:
    """A peer's failure at a batch size as one line of the table's notes (the other peers stand)."""
    return f"{peer} batch {batch}: failed: {type(e).__name__}: {(str(e) or ' ').splitlines()[0]}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_label(device: torch.device) -> str:
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


@dataclass
class RunResult:
    stats: LoopStats
    wall_s: float
    hits: int
    misses: int
    tokens: dict[str, np.ndarray]  # per request [frames, C]
    logprobs: dict[str, np.ndarray]

    @property
    def ms_per_step(self) -> float:
        steps = self.stats.step_ms
        return float(np.median(steps[min(5, len(steps) - 1):]))  # past the first steps (graph captures)


def drive(runner, reqs: list[Request], max_batch: int, max_seq_len: int, async_decode: bool,
          device: torch.device) -> RunResult:
    """reqs through the scheduler loop after omni generate's warm-up (graph captures and a cold
    process's kernel compiles are startup, not part of the measured run)."""
    warm_up_lm(runner, reqs[:max_batch], max_seq_len, async_decode)
    sched = Scheduler(max_batch, max_seq_len, blocks=runner.kv_blocks, beside=True)
    for r in reqs:
        sched.add(r)
    sync(device)
    t0 = time.perf_counter()
    stats = run_loop(sched, runner, lambda rs: None, lambda rows, st: None, async_decode)
    wall = time.perf_counter() - t0
    return RunResult(stats, wall, runner.async_query_hit, runner.async_query_miss,
                     {r.rid: r.frames.array for r in reqs}, {r.rid: r.logprobs.array for r in reqs})


def progress(row: BenchRow) -> BenchRow:
    """A row as it is measured, on stderr: a run cut short still shows the rows it made."""
    print(f"  {row.peer} batch {row.batch}: {row.ms_per_step:.2f} ms/step, {row.audio_s_per_s:.2f} audio-s/s",
          file=sys.stderr, flush=True)
    return row


def table(rows: list[BenchRow], notes: list[str] = (), step: str = "step") -> str:
    """The rows (a Qwen3-TTS step is a frame: step="frame"), then a line per failed run."""
    lines = [f"{'peer':<13} {'batch':>5} {'ms/' + step:>9} {'audio-s/s':>10} {'floor ms':>9} {'of floor':>9}"]
    for r in rows:
        floor = f"{r.floor_ms:9.2f}" if r.floor_ms else f"{'-':>9}"
        frac = f"{r.floor_ms / r.ms_per_step:9.1%}" if r.floor_ms else f"{'-':>9}"
        lines.append(f"{r.peer:<13} {r.batch:>5} {r.ms_per_step:>9.2f} {r.audio_s_per_s:>10.2f} {floor} {frac}")
    return "\n".join(lines + list(notes))


def plot(rows: list[BenchRow], path: Path, shape: str, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"transformers": "transformers generate", "qwen-tts": "qwen-tts generate"}
    fig, ax = plt.subplots(figsize=(6, 4))
    for peer in dict.fromkeys(r.peer for r in rows):
        pts = [(r.batch, r.audio_s_per_s) for r in rows if r.peer == peer]
        ax.plot(*zip(*pts), marker="o", label=names.get(peer, f"omni {peer}"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("audio seconds per second")
    ax.set_title(f"{shape} on {device}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
