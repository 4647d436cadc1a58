"""Shared logit processing and the seeded draw.

Oracles: transformers' logits processors, the mmh3 package, and statistics
(a chi-square goodness-of-fit test against the filtered target distribution).
"""

from __future__ import annotations

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
