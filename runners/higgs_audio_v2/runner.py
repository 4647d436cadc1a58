"""Higgs Audio v2 runner: the delay pattern, the stop rule and the codec.

Delay pattern (as transformers' HiggsAudioV2DelayPatternLogitsProcessor and
``_sample``): codebook k lags k frames.
- Start ramp: per slot a counter ``bos_delay`` [C] starts at
  delay - (distance of the prompt's <|audio_out_bos|> from its end), i.e.
  [0, 1, ..., 7] for a prompt that ends in it. While a codebook's counter is
  >= 0 it is forced to stream-BOS, then the counter drops by one.
- EOS staircase: ``eos_delay`` [C] starts at [1, ..., 8] (less, if the prompt
  ends in delay tokens). Once any codebook of a row has emitted stream-EOS
  (the reference then feeds the text token ``audio_delay_token_id``), every
  later step lowers the counters by one, and codebooks whose counter is <= 0
  are forced to stream-EOS: codebook 0 first, then 1, ... a staircase.
- Stop: a row ends when all codebooks emit stream-EOS in one frame.
Each step feeds back the previous frame's codes (8 embeddings summed).
"""

from __future__ import annotations

import collections
import contextlib
import threading

import numpy as np
import torch

from ..attention import fused_kernels_available
from ..audio import pcm16
from ..base import BatchResult, ModelRunner, StepCollect
from ..codec_graphs import CodecGraphs
from ..device import host_buffer, new_event
from ..engine import Engine, ForwardBatch
from .codec import HiggsCodecDecoder
from .config import HiggsConfig

# codec frames per batched decode call: ~1.4 GiB of activations at the 3B codec
# in bf16 (~340 KB a frame, measured by benchmarks/codec_decode.py), which the
# KV budget keeps free (runners/higgs_audio_v2/__init__.py). Larger calls decode faster
# (bf16, masked, batch 64 x 8 s: 6,719 audio-s/s against 5,526 at batch 21) but were
# measured to hurt end to end (BENCHMARKS.md), so calls stay this size.
CODEC_BATCH_FRAMES = 4096
# Once the decode loop has stopped (the drain: the run's last rows), the codec and the
# writers are all that is left, at about the same rate (0.65-0.72 ms a row of 8 s for a
# graphed call of 32 down to 8 rows, benchmarks/codec_calls.py; ~0.66-1 ms a row for four
# writer threads, H200): the tail ends when the writers finish, which they start once the
# first call's rows are out, and after the codec's last call they still write its rows.
# So the drain's rows of a length bucket go in about CODEC_DRAIN_CALLS calls of a power
# of two rows each: that share of them, or as many as CODEC_DRAIN_FRAMES hold (8 of 8 s)
# if more, and never more than a call beside the loop holds. Batch 64, one wave: calls of
# 8 rows against 32 gave a tail of 0.054-0.062 s against 0.069-0.085 and 802-825
# audio-s/s against 772-792 (four runs each, alternating). More calls cost the writers:
# at batch 256, 32 calls of 8 rows kept them busy 0.80-1.11 s against 0.68-0.83 with
# eight calls of 32; 13 calls of 21 (what this gives) ran 1,505 and 1,505 against 1,487
# (benchmarks/e2e_generate.py; BENCHMARKS.md).
CODEC_DRAIN_CALLS = 8
CODEC_DRAIN_FRAMES = 1536
# a codec call's peak device memory per frame in bf16 (twice that in float32): the codec
# benchmark's peak, rounded up
CODEC_FRAME_BYTES = 350 << 10
# batched rows are padded to a multiple of this many codec frames (2.56 s)
CODEC_LENGTH_BUCKET = 64
# batched codec calls queued on the GPU beyond the one being collected: with one, a
# batch-256 drain sat idle 7-17 ms between its 22 ms calls, the codec thread waiting for the
# writers' GIL (benchmarks/drain_timeline.py, H200)
CODEC_CALLS_AHEAD = 2


