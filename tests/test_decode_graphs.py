"""DecodeGraphs' cascade twins (runners/cuda_graphs.py), on the CPU with the graph builder stubbed: which
graphs a run's steps make. A bucket's cascade graph is captured beside its plain one only once a step has
had a plan: in a run whose rows share nothing, a captured cascade twin made every plain step slower."""

from __future__ import annotations

import numpy as np
import torch

from omni_cli.runners.batch import ForwardBatch
from omni_cli.runners.cascade_attention import CascadeInputs
from omni_cli.runners.cuda_graphs import DecodeGraphs
from omni_cli.runners.kv_blocks import TILE_ROWS, CascadePlan


class _KV:
    max_seq_len, spare_slot = 64, 15


def _graphs():
    graphs = DecodeGraphs(model=None, kv=_KV(), device=torch.device("cpu"), capture=False)
    graphs.kernel = graphs.cascade = True  # as on CUDA, with a block pool that shares prompt blocks
    built = []

    def build(rows, k, deterministic, inputs_like, post, cascade=False):
        built.append((rows, cascade))
        st = {name: torch.zeros(rows, dtype=torch.int64) for name in ("slots", "steps", "lengths")}
        st["positions"] = torch.zeros(rows, 1, dtype=torch.int64)
        st["cascade"] = CascadeInputs(torch.zeros(rows, dtype=torch.int32),
                                      torch.full((rows, TILE_ROWS), -1, dtype=torch.int32),
                                      torch.zeros(rows, dtype=torch.int32)) if cascade else None
        return st, {}, (lambda post: torch.arange(rows)[:, None] + st["slots"][:, None]), None

    graphs._build = build
    return graphs, built


def _step(n: int, shared: bool = False) -> ForwardBatch:
    plan = None
    if shared:  # rows 0 and 1 share 16 prompt positions
        tile = np.full((1, TILE_ROWS), -1, dtype=np.int32)
        tile[0, :2] = [0, 1]
        plan = CascadePlan(np.array([16, 16] + [0] * (n - 2), dtype=np.int32), tile, np.array([16], dtype=np.int32))
    return ForwardBatch(is_prefill=False, rids=[str(i) for i in range(n)], slots_gpu=torch.arange(n) + 3,
                        lengths_cpu=[20] * n, steps_cpu=[1] * n, steps_gpu=torch.ones(n, dtype=torch.int64),
                        positions_gpu=torch.full((n, 1), 19, dtype=torch.int64), cascade_cpu=plan)


def test_cascade_twins_only_once_a_step_had_a_plan():
    graphs, built = _graphs()
    for n in (3, 2, 3):  # a run whose rows share nothing: plain graphs only
        out = graphs.run(_step(n), deterministic=False)
        assert out[:, 0].tolist() == [i + i + 3 for i in range(n)]  # each real row's own output, padding cut
    assert built == [(4, False), (2, False)]
    graphs.run(_step(4, shared=True), deterministic=False)  # the first plan: its bucket's cascade graph
    assert built[2:] == [(4, True)]
    graphs.run(_step(7), deterministic=False)  # from now on a new bucket's first step builds both
    assert built[3:] == [(8, False), (8, True)]
    graphs.run(_step(2, shared=True), deterministic=False)  # the bucket built before the first plan
    assert built[5:] == [(2, True)]
