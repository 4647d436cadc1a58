"""A run's row outcomes: files and manifest rows through the OutputWriter, counts, progress.

Called from the main thread (rows rejected before the run, interrupted rows)
and from the writer threads (rows the codec decoded), so the counts are locked.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from rich.markup import escape

from omni_cli.output import REJECTED_DIR, OutputWriter
from omni_cli.progress import Progress
from omni_cli.prompts import PromptRow
from omni_cli.scheduler import Request


def input_fields(r: PromptRow, system: str | None) -> dict:
    """A failed row's input as the manifest keeps it, so that it can be fixed from there: its checked
    fields, then any field it gave that did not pass (as given: a CSV cell's text), and the id it
    gave where the manifest's differs."""
    refs = {k: getattr(r, k) for k in ("ref_audio", "ref_text", "voice") if getattr(r, k) is not None}
    typed = {"text": r.text, "scene": r.scene, "system": r.system if system is None else system, "seed": r.seed,
             **refs, **r.fields, **r.overrides, **({"chunk": r.chunk} if r.chunk is not None else {})}
    given = {k: v for k, v in r.raw.items() if k != "id" and typed.get(k) in (None, "")}
    if r.given_id is not None and str(r.given_id) != r.id:
        given["given_id"] = r.given_id
    return typed | given


def reference_record(r: PromptRow) -> dict | None:
    """The manifest's record of a row's reference voice: what `omni verify` regenerates it from."""
    if r.reference is None:
        return None
    voice, sha = r.reference
    return {"name": voice.name, "file": str(voice.path), "sha256": sha, "text": voice.text}


class RowResults:
    def __init__(self, writer: OutputWriter, progress: Progress, real_code_mask, quiet: bool):
        self.writer, self.progress, self.quiet = writer, progress, quiet
        self._real_code_mask = real_code_mask  # the family's: tokens [T, C] -> bool
        self.ok = self.failed = self.rejected = 0  # failed: rows that failed on their own
        self.interrupted = self.skipped = 0  # rows a signal or --max-failures stopped first
        self.write_busy: list[float] = []  # seconds per row written, on the writer threads
        self._lock = threading.Lock()
        self.rows: dict[str, tuple] = {}  # request id -> (its prompt row, its system prompt, ...)
        self.quality = None  # the scoring stage (omni_cli/quality/stage.py), where the run scores rows
        self.sample_rate = writer.sample_rate

    def fail(self, row: int, rid: str, fields: dict, error: str, status: str = "failed") -> None:
        """A row that did not come out: failed (an error of its own) or, after the run stopped,
        interrupted / skipped / failed with the run's error. Printed even under --quiet (errors only)."""
        with self._lock:
            self.failed += status == "failed"
            self.interrupted += status == "interrupted"
            self.skipped += status == "skipped"
        self.writer.write_failed(row, rid, fields, error, status=status)
        self.progress.row_done(0.0, status)
        if status == "failed":
            self.progress.print_line(f"[red]omni: {escape(error)}[/red]")

    def write(self, req: Request, tokens: np.ndarray, samples) -> None:
        """On a writer thread: one decoded row's files (or its failure)."""
        try:
            self._write(req, tokens, samples)
        finally:
            req.release()  # written or failed: a run keeps every Request to its end, not their frames

    def _write(self, req: Request, tokens: np.ndarray, samples) -> None:
        row, system, _, digest = self.rows[req.rid]
        raw = req.raw_logprobs.array if len(req.raw_logprobs) else None
        self.write_row(row, system, digest, req.seed, req.finish_reason, req.params, tokens, req.logprobs.array,
                       raw, samples)

    def write_row(self, row: PromptRow, system: str, digest: str, seed: int, finish_reason: str, params,
                  tokens: np.ndarray, logprobs: np.ndarray, raw, samples, extra_meta: dict | None = None,
                  extra_arrays: dict | None = None) -> bool:
        """One row's files and manifest row (or its failure): a request's, or a long row's chunks joined
        (omni_cli/chunked.py: extra_meta and extra_arrays add its chunk fields and arrays). True: ok.
        With scoring on (omni_cli/quality/stage.py) the attempt goes to the scoring stage instead,
        which writes the attempt it keeps through commit."""
        error = None
        if isinstance(samples, Exception):
            error = f"decoding its audio failed: {samples}"
        elif len(samples) == 0:  # a 44-byte wav is no result: the row ended before its first whole frame
            error = (f"it generated no audio: its speech ended after {len(tokens)} frames, before the first whole "
                     f"frame of audio (finish reason: {finish_reason})")
        elif not np.isfinite(logprobs).all():  # garbage, not a result: a sampling value past what float32 holds
            error = ("its logprobs are not finite (NaN or infinite): a sampling value (temperature, "
                     "repetition_penalty) outside what the model's arithmetic holds")
        if self.quality is not None and self.quality.handles(row.id):
            payload = None if error else (seed, finish_reason, params, np.array(tokens), np.array(logprobs),
                                          None if raw is None else np.array(raw), samples, extra_meta, extra_arrays)
            self.quality.attempt(row, seed, payload, error)  # the arrays copied: the request's frames are released
            return error is None
        if error is not None:
            self.fail_row(row, system, error)
            return False
        return self.commit(row, system, (seed, finish_reason, params, tokens, logprobs, raw, samples, extra_meta,
                                         extra_arrays), {}, False, digest)

    def commit(self, row: PromptRow, system: str, payload: tuple, fields: dict, aside: bool,
               digest: str | None = None) -> bool:
        """Write a row's kept attempt: fields, the scoring's manifest fields (status ok or rejected,
        scores, attempts); aside: its files under rejected/ (--drop-rejected). True: written."""
        seed, finish_reason, params, tokens, logprobs, raw, samples, extra_meta, extra_arrays = payload
        rid = row.id
        digest = digest if digest is not None else self.rows[rid][3]
        t_write = time.perf_counter()
        meta = {"row": row.row, "text": row.text, "scene": row.scene, "system": system, **row.fields, "seed": seed,
                "finish_reason": finish_reason, **params.as_record(), "row_hash": digest,
                **({"chunk": row.chunk} if row.chunk is not None else {}), **(extra_meta or {}),
                **({"warnings": list(row.warnings)} if row.warnings else {})}
        if row.reference is not None:
            meta["reference"] = reference_record(row)
        meta.update(fields)
        status = fields.get("status", "ok")
        try:
            record = self.writer.write_ok(row.row, rid, samples, tokens, logprobs, self._real_code_mask(tokens), meta,
                                          raw, extra_arrays, subdir=REJECTED_DIR if aside else "")
        except Exception as e:  # noqa: BLE001  (a full disk, a bad value: this row only)
            self.fail(row.row, rid, input_fields(row, system),
                      f"row {row.row}: writing its outputs failed: {type(e).__name__}: {e}")
            return False
        with self._lock:
            self.ok += status == "ok"
            self.rejected += status == "rejected"
            self.write_busy.append(time.perf_counter() - t_write)
        if "scores" in fields:
            self.progress.scores(fields["scores"])
        self.progress.row_done(record["duration_s"], status)
        return True

    def fail_row(self, row: PromptRow, system: str, error: str, attempts: list | None = None) -> None:
        """A row that failed on its own; attempts: each attempt's record, where it had several."""
        fields = input_fields(row, system) | ({"attempts": attempts} if attempts else {})
        self.fail(row.row, row.id, fields, f"row {row.row}: {error}")
