from __future__ import annotations

import os

from tests import torchaudio_standin

# before anything imports transformers: its torchaudio check is cached
torchaudio_standin.install()
from dataclasses import replace
from pathlib import Path

import pytest
import torch

# NOTE: the suite's own process runs torch on one thread: the background checks (tests/background.py)
# take the second core, and a two-thread OpenMP op waited on its thread that they had preempted.
# Subprocesses (the CLI, workers, the checks) keep torch's default.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny-higgs-audio-v2"


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: start only the selected checks
def pytest_collection_modifyitems(config, items):
    # the interpreter's kernel checks run on a background thread from now on; their tests go last
    from tests import background

    interp = [item for item in items if item.originalname == "test_kernels_in_interpreter"]
    venv = [item for item in items if item.originalname == "test_readme_command_in_fresh_venv"]
    items[:] = [item for item in items if item not in interp + venv] + venv + interp
    if venv:
        from tests.test_fresh_venv import JOB

        background.start([JOB])
    background.start([item.callspec.params["script"] for item in interp])
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (CI has none; run on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def write_config(path: Path, ckpt: Path, **extra) -> Path:
    """A model YAML pointing at a tiny checkpoint folder."""
    lines = [
        "family: higgs_audio_v2",
        f"checkpoint: {ckpt / 'model'}",
        f"codec: {ckpt / 'codec'}",
        "dtype: float32",
        "device: cpu",
    ]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def eos_ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint whose codebook-6 stream-EOS logit is pushed up: greedy rows stop early."""
    from tests.tiny_checkpoint import build

    return build(tmp_path_factory.mktemp("eos-ckpt"), seed=0, eos_boost=(6, 0.6))


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_cli(*args: str, stdin: str | None = None):
    """Run `omni ...` in-process; returns the click Result (exit_code, output)."""
    from typer.testing import CliRunner

    from omni_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], input=stdin, catch_exceptions=False)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# one prompt file that several modules run (test_resume, test_devices, test_ray): rows of several lengths
JOB_ROWS = [{"id": f"r{i}", "text": f"row number {i} says" + " more" * (i % 4), "max_new_frames": 9 + (i * 5) % 17}
            for i in range(12)]
JOB_FLAGS = ("--deterministic", "--seed", "3", "--max-batch-size", "4", "-q")


@pytest.fixture(scope="session")
def job_oracle(tmp_path_factory):
    """JOB_ROWS run by one process under JOB_FLAGS: (the prompt file, digests of its results)."""
    tmp = tmp_path_factory.mktemp("job")
    prompts = write_jsonl(tmp / "p.jsonl", JOB_ROWS)
    res = run_cli("generate", prompts, "-o", tmp / "out", *JOB_FLAGS)
    assert res.exit_code == 0, res.output
    return prompts, digests(tmp / "out")


def digests(out: Path) -> dict[str, str]:
    """sha256 of the manifest and every audio and npz file (not run.json: timings; not the lock)."""
    import hashlib

    files = [out / "metadata.jsonl", *sorted((out / "audio").iterdir()), *sorted((out / "logprobs").iterdir())]
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def read_manifest(out: Path) -> list[dict]:
    import json

    # split on \n only: a row's text may hold U+2028, which str.splitlines also splits at
    return [json.loads(line) for line in (out / "metadata.jsonl").read_text(encoding="utf-8").split("\n") if line]


def load_family(config, dtype=None, device=None, raw_logprobs: bool = False):
    """The config's model family, loaded as omni generate loads it (dtype and device from the
    config unless given)."""
    from omni_cli.generate import GenerateOptions
    from omni_cli.job_settings import load_spec
    from omni_cli.runners.device import DTYPES, pick_device
    from omni_cli.runners.family import family_class

    spec = load_spec(config, GenerateOptions(prompts="-", out=Path("."), raw_logprobs=raw_logprobs))
    spec = replace(spec, dtype=dtype or DTYPES[config.dtype], device=device or pick_device(config.device))
    return family_class(config.family).load(spec)
