"""Long rows at run time: a row split into chunks (omni_cli/longform.py) runs one chunk at a time.

Chunk 0 is queued with the other rows. When chunk k finishes (the loop's on_finished, on the
loop thread), its generated frames become codec codes (the family's RowCodec ``span`` /
``codes_into``: the delay pattern reverted) and chunk k+1's prompt is rendered after the row's
own context (a reference voice) plus the last ``buffer`` chunks as AudioTurn(text, codes) (fewer,
the latest, where the prompt would not fit max_seq_len; one at least, else the row fails),
tokenized, and added to the scheduler while the loop runs, so the loop keeps going; chunks of
different rows batch together as any requests do. Each chunk request goes through the audio
stage as a row of its own (decoded alone, or batched on CUDA); its writer callback keeps the
chunk's tokens, logprobs and samples, and once every chunk of the row is in, the row's one
wav (the chunks crossfaded), one npz (every chunk's arrays concatenated, plus
``chunk_frames``, ``chunk_samples``, ``chunk_texts``) and one manifest row (``chunks: n``) are
written. Any chunk's failure (its prompt, its KV need, its decode) fails the row once; the
chunks still in flight are dropped when they finish.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from omni_cli.chunk_store import ChunkStore
from omni_cli.errors import OmniError, RowError
from omni_cli.longform import CHUNK_METHODS, chunk_seed, crossfade_join, crossfade_samples, plan_chunks, texts_array
from omni_cli.prompts import PromptRow
from omni_cli.results import input_fields
from omni_cli.runners.family import AudioTurn, PromptFieldError
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request


@dataclass(eq=False)
class LongRow:
    row: PromptRow
    system: str
    params: SamplingParams
    seed: int  # the row's seed; chunk k's is chunk_seed(seed, k)
    texts: list[str]
    digest: str
    turns: list = field(default_factory=list)  # AudioTurn of each finished chunk (None: no codes)
    parts: dict = field(default_factory=dict)  # chunk index -> (tokens, logprobs, raw or None, samples)
    finish_reasons: list = field(default_factory=list)
    finish_reason: str | None = None  # once the last chunk is generated: "length" if any chunk's was; "failed"
    failed: bool = False
    resumed: int = 0  # chunks an earlier run finished (--resume: omni_cli/chunk_store.py)
    rid: str = ""  # its chunks' request ids' stem: "" the row's id (attempt 0), else a scoring attempt's
    first_prompt: object = None  # chunk 0's prompt (a scoring attempt starts the row over from it)

    @property
    def n(self) -> int:
        return len(self.texts)

    @property
    def stored(self) -> bool:
        """Its finished chunks are kept in the store: attempt 0's; a scoring attempt's are not."""
        return not self.rid


def chunk_rid(rid: str, k: int) -> str:
    """A chunk request's id: '#' never occurs in a row id (prompts.py), so it is unique."""
    return f"{rid}#{k}"


