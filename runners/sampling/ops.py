"""Shared logit processing and the seeded, sync-free draw.

Everything here is vectorised over rows (a row is one categorical
distribution: for Higgs, one codebook of one request) and runs on the device
with no host sync, so it can sit inside a CUDA graph.

The draw is sglang's ``multinomial_with_seed`` scheme: for row seed s,
position p and vocabulary column c,
    u = murmur3_x86_32(le32(s & 0xffffffff), le32(s >> 32), le32(p), le32(c); seed 0) / (2^32 - 1)
in float64, turned into Gumbel noise, and the token is argmax(logprobs + noise).
A draw therefore depends only on (seed, position, token), never on batch-mates.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_UINT32_MAX = float(2**32 - 1)


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2^32 for int64 a in [0, 2^32), without int64 overflow.

    The constant is split in 16-bit halves so no partial product reaches 2^63
    (signed overflow is not something to rely on across backends).
    """
    lo = a * (c & 0xFFFF)
    hi = ((a * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur3_32(words: list[torch.Tensor]) -> torch.Tensor:
    """MurmurHash3 x86_32, seed 0, of the little-endian bytes of uint32 words.

    ``words``: int64 tensors of values in [0, 2^32), all broadcastable together.
    Returns int64 hashes in [0, 2^32).
    """
    h = torch.zeros((), dtype=torch.int64, device=words[0].device)
    for k in words:
        k = _mul32(k, _C1)
        k = _rotl32(k, 15)
        k = _mul32(k, _C2)
        h = h ^ k
        h = _rotl32(h, 13)
        h = (_mul32(h, 5) + 0xE6546B64) & _M32
    h = h ^ (4 * len(words))
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R] int64 seeds, [R] int64 positions -> [R, vocab] float64 uniforms in [0, 1]."""
    cols = torch.arange(vocab, dtype=torch.int64, device=seeds.device)[None, :]
    s = seeds.to(torch.int64)[:, None]
    h = murmur3_32([s & _M32, (s >> 32) & _M32, positions.to(torch.int64)[:, None] & _M32, cols])
    return h.to(torch.float64) / _UINT32_MAX


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0,1) noise as sglang computes it: -log(-clamp(log u, max=-2^-32))."""
    log_u = seeded_uniform(seeds, positions, vocab).log()
    log_u = log_u.clamp(min=torch.finfo(torch.float64).min, max=-(2.0**-32))
    return -torch.log(-log_u)


def apply_repetition_penalty(scores: torch.Tensor, history: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Penalise every token in each row's history: positive logits / p, negative * p.

    scores [R, V] float; history [R, H] int64 token ids, -1 for padding; penalty [R].
    Matches transformers' RepetitionPenaltyLogitsProcessor (each distinct token once).
    """
    # scatter_add, not scatter: padding (-1 -> column 0) must not race a real token 0
    counts = torch.zeros_like(scores, dtype=torch.int32).scatter_add(
        1, history.clamp(min=0), (history >= 0).to(torch.int32)
    )
    seen = counts > 0
    p = penalty[:, None].to(scores.dtype)
    penalised = torch.where(scores < 0, scores * p, scores / p)
    return torch.where(seen, penalised, scores)


def ras_replace_mask(window: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor, excluded: torch.Tensor,
                     max_repeat: torch.Tensor) -> torch.Tensor:
    """Repetition-aware sampling, as transformers' Higgs ``_sample``: which draws to redo.

    window [R, W] the stream's previous tokens, valid [R, W] which of them exist,
    tokens [R] this step's draws, excluded [V] bool (tokens never counted: the
    stream BOS/EOS), max_repeat [R]. A draw is redone when it already occurs at
    least max_repeat times in the window.
    """
    counted = valid & ~excluded[window.clamp(min=0)]
    repeats = ((window == tokens[:, None]) & counted).sum(dim=-1)
    return repeats >= max_repeat


def apply_suppress_tokens(scores: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """token_mask [R, V] bool: True columns are set to -inf."""
    return scores.masked_fill(token_mask, float("-inf"))


def apply_warpers(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
    """Temperature, top-k, top-p, then min-p, per row, with transformers' semantics.

    scores [R, V] float32; temperature [R] (> 0); top_k [R] int64 (0 = off);
    top_p [R] (1 = off); min_p [R] (0 = off). Ties at the k-th value are kept,
    as TopKLogitsWarper does; top-p drops the low tail whose mass is <= 1 - p;
    min-p drops tokens whose probability is below min_p times the top one.
    Each filter always keeps the top token.
    """
    vocab = scores.shape[-1]
    scores = scores / temperature[:, None].to(scores.dtype)
    sorted_desc, _ = scores.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth = sorted_desc.gather(1, (k - 1)[:, None])
    scores = scores.masked_fill(scores < kth, float("-inf"))
    # top-p on the top-k-filtered scores, as the chained warpers do
    sorted_asc, order = scores.sort(dim=-1, descending=False)
    cum = sorted_asc.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - top_p[:, None].to(cum.dtype))
    remove_sorted[:, -1] = False
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    off = (top_p >= 1.0)[:, None]
    scores = scores.masked_fill(remove & ~off, float("-inf"))
    probs = scores.softmax(dim=-1)
    below = probs < min_p[:, None].to(probs.dtype) * probs.amax(dim=-1, keepdim=True)
    return scores.masked_fill(below, float("-inf"))  # the top token is never below its own share


def seeded_argmax(logprobs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A draw from softmax(logprobs) per row: argmax(logprobs + seeded Gumbel noise), in float64."""
    return (logprobs.double() + gumbel_noise(seeds, positions, logprobs.shape[-1])).argmax(dim=-1)


def draw(
    scores: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens [R] int64, logprobs [R] float32).

    Greedy rows (temperature 0) take the argmax of ``scores`` as they are, like
    ``generate(do_sample=False)``, which applies no warpers. Other rows are
    warped and drawn with seeded Gumbel noise. The logprob is that of the
    sampled token under the distribution it was drawn from.
    """
    greedy = temperature <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature)
    warped = apply_warpers(scores, safe_t, top_k, top_p, min_p)
    processed = torch.where(greedy[:, None], scores, warped)
    logprobs = processed.float().log_softmax(dim=-1)
    tokens = torch.where(greedy, processed.argmax(dim=-1), seeded_argmax(logprobs, seeds, positions))
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def draw_rows(scores: torch.Tensor, slots: torch.Tensor, steps: torch.Tensor, tables: dict[str, torch.Tensor],
              streams: int, history: torch.Tensor, first: int = 0,
              total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's draw: ``streams`` rows per request, each drawn as ``draw`` does.

    scores [B * streams, V], request-major; slots, steps [B] int64 (the frame each
    request samples); tables: per-slot parameters [S] ("temperature", "top_k",
    "top_p", "min_p", "seed"); history [S, total, H] int64. The rows are streams
    [first, first + streams) of a request's ``total`` (default: all of them, first
    0): row b * streams + j is stream c = first + j, drawn at position
    step * total + c, as sglang-omni's Higgs runner, and written to history at
    [slot, c, step]. So a frame drawn a few streams at a time (an inner loop's
    sub-steps) gives the tokens of one full draw. Returns (tokens, logprobs),
    [B * streams] each.
    """
    total = streams if total is None else total
    slot_rows = slots.repeat_interleave(streams)
    stream_ids = torch.arange(first, first + streams, device=steps.device)
    positions = (steps[:, None] * total + stream_ids[None, :]).reshape(-1)
    p = {name: tables[name][slot_rows] for name in ("temperature", "top_k", "top_p", "min_p", "seed")}
    tokens, logprobs = draw(scores, p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["seed"], positions)
    history[slots, first: first + streams, steps] = tokens.view(-1, streams)
    return tokens, logprobs
