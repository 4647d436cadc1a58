"""Where a one-wave run's tail goes on the host: the real `omni generate` in this process, with
the host-side steps of its codec thread and writer threads timed.

In a one-wave run every row finishes at the last decode step, so the codec's
calls and the files all come after the loop (run.json's write_tail_s). The
device side of that tail is benchmarks/drain_timeline.py's; this is the
host side: each step below is wrapped with a timer (the code itself is
unchanged) and reported from the loop's end, per step: its calls after the
loop's end, their seconds in all, the CPU seconds their thread spent in them
(time.thread_time: what is left of the wall time is waiting, for the GIL,
a lock or the disk), and when the first began and the last ended (ms after
the loop's end). The steps: where each row's codec codes
are, the calls' sizes chosen, each codec call queued
and collected, a graph captured, each row's files encoded and published, its
manifest row, and the manifest's final rewrite.
Uses the random 3B checkpoint of benchmarks/e2e_generate.py (written once
into --root). Prints a table and writes JSON.

  python benchmarks/tail_host.py --rows 256 --batch 256 --root /tmp/e2e_root --out tail_host.json
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.e2e_generate import add_one_wave_args, one_wave_options  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402

# (module path, attribute path): the host steps timed, in the order they happen
STEPS = (("omni_cli.runners.higgs_audio_v2.runner", "HiggsRunner._codec_span"),
         ("omni_cli.runners.higgs_audio_v2.runner", "HiggsRunner._rows_per_call"),
         ("omni_cli.runners.higgs_audio_v2.runner", "HiggsRunner._launch_codec"),
         ("omni_cli.runners.codec_graphs", "CodecGraphs._record"),
         ("omni_cli.runners.higgs_audio_v2.runner", "HiggsRunner._collect_codec"),
         ("omni_cli.output", "OutputWriter.encode_ok"), ("omni_cli.output", "OutputWriter.publish"),
         ("omni_cli.output", "OutputWriter.add_row"), ("omni_cli.output", "OutputWriter.close"))


def _wrap(records: list, module: str, path: str) -> None:
    """Replace module.path (a function or a class's method) with a copy that appends
    (step, thread, start, end, the thread's CPU seconds in it) to records."""
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            records.append((path, threading.current_thread().name, t0, time.perf_counter(), time.thread_time() - c0))

    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_one_wave_args(ap)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="as e2e_generate.py's (0: one sentence a row)")
    ap.add_argument("--writer-threads", type=int, default=None,
                    help="run with this many writer threads instead of omni_cli/generate.py's WRITER_THREADS")
    ap.add_argument("--out", type=Path, default=Path("tail_host.json"))
    args = ap.parse_args()
    import omni_cli.generate as generate

    if args.writer_threads:
        generate.WRITER_THREADS = args.writer_threads
    opts = one_wave_options(args.root, "tail-host", args.rows, args.batch, args.frames, args.prompt_tokens)
    records: list[tuple] = []
    for module, path in STEPS:
        _wrap(records, module, path)
    _wrap(records, "omni_cli.generate", "run_loop")  # its end is the tail's start
    generate.run_generate(opts)
    timings = json.loads((opts.out / "run.json").read_text())["timings"]
    loop_end = max(t1 for step, _, _, t1, _ in records if step == "run_loop")
    steps: dict[str, dict] = defaultdict(lambda: {"calls": 0, "ms": 0.0, "cpu_ms": 0.0, "first_ms": None,
                                                  "last_ms": None, "threads": set()})
    for step, thread, t0, t1, cpu in records:
        if step == "run_loop" or t1 < loop_end:
            continue
        s = steps[step]
        s["calls"] += 1
        s["ms"] += (t1 - t0) * 1e3
        s["cpu_ms"] += cpu * 1e3
        s["first_ms"] = min(s["first_ms"] if s["first_ms"] is not None else 1e18, (t0 - loop_end) * 1e3)
        s["last_ms"] = max(s["last_ms"] if s["last_ms"] is not None else -1e18, (t1 - loop_end) * 1e3)
        s["threads"].add(thread.rsplit("_", 1)[0])
    rows = [{"step": k, **{f: v for f, v in s.items() if f != "threads"}, "threads": sorted(s["threads"])}
            for k, s in sorted(steps.items(), key=lambda kv: kv[1]["first_ms"])]
    print(f"{'step (after the loop)':34} {'calls':>6} {'ms':>8} {'cpu ms':>8} {'first ms':>9} {'last ms':>8}  threads")
    for r in rows:
        print(f"{r['step']:34} {r['calls']:>6} {r['ms']:>8.1f} {r['cpu_ms']:>8.1f} {r['first_ms']:>9.1f} {r['last_ms']:>8.1f}  "
              f"{','.join(r['threads'])}")
    keys = ("generate_s", "loop_s", "write_tail_s", "tail_codec_s", "write_busy_s", "codec_calls", "codec_s")
    print(json.dumps({k: timings[k] for k in keys}))
    write_results(args.out, rows=args.rows, batch=args.batch, frames=args.frames, prompt_tokens=args.prompt_tokens,
                  writer_threads=generate.WRITER_THREADS, steps=rows, timings={k: timings[k] for k in keys})


if __name__ == "__main__":
    main()
