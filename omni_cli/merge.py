"""`omni merge OUT1 OUT2 ... -o OUT`: join the folders of one prompt file's runs (its --shard
runs, say) into one output folder, as one unsharded run would have written it.

Each source's manifest rows are taken as they are (their lines byte for byte, unknown fields
included); the merged metadata.jsonl holds them sorted by `row` (the input line), and each ok
row's audio and npz are hard-linked (copied across file systems). Problems:
  - not an output folder (no metadata.jsonl), folders of different prompt files or settings,
    or an output folder already holding results: nothing is written, exit 2;
  - the same id in two folders with different content (a conflict: the first folder given
    wins, the others are listed), rows missing from every folder (when run.json names a
    readable prompt file, or a shard of n is absent), an ok row whose files are gone
    (recorded as failed): the rest is still merged, then exit 1.
The same id with identical manifest rows and files in two folders is merged once, silently.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omni_cli.errors import OmniError
from omni_cli.folder import KEPT_STATUSES
from omni_cli.folder import LOCK_NAME, lock_held
from omni_cli.shard import shard_of

# run.json command keys that must agree between the sources: what decides a row's output
_SAME_COMMAND = ("prompts", "model", "seed", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                 "ras_win_len", "ras_win_max_num_repeat", "suppress_tokens", "max_new_frames", "min_new_frames",
                 "raw_logprobs", "fmt", "chunk_method", "chunk_buffer")


@dataclass
class Source:
    path: Path
    run: dict | None  # its run.json; None where the run never wrote one (killed)
    lines: dict[str, tuple[int, str, dict]]  # id -> (row, manifest line, parsed row)


@dataclass
class MergeReport:
    rows: int = 0
    ok: int = 0
    rejected: int = 0  # scored rows that failed their thresholds: their files come along as ok rows' do
    failed: int = 0
    duplicates: list[str] = field(default_factory=list)  # ids in several folders that agree
    conflicts: list[str] = field(default_factory=list)  # "id: folder, folder": ids whose copies differ
    missing: list[str] = field(default_factory=list)  # ids of the prompt file in no folder
    unlisted: int = 0  # rows of the prompt file in no folder whose ids cannot be listed (its file unreadable here)
    unverified: str | None = None  # why the merge cannot tell whether rows are missing
    missing_shards: list[str] = field(default_factory=list)  # "i/n" no folder holds
    lost_files: list[str] = field(default_factory=list)  # ok rows whose files are gone
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.conflicts or self.missing or self.unlisted or self.unverified or self.missing_shards
                    or self.lost_files)


def read_source(path: Path) -> Source:
    manifest = path / "metadata.jsonl"
    if not path.is_dir() or not manifest.is_file():
        raise OmniError(f"{path} is not an omni output folder (no metadata.jsonl)")
    if lock_held(path):
        raise OmniError(f"{path} is in use by a running omni run (it holds {path / LOCK_NAME}): merge it once "
                        "that run has ended")
    run = None
    if (path / "run.json").is_file():
        try:
            run = json.loads((path / "run.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise OmniError(f"{path / 'run.json'} is not JSON: {e}") from None
    lines: dict[str, tuple[int, str, dict]] = {}
    for n, line in enumerate(manifest.read_bytes().decode("utf-8", "replace").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = (int(rec["row"]), str(rec["id"]))
        except (ValueError, KeyError, TypeError):
            raise OmniError(f"{manifest}, line {n}: not a manifest row (JSON with row and id)") from None
        lines[key[1]] = (key[0], line + "\n", rec)  # an id written twice (a resumed run): its last row
    return Source(path, run, lines)


def _check_same_run(sources: list[Source]) -> None:
    """The sources must come from one prompt file under one model and one set of sampling settings.
    The prompt file is compared by its content's sha256 where both run.json files record it (the
    path as typed may differ between machines), else by that path."""
    runs = [(s.path, s.run) for s in sources if s.run is not None]
    for path, run in runs[1:]:
        first_path, first = runs[0]
        a, b = (first.get("prompts") or {}).get("sha256"), (run.get("prompts") or {}).get("sha256")
        if a and b and a != b:
            raise OmniError(f"{first_path} and {path} are not runs of one job: their prompt files differ "
                            f"(sha256 {a[:12]} != {b[:12]})")
        for key in _SAME_COMMAND:
            if key == "prompts" and a and b:
                continue
            a, b = first.get("command", {}).get(key), run.get("command", {}).get(key)
            if a != b:
                raise OmniError(f"{first_path} and {path} are not runs of one job: {key} differs ({a!r} != {b!r})")
        a, b = first.get("config", {}).get("sampling"), run.get("config", {}).get("sampling")
        if a != b:
            raise OmniError(f"{first_path} and {path} are not runs of one job: the model's sampling defaults differ")
    by_row: dict[int, tuple[str, Path]] = {}
    for s in sources:
        for rid, (row, _, _) in s.lines.items():
            other = by_row.setdefault(row, (rid, s.path))
            if other[0] != rid:
                raise OmniError(f"row {row} is id {other[0]!r} in {other[1]} but {rid!r} in {s.path}: "
                                "not runs of one prompt file")


def _files(rec: dict) -> list[str]:
    return [rec[k] for k in ("file_name", "logprobs_file") if rec.get("status") in KEPT_STATUSES and rec.get(k)]


def _same_row(a: Source, b: Source, rid: str) -> bool:
    (_, line_a, rec), (_, line_b, _) = a.lines[rid], b.lines[rid]
    return line_a == line_b and all(
        (a.path / f).is_file() and (b.path / f).is_file() and filecmp.cmp(a.path / f, b.path / f, shallow=False)
        for f in _files(rec))


def _link_or_copy(src: Path, dst: Path) -> None:
    """dst whole or not at all: linked (or copied) under a partial name, then renamed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.stem}.partial{dst.suffix}")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _missing(sources: list[Source], present: set[str], report: MergeReport) -> None:
    """Rows of the prompt file in no folder: listed from the file where run.json's `prompts` names
    one readable here with the recorded sha256, else counted from the recorded row count; and
    whole shards no folder holds. A folder without run.json (a run killed before its end) among
    sources that record nothing to count by leaves the merge unverified: not clean."""
    runs = [s.run for s in sources if s.run is not None]
    info = next((r["prompts"] for r in runs if isinstance(r.get("prompts"), dict)), None)
    if info is not None:
        _missing_by_record(info, present, report)
    else:
        _missing_by_path(runs, present, report)
        if any(s.run is None for s in sources) and not report.missing:
            killed = ", ".join(str(s.path) for s in sources if s.run is None)
            report.unverified = (f"no run.json in {killed} (a run killed before it ended), and no folder records "
                                 "its prompt file's rows: rows may be missing that the merge cannot count")
    specs = [str(r.get("command", {}).get("shard") or "") for r in runs]
    counts = {spec.split("/")[-1] for spec in specs}
    if len(counts) == 1 and "" not in counts:  # every source a shard of one split: which shards are there
        n = int(counts.pop())
        held = {int(spec.split("/")[0]) for spec in specs}
        held |= {shard_of(rid, n) for rid in present}  # a folder without run.json still holds its shard's rows
        report.missing_shards = [f"{i}/{n}" for i in range(n) if i not in held]


