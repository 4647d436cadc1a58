"""Shared prompt prefixes through the paged cache's prefix cache (runners/kv_blocks.py,
runners/engine.py): rows admitted through a block pool take the blocks of a prefix that an earlier
row (of the same prefill, or of an earlier one) computes, and run only the rest of their prompts.

The oracle is the prefill that runs every prompt whole on the slot cache (itself held to
transformers by tests/test_parity_higgs.py, which also runs `omni generate` with sharing on):
logits, every row's keys and values, and the decode steps after it agree in float32, with rows of
different lengths (right padding).
"""

from __future__ import annotations

import pytest
import torch

from omni_cli.runners.attention import KVCache
from omni_cli.runners.checkpoint import load_into, read_safetensors
from omni_cli.runners.engine import Engine, ForwardBatch
from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from omni_cli.runners.kv_blocks import BlockPool
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from tests.conftest import TINY

BS = 4  # positions a block

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model():
    cfg = HiggsConfig.from_file(TINY / "model" / "config.json")
    m = HiggsAudioV2LM(cfg, 128)
    load_into(m, read_safetensors(TINY / "model"), TINY)
    return m.to_runtime(CPU, torch.float32)


def _prefill_batch(prompts: list[list[int]], slots: list[int]) -> ForwardBatch:
    """A prefill of these prompts (right-padded) into these slots, as build_forward_batch makes one."""
    t = max(len(p) for p in prompts)
    return ForwardBatch(is_prefill=True, rids=[str(s) for s in slots], slots_gpu=torch.tensor(slots),
                        lengths_cpu=[len(p) for p in prompts], steps_cpu=[0] * len(prompts),
                        steps_gpu=torch.zeros(len(prompts), dtype=torch.int64),
                        positions_gpu=torch.arange(t).expand(len(prompts), t),
                        model_inputs={"input_ids": torch.tensor([p + [0] * (t - len(p)) for p in prompts])},
                        prompts_cpu=prompts, slots_cpu=slots)


def _decode(engine: Engine, slots: list[int], lens: list[int], steps: int) -> list[torch.Tensor]:
    """`steps` decode steps of rows with these prompt lengths, the same random audio codes every call."""
    g = torch.Generator().manual_seed(1)
    outs = []
    for s in range(1, steps + 1):
        pos = [n + s - 1 for n in lens]
        fb = ForwardBatch(is_prefill=False, rids=[str(x) for x in slots], slots_gpu=torch.tensor(slots),
                          lengths_cpu=[p + 1 for p in pos], steps_cpu=[s] * len(slots),
                          steps_gpu=torch.full((len(slots),), s), positions_gpu=torch.tensor(pos)[:, None],
                          model_inputs={"audio_codes": torch.randint(0, 1024, (len(slots), 1, 8), generator=g)})
        outs.append(engine.forward(fb))
    return outs


def _whole(model, prompts: list[list[int]], steps: int = 3):
    """The oracle: every prompt run whole on a slot cache, then decode steps -> (logits per forward, kv)."""
    cfg = model.cfg
    kv = KVCache(cfg.num_hidden_layers, len(prompts) + 1, cfg.num_key_value_heads, 128, cfg.head_dim,
                 torch.float32, CPU)
    engine = Engine(model, kv, CPU)
    slots = list(range(len(prompts)))
    outs = [engine.forward(_prefill_batch(prompts, slots))]
    return outs + _decode(engine, slots, [len(p) for p in prompts], steps), kv


