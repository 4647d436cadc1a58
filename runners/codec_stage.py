"""The codec stage: finished rows' codes -> int16 audio, in batched calls beside the decode loop.

Generic over model families: a family gives a ``RowCodec`` (runners/family.py),
which says where a row's codes are among its generated frames, how to lay them
out for the codec, and how to decode a padded batch; this stage does the
batching, length buckets, calls queued ahead, pinned buffers, the codec's stream
and CUDA graphs.

Runs on the caller's thread (omni generate's codec thread); on CUDA on the
process's codec stream (runners/device.py: role_stream), so the decode loop's
stream never waits for it. Hazard: one thread decodes at a time (its graphs
capture on that stream). Batched
(the default mode on CUDA): rows go through the codec together, padded to a
length bucket of CODEC_LENGTH_BUCKET codec frames and a power-of-two batch,
with the padding masked, so that a few shapes serve every length; a row's
audio then equals the row decoded alone up to rounding. Otherwise each row
goes alone at its own length, which deterministic mode needs (its bytes must
not depend on which rows finished with it).
"""

from __future__ import annotations

import collections
import contextlib
import threading

import numpy as np
import torch

from .audio import pcm16
from .codec_graphs import CodecGraphs
from .device import host_buffer, new_event, role_stream

# codec frames a batched call beside the loop holds; the KV budget keeps room for its
# activations (larger calls decode faster alone but hurt end to end: BENCHMARKS.md, codec)
CODEC_BATCH_FRAMES = 4096
# Once the decode loop has stopped (the drain), the codec and the writers go at about the
# same rate a row, so the drain's rows of a length bucket go in about CODEC_DRAIN_CALLS calls
# of a power of two rows each: the writers start sooner and fewer rows are left after the
# last call (BENCHMARKS.md, end to end); at least CODEC_DRAIN_FRAMES a call
CODEC_DRAIN_CALLS = 8
CODEC_DRAIN_FRAMES = 1536
# batched rows are padded to a multiple of this many codec frames
CODEC_LENGTH_BUCKET = 64
# batched calls queued on the GPU beyond the one being collected: the codec thread waits for
# the writers' GIL between calls, and queued calls keep the GPU busy meanwhile
CODEC_CALLS_AHEAD = 2


