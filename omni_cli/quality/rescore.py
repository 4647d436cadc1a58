"""`omni score OUT`: score the rows of an existing folder and write the fields in place.

OUT: an omni output folder, or any folder of audio with a manifest, metadata.jsonl (preferred
where both exist) or metadata.csv, naming each row's `file_name` (relative to OUT) and text
(--text-column). Rows whose status is failed, interrupted or skipped (no audio) are left as they
are. The speaker scorer reads a row's `reference.file` (omni's) or `ref_audio`; degenerate its
`logprobs_file` npz (tokens, logprobs, mask) and, from run.json's family, the frame rate.

Each scored row gets the fields `omni generate --score LIST --reject RULES` writes for it
(decide.py: manifest_fields of its only attempt), in the manifest's own format:
- metadata.jsonl: `status` (ok | rejected), `scores`, `score_notes` (name -> why it is null),
  `transcript`, `rejected_by`; this run's scores replace the row's earlier ones;
- metadata.csv: a column `score_<name>` a score (empty: null, its reason in the `score_notes`
  JSON), `status`, `transcript`, `rejected_by` (comma-joined); missing columns are appended.
No file moves (a rejected row under rejected/ stays there whatever its status).

Resumable: the manifest is rewritten whole (temporary + rename) after every batch. A row whose
scores hold every score name of the enabled scorers is only judged again by this run's rules
(scored again under --rescore). The folder's lock, `omni generate`'s, is held throughout; run.json,
where there is one, gets a `scoring` entry. A row that cannot be read is named by its manifest line
and id, left as it is, and the others are scored (exit 1).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from omni_cli.errors import OmniError
from omni_cli.folder import lock_existing
from omni_cli.output import _atomic_write, json_line, write_run_json
from omni_cli.quality.decide import Attempt, manifest_fields
from omni_cli.quality.settings import quality_settings
from omni_cli.runners.scoring import ScoreInput, score_owners, scorer_class

FRAME_RATES = {"higgs_audio_v2": 25.0, "qwen3_tts": 12.5}  # run.json's config.family -> codec frames a second
LEFT = ("failed", "interrupted", "skipped")  # omni's statuses of rows without audio
CSV_FIELDS = ("status", "transcript", "rejected_by", "score_notes")
FIELDS = ("scores", "score_notes", "transcript", "rejected_by")
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
PROGRESS_S = 10.0  # a progress line at most this often (not under --quiet)
OWNERS = score_owners()  # score name -> its scorer


class ScoreInterrupted(OmniError):
    exit_code = 130


@dataclass
class ScoreOptions:  # what quality_settings reads (score, reject, the models, batch_size) and the rest
    score: str | None = None
    reject: str | None = None
    asr_model: str | None = None
    speaker_model: str | None = None
    mos_model: str | None = None
    batch_size: int = 16
    device: str = "auto"
    text_column: str = "text"
    quiet: bool = False
    rescore: bool = False
    utmos_model: str | None = None


@dataclass
class ScoreReport:
    scored: int = 0
    skipped: int = 0  # scored before
    left: int = 0  # rows without audio (LEFT)
    rejected: int = 0
    unscored: list[str] = field(default_factory=list)  # 'line N, id X: why'
    means: dict[str, float] = field(default_factory=dict)


class Manifest:
    """A manifest's rows as dicts (a CSV row decoded into the JSON fields), each with its line."""

    def __init__(self, path: Path, text_column: str):
        self.path, self.header, self.rows, self.lines, self._raw = path, None, [], [], []
        self._dirty: set[int] = set()
        (self._read_csv if path.suffix == ".csv" else self._read_jsonl)(text_column)

    def _read_jsonl(self, text_column: str) -> None:
        for n, line in enumerate(self.path.read_bytes().split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):  # a cut last line included: omni's runs end with whole lines
                raise OmniError(f"{self.path} line {n}: not a JSON object (a generate run killed mid-write? "
                                "finish it with omni generate --resume)")
            self.rows.append(row), self.lines.append(n), self._raw.append(line.decode("utf-8") + "\n")
        for key, what in (("file_name", "file_name (the audio file)"), (text_column, "the text (--text-column)")):
            if self.rows and not any(key in r for r in self.rows):
                raise OmniError(f"{self.path}: no row has the field '{key}': {what}")

    def _read_csv(self, text_column: str) -> None:
        reader = csv.DictReader(io.StringIO(self.path.read_text(encoding="utf-8-sig"), newline=""))
        self.header = list(reader.fieldnames or [])
        for key in ("file_name", text_column):
            if key not in self.header:
                raise OmniError(f"{self.path}: no column '{key}' (its columns: {', '.join(self.header) or 'none'})")
        start, owners = reader.line_num + 1, OWNERS
        for cells in reader:
            row = {k: v for k, v in cells.items() if k is not None and not (k.startswith("score_") and k[6:] in owners)
                   and k not in CSV_FIELDS}
            try:
                notes = json.loads(cells.get("score_notes") or "{}")
                scores = {k[6:]: (float(v) if v else None) for k, v in cells.items() if k and k.startswith("score_")
                          and k[6:] in owners and (v or k[6:] in notes)}
            except (ValueError, TypeError, AttributeError):
                notes, scores = {}, {}  # not this module's cells: the row is scored again
            row |= {"scores": scores} if scores else {}
            row |= {"score_notes": notes} if notes and isinstance(notes, dict) else {}
            row |= {k: cells[k] for k in ("status", "transcript") if cells.get(k)}
            row |= {"rejected_by": cells["rejected_by"].split(",")} if cells.get("rejected_by") else {}
            self.rows.append(row), self.lines.append(start)
            start = reader.line_num + 1

    def update(self, i: int, fields: dict) -> None:
        row = self.rows[i]
        new = {k: v for k, v in row.items() if k not in FIELDS} | fields
        if new != row:
            row.clear(), row.update(new), self._dirty.add(i)

    def write(self) -> None:
        for i in self._dirty if self.header is None else ():
            self._raw[i] = json_line(self.rows[i])  # the other lines stay as they were, byte for byte
        if self._dirty:
            _atomic_write(self.path, ("".join(self._raw) if self.header is None else self._csv()).encode("utf-8"))
        self._dirty.clear()

    def _csv(self) -> str:
        names = list(dict.fromkeys(n for r in self.rows for n in r.get("scores", {})))
        extra = ["status", *(f"score_{n}" for n in names), "transcript", "rejected_by", "score_notes"]
        header = self.header + [c for c in extra if c not in self.header and  # a score's column even if all empty
                                (c.startswith("score_") and c[6:] in OWNERS or any(_cell(r, c) for r in self.rows))]
        buf = io.StringIO()
        w = csv.DictWriter(buf, header, lineterminator="\n")
        w.writeheader()
        w.writerows({c: _cell(r, c) for c in header} for r in self.rows)
        return buf.getvalue()