def _missing_by_record(info: dict, present: set[str], report: MergeReport) -> None:
    from omni_cli.prompts import read_prompts

    path = info.get("path")
    readable = isinstance(path, str) and path != "-" and Path(path).is_file()
    if readable and _sha256(Path(path)) == info.get("sha256"):
        try:
            report.missing = [r.id for r in read_prompts(path, info.get("format"), warn=lambda m: None)
                              if r.id not in present]
            return
        except OmniError as e:
            report.notes.append(f"could not read the prompt file {path} to list missing rows: {e}")
    elif readable:
        report.notes.append(f"the prompt file {path} changed since the runs: missing rows are counted, not listed")
    else:
        report.notes.append(f"the prompt file {path} is not readable here: missing rows are counted, not listed")
    total = info.get("rows")
    if isinstance(total, int) and total > len(present):
        report.unlisted = total - len(present)


def _missing_by_path(runs: list[dict], present: set[str], report: MergeReport) -> None:
    """Runs of an older version record no prompt file's identity: its path as typed, where readable."""
    prompts = runs[0].get("command", {}).get("prompts") if runs else None
    if prompts and prompts != "-" and Path(prompts).is_file():
        from omni_cli.prompts import read_prompts

        try:
            report.missing = [r.id for r in read_prompts(prompts, warn=lambda m: None) if r.id not in present]
        except OmniError as e:
            report.notes.append(f"could not read the prompt file {prompts} to look for missing rows: {e}")
    else:
        report.notes.append("the prompt file is not readable from here: rows missing from every folder "
                            "are not listed")


