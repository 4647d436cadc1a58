"""Async decode (one-step lookahead) against synchronous steps, in one run.

Higgs Audio v2 3B shape, random bf16 weights, 64-token prompts, sampling on
(temperature 1, top-k 50, top-p 0.95), each request generating exactly
--frames frames. For each batch size: decode ms/step, audio-s/s over the
whole run (prefill included), the event-query hit rate, and whether async
and sync produced the same codes and logprobs bit for bit. Each mode runs
--repeats times, alternating, and medians are reported. Prints a table and
writes JSON.

  python benchmarks/async_decode.py --batch 1 8 64 --out async_decode.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.bench import AUDIO_S_PER_FRAME, random_model, run_requests  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode, alternating; medians are reported")
    ap.add_argument("--out", type=Path, default=Path("async_decode.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    _, model = random_model("higgs-audio-v2-3b", torch.bfloat16, device, args.max_seq_len)
    run = lambda b, mode: run_requests(model, b, b, args.frames, args.prompt_len,  # noqa: E731
                                       args.max_seq_len, mode, device)
    run(2, True)  # warm-up
    rows = []
    for b in args.batch:
        runs = {False: [], True: []}
        for _ in range(args.repeats):  # alternate, so drift hits both modes alike
            for mode in (False, True):
                runs[mode].append(run(b, mode))
        sync, lookahead = runs[False][0], runs[True][0]
        same = all(np.array_equal(sync.tokens[k], lookahead.tokens[k]) and
                   np.array_equal(sync.logprobs[k], lookahead.logprobs[k]) for k in sync.tokens)
        walls = {m: [r.wall_s for r in runs[m]] for m in runs}
        audio = b * (args.frames - 8) * AUDIO_S_PER_FRAME
        hits, misses = sum(r.hits for r in runs[True]), sum(r.misses for r in runs[True])
        rows.append({"batch": b,
                     "sync_ms_per_step": float(np.median([r.ms_per_step for r in runs[False]])),
                     "async_ms_per_step": float(np.median([r.ms_per_step for r in runs[True]])),
                     "sync_audio_s_per_s": audio / float(np.median(walls[False])),
                     "async_audio_s_per_s": audio / float(np.median(walls[True])),
                     "speedup_pct": 100 * (np.median(walls[False]) / np.median(walls[True]) - 1),
                     "sync_wall_s": walls[False], "async_wall_s": walls[True],
                     "hit_rate": hits / (hits + misses), "hits": hits, "misses": misses, "bit_identical": same})
    print(f"medians of {args.repeats} runs each")
    print(f"{'batch':>5} {'sync ms/step':>13} {'async ms/step':>14} {'sync aud-s/s':>13} {'async aud-s/s':>14} "
          f"{'speedup':>8} {'hit rate':>9} {'identical':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['sync_ms_per_step']:>13.2f} {r['async_ms_per_step']:>14.2f} "
              f"{r['sync_audio_s_per_s']:>13.2f} {r['async_audio_s_per_s']:>14.2f} {r['speedup_pct']:>7.1f}% "
              f"{100 * r['hit_rate']:>8.1f}% {str(r['bit_identical']):>9}")
    write_results(args.out, frames=args.frames, prompt_len=args.prompt_len, repeats=args.repeats, rows=rows)


if __name__ == "__main__":
    main()