def _cell(row: dict, col: str) -> str:
    if col.startswith("score_") and col[6:] in OWNERS:
        v = row.get("scores", {}).get(col[6:])
        return "" if v is None else repr(float(v))
    v = row.get(col)
    if col == "score_notes":
        return json.dumps(v, ensure_ascii=False) if v else ""
    if col == "rejected_by":
        return ",".join(v) if v else ""
    return "" if v is None else str(v)


def find_manifest(out: Path) -> Path:
    if not out.is_dir():
        raise OmniError(f"{out}: no such folder" if not out.exists() else f"{out} is not a folder")
    for name in ("metadata.jsonl", "metadata.csv"):
        if (out / name).is_file():
            return out / name
    audio = [p for p in out.rglob("*") if p.suffix.lower() in (".wav", ".flac", ".mp3", ".ogg")]
    raise OmniError(f"{out} has no manifest: metadata.jsonl or metadata.csv, with a file_name column (the audio, "
                    f"relative to the folder) and a text column, is missing" +
                    (f" beside its {len(audio)} audio files" if audio else ""))


def run_score(out: Path, opts: ScoreOptions) -> ScoreReport:
    if not opts.score:
        raise OmniError("--score: name the scorers to run: asr, mos, speaker, degenerate, utmos")
    if not DEVICE.match(opts.device):
        raise OmniError(f"--device: must be auto, cpu, cuda or cuda:N, got {opts.device!r}")
    if opts.batch_size < 1:
        raise OmniError(f"--batch-size: must be an integer >= 1, got {opts.batch_size}")
    settings = quality_settings({}, None, opts)
    find_manifest(out)
    lock = lock_existing(out)
    try:
        manifest = Manifest(find_manifest(out), opts.text_column)
        info = _run_json(out)
        cfg = (info or {}).get("config")
        family = cfg.get("family") if isinstance(cfg, dict) else None
        from omni_cli.quality.job import build_scorers
        from omni_cli.runners.device import pick_device

        device = str(pick_device(opts.device))
        job = _Job(out, manifest, settings, opts, FRAME_RATES.get(family))
        todo = job.plan()
        scorers, _ = build_scorers(settings, device) if todo else ({}, 0.0)
        try:
            job.run(todo, scorers)
        finally:
            for s in scorers.values():
                s.close()
        report = job.finish()
        if info is not None:
            info["scoring"] = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "scorers": list(settings.scorers), "rules": [str(r) for r in settings.rules],
                               "models": {k: v for k, v in settings.as_record().items() if k.endswith("_model")},
                               "device": device, "manifest": manifest.path.name, "rows_scored": report.scored,
                               "rows_skipped": report.skipped, "rows_rejected": report.rejected,
                               "unscored": report.unscored, "means": report.means}
            write_run_json(out, info)
    finally:
        lock.release()
    return report


