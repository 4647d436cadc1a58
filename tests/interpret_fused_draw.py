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
The previous kernel (_draw_kernel_before, every stage run on every row, top-k
a bit a step) is kept here as an oracle: on the same rows the kernel must give
its tokens, logprobs and history bit for bit.
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton
import triton.language as tl

from omni_cli.runners.sampling.fused_draw import _argmax2, _key, _max2, _noisy, _sum2
from tests.interpret_decode_attention import _patch_interpreter_calls, _patch_interpreter_scalars


@triton.jit
def _draw_kernel_before(scores_ptr, slots_ptr, steps_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr,
                        tok_ptr, lp_ptr, hist_ptr, hist_len, vocab, first, STREAMS: tl.constexpr, TOTAL: tl.constexpr,
                        MAIN: tl.constexpr, TAIL: tl.constexpr):
    """fused_draw._draw_kernel before its runtime branches and multi-bit top-k search, kept
    unchanged as the oracle the current kernel must match bit for bit."""
    row = tl.program_id(0).to(tl.int64)
    # row = request * STREAMS + j: stream first + j of the request's TOTAL; its parameters live in per-slot tables
    slot = tl.load(slots_ptr + row // STREAMS)
    step = tl.load(steps_ptr + row // STREAMS)
    stream = first + row % STREAMS
    # the row as two blocks, columns [0, MAIN) (_m) and [MAIN, MAIN + TAIL) (_t): every step
    # below runs on both, every reduction adds or compares the two blocks' results
    cm = tl.arange(0, MAIN)
    ct = MAIN + tl.arange(0, TAIL)
    ok_m = cm < vocab
    ok_t = ct < vocab
    neg_inf = float("-inf")
    s_m = tl.load(scores_ptr + row * vocab + cm, mask=ok_m, other=neg_inf).to(tl.float32)
    s_t = tl.load(scores_ptr + row * vocab + ct, mask=ok_t, other=neg_inf).to(tl.float32)
    t = tl.load(temp_ptr + slot)
    greedy = t <= 0
    z_m = s_m / tl.where(greedy, 1.0, t)
    z_t = s_t / tl.where(greedy, 1.0, t)
    # top-k: keep scores >= the k-th largest. The k-th largest key is found bit
    # by bit from the top (the largest K with at least k keys >= K): 32 counts
    # over the row instead of a sort, which was most of this kernel's time.
    k = tl.load(top_k_ptr + slot)
    k = tl.where(k > 0, tl.minimum(k, vocab), vocab)
    key_m, key_t = _key(z_m), _key(z_t)
    kth_key = tl.zeros((), dtype=tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        cand = kth_key | (1 << bit)
        kth_key = tl.where(_sum2((key_m >= cand).to(tl.int32), (key_t >= cand).to(tl.int32)) >= k, cand, kth_key)
    # compared as a value: -0 == +0, as in PyTorch
    kth = _max2(tl.where(key_m == kth_key, z_m, neg_inf), tl.where(key_t == kth_key, z_t, neg_inf))
    z_m = tl.where(z_m < kth, neg_inf, z_m)
    z_t = tl.where(z_t < kth, neg_inf, z_t)
    # top-p on the top-k survivors: drop the low tail whose mass is <= 1 - p,
    # never the top token. The tail is every key <= T for the largest T whose
    # mass (probabilities of keys <= T) is <= 1 - p, found bit by bit as above.
    p = tl.load(top_p_ptr + slot)
    top = _max2(z_m, z_t)
    e_m, e_t = tl.exp(z_m - top), tl.exp(z_t - top)
    total = _sum2(e_m, e_t)
    prob_m, prob_t = e_m / total, e_t / total
    key_m, key_t = _key(z_m), _key(z_t)
    tail_key = tl.zeros((), dtype=tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        cand = tail_key | (1 << bit)
        mass = _sum2(tl.where(key_m <= cand, prob_m, 0.0), tl.where(key_t <= cand, prob_t, 0.0))
        tail_key = tl.where(mass <= 1 - p, cand, tail_key)
    z_m = tl.where(p < 1.0, tl.where((key_m <= tail_key) & (z_m < top), neg_inf, z_m), z_m)
    z_t = tl.where(p < 1.0, tl.where((key_t <= tail_key) & (z_t < top), neg_inf, z_t), z_t)
    # min-p: drop tokens below min_p times the top probability
    mp = tl.load(min_p_ptr + slot)
    top = _max2(z_m, z_t)
    e_m, e_t = tl.exp(z_m - top), tl.exp(z_t - top)
    e_top = _max2(e_m, e_t)
    z_m = tl.where(e_m < mp * e_top, neg_inf, z_m)
    z_t = tl.where(e_t < mp * e_top, neg_inf, z_t)
    proc_m, proc_t = tl.where(greedy, s_m, z_m), tl.where(greedy, s_t, z_t)
    top = _max2(proc_m, proc_t)
    lse = top + tl.log(_sum2(tl.exp(proc_m - top), tl.exp(proc_t - top)))
    lp_m, lp_t = proc_m - lse, proc_t - lse
    # the seeded draw: argmax(logprobs + Gumbel noise) in float64
    seed = tl.load(seed_ptr + slot)
    pos = step * TOTAL + stream  # the draw position, as sglang-omni's Higgs runner: the same in any subset
    drawn = _argmax2(_noisy(lp_m, cm, ok_m, seed, pos), _noisy(lp_t, ct, ok_t, seed, pos), MAIN)
    tok = tl.where(greedy, _argmax2(proc_m, proc_t, MAIN), drawn)
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(lp_ptr + row, _sum2(tl.where(cm == tok, lp_m, 0.0), tl.where(ct == tok, lp_t, 0.0)))
    tl.store(hist_ptr + (slot * TOTAL + stream) * hist_len + step, tok.to(tl.int64))


def _fused_draw_rows_before(scores, slots, steps, tables, streams, history, first=0, total=None):
    """fused_draw.fused_draw_rows launching _draw_kernel_before."""
    from omni_cli.runners.sampling.fused_draw import blocks, warps

    r, v = scores.shape
    total = streams if total is None else total
    tokens = torch.empty(r, dtype=torch.int64)
    logprobs = torch.empty(r, dtype=torch.float32)
    main, tail = blocks(v)
    _draw_kernel_before[(r,)](scores.contiguous(), slots, steps, tables["temperature"], tables["top_k"],
                              tables["top_p"], tables["min_p"], tables["seed"], tokens, logprobs, history,
                              history.shape[-1], v, first, STREAMS=streams, TOTAL=total, MAIN=main, TAIL=tail,
                              num_warps=warps(r // streams * total))
    return tokens, logprobs


def _inputs(g: torch.Generator, streams: int, vocab: int):
    """Rows of requests of `streams` rows each; a request's parameters sit at a shuffled slot.
    Returns (scores [rows, vocab], slots, steps [n_req], tables, an empty history)."""
    # top_k 0 and one past every vocabulary here: no top-k cut
    grid = list(itertools.product([0.0, 0.7, 1.3], [0, 1, 50, 5000], [1.0, 0.9, 0.5], [0.0, 0.05]))
    n_req = 108 // streams
    rows = n_req * streams
    scores = torch.randn(rows, vocab, generator=g) * 3
    scores[::5, vocab - 2] = float("-inf")  # a forced-away stream token
    scores[1::7, : vocab - 2] = float("-inf")  # a forced stream token: one finite score
    n_slots = n_req + 3
    slots = torch.randperm(n_slots, generator=g)[:n_req]
    params = [grid[(i * 7) % len(grid)] for i in range(n_req)]  # a stride prime to the grid's size: all of it
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
    if streams > 1:  # four requests (the interpreter is slow): two plain, two with ties; one a stream covers the grid
        keep = torch.tensor([0, 1, len(slots) - 2, len(slots) - 1])
        scores = scores.view(len(slots), streams, vocab)[keep].reshape(-1, vocab)
        slots, steps = slots[keep], steps[keep]
    hist_got = hist_want.clone()
    n_req, rows = len(slots), scores.shape[0]
    hist_before = hist_want.clone()
    want_tok, want_lp = draw_rows(scores, slots, steps, tables, streams, hist_want)
    got_tok, got_lp = fused_draw_rows(scores, slots, steps, tables, streams, hist_got)
    bad = (want_tok != got_tok).nonzero()[:, 0].tolist()
    lp_err = (want_lp - got_lp).abs().max().item()
    same_history = torch.equal(hist_want, hist_got) and int((hist_got >= 0).sum()) == rows
    # the previous kernel on the same rows: the same tokens, logprobs and history, bit for bit (one
    # row a request: every parameter combination once)
    as_before = True
    if streams == 1:
        before_tok, before_lp = _fused_draw_rows_before(scores, slots, steps, tables, streams, hist_before)
        as_before = (torch.equal(before_tok, got_tok) and torch.equal(before_lp, got_lp)
                     and torch.equal(hist_before, hist_got))
    print(f"{n_req} requests x {streams} rows of {vocab}: {len(bad)} tokens differ {bad[:5]}, "
          f"max logprob difference {lp_err:.2e}, history {'same' if same_history else 'DIFFERS'}"
          + ("" if streams != 1 else f"; {'same as' if as_before else 'DIFFERS from'} the previous kernel"))
    return not bad and lp_err < 1e-5 and same_history and as_before


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
    _patch_interpreter_calls()
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