class Paged:
    """A paged engine and the scheduler admitting through its pool; counts the tokens each forward ran."""

    def __init__(self, model, monkeypatch, rows: int = 8, blocks: int = 64):
        cfg = model.cfg
        self.pool = BlockPool(blocks, BS)
        self.kv = KVCache.paged(cfg.num_hidden_layers, rows + 1, cfg.num_key_value_heads, 128, cfg.head_dim,
                                torch.float32, CPU, num_blocks=blocks, block_size=BS)
        self.engine = Engine(model, self.kv, CPU, blocks=self.pool)
        self.sched = Scheduler(rows, 128, blocks=self.pool)
        self.widths: list[int] = []  # tokens a row, each prefill forward of the model
        forward = model.forward

        def counted(attn, **kw):
            if attn.is_prefill:
                self.widths.append(kw["input_ids"].shape[1])
            return forward(attn, **kw)

        monkeypatch.setattr(model, "forward", counted)

    def prefill(self, prompts: list[list[int]], tag: str, frames: int = 8) -> tuple[list[Request], torch.Tensor]:
        reqs = [Request(rid=f"{tag}{i}", prompt=p, params=SamplingParams(max_new_frames=frames), seed=0)
                for i, p in enumerate(prompts)]
        for r in reqs:
            self.sched.add(r)
        so = self.sched.schedule()
        assert so.is_prefill and so.requests == reqs
        return reqs, self.engine.forward(self.engine.build_forward_batch(so))

    def rows_kv(self, reqs: list[Request], n: list[int]):
        """Each row's keys and values at its first n positions, read through its block table."""
        slots = torch.tensor([r.slot for r in reqs])
        return [[t[i, :, : n[i]] for i in range(len(reqs))] for t in self.kv.gather(0, slots, max(n))]


def _random(g, n: int) -> list[int]:
    return torch.randint(0, 250, (n,), generator=g).tolist()


def test_rows_admitted_together_compute_a_shared_prefix_once(model, monkeypatch):
    """Four rows opening with the same 21 tokens, admitted in one prefill: the first runs its whole
    prompt, the other three reuse its 5 whole blocks (20 positions) and run from position 20, a phase
    later; logits, every row's keys and values and three decode steps agree with the whole prompts'."""
    g = torch.Generator().manual_seed(0)
    prefix = _random(g, 21)
    prompts = [prefix + _random(g, n) for n in (9, 1, 30, 4)]
    want, kv_whole = _whole(model, prompts)
    p = Paged(model, monkeypatch)
    reqs, logits = p.prefill(prompts, "r")
    assert [r.blocks.cached for r in reqs] == [0, 20, 20, 20]
    assert p.widths == [30, 51 - 20]  # the first row whole, then the others from position 20 (the longest: 51)
    assert all(r.blocks.table[:5] == reqs[0].blocks.table[:5] for r in reqs)
    got = [logits] + _decode(p.engine, [r.slot for r in reqs], [len(x) for x in prompts], 3)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    n = [len(x) + 3 for x in prompts]  # the prompt and the three decode steps' keys
    whole = [[t[0][i, :, : n[i]] for i in range(4)] for t in (kv_whole.k_gpu, kv_whole.v_gpu)]
    for ours, theirs in zip(p.rows_kv(reqs, n), whole):
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert p.pool.stats.reused_positions == 60 and p.pool.stats.prefilled_positions == sum(map(len, prompts)) - 60