def _sha256(path: Path) -> str | None:
    from omni_cli.folder import file_digest

    got = file_digest(path)
    return got[1] if got else None


def run_merge(folders: list[Path], out: Path) -> MergeReport:
    if not folders:
        raise OmniError("omni merge needs at least one output folder")
    resolved = {f.resolve() for f in folders}
    if out.resolve() in resolved:
        raise OmniError(f"-o {out} is one of the folders to merge; choose a new folder")
    if len(resolved) != len(folders):
        raise OmniError("a folder is named twice")
    if (out / "metadata.jsonl").exists():
        raise OmniError(f"{out} already holds results ({out / 'metadata.jsonl'}); choose another folder")
    if out.exists() and not out.is_dir():
        raise OmniError(f"{out} exists and is not a folder")
    sources = [read_source(f) for f in folders]
    _check_same_run(sources)

    report = MergeReport()
    for s in sources:
        if (s.path / LOCK_NAME).exists():  # not held (read_source refuses that): a run killed before it let go
            report.notes.append(f"{s.path}: a run was killed there before it ended (its {LOCK_NAME} is left)")
    chosen: dict[str, Source] = {}  # id -> the folder whose row is merged
    for s in sources:
        for rid in s.lines:
            first = chosen.get(rid)
            if first is None:
                chosen[rid] = s
            elif _same_row(first, s, rid):
                report.duplicates.append(rid)
            else:
                report.conflicts.append(f"{rid}: {first.path} (merged), {s.path}")

    out.mkdir(parents=True, exist_ok=True)
    merged: list[tuple[int, str]] = []
    for rid, s in chosen.items():
        row, line, rec = s.lines[rid]
        try:
            for rel in _files(rec):
                _link_or_copy(s.path / rel, out / rel)
        except OSError as e:  # a deleted file: the row cannot be ok here; its input fields stay
            report.lost_files.append(f"{rid}: {e}")
            rec = {**rec, "status": "failed", "error": f"omni merge: its files in {s.path} are unreadable: {e}"}
            line = json.dumps(rec, ensure_ascii=False) + "\n"
        merged.append((row, line))
        report.ok += rec.get("status") == "ok"
        report.rejected += rec.get("status") == "rejected"
    merged.sort()
    report.rows = len(merged)
    report.failed = report.rows - report.ok - report.rejected
    _missing(sources, set(chosen), report)

    tmp = out / ".metadata.jsonl.partial"
    tmp.write_text("".join(line for _, line in merged), encoding="utf-8")
    os.replace(tmp, out / "metadata.jsonl")
    _write_run_json(sources, out, report)
    return report


def _write_run_json(sources: list[Source], out: Path, report: MergeReport) -> None:
    """The first source's record (config, versions, command: what `omni verify` reads), with the
    merge's sources and totals; timings, which were per source, are left out."""
    from omni_cli.output import write_run_json

    base = next((s.run for s in sources if s.run is not None), {})
    record = {k: v for k, v in base.items() if k not in ("timings", "totals")}
    if "command" in record:
        record["command"] = {**record["command"], "out": str(out), "shard": None}
    totals = [s.run.get("totals", {}) for s in sources if s.run is not None]
    record["totals"] = {"rows": report.rows, "ok": report.ok, "rejected": report.rejected, "failed": report.failed,
                        "interrupted": any(bool(t.get("interrupted")) for t in totals),
                        # the sources' sums (a duplicate counted in each of its folders)
                        "frames": sum(t.get("frames") or 0 for t in totals),
                        "audio_s": round(sum(t.get("audio_s") or 0.0 for t in totals), 3)}
    record["merge"] = {
        "sources": [{"path": str(s.path), "rows": len(s.lines),
                     "shard": (s.run or {}).get("command", {}).get("shard"),
                     "totals": (s.run or {}).get("totals")} for s in sources],
        "duplicates": report.duplicates, "conflicts": report.conflicts, "missing": report.missing,
        "missing_unlisted": report.unlisted, "unverified": report.unverified,
        "missing_shards": report.missing_shards, "lost_files": report.lost_files,
    }
    write_run_json(out, record)
