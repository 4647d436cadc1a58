"""Deterministic mode's fixed-shape chunking computes the same function as the default path.

CUDA uses chunks of several rows and length buckets; the CPU runs them with
one row each. Here the CUDA-style shapes run on the CPU (fp32) and must agree
with the default engine up to rounding, prefill and decode, padding rows and
buckets included.
"""

from __future__ import annotations

import torch

from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from omni_cli.runners.attention import KVCache
from omni_cli.runners.checkpoint import load_into, read_safetensors
from omni_cli.runners.engine import Engine, FixedShapes
from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from tests.conftest import TINY


def test_chunked_fixed_shapes_match_default_engine():
    cfg = HiggsConfig.from_file(TINY / "model" / "config.json")
    model = HiggsAudioV2LM(cfg, 128)
    load_into(model, read_safetensors(TINY / "model"), TINY)
    model = model.to_runtime(torch.device("cpu"), torch.float32)
    lengths = [5, 17, 30, 33, 64, 2, 16]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (n,), generator=g).tolist() for n in lengths]
    results = {}
    for name, shapes in (("default", None), ("fixed", FixedShapes(decode_rows=4, prefill_rows=3, prefill_bucket=16))):
        kv = KVCache(cfg.num_hidden_layers, 8 + 1, cfg.num_key_value_heads, 128, cfg.head_dim, torch.float32,
                     torch.device("cpu"))
        engine = Engine(model, kv, torch.device("cpu"), shapes)
        sched = Scheduler(8, 128)
        for i, p in enumerate(prompts):
            sched.add(Request(rid=f"r{i}", prompt=p, params=SamplingParams(max_new_frames=10), seed=0))
        outs = []
        so = sched.schedule()
        fb = engine.build_forward_batch(so)
        outs.append(engine.forward(fb))
        codes = torch.randint(0, 1024, (len(prompts), 1, 8), generator=torch.Generator().manual_seed(1))
        for _ in range(3):  # decode steps, 7 rows -> two chunks of 4 (one padding row)
            so = sched.schedule()
            fb = engine.build_forward_batch(so)
            fb.model_inputs["audio_codes"] = codes
            outs.append(engine.forward(fb))
        results[name] = outs
    for a, b in zip(results["default"], results["fixed"]):
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_decode_graph_padding_matches_eager():
    """DecodeGraphs' bucketing (rows to a power of two, keys to a length bucket,
    padding on the spare slot), run eagerly on the CPU: the same logits as the
    plain engine; and bit-identical to the eager fixed-shape path in deterministic mode."""
    cfg = HiggsConfig.from_file(TINY / "model" / "config.json")
    model = HiggsAudioV2LM(cfg, 512)
    load_into(model, read_safetensors(TINY / "model"), TINY)
    model = model.to_runtime(torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (5, 40, 300, 12, 7)]
    codes = [torch.randint(0, 1024, (5, 1, 8), generator=g) for _ in range(4)]

    def run(shapes, graphs):
        kv = KVCache(cfg.num_hidden_layers, 9, cfg.num_key_value_heads, 512, cfg.head_dim, torch.float32,
                     torch.device("cpu"))
        engine = Engine(model, kv, torch.device("cpu"), shapes)
        if graphs:
            engine.use_graphs(capture=False)
        sched = Scheduler(8, 512)
        for i, p in enumerate(prompts):
            sched.add(Request(rid=f"r{i}", prompt=p, params=SamplingParams(max_new_frames=10), seed=0))
        engine.forward(engine.build_forward_batch(sched.schedule()))
        outs = []
        for c in codes:
            fb = engine.build_forward_batch(sched.schedule())
            fb.model_inputs["audio_codes"] = c
            outs.append(engine.forward(fb))
        return outs, engine

    eager, _ = run(None, False)
    padded, engine = run(None, True)
    assert {key[:2] for key in engine.graphs._entries} == {(8, 512)}  # 5 rows -> 8; 300 + steps keys -> 512
    for a, b in zip(eager, padded):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    shapes = FixedShapes(decode_rows=1, prefill_rows=1, prefill_bucket=1)
    det_eager, _ = run(shapes, False)
    det_padded, _ = run(shapes, True)
    for a, b in zip(det_eager, det_padded):
        assert torch.equal(a, b)
