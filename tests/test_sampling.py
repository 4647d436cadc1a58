"""Shared logit processing and the seeded draw.

Oracles: transformers' logits processors, the mmh3 package, and statistics
(a chi-square goodness-of-fit test against the filtered target distribution).
"""

from __future__ import annotations

import hashlib
import math
import random
import struct

import mmh3
import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omni_cli.runners.sampling.ops import (
    apply_repetition_penalty,
    apply_suppress_tokens,
    apply_warpers,
    draw,
    murmur3_32,
    ras_replace_mask,
    seeded_uniform,
)


def test_murmur3_matches_mmh3():
    rng = random.Random(0)
    edge = [0, 1, 2**31 - 1, 2**31, 2**32 - 1]
    words = [tuple(rng.getrandbits(32) for _ in range(4)) for _ in range(500)]
    words += [(a, b, c, d) for a in edge for b in edge[:2] for c in edge for d in edge[:3]]
    got = murmur3_32([torch.tensor([w[i] for w in words]) for i in range(4)])
    want = [mmh3.hash(struct.pack("<4I", *w), 0, signed=False) for w in words]
    assert got.tolist() == want


def test_uniform_is_hash_over_seed_position_column():
    seeds = torch.tensor([0, 7, 2**31 - 1])
    pos = torch.tensor([0, 123, 4000])
    u = seeded_uniform(seeds, pos, 5)
    for i in range(3):
        for col in range(5):
            key = struct.pack("<4I", int(seeds[i]) & 0xFFFFFFFF, int(seeds[i]) >> 32, int(pos[i]), col)
            assert u[i, col].item() == mmh3.hash(key, 0, signed=False) / (2**32 - 1)


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(0)
    scores = torch.randn(6, 50) * 3
    history = torch.randint(0, 50, (6, 9))
    history[2, 4:] = -1  # padding
    history[3] = -1
    history[4, :] = 0  # token 0 repeated must not race the padding's column 0
    for penalty in (1.3, 0.7):
        got = apply_repetition_penalty(scores, history, torch.full((6,), penalty))
        for row in range(6):
            h = history[row][history[row] >= 0]
            want = scores[row: row + 1] if h.numel() == 0 else \
                RepetitionPenaltyLogitsProcessor(penalty)(h[None], scores[row: row + 1].clone())
            torch.testing.assert_close(got[row: row + 1], want)


def test_suppress_tokens():
    scores = torch.zeros(2, 5)
    mask = torch.tensor([[False, True, False, False, True], [False] * 5])
    out = apply_suppress_tokens(scores, mask)
    assert torch.isinf(out[0, [1, 4]]).all() and torch.isfinite(out[0, [0, 2, 3]]).all()
    assert torch.isfinite(out[1]).all()


def test_warpers_match_transformers_chain():
    torch.manual_seed(1)
    scores = torch.randn(6, 40) * 2
    scores[0, :10] = 1.0  # ties at the k-th value are kept
    temps, ks, ps, mps = [0.7, 1.0, 1.5, 1.0, 0.9, 1.2], [5, 0, 12, 40, 3, 0], [1.0, 0.8, 0.5, 0.95, 0.3, 1.0], \
        [0.0, 0.0, 0.1, 0.05, 0.0, 0.3]
    got = apply_warpers(scores, torch.tensor(temps), torch.tensor(ks), torch.tensor(ps), torch.tensor(mps))
    for i in range(6):
        want = TemperatureLogitsWarper(temps[i])(None, scores[i: i + 1].clone())
        if ks[i]:
            want = TopKLogitsWarper(ks[i])(None, want)
        if ps[i] < 1.0:
            want = TopPLogitsWarper(ps[i])(None, want)
        if mps[i] > 0:
            want = MinPLogitsWarper(mps[i])(None, want)
        torch.testing.assert_close(got[i: i + 1], want)


def test_greedy_rows_ignore_warpers_and_report_logprob():
    torch.manual_seed(2)
    scores = torch.randn(3, 30)
    tokens, lp = draw(scores, torch.zeros(3), torch.tensor([1, 1, 1]), torch.tensor([0.1] * 3), torch.zeros(3),
                      torch.arange(3), torch.zeros(3, dtype=torch.int64))
    assert tokens.tolist() == scores.argmax(-1).tolist()
    torch.testing.assert_close(lp, scores.log_softmax(-1).gather(1, tokens[:, None])[:, 0])