def length_bucket(codec_frames: int) -> int:
    """The padded length of a batched row: the next multiple of CODEC_LENGTH_BUCKET."""
    return -(-codec_frames // CODEC_LENGTH_BUCKET) * CODEC_LENGTH_BUCKET


def calls_of(n: int, rows: int) -> list[tuple[int, int]]:
    """The codec calls n rows of one length bucket take at most `rows` a call: (its rows, its
    padded batch) each; full calls, then the rest padded to a power of two (at most `rows`)."""
    calls = [(rows, rows)] * (n // rows)
    if n % rows:
        calls.append((n % rows, min(1 << (n % rows - 1).bit_length(), rows)))
    return calls


def batches_of(most: int, rows: int) -> set[int]:
    """Every padded batch that 1..most rows of one bucket take at `rows` a call."""
    return {b for n in range(1, most + 1) for _, b in calls_of(n, rows)}


class CodecStage:
    def __init__(self, codec, device: torch.device):
        """``codec``: the family's RowCodec (runners/family.py)."""
        self.codec = codec
        self.device = device
        self.num_streams = codec.num_streams
        self.sample_rate = codec.sample_rate
        self.hop_length = codec.hop_length
        # per calling thread: its host buffers, its codec graphs (codec_graphs.py)
        self._local = threading.local()
        self._lock = threading.Lock()  # batched calls are queued one at a time

    @staticmethod
    def call_bytes(codec, dtype: torch.dtype, graphed: bool) -> int:
        """Device memory the calls beside the loop keep: one call of CODEC_BATCH_FRAMES at the
        codec's per-frame peak, twice where batched and graphed (the graphs' pool and the eager
        first calls of shapes not captured yet each keep a call's activations)."""
        return codec.frame_bytes(dtype) * CODEC_BATCH_FRAMES * (2 if graphed else 1)

    def _stream(self):
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return torch.cuda.stream(role_stream(self.device, "codec"))

    def rows_per_call(self, max_new_frames: int) -> int:
        """How many rows of max_new_frames frames one batched call beside the loop holds."""
        n = self.codec.span(np.zeros((max_new_frames, self.num_streams), dtype=np.int64))[1]
        return self._rows_per_call(length_bucket(max(n, 1)))

    def _rows_per_call(self, length: int, drain_rows: int = 0) -> int:
        """Rows of a length bucket per batched call: within CODEC_BATCH_FRAMES; at a drain of
        `drain_rows` rows of the bucket, the largest power of two within a CODEC_DRAIN_CALLS-th
        of them or what CODEC_DRAIN_FRAMES hold, whichever is more, but never more than a call
        beside the loop holds."""
        rows = max(1, CODEC_BATCH_FRAMES // length)
        if not drain_rows:
            return rows
        share = max(CODEC_DRAIN_FRAMES // length, -(-drain_rows // CODEC_DRAIN_CALLS), 1)
        return min(rows, 1 << (share.bit_length() - 1))

    def warm(self, max_new_frames: int, rows: int, batched: bool) -> None:
        """Decode dummy codes at the shapes that rows running to max_new_frames take:
        batched, every padded batch that up to ``rows`` of them (rounded up to a power of two:
        a backlog may hold a few more) take in calls beside the loop or at the drain, at their
        length bucket; else one row at their exact length. Run it on the thread that will
        decode (cuDNN's set-up is per thread as well as per shape)."""
        frames = np.zeros((max_new_frames, self.num_streams), dtype=np.int64)
        if self.codec.span(frames)[1] == 0:
            return
        if not batched:
            self.decode([frames], batched)
            return
        most = 1 << (rows - 1).bit_length()
        # the drain's batches are among these: its calls hold a power of two no larger than these hold
        sizes = batches_of(most, self.rows_per_call(max_new_frames))
        # on CUDA two calls a shape: the first plans and compiles, the second captures its graph
        for n in sorted(sizes):
            for _ in range(2 if self.device.type == "cuda" else 1):
                self.decode([frames] * n, batched)

    def codes_of(self, tokens: np.ndarray) -> np.ndarray:
        """A row's generated frames [T, streams] -> its codec codes [n, streams] (n may be 0), as
        the codec reads them (the family's span and codes_into)."""
        first, n = self.codec.span(tokens)
        codes = np.zeros((self.num_streams, n), dtype=np.int64)
        if n:
            self.codec.codes_into(codes, tokens, first, n)
        return np.ascontiguousarray(codes.T)

    def decode(self, tokens: list[np.ndarray], batched: bool, drain: bool = False) -> list[np.ndarray]:
        """Generated frames, [T, C] per row -> their audio, int16 samples [samples] each at
        ``sample_rate``: every call of decode_calls, gathered in row order."""
        audio: list[np.ndarray | None] = [None] * len(tokens)
        for rows, waves in self.decode_calls(tokens, batched, drain):
            for i, wave in zip(rows, waves):
                audio[i] = wave
        return audio

    @torch.inference_mode()
    def decode_calls(self, tokens: list[np.ndarray], batched: bool, drain: bool = False):
        """Yields (row indices, their audio: int16 samples) per codec call, as each call
        completes, so the caller can write those rows while later calls run; rows without
        codes come first. A batched call holds at most CODEC_BATCH_FRAMES codec frames (with
        ``drain``, once the caller's decode loop has stopped: fewer, _rows_per_call), one
        batch runs at a time: the KV budget keeps room for one (runners/budget.py)."""
        # a row's codes are laid out call by call, as each call's input is filled: the first call starts sooner
        spans = [self.codec.span(t) for t in tokens]
        empty = [i for i, (_, n) in enumerate(spans) if n == 0]
        if empty:
            yield empty, [np.zeros(0, dtype=np.int16) for _ in empty]
        todo = [i for i, (_, n) in enumerate(spans) if n]
        with self._stream():
            if not batched:
                for i in todo:
                    codes = np.zeros((1, self.num_streams, spans[i][1]), dtype=np.int64)  # [1, C, T']
                    self.codec.codes_into(codes[0], tokens[i], *spans[i])
                    codes_gpu = torch.from_numpy(codes).to(self.device)
                    yield [i], [self._decode_pcm16(codes_gpu)[0].cpu().numpy()]  # waits for this stream only
                return
            buckets: dict[int, list[int]] = {}
            for i in todo:
                buckets.setdefault(length_bucket(spans[i][1]), []).append(i)
            # calls k+1..k+CODEC_CALLS_AHEAD are queued before call k's audio is collected, so the
            # GPU runs them while this thread copies k's rows out and hands them to the writers
            queued: collections.deque = collections.deque()
            calls = 0
            for length, members in buckets.items():
                rows = self._rows_per_call(length, len(members) if drain else 0)
                start = 0
                for n, batch in calls_of(len(members), rows):
                    chunk = members[start: start + n]
                    start += n
                    padded = np.zeros((batch, self.num_streams, length), dtype=np.int64)  # [B, C, T bucket]
                    lengths = np.zeros(batch, dtype=np.int64)  # padding rows: length 0, all masked
                    for j, i in enumerate(chunk):
                        self.codec.codes_into(padded[j], tokens[i], *spans[i])
                        lengths[j] = spans[i][1]
                    try:
                        queued.append((chunk, lengths, *self._launch(padded, lengths, calls % (CODEC_CALLS_AHEAD + 1))))
                    except Exception:
                        while queued:  # what already ran is kept
                            yield self._collect(*queued.popleft())
                        raise
                    calls += 1
                    if len(queued) > CODEC_CALLS_AHEAD:
                        yield self._collect(*queued.popleft())
            while queued:
                yield self._collect(*queued.popleft())

    def _decode_pcm16(self, codes_gpu: torch.Tensor, lengths_gpu: torch.Tensor | None = None) -> torch.Tensor:
        """codes [B, C, T] (lengths [B]) -> the files' samples [B, T * hop] int16, on the device."""
        return pcm16(self.codec.decode(codes_gpu, lengths_gpu))

    def _launch(self, padded: np.ndarray, lengths: np.ndarray, slot: int):
        """Queues one batched call (a CUDA graph from a shape's second call on) and the copy of
        its samples into this thread's host buffer `slot`. Returns (host samples [B, samples]
        int16, the copy's event).

        CODEC_CALLS_AHEAD + 1 buffers each way, used by calls in turn: a call's inputs go
        through pinned memory, so their copies queue behind the calls before it instead of the
        host waiting for them, and the calls run back to back on the GPU; a buffer is filled
        again once the call that used it was collected."""
        local = self._local
        if not hasattr(local, "graphs"):
            slots = CODEC_CALLS_AHEAD + 1
            local.graphs = CodecGraphs(self._decode_pcm16, self.device)
            local.inputs, local.hosts = [None] * slots, [None] * slots
        n = padded.size + lengths.size
        if local.inputs[slot] is None or local.inputs[slot].numel() < n:
            local.inputs[slot] = host_buffer((n,), torch.int64, self.device)
        codes_host = local.inputs[slot][: padded.size].view(padded.shape)
        lengths_host = local.inputs[slot][padded.size: n]
        codes_host.numpy()[...] = padded
        lengths_host.numpy()[...] = lengths
        with self._lock:
            wave_gpu = local.graphs(codes_host, lengths_host)  # [B, samples] int16; a graph's buffer: copied out next
        if local.hosts[slot] is None or local.hosts[slot].numel() < wave_gpu.numel():
            local.hosts[slot] = host_buffer((wave_gpu.numel(),), wave_gpu.dtype, self.device)
        host = local.hosts[slot][: wave_gpu.numel()].view(wave_gpu.shape)
        host.copy_(wave_gpu, non_blocking=True)
        done = new_event(self.device)
        done.record()
        return host, done

    def _collect(self, chunk: list[int], lengths: np.ndarray, host: torch.Tensor, done):
        """A launched call's rows: (their indices, their audio: views of one copy out of the
        reused buffer). One copy, not one a row: each copy lets go of the GIL and waits to get
        it back from the writer threads."""
        done.synchronize()
        wave = host.numpy()[: len(chunk)].copy()
        return chunk, [wave[j, : lengths[j] * self.hop_length] for j in range(len(chunk))]
