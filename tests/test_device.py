"""runners/device.py helpers that have a CPU path of their own."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

_SCRIPT = """
import ctypes, os, sys
from omni_cli.runners.device import stderr_silenced
os.write(2, b"before\\n")
with stderr_silenced():
    sys.stderr.write("python inside\\n")
    os.write(2, b"fd inside\\n")
    ctypes.CDLL(None).write(2, b"libc inside\\n", 12)  # as torch's C++ warning is written
os.write(2, b"after\\n")
sys.stderr.write("python after\\n")
"""


def test_stderr_silenced_drops_every_write_to_stderr_inside_it_and_restores_it():
    res = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "before\nafter\npython after\n"


class _RoundRobinPool:
    """torch.cuda.Stream's pool as torch keeps it: `size` streams per priority, handed out in turn."""

    def __init__(self, size: int):
        self.size, self.drawn = size, {}

    def __call__(self, device=None, priority=0):
        from types import SimpleNamespace

        n = self.drawn[priority] = self.drawn.get(priority, 0) + 1
        return SimpleNamespace(cuda_stream=(1000 if priority else 1) + n % self.size, priority=priority)


def _fake_cuda(monkeypatch, pool_size: int):
    from types import SimpleNamespace

    import torch

    from omni_cli.runners import device

    monkeypatch.setattr(device, "_ROLE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", _RoundRobinPool(pool_size))
    monkeypatch.setattr(torch.cuda, "default_stream", lambda index=None: SimpleNamespace(cuda_stream=0))
    return device, torch.device("cuda", 0)


def test_role_streams_stay_distinct_after_the_stream_pool_wraps(monkeypatch):
    """The pool hands every 4th draw the same stream (torch's: every 32nd). Streams drawn by others
    first (a graph's, a library's) do not make two roles share one, a role keeps its stream, and
    the loop's priority draws from its own pool."""
    import torch

    device, cuda = _fake_cuda(monkeypatch, pool_size=4)
    roles = {"capture": device.role_stream(cuda, "capture")}
    for _ in range(3):
        torch.cuda.Stream(0)  # others' draws (graph builds, say): the pool's next is capture's stream
    roles.update({r: device.role_stream(cuda, r) for r in ("codec", "load")})
    loop = device.role_stream(cuda, "loop", priority=-100)
    handles = [s.cuda_stream for s in roles.values()]
    assert len(set(handles)) == 3 and 0 not in handles
    assert loop.priority == -100 and loop.cuda_stream not in handles
    for _ in range(5):
        torch.cuda.Stream(0)
    assert all(device.role_stream(cuda, r) is s for r, s in roles.items())


def test_a_role_with_no_stream_left_is_refused_by_name(monkeypatch):
    """A pool of two streams holds two roles; the third is an error that names it, not a shared stream."""
    import pytest

    device, cuda = _fake_cuda(monkeypatch, pool_size=2)
    a, b = device.role_stream(cuda, "capture"), device.role_stream(cuda, "codec")
    assert a.cuda_stream != b.cuda_stream
    with pytest.raises(RuntimeError, match="'load'"):
        device.role_stream(cuda, "load")


_THREADS = """
import ctypes, threading, torch
libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line or "libiomp" in line})
if not libs:
    print("no-openmp"); raise SystemExit
omp = ctypes.CDLL(libs[0])  # the OpenMP runtime torch runs its CPU kernels on
from omni_cli.audio_stage import AudioStage
torch.set_num_threads(1)  # as --deterministic on the CPU does before the run builds its stages
stage = AudioStage(None, batched=False)
codec_thread = stage._codec_thread.submit(omp.omp_get_max_threads).result()
stage._codec_thread.shutdown()
fresh = []
t = threading.Thread(target=lambda: fresh.append(omp.omp_get_max_threads()))
t.start(); t.join()
print(codec_thread, fresh[0])
"""


def test_the_codec_thread_runs_on_the_runs_torch_thread_count():
    """OpenMP keeps a thread count per thread: the codec thread takes the process's (one under
    --deterministic on the CPU), read from the OpenMP runtime torch loaded; control: a plain new
    thread keeps OpenMP's default (every core), where there are several."""
    import os

    import pytest

    res = subprocess.run([sys.executable, "-c", _THREADS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    if res.stdout.strip() == "no-openmp":
        pytest.skip("torch runs on no OpenMP runtime here")
    codec_thread, fresh = map(int, res.stdout.split())
    assert codec_thread == 1
    if len(os.sched_getaffinity(0)) > 1:
        assert fresh > 1