# fixed logits over a small vocabulary; each case is (top_k, top_p, min_p)
LOGITS = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0, -2.0])
CASES = {"plain": (0, 1.0, 0.0), "top_k": (4, 1.0, 0.0), "top_p": (0, 0.7, 0.0), "min_p": (0, 1.0, 0.3)}


def _draws(case: str, n_seeds: int = 4000, n_pos: int = 5, temperature: float = 1.3):
    top_k, top_p, min_p = CASES[case]
    r = n_seeds * n_pos
    seeds = torch.arange(n_seeds).repeat_interleave(n_pos) * 7919 + 13  # many seeds ...
    positions = torch.arange(n_pos).repeat(n_seeds) * 8 + 3  # ... and positions
    rows = LOGITS.expand(r, -1)
    tokens, lp = draw(rows, torch.full((r,), temperature), torch.full((r,), top_k), torch.full((r,), top_p),
                      torch.full((r,), min_p), seeds, positions)
    target = apply_warpers(LOGITS[None], torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]),
                           torch.tensor([min_p]))[0].softmax(-1)
    return tokens, lp, target


@pytest.mark.parametrize("case", list(CASES))
def test_draw_distribution_chi_square(case):
    """The seeded Gumbel draw samples the filtered distribution (sglang-omni #1239 got this wrong)."""
    tokens, _, target = _draws(case)
    support = target > 0
    counts = torch.bincount(tokens, minlength=len(LOGITS)).double()
    t64 = target[support].double()
    expected = t64 / t64.sum() * counts[support].sum()
    stat, p = chisquare(counts[support].numpy(), expected.numpy())
    assert p > 1e-3, (case, counts.tolist(), expected.tolist())


@pytest.mark.parametrize("case", list(CASES))
def test_filters_are_exact(case):
    """No token outside top-k / top-p / min-p is ever drawn; logprobs are the filtered ones."""
    tokens, lp, target = _draws(case)
    allowed = set(torch.nonzero(target > 0)[:, 0].tolist())
    assert set(tokens.unique().tolist()) <= allowed
    if case != "plain":
        assert len(allowed) < len(LOGITS)
    torch.testing.assert_close(lp, target.log()[tokens].float())


def test_suppressed_tokens_never_drawn():
    r = 3000
    rows = apply_suppress_tokens(LOGITS.expand(r, -1).clone(), (torch.arange(10) % 3 == 0).expand(r, -1))
    tokens, _ = draw(rows, torch.ones(r), torch.zeros(r, dtype=torch.int64), torch.ones(r), torch.zeros(r),
                     torch.arange(r), torch.zeros(r, dtype=torch.int64))
    assert not (tokens % 3 == 0).any()
    assert len(tokens.unique()) == 6


def test_draws_do_not_depend_on_batch_mates():
    rows = LOGITS.expand(4, -1)
    one = lambda s, p: draw(rows[:1], torch.ones(1), torch.zeros(1, dtype=torch.int64), torch.ones(1),  # noqa: E731
                            torch.zeros(1), torch.tensor([s]), torch.tensor([p]))[0].item()
    batch, _ = draw(rows, torch.ones(4), torch.zeros(4, dtype=torch.int64), torch.ones(4), torch.zeros(4),
                    torch.tensor([5, 6, 7, 8]), torch.tensor([0, 9, 2, 100]))
    assert batch.tolist() == [one(5, 0), one(6, 9), one(7, 2), one(8, 100)]


def test_ras_counts_repeats_like_transformers():
    """A constructed repeat: the window holds code 7 twice in stream 0, once in stream 1.

    transformers' rule: count matches of the new draw in the last ras_win_len
    frames, ignoring stream BOS/EOS entries, and redo the draw when the count
    reaches ras_win_max_num_repeat.
    """
    bos, eos = 8, 9
    excluded = torch.zeros(10, dtype=torch.bool)
    excluded[[bos, eos]] = True
    window = torch.tensor([[7, 3, 7, bos], [7, 1, 2, 3], [eos, eos, eos, 5], [4, 4, 4, 4]])
    valid = torch.tensor([[True] * 4, [True] * 4, [True] * 4, [False, False, True, True]])  # row 3: 2 frames exist
    tokens = torch.tensor([7, 7, eos, 4])
    got = ras_replace_mask(window, valid, tokens, excluded, torch.tensor([2, 2, 1, 3]))
    # row 0: 7 twice >= 2; row 1: once < 2; row 2: EOS never counted; row 3: only 2 valid 4s < 3
    assert got.tolist() == [True, False, False, False]


