"""Cost of --deterministic at the Higgs 3B shape, and its batch invariance, in one run.

Random bf16 weights, 64-token prompts, sampling on (temperature 1, top-k 50,
top-p 0.95), every request generating exactly --frames frames. Times every
decode step in the default mode and in deterministic mode, then reruns
deterministic mode at a quarter of the batch size and checks that every
request's codes and logprobs are bit-identical. The default mode is rerun at
the same batch size: the control (a rerun must match in every mode; a race
shows here). Prints a table and writes JSON.

  python benchmarks/deterministic_cost.py --batch 1 64 256 --max-seq-len 512 --out results.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.bench import random_model, run_requests  # noqa: E402
from omni_cli.runners.engine import DETERMINISTIC_SHAPES  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def differing(a, b) -> list[str]:
    """Requests whose codes or logprobs differ between two runs."""
    return [k for k in a.tokens if not (np.array_equal(a.tokens[k], b.tokens[k]) and
                                        np.array_equal(a.logprobs[k], b.logprobs[k]))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[64])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, nargs="+", default=[2048, 512])
    ap.add_argument("--out", type=Path, default=Path("deterministic_cost.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    _, model = random_model("higgs-audio-v2-3b", torch.bfloat16, device, max(args.max_seq_len))
    det = DETERMINISTIC_SHAPES["cuda"]
    rows = []
    for L, batch in ((L, b) for L in args.max_seq_len for b in args.batch):
        run = lambda width, shapes: run_requests(model, batch, width, args.frames,  # noqa: E731
                                                 args.prompt_len, L, False, device, shapes)
        run(batch, None), run(batch, det)  # warm-up: graph captures, kernel selection
        base, fixed, other = run(batch, None), run(batch, det), run(max(batch // 4, 1), det)
        diff = differing(fixed, other)
        rerun = differing(base, run(batch, None))
        rows.append({
            "max_seq_len": L, "batch": batch,
            "default_step_ms": base.ms_per_step, "deterministic_step_ms": fixed.ms_per_step,
            "step_cost_pct": 100 * (fixed.ms_per_step / base.ms_per_step - 1),
            "default_wall_s": base.wall_s, "deterministic_wall_s": fixed.wall_s,
            "wall_cost_pct": 100 * (fixed.wall_s / base.wall_s - 1),
            "default_prefill_s": sum(base.stats.prefill_ms) / 1e3, "deterministic_prefill_s": sum(fixed.stats.prefill_ms) / 1e3,
            "invariance_checked_at": max(batch // 4, 1), "requests_differing": len(diff),
            "default_rerun_requests_differing": len(rerun),
        })
    print(f"{'max_seq_len':>11} {'batch':>5} {'default ms/step':>16} {'determ. ms/step':>16} {'step cost':>10} "
          f"{'wall cost':>10} {'invariant':>10} {'default rerun equal':>20}")
    for r in rows:
        print(f"{r['max_seq_len']:>11} {r['batch']:>5} {r['default_step_ms']:>16.2f} {r['deterministic_step_ms']:>16.2f} "
              f"{r['step_cost_pct']:>9.1f}% {r['wall_cost_pct']:>9.1f}% {str(not r['requests_differing']):>10} "
              f"{str(not r['default_rerun_requests_differing']):>20}")
    write_results(args.out, frames=args.frames, prompt_len=args.prompt_len, rows=rows)


if __name__ == "__main__":
    main()
