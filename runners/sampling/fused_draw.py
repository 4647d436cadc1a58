"""The seeded draw of runners/sampling/ops.py as one Triton kernel per step (CUDA only).

``ops.draw`` is ~80 PyTorch kernels per step: temperature, two sorts for
top-k and top-p, softmaxes, a scatter, and the murmur3 hash as ~60 int64
elementwise passes over [rows, vocab], a large share of a small step even inside
its CUDA graph (BENCHMARKS.md). Here one program takes one row
(one codebook of one request) through the same steps in registers:
  temperature -> top-k (ties at the k-th value kept) -> top-p -> min-p
  -> log_softmax -> argmax(logprobs + Gumbel(murmur3(seed, position, token)))
with transformers' semantics, as in ops.apply_warpers, and the same hash
and float64 Gumbel noise as ops.gumbel_noise, so a seed draws the same
token. One difference, at exact ties only: top-p keeps every token whose
score equals the smallest kept score (the PyTorch path drops tied copies that
sort into the removed tail). Greedy rows (temperature 0) take the argmax of
the unwarped scores.

No sort: the top-k cut (the k-th largest score) and the top-p cut (the
largest score whose cumulative mass from below stays <= 1 - p) are found by
a bitwise search over the scores' order-preserving 32-bit keys: several times
faster than sorting the padded row, and faster again over the row as a
1024-lane block and a 2-lane one (``blocks``; BENCHMARKS.md). The two blocks'
sums are added in a different order than one block's, so a logprob may move
by an ulp. The top-k search takes TOP_K_DIGIT bits a step (the counts of
every next digit in one reduction: 32 / TOP_K_DIGIT serial block reductions);
the top-p search stays one masked float sum a bit, as several candidates'
masses summed in one [n, BLOCK] reduction may round differently on the GPU.

A row is latency-bound (one program, a chain of block reductions), so each
stage is a runtime branch that runs only where it can change the row: top-k
where k < vocab, top-p where p < 1, min-p where min_p > 0, and a greedy row
only its log_softmax and argmax. A row's results are those of running every
stage (tests/interpret_fused_draw.py checks them bit for bit against the
kernel that did).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# bits of the k-th key per top-k step (1: bit by bit); a global, so compiles naming the kernel's constexprs get it
TOP_K_DIGIT = tl.constexpr(2)


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
def _noisy(lp, cols, ok, seed, pos):
    """lp + Gumbel(murmur3(seed, pos, col)) in float64, -inf off the vocabulary."""
    h = _murmur3((seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32),
                 (pos & 0xFFFFFFFF).to(tl.uint32), cols.to(tl.uint32))
    log_u = tl.log(h.to(tl.float64) / 4294967295.0)
    log_u = tl.minimum(tl.maximum(log_u, -1.7976931348623157e308), -(2.0 ** -32))
    return tl.where(ok, lp.to(tl.float64) - tl.log(-log_u), float("-inf"))


@triton.jit
def _max2(a, b):
    # the max over both blocks of a row
    return tl.maximum(tl.max(a, 0), tl.max(b, 0))


@triton.jit
def _sum2(a, b):
    # the sum over both blocks of a row: a's block, then b's
    return tl.sum(a, 0) + tl.sum(b, 0)


@triton.jit
def _argmax2(a, b, offset_b: tl.constexpr):
    # argmax over [a, b] as one row: a's columns first, so a tie goes to a
    return tl.where(tl.max(a, 0) >= tl.max(b, 0), tl.argmax(a, 0), tl.argmax(b, 0) + offset_b)


@triton.jit
def _unkey(key):
    """The float32 whose _key is key."""
    return tl.where((key >> 31) != 0, key ^ 0x80000000, key ^ 0xFFFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _kth_key_bits(key_m, key_t, k):
    """The k-th largest key of the row, one bit a step: the largest K with at least k keys >= K."""
    kth_key = tl.zeros((), dtype=tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        cand = kth_key | (1 << bit)
        kth_key = tl.where(_sum2((key_m >= cand).to(tl.int32), (key_t >= cand).to(tl.int32)) >= k, cand, kth_key)
    return kth_key


@triton.jit
def _kth_key_digits(key_m, key_w, k, DIGIT: tl.constexpr):
    """_kth_key_bits, DIGIT bits a step: one [2**DIGIT, MAIN] count gives every next digit's count.
    key_w: the tail block's keys in a MAIN-wide block (0 past it), so one sum counts both blocks."""
    tl.static_assert(32 // DIGIT * DIGIT == 32)
    digits = tl.arange(0, 2**DIGIT).to(tl.uint32)
    kth_key = tl.zeros((), dtype=tl.uint32)
    for step in tl.static_range(32 // DIGIT):
        cand = kth_key | (digits << (32 - DIGIT * (step + 1)))
        n = tl.sum((key_m[None, :] >= cand[:, None]).to(tl.int32) + (key_w[None, :] >= cand[:, None]).to(tl.int32), 1)
        # counts fall as the digit grows and digit 0 always has k: the digit is how many of 1.. have k
        c = ((n >= k) & (digits > 0)).to(tl.uint32)
        for level in tl.static_range(DIGIT):  # added by splits in registers: tl.sum went through shared memory
            lo, hi = tl.split(tl.reshape(c, (2 ** (DIGIT - 1 - level), 2)))
            c = lo + hi
        kth_key = kth_key | (tl.reshape(c, ()) << (32 - DIGIT * (step + 1)))
    return kth_key


@triton.jit
def _draw_kernel(scores_ptr, slots_ptr, steps_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, tok_ptr,
                 lp_ptr, hist_ptr, hist_len, vocab, first, STREAMS: tl.constexpr, TOTAL: tl.constexpr,
                 MAIN: tl.constexpr, TAIL: tl.constexpr):
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
    # the tail block again at the main block's first lanes, so _kth_key_digits counts both in one sum
    s_w = tl.load(scores_ptr + row * vocab + MAIN + cm, mask=(cm < TAIL) & (MAIN + cm < vocab),
                  other=neg_inf).to(tl.float32)
    t = tl.load(temp_ptr + slot)
    greedy = t <= 0
    # each stage below is a runtime branch, skipped where it cannot change the row
    if greedy:
        # greedy: the argmax of the unwarped scores, whose logprob is under their log_softmax
        proc_m, proc_t = s_m, s_t
    else:
        z_m = s_m / t
        z_t = s_t / t
        # top-k: keep scores >= the k-th largest (ties at it kept), found over the scores'
        # order-preserving keys instead of a sort; a k covering the row keeps all of it
        k = tl.load(top_k_ptr + slot)
        k = tl.where(k > 0, tl.minimum(k, vocab), vocab)
        if k < vocab:
            if TOP_K_DIGIT == 1:
                kth_key = _kth_key_bits(_key(z_m), _key(z_t), k)
            else:
                kth_key = _kth_key_digits(_key(z_m), tl.where(cm < TAIL, _key(s_w / t), 0), k, TOP_K_DIGIT)
            # the k-th largest key is a score's: that score, compared as a value (-0 == +0, as in PyTorch)
            kth = _unkey(kth_key)
            z_m = tl.where(z_m < kth, neg_inf, z_m)
            z_t = tl.where(z_t < kth, neg_inf, z_t)
        # top-p on the top-k survivors: drop the low tail whose mass is <= 1 - p,
        # never the top token. The tail is every key <= T for the largest T whose
        # mass (probabilities of keys <= T) is <= 1 - p, found bit by bit from the top.
        p = tl.load(top_p_ptr + slot)
        if p < 1.0:
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
            z_m = tl.where((key_m <= tail_key) & (z_m < top), neg_inf, z_m)
            z_t = tl.where((key_t <= tail_key) & (z_t < top), neg_inf, z_t)
        # min-p: drop tokens below min_p times the top probability (none when min_p <= 0)
        mp = tl.load(min_p_ptr + slot)
        if mp > 0.0:
            top = _max2(z_m, z_t)
            e_m, e_t = tl.exp(z_m - top), tl.exp(z_t - top)
            e_top = _max2(e_m, e_t)
            z_m = tl.where(e_m < mp * e_top, neg_inf, z_m)
            z_t = tl.where(e_t < mp * e_top, neg_inf, z_t)
        proc_m, proc_t = z_m, z_t
    top = _max2(proc_m, proc_t)
    lse = top + tl.log(_sum2(tl.exp(proc_m - top), tl.exp(proc_t - top)))
    lp_m, lp_t = proc_m - lse, proc_t - lse
    if greedy:
        tok = _argmax2(proc_m, proc_t, MAIN)
    else:
        # the seeded draw: argmax(logprobs + Gumbel noise) in float64
        seed = tl.load(seed_ptr + slot)
        pos = step * TOTAL + stream  # the draw position, as sglang-omni's Higgs runner: the same in any subset
        tok = _argmax2(_noisy(lp_m, cm, ok_m, seed, pos), _noisy(lp_t, ct, ok_t, seed, pos), MAIN)
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(lp_ptr + row, _sum2(tl.where(cm == tok, lp_m, 0.0), tl.where(ct == tok, lp_t, 0.0)))
    tl.store(hist_ptr + (slot * TOTAL + stream) * hist_len + step, tok.to(tl.int64))


def blocks(vocab: int) -> tuple[int, int]:
    """A row's two blocks: the largest power of two within the vocabulary and a power of two for
    the rest (one masked lane when there is none). 1026 -> (1024, 2): one block of 2048 lanes
    had half of them padding."""
    main = 1 << (vocab.bit_length() - 1)
    return main, triton.next_power_of_2(max(vocab - main, 1))


def warps(rows: int) -> int:
    """Warps per row, by the rows of a call: 8 while they fit the SMs, fewer as they queue
    (the fastest at each size: BENCHMARKS.md). The warps set how a row's sums reduce, so a
    row's logprob (and, at a near-tie, its token) changes with them: batch-invariant draws
    take INVARIANT_WARPS at every size."""
    return 8 if rows <= 128 else 4 if rows <= 1024 else 2


INVARIANT_WARPS = 4  # deterministic mode's warps per row, whatever the call's rows


def fused_draw_rows(scores: torch.Tensor, slots: torch.Tensor, steps: torch.Tensor, tables: dict[str, torch.Tensor],
                    streams: int, history: torch.Tensor, first: int = 0,
                    total: int | None = None, invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """sampling.ops.draw_rows in one kernel (same arguments and results). A subset of a frame's
    streams runs at the warps of the whole frame's rows, so its sums round as the full draw's;
    invariant: at INVARIANT_WARPS, so a row's draw does not depend on the call's rows at all."""
    r, v = scores.shape
    total = streams if total is None else total
    tokens = torch.empty(r, dtype=torch.int64, device=scores.device)
    logprobs = torch.empty(r, dtype=torch.float32, device=scores.device)
    main, tail = blocks(v)
    _draw_kernel[(r,)](scores.contiguous(), slots, steps, tables["temperature"], tables["top_k"], tables["top_p"],
                       tables["min_p"], tables["seed"], tokens, logprobs, history, history.shape[-1], v, first,
                       STREAMS=streams, TOTAL=total, MAIN=main, TAIL=tail,
                       num_warps=INVARIANT_WARPS if invariant else warps(r // streams * total))
    return tokens, logprobs
