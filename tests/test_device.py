"""runners/device.py helpers that have a CPU path of their own."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

_SCRIPT = """
import ctypes, os, sys
from omni_cli.runners.device import stderr_silenced
os.write(2, b"before\\n")
with stderr_silenced():
    sys.stderr.write("python inside\\n")
    os.write(2, b"fd inside\\n")
    ctypes.CDLL(None).write(2, b"libc inside\\n", 12)  # as torch's C++ warning is written
os.write(2, b"after\\n")
sys.stderr.write("python after\\n")
"""


def test_stderr_silenced_drops_every_write_to_stderr_inside_it_and_restores_it():
    res = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "before\nafter\npython after\n"
