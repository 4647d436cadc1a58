"""The fused CUDA draw (runners/fused_draw.py) against sampling.draw, in Triton's CPU interpreter.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1.
Random float32 scores over the Higgs vocabulary (some masked to -inf, as the
delay pattern does; in a third of the rows integers, so that top-k cuts
through ties), every combination of greedy / temperature, top-k, top-p and
min-p, seeds past 2^32 (the hash's high word) and varied positions:
the tokens must be the PyTorch path's, exactly, and their logprobs equal to
within float32 rounding.
"""

from __future__ import annotations

import itertools
import sys

import torch

from tests.interpret_decode_attention import _patch_interpreter_scalars


def main() -> int:
    _patch_interpreter_scalars()
    from runners.fused_draw import fused_draw
    from runners.sampling import draw

    g = torch.Generator().manual_seed(0)
    grid = list(itertools.product([0.0, 0.7, 1.3], [0, 1, 50], [1.0, 0.9, 0.5], [0.0, 0.05]))
    rows = len(grid) * 2
    vocab = 1026  # the Higgs codebook (1024 codes, stream BOS, EOS): not a power of two
    scores = torch.randn(rows, vocab, generator=g) * 3
    scores[::5, vocab - 2] = float("-inf")  # a forced-away stream token
    scores[1::7, : vocab - 2] = float("-inf")  # a forced stream token: one finite score
    params = [grid[i // 2] for i in range(rows)]
    t, k, p, m = (torch.tensor([c[j] for c in params]) for j in range(4))
    k = k.long()
    seeds = torch.randint(0, 2**31, (rows,), generator=g) + torch.tensor([0, 2**40] * (rows // 2))
    positions = torch.randint(0, 4000, (rows,), generator=g)
    # ties: integer scores, so many tokens share the k-th value (all of them are kept);
    # top-p off there, since at a tie it keeps every tied copy (see fused_draw)
    ties = len(grid) // 3
    scores[-ties:] = torch.randint(-4, 5, (ties, vocab), generator=g).float()
    p[-ties:] = 1.0
    want_tok, want_lp = draw(scores, t, k, p, m, seeds, positions)
    got_tok, got_lp = fused_draw(scores, t, k, p, m, seeds, positions)
    bad = (want_tok != got_tok).nonzero()[:, 0].tolist()
    lp_err = (want_lp - got_lp).abs().max().item()
    print(f"{rows} rows: {len(bad)} tokens differ {bad[:5]}, max logprob difference {lp_err:.2e}")
    return 0 if not bad and lp_err < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
