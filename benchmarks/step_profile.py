"""Where a decode step's time goes, at the Higgs Audio v2 3B shape (random bf16 weights).

For each batch size, in one run:
  step      the runner's whole decode step through the scheduler loop (async, graphs), median ms
  forward   the graphed decode forward alone (input copies + replay + logits copy), ms
  sample    the draw the runner uses (the fused kernel on CUDA) alone on [batch * 8, codebook]
            logits (temperature, top-k, top-p), ms, launched eagerly
  kernels   GPU time by kernel of the same forward launched eagerly (torch.profiler), top entries
--deterministic profiles deterministic mode's step (runners/higgs_audio_v2/invariant_step.py).
Prints a table and writes JSON.

  python benchmarks/step_profile.py --batch 1 64 --out step_profile.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.bench import random_model, run_requests  # noqa: E402
from omni_cli.runners.attention import KVCache  # noqa: E402
from omni_cli.runners.engine import DETERMINISTIC_SHAPES, Engine, ForwardBatch  # noqa: E402
from omni_cli.runners.sampling.fused_draw import fused_draw_rows  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def _time_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _decode_batch(engine: Engine, b: int, kv_len: int, codebooks: int) -> ForwardBatch:
    dev = engine.device
    return ForwardBatch(is_prefill=False, rids=[str(i) for i in range(b)], slots_gpu=torch.arange(b, device=dev),
                        lengths_cpu=[kv_len] * b, steps_cpu=[kv_len - 64] * b,
                        steps_gpu=torch.full((b,), kv_len - 64, device=dev),
                        positions_gpu=torch.full((b, 1), kv_len - 1, device=dev),
                        model_inputs={"audio_codes": torch.randint(0, 1000, (b, 1, codebooks), device=dev)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--kv-len", type=int, default=164, help="keys per row in the timed forward")
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("step_profile.json"))
    args = ap.parse_args()
    device = torch.device("cuda")
    ref, model = random_model("higgs-audio-v2-3b", torch.bfloat16, device, args.max_seq_len)
    del ref
    cfg = model.cfg
    c, v = cfg.num_codebooks, cfg.codebook_size
    rows = []
    for b in args.batch:
        shapes = DETERMINISTIC_SHAPES["cuda"] if args.deterministic else None
        step = run_requests(model, b, b, 64, 64, args.max_seq_len, True, device, shapes).ms_per_step
        kv = KVCache(cfg.num_hidden_layers, b + 1, cfg.num_key_value_heads, args.max_seq_len, cfg.head_dim,
                     torch.bfloat16, device)
        engine = Engine(model, kv, device, shapes)
        fb = _decode_batch(engine, b, args.kv_len, c)
        engine.use_graphs(capture=False)  # the graphed computation, launched eagerly
        eager_ms = _time_ms(lambda: engine.forward(fb), 10)
        eager_graphs = engine.graphs
        engine.use_graphs()
        fwd_ms = _time_ms(lambda: engine.forward(fb), 50)
        r = b * c
        tables = dict(temperature=torch.ones(b, device=device), top_k=torch.full((b,), 50, device=device),
                      top_p=torch.full((b,), 0.95, device=device), min_p=torch.zeros(b, device=device),
                      seed=torch.arange(b, device=device))
        par = dict(scores=torch.randn(r, v, device=device), slots=torch.arange(b, device=device),
                   steps=torch.full((b,), 64, device=device), tables=tables, streams=c,
                   history=torch.zeros(b, c, args.max_seq_len, dtype=torch.int64, device=device))
        sample_ms = _time_ms(lambda: fused_draw_rows(**par), 50)
        engine.graphs = eager_graphs
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                engine.forward(fb)
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
        events.sort(key=lambda e: -e.device_time_total)
        total = sum(e.device_time_total for e in events) / 3 / 1e3
        kernels = [{"name": e.key[:90], "ms_per_forward": e.device_time_total / 3 / 1e3, "calls_per_forward": e.count / 3}
                   for e in events[: args.top]]
        rows.append({"batch": b, "step_ms": step, "graph_forward_ms": fwd_ms, "eager_forward_ms": eager_ms,
                     "sample_ms": sample_ms, "eager_kernel_ms": total,
                     "kernel_launches_per_forward": sum(e.count for e in events) / 3, "kernels": kernels})
        del engine, kv
        torch.cuda.empty_cache()
    print(f"{'batch':>5} {'step':>7} {'graph fwd':>10} {'eager fwd':>10} {'sample':>7} {'GPU kernels':>12} {'launches':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['step_ms']:>7.2f} {r['graph_forward_ms']:>10.2f} {r['eager_forward_ms']:>10.2f} "
              f"{r['sample_ms']:>7.2f} {r['eager_kernel_ms']:>12.2f} {r['kernel_launches_per_forward']:>9.0f}")
        for k in r["kernels"]:
            print(f"      {k['ms_per_forward']:8.3f} ms {k['calls_per_forward']:6.0f}x  {k['name']}")
    write_results(args.out, kv_len=args.kv_len, deterministic=args.deterministic, rows=rows)


if __name__ == "__main__":
    main()