def test_ras_redraws_exactly_the_repeated_codes(tmp_path):
    """End to end against a greedy run: up to the first frame where RAS changed
    something the runs agree; at that frame, exactly the streams whose greedy
    code already occurred in their last ras_win_len frames (BOS/EOS aside) were
    redrawn, each from the unprocessed distribution."""
    from tests.conftest import run_cli, write_jsonl

    win, limit = 10, 1
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "repeat repeat repeat"}])
    outs = {}
    for name, extra in (("off", []), ("on", ["--ras-win-len", str(win), "--ras-win-max-num-repeat", str(limit)])):
        res = run_cli("generate", prompts, "-o", tmp_path / name, "-q", "--temperature", "0", "--seed", "1",
                      "--max-new-frames", "80", "--raw-logprobs", *extra)
        assert res.exit_code == 0, res.output
        outs[name] = np.load(tmp_path / name / "logprobs/a.npz")
    off, on = outs["off"]["tokens"], outs["on"]["tokens"]
    n = min(len(off), len(on))
    differs = np.flatnonzero((off[:n] != on[:n]).any(axis=1))
    assert differs.size, "RAS never triggered on this prompt"
    t = differs[0]
    for c in range(off.shape[1]):
        past = off[max(0, t - win): t, c]
        repeated = int(((past == off[t, c]) & (past < 1024)).sum()) >= limit
        if not repeated:
            assert on[t, c] == off[t, c]
        elif on[t, c] != off[t, c]:
            # a redraw reports its logprob under the raw distribution
            assert outs["on"]["logprobs"][t, c] == outs["on"]["raw_logprobs"][t, c]
    assert any(on[t, c] != off[t, c] for c in range(off.shape[1]))


# ---- the Sampler: subset draws (an inner loop's sub-steps) and the draw position ----

def _sampler(requests, slots, streams, vocab, max_len=24, raw_logprobs=True):
    from omni_cli.runners.sampling.sampler import Sampler

    sampler = Sampler(8, streams, vocab, max_len, torch.device("cpu"), ras_excluded_tokens=(vocab - 1,),
                      raw_logprobs=raw_logprobs, fused=False)
    sampler.install(slots, requests)
    return sampler


def _partitioned(sampler, scores, logits, slots, steps, flags, parts):
    """Draw each row's streams as consecutive sub-steps of `parts` streams; concatenated [B, C] results."""
    out, first = [], 0
    for n in parts:
        out.append(sampler.sample(scores[:, first: first + n], logits[:, first: first + n], slots, steps, flags, first))
        first += n
    return [torch.cat([o[i] for o in out], dim=1) for i in range(3)]


@pytest.mark.parametrize("graphed", [False, True])
def test_partitioned_draw_equals_the_full_draw(graphed):
    """A frame drawn a few streams at a time, in any partition, gives one full draw's tokens,
    logprobs, raw logprobs and history, bit for bit, with penalties, suppress tokens, RAS and
    every warper mixed across rows."""
    from types import SimpleNamespace

    from omni_cli.runners.sampling.params import SamplingParams

    c, v = 8, 40
    g = torch.Generator().manual_seed(3)
    params = [SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, suppress_tokens=(0, 5, 9)),
              SamplingParams(top_p=0.8, min_p=0.05, repetition_penalty=0.8),
              SamplingParams(temperature=1.3, suppress_tokens=(1, 2, 3), ras_win_len=3),
              SamplingParams(ras_win_len=4, ras_win_max_num_repeat=1, top_k=12),
              SamplingParams(temperature=0.9, top_p=0.6, min_p=0.2, repetition_penalty=1.1)]
    requests = [SimpleNamespace(params=p, seed=s) for p, s in zip(params, [5, 17, 2**31 - 1, 0, 99, 2**40 + 3])]
    slots = torch.tensor([6, 0, 3, 8, 2, 5])
    steps = torch.tensor([7, 3, 12, 9, 5, 20])
    sampler = _sampler(requests, slots, c, v)
    for i, (s, t) in enumerate(zip(slots, steps)):  # earlier frames, some of them repeats of token 7
        sampler.history_gpu[s, :, :t] = torch.randint(0, 10 if i == 4 else v, (c, int(t)), generator=g)
    logits = torch.randn(6, c, v, generator=g) * 3
    scores = logits.clone()
    scores[::2, :, v - 1] = float("-inf")  # model masks, as a delay pattern's
    scores[4, :, 7] += 20.0  # row 4 draws 7, which its window holds: RAS redraws it
    flags = sampler.flags(requests, steps.tolist(), graphed)
    assert flags.penalty and flags.suppress and flags.ras_window == 4
    start = sampler.history_gpu.clone()
    full = sampler.sample(scores, logits, slots, steps, flags)
    full_history = sampler.history_gpu.clone()
    assert torch.equal(full_history[slots, :, steps], full.tokens)
    assert (full.tokens[4] != 7).any()
    for parts in ([1] * 8, [3, 5], [2, 2, 4], [5, 1, 2], [8]):
        sampler.history_gpu.copy_(start)
        tokens, logprobs, raw = _partitioned(sampler, scores, logits, slots, steps, flags, parts)
        assert torch.equal(tokens, full.tokens), parts
        assert torch.equal(logprobs, full.logprobs), parts
        assert torch.equal(raw, full.raw), parts
        assert torch.equal(sampler.history_gpu, full_history), parts


