"""A prefill's shared prompt prefix, run once and copied into every row's slot (runners/engine.py).

The oracle is the prefill that runs every prompt whole (itself held to
transformers by tests/test_parity_higgs.py, which also runs `omni generate`
with sharing on): logits, every row's keys and values, and the decode steps
after it agree in float32, with rows of different lengths (right padding) in
slots out of order.
"""

from __future__ import annotations

import pytest
import torch

from omni_cli.runners import engine as engine_mod
from omni_cli.runners.attention import KVCache
from omni_cli.runners.checkpoint import load_into, read_safetensors
from omni_cli.runners.engine import Engine, ForwardBatch, shared_prefix
from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from tests.conftest import TINY

CPU = torch.device("cpu")


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5]]) == 3
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4, 5]]) == 2  # the shorter prompt keeps its last token
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix([[7, 2], [1, 2]]) == 0
    assert shared_prefix([[1], [1]]) == 0
    assert shared_prefix([[1, 2, 9], [1, 2, 9], [1, 3, 9]]) == 1


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


def _run(model, prompts: list[list[int]], slots: list[int], min_saved: int, monkeypatch):
    """Prefill then three decode steps through a fresh engine -> (logits per forward, kv)."""
    monkeypatch.setattr(engine_mod, "PREFIX_MIN_SAVED_TOKENS", min_saved)
    cfg = model.cfg
    kv = KVCache(cfg.num_hidden_layers, 8, cfg.num_key_value_heads, 128, cfg.head_dim, torch.float32, CPU)
    engine = Engine(model, kv, CPU)
    lens = [len(p) for p in prompts]
    fb = _prefill_batch(prompts, slots)
    outs = [engine.forward(fb)]
    g = torch.Generator().manual_seed(1)
    for s in range(1, 4):
        pos = [n + s - 1 for n in lens]
        fb = ForwardBatch(is_prefill=False, rids=fb.rids, slots_gpu=torch.tensor(slots), lengths_cpu=[p + 1 for p in pos],
                          steps_cpu=[s] * len(prompts), steps_gpu=torch.full((len(prompts),), s),
                          positions_gpu=torch.tensor(pos)[:, None],
                          model_inputs={"audio_codes": torch.randint(0, 1024, (len(prompts), 1, 8), generator=g)})
        outs.append(engine.forward(fb))
    return outs, kv


def test_shared_prefix_prefill_computes_what_the_whole_prompts_do(model, monkeypatch):
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 250, (21,), generator=g).tolist()
    prompts = [prefix + torch.randint(0, 250, (n,), generator=g).tolist() for n in (9, 1, 30, 4)]
    slots = [5, 0, 6, 2]
    assert shared_prefix(prompts) == 21
    shared, kv_shared = _run(model, prompts, slots, 1, monkeypatch)
    whole, kv_whole = _run(model, prompts, slots, 10 ** 9, monkeypatch)
    for a, b in zip(shared, whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for row, slot in enumerate(slots):
        n = len(prompts[row]) + 3  # the prompt and the three decode steps' keys
        for a, b in ((kv_shared.k_gpu, kv_whole.k_gpu), (kv_shared.v_gpu, kv_whole.v_gpu)):
            torch.testing.assert_close(a[:, slot, :, :n], b[:, slot, :, :n], atol=1e-5, rtol=1e-5)
    # the shared run wrote no slot that no row owns (the prefix went to the first row's slot)
    for other in set(range(8)) - set(slots):
        assert not kv_shared.k_gpu[:, other].any()


def test_small_savings_run_the_prompts_whole(model, monkeypatch):
    """Below PREFIX_MIN_SAVED_TOKENS the prefill is the unshared one, bit for bit."""
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 250, (10,), generator=g).tolist()
    prompts = [prefix + torch.randint(0, 250, (n,), generator=g).tolist() for n in (3, 5)]
    below, _ = _run(model, prompts, [1, 3], 11, monkeypatch)  # (2 - 1) x 10 tokens saved < 11
    whole, _ = _run(model, prompts, [1, 3], 10 ** 9, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(below, whole))


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


def _prefill(engine, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
    return engine.forward(_prefill_batch(prompts, slots))


def test_kept_prefix_serves_later_prefills_until_its_slot_is_rewritten(model, monkeypatch):
    """A later prefill whose prompts open with the kept prefix copies its keys (its forward
    runs only the rows' own tokens) and computes what the whole prompts do; once a prefill
    rewrites the kept prefix's slot, the next one does not read that slot's new keys."""
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, 250, (21,), generator=g).tolist()

    def prompts(*own):
        return [prefix + torch.randint(0, 250, (n,), generator=g).tolist() for n in own]

    first, second, third = prompts(5, 9), prompts(3, 7, 2), prompts(6, 4)
    other = [torch.randint(0, 250, (30,), generator=g).tolist()]  # shares nothing with the prefix
    cfg = model.cfg
    widths = []  # tokens a row each forward of the model ran
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda attn, **kw: widths.append(kw["input_ids"].shape[1]) or forward(attn, **kw))

    def engine():
        return Engine(model, KVCache(cfg.num_hidden_layers, 8, cfg.num_key_value_heads, 128, cfg.head_dim,
                                     torch.float32, CPU), CPU)

    def whole(batch, slots):  # the oracle: a fresh engine, nothing shared
        monkeypatch.setattr(engine_mod, "PREFIX_MIN_SAVED_TOKENS", 10 ** 9)
        out = _prefill(engine(), batch, slots)
        monkeypatch.setattr(engine_mod, "PREFIX_MIN_SAVED_TOKENS", 1)
        return out

    want = [whole(first, [5, 0]), whole(second, [2, 6, 4]), whole(third, [1, 3])]
    monkeypatch.setattr(engine_mod, "PREFIX_MIN_SAVED_TOKENS", 1)
    e = engine()
    widths.clear()
    got = _prefill(e, first, [5, 0])  # runs the prefix into slot 5, keeps it
    assert widths == [21, 9]  # the prefix alone, then the rows' own tokens (the longest has 9)
    torch.testing.assert_close(got, want[0], atol=1e-5, rtol=1e-5)
    widths.clear()
    got = _prefill(e, second, [2, 6, 4])
    assert widths == [7]  # the kept prefix copied: only the rows' own tokens ran
    torch.testing.assert_close(got, want[1], atol=1e-5, rtol=1e-5)
    _prefill(e, other, [5])  # a new request in the kept prefix's slot
    widths.clear()
    got = _prefill(e, third, [1, 3])
    assert widths == [21, 6]  # the prefix ran again (slot 5 no longer holds it)
    torch.testing.assert_close(got, want[2], atol=1e-5, rtol=1e-5)
