"""The CUDA kernels (attention, fused norm/rope/silu path, batch-1 GEMVs, the draw, Higgs
masks and publish, the codec's Snake and residual units), checked on the CPU in Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("triton")


@pytest.mark.parametrize("script", ["interpret_decode_attention", "interpret_fused_decode", "interpret_fused_draw",
                                    "interpret_higgs_step", "interpret_fused_codec"])
def test_kernels_in_interpreter(script):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", f"tests.{script}"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
