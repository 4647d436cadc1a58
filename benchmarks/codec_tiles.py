"""The codec's own kernels at a drain call's shapes (ROWS x 192 frames, bf16, random weights).

1. The residual-unit kernel's tile (runners/fused_codec.py). For each width
the kernel takes (128, 64, 32 channels, at 4, 8 and 24 kHz: L = 192 codec
frames x 160, 320, 960 samples a frame), a row's three units (dilations 1, 3,
9) on [ROWS, C, L] signals, masked, timed from one CUDA graph at each tile of
--tiles (positions a program x warps) and the shipped one
(fused_codec.UNIT_TILES). Every tile's output is compared with the shipped
tile's (max |diff|): a tile must not change a value, only the time. GB/s
counts the three [ROWS, C, L] passes of a unit (s and x read, the output
written).
2. The last convolution (32 channels -> 1, kernel 7, at 24 kHz): cuDNN's
(F.conv1d) against _head_kernel at the shipped tile (HEAD_TILE) and each of
--head-tiles, each against cuDNN's output (max |diff| over max |out|).
Prints tables and writes JSON.

  python benchmarks/codec_tiles.py --rows 32 --out codec_tiles.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import graph_us, write_results  # noqa: E402
from omni_cli.runners.fused_codec import HEAD_TILE, UNIT_TILES, FusedHead, FusedUnit, _head_kernel, _unit_kernel  # noqa: E402

WIDTHS = {128: 160, 64: 320, 32: 960}  # channels -> samples a codec frame at that stage
FRAMES = 192


class _Unit(torch.nn.Module):  # the shapes FusedUnit reads from a decoder's residual unit
    def __init__(self, c: int, dilation: int):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(c, c, 7, dilation=dilation, padding=3 * dilation)
        self.conv2 = torch.nn.Conv1d(c, c, 1)
        self.snake2 = torch.nn.Module()
        self.snake2.alpha = torch.nn.Parameter(torch.rand(1, c, 1) + 0.5)


def _run(unit: FusedUnit, s, x, lengths, rate, block: int, warps: int) -> torch.Tensor:
    b, c, length = x.shape
    out = torch.empty_like(x)
    _unit_kernel[(triton.cdiv(length, block), b)](
        s, x, unit.w1, unit.b1, unit.alpha2, unit.w2, unit.b2, out, lengths, length, rate, unit.dilation,
        C=c, BLOCK_L=block, MASKED=True, PRECISION="tf32", num_warps=warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tiles", nargs="+", default=["128:32:4", "128:64:8", "128:32:8", "64:128:4", "64:64:4",
                                                    "64:64:8", "32:256:4", "32:64:4", "32:128:8", "32:64:2"],
                    help="CHANNELS:POSITIONS:WARPS, beside the shipped tile of each width")
    ap.add_argument("--head-tiles", nargs="+", default=["256:4", "64:4", "128:8", "64:2"],
                    help="POSITIONS:WARPS of the last convolution's kernel, beside the shipped one")
    ap.add_argument("--out", type=Path, default=Path("codec_tiles.json"))
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    rows = []
    for c, rate in WIDTHS.items():
        length = FRAMES * rate
        units = [FusedUnit(_Unit(c, d).to(dev, dt)) for d in (1, 3, 9)]
        x = torch.randn(args.rows, c, length, device=dev, dtype=dt)
        s = torch.randn_like(x)
        lengths = torch.full((args.rows,), FRAMES, device=dev)
        shipped = UNIT_TILES[c]
        want = [_run(u, s, x, lengths, rate, *shipped) for u in units]
        mb = 3 * x.numel() * x.element_size() / 1e6
        tiles = [shipped] + [(b, w) for t in args.tiles for cc, b, w in [map(int, t.split(":"))] if cc == c]
        for block, warps in tiles:
            try:
                got = [_run(u, s, x, lengths, rate, block, warps) for u in units]
                us = graph_us(lambda i: _run(units[i], s, x, lengths, rate, block, warps), len(units))
            except triton.runtime.errors.OutOfResources as e:
                rows.append({"channels": c, "block": block, "warps": warps, "error": str(e)[:80]})
                continue
            diff = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
            rows.append({"channels": c, "length": length, "block": block, "warps": warps,
                         "shipped": (block, warps) == shipped, "us_per_unit": us, "gb_s": mb / us * 1e3,
                         "max_abs_diff_vs_shipped": diff})
    head = _head(args, dev, dt)
    print(f"{'C':>4} {'block':>6} {'warps':>5} {'us/unit':>9} {'GB/s':>7} {'diff':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['channels']:>4} {r['block']:>6} {r['warps']:>5}   {r['error']}")
            continue
        mark = " <- shipped" if r["shipped"] else ""
        print(f"{r['channels']:>4} {r['block']:>6} {r['warps']:>5} {r['us_per_unit']:>9.1f} {r['gb_s']:>7.0f} "
              f"{r['max_abs_diff_vs_shipped']:>9.2e}{mark}")
    print("the last convolution:")
    for r in head:
        print(f"  {r['peer']:>24} {r['us']:>9.1f} us  {r['rel_diff_vs_cudnn']:.2e} (max |diff| / max |out|)")
    write_results(args.out, rows_per_call=args.rows, frames=FRAMES, results=rows, last_convolution=head)


@torch.inference_mode()
def _head(args, dev, dt) -> list[dict]:
    """The last convolution: cuDNN against the kernel at each tile, us per call and the distance."""
    conv = torch.nn.Conv1d(32, 1, 7, padding=3).to(dev, dt)
    s = torch.randn(args.rows, 32, FRAMES * WIDTHS[32], device=dev, dtype=dt)
    want = conv(s).float()
    out = [{"peer": "cudnn", "us": graph_us(lambda i: conv(s), 1), "rel_diff_vs_cudnn": 0.0}]
    fused = FusedHead(conv)
    for block, warps in [HEAD_TILE] + [tuple(map(int, t.split(":"))) for t in args.head_tiles]:

        def run(i, block=block, warps=warps):
            y = torch.empty(args.rows, 1, s.shape[-1], device=dev, dtype=dt)
            _head_kernel[(triton.cdiv(s.shape[-1], block), args.rows)](s, fused.w, fused.b, y, s.shape[-1], C=32,
                                                                       BLOCK=block, num_warps=warps)
            return y

        diff = float((run(0).float() - want).abs().max() / want.abs().max())
        shipped = " (shipped)" if (block, warps) == HEAD_TILE else ""
        out.append({"peer": f"kernel {block}x{warps}{shipped}", "us": graph_us(run, 1), "rel_diff_vs_cudnn": diff})
    return out


if __name__ == "__main__":
    main()
