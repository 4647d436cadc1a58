"""How fast writer threads put rows' files on a disk, at the end-to-end run's shape
(benchmarks/e2e_generate.py: 7.68 s of 24 kHz audio and 200 frames x 8 codebooks a row).

Three ways, each --rows rows on --threads threads (omni generate runs four) into a new
folder under --dir (put it on the disk the outputs go to), with omni_cli/output.py's code:
- whole rows: OutputWriter.write_ok as omni generate calls it (the wav, the npz and the
  manifest row);
- encode only: its in-memory half (encode_ok: the wav bytes from the int16 samples, the npz bytes,
  the manifest row's fields);
- files only: its other half from bytes made beforehand (publish: each file written under
  a partial name and renamed, then the manifest row appended and flushed).
Whether the halves add up on one thread, and which stops scaling with threads, says
what serialises the writers: the GIL in the encoding or the folder's file operations.
Prints ms per row (wall over rows) and writes JSON. (Before 2026-12-02 the script timed
libsndfile writing to a path against writing in memory: BENCHMARKS.md.)

  python benchmarks/write_probe.py --rows 256 --threads 1 4 8 --dir /tmp --out write_probe.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import write_results  # noqa: E402
from omni_cli.output import OutputWriter  # noqa: E402

RATE = 24000


def _timed(rows: int, threads: int, job) -> float:
    """ms per row of job(i) for i < rows on `threads` threads."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(job, range(rows)))
    return (time.perf_counter() - t0) / rows * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("write_probe.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # int16 samples: the codec's audio is converted on the device (runners/audio.py)
    audio = [(rng.standard_normal(192 * 960) * 3000).astype(np.int16) for _ in range(args.rows)]
    tokens = rng.integers(0, 1024, (200, 8))
    logprobs = rng.standard_normal((200, 8)).astype(np.float32)
    mask = np.ones((200, 8), dtype=bool)
    meta = [{"row": i, "text": "a prompt row"} for i in range(args.rows)]
    results = []
    for threads in args.threads:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            whole_writer = OutputWriter(Path(tmp) / "whole", "wav", RATE)
            files_writer = OutputWriter(Path(tmp) / "files", "wav", RATE)
            encoded = [whole_writer.encode_ok(f"e{i}", audio[i], tokens, logprobs, mask, meta[i])
                       for i in range(args.rows)]  # the files-only half's bytes, made before it is timed

            def whole(i: int) -> None:
                whole_writer.write_ok(i, f"r{i}", audio[i], tokens, logprobs, mask, meta[i])

            def encode(i: int) -> None:
                whole_writer.encode_ok(f"r{i}", audio[i], tokens, logprobs, mask, meta[i])

            def files(i: int) -> None:
                parts, record = encoded[i]
                for rel, data in parts:
                    files_writer.publish(rel, data)
                files_writer.add_row(i, record)

            row = {"threads": threads, "rows": args.rows}
            for key, job in (("write_ok_ms", whole), ("encode_ms", encode), ("files_ms", files)):
                row[key] = _timed(args.rows, threads, job)
            whole_writer.close()
            files_writer.close()
            results.append(row)
    print(f"{'threads':>7} {'rows':>5} {'whole rows':>11} {'encode only':>12} {'files only':>11}   (ms a row)")
    for r in results:
        print(f"{r['threads']:>7} {r['rows']:>5} {r['write_ok_ms']:>11.3f} {r['encode_ms']:>12.3f} "
              f"{r['files_ms']:>11.3f}")
    write_results(args.out, dir=str(args.dir), runs=results)


if __name__ == "__main__":
    main()
