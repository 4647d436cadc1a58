"""GPU tests of single kernels against a reference (the PyTorch path, float64, cuBLAS): skipped
where there is no CUDA device (CI), run on the device machine. The tests that run the model or
the command are in tests/test_gpu.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_fused_draw_matches_the_pytorch_draw_on_cuda():
    """The one-kernel draw against sampling.draw_rows at the real vocabulary, on CUDA: tokens,
    logprobs and the history it writes, with parameters read from per-slot tables."""
    import itertools

    import torch

    from omni_cli.runners.sampling.fused_draw import fused_draw_rows
    from omni_cli.runners.sampling.ops import draw_rows

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    grid = list(itertools.product([0.0, 0.7, 1.0, 1.3], [0, 1, 50], [1.0, 0.95, 0.5], [0.0, 0.05]))
    n_req, c = len(grid) * 3, 8
    scores = torch.randn(n_req * c, 1026, generator=g, device=dev) * 3
    scores[::5, 1024] = float("-inf")
    slots = torch.randperm(n_req + 5, generator=g, device=dev)[:n_req]
    tables = {}
    for j, name in enumerate(("temperature", "top_k", "top_p", "min_p")):
        tables[name] = torch.zeros(n_req + 5, dtype=torch.int64 if name == "top_k" else torch.float32, device=dev)
        tables[name][slots] = torch.tensor([grid[i % len(grid)][j] for i in range(n_req)], device=dev,
                                           dtype=tables[name].dtype)
    tables["seed"] = torch.randint(0, 2**31, (n_req + 5,), generator=g, device=dev) * 2**20
    steps = torch.randint(0, 1000, (n_req,), generator=g, device=dev)
    hist_want = torch.full((n_req + 5, c, 1024), -1, dtype=torch.int64, device=dev)
    hist_got = hist_want.clone()
    want_tok, want_lp = draw_rows(scores, slots, steps, tables, c, hist_want)
    got_tok, got_lp = fused_draw_rows(scores, slots, steps, tables, c, hist_got)
    assert torch.equal(got_tok, want_tok)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=0)
    assert torch.equal(hist_got, hist_want)


def test_fused_subset_draws_equal_the_full_draw_on_cuda():
    """The one-kernel draw, a frame drawn as sub-steps of its streams (streams [first, first + n)
    of eight, an inner loop's): the full draw's tokens, logprobs and history, bit for bit."""
    import torch

    from omni_cli.runners.sampling.fused_draw import fused_draw_rows

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    n_req, c, v = 40, 8, 1026
    scores = torch.randn(n_req, c, v, generator=g, device=dev) * 3
    slots = torch.randperm(n_req + 5, generator=g, device=dev)[:n_req]
    tables = {"temperature": torch.rand(n_req + 5, generator=g, device=dev) + 0.5,
              "top_k": torch.randint(0, 60, (n_req + 5,), generator=g, device=dev),
              "top_p": torch.rand(n_req + 5, generator=g, device=dev) * 0.5 + 0.5,
              "min_p": torch.rand(n_req + 5, generator=g, device=dev) * 0.1,
              "seed": torch.randint(0, 2**31, (n_req + 5,), generator=g, device=dev) * 2**20}
    steps = torch.randint(0, 1000, (n_req,), generator=g, device=dev)
    hist_full = torch.full((n_req + 5, c, 1024), -1, dtype=torch.int64, device=dev)
    full_tok, full_lp = fused_draw_rows(scores.view(-1, v), slots, steps, tables, c, hist_full)
    for parts in ([1] * 8, [3, 1, 4]):
        hist = torch.full_like(hist_full, -1)
        toks, lps, first = [], [], 0
        for n in parts:
            tok, lp = fused_draw_rows(scores[:, first: first + n].reshape(-1, v), slots, steps, tables, n, hist,
                                      first, c)
            toks.append(tok.view(n_req, n))
            lps.append(lp.view(n_req, n))
            first += n
        assert torch.equal(torch.cat(toks, 1).view(-1), full_tok)
        assert torch.equal(torch.cat(lps, 1).view(-1), full_lp)
        assert torch.equal(hist, hist_full)


def test_invariant_draw_gives_a_row_the_same_draw_in_any_call_on_cuda():
    """The one-kernel draw with invariant=True: a request's tokens and logprobs are the same bits
    in calls of 2, 17, 100 and 300 requests (across the row counts where the default draw changes
    its warps), and the default draw's logprobs do change there (the control: the test can see
    what it guards against)."""
    import torch

    from omni_cli.runners.sampling.fused_draw import fused_draw_rows

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(2)
    n_req, c, v = 300, 8, 1026
    scores = torch.randn(n_req, c, v, generator=g, device=dev) * 3
    slots = torch.arange(n_req, device=dev)
    tables = {"temperature": torch.rand(n_req, generator=g, device=dev) + 0.5,
              "top_k": torch.randint(0, 60, (n_req,), generator=g, device=dev),
              "top_p": torch.rand(n_req, generator=g, device=dev) * 0.5 + 0.5,
              "min_p": torch.zeros(n_req, device=dev),
              "seed": torch.randint(0, 2**31, (n_req,), generator=g, device=dev) * 2**20}
    steps = torch.randint(0, 1000, (n_req,), generator=g, device=dev)

    def draw(m, invariant):
        hist = torch.full((n_req, c, 1024), -1, dtype=torch.int64, device=dev)
        tok, lp = fused_draw_rows(scores[:m].reshape(-1, v), slots[:m], steps[:m], tables, c, hist, invariant=invariant)
        return tok[:2 * c], lp[:2 * c]  # the first two requests

    base = draw(2, True)
    for m in (17, 100, n_req):
        tok, lp = draw(m, True)
        assert torch.equal(tok, base[0]) and torch.equal(lp, base[1]), m
    assert any(not torch.equal(draw(m, False)[1], draw(2, False)[1]) for m in (17, n_req))

def test_rope_kv_write_rotates_within_bf16_rounding_and_writes_only_its_tokens_on_cuda():
    """rope_kv_write (one program a token, every head of it, padded to a power of two) at the 3B
    model's head counts against rope in float64 (q * cos + rotate_half(q) * sin over the float32
    tables): queries and keys within three bf16 roundings (the tables, each product, the sum; 2^-5
    holds them even rounded toward zero, as Triton's CPU interpreter does) of the terms' size,
    values as they are, each at its [slot, :, position]; nothing else in the
    cache changes."""
    import torch

    from omni_cli.runners.fused_ops import rope_kv_write

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    h, kvh, d, max_len, n_slots, n = 24, 8, 128, 64, 12, 301
    g = torch.Generator(device=dev).manual_seed(0)
    cos, sin = (torch.rand(max_len, d, generator=g, device=dev) * 2 - 1 for _ in range(2))
    qkv = torch.randn(n, (h + 2 * kvh) * d, generator=g, device=dev).to(bf16)
    idx = torch.randperm(n, generator=g, device=dev)
    slots, positions = idx % n_slots, idx // n_slots  # every (slot, position) once, out of order
    caches = [torch.randn(n_slots, kvh, max_len, d, generator=g, device=dev).to(bf16) for _ in range(2)]
    want_k, want_v = (c.clone() for c in caches)
    ident = torch.arange(n_slots, dtype=torch.int32, device=dev)[:, None]  # the slot cache's block table
    q = rope_kv_write(qkv, cos, sin, positions, slots, *caches, ident, h, kvh)

    x = qkv.view(n, h + 2 * kvh, d)
    xd, c, s = x[:, : h + kvh].double(), cos[positions].double()[:, None], sin[positions].double()[:, None]
    terms = (xd * c, torch.cat((-xd[..., d // 2:], xd[..., : d // 2]), -1) * s)
    exact, size = terms[0] + terms[1], terms[0].abs() + terms[1].abs()
    got_k = caches[0][slots, :, positions]
    for got, want, scale in ((q[:, :, 0], exact[:, :h], size[:, :h]), (got_k, exact[:, h:], size[:, h:])):
        assert bool(((got.double() - want).abs() <= scale * 2 ** -5).all())
    want_k[slots, :, positions] = got_k  # the written keys checked above: nothing else may differ
    want_v[slots, :, positions] = x[:, h + kvh:]
    assert torch.equal(caches[0], want_k)
    assert torch.equal(caches[1], want_v)


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_decode_attention_through_block_tables_gives_the_slot_caches_bits_on_cuda(rows):
    """The same keys as a slot cache and as shuffled blocks of 16 positions (a scratch block of
    garbage past every row's blocks), at the 3B head shape in bf16: the attention through the
    block tables equals the slot cache's bit for bit, at one row (split keys), a few rows, and
    64 (the multi-row kernel's other tile), with rows of lengths across block edges; and the
    invariant kernel (deterministic mode) the same."""
    import torch

    from omni_cli.runners.decode_attention import decode_attention
    from tests.interpret_decode_attention import paged

    dev, g = torch.device("cuda"), torch.Generator().manual_seed(rows)
    kvh, h, d, max_len, slots_n = 8, 24, 128, 700, rows + 1
    kc, vc = (torch.randn(slots_n, kvh, max_len, d, generator=g).to(torch.bfloat16) for _ in range(2))
    kb, vb, table = paged(kc.float(), vc.float(), 16, g)
    kb, vb, table = kb.to(torch.bfloat16).to(dev), vb.to(torch.bfloat16).to(dev), table.to(dev)
    kc, vc = kc.to(dev), vc.to(dev)
    ident = torch.arange(slots_n, dtype=torch.int32, device=dev)[:, None]
    slots = torch.randperm(slots_n, generator=g)[:rows].to(dev)
    lengths = torch.randint(1, max_len + 1, (rows,), generator=g)
    lengths[0] = 513 if rows == 1 else 17
    lengths = lengths.to(dev)
    q = torch.randn(rows, h, 1, d, generator=g).to(torch.bfloat16).to(dev)
    for invariant in (False, True):
        want = decode_attention(q, kc, vc, ident, slots, lengths, invariant=invariant)
        got = decode_attention(q, kb, vb, table, slots, lengths, invariant=invariant)
        assert torch.equal(got, want), (rows, invariant)


@pytest.mark.parametrize("beside", [True, False])
@pytest.mark.parametrize("rows", [64, 256])
def test_cascade_decode_attention_against_float64_on_cuda(rows, beside, monkeypatch):
    """Cascade attention (runners/cascade_attention.py), its parts joined beside (a side stream and the
    merge) or after, at the 3B head shape in bf16: rows in 4 groups
    sharing 256 positions of a voice (16 blocks) plus a few rows sharing nothing, each row with its own
    1 to 200 positions after; the plan built as the engine builds it. Every row within bf16 rounding of
    float64 attention over its own keys, as close as the per-row kernel is, and the rows outside any
    group bit for bit the per-row kernel's."""
    import numpy as np
    import torch

    import omni_cli.runners.cascade_attention as ca
    from omni_cli.runners.cascade_attention import to_device
    from omni_cli.runners.decode_attention import decode_attention
    from omni_cli.runners.kv_blocks import cascade_plan

    monkeypatch.setattr(ca, "BESIDE", beside)
    dev, g = torch.device("cuda"), torch.Generator().manual_seed(rows)
    kvh, h, d, bs = 8, 24, 128, 16
    own = torch.randint(1, 201, (rows,), generator=g).tolist()
    voice = [i % 4 if i < rows - 4 else None for i in range(rows)]  # the last 4 rows share nothing
    nxt, tables, lengths = 4 * 16, [], []
    for i in range(rows):
        head = list(range(voice[i] * 16, voice[i] * 16 + 16)) if voice[i] is not None else []
        n = len(head) * bs + own[i]
        fresh = -(-n // bs) - len(head)
        tables.append(head + list(range(nxt, nxt + fresh)))
        nxt += fresh
        lengths.append(n)
    width = max(map(len, tables))
    table = np.full((rows + 1, width), nxt, dtype=np.int32)
    slots = torch.randperm(rows, generator=g)
    for i, t in enumerate(tables):
        table[slots[i], : len(t)] = t
    kb, vb = (torch.randn(nxt + 1, kvh, bs, d, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(rows, h, 1, d, generator=g).to(torch.bfloat16)
    plan = cascade_plan(table, slots.tolist(), [len(t) for t in tables], bs)
    assert plan is not None and (plan.shared[: rows - 4] == 256).all() and not plan.shared[rows - 4:].any()
    args = [x.to(dev) for x in (q, kb, vb, torch.from_numpy(table), slots, torch.tensor(lengths))]
    plain = decode_attention(*args)
    got = decode_attention(*args, cascade=to_device(plan, dev))
    errs = []
    for out in (plain, got):
        worst = 0.0
        for i in range(rows):
            blocks = torch.from_numpy(table[int(slots[i]), : -(-lengths[i] // bs)]).long()
            k = kb[blocks].transpose(0, 1).reshape(kvh, -1, d)[:, : lengths[i]].double().repeat_interleave(3, 0)
            v = vb[blocks].transpose(0, 1).reshape(kvh, -1, d)[:, : lengths[i]].double().repeat_interleave(3, 0)
            want = torch.softmax(q[i].double() @ k.transpose(-1, -2) * d ** -0.5, -1) @ v  # [H, 1, D]
            worst = max(worst, float((out[i].cpu().double() - want).abs().max() / want.abs().max()))
        errs.append(worst)
    assert errs[1] < 2e-2 and errs[1] < 2 * errs[0] + 1e-3, errs  # bf16 outputs: a few ulps of the largest
    assert torch.equal(got[rows - 4:], plain[rows - 4:])


def test_one_row_decode_attention_on_cuda():
    """The one-row attention kernel (keys split over programs, merged by the last to finish,
    launched early) against float64 attention at the 3B head shape, in bf16. Twenty calls back to
    back per length, each with its own query: a merge that read another call's partials, or a
    count left behind, would mix two queries' results."""
    import torch

    from omni_cli.runners.decode_attention import decode_attention

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    kvh, h, d, max_len = 8, 24, 128, 2048
    kc, vc = (torch.randn(3, kvh, max_len, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(2))
    slot = torch.tensor([1], device=dev)
    ident = torch.arange(3, dtype=torch.int32, device=dev)[:, None]  # the slot cache's block table
    for n in (1, 64, 128, 129, 200, 513, 2000):  # whole rows, then 3, 4, 9 and 32 blocks split
        lengths = torch.tensor([n], device=dev)
        qs = [torch.randn(1, h, 1, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(20)]
        outs = [decode_attention(q, kc, vc, ident, slot, lengths) for q in qs]
        k = kc[1, :, :n].double().repeat_interleave(h // kvh, 0)  # [H, n, D]
        v = vc[1, :, :n].double().repeat_interleave(h // kvh, 0)
        for i, (q, out) in enumerate(zip(qs, outs)):
            want = torch.softmax(q[0].double() @ k.transpose(-1, -2) * d ** -0.5, -1) @ v  # [H, 1, D]
            err = float((out[0].double() - want).abs().max() / want.abs().max())
            assert err < 2e-2, (n, i, err)


def test_gate_up_kernel_is_as_close_to_exact_as_cublas_and_silu_mul_on_cuda():
    """fused_mm.mm (gate/up with silu * up) at the 3B shape in bf16 against float64 of the same
    inputs, at every row bucket it serves: its error is within the cuBLAS path's (F.linear, then
    silu_mul: the ops it replaces) plus one bf16 rounding. And a row's result does not depend on
    what the other rows of its call hold."""
    import torch
    import torch.nn.functional as F

    from omni_cli.runners.fused_mm import MAX_ROWS, mm
    from omni_cli.runners.fused_ops import silu_mul

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    n, k = 8192, 3072
    w = (torch.randn(2 * n, k, generator=g, device=dev) / k**0.5).to(torch.bfloat16)
    for m in (2, 8, 16, 33, MAX_ROWS):
        x = torch.randn(m, k, generator=g, device=dev).to(torch.bfloat16)
        xd, wd = x.double(), w.double()
        exact = F.silu(xd @ wd[:n].T) * (xd @ wd[n:].T)
        scale = exact.abs().max()
        got = mm(x, w, silu_mul=True)
        err = float((got.double() - exact).abs().max() / scale)
        err_cublas = float((silu_mul(F.linear(x, w)).double() - exact).abs().max() / scale)
        assert err <= err_cublas + 2**-8, (m, err, err_cublas)
        other = torch.randn(m, k, generator=g, device=dev).to(torch.bfloat16)
        other[0] = x[0]
        assert torch.equal(mm(other, w, silu_mul=True)[0], got[0]), m


def test_prefill_attention_reads_shared_kv_heads_as_repeated_ones():
    """attend_cached_causal (each KV head shared by its query heads inside the flash kernel)
    against causal SDPA over keys and values repeated per query head (repeat_kv, as
    transformers runs it), bit for bit, and against float64 attention."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from omni_cli.runners.attention import AttentionContext, KVCache

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    h, kvh, d = 24, 8, 128  # the 3B model's heads
    g = torch.Generator(device=dev).manual_seed(1)
    b, t = 6, 64
    kv = KVCache(1, b + 2, kvh, 512, d, bf16, dev)
    kv.k_gpu[0].copy_(torch.randn(kv.k_gpu[0].shape, generator=g, device=dev))
    kv.v_gpu[0].copy_(torch.randn(kv.v_gpu[0].shape, generator=g, device=dev))
    slots = torch.tensor([3, 0, 7, 1, 5, 2], device=dev)  # out of order, as admission leaves them
    ctx = AttentionContext(kv=kv, is_prefill=True, slots_gpu=slots,
                           positions_gpu=torch.arange(t, device=dev).expand(b, t), mask_gpu=None, kv_len=t)
    q = torch.randn(b, t, h, d, generator=g, device=dev).to(bf16).transpose(1, 2)  # [B, H, T, D], as the model's
    out = ctx.attend_cached_causal(0, q)

    k = kv.k_gpu[0][slots, :, :t].repeat_interleave(h // kvh, 1)  # [B, H, T, D]
    v = kv.v_gpu[0][slots, :, :t].repeat_interleave(h // kvh, 1)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the kernel attend_cached_causal takes on CUDA
        assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    s = (q.double() @ k.double().transpose(-1, -2)) * d ** -0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    want = torch.softmax(s, -1) @ v.double()
    assert float((out.double() - want).abs().max() / want.abs().max()) < 1e-2


@pytest.mark.parametrize("kind", ["qkv", "o_proj", "gate_up", "down", "head"])
def test_invariant_projections_give_a_row_the_same_bits_in_any_call_on_cuda(kind):
    """invariant_mm (qkv, o_proj and down: its k-range partials, summed; o_proj's and down's into
    the residual by add_rmsnorm) at the 3B shapes in bf16, at row counts across every tile bucket: each row's
    result equals, bit for bit, the same row's in a 256-row call and in a call whose other rows
    hold other values; and its error against float64 is within cuBLAS's (the op it replaces)
    plus one bf16 rounding. The oracle of the first is the kernel's own wider call: the property
    is invariance; cuBLAS itself fails it for o_proj and down (BENCHMARKS.md)."""
    import torch
    import torch.nn.functional as F

    from omni_cli.runners.fused_ops import add_rmsnorm, silu_mul
    from omni_cli.runners.invariant_mm import SPLITS, invariant_mm, invariant_mm_parts

    n, k = {"qkv": (5120, 3072), "o_proj": (3072, 3072), "gate_up": (8192, 3072), "down": (3072, 8192),
            "head": (8208, 3072)}[kind]
    silu, residual = kind == "gate_up", kind in ("o_proj", "down")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    w = (torch.randn((2 if silu else 1) * n, k, generator=g, device=dev) / k**0.5).to(torch.bfloat16)
    x = torch.randn(256, k, generator=g, device=dev).to(torch.bfloat16)
    res = torch.randn(256, n, generator=g, device=dev).to(torch.bfloat16)
    out_dtype = torch.float32 if kind == "head" else None

    ones = torch.ones(n, device=dev, dtype=torch.bfloat16)

    def call(xm, rm):
        if kind not in SPLITS:
            return invariant_mm(xm, w, silu_mul=silu, out_dtype=out_dtype, kind=kind)
        parts = invariant_mm_parts(xm, w, kind=kind)  # k-range partials, summed by the next kernel
        if residual:  # o_proj and down: into the residual, by add_rmsnorm
            return add_rmsnorm(rm, parts, ones, 1e-6, parts=True)[0]
        return sum(parts.unbind(0)).to(torch.bfloat16)  # qkv: rope_kv_write's sum, in index order

    full = call(x, res)
    for m in (1, 2, 15, 16, 17, 31, 33, 64, 65, 100, 128, 200):
        got = call(x[:m], res[:m])
        assert torch.equal(got, full[:m]), (kind, m)
        other, other_res = torch.randn_like(x[:m]), torch.randn_like(res[:m])
        other[-1], other_res[-1] = x[m - 1], res[m - 1]
        assert torch.equal(call(other, other_res)[-1], got[-1]), (kind, m)
    xd, wd = x.double(), w.double()
    exact = F.silu(xd @ wd[:n].T) * (xd @ wd[n:].T) if silu else xd @ wd.T + (res.double() if residual else 0)
    cublas = silu_mul(F.linear(x, w)) if silu else F.linear(x, w) + (res if residual else 0)
    scale = exact.abs().max()
    err = float((full.double() - exact).abs().max() / scale)
    err_cublas = float((cublas.double() - exact).abs().max() / scale)
    assert err <= err_cublas + 2**-8, (kind, err, err_cublas)
