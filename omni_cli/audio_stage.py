"""The audio stage: finished rows -> audio on one codec thread -> files on a pool of writers.

The decode loop hands each step's finished requests to ``finished``; rows wait
in a backlog until one batched codec call's worth has finished (or the last
rows), then the codec thread takes every row finished so far at once: when it
falls behind, its calls get bigger instead of its queue longer. Each codec
call's rows go to the writer threads as soon as that call completes, so
neither the loop nor the codec waits for the disk.

One codec thread: cuDNN sets up per thread and per input shape, and Python
launches the codec's kernels under the GIL anyway, so more codec threads add
set-up, not speed.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from omni_cli.runners.codec_stage import CodecStage
from omni_cli.runners.device import adopt_torch_threads
from omni_cli.scheduler import Request

# rows whose files are written at once (soundfile and numpy release the GIL)
WRITER_THREADS = 4


class AudioStage:
    def __init__(self, codec: CodecStage, batched: bool, family=None):
        self.codec = codec
        self.batched = batched  # rows decoded together (CUDA, default mode), else one by one
        # the family's codec_prefix / prefix_cut: frames a row's audio is decoded after (an in-context reference)
        self._family = family
        # the codec runs torch ops on its own thread: it takes the run's torch thread count (one under
        # --deterministic on the CPU), which a new thread does not inherit (runners/device.py)
        self._codec_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omni-codec",
                                                initializer=adopt_torch_threads)
        self._writers: ThreadPoolExecutor | None = None
        self._write: Callable | None = None
        self._pending: list[Future] = []  # appended by the loop's thread and the codec thread
        self._backlog: list[Request] = []
        self._lock = threading.Lock()
        self._rows_per_call = 1
        self._queued = self._taken = 0  # rows that will reach the codec, and those that did
        self._inflight = 0  # codec calls and writes submitted and not yet done
        self.codec_calls: list[float] = []  # seconds per codec-thread call that decoded rows
        self.codec_done = 0.0  # when the last of them returned (perf_counter)

    def warm(self, max_new_frames: int, rows: int) -> Future:
        """The codec's first-use costs at the run's shapes, on the codec thread (cuDNN's set-up is per thread)."""
        return self._codec_thread.submit(self.codec.warm, max_new_frames, rows, self.batched)

    def start(self, write: Callable[[Request, np.ndarray, object], None], queued: int, rows_per_call: int) -> None:
        """``write(req, tokens, samples or the error that kept it from being decoded)`` runs on a
        writer thread per row; ``queued`` rows will come; a codec call waits for ``rows_per_call``."""
        self._write, self._queued, self._rows_per_call = write, queued, rows_per_call
        self._writers = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="omni-writer")

    def expect(self, n: int) -> None:
        """n more (or, negative, fewer) rows will come than start was told: a long row's chunks
        that will never run once the row has failed (omni_cli/chunked.py)."""
        with self._lock:
            self._queued += n

    def finished(self, reqs: list[Request]) -> None:
        """The loop's callback: these requests finished in the last step."""
        with self._lock:
            self._backlog.extend(reqs)
            self._taken += len(reqs)
            ready = len(self._backlog) >= self._rows_per_call or self._taken >= self._queued
        if ready:
            self._submit(self._codec_thread, self._decode_and_write)

    def _submit(self, pool: ThreadPoolExecutor, fn, *args) -> None:
        with self._lock:
            self._inflight += 1
        future = pool.submit(fn, *args)
        future.add_done_callback(self._done)
        self._pending.append(future)

    def _done(self, _future) -> None:
        with self._lock:
            self._inflight -= 1

    def idle(self) -> bool:
        """No row waits for the codec and no codec call or write is under way (scoring's retries wait on it)."""
        with self._lock:
            return not self._backlog and self._inflight == 0

    def flush_stalled(self) -> None:
        """Rows left in the backlog with nothing under way (the loop is out of work): decode them now."""
        with self._lock:
            stalled = bool(self._backlog) and self._inflight == 0
        if stalled:
            self._submit(self._codec_thread, self._decode_and_write)

    def _decode_and_write(self, after_loop: bool = False) -> None:
        """On the codec thread: every row finished so far."""
        with self._lock:
            reqs = self._backlog[:]
            self._backlog.clear()
            drain = after_loop or self._taken >= self._queued  # the last rows: the loop decodes nothing more
        if not reqs:
            return  # an earlier call took them
        tokens = [r.frames.array for r in reqs]  # [frames, streams], as sampled
        prefixes = [self._prefix(r) for r in reqs]
        decoded = [t if p is None else np.concatenate([p, t]) for t, p in zip(tokens, prefixes)]
        t_call = time.perf_counter()
        for i, samples in decode_rows(self.codec, decoded, self.batched, drain):  # writes start as each call ends
            if prefixes[i] is not None and not isinstance(samples, Exception):  # the reference's part goes
                samples = samples[self._family.prefix_cut(len(prefixes[i]), len(decoded[i]), len(samples)):]
            self._submit(self._writers, self._write, reqs[i], tokens[i], samples)
        self.codec_done = time.perf_counter()
        self.codec_calls.append(self.codec_done - t_call)

    def _prefix(self, req: Request) -> np.ndarray | None:
        return None if self._family is None else self._family.codec_prefix(req.prompt)

    def drain(self) -> None:
        """After the loop (or Ctrl-C): rows still waiting are decoded, and every file is on disk."""
        self._pending.append(self._codec_thread.submit(self._decode_and_write, True))
        self._codec_thread.shutdown(wait=True)  # every finished request decoded, its files submitted
        if self._writers is not None:
            self._writers.shutdown(wait=True)

    def check(self) -> None:
        """Raise a bug in the codec or writer threads (expected errors fail their row instead)."""
        for f in list(self._pending):
            f.result()


def decode_rows(codec: CodecStage, tokens: list[np.ndarray], batched: bool, drain: bool = False):
    """Yields (row index, its audio as int16 samples or the error that kept it from being
    decoded) for every row, each codec call's rows as soon as that call completes.

    When a call fails (a batch out of memory, say), the rows not yet yielded
    are retried one by one, so that only a row that fails alone is lost."""
    done: set[int] = set()
    try:
        for rows, waves in codec.decode_calls(tokens, batched=batched, drain=drain):
            for i, wave in zip(rows, waves):
                done.add(i)
                yield i, wave
        return
    except Exception as e:  # noqa: BLE001  (a codec error: retried row by row, each failing alone)
        if len(tokens) == 1:
            yield 0, e
            return
    for i in sorted(set(range(len(tokens))) - done):
        try:
            yield i, codec.decode([tokens[i]], batched=False)[0]
        except Exception as e:  # noqa: BLE001
            yield i, e
