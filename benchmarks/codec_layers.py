"""Where the codec's time goes: every convolution of the released tokenizer's DAC decoder,
timed alone at a codec call's shape, as a conv1d on [B, C, L] against the same convolution
as a channels-last conv2d ([B, C, 1, L] stored as [B, 1, L, C], the layout cuDNN's
tensor-core kernels read), each with cuDNN's default algorithm choice and with its
benchmark mode (it times the candidates once per shape). Then the whole masked decode as
omni generate runs it (runners/higgs_audio_v2/codec.py, [B, C, L]), with and without the
benchmark mode. Random weights at the real shape (the modules' own init, so the codebooks
are zero and the latent is constant over time: timing only); bf16 unless --dtype. The two
layouts' outputs are compared (max |diff| relative to max |out|) so a faster layout is not
a different convolution. Prints a table and writes JSON.

  python benchmarks/codec_layers.py --rows 32 --frames 200 --out codec_layers.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms, write_results  # noqa: E402
from omni_cli.runners.attention import fused_kernels_available  # noqa: E402
from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder, Snake1d, _FusedSnake1d  # noqa: E402
from omni_cli.runners.higgs_audio_v2.shapes import codec_config  # noqa: E402


def _decoder(dtype: torch.dtype, dev: torch.device) -> HiggsCodecDecoder:
    """The decoder at the released shape with its modules' own random init (timing only)."""
    dec = HiggsCodecDecoder(codec_config("higgs-audio-v2-3b").to_dict(), Path("codec_config"))
    dec = dec.to(device=dev, dtype=dtype).eval()
    if fused_kernels_available(dev):  # as HiggsCodecDecoder.load
        for m in dec.acoustic_decoder.modules():
            if isinstance(m, Snake1d):
                m.__class__ = _FusedSnake1d
    return dec


def _convs(dec) -> list[tuple[str, torch.nn.Module, int]]:
    """(name, module, samples per frame at its input) in the decoder's order."""
    ad = dec.acoustic_decoder
    out = [("conv1", ad.conv1, 1)]
    rate = 1
    for i, block in enumerate(ad.block):
        out.append((f"block{i}.conv_t1", block.conv_t1, rate))
        rate *= block.conv_t1.stride[0]
        for j, unit in enumerate((block.res_unit1, block.res_unit2, block.res_unit3)):
            out.append((f"block{i}.res{j}.conv1", unit.conv1, rate))
            out.append((f"block{i}.res{j}.conv2", unit.conv2, rate))
    out.append(("conv2", ad.conv2, rate))
    return out


def _as_2d(conv: torch.nn.Module):
    """The conv1d / conv_transpose1d as a function of a channels-last [B, C, 1, L] input."""
    w = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    if isinstance(conv, torch.nn.ConvTranspose1d):
        return lambda x: F.conv_transpose2d(x, w, conv.bias, stride=(1, conv.stride[0]), padding=(0, conv.padding[0]),
                                            output_padding=(0, conv.output_padding[0]))
    return lambda x: F.conv2d(x, w, conv.bias, padding=(0, conv.padding[0]), dilation=(1, conv.dilation[0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("codec_layers.json"))
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    torch.manual_seed(0)
    dec = _decoder(dtype, dev)
    b, t = args.rows, args.frames
    rows = []
    for name, conv, rate in _convs(dec):
        x = torch.randn(b, conv.in_channels, t * rate, device=dev, dtype=dtype)
        x2 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        f2 = _as_2d(conv)
        with torch.no_grad():
            ref, alt = conv(x), f2(x2).squeeze(2)
            err = ((ref.float() - alt.float()).abs().max() / ref.float().abs().max()).item()
            row = {"conv": name, "in": conv.in_channels, "out": conv.out_channels, "k": conv.kernel_size[0],
                   "samples": t * rate, "rel_diff": err}
            for bench in (False, True):
                torch.backends.cudnn.benchmark = bench
                tag = "bench" if bench else "default"
                row[f"ncl_{tag}_ms"] = median_ms(lambda: conv(x), args.iters)
                row[f"nlc_{tag}_ms"] = median_ms(lambda: f2(x2), args.iters)
        rows.append(row)
    torch.backends.cudnn.benchmark = False
    codes = torch.randint(0, 1024, (b, dec.num_quantizers, t), device=dev)
    lengths = torch.full((b,), t, device=dev)
    whole = {}
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        whole["bench" if bench else "default"] = median_ms(lambda: dec.decode(codes, lengths), args.iters)
    cols = ["ncl_default_ms", "ncl_bench_ms", "nlc_default_ms", "nlc_bench_ms"]
    print(f"{'conv':<20} {'in':>5} {'out':>5} {'k':>3} {'samples':>8} " + " ".join(f"{c:>15}" for c in cols)
          + f" {'rel diff':>9}")
    for r in rows:
        print(f"{r['conv']:<20} {r['in']:>5} {r['out']:>5} {r['k']:>3} {r['samples']:>8} "
              + " ".join(f"{r[c]:>15.3f}" for c in cols) + f" {r['rel_diff']:>9.1e}")
    print("sum".ljust(44) + " ".join(f"{sum(r[c] for r in rows):>15.3f}" for c in cols))
    audio_s = b * t / 25
    print(f"whole masked decode: default {whole['default']:.2f} ms ({audio_s / whole['default'] * 1e3:,.0f} audio-s/s), "
          f"benchmark mode {whole['bench']:.2f} ms ({audio_s / whole['bench'] * 1e3:,.0f})")
    write_results(args.out, rows_per_call=b, frames=t, dtype=args.dtype, convs=rows, whole_ms=whole)


if __name__ == "__main__":
    main()
