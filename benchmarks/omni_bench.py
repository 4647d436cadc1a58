"""`omni bench` as a script: omni sync, omni async and transformers generate in one run.

  python benchmarks/omni_bench.py --shape higgs-audio-v2-3b --batch 1 --batch 8 --batch 64 --batch 256 \\
      --out bench.json --plot bench.png
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.cli import app  # noqa: E402

if __name__ == "__main__":
    app(["bench", *sys.argv[1:]])
