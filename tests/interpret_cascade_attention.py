"""Cascade decode attention (runners/cascade_attention.py) in Triton's CPU interpreter, its two ways of
joining the parts (BESIDE), against float64 attention over each row's own keys and against the per-row
kernel without a cascade.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1. A paged cache of
16-position blocks in a shuffled order: 18 rows share a 9-block prompt (two tiles of one group),
3 rows another 8-block one, a row shares only 4 blocks with the first group (under the plan's
minimum: no first part), a row shares nothing. The plan is built from the tables and the blocks'
rows' prompt blocks as the engine builds it.
"""

from __future__ import annotations

import sys

import torch

from tests.interpret_decode_attention import (_patch_interpreter_calls, _patch_interpreter_dot,
                                              _patch_interpreter_scalars)

BS = 16


def cache(g: torch.Generator, kvh: int, d: int):
    """Block tables of the rows described above, their lengths, and k/v blocks with garbage in the
    scratch block (the last) -> (kb, vb, table [S, width] int32, slots, lengths)."""
    prefixes = {"a": list(range(9)), "b": list(range(9, 17))}  # shared blocks of the two prompts
    nxt = 17
    rows: list[list[int]] = []
    kinds = ["a"] * 18 + ["b"] * 3 + ["a4", "none"]
    lengths = []
    for kind in kinds:
        own = int(torch.randint(1, 70, (1,), generator=g))
        head = prefixes["a"][:4] if kind == "a4" else prefixes.get(kind, [])
        n = len(head) * BS + own
        fresh = -(-n // BS) - len(head)
        rows.append(head + list(range(nxt, nxt + fresh)))
        nxt += fresh
        lengths.append(n)
    order = torch.randperm(nxt, generator=g)  # block ids shuffled in memory
    width = max(len(r) for r in rows) + 1
    slots_n = len(rows) + 1
    table = torch.full((slots_n, width), nxt, dtype=torch.int32)  # scratch past a row's blocks
    slot_of = torch.randperm(len(rows), generator=g)  # rows in slots out of order
    for i, r in enumerate(rows):
        table[slot_of[i], : len(r)] = order[torch.tensor(r)].to(torch.int32)
    kb = torch.randn(nxt + 1, kvh, BS, d, generator=g)
    vb = torch.randn(nxt + 1, kvh, BS, d, generator=g)
    kb[-1], vb[-1] = 1e4, float("nan")
    return kb, vb, table, slot_of, torch.tensor(lengths), [len(x) for x in rows]


def reference(q, kb, vb, table, slots, lengths):
    """float64 attention of each row over its own keys, read through its table. q [B, H, 1, D]."""
    b, h, _, d = q.shape
    rep = h // kb.shape[1]
    out = torch.empty(b, h, 1, d, dtype=torch.float64)
    for i in range(b):
        n = int(lengths[i])
        blocks = table[slots[i], : -(-n // BS)].long()
        k = kb[blocks].transpose(0, 1).reshape(kb.shape[1], -1, d)[:, :n].double().repeat_interleave(rep, 0)
        v = vb[blocks].transpose(0, 1).reshape(vb.shape[1], -1, d)[:, :n].double().repeat_interleave(rep, 0)
        out[i] = torch.softmax(q[i].double() @ k.transpose(-1, -2) * d ** -0.5, -1) @ v
    return out


def check(d: int) -> list[str]:
    import omni_cli.runners.cascade_attention as ca
    from omni_cli.runners.kv_blocks import cascade_plan
    from omni_cli.runners.decode_attention import decode_attention

    g = torch.Generator().manual_seed(d)
    kvh, h = 2, 6
    kb, vb, table, slots, lengths, prompt_blocks = cache(g, kvh, d)
    b = len(slots)
    q = torch.randn(b, 1, h, d, generator=g).transpose(1, 2)  # the model's [B, H, 1, D] view
    p = cascade_plan(table.numpy(), slots.tolist(), prompt_blocks, BS)  # every block of a row as its prompt's
    failures = []
    if p is None:
        return ["no plan for rows that share 9 and 8 blocks"]
    want_shared = [9 * BS] * 18 + [8 * BS] * 3 + [0, 0]
    if p.shared.tolist() != want_shared:
        failures.append(f"plan's shared positions {p.shared.tolist()}, expected {want_shared}")
    if sorted(p.tile_len.tolist()) != [8 * BS, 9 * BS, 9 * BS]:
        failures.append(f"tiles {p.tile_len.tolist()}: expected two of the first group, one of the second")
    plain = decode_attention(q, kb, vb, table, slots, lengths)
    with torch.inference_mode():  # rows outside a group must not read them (the engine's are inference tensors)
        for part in ca._PARTIALS.values():
            for t in part:
                t.fill_(float("nan"))
    got = decode_attention(q, kb, vb, table, slots, lengths, cascade=ca.to_device(p, q.device))
    err = (got.double() - reference(q, kb, vb, table, slots, lengths)).abs().max().item()
    if not err < 1e-5:
        failures.append(f"max abs error {err} against the float64 reference")
    if not torch.allclose(got, plain, atol=1e-5, rtol=0):
        failures.append("differs from the per-row kernel beyond float32 rounding")
    if not torch.equal(got[-2:], plain[-2:]):
        failures.append("rows outside any group differ from the per-row kernel's bits")
    return failures


def check_engine() -> list[str]:
    """The fused Higgs decode step through the engine's padded (uncaptured) graph path: five rows, four
    sharing 9 blocks of random keys, one step with the cascade plan and one without on copies of one
    cache -> the same logits to float32 rounding; the plan is copied into the graph's buffers once."""
    import copy
    import dataclasses

    import omni_cli.runners.attention as attention
    import omni_cli.runners.cascade_attention as ca
    import omni_cli.runners.cuda_graphs as cuda_graphs
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine, ForwardBatch
    from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
    from omni_cli.runners.higgs_audio_v2.shapes import shape_config
    from omni_cli.runners.kv_blocks import cascade_plan

    cfg = dataclasses.replace(shape_config("tiny-higgs-audio-v2"), hidden_size=64, intermediate_size=96,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=16)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = HiggsAudioV2LM(cfg, 176).eval()  # rope tables for the rows of 150-170 positions
    attention.fused_kernels_available = cuda_graphs.fused_kernels_available = lambda device: True
    model.to_runtime(cpu, torch.float32)
    tables = [list(range(9)) + [10 + 2 * i, 11 + 2 * i] for i in range(4)] + [list(range(30, 41))]
    kv = KVCache.paged(cfg.num_hidden_layers, 6, cfg.num_key_value_heads, 176, cfg.head_dim, torch.float32, cpu,
                       num_blocks=48, block_size=BS)
    kv.assign([3, 0, 4, 1, 2], tables)
    g = torch.Generator().manual_seed(3)
    kv.k_gpu.normal_(generator=g)
    kv.v_gpu.normal_(generator=g)
    slots = [3, 0, 4, 1, 2]
    lens = [150, 161, 170, 146, 170]
    plan = cascade_plan(kv.table_host, slots, [9, 9, 9, 9, 10], BS)
    failures = [] if plan is not None and plan.shared.tolist() == [9 * BS] * 4 + [0] else [f"plan {plan}"]
    codes = torch.randint(0, cfg.codebook_size, (5, 1, cfg.num_codebooks), generator=g)
    logits = []
    for cascade in (None, plan, plan):
        e = Engine(model, copy.deepcopy(kv), cpu)
        e.use_graphs(capture=False)
        fb = ForwardBatch(is_prefill=False, rids=list("abcde"), slots_gpu=torch.tensor(slots), lengths_cpu=lens,
                          steps_cpu=[1] * 5, steps_gpu=torch.ones(5, dtype=torch.int64),
                          positions_gpu=torch.tensor(lens)[:, None] - 1, model_inputs={"audio_codes": codes},
                          cascade_cpu=cascade)
        with torch.inference_mode():  # the engine's own tensors are inference tensors
            for part in ca._PARTIALS.values():
                for t in part:
                    t.fill_(float("nan"))
        logits.append(e.forward(fb))
        if cascade is not None:
            step = ca._PARTIALS.get((cpu, 8, cfg.num_attention_heads, cfg.head_dim, "group"))  # the 8-row bucket
            if step is None or not all(torch.isfinite(t[:4]).all() for t in step):
                failures.append("the step with a plan left the grouped rows' partials unwritten")
            st = next(iter(e.graphs._entries.values()))[0]
            if st["cascade"].shared_gpu[:5].tolist() != plan.shared.tolist():
                failures.append("the plan was not copied into the graph's buffers")
    worst = ((logits[1] - logits[0]).abs().max() / logits[0].abs().max()).item()
    if not worst < 1e-5:
        failures.append(f"engine step with the cascade: max relative logit difference {worst:.2e}")
    if not torch.equal(logits[1], logits[2]):
        failures.append("two engine steps with one plan differ")
    return failures


def main() -> int:
    _patch_interpreter_calls()
    _patch_interpreter_scalars()
    _patch_interpreter_dot()
    import omni_cli.runners.cascade_attention as ca

    failures = []
    for beside in (True, False):  # the parts joined by the merge kernel, or by the per-row kernel continuing
        ca.BESIDE = beside
        for d in (32, 8):  # tl.dot (head_dim >= 16) and the elementwise path for smaller heads
            failures += [f"beside={beside}, head_dim {d}: {f}" for f in check(d)]
        failures += [f"beside={beside}: {f}" for f in check_engine()]
    print("\n".join(failures) or "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
