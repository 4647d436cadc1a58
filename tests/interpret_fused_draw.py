"""The fused CUDA draw (runners/sampling/fused_draw.py) against ops.draw_rows, in Triton's CPU interpreter.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1.
Random float32 scores over the Higgs vocabulary and two others (some masked to -inf, as the
delay pattern does; in a third of the rows integers, so that top-k cuts
through ties), every combination of greedy / temperature, top-k, top-p and
min-p, seeds past 2^32 (the hash's high word) and varied positions:
the tokens must be the PyTorch path's, exactly, their logprobs equal to
within float32 rounding, and the history they write the same. Parameters
are read from per-slot tables at shuffled slots, with one row per request
and with eight (request-major rows, draw position step * 8 + stream).
Subsets: a frame drawn a few streams at a time (streams [first, first + n)
of eight, as an inner loop's sub-steps) must give the full draw's tokens,
logprobs and history bit for bit, and the PyTorch path's subset draws.
"""

from __future__ import annotations

import itertools
import sys

import torch

from tests.interpret_decode_attention import _patch_interpreter_scalars


def _inputs(g: torch.Generator, streams: int, vocab: int):
    """Rows of requests of `streams` rows each; a request's parameters sit at a shuffled slot.
    Returns (scores [rows, vocab], slots, steps [n_req], tables, an empty history)."""
    grid = list(itertools.product([0.0, 0.7, 1.3], [0, 1, 50], [1.0, 0.9, 0.5], [0.0, 0.05]))
    n_req = len(grid) * 2 // streams
    rows = n_req * streams
    scores = torch.randn(rows, vocab, generator=g) * 3
    scores[::5, vocab - 2] = float("-inf")  # a forced-away stream token
    scores[1::7, : vocab - 2] = float("-inf")  # a forced stream token: one finite score
    n_slots = n_req + 3
    slots = torch.randperm(n_slots, generator=g)[:n_req]
    params = [grid[(i * 2) % len(grid)] for i in range(n_req)]
    tables = {name: torch.zeros(n_slots, dtype=torch.int64 if name == "top_k" else torch.float32)
              for name in ("temperature", "top_k", "top_p", "min_p")}
    for j, name in enumerate(("temperature", "top_k", "top_p", "min_p")):
        tables[name][slots] = torch.tensor([c[j] for c in params], dtype=tables[name].dtype)
    tables["seed"] = torch.randint(0, 2**31, (n_slots,), generator=g) + torch.tensor([0, 2**40] * n_slots)[:n_slots]
    steps = torch.randint(0, 500, (n_req,), generator=g)
    # ties: integer scores, so many tokens share the k-th value (all of them are kept);
    # top-p off there, since at a tie it keeps every tied copy (see fused_draw)
    ties = n_req // 3
    scores[-ties * streams:] = torch.randint(-4, 5, (ties * streams, vocab), generator=g).float()
    tables["top_p"][slots[-ties:]] = 1.0
    return scores, slots, steps, tables, torch.full((n_slots, streams, 512), -1, dtype=torch.int64)


def _case(g: torch.Generator, streams: int, vocab: int, fused_draw_rows, draw_rows) -> bool:
    scores, slots, steps, tables, hist_want = _inputs(g, streams, vocab)
    hist_got = hist_want.clone()
    n_req, rows = len(slots), scores.shape[0]
    want_tok, want_lp = draw_rows(scores, slots, steps, tables, streams, hist_want)
    got_tok, got_lp = fused_draw_rows(scores, slots, steps, tables, streams, hist_got)
    bad = (want_tok != got_tok).nonzero()[:, 0].tolist()
    lp_err = (want_lp - got_lp).abs().max().item()
    same_history = torch.equal(hist_want, hist_got) and int((hist_got >= 0).sum()) == rows
    print(f"{n_req} requests x {streams} rows of {vocab}: {len(bad)} tokens differ {bad[:5]}, "
          f"max logprob difference {lp_err:.2e}, history {'same' if same_history else 'DIFFERS'}")
    return not bad and lp_err < 1e-5 and same_history


def _subset_case(g: torch.Generator, vocab: int, parts: list[int], fused_draw_rows, draw_rows) -> bool:
    """Eight streams a request drawn as the sub-steps `parts` (stream counts, in order) against one full draw."""
    streams = 8
    scores, slots, steps, tables, hist_full = _inputs(g, streams, vocab)
    keep = torch.tensor([0, len(slots) - 1])  # two requests (the interpreter is slow), the second with ties
    scores = scores.view(len(slots), streams, vocab)[keep].reshape(-1, vocab)
    slots, steps = slots[keep], steps[keep]
    full_tok, full_lp = fused_draw_rows(scores, slots, steps, tables, streams, hist_full)
    by_req = scores.view(len(slots), streams, vocab)
    hist_sub, hist_ref = hist_full.new_full(hist_full.shape, -1), hist_full.new_full(hist_full.shape, -1)
    toks, lps, ref_toks, ref_lps = [], [], [], []
    first = 0
    for n in parts:
        sub = by_req[:, first: first + n].reshape(-1, vocab)
        tok, lp = fused_draw_rows(sub, slots, steps, tables, n, hist_sub, first, streams)
        ref_tok, ref_lp = draw_rows(sub, slots, steps, tables, n, hist_ref, first, streams)
        toks.append(tok.view(-1, n))
        lps.append(lp.view(-1, n))
        ref_toks.append(ref_tok.view(-1, n))
        ref_lps.append(ref_lp.view(-1, n))
        first += n
    got_tok, got_lp = torch.cat(toks, 1).reshape(-1), torch.cat(lps, 1).reshape(-1)
    same = torch.equal(got_tok, full_tok) and torch.equal(got_lp, full_lp) and torch.equal(hist_sub, hist_full)
    ref_tok, ref_lp = torch.cat(ref_toks, 1).reshape(-1), torch.cat(ref_lps, 1).reshape(-1)
    lp_err = (ref_lp - got_lp).abs().max().item()
    as_pytorch = torch.equal(ref_tok, got_tok) and lp_err < 1e-5 and torch.equal(hist_ref, hist_sub)
    print(f"{len(slots)} requests x sub-steps {parts} of {vocab}: {'same as' if same else 'DIFFERS from'} the full "
          f"draw; {'same as' if as_pytorch else 'DIFFERS from'} the PyTorch subsets (logprobs within {lp_err:.2e})")
    return same and as_pytorch


def main() -> int:
    _patch_interpreter_scalars()
    from omni_cli.runners.sampling.fused_draw import fused_draw_rows
    from omni_cli.runners.sampling.ops import draw_rows

    g = torch.Generator().manual_seed(0)
    # the Higgs codebook (1024 codes, stream BOS, EOS): a 1024-lane block and a 2-lane one; a power
    # of two (the second block one masked lane); a short row whose two blocks are 32 and 8 lanes
    cases = [(1, 1026), (8, 1026), (8, 1024), (1, 37)]
    ok = [_case(g, streams, vocab, fused_draw_rows, draw_rows) for streams, vocab in cases]
    # sub-steps: one stream at a time; uneven groups
    ok += [_subset_case(g, vocab, parts, fused_draw_rows, draw_rows) for vocab, parts in
           [(37, [1] * 8), (1026, [3, 1, 4])]]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
