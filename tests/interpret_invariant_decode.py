"""Deterministic decode's batch-invariant kernels, in Triton's CPU interpreter: a row's logits
are the same bits at every batch size from 1 to 8, and a batch-dependent kernel is caught.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1; exits 0 only if
every row matched and both negative controls were caught.
One random tiny model (head_dim 16: tl.dot needs 16) on the fused path in deterministic mode,
float32: eight prompts of different lengths, prefilled and then decoded for a few steps with
codes that depend only on (row, step), each step in groups of a different size (2..8). Every
row's logits of every step must equal, bit for bit, its logits when it ran alone. The oracle is the row's own
one-row run: the property is invariance, whatever the values are.
Negative controls, each of which must make rows differ: the projections' reduction step
following the row count (in the interpreter a tile's sum is numpy's, so the step changes the
rounding, as cuBLAS's split-K does on the GPU; the GPU's tensor cores add in k order whatever
the step: benchmarks/invariant_mm.py), and the attention's key block following the row count
(as the default mode's row-bucket tile does).
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from tests.interpret_decode_attention import (_patch_interpreter_calls, _patch_interpreter_dot,
                                              _patch_interpreter_scalars)

LENS = [5, 9, 3, 12, 7, 4, 10, 6]
STEPS = 7  # decode steps: rows reach 10..19 keys, some past one 16-key block


def run(model, cfg, lens: list[int], steps: int, sizes) -> list[list[torch.Tensor]]:
    """Each row's logits at prefill and every decode step; at step s the rows run in groups of
    sizes[s] (prefill: step 0), so one pass covers many batch sizes."""
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine, FixedShapes, ForwardBatch

    cpu = torch.device("cpu")
    n = len(lens)
    kv = KVCache(cfg.num_hidden_layers, n + 1, cfg.num_key_value_heads, 64, cfg.head_dim, torch.float32, cpu)
    engine = Engine(model, kv, cpu, FixedShapes(decode_rows=None, prefill_rows=1, prefill_bucket=1))
    out: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for step in range(steps + 1):
        b = sizes[step]
        for first in range(0, n, b):
            rows = list(range(first, min(first + b, n)))
            if step == 0:
                t = max(lens[r] for r in rows)
                ids = torch.zeros(len(rows), t, dtype=torch.int64)
                for j, r in enumerate(rows):
                    ids[j, :lens[r]] = torch.randint(0, cfg.audio_bos_token_id - 16, (lens[r],),
                                                     generator=torch.Generator().manual_seed(r))
                fb = dict(is_prefill=True, lengths_cpu=[lens[r] for r in rows],
                          positions_gpu=torch.arange(t).expand(len(rows), t), model_inputs={"input_ids": ids})
            else:
                pos = [lens[r] + step - 1 for r in rows]
                codes = torch.stack([torch.randint(0, cfg.codebook_size, (1, cfg.num_codebooks),
                                                   generator=torch.Generator().manual_seed(1000 * r + step))
                                     for r in rows])
                fb = dict(is_prefill=False, lengths_cpu=[p + 1 for p in pos],
                          positions_gpu=torch.tensor(pos)[:, None], model_inputs={"audio_codes": codes})
            logits = engine.forward(ForwardBatch(rids=[str(r) for r in rows], slots_gpu=torch.tensor(rows),
                                                 steps_cpu=[step] * len(rows),
                                                 steps_gpu=torch.full((len(rows),), step), **fb))
            for j, r in enumerate(rows):
                out[r].append(logits[j].clone())
    return out


def differing(got: list[list[torch.Tensor]], alone: list[list[torch.Tensor]]) -> int:
    """Rows whose logits at some step differ from their one-row run's."""
    return sum(any(not torch.equal(x, y) for x, y in zip(g, a)) for g, a in zip(got, alone, strict=True))


def main() -> int:
    _patch_interpreter_calls()
    _patch_interpreter_scalars()
    _patch_interpreter_dot()
    import omni_cli.runners.attention as attention
    import omni_cli.runners.cuda_graphs as cuda_graphs
    import omni_cli.runners.decode_attention as decode_attention
    import omni_cli.runners.invariant_mm as invariant_mm
    from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
    from omni_cli.runners.higgs_audio_v2.shapes import shape_config

    # a small head (64 codes a codebook): the interpreter runs program by program
    cfg = dataclasses.replace(shape_config("tiny-higgs-audio-v2"), hidden_size=64, intermediate_size=96,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=16, codebook_size=64)
    torch.manual_seed(0)
    model = HiggsAudioV2LM(cfg, 64).eval()
    attention.fused_kernels_available = cuda_graphs.fused_kernels_available = lambda device: True
    model.to_runtime(torch.device("cpu"), torch.float32)
    assert model.fused
    sizes = [8, 2, 3, 4, 5, 6, 7, 8]  # prefill, then each step's batch size: 2..8 all met
    found = differing(run(model, cfg, LENS, STEPS, sizes), run(model, cfg, LENS, STEPS, [1] * (STEPS + 1)))
    print(f"rows differing from their one-row run at batch sizes {sizes}: {found} of {len(LENS)}")

    shipped_pick, shipped_attention = invariant_mm.pick_tile, decode_attention.decode_attention
    shipped_tile = decode_attention.INVARIANT_TILE

    def step_follows_rows(m, kind, k):  # a batch-dependent reduction step (the shipped one at one row)
        bm, bn, bk, warps, stages, tma = shipped_pick(m, kind, k)
        return bm, bn, bk if m == 1 else min(16, k & -k), warps, stages, tma

    def block_follows_rows(q, *args, invariant=False):  # a batch-dependent key block (the shipped one at one row)
        decode_attention.INVARIANT_TILE = shipped_tile if q.shape[0] == 1 else (16, 4)
        return shipped_attention(q, *args, invariant=invariant)

    import omni_cli.runners.higgs_audio_v2.invariant_step as invariant_step

    lens, steps = [16, 12], 2  # the first row reaches 18 keys: past a 16-key block
    # both controls' kernels are the shipped ones at one row: the rows' one-row runs are these
    alone = run(model, cfg, lens, steps, [1] * (steps + 1))
    invariant_mm.pick_tile = step_follows_rows
    caught_mm = differing(run(model, cfg, lens, steps, [2] * (steps + 1)), alone)
    invariant_mm.pick_tile = shipped_pick
    invariant_step.decode_attention = block_follows_rows
    caught_attention = differing(run(model, cfg, lens, steps, [2] * (steps + 1)), alone)
    print(f"negative controls, rows differing at batch 2: reduction step {caught_mm}, key block {caught_attention}")
    return 0 if not found and caught_mm and caught_attention else 1


if __name__ == "__main__":
    sys.exit(main())
