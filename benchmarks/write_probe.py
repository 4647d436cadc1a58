"""How fast writer threads put rows' files on a disk, at the end-to-end run's shape
(benchmarks/e2e_generate.py: 7.68 s of 24 kHz audio and 200 frames x 8 codebooks a row).

Three ways, each --rows rows on --threads threads (omni generate runs four) into a new
folder under --dir (put it on the disk the outputs go to):
- libsndfile to a path: soundfile writes each wav itself (sf.write to a file name), as
  omni_cli/output.py did before; libsndfile seeks ~50 times a file and fsyncs it on close;
- in memory, then one write: the wav encoded by soundfile into memory, written at once
  (what output.py does now);
- whole rows: OutputWriter.write_ok as omni generate calls it (that wav, the npz and the
  manifest row).
Prints ms per row (wall over rows) and writes JSON.

  python benchmarks/write_probe.py --rows 256 --threads 4 --dir /tmp --out write_probe.json
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import write_results  # noqa: E402
from omni_cli.output import OutputWriter, pcm16  # noqa: E402

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
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("write_probe.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    audio = [(rng.standard_normal(192 * 960) * 0.1).astype(np.float32) for _ in range(args.rows)]
    tokens = rng.integers(0, 1024, (200, 8))
    logprobs = rng.standard_normal((200, 8)).astype(np.float32)
    mask = np.ones((200, 8), dtype=bool)
    results = []
    for threads in args.threads:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            root = Path(tmp)
            for name in ("path", "memory"):
                (root / name).mkdir()

            def to_path(i: int) -> None:
                sf.write(root / "path" / f"{i}.wav", pcm16(audio[i]), RATE, format="WAV", subtype="PCM_16")

            def in_memory(i: int) -> None:
                encoded = io.BytesIO()
                sf.write(encoded, pcm16(audio[i]), RATE, format="WAV", subtype="PCM_16")
                (root / "memory" / f"{i}.wav").write_bytes(encoded.getbuffer())

            writer = OutputWriter(root / "rows", "wav", RATE)

            def whole(i: int) -> None:
                writer.write_ok(i, f"r{i}", audio[i], tokens, logprobs, mask, {"row": i, "text": "a prompt row"})

            row = {"threads": threads, "rows": args.rows}
            for key, job in (("libsndfile_to_path_ms", to_path), ("in_memory_ms", in_memory), ("write_ok_ms", whole)):
                row[key] = _timed(args.rows, threads, job)
            writer.close()
            results.append(row)
    print(f"{'threads':>7} {'rows':>5} {'libsndfile to a path':>21} {'in memory, one write':>21} {'whole rows':>11}"
          "   (ms a row)")
    for r in results:
        print(f"{r['threads']:>7} {r['rows']:>5} {r['libsndfile_to_path_ms']:>21.2f} {r['in_memory_ms']:>21.2f} "
              f"{r['write_ok_ms']:>11.2f}")
    write_results(args.out, dir=str(args.dir), runs=results)


if __name__ == "__main__":
    main()
