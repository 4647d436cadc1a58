"""README command 1 in a fresh virtual environment: install, then the sample job.

`pip install -e . && omni generate samples/prompts.jsonl -o OUT` must write
every output file, and metadata.jsonl must hold one row per prompt and load
as a datasets audiofolder. Then, in the same venv (torch is installed once), a
wheel built from a clean copy of the tree replaces the editable install, and
`omni generate` run from another folder finds its embedded default model, and the
tiny Qwen3-TTS one, in the installed package.

The check is a subprocess (`python -m tests.test_fresh_venv`) that the suite's background thread
starts at collection (tests/background.py): minutes of pip, which the other core takes while the
suite runs, in a process of its own, so nothing it imports (datasets and what that loads) touches
the suite's process while other tests run there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
import zipfile
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.conftest import REPO

PROMPTS = REPO / "samples" / "prompts.jsonl"


def _sh(cmd: list, **kw) -> subprocess.CompletedProcess:
    cmd = [str(c) for c in cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _check_outputs(out: Path, res: subprocess.CompletedProcess) -> dict:
    """Every output file of the sample job, and the folder loads as a datasets audiofolder; returns run.json."""
    assert "rows (0 failed)" in res.stderr  # the plain summary line (stderr is not a terminal)
    prompts = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
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
    return run


def _clean_copy(dst: Path) -> Path:
    """What a wheel is built from, without build outputs or the dev symlink omni_cli/runners -> ../runners."""
    def ignore(folder, names):
        return [n for n in names if n in ("__pycache__", "build") or n.endswith(".egg-info")
                or os.path.islink(os.path.join(folder, n))]

    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    for name in ("omni_cli", "runners", "configs"):
        shutil.copytree(REPO / name, dst / name, ignore=ignore)
    return dst


def test_readme_command_in_fresh_venv():
    from tests import background

    res = background.result(JOB)  # the subprocess below, run since collection
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


JOB = "test_fresh_venv"  # this module, run as a script by tests/background.py


def main() -> int:
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="omni-fresh-venv-"))
    try:
        _check_in(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
    return 0


def _check_in(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py, omni = env_dir / "bin" / "python", env_dir / "bin" / "omni"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # torch first, pinned: the CPU wheel on this machine's disk (a plain `torch` pulls a CUDA build)
    _sh([py, "-m", "pip", "install", "-q", "torch==2.13.0"], env=env)
    _sh([py, "-m", "pip", "install", "-q", "-e", REPO], env=env)
    out = tmp_path / "out"
    res = _sh([omni, "generate", "samples/prompts.jsonl", "-o", out], cwd=REPO, env=env)
    _check_outputs(out, res)

    # non-editable: a wheel holding the package data, installed over the editable install
    _sh([py, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", _clean_copy(tmp_path / "src")], env=env)
    (wheel,) = (tmp_path / "dist").glob("omni_cli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tiny = [p.relative_to(REPO).as_posix() for p in (REPO / "configs/tiny-higgs-audio-v2").rglob("*") if p.is_file()]
    assert {"configs/tiny-higgs-audio-v2/model/model.safetensors", "configs/tiny-higgs-audio-v2/codec/model.safetensors",
            "configs/tiny-higgs-audio-v2/model/tokenizer.json"} <= set(tiny)
    assert {f"omni_cli/{n}" for n in tiny + ["configs/tiny-higgs-audio-v2.yaml"]} <= names
    assert not any(n.startswith(("runners/", "configs/")) for n in names)
    _sh([py, "-m", "pip", "install", "-q", wheel], env=env)

    elsewhere = tmp_path / "elsewhere"  # not the repo: nothing found through the working directory
    elsewhere.mkdir()
    probe = "import sysconfig, importlib.metadata as m, omni_cli; " \
            "print(sysconfig.get_paths()['purelib'], omni_cli.__file__, m.version('omni-cli'), sep='\\n')"
    site, init, version = _sh([py, "-c", probe], cwd=elsewhere, env=env).stdout.split()
    site = Path(site).resolve()
    assert Path(init).resolve() == site / "omni_cli" / "__init__.py"
    assert not (site / "runners").exists() and not (site / "configs").exists()
    assert (site / "omni_cli/runners/engine.py").is_file()
    assert (site / "omni_cli/configs/tiny-higgs-audio-v2.yaml").is_file()
    assert _sh([omni, "--version"], cwd=elsewhere, env=env).stdout.split() == ["omni-cli", version]

    out2 = tmp_path / "out-installed"
    res = _sh([omni, "generate", PROMPTS, "-o", out2], cwd=elsewhere, env=env)
    run = _check_outputs(out2, res)
    assert Path(run["config"]["path"]).resolve() == site / "omni_cli/configs/tiny-higgs-audio-v2.yaml"
    # the second family from the wheel: its package and its tiny checkpoint (speech tokenizer inside)
    assert (site / "omni_cli/runners/qwen3_tts/runner.py").is_file()
    qwen = elsewhere / "q.jsonl"
    qwen.write_text('{"id": "q", "text": "Hello.", "instruct": "A calm voice."}\n')
    _sh([omni, "generate", qwen, "-o", tmp_path / "out-qwen", "--model", "tiny-qwen3-tts"], cwd=elsewhere, env=env)
    assert (tmp_path / "out-qwen" / "audio" / "q.wav").is_file()


if __name__ == "__main__":
    raise SystemExit(main())