def _ras_seed(seed: int) -> int:
    # facts.md: BLAKE2b-64 of "namespace:seed", little-endian, masked to 31 bits
    digest = hashlib.blake2b(f"omni-cli-ras:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _oracle_token(seed: int, position: int, vocab: int) -> int:
    """The draw from a uniform distribution: the column whose uniform (the murmur3 hash) is the largest."""
    hashes = [mmh3.hash(struct.pack("<4I", seed & 0xFFFFFFFF, seed >> 32, position, col), 0, signed=False)
              for col in range(vocab)]
    return max(range(vocab), key=hashes.__getitem__)


def test_subset_draw_position_is_frame_times_streams_plus_stream():
    """Stream c of frame t is drawn at position t * num_streams + c (its absolute index), whichever
    sub-step draws it, and lands in the history at [slot, c, t]; a RAS redraw of it uses the RAS
    seed at the same position. Uniform scores make each draw the argmax of mmh3 over the columns."""
    from types import SimpleNamespace

    from omni_cli.runners.sampling.params import SamplingParams

    c, v = 4, 16
    seeds = [2**40 + 12345, 7]
    requests = [SimpleNamespace(params=SamplingParams(), seed=seeds[0]),
                SimpleNamespace(params=SamplingParams(ras_win_len=2, ras_win_max_num_repeat=1), seed=seeds[1])]
    slots, steps = torch.tensor([3, 1]), torch.tensor([5, 11])
    sampler = _sampler(requests, slots, c, v)
    draws = [[_oracle_token(s, int(t) * c + k, v) for k in range(c)] for s, t in zip(seeds, steps)]
    # row 1's previous frame holds its draws: RAS redraws every stream of it
    sampler.history_gpu[1, :, 10] = torch.tensor(draws[1])
    want = [draws[0], [_oracle_token(_ras_seed(seeds[1]), 11 * c + k, v) for k in range(c)]]
    # a sub-step's relative index, or its own count as the total, would draw other tokens
    assert draws[0] != [_oracle_token(seeds[0], 5 * 2 + k % 2, v) for k in range(c)]
    flags = sampler.flags(requests, steps.tolist())
    uniform = torch.zeros(2, c, v)
    got = [None] * c
    for first, n in ((2, 2), (0, 1), (1, 1)):  # streams 2-3, then 0, then 1
        drawn = sampler.sample(uniform[:, :n], uniform[:, :n], slots, steps, flags, first)
        for j in range(n):
            got[first + j] = drawn.tokens[:, j].tolist()
        torch.testing.assert_close(drawn.logprobs, torch.full((2, n), -math.log(v)))
    assert [[got[k][row] for k in range(c)] for row in range(2)] == want
    assert sampler.history_gpu[3, :, 5].tolist() == want[0] and sampler.history_gpu[1, :, 11].tolist() == want[1]
    written = sampler.history_gpu >= 0
    assert int(written.sum()) == 3 * c  # the two frames drawn, and row 1's previous frame
