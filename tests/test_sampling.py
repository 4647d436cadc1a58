"""Shared logit processing against transformers' processors, and the hash against mmh3."""

from __future__ import annotations

import random
import struct

import mmh3
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from runners.sampling import apply_repetition_penalty, apply_suppress_tokens, apply_warpers, draw, murmur3_32


def test_murmur3_matches_mmh3():
    rng = random.Random(0)
    edge = [0, 1, 2**31 - 1, 2**31, 2**32 - 1]
    words = [tuple(rng.getrandbits(32) for _ in range(4)) for _ in range(500)]
    words += [(a, b, c, d) for a in edge for b in edge[:2] for c in edge for d in edge[:3]]
    got = murmur3_32([torch.tensor([w[i] for w in words]) for i in range(4)])
    want = [mmh3.hash(struct.pack("<4I", *w), 0, signed=False) for w in words]
    assert got.tolist() == want


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(0)
    scores = torch.randn(6, 50) * 3
    history = torch.randint(0, 50, (6, 9))
    history[2, 4:] = -1  # padding
    history[3] = -1
    for penalty in (1.3, 0.7):
        got = apply_repetition_penalty(scores, history, torch.full((6,), penalty))
        for row in range(6):
            h = history[row][history[row] >= 0]
            want = scores[row : row + 1] if h.numel() == 0 else \
                RepetitionPenaltyLogitsProcessor(penalty)(h[None], scores[row : row + 1].clone())
            torch.testing.assert_close(got[row : row + 1], want)


def test_suppress_tokens():
    scores = torch.zeros(2, 5)
    mask = torch.tensor([[False, True, False, False, True], [False] * 5])
    out = apply_suppress_tokens(scores, mask)
    assert torch.isinf(out[0, [1, 4]]).all() and torch.isfinite(out[0, [0, 2, 3]]).all()
    assert torch.isfinite(out[1]).all()


def test_warpers_match_transformers_chain():
    torch.manual_seed(1)
    scores = torch.randn(5, 40) * 2
    scores[0, :10] = 1.0  # ties at the k-th value are kept
    temps, ks, ps = [0.7, 1.0, 1.5, 1.0, 0.9], [5, 0, 12, 40, 3], [1.0, 0.8, 0.5, 0.95, 0.3]
    got = apply_warpers(scores, torch.tensor(temps), torch.tensor(ks), torch.tensor(ps))
    for i in range(5):
        want = scores[i : i + 1].clone()
        want = TemperatureLogitsWarper(temps[i])(None, want)
        if ks[i]:
            want = TopKLogitsWarper(ks[i])(None, want)
        if ps[i] < 1.0:
            want = TopPLogitsWarper(ps[i])(None, want)
        torch.testing.assert_close(got[i : i + 1], want)


def test_greedy_rows_ignore_warpers_and_report_logprob():
    torch.manual_seed(2)
    scores = torch.randn(3, 30)
    tokens, lp = draw(scores, torch.zeros(3), torch.tensor([1, 1, 1]), torch.tensor([0.1] * 3),
                      torch.arange(3), torch.zeros(3, dtype=torch.int64))
    assert tokens.tolist() == scores.argmax(-1).tolist()
    torch.testing.assert_close(lp, scores.log_softmax(-1).gather(1, tokens[:, None])[:, 0])
