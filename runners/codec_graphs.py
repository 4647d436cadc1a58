"""CUDA graphs of the codec's batched calls: one per call shape (rows, length bucket).

A masked call of the released codec launches ~170 kernels. Inside omni
generate the codec thread launches them while the writer threads hold the GIL
for long stretches, so at a run's drain the GPU sat idle for much of the
calls' time, waiting for launches, not for its kernels (BENCHMARKS.md, the
codec's calls as CUDA graphs). A graph replays a call with one launch.

A shape's first call runs eagerly (holding CAPTURE_LOCK): it makes cuDNN's plans and compiles
Triton's specializations, neither of which may happen inside a capture. Its
second call captures the graph and replays it; later calls copy their inputs
into the graph's buffers and replay. The capture runs on the codec's stream
(runners/device.py: role_stream, never a decode graph's) with capture_begin,
not torch.cuda.graph, whose device-wide synchronize and cache flush would
stall the decode loop (which keeps running on its own stream) and hand back
its cached blocks. On the CPU every call is eager.

HAZARDS: a replayed call's output is the graph's own buffer, which the shape's
next replay overwrites: the caller copies it out on the same stream before its
next call. An instance's graphs share one memory pool (a call's activations),
so they run one at a time, on one stream: one instance per thread. Each
graph's output stays allocated in that pool (up to 8 MiB: a call of
CODEC_BATCH_FRAMES frames as int16 samples), so at most MAX_GRAPHS shapes
are captured and the rest run eagerly: 15 more outputs than the one call the
KV budget counts fit in its slack (runners/device.py: RUNTIME_SLACK_BYTES). A run of one
length takes ~6 shapes (its padded batches); varied lengths a few per
length bucket.
"""

from __future__ import annotations

import contextlib

import torch

from .device import CAPTURE_LOCK

MAX_GRAPHS = 16


class CodecGraphs:
    def __init__(self, decode, device: torch.device):
        self.decode = decode  # (codes_gpu [B, Q, T] int64, lengths_gpu [B] int64) -> audio_gpu [B, samples]
        self.device = device
        self._capture = device.type == "cuda"
        self._seen: set[tuple[int, ...]] = set()  # shapes called once, eagerly
        self._graphs: dict[tuple[int, ...], tuple] = {}  # shape -> (codes_gpu, lengths_gpu, graph, audio_gpu)
        self._pool = torch.cuda.graph_pool_handle() if self._capture else None

    def __call__(self, codes_host: torch.Tensor, lengths_host: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] int64, lengths [B] int64, on the host (pinned on CUDA: their copies are
        queued, so the caller must not refill them until this call's work is done) -> what decode
        makes of them (audio [B, T * hop]) on the device, queued on the current stream."""
        shape = tuple(codes_host.shape)
        entry = self._graphs.get(shape)
        if entry is None and (not self._capture or shape not in self._seen or len(self._graphs) >= MAX_GRAPHS):
            first = self._capture and shape not in self._seen
            self._seen.add(shape)
            # a shape's first call loads kernels and makes cuDNN's plans, which may synchronize
            # the device: not while another thread captures (a decode graph's capture beside the
            # warm-up's first codec calls failed once, invalidated: cudaErrorStreamCaptureInvalidated)
            with CAPTURE_LOCK if first else contextlib.nullcontext():
                return self.decode(codes_host.to(self.device, non_blocking=True),
                                   lengths_host.to(self.device, non_blocking=True))
        if entry is None:
            entry = self._graphs[shape] = self._record(shape, tuple(lengths_host.shape))
        codes_gpu, lengths_gpu, graph, audio_gpu = entry
        codes_gpu.copy_(codes_host, non_blocking=True)
        lengths_gpu.copy_(lengths_host, non_blocking=True)
        graph.replay()
        return audio_gpu

    def _record(self, codes_shape: tuple[int, ...], lengths_shape: tuple[int, ...]) -> tuple:
        codes_gpu = torch.zeros(codes_shape, dtype=torch.int64, device=self.device)
        lengths_gpu = torch.zeros(lengths_shape, dtype=torch.int64, device=self.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the decode loop's thread keeps launching and allocating meanwhile;
        # CAPTURE_LOCK keeps its own captures (which synchronize the device) out of this one
        with CAPTURE_LOCK:
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                audio_gpu = self.decode(codes_gpu, lengths_gpu)
            finally:
                graph.capture_end()
        return codes_gpu, lengths_gpu, graph, audio_gpu
