"""The codec's wide residual units' dilated convolutions, as cuDNN gets them and two other ways.

The drain of a batch-256 run (benchmarks/drain_timeline.py) spent 6.3 ms a call
in cuDNN's generic `implicit_convolve_sgemm` for one 512-channel k7 dilated
convolution, where its two siblings took ~0.22 ms in a Hopper implicit-GEMM
kernel. This probe times, at the codec's call shapes (rows x codec frames x the
unit's rate), each k7 convolution of the 512- and 256-channel units
(dilations 1, 3, 9), bf16, median of synchronized calls:
- conv1d: F.conv1d with its bias, as the decoder runs it now;
- no bias: the same without the bias (what a separate bias pass costs);
- folded: a dilation-d convolution over length L is an undilated one over the
  [L/d, d] view of the signal (position p = d i + j; its taps d apart are rows
  i + k of column j), run as conv2d with a (7, 1) kernel on that view, the
  length padded to a multiple of d first where it is not one;
and the top kernels of each (profiler), and each result's max |diff| to conv1d
relative to max |conv1d|. Prints a table and writes JSON.

  python benchmarks/dilated_conv_probe.py --rows 21 32 --frames 192 256 --out dilated_conv_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import median_ms, write_results  # noqa: E402

# (channels, rate): the released decoder's 512- and 256-channel units run at 8 and 40
# samples a codec frame (upsampling 8, 5, 4, 2 from 1,024 channels)
UNITS = ((512, 8), (256, 40))


def folded(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, d: int) -> torch.Tensor:
    """conv1d(x, w, b, dilation=d, padding=3d) as conv2d over the [L/d, d] view. x [B, C, L]."""
    n, c, length = x.shape
    pad = -length % d
    xp = F.pad(x, (0, pad)) if pad else x
    y = F.conv2d(xp.view(n, c, (length + pad) // d, d), w.unsqueeze(-1), b, padding=(w.shape[-1] // 2, 0))
    y = y.view(n, w.shape[0], length + pad)
    return y[..., :length] if pad else y


def top_kernels(fn, k: int = 3) -> list[list]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for e in prof.events():
        if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name[:70]] = totals.get(e.name[:70], 0.0) + e.device_time_total
    return [[n, round(us, 1)] for n, us in sorted(totals.items(), key=lambda t: -t[1])[:k]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[21, 32])
    ap.add_argument("--frames", type=int, nargs="+", default=[192, 256])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("dilated_conv_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        for channels, rate in UNITS:
            w = torch.randn(channels, channels, 7, device=dev, dtype=torch.bfloat16) / (7 * channels) ** 0.5
            b = torch.randn(channels, device=dev, dtype=torch.bfloat16)
            for rows in args.rows:
                for frames in args.frames:
                    x = torch.randn(rows, channels, frames * rate, device=dev, dtype=torch.bfloat16)
                    for d in (1, 3, 9):
                        ways = {"conv1d": lambda: F.conv1d(x, w, b, padding=3 * d, dilation=d),
                                "no bias": lambda: F.conv1d(x, w, None, padding=3 * d, dilation=d),
                                "folded": lambda: folded(x, w, b, d)}
                        ref = ways["conv1d"]().float()
                        row = {"channels": channels, "rows": rows, "frames": frames, "length": frames * rate,
                               "dilation": d}
                        for name, fn in ways.items():
                            out = fn().float()
                            diff = (out - ref).abs().max().item() / ref.abs().max().item() if name != "no bias" else None
                            row[name] = {"ms": median_ms(fn, args.iters), "kernels": top_kernels(fn), "rel_diff": diff}
                        results.append(row)
                        print(f"{channels:>4} ch {rows:>3} x {frames:>3} frames (L {frames * rate:>6}) d {d}: "
                              + "  ".join(f"{n} {row[n]['ms']:.3f} ms" for n in ways)
                              + f"  | conv1d: {row['conv1d']['kernels'][0][0][:48]}"
                              + f"  | folded: {row['folded']['kernels'][0][0][:48]}"
                              + f"  (diff {row['folded']['rel_diff']:.1e})", flush=True)
    write_results(args.out, rows=args.rows, frames=args.frames, results=results)


if __name__ == "__main__":
    main()
