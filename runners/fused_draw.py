"""The seeded draw of runners/sampling.py as one Triton kernel per step (CUDA only).

``sampling.draw`` is ~80 PyTorch kernels per step: temperature, two sorts for
top-k and top-p, softmaxes, a scatter, and the murmur3 hash as ~60 int64
elementwise passes over [rows, vocab]. Inside the step's CUDA graph they cost
~0.4 ms at batch 1 and grow with the batch. Here one program takes one row
(one codebook of one request) through the same steps in registers:
  temperature -> top-k (ties at the k-th value kept) -> top-p -> min-p
  -> log_softmax -> argmax(logprobs + Gumbel(murmur3(seed, position, token)))
with transformers' semantics, as in sampling.apply_warpers, and the same hash
and float64 Gumbel noise as sampling.gumbel_noise, so a seed draws the same
token. One difference, at exact ties only: top-p keeps every token whose
score equals the smallest kept score (the PyTorch path drops tied copies that
sort into the removed tail). Greedy rows (temperature 0) take the argmax of
the unwarped scores.

No sort: the top-k cut (the k-th largest score) and the top-p cut (the
largest score whose cumulative mass from below stays <= 1 - p) are found by
a bitwise search over the scores' order-preserving 32-bit keys, 32 counts or
masked sums over the row each. Two sorts of the padded row (2048) made this
kernel 0.12 / 0.34 / 1.0 ms of a step at batch 1 / 64 / 256 on the H200;
the search takes 0.03 / 0.03 / 0.13 ms (benchmarks/draw_probe.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix(h, k):
    k = _rotl(k * 0xCC9E2D51, 15) * 0x1B873593
    return _rotl(h ^ k, 13) * 5 + 0xE6546B64


@triton.jit
def _murmur3(seed_lo, seed_hi, pos, cols):
    """MurmurHash3 x86_32, seed 0, of 4 little-endian uint32 words; cols [BLOCK] uint32."""
    h = _mix(tl.zeros_like(cols), seed_lo + tl.zeros_like(cols))
    h = _mix(h, seed_hi + tl.zeros_like(cols))
    h = _mix(h, pos + tl.zeros_like(cols))
    h = _mix(h, cols)
    h = h ^ 16
    h = (h ^ (h >> 16)) * 0x85EBCA6B
    h = (h ^ (h >> 13)) * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _key(z):
    """float32 -> uint32 whose unsigned order is the floats' order (-0 sorts just below +0)."""
    b = z.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _draw_kernel(scores_ptr, slots_ptr, steps_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, tok_ptr,
                 lp_ptr, hist_ptr, hist_len, vocab, STREAMS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    # row = request * STREAMS + stream; the request's parameters live in per-slot tables
    slot = tl.load(slots_ptr + row // STREAMS)
    step = tl.load(steps_ptr + row // STREAMS)
    stream = row % STREAMS
    cols = tl.arange(0, BLOCK)
    ok = cols < vocab
    neg_inf = float("-inf")
    s = tl.load(scores_ptr + row * vocab + cols, mask=ok, other=neg_inf).to(tl.float32)  # [BLOCK]
    t = tl.load(temp_ptr + slot)
    greedy = t <= 0
    z = s / tl.where(greedy, 1.0, t)
    # top-k: keep scores >= the k-th largest. The k-th largest key is found bit
    # by bit from the top (the largest K with at least k keys >= K): 32 counts
    # over the row instead of a sort, which was most of this kernel's time.
    k = tl.load(top_k_ptr + slot)
    k = tl.where(k > 0, tl.minimum(k, vocab), vocab)
    key = _key(z)
    kth_key = tl.zeros((), dtype=tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        cand = kth_key | (1 << bit)
        kth_key = tl.where(tl.sum((key >= cand).to(tl.int32), 0) >= k, cand, kth_key)
    kth = tl.max(tl.where(key == kth_key, z, neg_inf), 0)  # compared as a value: -0 == +0, as in PyTorch
    z = tl.where(z < kth, neg_inf, z)
    # top-p on the top-k survivors: drop the low tail whose mass is <= 1 - p,
    # never the top token. The tail is every key <= T for the largest T whose
    # mass (probabilities of keys <= T) is <= 1 - p, found bit by bit as above.
    p = tl.load(top_p_ptr + slot)
    top = tl.max(z, 0)
    e = tl.exp(z - top)
    prob = e / tl.sum(e, 0)
    key = _key(z)
    tail_key = tl.zeros((), dtype=tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        cand = tail_key | (1 << bit)
        mass = tl.sum(tl.where(key <= cand, prob, 0.0), 0)
        tail_key = tl.where(mass <= 1 - p, cand, tail_key)
    drop = (key <= tail_key) & (z < top)
    z = tl.where(p < 1.0, tl.where(drop, neg_inf, z), z)
    # min-p: drop tokens below min_p times the top probability
    mp = tl.load(min_p_ptr + slot)
    e2 = tl.exp(z - tl.max(z, 0))
    z = tl.where(e2 < mp * tl.max(e2, 0), neg_inf, z)
    proc = tl.where(greedy, s, z)
    lse = tl.max(proc, 0) + tl.log(tl.sum(tl.exp(proc - tl.max(proc, 0)), 0))
    lp = proc - lse
    # the seeded draw: argmax(logprobs + Gumbel noise) in float64
    seed = tl.load(seed_ptr + slot)
    pos = step * STREAMS + stream  # the draw position, as sglang-omni's Higgs runner
    h = _murmur3((seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32),
                 (pos & 0xFFFFFFFF).to(tl.uint32), cols.to(tl.uint32))
    log_u = tl.log(h.to(tl.float64) / 4294967295.0)
    log_u = tl.minimum(tl.maximum(log_u, -1.7976931348623157e308), -(2.0 ** -32))
    noisy = tl.where(ok, lp.to(tl.float64) - tl.log(-log_u), float("-inf"))
    tok = tl.where(greedy, tl.argmax(proc, 0), tl.argmax(noisy, 0))
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(lp_ptr + row, tl.sum(tl.where(cols == tok, lp, 0.0), 0))
    tl.store(hist_ptr + (slot * STREAMS + stream) * hist_len + step, tok.to(tl.int64))


def fused_draw_rows(scores: torch.Tensor, slots: torch.Tensor, steps: torch.Tensor, tables: dict[str, torch.Tensor],
                    streams: int, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sampling.draw_rows in one kernel (same arguments and results)."""
    r, v = scores.shape
    tokens = torch.empty(r, dtype=torch.int64, device=scores.device)
    logprobs = torch.empty(r, dtype=torch.float32, device=scores.device)
    # 8 warps while there are fewer rows than SMs: 20.6 against 28.2 us at 8 rows,
    # 35.2 against 32.1 at 512 (benchmarks/draw_probe.py, H200)
    _draw_kernel[(r,)](scores.contiguous(), slots, steps, tables["temperature"], tables["top_k"], tables["top_p"],
                       tables["min_p"], tables["seed"], tokens, logprobs, history, history.shape[-1], v,
                       STREAMS=streams, BLOCK=triton.next_power_of_2(v), num_warps=8 if r <= 128 else 4)
    return tokens, logprobs