def _run_json(out: Path) -> dict | None:
    try:
        info = json.loads((out / "run.json").read_text(encoding="utf-8"))
        return info if isinstance(info, dict) else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        _warn(f"{out / 'run.json'} does not load ({e}): no scoring entry is written there")


def _warn(message: str) -> None:
    print(f"omni: warning: {message}", file=sys.stderr, flush=True)


class _Job:
    def __init__(self, out: Path, manifest: Manifest, settings, opts: ScoreOptions, frame_rate: float | None):
        self.out, self.m, self.settings, self.opts, self.frame_rate = out, manifest, settings, opts, frame_rate
        self.names = [n for s in settings.scorers for n in scorer_class(s).score_names]
        self.report = ScoreReport()

    def _unscored(self, i: int, why: str) -> None:
        row = self.m.rows[i]
        self.report.unscored.append(f"{self.m.path.name} line {self.m.lines[i]}, id "
                                    f"{row.get('id', row.get('file_name'))!r}: {why}")
        _warn(f"{self.report.unscored[-1]}; not scored")

    def plan(self) -> list[int]:
        """The rows to score; the others counted, rows scored before judged by this run's rules."""
        todo = []
        for i, row in enumerate(self.m.rows):
            scores = row.get("scores")
            if row.get("status") in LEFT:
                self.report.left += 1
            elif not self.opts.rescore and isinstance(scores, dict) and all(n in scores for n in self.names):
                self.report.skipped += 1
                a = Attempt(0, 0, scores=dict(scores))
                a.judge(self.settings.rules)
                self.m.update(i, {k: row[k] for k in FIELDS if k in row and k != "rejected_by"} |
                              {"status": "rejected" if a.broken else "ok"} |
                              ({"rejected_by": a.broken} if a.broken else {}))
            elif not isinstance(row.get("file_name"), str) or not row["file_name"]:
                self._unscored(i, "field 'file_name' is missing or not a file name")
            elif not isinstance(row.get(self.opts.text_column), str):
                self._unscored(i, f"field '{self.opts.text_column}' is missing or not text")
            elif not (self.out / row["file_name"]).is_file():
                self._unscored(i, f"field 'file_name': {self.out / row['file_name']} does not exist")
            else:
                todo.append(i)
        self.m.write()
        return todo

    def run(self, todo: list[int], scorers: dict) -> None:
        from omni_cli.quality.stage import QualityStage

        last = time.monotonic()
        try:
            for start in range(0, len(todo), self.opts.batch_size):
                rows, inputs = [], []
                for i in todo[start:start + self.opts.batch_size]:
                    try:
                        inputs.append(self._input(i)), rows.append(i)
                    except (OSError, ValueError, KeyError, RuntimeError) as e:
                        self._unscored(i, str(e))
                attempts = [Attempt(0, 0) for _ in inputs]
                for scorer in scorers.values() if inputs else ():
                    try:
                        got = scorer.score(inputs)
                    except Exception as e:  # noqa: BLE001  (as the generate stage: each row alone, then None)
                        got = [QualityStage._alone(scorer, x, e) for x in inputs]
                    for a, g in zip(attempts, got):
                        a.scores.update(g), a.reasons.update(g.reasons), a.text.update(g.text)
                for i, a in zip(rows, attempts):
                    a.judge(self.settings.rules)
                    self.m.update(i, manifest_fields(a, [a], "the only attempt", several=False))
                self.m.write()
                self.report.scored += len(rows)
                if not self.opts.quiet and time.monotonic() - last > PROGRESS_S:
                    print(f"omni score: {self.report.scored}/{len(todo)} rows scored", file=sys.stderr, flush=True)
                    last = time.monotonic()
        except KeyboardInterrupt:
            raise ScoreInterrupted(f"interrupted after {self.report.scored} rows scored (saved in {self.m.path}); "
                                   "run omni score again to go on") from None

    def _input(self, i: int) -> ScoreInput:
        """The row as scorers see it; ValueError naming the field that does not read."""
        import soundfile as sf

        from omni_cli.voices import read_clip

        row, used = self.m.rows[i], self.settings.scorers
        ref_key = "reference" if isinstance(row.get("reference"), dict) else "ref_audio"
        ref = row["reference"].get("file") if ref_key == "reference" else row.get("ref_audio")
        key = "file_name"
        try:  # soundfile: mono float32, channels averaged; a stored PCM_16 row reads as generate scored it
            samples, rate = sf.read(self.out / row[key], dtype="float32", always_2d=True)
            key, clip = ref_key, (read_clip(self.out / Path(str(ref)).expanduser()) if ref and "speaker" in used
                                  else None)
            key, arrays = "logprobs_file", {}
            if row.get(key) and "degenerate" in used:
                with np.load(self.out / row[key]) as z:
                    arrays = {"codes": z["tokens"], "logprobs": z["logprobs"], "mask": z["mask"].astype(bool)}
        except Exception as e:  # noqa: BLE001  (missing, not audio, not an npz, a key missing)
            raise ValueError(f"field '{key}': {type(e).__name__}: {e}") from None
        frames, finish = row.get("max_new_frames"), row.get("finish_reason")
        return ScoreInput(audio=samples.mean(axis=1, dtype=np.float32), sample_rate=int(rate),
                          text=row[self.opts.text_column], language=row.get("language") or None,
                          reference=clip and clip.samples, reference_rate=clip and clip.rate, **arrays,
                          frame_rate=self.frame_rate, max_new_frames=int(frames) if str(frames).isdigit() else None,
                          finish_reason=finish if finish in ("stop", "length") else None,
                          id=str(row.get("id", row["file_name"])))

    def finish(self) -> ScoreReport:
        rep, sums = self.report, {}
        for row in self.m.rows:
            rep.rejected += row.get("status") == "rejected"
            for n, v in (row.get("scores") or {}).items():
                if n in self.names and isinstance(v, (int, float)) and math.isfinite(v):
                    sums.setdefault(n, []).append(float(v))
        rep.means = {n: round(sum(v) / len(v), 6) for n, v in sums.items()}
        if not self.opts.quiet:
            means = ", ".join(f"{n} {v:.4g}" for n, v in rep.means.items())
            print(f"omni score: {rep.scored} rows scored, {rep.skipped} already scored, {rep.left} failed rows left, "
                  f"{len(rep.unscored)} unreadable; {rep.rejected} rejected"
                  + (f"; mean {means}" if means else ""), file=sys.stderr, flush=True)
        return rep