def test_rows_reusing_prefixes_of_two_depths_run_one_forward_a_start(model, monkeypatch):
    """A system prompt and two voices after it, admitted in one prefill: row A computes the system
    prompt and voice X, row B reuses A's system blocks and computes voice Y, rows C and D reuse
    A's and B's voices. Three forwards, by first uncached position (C and D together, though
    their voices come from different rows), and logits, keys and values as the whole prompts'."""
    g = torch.Generator().manual_seed(5)
    system, vx, vy = _random(g, 9), _random(g, 12), _random(g, 12)
    prompts = [system + vx + _random(g, 5), system + vy + _random(g, 3), system + vx + _random(g, 7),
               system + vy + _random(g, 2)]
    want, kv_whole = _whole(model, prompts, 0)
    p = Paged(model, monkeypatch)
    reqs, logits = p.prefill(prompts, "r")
    assert [r.blocks.cached for r in reqs] == [0, 8, 20, 20]
    assert p.widths == [26, 24 - 8, 28 - 20]
    torch.testing.assert_close(logits, want[0], atol=1e-5, rtol=1e-5)
    n = [len(x) for x in prompts]
    whole = [[t[0][i, :, : n[i]] for i in range(4)] for t in (kv_whole.k_gpu, kv_whole.v_gpu)]
    for ours, theirs in zip(p.rows_kv(reqs, n), whole):
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_later_prefill_reuses_the_cached_blocks_after_their_rows_finished(model, monkeypatch):
    """Rows of a second prefill, admitted after every row of the first has finished, take the cached
    blocks of the prefix (their only holder is the cache) and run only their own tokens; a prompt
    that shares nothing runs whole; the shared blocks go back to the pool with their last row."""
    g = torch.Generator().manual_seed(4)
    prefix = _random(g, 21)
    first, second = [prefix + _random(g, n) for n in (5, 9)], [prefix + _random(g, n) for n in (3, 7)]
    other = [_random(g, 30)]
    p = Paged(model, monkeypatch, blocks=40)
    reqs, _ = p.prefill(first, "a")
    for r in reqs:
        p.sched.finish(r, "stop")
    assert p.pool.free_blocks == 40  # every block free again (the prefix's five kept as cache)
    p.widths.clear()
    reqs, logits = p.prefill(second, "b")
    assert [r.blocks.cached for r in reqs] == [20, 20] and p.widths == [len(second[1]) - 20]
    torch.testing.assert_close(logits, _whole(model, second, 0)[0][0], atol=1e-5, rtol=1e-5)
    shared = reqs[0].blocks.table[:5]
    p.sched.finish(reqs[0], "stop")
    assert all(p.pool.refs[b] == 1 for b in shared)  # the second row still holds them
    p.widths.clear()
    lone, logits = p.prefill(other, "c")
    assert lone[0].blocks.cached == 0 and p.widths == [30]
    torch.testing.assert_close(logits, _whole(model, other, 0)[0][0], atol=1e-5, rtol=1e-5)
    p.sched.finish(reqs[1], "stop")
    assert all(p.pool.refs[b] == 0 for b in shared)  # freed with their last row (and still cached)


def test_cached_attention_after_a_prefix_is_causal_to_the_last_key():
    """attend_cached_causal (the fused prefill's attention) with P prefix keys in the cache:
    query j of a row is position P + j and sees keys 0..P + j, against float64 attention over
    keys repeated per query head, with slots out of order."""
    from omni_cli.runners.attention import AttentionContext

    g = torch.Generator().manual_seed(3)
    b, h, kvh, d, p, t = 3, 6, 2, 16, 5, 7
    kv = KVCache(1, 4, kvh, 32, d, torch.float32, CPU)
    kv.k_gpu.copy_(torch.randn(kv.k_gpu.shape, generator=g))
    kv.v_gpu.copy_(torch.randn(kv.v_gpu.shape, generator=g))
    slots = torch.tensor([2, 0, 3])
    ctx = AttentionContext(kv=kv, is_prefill=True, slots_gpu=slots, positions_gpu=torch.arange(p, p + t).expand(b, t),
                           mask_gpu=None, kv_len=p + t, prefix_len=p)
    q = torch.randn(b, h, t, d, generator=g)
    k = kv.k_gpu[0][slots, :, : p + t].repeat_interleave(h // kvh, 1).double()
    v = kv.v_gpu[0][slots, :, : p + t].repeat_interleave(h // kvh, 1).double()
    s = (q.double() @ k.transpose(-1, -2)) * d ** -0.5
    seen = torch.arange(p + t)[None, :] <= torch.arange(p, p + t)[:, None]  # [T, P + T]
    want = torch.softmax(s.masked_fill(~seen, float("-inf")), -1) @ v
    torch.testing.assert_close(ctx.attend_cached_causal(0, q).double(), want, atol=1e-5, rtol=1e-5)
