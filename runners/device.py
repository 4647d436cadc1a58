"""The few device objects whose CUDA and CPU versions differ: events, host staging, the loop's stream, early launch.

On the CPU every operation has finished when it returns, so an event is
complete as soon as it is recorded, and host staging needs no pinning. The
async-decode logic above this module is the same on both, so CI runs it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

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


def upload(host, device: torch.device, dtype: torch.dtype | None = None, pin: bool = False) -> torch.Tensor:
    """Host data (a list, array or tensor; a temporary) onto the device without waiting for it: a small
    pageable source is staged at once, where a blocking copy would wait for everything queued (the decode
    step launched beside a prefill). pin: through pinned memory, for a large source, whose pageable copy
    waits for the stream to drain; the caching host allocator keeps the block until the copy is done."""
    host = torch.as_tensor(host, dtype=dtype)
    if pin and device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host memory a device->host copy can fill asynchronously (pinned, on CUDA)."""
    return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=device.type == "cuda")


# What a run needs beside weights, KV cache, its widest prefill's activations
# (measured at start-up: peak_bytes) and the codec's calls (runners/higgs_audio_v2/
# runner.py): the CUDA graphs' pool (decode steps, small prefills), cuBLAS and cuDNN
# workspaces, the allocator's fragmentation
RUNTIME_SLACK_BYTES = 1 << 30


# The engine's GEMMs go through cuBLASLt, not the cuBLAS PyTorch picks by default: at 64 rows
# cuBLAS split the down projection into a GEMM and a reduction kernel; cuBLASLt makes the
# decode step and omni generate faster (BENCHMARKS.md, cuBLASLt for the engine's GEMMs)
ENGINE_BLAS = "cublaslt"


def use_engine_blas(device: torch.device) -> None:
    """Make ENGINE_BLAS PyTorch's BLAS on CUDA. Process-wide, and once set, left set: every GEMM
    of the run then takes it (the codec's included), whichever thread runs it and whenever; a
    setting toggled around the engine's calls would let a codec call beside them take either
    library, and so the run's bytes depend on timing."""
    if device.type == "cuda" and torch.backends.cuda.preferred_blas_library().name.lower() != ENGINE_BLAS:
        # torch's C++ prints a one-time "experimental feature" warning on this call, straight to
        # the process's stderr, which `omni generate -q` keeps for errors: the choice was measured
        with stderr_silenced():
            torch.backends.cuda.preferred_blas_library(ENGINE_BLAS)


