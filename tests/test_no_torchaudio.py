"""The runtime never imports torchaudio (PyPI's wheels do not load beside a CPU torch)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# torchaudio as it is beside a CPU torch: installed (find_spec sees it), but
# importing it fails
SCRIPT = r"""
import importlib.abc, importlib.machinery, sys

class Broken(importlib.abc.Loader):
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise ImportError("torchaudio fails to load in this test")

class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "torchaudio" or name.startswith("torchaudio."):
            return importlib.machinery.ModuleSpec(name, Broken())
        return None

sys.meta_path.insert(0, Finder())
from omni_cli.cli import app
try:
    app(["generate", "samples/prompts.jsonl", "-o", sys.argv[1], "--quiet", "--max-new-frames", "12"])
except SystemExit as e:
    assert e.code in (0, None), e.code
assert not any(m == "torchaudio" or m.startswith("torchaudio.") for m in sys.modules)
print("OK")
"""


def test_generate_runs_with_torchaudio_unimportable(tmp_path):
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("OK")
    assert (tmp_path / "out" / "metadata.jsonl").is_file()
