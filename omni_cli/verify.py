"""`omni verify`: regenerate rows of an output folder and compare bytes.

A sample of the folder's ok rows is regenerated from what its manifest
records (text, scene, system, seed, every sampling parameter) with the same
model config and mode, but at a different batch size and in a shuffled
order, and each row's audio file and npz are compared byte for byte.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omni_cli.errors import OmniError
from omni_cli.folder import KEPT_STATUSES
from omni_cli.generate import GenerateOptions, run_generate
from omni_cli.runners.sampling.params import FIELD_NAMES


@dataclass
class RowCheck:
    id: str
    audio_equal: bool
    npz_equal: bool

    @property
    def ok(self) -> bool:
        return self.audio_equal and self.npz_equal


def _load(out: Path) -> tuple[dict, list[dict]]:
    try:
        run = json.loads((out / "run.json").read_text())
        rows = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise OmniError(f"{out} is not a complete omni output folder: {e}") from None
    return run, rows


def _rerun_row(r: dict, keep: tuple) -> dict:
    """A manifest row as a prompt row again; a reference voice by its recorded file and transcript
    (the bank that named it need not be given again; a changed file fails the row's check)."""
    row = {k: r[k] for k in keep if r.get(k) is not None}
    ref = r.get("reference")
    if ref:
        row |= {"ref_audio": ref["file"], "ref_text": ref["text"]}
    return row


def run_verify(out: Path, sample: int, batch_size: int | None, seed: int, quiet: bool) -> list[RowCheck]:
    run, rows = _load(out)
    ok_rows = [r for r in rows if r.get("status") in KEPT_STATUSES]  # a rejected row's kept attempt too
    if not ok_rows:
        raise OmniError(f"{out} has no ok rows to verify")
    rng = random.Random(seed)
    picked = ok_rows if sample <= 0 or sample >= len(ok_rows) else rng.sample(ok_rows, sample)
    rng.shuffle(picked)  # another order than the original run
    cmd = run["command"]
    original_bs = run["config"]["max_batch_size"]
    if batch_size is None:  # another batch size than the original run
        batch_size = original_bs // 2 if original_bs > 1 else 2
    with tempfile.TemporaryDirectory(prefix="omni-verify-") as tmp:
        prompts = Path(tmp) / "rows.jsonl"
        from omni_cli.runners.family import family_class

        family = tuple(family_class(run["config"]["family"]).row_fields())  # Qwen3-TTS: language, speaker, ...
        keep = ("id", "text", "scene", "system", "seed", "chunk") + family + FIELD_NAMES
        prompts.write_text("".join(json.dumps(_rerun_row(r, keep)) + "\n" for r in picked))
        again = Path(tmp) / "out"
        run_generate(GenerateOptions(
            prompts=str(prompts), out=again, model=run["config"]["path"], max_batch_size=batch_size,
            deterministic=run["config"]["deterministic"], raw_logprobs=cmd.get("raw_logprobs", False),
            fmt=cmd.get("fmt", "wav"), quiet=quiet, chunk_method=cmd.get("chunk_method", "auto"),
            chunk_buffer=cmd.get("chunk_buffer", 2),
        ))
        checks = []
        for r in picked:  # the rerun scores nothing: its files are under audio/ and logprobs/ (not rejected/)
            fresh_audio, fresh_npz = again / f"audio/{r['id']}.{cmd.get('fmt', 'wav')}", again / f"logprobs/{r['id']}.npz"
            audio_equal = (out / r["file_name"]).read_bytes() == fresh_audio.read_bytes() \
                if fresh_audio.exists() else False
            npz_equal = (out / r["logprobs_file"]).read_bytes() == fresh_npz.read_bytes() if fresh_npz.exists() else False
            checks.append(RowCheck(r["id"], audio_equal, npz_equal))
    return checks
