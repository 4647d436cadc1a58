"""How close continuous batching can come to the one-wave rate, by simulation: no device.

Drives the real scheduler (omni_cli/scheduler.py, slots, prefills beside decode steps) over the rows
that `e2e_generate.py --vary V` writes (each row exactly its own length, seeded as there), with a
cost model measured on the device and given here: a decode step of n rows costs
  step(n) = a + (b - a) * n / batch      (--step-ms a b: the 1-row and the full-batch step)
and a prefill of k rows after the cached system prompt costs max(--prefill-floor-ms,
--prefill-ms-per-row * k) (GPU-bound from some rows on; the floor: a small prefill's launches).
A prefill beside a decode step costs both. The one-wave reference is BATCH:BATCH rows of the mean
length, decoded at full batch, its prefill at the same per-row cost. Prints, for each refill size
(the free slots that start a prefill; the scheduler's own is batch // 8), the decode steps, the
prefills and the rate as a share of the one wave's: with refills at the given cost, and free.

  python benchmarks/admission_sim.py --batch 64 --rows 256 --step-ms 2.39 3.20 --prefill-ms-per-row 0.70
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.timing import write_results  # noqa: E402
from omni_cli.runners.prompt_input import PromptInput  # noqa: E402
from omni_cli.runners.sampling.params import SamplingParams  # noqa: E402
from omni_cli.scheduler import Request, Scheduler  # noqa: E402


def lengths(rows: int, frames: int, vary: int) -> list[int]:
    """Each row's frames, as e2e_generate.py draws them (random.Random(rows), in row order)."""
    rng = random.Random(rows)
    return [rng.randint(frames - vary, frames + vary) if vary else frames for _ in range(rows)]


def simulate(lens: list[int], batch: int, refill: int, step, prefill) -> dict:
    """Synchronous steps through the scheduler; every row runs to its own length. -> ms, steps, prefills."""
    sched = Scheduler(batch, max(lens) + 8, beside=True)
    sched.refill = refill
    for i, n in enumerate(lens):
        sched.add(Request(rid=f"r{i}", prompt=PromptInput(ids=[1, 2, 3]),
                          params=SamplingParams(max_new_frames=n), seed=i))
    ms, steps, prefills = 0.0, 0, 0
    while sched.has_work():
        so = sched.schedule()
        decode = so.beside if so.is_prefill else so
        if so.is_prefill:
            ms += prefill(len(so.requests))
            prefills += 1
        if decode is not None:
            ms += step(len(decode.requests))
            steps += 1
        for req in (so.requests if so.is_prefill else []) + (decode.requests if decode is not None else []):
            if req.num_scheduled >= req.params.max_new_frames and req.status.value == "running":
                sched.finish(req, "length")
    return {"ms": ms, "decode_steps": steps, "prefills": prefills}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--vary", type=int, default=50)
    ap.add_argument("--step-ms", type=float, nargs=2, required=True, metavar=("ONE_ROW", "FULL"))
    ap.add_argument("--prefill-ms-per-row", type=float, required=True)
    ap.add_argument("--prefill-floor-ms", type=float, default=0.0)
    ap.add_argument("--refills", type=int, nargs="+", help="refill sizes (default: 1, 4, batch/16, batch/8, batch/4)")
    ap.add_argument("--out", type=Path, default=Path("admission_sim.json"))
    args = ap.parse_args()
    a, b = args.step_ms
    step = lambda n: a + (b - a) * n / args.batch  # noqa: E731
    prefill = lambda k: max(args.prefill_floor_ms, args.prefill_ms_per_row * k)  # noqa: E731
    lens = lengths(args.rows, args.frames, args.vary)
    mean = sum(lens) / len(lens)
    wave_ms = mean * step(args.batch) + args.prefill_ms_per_row * args.batch  # one wave of mean-length rows
    ideal_ms = wave_ms * args.rows / args.batch
    refills = args.refills or sorted({1, 4, max(1, args.batch // 16), max(1, args.batch // 8), max(1, args.batch // 4)})
    results = []
    print(f"batch {args.batch}, {args.rows} rows of {args.frames} +- {args.vary} frames; one-wave steps "
          f"{mean * args.rows / args.batch:.0f}")
    print(f"{'refill':>6} {'steps':>6} {'prefills':>8} {'share':>7} {'free refills':>13}")
    for r in refills:
        paid = simulate(lens, args.batch, r, step, prefill)
        free = simulate(lens, args.batch, r, step, lambda k: 0.0)
        free_ideal = ideal_ms - args.prefill_ms_per_row * args.rows  # the same reference, its prefill free too
        row = {"refill": r, **paid, "share": ideal_ms / paid["ms"], "share_free_refills": free_ideal / free["ms"]}
        results.append(row)
        print(f"{r:>6} {paid['decode_steps']:>6} {paid['prefills']:>8} {row['share']:>7.3f} "
              f"{row['share_free_refills']:>13.3f}")
    write_results(args.out, batch=args.batch, rows=args.rows, frames=args.frames, vary=args.vary,
                  step_ms=args.step_ms, prefill_ms_per_row=args.prefill_ms_per_row,
                  prefill_floor_ms=args.prefill_floor_ms, runs=results)


if __name__ == "__main__":
    main()
