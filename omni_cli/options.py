"""`omni generate`'s options (the flags, as one frozen record: run.json's `command`), its summary
and exit codes; omni_cli/generate.py runs them (and re-exports these names)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omni_cli.longform import DEFAULT_CHUNK_BUFFER
from omni_cli.shard import Shard

# exit codes (cli.py's --help and README's table say the same)
EXIT_OK, EXIT_ROWS_FAILED, EXIT_USAGE, EXIT_RUN_FAILED = 0, 1, 2, 3


@dataclass(frozen=True)
class GenerateOptions:
    prompts: str
    out: Path
    model: str | None = None
    seed: int | None = None
    max_batch_size: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ras_win_len: int | None = None
    ras_win_max_num_repeat: int | None = None
    suppress_tokens: tuple[int, ...] | None = None
    max_new_frames: int | None = None
    min_new_frames: int | None = None
    subtalker_temperature: float | None = None  # Qwen3-TTS's code predictor (runners/sampling/params.py)
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None
    deterministic: bool | None = None
    async_decode: bool | None = None
    raw_logprobs: bool = False
    fmt: str = "wav"
    quiet: bool = False
    overwrite: bool = False
    resume: bool = False
    max_failures: int | None = None  # stop once this many rows have failed (the rest: status skipped)
    jsonl_stdout: bool = False  # each manifest row written also goes to stdout, as rows complete
    shard: Shard | None = None  # --shard i/n: only the rows whose id hashes to shard i (omni_cli/shard.py)
    voices: Path | None = None  # --voices: a voice bank file, over the config's voices
    chunk_method: str | None = None  # long-form text (omni_cli/longform.py): auto, sentence, none; None: the family's
    chunk_buffer: int = DEFAULT_CHUNK_BUFFER  # earlier chunks a chunk's prompt holds
    devices: tuple[str, ...] | None = None  # --devices (omni_cli/workers.py); one device: this process's
    ray: str | None = None  # --ray ADDRESS: the job as a Ray Data pipeline (omni_cli/ray.py)
    input_format: str | None = None  # --input-format jsonl|json|csv|txt; None: by extension, else sniffed
    # scoring (omni_cli/quality/settings.py); None: the model YAML's quality section, else off
    score: str | None = None
    reject: str | None = None
    best_of: int | None = None
    retry: int | None = None
    drop_rejected: bool | None = None
    asr_model: str | None = None
    speaker_model: str | None = None
    mos_model: str | None = None
    utmos_model: str | None = None


@dataclass
class RunSummary:
    total: int
    ok: int
    failed: int
    interrupted: bool
    exit_code: int = EXIT_OK
    rejected: int = 0


__all__ = ["EXIT_OK", "EXIT_ROWS_FAILED", "EXIT_USAGE", "EXIT_RUN_FAILED", "GenerateOptions", "RunSummary"]
