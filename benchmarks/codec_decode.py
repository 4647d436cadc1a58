"""Codec decode throughput at the released Higgs Audio v2 tokenizer's shape (random weights).

Ours (runners/higgs_audio_v2/codec.py: transformers' DAC decoder with the
Snake activations fused on CUDA) against transformers'
HiggsAudioV2TokenizerModel.decode, same weights (ours loads the saved
reference checkpoint through its real loading path), same codes, in one run.
Each row: dtype, batch x seconds of codes, median ms per decode, audio-s/s;
for ours also the peak device memory of one decode above what was allocated
before it, and how far a row decoded in the batch is from the same row
decoded alone (max |diff| over the batch's first and last rows), beside how
far this dtype is from float32 (max |diff| of our decode against our float32
decode of the same codes), and the ms of the masked decode that omni generate
runs on padded batches (codec.decode with lengths; here every row full).
Prints a table and writes JSON.

  python benchmarks/codec_decode.py --batch 1 16 64 --seconds 10 --out codec_decode.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import codec_config  # noqa: E402
from benchmarks.timing import median_ms, write_results  # noqa: E402


def main() -> None:
    from transformers import HiggsAudioV2TokenizerModel

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("codec_decode.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ref = HiggsAudioV2TokenizerModel(codec_config("higgs-audio-v2-3b")).eval()
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(tmp)
        ours = {dt: HiggsCodecDecoder.load(Path(tmp), dt, dev) for dt in (torch.float32, torch.bfloat16)}
    ref = ref.to(dev)
    frames = int(args.seconds * 25)
    rows = []
    for dt in (torch.float32, torch.bfloat16):
        ref = ref.to(dt)
        for b in args.batch:
            codes = torch.randint(0, 1024, (b, 8, frames), device=dev)
            with torch.inference_mode():
                peers = {"omni": lambda: ours[dt].decode(codes), "transformers": lambda: ref.decode(codes, return_dict=False)}
                out = {name: fn() for name, fn in peers.items()}
                diff = float((out["omni"] - out["transformers"][:, 0].float()).abs().max())
                ends = [0, b - 1]
                alone = torch.cat([ours[dt].decode(codes[i: i + 1]) for i in ends])
                vs_alone = float((out["omni"][ends] - alone).abs().max())
                vs_fp32 = float((out["omni"] - ours[torch.float32].decode(codes)).abs().max())
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                ours[dt].decode(codes)
                peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
                for name, fn in peers.items():
                    ms = median_ms(fn, args.iters)
                    row = {"peer": name, "dtype": str(dt).replace("torch.", ""), "batch": b,
                           "seconds": args.seconds, "ms": ms, "audio_s_per_s": b * args.seconds / (ms / 1e3),
                           "max_abs_diff_vs_transformers": diff}
                    if name == "omni":
                        full = torch.full((b,), frames, device=dev)
                        row.update(peak_mib=peak_mib, max_abs_diff_batched_vs_alone=vs_alone,
                                   max_abs_diff_vs_fp32=vs_fp32,
                                   ms_masked=median_ms(lambda: ours[dt].decode(codes, full), args.iters))
                    rows.append(row)
            torch.cuda.empty_cache()
    print(f"{'peer':<13} {'dtype':<9} {'batch':>5} {'ms':>9} {'audio-s/s':>10} {'max |diff|':>11} "
          f"{'peak MiB':>9} {'vs alone':>9} {'vs fp32':>9} {'masked ms':>10}")
    for r in rows:
        extra = (f" {r['peak_mib']:>9.0f} {r['max_abs_diff_batched_vs_alone']:>9.2e} {r['max_abs_diff_vs_fp32']:>9.2e}"
                 f" {r['ms_masked']:>10.1f}" if "peak_mib" in r else "")
        print(f"{r['peer']:<13} {r['dtype']:<9} {r['batch']:>5} {r['ms']:>9.1f} {r['audio_s_per_s']:>10.0f} "
              f"{r['max_abs_diff_vs_transformers']:>11.2e}{extra}")
    write_results(args.out, rows=rows)


if __name__ == "__main__":
    main()