@contextlib.contextmanager
def stderr_silenced():
    """File descriptor 2 pointed at os.devnull inside the block, C++ writes included. HAZARD:
    process-wide: another thread's writes to stderr meanwhile are lost, so keep the block to a
    call made before any thread that reports runs."""
    if sys.stderr is not None:
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all (closed by whoever started the process): nothing to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@contextlib.contextmanager
def blas_library(name: str):
    """PyTorch's BLAS set to `name` inside the block (one thread's work, nothing beside it: a
    peer measured as PyTorch runs it by default), restored after."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


# Held by every CUDA graph capture, and by the device-wide calls made beside one: a capture
# must not overlap another thread's device synchronize or cache flush, which spoil it (and
# torch.cuda.graph, used by the LM's graphs, does both before it captures). The codec
# thread captures its calls' graphs (runners/codec_graphs.py) while the decode loop runs
# and may capture a new prefill bucket.
CAPTURE_LOCK = threading.Lock()


# (device index, role) -> the process's stream for that role (role_stream)
_ROLE_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}
_ROLE_LOCK = threading.Lock()
ROLE_DRAWS = 64  # two turns of torch's pool of a priority


def role_stream(device: torch.device, role: str, priority: int = 0) -> torch.cuda.Stream:
    """The process's one CUDA stream for ``role`` on ``device``, made on first use and kept:
    "capture" (every graph's warm-up and capture), "codec" (the codec's calls: one thread
    decodes at a time), "loop" (the decode loop's, at ``priority``), "load" (weight copies),
    "cascade" (cascade attention's first kernel, a branch of the decode graph).

    NOTE: torch.cuda.Stream() hands out a pool of 32 streams per priority in turn, so the
    33rd asks for one already given: a codec call then ran on the stream a decode graph was
    capturing (a capture error, or the codec's kernels recorded into the graph, never run).
    A role's stream is drawn until it is no other role's and not the default stream."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _ROLE_LOCK:
        stream = _ROLE_STREAMS.get((index, role))
        if stream is not None:
            return stream
        taken = {s.cuda_stream for (i, _), s in _ROLE_STREAMS.items() if i == index}
        taken.add(torch.cuda.default_stream(index).cuda_stream)
        for _ in range(ROLE_DRAWS):
            stream = torch.cuda.Stream(index, priority=priority)
            if stream.cuda_stream not in taken:
                _ROLE_STREAMS[(index, role)] = stream
                return stream
    raise RuntimeError(f"no CUDA stream of priority {priority} left for role {role!r}: every one the pool "
                       f"gave in {ROLE_DRAWS} draws belongs to another role")


def empty_cache() -> None:
    """torch.cuda.empty_cache, never while another thread captures a graph."""
    with CAPTURE_LOCK:
        torch.cuda.empty_cache()


def kv_slots_within(free_bytes: int, per_slot_bytes: int, wanted: int, headroom: int) -> int:
    """How many KV slots (one running request each, plus the padding slot) fit in free memory
    once `headroom` bytes are left for everything else."""
    return min(wanted, max((free_bytes - headroom) // per_slot_bytes - 1, 0))


def peak_bytes(fn, device: torch.device) -> int:
    """Runs fn(); on CUDA, the device memory it allocated at its peak beyond what was allocated
    before, with its cached blocks handed back after; 0 on the CPU (which keeps no budget)."""
    if device.type != "cuda":
        fn()
        return 0
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    return peak


def free_memory(device: torch.device) -> int | None:
    """Free device memory in bytes, after what is loaded so far; None on the CPU (no budget)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]


class Laps:
    """Seconds between calls, by name (a load's phases); each waits for the device first, so a
    phase's queued kernels count in that phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.done: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.done[name] = round(now - self._t, 3)
        self._t = now


def host_available() -> int | None:
    """Bytes of host memory the kernel can still hand out (Linux's MemAvailable); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@contextlib.contextmanager
def priority_stream(device: torch.device):
    """Run the enclosed device work on a stream of the highest priority (CUDA; elsewhere a no-op).

    The decode loop runs on it and the codec on a stream of default priority
    (runners/higgs_audio_v2/runner.py): when both have work queued the GPU
    starts the loop's blocks first, so a codec call stalls a decode step less.
    A graph replayed into it runs at its priority (CUDA's default for graphs).
    Hazard: memory the enclosed code frees is reused on this stream only, so
    tensors made inside must not be handed to another stream without a wait."""
    if device.type != "cuda":
        yield
        return
    outer = torch.cuda.current_stream(device)
    stream = role_stream(device, "loop", priority=-100)  # clamped to the device's highest
    stream.wait_stream(outer)  # what was enqueued before (weights, tables) is ready
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        outer.wait_stream(stream)


# Programmatic dependent launch (a benchmark turns it off to measure it)
PDL = True
# Only the one-row step launches early: there it saves time, while at 64 and 256 rows, where
# the norm, rope and attention kernels sit between cuBLAS GEMMs, it costs a share of the step
# (BENCHMARKS.md, few-row projections)
PDL_MAX_ROWS = 1


def pdl_launch(device: torch.device, rows: int) -> dict:
    """Launch options of a Triton kernel over `rows` batch rows that may start before its
    predecessor ends.

    With programmatic dependent launch (Hopper on) the next kernel's programs
    start once every program of the current one is running (each calls
    ``gdc_launch_dependents`` first), run up to their ``gdc_wait`` and block
    there until the predecessor has finished and its writes are visible. So
    launch latency and the next kernel's weight loads overlap the current
    kernel's tail: at batch 1, where a step is ~150 short kernels in a row,
    this is a real share of the step. Hazard: a kernel launched so must wait
    before its first read of anything a predecessor writes and before its
    first write; only weight reads may go ahead of the wait. Returns {} where
    there is no such launch (the CPU, older GPUs, PDL off, wider batches): the
    kernels' waits are then compiled out."""
    ok = PDL and rows <= PDL_MAX_ROWS and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
    return {"launch_pdl": True} if ok else {}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(spec: str) -> torch.device:
    """A config's `device`: auto (CUDA where there is one), cpu, cuda or cuda:N."""
    from .errors import OmniError

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise OmniError(f"device {spec!r} requested but CUDA is not available")
    return torch.device(spec)


def describe(device: torch.device) -> str:
    """The device for run.json: 'cpu', or 'cuda:0 (NVIDIA H200)'."""
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def visible_gpus() -> int:
    """How many CUDA devices this process sees (omni generate --devices all)."""
    return torch.cuda.device_count()


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to dtype inside, restored after: modules built inside get their
    parameters in dtype directly (no float32 copy first)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def deterministic_cpu_threads(device: torch.device, deterministic: bool):
    """--deterministic on the CPU runs on one torch thread, then restores the count. On two
    threads a busy machine changed a codec row's bytes from run to run (some kernel splits its
    sums by the threads it actually gets). Threads that run torch ops take the count with
    adopt_torch_threads."""
    if not deterministic or device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def adopt_torch_threads() -> None:
    """The calling thread takes the process's torch thread count (a worker thread's initializer).
    NOTE: OpenMP keeps a thread count per thread: a thread started after torch.set_num_threads(1)
    in another still ran a oneDNN convolution on every core, while torch.get_num_threads() said 1."""
    torch.set_num_threads(torch.get_num_threads())


def use_all_cpu_threads() -> None:
    """torch's intra-op threads = the CPUs this process may run on (a Ray actor starts with its
    OMP_NUM_THREADS set to its CPU share; the CPU codec's rounding follows the thread count)."""
    import os

    torch.set_num_threads(len(os.sched_getaffinity(0)))
