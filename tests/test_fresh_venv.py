"""README command 1 in a fresh virtual environment: install, then the sample job.

`pip install -e . && omni generate samples/prompts.jsonl -o OUT` must write
every output file, and metadata.jsonl must hold one row per prompt and load
as a datasets audiofolder.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv

import numpy as np
import soundfile as sf

from tests.conftest import REPO


def _sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def test_readme_command_in_fresh_venv(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # torch first, pinned: the CPU wheel on this machine's disk (a plain `torch` pulls a CUDA build)
    _sh([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], env=env)
    _sh([str(py), "-m", "pip", "install", "-q", "-e", str(REPO)], env=env)
    out = tmp_path / "out"
    res = _sh([str(env_dir / "bin" / "omni"), "generate", "samples/prompts.jsonl", "-o", str(out)], cwd=REPO, env=env)
    assert "rows (0 failed)" in res.stderr  # the plain summary line (stderr is not a terminal)

    prompts = [json.loads(line) for line in (REPO / "samples/prompts.jsonl").read_text().splitlines() if line.strip()]
    manifest = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert [m["id"] for m in manifest] == [p["id"] for p in prompts]
    for m in manifest:
        assert m["status"] == "ok" and m["finish_reason"] in ("stop", "length")
        audio, sr = sf.read(out / m["file_name"])
        assert sr == 24000 and len(audio) == round(m["duration_s"] * sr)
        z = np.load(out / m["logprobs_file"])
        assert z["tokens"].shape == (m["frames"], 8)
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["ok"] == len(prompts) and run["device"].startswith(("cpu", "cuda"))

    import datasets

    ds = datasets.load_dataset("audiofolder", data_dir=str(out), split="train")
    assert ds.num_rows == len(prompts)
    assert sorted(ds["id"]) == sorted(p["id"] for p in prompts)
    # datasets 3 decodes audio with librosa; read the files it found with soundfile instead
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    for row in ds:
        audio, sr = sf.read(row["audio"]["path"])
        assert sr == 24000 and row["audio"]["path"].endswith(f"{row['id']}.wav")
