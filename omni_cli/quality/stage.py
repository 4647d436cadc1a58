"""The scoring stage: a row's attempts come in decoded, are scored on a thread of their own, and
the row is decided there: kept (its files written, ok or rejected) or tried again.

Path of an attempt: the loop -> the audio stage (codec, writer threads) -> RowResults.write_row,
which hands it here instead of writing it (`attempt`). The scoring thread takes the attempts
waiting, up to the batch size (up to BATCH_WAIT_S after the first for a fuller batch, while the
loop decodes or the audio stage holds rows: a scorer call costs about as much for one row as for
many), scores them with each scorer in turn, and decides each row
(omni_cli/quality/decide.py). A row still short of its attempts (best-of) waits; a rejected row
with retries left gets its next attempt, a Request with the derived seed, put in the inbox that
the loop empties into the scheduler between steps (`add_waiting`), so retries join the next
batches; a kept attempt is written by RowResults.commit with its scores and attempts.

The loop ends only when nothing can come back (`wait_for_more`): the scheduler empty, the audio
stage idle, this stage idle and its inbox empty, checked in that order (each feeds the next).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from omni_cli.quality.decide import Attempt, attempt_rid, attempt_seed, choose, manifest_fields
from omni_cli.quality.settings import QualitySettings
from omni_cli.runners.scoring import RowScores, ScoreInput, Scorer
from omni_cli.scheduler import Request

WAIT_S = 0.002  # the loop's poll while only scoring or writing can bring more work
BATCH_WAIT_S = 0.25  # how long a scorer call waits after its first row for more, while the loop decodes


@dataclass(eq=False)
class RowState:
    row: Any  # PromptRow
    system: str | None
    template: Request | None  # attempt 0's request (prompt, params, row seed); None: a long row
    long_row: Any = None  # a long row's attempt 0 (omni_cli/chunked.py: LongRow); attempts start it over
    attempts: dict[int, Attempt] = field(default_factory=dict)
    started: int = 1  # attempts queued so far
    done: bool = False

    @property
    def seed(self) -> int:
        """The row's seed: attempt 0's."""
        return self.template.seed if self.template is not None else self.long_row.seed


class QualityStage:
    def __init__(self, settings: QualitySettings, scorers: dict[str, Scorer], results, audio, reference_audio,
                 frame_rate: float, real_code_mask: Callable, retry_long: Callable):
        self.settings = settings
        self.scorers = scorers  # name -> Scorer, in the settings' order
        self.results, self.audio = results, audio  # omni_cli/results.py RowResults, omni_cli/audio_stage.py
        self._reference_audio = reference_audio  # PromptRow -> (float32 samples, rate) or None
        self.frame_rate, self._mask = frame_rate, real_code_mask
        # (LongRow, request id, seed) -> (chunk 0's request, chunks): a long row's attempt (ChunkedRows.retry)
        self._retry_long = retry_long
        self._rows: dict[str, RowState] = {}  # row id -> its state
        self._queue: queue.Queue = queue.Queue()
        self._inbox: list[Request] = []  # retries for the loop to add
        self._lock = threading.Lock()
        self._dry = threading.Event()  # the scheduler ran empty: score what is waiting at once
        self._busy = 0  # attempts handed in and not yet decided
        self.score_s = 0.0  # seconds the scoring thread spent in scorers
        self.scorer_s: dict[str, float] = {n: 0.0 for n in scorers}
        self.scored = self.retries = 0
        self.calls: list[int] = []  # rows in each scoring call (run.json: how full the batches ran)
        self.error: BaseException | None = None  # a bug of the scoring thread (raised by check)
        self._thread = threading.Thread(target=self._run, name="omni-scoring", daemon=True)
        self._thread.start()

    # ---- set-up (main thread) ----
    def register(self, row, system, req: Request | None, long_row=None) -> list[tuple[Request, int]]:
        """A queued row: req, its attempt-0 request, or long_row, a long row's attempt 0 (its chunks).
        Returns the extra attempts of --best-of, to queue beside it: (first request, requests the
        audio stage will see)."""
        state = RowState(row, system, req, long_row)
        self._rows[row.id] = state
        if self.settings.best_of == 1:
            return []
        state.started = self.settings.best_of
        return [self._request(state, k) for k in range(1, self.settings.best_of)]

    def _request(self, state: RowState, k: int) -> tuple[Request, int]:
        """Attempt k's first request (a long row's: its chunk 0) and the requests the audio stage will see."""
        seed = attempt_seed(state.seed, k)
        if state.long_row is not None:
            return self._retry_long(state.long_row, attempt_rid(state.row.id, k), seed)
        t = state.template
        return Request(rid=attempt_rid(t.rid, k), prompt=t.prompt, params=t.params, seed=seed), 1

    def attempt_index(self, row_id: str, seed: int) -> int:
        state = self._rows[row_id]
        return next(k for k in range(state.started) if attempt_seed(state.seed, k) == seed)

    def handles(self, row_id: str) -> bool:
        return row_id in self._rows

    # ---- the writer threads ----
    def attempt(self, row, seed: int, payload: tuple | None = None, error: str | None = None) -> None:
        """An attempt of `row` came out: payload (what RowResults.commit writes), or the error that
        failed it."""
        with self._lock:
            self._busy += 1
        self._queue.put((row.id, seed, payload, error))

    # ---- the loop thread ----
    def add_waiting(self, scheduler) -> None:
        """Retries waiting in the inbox into the scheduler (the loop's thread owns the scheduler)."""
        if not self._inbox:
            return
        with self._lock:
            reqs, self._inbox = self._inbox, []
        for req in reqs:
            try:
                scheduler.add(req)
            except Exception as e:  # noqa: BLE001  (it fit before: a bug; this row's attempt fails alone)
                self.audio.expect(-1)
                self.attempt(self._rows[req.rid.split("~")[0]].row, req.seed,
                             error=f"queueing its next attempt failed: {type(e).__name__}: {e}")

    def wait_for_more(self) -> bool:
        """With the scheduler empty: True while an attempt may still come back (wait a little first),
        False once none can."""
        self._dry.set()
        if self._inbox:
            return True
        if self.audio.idle() and self.idle() and not self._inbox:
            return False
        self.audio.flush_stalled()
        time.sleep(WAIT_S)
        return True

    def idle(self) -> bool:
        with self._lock:
            return self._busy == 0

    def close(self) -> None:
        """Every attempt handed in is decided; the scorers stay loaded (their owner closes them)."""
        self._queue.put(None)
        self._thread.join()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    # ---- the scoring thread ----
    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + BATCH_WAIT_S
            while len(batch) < self.settings.batch_size:
                try:
                    nxt = self._queue.get(timeout=0.01) if self._linger(deadline) else self._queue.get_nowait()
                except queue.Empty:
                    if self._linger(deadline):
                        continue
                    break
                if nxt is None:
                    self._queue.put(None)  # seen after this batch
                    break
                batch.append(nxt)
            try:
                self._handle(batch)
            except BaseException as e:  # noqa: BLE001  (a bug here: the rows fail, the run ends with it)
                self.error = self.error or e
                for rid, seed, payload, _ in batch:
                    self._fail_row(self._rows[rid], f"scoring it failed: {type(e).__name__}: {e}",
                                   traceback.format_exc())
            finally:
                with self._lock:
                    self._busy -= len(batch)

    def _linger(self, deadline: float) -> bool:
        """Whether a batch not yet full waits for more rows, until the deadline: while the loop still
        decodes or the audio stage still holds rows."""
        return time.monotonic() < deadline and (not self._dry.is_set() or not self.audio.idle())

    def _handle(self, batch: list) -> None:
        scored = [(rid, seed, payload) for rid, seed, payload, error in batch if error is None]
        results = self._score([self._input(self._rows[rid].row, payload) for rid, _, payload in scored])
        by_key = {(rid, seed): s for (rid, seed, _), s in zip(scored, results)}
        for rid, seed, payload, error in batch:
            state = self._rows[rid]
            k = self.attempt_index(rid, seed)
            a = Attempt(k, seed, payload=payload, error=error)
            if error is None:
                s = by_key[rid, seed]
                a.scores, a.reasons, a.text = dict(s), dict(s.reasons), dict(s.text)
                a.judge(self.settings.rules)
            state.attempts[k] = a
            self._decide(state)

    def _score(self, inputs: list[ScoreInput]) -> list[RowScores]:
        out = [RowScores() for _ in inputs]
        if not inputs:
            return out
        for name, scorer in self.scorers.items():
            t0 = time.perf_counter()
            try:
                got = scorer.score(inputs)
            except Exception as e:  # noqa: BLE001  (this scorer on this batch: each row alone, then None)
                got = [self._alone(scorer, x, e) for x in inputs]
            self.scorer_s[name] += time.perf_counter() - t0
            for o, g in zip(out, got):
                o.update(g)
                o.reasons.update(g.reasons)
                o.text.update(g.text)
        self.scored += len(inputs)
        self.calls.append(len(inputs))
        self.score_s = sum(self.scorer_s.values())
        return out

    @staticmethod
    def _alone(scorer: Scorer, x: ScoreInput, first: Exception) -> RowScores:
        try:
            return scorer.score([x])[0]
        except Exception as e:  # noqa: BLE001
            return RowScores().missing(scorer.score_names, f"the {scorer.name} scorer failed: {type(e).__name__}: {e}")

    def _input(self, row, payload: tuple) -> ScoreInput:
        (seed, finish_reason, params, tokens, logprobs, raw, samples, extra_meta, extra_arrays) = payload
        ref = self._reference_audio(row)
        return ScoreInput(audio=np.asarray(samples, dtype=np.float32) / 32768.0, sample_rate=self.results.sample_rate,
                          text=row.text, language=(row.fields or {}).get("language"),
                          reference=None if ref is None else ref[0], reference_rate=None if ref is None else ref[1],
                          codes=tokens, logprobs=logprobs, mask=self._mask(tokens), frame_rate=self.frame_rate,
                          max_new_frames=params.max_new_frames, finish_reason=finish_reason, id=row.id)

    def _decide(self, state: RowState) -> None:
        if len(state.attempts) < state.started:
            return  # best-of: the other attempts still run
        attempts = [state.attempts[k] for k in sorted(state.attempts)]
        kept, why = choose(attempts)
        if not kept.passes and state.started < self.settings.max_attempts:
            req, requests = self._request(state, state.started)
            state.started += 1
            self.retries += 1
            if state.template is not None:
                self.results.rows[req.rid] = self.results.rows[state.template.rid]
            self.audio.expect(requests)
            with self._lock:
                self._inbox.append(req)
            return
        state.done = True
        several = self.settings.max_attempts > 1
        if kept.error is not None:
            self._fail_row(state, kept.error, None, [a.record() for a in attempts] if several else None)
        else:
            self.results.commit(state.row, state.system, kept.payload, manifest_fields(kept, attempts, why, several),
                                self.settings.drop_rejected and bool(kept.broken))
        for a in attempts:
            a.payload = None  # the audio of attempts not kept

    def _fail_row(self, state: RowState, error: str, tb: str | None, attempts: list | None = None) -> None:
        if state.done and tb is not None:
            return
        state.done = True
        self.results.fail_row(state.row, state.system, error, attempts)
