"""The batch-invariant projection kernel (runners/invariant_mm.py) against PyTorch, in Triton's
CPU interpreter, with pointer loads and with TMA tensor descriptors.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1; exits 0 only if
every case matched. Float32 operands, float64 PyTorch as the oracle, at sizes that are no
multiple of the tiles (rows past m and columns past n are masked or read as zeros):
  invariant_mm          x @ w.T + bias, and silu(gate) * up (rounded where PyTorch rounds)
  invariant_mm_parts    each k range's partial is that range's product; their sum through
                        add_rmsnorm(parts=True) is x + (sum + bias), and its RMSNorm
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from tests.interpret_decode_attention import _patch_interpreter_calls, _patch_interpreter_scalars

M, N, K = 5, 80, 96  # rows short of a 16-row block, columns short of a 32-column one


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> bool:
    err = float((got.double() - want).abs().max() / want.abs().max())
    print(f"{what}: relative error {err:.2e}")
    return err < 1e-5


def main() -> int:
    _patch_interpreter_calls()
    _patch_interpreter_scalars()
    from omni_cli.runners.fused_ops import add_rmsnorm
    from omni_cli.runners.invariant_mm import invariant_mm, invariant_mm_parts

    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(2 * N, K, generator=g) / K**0.5
    bias = torch.randn(2 * N, generator=g)
    res = torch.randn(M, N, generator=g)
    norm_w = torch.rand(N, generator=g) + 0.5
    xd, wd = x.double(), w.double()
    ok = True
    for tma in (False, True):
        tile = (16, 32, 32, 4, 2, tma)
        ok &= close(invariant_mm(x, w[:N], bias=bias[:N], tile=tile), xd @ wd[:N].T + bias[:N].double(),
                    f"x @ w.T + bias, TMA {tma}")
        gate, up = xd @ wd[:N].T, xd @ wd[N:].T
        ok &= close(invariant_mm(x, w, silu_mul=True, tile=(16, 16, 32, 4, 2, tma)), F.silu(gate) * up,
                    f"silu(gate) * up, TMA {tma}")
        parts = invariant_mm_parts(x, w[:N], kind="down", splits=2, tile=(16, 32, 16, 4, 2, tma))
        for s in range(2):
            cols = slice(s * K // 2, (s + 1) * K // 2)
            ok &= close(parts[s], xd[:, cols] @ wd[:N, cols].T, f"partial {s} of 2, TMA {tma}")
        summed, normed = add_rmsnorm(res, parts, norm_w, 1e-6, parts=True, bias=bias[:N])
        want = res.double() + (xd @ wd[:N].T + bias[:N].double())
        ok &= close(summed, want, f"residual + partials + bias, TMA {tma}")
        rms = (want.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
        ok &= close(normed, want * rms * norm_w.double(), f"its RMSNorm, TMA {tma}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