def _length_bucket(codec_frames: int) -> int:
    """The padded length of a batched row: the next multiple of CODEC_LENGTH_BUCKET."""
    return -(-codec_frames // CODEC_LENGTH_BUCKET) * CODEC_LENGTH_BUCKET


def codec_bytes(frames: int, dtype: torch.dtype) -> int:
    """Device memory a codec call of this many frames peaks at, in the codec's dtype."""
    return frames * CODEC_FRAME_BYTES * (torch.finfo(dtype).bits // 8) // 2


def _calls(n: int, rows: int) -> list[tuple[int, int]]:
    """The codec calls n rows of one length bucket take at most `rows` a call: (its rows, its
    padded batch) each; full calls, then the rest padded to a power of two (at most `rows`)."""
    calls = [(rows, rows)] * (n // rows)
    if n % rows:
        calls.append((n % rows, min(1 << (n % rows - 1).bit_length(), rows)))
    return calls


def _batches(most: int, rows: int) -> set[int]:
    """Every padded batch that 1..most rows of one bucket take at `rows` a call."""
    return {b for n in range(1, most + 1) for _, b in _calls(n, rows)}


class HiggsRunner(ModelRunner):
    sample_rate: int

    def __init__(self, engine: Engine, cfg: HiggsConfig, codec: HiggsCodecDecoder, num_slots: int,
                 max_seq_len: int, device: torch.device, raw_logprobs: bool = False):
        self.cfg = cfg
        self.num_streams = cfg.num_codebooks
        self.vocab_size = cfg.codebook_size
        self.ras_excluded_tokens = (cfg.audio_stream_bos_id, cfg.audio_stream_eos_id)
        super().__init__(engine, num_slots, max_seq_len, device, raw_logprobs)
        if codec.num_quantizers != cfg.num_codebooks:
            raise ValueError(f"codec has {codec.num_quantizers} quantizers, the model {cfg.num_codebooks} codebooks")
        self.codec = codec
        self.kv_budget: dict | None = None  # the KV budget's terms, set by build (run.json)
        self.load_phases: dict[str, float] = {}  # build's start-up phases, seconds (run.json)
        # per calling thread: its CUDA stream, its two host buffers, its codec graphs (codec_graphs.py)
        self._codec_local = threading.local()
        self._codec_lock = threading.Lock()  # batched codec calls are queued one at a time
        self.sample_rate = codec.sample_rate
        self.hop_length = codec.hop_length
        c, s = cfg.num_codebooks, num_slots + 1  # + the padding rows' slot
        self.last_codes_gpu = torch.zeros(s, c, dtype=torch.int64, device=device)
        self.bos_delay_gpu = torch.zeros(s, c, dtype=torch.int64, device=device)
        self.eos_delay_gpu = torch.zeros(s, c, dtype=torch.int64, device=device)
        self.delay_started_gpu = torch.zeros(s, dtype=torch.bool, device=device)
        cols = torch.arange(cfg.codebook_size, device=device)
        self._not_bos_gpu = cols != cfg.audio_stream_bos_id  # [V]
        self._not_eos_gpu = cols != cfg.audio_stream_eos_id
        self._fused = fused_kernels_available(device)  # the two methods below as one kernel each (fused_step.py)

    def _initial_delays(self, prompt_ids: list[int]) -> tuple[list[int], list[int], bool]:
        """bos_delay, eos_delay and delay_started for a prompt, from its last C tokens."""
        c = self.cfg.num_codebooks
        tail = prompt_ids[-c:]
        delay = list(range(1, c + 1))

        def shifted(token_id: int, absent: list[int]) -> list[int]:
            if token_id not in tail:
                return absent
            after = c - tail.index(token_id)  # reference: delay_pattern_size - first index in the tail
            return [d - after for d in delay]

        bos = shifted(self.cfg.audio_bos_token_id, [0] * c)
        eos = shifted(self.cfg.audio_delay_token_id, delay)
        return bos, eos, prompt_ids[-1] == self.cfg.audio_delay_token_id

    # ---- hooks -----------------------------------------------------------
    def before_prefill(self, fb: ForwardBatch, requests) -> None:
        init = [self._initial_delays(r.prompt_ids) for r in requests]
        s = fb.slots_gpu
        self.bos_delay_gpu[s] = torch.tensor([i[0] for i in init]).to(self.device)
        self.eos_delay_gpu[s] = torch.tensor([i[1] for i in init]).to(self.device)
        self.delay_started_gpu[s] = torch.tensor([i[2] for i in init]).to(self.device)

    def before_decode(self, fb: ForwardBatch, requests) -> None:
        fb.model_inputs["audio_codes"] = self.last_codes_gpu[fb.slots_gpu][:, None, :]  # [B, 1, C]

    def sample_before_post(self, is_prefill: bool) -> bool:
        return True  # the collect below needs this step's codes

    def process_logits(self, logits_gpu: torch.Tensor, fb: ForwardBatch, requests) -> torch.Tensor:
        s = fb.slots_gpu
        if self._fused:
            from .fused_step import delay_masks

            return delay_masks(logits_gpu, s, fb.steps_gpu, self.slot_gpu["min_new_frames"], self.bos_delay_gpu,
                               self.eos_delay_gpu, self.delay_started_gpu, self.cfg.audio_stream_bos_id,
                               self.cfg.audio_stream_eos_id)
        scores = logits_gpu.view(fb.batch_size, self.num_streams, self.vocab_size)
        # no stream-EOS before min_new_frames (the staircase only follows a sampled EOS)
        early = (fb.steps_gpu < self.slot_gpu["min_new_frames"][s])[:, None, None]
        scores = scores.masked_fill(early & ~self._not_eos_gpu, float("-inf"))
        bos = self.bos_delay_gpu[s]
        force_bos = bos >= 0  # [B, C]
        scores = scores.masked_fill(force_bos[..., None] & self._not_bos_gpu, float("-inf"))
        self.bos_delay_gpu[s] = torch.where(force_bos, bos - 1, bos)
        eos = self.eos_delay_gpu[s] - self.delay_started_gpu[s][:, None].to(torch.int64)
        self.eos_delay_gpu[s] = eos
        return scores.masked_fill((eos <= 0)[..., None] & self._not_eos_gpu, float("-inf"))

    def publish(self, result: BatchResult, fb: ForwardBatch) -> torch.Tensor:
        """Device half of the collect: advance the slots' state; return the payload for the host.

        The payload packs codes (exact in float32, < 2^24), logprobs, the stop
        flag [, raw logprobs] -> [B, 2C + 1 (+ C)] float32, one copy per step.
        """
        tokens = result.next_token_ids_gpu  # [B, C]
        s = fb.slots_gpu
        if self._fused:
            from .fused_step import publish

            return publish(tokens, result.logprobs_gpu, result.raw_logprobs_gpu, s, self.last_codes_gpu,
                           self.delay_started_gpu, self.cfg.audio_stream_eos_id)
        self.last_codes_gpu[s] = tokens  # the next step's input stays on the device
        is_eos = tokens == self.cfg.audio_stream_eos_id
        self.delay_started_gpu[s] = self.delay_started_gpu[s] | is_eos.any(dim=-1)
        parts = [tokens.float(), result.logprobs_gpu, is_eos.all(dim=-1).float()[:, None]]
        if result.raw_logprobs_gpu is not None:
            parts.append(result.raw_logprobs_gpu)
        return torch.cat(parts, dim=1)

    def post_prefill(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        result.host = self.publish(result, fb).cpu().numpy()

    def post_decode(self, result: BatchResult, fb: ForwardBatch, requests) -> None:
        result.host = result.payload_gpu.cpu().numpy()  # published by the decode step

    def post_decode_launch(self, result: BatchResult, fb: ForwardBatch, requests) -> torch.Tensor:
        payload = result.payload_gpu
        staging = self.next_host_staging((self.num_slots, payload.shape[1]), payload.dtype)
        staging[: fb.batch_size].copy_(payload, non_blocking=True)
        return staging

    def post_decode_resolve(self, launch_buf: torch.Tensor, result: BatchResult, fb: ForwardBatch, requests) -> None:
        # copy out: the buffer is refilled by the launch after next
        result.host = launch_buf[: fb.batch_size].numpy().copy()

    def collect_outputs(self, result: BatchResult, fb: ForwardBatch, requests) -> list[StepCollect]:
        c, h = self.num_streams, result.host
        raw = h.shape[1] > 2 * c + 1
        return [StepCollect(tokens=h[i, :c].astype(np.int64), logprobs=h[i, c: 2 * c].astype(np.float32),
                            raw_logprobs=h[i, 2 * c + 1:].astype(np.float32) if raw else None,
                            stopped=bool(h[i, 2 * c]))
                for i in range(len(requests))]

    # ---- audio -----------------------------------------------------------
    def real_code_mask(self, tokens: np.ndarray) -> np.ndarray:
        """True where a sampled entry is an audio code, not stream BOS/EOS."""
        return (tokens != self.cfg.audio_stream_bos_id) & (tokens != self.cfg.audio_stream_eos_id)

    # Generated frames [T, C] -> codec codes [C, T'], as HiggsAudioV2Processor.batch_decode: drop
    # everything up to the last all-BOS frame and from the first all-EOS frame on (_codec_span),
    # revert the delay pattern (codebook k read k frames later) and clip stream tokens into the
    # code range (_revert_into). T' = T_inner - C + 1, or 0.
    def _codec_span(self, tokens: np.ndarray) -> tuple[int, int]:
        """(first, n) for generated frames [T, C]: the inner frames (after the last all-BOS frame,
        before the first all-EOS one after it) start at `first`, and give n codec frames."""
        bos, eos = self.cfg.audio_stream_bos_id, self.cfg.audio_stream_eos_id
        all_bos = np.flatnonzero((tokens == bos).all(axis=1))
        start = int(all_bos[-1]) if all_bos.size else 0
        all_eos = np.flatnonzero((tokens[start:] == eos).all(axis=1))
        end = start + int(all_eos[0]) if all_eos.size else len(tokens)
        first = start + 1
        return first, max(end - first - self.num_streams + 1, 0)

    def _revert_into(self, out: np.ndarray, tokens: np.ndarray, first: int, n: int) -> None:
        """out [C, >= n] int64: codebook k's codes are tokens[first + k : first + k + n, k] (the
        delay pattern reverted), clipped into the code range; written in place."""
        for k in range(self.num_streams):
            np.clip(tokens[first + k: first + k + n, k], 0, self.cfg.audio_stream_bos_id - 1, out=out[k, :n])

    def _codec_stream(self):
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        if not hasattr(self._codec_local, "stream"):
            self._codec_local.stream = torch.cuda.Stream(self.device)
        return torch.cuda.stream(self._codec_local.stream)

    def codec_rows_per_call(self, max_new_frames: int) -> int:
        """How many rows of max_new_frames frames one batched codec call beside the loop holds."""
        n = self._codec_span(np.zeros((max_new_frames, self.num_streams), dtype=np.int64))[1]
        return self._rows_per_call(_length_bucket(max(n, 1)))

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

    def warm_codec(self, max_new_frames: int, rows: int, batched: bool) -> None:
        """Decode dummy codes at the shapes that rows running to max_new_frames take:
        batched, every padded batch that up to ``rows`` of them (rounded up to a power of two:
        a backlog may hold a few more) take in calls beside the loop or at the drain, at their
        length bucket; else one row at their exact length. Run it on the thread that will
        decode (cuDNN's set-up is per thread as well as per shape)."""
        frames = np.zeros((max_new_frames, self.num_streams), dtype=np.int64)  # max_new_frames - C codec frames
        if self._codec_span(frames)[1] == 0:
            return
        if not batched:
            self.decode_audio([frames], batched)
            return
        most = 1 << (rows - 1).bit_length()
        # the drain's batches are among these: its calls hold a power of two no larger than these hold
        sizes = _batches(most, self.codec_rows_per_call(max_new_frames))
        # on CUDA two calls a shape: the first plans and compiles, the second captures the shape's
        # graph (codec_graphs.py)
        for n in sorted(sizes):
            for _ in range(2 if self.device.type == "cuda" else 1):
                self.decode_audio([frames] * n, batched)

    def decode_audio(self, tokens: list[np.ndarray], batched: bool, drain: bool = False) -> list[np.ndarray]:
        """Generated frames, [T, C] per request -> their audio, int16 samples [samples] each at
        ``sample_rate`` (runners/audio.py): every call of decode_audio_calls, gathered in row order."""
        audio: list[np.ndarray | None] = [None] * len(tokens)
        for rows, waves in self.decode_audio_calls(tokens, batched, drain):
            for i, wave in zip(rows, waves):
                audio[i] = wave
        return audio

    @torch.inference_mode()
    def decode_audio_calls(self, tokens: list[np.ndarray], batched: bool, drain: bool = False):
        """Yields (row indices, their audio: int16 samples) per codec call, as each call completes, so the
        caller can write those rows while later calls run; rows without codes come first.

        Runs on the caller's thread (omni generate's codec thread); on CUDA on
        a stream of that thread's own, so the decode loop's stream never waits
        for it. ``batched`` (the default mode on CUDA): rows go through the
        codec together, padded to a length bucket of CODEC_LENGTH_BUCKET codec
        frames and a power-of-two batch, with the padding masked (codec.decode
        with lengths), so that a few shapes serve every length; a row's audio
        then equals the row decoded alone up to rounding. Otherwise each row
        goes alone at its own length, which deterministic mode needs (its
        bytes must not depend on which rows finished with it). A call holds at
        most CODEC_BATCH_FRAMES codec frames (with ``drain``, when the caller's
        decode loop has stopped: fewer, _rows_per_call), and one batch runs at a
        time: the KV budget keeps room for one (__init__.py: _kv_slots)."""
        # where each row's codes are (its delay pattern is reverted call by call, as each call's
        # input is filled: the first call of a 256-row wave starts sooner)
        spans = [self._codec_span(t) for t in tokens]
        empty = [i for i, (_, n) in enumerate(spans) if n == 0]
        if empty:
            yield empty, [np.zeros(0, dtype=np.int16) for _ in empty]
        todo = [i for i, (_, n) in enumerate(spans) if n]
        with self._codec_stream():
            if not batched:
                for i in todo:
                    codes = np.zeros((1, self.num_streams, spans[i][1]), dtype=np.int64)  # [1, C, T']
                    self._revert_into(codes[0], tokens[i], *spans[i])
                    codes_gpu = torch.from_numpy(codes).to(self.device)
                    yield [i], [self._decode_pcm16(codes_gpu)[0].cpu().numpy()]  # waits for this stream only
                return
            buckets: dict[int, list[int]] = {}
            for i in todo:
                buckets.setdefault(_length_bucket(spans[i][1]), []).append(i)
            # Calls ahead: calls k+1..k+CODEC_CALLS_AHEAD are queued before call k's audio is
            # collected, so the GPU runs them while this thread copies k's rows out and hands
            # them to the writers, whose encoding holds the GIL this thread then waits for.
            queued: collections.deque = collections.deque()
            calls = 0
            for length, members in buckets.items():
                rows = self._rows_per_call(length, len(members) if drain else 0)
                start = 0
                for n, batch in _calls(len(members), rows):
                    chunk = members[start: start + n]
                    start += n
                    padded = np.zeros((batch, self.num_streams, length), dtype=np.int64)  # [B, C, T bucket]
                    lengths = np.zeros(batch, dtype=np.int64)  # padding rows: length 0, all masked
                    for j, i in enumerate(chunk):
                        self._revert_into(padded[j], tokens[i], *spans[i])
                        lengths[j] = spans[i][1]
                    try:
                        queued.append((chunk, lengths, *self._launch_codec(padded, lengths,
                                                                          calls % (CODEC_CALLS_AHEAD + 1))))
                    except Exception:
                        while queued:  # what already ran is kept
                            yield self._collect_codec(*queued.popleft())
                        raise
                    calls += 1
                    if len(queued) > CODEC_CALLS_AHEAD:
                        yield self._collect_codec(*queued.popleft())
            while queued:
                yield self._collect_codec(*queued.popleft())

    def _decode_pcm16(self, codes_gpu: torch.Tensor, lengths_gpu: torch.Tensor | None = None) -> torch.Tensor:
        """codes [B, C, T] (lengths [B]: codec.decode's) -> the files' samples [B, T * hop] int16, on the device."""
        return pcm16(self.codec.decode(codes_gpu, lengths_gpu))

    def _launch_codec(self, padded: np.ndarray, lengths: np.ndarray, slot: int):
        """Queues one batched codec call (a CUDA graph from a shape's second call on) and the
        copy of its samples into this thread's host buffer `slot`. Returns (host samples
        [B, samples] int16, the copy's event).

        CODEC_CALLS_AHEAD + 1 buffers each way, used by calls in turn: a call's inputs go
        through pinned memory, so their copies queue behind the calls before it instead of the
        host waiting for them (as from pageable memory), and the calls run back to back on
        the GPU; a buffer is filled again once the call that used it was collected."""
        local = self._codec_local
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
        with self._codec_lock:
            wave_gpu = local.graphs(codes_host, lengths_host)  # [B, samples] int16; a graph's buffer: copied out next
        if local.hosts[slot] is None or local.hosts[slot].numel() < wave_gpu.numel():
            local.hosts[slot] = host_buffer((wave_gpu.numel(),), wave_gpu.dtype, self.device)
        host = local.hosts[slot][: wave_gpu.numel()].view(wave_gpu.shape)
        host.copy_(wave_gpu, non_blocking=True)
        done = new_event(self.device)
        done.record()
        return host, done

    def _collect_codec(self, chunk: list[int], lengths: np.ndarray, host: torch.Tensor, done):
        """A launched call's rows: (their indices, their audio: views of one copy out of the
        reused buffer). One copy, not one a row: each copy lets go of the GIL and waits to get
        it back from the writer threads (up to the 5 ms switch interval each time)."""
        done.synchronize()
        wave = host.numpy()[: len(chunk)].copy()
        return chunk, [wave[j, : lengths[j] * self.hop_length] for j in range(len(chunk))]