class ChunkedRows:
    def __init__(self, model, scheduler, buffer: int, store: ChunkStore | None = None, resume: bool = False):
        self.model, self.scheduler, self.buffer = model, scheduler, buffer
        self.store = store  # each finished chunk kept on disk until its row is written
        self.resume = resume  # --resume: a long row goes on after the chunks an earlier run kept
        self.results = None  # RowResults, AudioStage and Progress, set once they exist
        self.audio = None
        self.progress = None
        self._by_rid: dict[str, tuple[LongRow, int]] = {}  # chunk request id -> (its row, its index)
        self._lock = threading.Lock()

    def first_request(self, lr: LongRow, prompt) -> Request:
        """Chunk 0's request; with --resume, the first chunk an earlier run did not finish (its
        finished ones, its seed and their codes taken from the store)."""
        lr.first_prompt = prompt
        if self.store is not None:
            got = self.store.load(lr.row.id, lr.digest, lr.n) if self.resume else None
            if got is None:
                self.store.clear(lr.row.id)  # an earlier run's chunks of this row, if any, are stale
            else:
                lr.seed, parts, lr.finish_reasons = got
                for k, part in enumerate(parts):
                    lr.parts[k] = part
                    lr.turns.append(self._turn(lr.texts[k], part[0]))
                lr.resumed = len(parts)
                return self._next_request(lr, lr.resumed)
        return self._request(lr, 0, prompt)

    def _request(self, lr: LongRow, k: int, prompt) -> Request:
        req = Request(rid=chunk_rid(lr.rid or lr.row.id, k), prompt=prompt, params=lr.params,
                      seed=chunk_seed(lr.seed, k))
        self._by_rid[req.rid] = (lr, k)
        return req

    def retry(self, lr: LongRow, rid: str, seed: int) -> tuple[Request, int]:
        """A scoring attempt of a long row (omni_cli/quality/stage.py): every chunk again, from chunk 0's
        prompt, at the attempt's seed, under request ids of its own. Its chunks are not kept in the
        store: a killed run starts the row's attempts over, as it does a plain row's. Returns chunk 0's
        request and the chunks the audio stage will see."""
        again = LongRow(lr.row, lr.system, lr.params, seed, lr.texts, lr.digest, rid=rid, first_prompt=lr.first_prompt)
        if self.progress is not None:
            self.progress.more_chunks(again.n)
        return self._request(again, 0, lr.first_prompt), again.n

    def requests(self, rows: int, long_rows: list[LongRow]) -> int:
        """Requests the audio stage will see: one a plain row, n a long row."""
        return rows - len(long_rows) + sum(lr.n - lr.resumed for lr in long_rows)

    # ---- the loop thread ----
    def finished(self, reqs: list[Request]) -> None:
        """The loop's on_finished: queue each finished chunk's successor, then hand every request
        to the audio stage (after the codes are read: a writer releases the frames)."""
        for req in reqs:
            got = self._by_rid.get(req.rid)
            if got is not None:
                self._chunk_generated(req, *got)
        self.audio.finished(reqs)

    def _chunk_generated(self, req: Request, lr: LongRow, k: int) -> None:
        lr.finish_reasons.append(req.finish_reason)
        if self.progress is not None:
            self.progress.chunk_done()
        with self._lock:
            failed = lr.failed
        if failed:
            self.audio.expect(-(lr.n - k - 1))  # chunks that will never come
            return
        if k + 1 == lr.n:  # "length" where any chunk was cut at max_new_frames
            lr.finish_reason = "length" if "length" in lr.finish_reasons else req.finish_reason
            return
        try:
            lr.turns.append(self._turn(lr.texts[k], req.frames.array))
            nxt = self._next_request(lr, k + 1)
        except Exception as e:  # noqa: BLE001  (this row only)
            self._fail(lr, e if isinstance(e, RowError) else
                       f"row {lr.row.row}, chunk {k + 2} of {lr.n}: queueing it failed: {type(e).__name__}: {e}")
            self.audio.expect(-(lr.n - k - 1))
            return
        self.scheduler.add(nxt)

    def _turn(self, text: str, tokens: np.ndarray) -> AudioTurn | None:
        codes = self.model.codec.codes_of(tokens)
        return AudioTurn(text, codes) if len(codes) else None

    def _next_request(self, lr: LongRow, k: int) -> Request:
        """Chunk k's request: its prompt after the row's context and the last `buffer` chunks, or
        as many of the latest as fit max_seq_len with the chunk's frames (one at least)."""
        earlier = [t for t in lr.turns[max(0, k - self.buffer):k] if t is not None]
        for keep in list(range(len(earlier), 0, -1)) or [0]:  # the latest chunks first
            context = tuple(lr.row.context) + tuple(earlier[len(earlier) - keep:])
            rendered = self.model.render_prompt(lr.texts[k], lr.system, lr.row.scene, context, lr.row.fields)
            prompt = self.model.encode_prompts([rendered])[0]
            need = len(prompt.ids) + lr.params.max_new_frames - 1
            if need <= self.scheduler.max_seq_len:
                return self._request(lr, k, prompt)
        raise RowError(lr.row.row, "text", f"chunk {k + 1} of {lr.n}: its prompt ({len(prompt.ids)} tokens, the "
                       f"previous chunk's audio included) plus max_new_frames ({lr.params.max_new_frames}) needs "
                       f"{need} KV positions, over max_seq_len {self.scheduler.max_seq_len}: lower max_new_frames")

    def _fail(self, lr: LongRow, error) -> None:
        with self._lock:
            if lr.failed:
                return
            lr.failed = True
            lr.finish_reason = "failed"
            lr.parts.clear()
        quality = self.results.quality
        if quality is not None and quality.handles(lr.row.id):  # a failed attempt: scoring decides the row
            quality.attempt(lr.row, lr.seed, None, str(error))
            return
        self.results.fail(lr.row.row, lr.row.id, input_fields(lr.row, lr.system), str(error))

    # ---- the writer threads ----
    def write(self, req: Request, tokens: np.ndarray, samples) -> None:
        """The audio stage's writer callback: a chunk is kept until its row is whole; a plain row
        goes to RowResults."""
        got = self._by_rid.get(req.rid)
        if got is None:
            self.results.write(req, tokens, samples)
            return
        lr, k = got
        try:
            self._chunk_written(req, tokens, samples, lr, k)
        finally:
            req.release()

    def _chunk_written(self, req: Request, tokens, samples, lr: LongRow, k: int) -> None:
        where = f"row {lr.row.row}, chunk {k + 1} of {lr.n}"
        if isinstance(samples, Exception):
            self._fail(lr, f"{where}: decoding its audio failed: {samples}")
            return
        logprobs = req.logprobs.array
        if not np.isfinite(logprobs).all():
            self._fail(lr, f"{where}: its logprobs are not finite (NaN or infinite): a sampling value "
                           "(temperature, repetition_penalty) outside what the model's arithmetic holds")
            return
        raw = req.raw_logprobs.array.copy() if len(req.raw_logprobs) else None
        part = (np.array(tokens), logprobs.copy(), raw, np.asarray(samples))
        with self._lock:
            if lr.failed:
                return
            lr.parts[k] = part
            whole = len(lr.parts) == lr.n
        if whole:
            self._write_row(lr)
        elif self.store is not None and lr.stored:  # kept until the row is written: a killed run resumes after it
            self.store.save(lr.row.id, lr.digest, lr.seed, k, part, req.finish_reason)

    def _write_row(self, lr: LongRow) -> None:
        parts = [lr.parts[k] for k in range(lr.n)]
        lr.parts = {}
        tokens = np.concatenate([p[0] for p in parts])
        logprobs = np.concatenate([p[1] for p in parts])
        raw = np.concatenate([p[2] for p in parts]) if all(p[2] is not None for p in parts) else None
        samples, offsets = crossfade_join([p[3] for p in parts], crossfade_samples(self.model.sample_rate))
        frames = np.cumsum([0] + [len(p[0]) for p in parts]).astype(np.int64)
        arrays = {"chunk_frames": frames, "chunk_samples": np.asarray(offsets, dtype=np.int64),
                  "chunk_texts": texts_array(lr.texts)}
        written = self.results.write_row(lr.row, lr.system, lr.digest, lr.seed, lr.finish_reason, lr.params, tokens,
                                         logprobs, raw, samples, extra_meta={"chunks": lr.n}, extra_arrays=arrays)
        if written and self.store is not None and lr.stored:
            self.store.clear(lr.row.id)


def check_chunk_flags(method: str | None, buffer: int) -> None:
    """--chunk-method (None: the model family's default) and --chunk-buffer, before anything loads (exit 2)."""
    if method is not None and method not in CHUNK_METHODS:
        raise OmniError(f"--chunk-method must be one of {', '.join(CHUNK_METHODS)}, got {method!r}")
    if buffer < 1:
        raise OmniError(f"--chunk-buffer must be >= 1, got {buffer}")


def first_chunk(r: PromptRow, system: str, params: SamplingParams, model, chunking, text) -> tuple[list[str], object]:
    """The row's chunk texts (omni_cli/longform.py; one: not split) and the prompt to queue: the
    whole row's, or its first chunk's after the row's context."""
    if chunking is None:
        return [r.text], text
    texts = plan_chunks(r.text, r.chunk or chunking[1], params.max_new_frames, model.frame_rate)
    if len(texts) == 1:
        return texts, text
    try:
        return texts, model.render_prompt(texts[0], system, r.scene, r.context, r.fields)
    except PromptFieldError as e:
        raise RowError(r.row, e.field, e.message) from None
