"""How much of the codec's GPU time hides behind decode steps when both run at once.

Decoding finished frames while the LM still decodes (a streaming codec) pays
only if the two share the GPU well: the LM's steps at 64-256 rows are weight
and KV reads, the codec's convolutions are arithmetic. This script times, at
the 3B shape (random bf16 weights; the released tokenizer's codec shape):
STEPS graphed decode forwards of B rows back to back on a high-priority
stream (as the loop runs, runners/device.py: priority_stream); CALLS masked
codec decodes of ROWS rows x 192 frames on another thread and stream; and
both at once. hidden = (LM alone + codec alone - both) / codec alone: the
share of the codec's time the overlap saved. With --codec-sms N the codec's
stream belongs to a CUDA green context of N SMs (0: a plain stream, every SM),
so its convolutions cannot fill the GPU while the LM's steps can still use every
SM. Prints a table and writes JSON.

  python benchmarks/codec_overlap.py --batch 64 256 --codec-sms 0 32 --out codec_overlap.json
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.step_profile import _decode_batch  # noqa: E402
from omni_cli.bench import random_model  # noqa: E402
from omni_cli.runners.attention import KVCache  # noqa: E402
from omni_cli.runners.device import priority_stream  # noqa: E402
from omni_cli.runners.engine import Engine  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import random_codec  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def _green_context(sms: int):
    """A green context of `sms` SMs on device 0 (torch's beta API)."""
    from torch.cuda.green_contexts import GreenContext

    return GreenContext.create(num_sms=sms, device_id=0)


@contextlib.contextmanager
def _codec_stream(green):
    """The codec thread's stream: a new one, or the green context's. Its API differs between
    torch releases: a Stream() of its own, or (2.10) set_context making its default stream current."""
    if green is None:
        with torch.cuda.stream(torch.cuda.Stream()):
            yield
    elif hasattr(green, "Stream"):
        with torch.cuda.stream(green.Stream()):
            yield
    else:
        green.set_context()
        try:
            yield
        finally:
            green.pop_context()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rows", type=int, default=21, help="codec rows a call (omni generate's calls beside the loop)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--kv-len", type=int, default=164)
    ap.add_argument("--codec-sms", type=int, nargs="+", default=[0],
                    help="SMs of the codec's green context (0: a plain stream)")
    ap.add_argument("--out", type=Path, default=Path("codec_overlap.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    _, model, _ = random_model("higgs-audio-v2-3b", torch.bfloat16, dev, 512)
    codec = random_codec("higgs-audio-v2-3b", torch.bfloat16, dev)
    codes = torch.randint(0, 1024, (args.rows, 8, 192), device=dev)
    lengths = torch.full((args.rows,), 192, device=dev)
    cfg = model.cfg
    out = []
    for b, sms in [(b, n) for b in args.batch for n in args.codec_sms]:
        kv = KVCache(cfg.num_hidden_layers, b + 1, cfg.num_key_value_heads, 512, cfg.head_dim, torch.bfloat16, dev)
        engine = Engine(model, kv, dev)
        engine.use_graphs()
        fb = _decode_batch(engine, b, args.kv_len, cfg.num_codebooks)

        def lm() -> float:
            with priority_stream(dev):
                engine.forward(fb)  # capture outside the timing
                torch.cuda.current_stream().synchronize()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    engine.forward(fb)
                torch.cuda.current_stream().synchronize()
            return time.perf_counter() - t0

        green = _green_context(sms) if sms else None

        def codec_calls(result: list) -> None:
            with _codec_stream(green), torch.inference_mode():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    codec.decode(codes, lengths).cpu()
                result.append(time.perf_counter() - t0)

        def both() -> tuple[float, float]:
            res: list = []
            th = threading.Thread(target=codec_calls, args=(res,))
            t0 = time.perf_counter()
            th.start()
            lm_s = lm()
            th.join()
            return time.perf_counter() - t0, lm_s

        warm: list = []
        codec_calls(warm)  # cuDNN's first call at this shape, on a thread, as in omni generate
        lm()
        lm_alone = lm()
        res: list = []
        codec_calls(res)
        codec_alone = res[0]
        together, lm_beside = both()
        row = {"batch": b, "codec_sms": sms, "steps": args.steps, "codec_rows": args.rows, "codec_calls": args.calls,
               "lm_alone_s": lm_alone, "codec_alone_s": codec_alone, "both_s": together,
               "lm_steps_beside_codec_s": lm_beside,
               "hidden": (lm_alone + codec_alone - together) / codec_alone}
        out.append(row)
        print(f"batch {b:>3}, codec on {sms or 'all'} SMs: LM {lm_alone:.3f} s "
              f"({1e3 * lm_alone / args.steps:.2f} ms a step), codec {codec_alone:.3f} s, both {together:.3f} s "
              f"(LM {lm_beside:.3f} s): hidden {100 * row['hidden']:.0f}%", flush=True)
        del engine, kv
        torch.cuda.empty_cache()
    write_results(args.out, rows=out)


if __name__ == "__main__":
    main()
