"""Qwen3-TTS's 12 Hz codec decode on the GPU at the release's decoder widths (random weights): ms a
call and frames a second by rows x frames, for the vocoder on its fused kernels (runners/qwen3_tts/
fused_codec.py, what omni generate runs) and as plain modules, in one run; how far the fused call is
from the modules' in the same dtype and from the modules' in float32 beside how far the modules
themselves are from float32 (max |diff| of audio in [-1, 1]); with --profile the kernels that take a
call's time (torch.profiler). The codec stage decodes finished rows in calls like these.

    python benchmarks/qwen3_codec.py --rows 16 --rows 64 --frames 200 --profile --out codec.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms, write_results  # noqa: E402


def build(dtype: torch.dtype, dev: torch.device):
    from omni_cli.runners.qwen3_tts.codec import CodecDecoder, Qwen3Codec
    from omni_cli.runners.qwen3_tts.codec_config import CodecDecoderConfig
    from omni_cli.runners.qwen3_tts.config import _Reader
    from omni_cli.runners.qwen3_tts.shapes import speech_tokenizer_dict

    spec = speech_tokenizer_dict("qwen3-tts-12hz-0.6b")["decoder_config"]
    cfg = CodecDecoderConfig.read(_Reader(spec, Path("speech_tokenizer/config.json"), "decoder_config."))
    torch.manual_seed(0)
    with torch.device(dev):
        dec = CodecDecoder(cfg)
    for name, p in dec.named_parameters():
        if name.endswith("embedding_sum"):
            p.data.normal_()
    dec = dec.to(dtype).eval()
    dec.pre_transformer.set_rope(dev)
    return Qwen3Codec(dec, eos_id=2150)


def _with(codec, fused: bool, dtype: torch.dtype | None = None):
    """The same decoder's weights as a codec whose vocoder runs fused or as modules (in dtype)."""
    import copy

    from omni_cli.runners.qwen3_tts.codec import Qwen3Codec

    dec = copy.deepcopy(codec.decoder)
    if dtype is not None:
        dec = dec.to(dtype)
    dec.fused = fused
    return Qwen3Codec(dec, eos_id=2150)


def profile(fn) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, list] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            by_name.setdefault(e.name, []).append(e.device_time_total)
    total = sum(sum(v) for v in by_name.values())
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    return {"kernels": sum(len(v) for v in by_name.values()), "gpu_ms": total / 1e3,
            "top": [(name[:100], len(v), sum(v) / 1e3) for name, v in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, action="append")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    dev, dtype = torch.device("cuda"), getattr(torch, a.dtype)
    base = build(torch.float32, dev)
    peers = {"fused": _with(base, True, dtype), "modules": _with(base, False, dtype)}
    rows = []
    for b in a.rows or [64]:
        codes = torch.randint(0, 2048, (b, 16, a.frames), device=dev)
        lengths = torch.full((b,), a.frames, device=dev)
        with torch.inference_mode():
            out = {name: c.decode(codes, lengths) for name, c in peers.items()}
            ref = base.decode(codes, lengths) if b <= 16 else None  # float32 modules (memory: small calls only)
        diffs = {"fused_vs_modules": float((out["fused"] - out["modules"]).abs().max())}
        if ref is not None:
            diffs.update(fused_vs_fp32=float((out["fused"] - ref).abs().max()),
                         modules_vs_fp32=float((out["modules"] - ref).abs().max()))
        del out, ref
        for name, c in peers.items():
            fn = lambda c=c: c.decode(codes, lengths)  # noqa: E731
            with torch.inference_mode():
                ms = median_ms(fn, a.iters)
            row = {"peer": name, "rows": b, "frames": a.frames, "dtype": a.dtype, "ms": ms,
                   "frames_per_s": b * a.frames / (ms / 1e3), "audio_s_per_s": b * a.frames / 12.5 / (ms / 1e3),
                   **(diffs if name == "fused" else {})}
            print(f"{name:<8} {b:>5} rows x {a.frames} frames {a.dtype}: {ms:9.1f} ms {row['frames_per_s']:9.0f} "
                  f"frames/s {row['audio_s_per_s']:8.0f} audio-s/s"
                  + ("  " + " ".join(f"{k} {v:.2e}" for k, v in diffs.items()) if name == "fused" else ""),
                  flush=True)
            if a.profile:
                with torch.inference_mode():
                    row["profile"] = p = profile(fn)
                print(f"      {p['kernels']} kernels, {p['gpu_ms']:.1f} ms GPU; top:")
                for kname, n, ms_ in p["top"][:12]:
                    print(f"      {ms_:9.2f} ms {n:5d}x  {kname}", flush=True)
            rows.append(row)
        torch.cuda.empty_cache()
    if a.out:
        write_results(a.out, rows=rows)


if __name__ == "__main__":
    main()
