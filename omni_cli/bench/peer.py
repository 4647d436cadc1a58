"""The qwen-tts peer: benchmarks/qwen_tts_peer.py in a process of its own, since qwen-tts 0.1.1 pins
transformers 4.57.3. Its interpreter is --qwen-tts-python (default this one) and its PYTHONPATH
starts with --qwen-tts-site (the wheels of .whl-qwen/ installed there: README, omni bench); its
rows join the table, and a run that fails leaves one line saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_cli.runners.qwen3_tts.shapes import config_dict

from .common import BenchRow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "qwen_tts_peer.py"
SITE_ENV, PYTHON_ENV = "OMNI_QWEN_TTS_SITE", "OMNI_QWEN_TTS_PYTHON"


@dataclass(frozen=True)
class PeerEnv:
    """Where qwen-tts runs: an interpreter, and a folder of packages put first on its PYTHONPATH."""

    python: str
    site: Path | None

    @classmethod
    def of(cls, python: str | None, site: Path | None) -> "PeerEnv":
        """The flags, else the environment variables, else this interpreter and its own packages."""
        site = site or (Path(os.environ[SITE_ENV]) if os.environ.get(SITE_ENV) else None)
        return cls(python or os.environ.get(PYTHON_ENV) or sys.executable, site)

    @property
    def given(self) -> bool:
        return self.site is not None or self.python != sys.executable


def run_qwen_tts(env: PeerEnv, shape: str, batches: list[int], frames: int, prompt_len: int,
                 device: torch.device, dtype: torch.dtype, floors: dict[int, float | None],
                 notes: list[str]) -> tuple[list[BenchRow], dict]:
    """qwen-tts's rows (floors[batch] beside each) and what the peer reported of itself; a failure
    is one line in notes."""
    if not SCRIPT.is_file():
        notes.append(f"qwen-tts: not run: {SCRIPT} is missing (a source checkout has it)")
        return [], {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "peer.json"
        cfg.write_text(json.dumps(config_dict(shape, "custom_voice")))
        cmd = [env.python, str(SCRIPT), "--shape", shape, "--config-json", str(cfg), "--frames", str(frames),
               "--prompt-len", str(prompt_len), "--device", str(device), "--dtype", str(dtype).split(".")[-1],
               "--out", str(out)] + [a for b in batches for a in ("--batch", str(b))]
        child = dict(os.environ)
        if env.site is not None:
            child["PYTHONPATH"] = os.pathsep.join([str(env.site)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        tail: deque[str] = deque(maxlen=20)
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child)
        except OSError as e:
            notes.append(f"qwen-tts: not run: {env.python}: {e.strerror or e}")
            return [], {}
        for line in proc.stdout:  # its progress as it comes; the last lines say why, should it fail
            tail.append(line.rstrip())
            print(f"  qwen-tts | {line.rstrip()}", file=sys.stderr, flush=True)
        rc = proc.wait()
        info = json.loads(out.read_text()) if out.is_file() else {}
    rows = []
    for r in info.get("rows", []):
        if "error" in r:
            notes.append(f"qwen-tts batch {r['batch']}: failed: {r['error']}")
        else:
            rows.append(BenchRow("qwen-tts", r["batch"], r["ms_per_step"], r["audio_s_per_s"], floors.get(r["batch"])))
    if rc != 0:
        why = next((line for line in reversed(tail) if line.strip()), "no output")
        notes.append(f"qwen-tts: failed (exit {rc}): {why.strip()[:300]}")
    return rows, {k: v for k, v in info.items() if k != "rows"}
