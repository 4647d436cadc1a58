"""Is a row's output the same whatever batch it ran in? `omni generate` at the Higgs 3B shape.

A random-weight checkpoint (benchmarks/e2e_generate.py writes it), N rows of seeded sampling
with natural stops allowed (--max-new-frames only), run at several --max-batch-size values and
once with the rows shuffled. For each run, the rows whose wav, npz (codes and logprobs) and
manifest row equal the reference run's (the first of the mode's batch sizes), byte for byte.
Both modes: --deterministic (every row must match) and the default (reported as measured).
Prints a table and writes JSON.

  python benchmarks/batch_invariance.py --rows 64 --batches 64 1 16 256 --default-batches 64 16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.e2e_generate import ensure_checkpoint  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def generate(root: Path, name: str, rows: list[dict], batch: int, frames: int,
             deterministic: bool) -> tuple[Path, float]:
    prompts = root / f"{name}.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = root / f"out-{name}"
    cmd = [sys.executable, "-m", "omni_cli", "generate", str(prompts), "-o", str(out), "--model",
           str(root / "model.yaml"), "-q", "--max-batch-size", str(batch), "--max-new-frames", str(frames),
           "--seed", "7", "--temperature", "1.0", "--top-k", "50", "--top-p", "0.95",
           "--deterministic" if deterministic else "--no-deterministic"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=os.environ, check=True)
    return out, time.perf_counter() - t0


def row_files(out: Path) -> dict[str, tuple[bytes, bytes, int]]:
    """id -> (wav bytes, npz bytes, frames) of every row of a run."""
    rows = {}
    for line in (out / "metadata.jsonl").read_text(encoding="utf-8").split("\n"):  # a text may hold U+2028
        if not line:
            continue
        m = json.loads(line)
        rows[m["id"]] = ((out / m["file_name"]).read_bytes(), (out / m["logprobs_file"]).read_bytes(), m["frames"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--frames", type=int, default=200, help="--max-new-frames (rows may stop earlier)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 1, 16, 256], help="--deterministic runs")
    ap.add_argument("--default-batches", type=int, nargs="*", default=[64, 16], help="default-mode runs")
    ap.add_argument("--root", type=Path, default=None, help="where the random checkpoint is (reused)")
    ap.add_argument("--out", type=Path, default=Path("batch_invariance.json"))
    args = ap.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="omni-invariance-"))
    ensure_checkpoint(root)
    (root / "model.yaml").write_text(f"family: higgs_audio_v2\ncheckpoint: {root / 'model'}\ncodec: {root / 'codec'}\n"
                                     "dtype: bfloat16\ndevice: auto\nmax_seq_len: 512\n")
    rows = [{"id": f"r{i}", "text": f"Row number {i}: a sentence to speak aloud."} for i in range(args.rows)]
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    table = []
    for mode, batches in (("deterministic", args.batches), ("default", args.default_batches)):
        runs = [(f"{b}", rows, b) for b in batches]
        if mode == "deterministic":
            runs.append((f"{batches[0]} shuffled", shuffled, batches[0]))
        ref = None
        for label, prompt_rows, b in runs:
            out, wall = generate(root, f"{mode}-{label.replace(' ', '-')}", prompt_rows, b, args.frames,
                                 mode == "deterministic")
            got = row_files(out)
            ref = ref or got
            same = {part: sum(got[i][k] == ref[i][k] for i in ref) for k, part in enumerate(("wav", "npz"))}
            table.append({"mode": mode, "max_batch_size": label, "rows": len(got), "wall_s": wall,
                          "rows_equal_wav": same["wav"], "rows_equal_npz": same["npz"],
                          "frames_min": min(v[2] for v in got.values()), "frames_max": max(v[2] for v in got.values())})
            write_results(args.out, rows=args.rows, frames=args.frames, runs=table)  # after each run: partial results
    print(f"{'mode':>13} {'max batch':>12} {'rows':>5} {'= wav':>6} {'= npz':>6} {'frames':>9} {'wall s':>7}")
    for r in table:
        print(f"{r['mode']:>13} {r['max_batch_size']:>12} {r['rows']:>5} {r['rows_equal_wav']:>6} "
              f"{r['rows_equal_npz']:>6} {r['frames_min']:>4}-{r['frames_max']:<4} {r['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
