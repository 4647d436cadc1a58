"""bf16 correctness on CUDA against transformers: 2 decoder layers at the real 3B hidden sizes.

Random weights shared by three models: transformers in float32 (the oracle),
transformers in bf16 (the peer) and ours in bf16 (CUDA graphs, Triton
attention and fused kernels). Checked:
- logits of our prefill and of 50 teacher-forced decode steps (fed the
  oracle's greedy codes) against the oracle's, by relative error
  ||ours - oracle|| / ||oracle|| per step: at most REL_BOUND, and no worse
  than transformers' own bf16 prefill is against the same oracle (times 1.5);
- greedy codes: at every teacher-forced step and codebook our argmax equals
  the oracle's wherever the oracle's top-two margin exceeds twice the largest
  logit error measured at that step; and the whole runner's free-running
  greedy codes (3 prompts of different lengths at batch 3: padded graph rows,
  several key lengths) equal the oracle's for the first 50 frames, except
  that a divergence is accepted at a measured near-tie (margin below twice
  the largest teacher-forced logit error), after which the inputs differ and
  comparing stops.
Why not plain equality of 50 free-running frames: with random weights the
top two of 1026 logits are often closer than bf16's own rounding noise
(transformers in bf16 is ~3% off its float32 self on this model, measured on
CPU), so no bf16 implementation, transformers' included, reproduces float32
greedy codes for 400 decisions; the test prints where transformers bf16 itself
leaves the oracle.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")
FRAMES = 50
REL_BOUND = 3e-2  # measured on CPU for this model: ours bf16 1.3%, transformers bf16 2.9% off float32


@pytest.fixture(scope="module")
def models():
    from transformers import HiggsAudioV2ForConditionalGeneration

    from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
    from omni_cli.runners.higgs_audio_v2.shapes import shape_config, transformers_config

    cfg = dataclasses.replace(shape_config("higgs-audio-v2-3b"), num_hidden_layers=2)
    dev = DEV
    torch.manual_seed(0)
    with torch.device(dev):
        oracle = HiggsAudioV2ForConditionalGeneration(transformers_config(cfg)).eval()
        peer = HiggsAudioV2ForConditionalGeneration(transformers_config(cfg)).to(torch.bfloat16).eval()
        ours = HiggsAudioV2LM(cfg, 512)
    peer.load_state_dict(oracle.state_dict())
    ours.load_state_dict(oracle.state_dict(), strict=False)
    return cfg, oracle, peer, ours.to_runtime(dev, torch.bfloat16)


def _prompt(cfg, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.audio_bos_token_id - 16, n - 1).tolist() + [cfg.audio_bos_token_id]


def _greedy(model, ids: list[int]):
    """-> codes [frames, 8], raw logits [frames, 8, V], processed scores [frames, 8, V] (float32)."""
    x = torch.tensor([ids], device=DEV)
    with torch.inference_mode():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=FRAMES, do_sample=False,
                             return_dict_in_generate=True, output_logits=True, output_scores=True)
    c = out.audio_sequences.shape[-1]
    raw = torch.stack([lg[0].float().reshape(c, -1) for lg in out.logits])
    scores = torch.stack([sc[0].float().reshape(c, -1) for sc in out.scores])
    return out.audio_sequences[0].cpu(), raw, scores


def _margin(scores: torch.Tensor) -> torch.Tensor:
    """[..., V] -> top-1 minus top-2, [...]."""
    top = scores.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def _engine(cfg, model, slots: int):
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine

    kv = KVCache(cfg.num_hidden_layers, slots + 1, cfg.num_key_value_heads, 512, cfg.head_dim, torch.bfloat16, DEV)
    engine = Engine(model, kv, DEV)
    engine.use_graphs(capture=DEV.type == "cuda")
    return engine


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def teacher_forced(models):
    """Our logits [frames, 8, V] for the oracle's greedy codes, and the oracle's run."""
    from omni_cli.runners.engine import ForwardBatch

    cfg, oracle, _, ours = models
    ids = _prompt(cfg, 64, 0)
    codes, raw, scores = _greedy(oracle, ids)
    engine = _engine(cfg, ours, 1)
    dev, t = DEV, len(ids)

    def batch(prefill: bool, step: int, **inputs) -> ForwardBatch:
        pos = list(range(t)) if prefill else [t + step - 1]
        return ForwardBatch(is_prefill=prefill, rids=["a"], slots_gpu=torch.tensor([0], device=dev),
                            lengths_cpu=[pos[-1] + 1], steps_cpu=[step], steps_gpu=torch.tensor([step], device=dev),
                            positions_gpu=torch.tensor([pos], device=dev), model_inputs=inputs,
                            prompts_cpu=[ids] if prefill else [])  # prompts given: the prefill replays a graph

    logits = [engine.forward(batch(True, 0, input_ids=torch.tensor([ids], device=dev)))[0]]
    for s in range(1, len(raw)):  # feed frame s-1 as the oracle did; logits for frame s
        logits.append(engine.forward(batch(False, s, audio_codes=codes[s - 1].to(dev)[None, None]))[0])
    return ids, codes, raw, scores, torch.stack(logits).view(raw.shape)


def test_prefill_and_decode_logits_match_transformers(models, teacher_forced):
    _, oracle, peer, _ = models
    ids, _, raw, _, ours = teacher_forced
    errs = [_rel(a, b) for a, b in zip(ours, raw)]
    x = torch.tensor([ids], device=DEV)
    with torch.inference_mode():
        peer_prefill = peer(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].float().reshape(raw[0].shape)
    peer_err = _rel(peer_prefill, raw[0])
    print(f"\nrelative logit error vs transformers float32: ours bf16 prefill {errs[0]:.2e}, decode max "
          f"{max(errs[1:]):.2e}; transformers bf16 prefill {peer_err:.2e}")
    assert len(errs) == FRAMES
    assert max(errs) < REL_BOUND, errs
    assert errs[0] <= 1.5 * peer_err


def test_teacher_forced_argmax_matches_where_the_margin_is_real(teacher_forced):
    _, _, raw, _, ours = teacher_forced
    err = (ours - raw).abs().amax(dim=(1, 2))  # [frames] largest logit error per step
    clear = _margin(raw) > 2 * err[:, None]  # [frames, 8]
    agree = ours.argmax(-1) == raw.argmax(-1)
    print(f"\nargmax decisions with a clear margin: {int(clear.sum())}/{clear.numel()}, "
          f"all agree: {bool(agree[clear].all())}")
    assert clear.float().mean() > 0.5  # the check covers most decisions
    assert agree[clear].all()


def test_greedy_codes_match_transformers_for_50_frames(models, teacher_forced):
    from omni_cli.loop import run_loop
    from omni_cli.runners.sampling.params import SamplingParams
    from omni_cli.scheduler import Request, Scheduler
    from omni_cli.runners.higgs_audio_v2.runner import HiggsRunner

    cfg, oracle, peer, ours = models
    _, _, raw_tf, _, ours_tf = teacher_forced
    tie = 2 * float((ours_tf - raw_tf).abs().max())  # twice the largest logit error measured above
    prompts = [_prompt(cfg, n, i) for i, n in enumerate((40, 64, 100))]
    engine = _engine(cfg, ours, 3)
    runner = HiggsRunner(engine, cfg, 3, 512, DEV)
    sched = Scheduler(3, 512)
    params = SamplingParams(temperature=0.0, max_new_frames=FRAMES)
    reqs = [Request(rid=f"r{i}", prompt=p, params=params, seed=i) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add(r)
    run_loop(sched, runner, lambda rs: None, lambda n, st: None, True)
    for r, p in zip(reqs, prompts):
        codes, raw, scores = _greedy(oracle, p)
        peer_codes, _, _ = _greedy(peer, p)
        n = min(FRAMES, len(codes), len(r.frames))
        got = torch.from_numpy(r.frames.array[:n])
        differ = (got != codes[:n]).any(dim=1).nonzero()
        first = int(differ[0]) if len(differ) else None
        m = min(n, len(peer_codes))  # the peer may stop early once it has left the oracle
        peer_differ = (peer_codes[:m] != codes[:m]).any(dim=1).nonzero()
        print(f"\n{r.rid}: ours equal the float32 oracle for {first if first is not None else n} frames, "
              f"transformers bf16 for {int(peer_differ[0]) if len(peer_differ) else m}")
        if first is None:
            assert n == FRAMES
            continue
        # the divergence must be at a near-tie of the oracle's processed scores
        books = (got[first] != codes[first]).nonzero()[:, 0]
        margin = _margin(scores[first, books])
        assert (margin < tie).all(), (r.rid, first, margin, tie)


def _paged_engine(cfg, ours, prompts: list[list[int]]):
    """Our bf16 model on a paged cache of 16-position blocks with graphs, and a scheduler holding the
    prompts (8 frames each) -> (engine, scheduler)."""
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine
    from omni_cli.runners.kv_blocks import BlockPool
    from omni_cli.runners.sampling.params import SamplingParams
    from omni_cli.scheduler import Request, Scheduler

    pool = BlockPool(64, 16)
    kv = KVCache.paged(cfg.num_hidden_layers, 4, cfg.num_key_value_heads, 512, cfg.head_dim, torch.bfloat16, DEV,
                       num_blocks=64, block_size=16)
    engine = Engine(ours, kv, DEV, blocks=pool)
    engine.use_graphs()
    sched = Scheduler(3, 512, blocks=pool)
    for i, p in enumerate(prompts):
        sched.add(Request(rid=f"r{i}", prompt=p, params=SamplingParams(max_new_frames=8), seed=0))
    return engine, sched


def test_shared_prefix_prefill_matches_transformers(models, monkeypatch):
    """A prefill whose prompts share a prefix, on the paged cache (runners/kv_blocks.py): the first
    row runs its whole prompt (a graph replay), the other two reuse its prefix blocks and run their
    own tokens on the fused path over those keys, a phase later. Each row's logits against the
    oracle run on its whole prompt, as the test above."""
    from omni_cli.runners import cuda_graphs

    cfg, oracle, peer, ours = models
    monkeypatch.setattr(cuda_graphs, "PREFILL_GRAPH_TOKENS", 64)  # the first row (64 tokens) replays a graph
    prefix = _prompt(cfg, 48, 7)[:-1]
    prompts = [prefix + _prompt(cfg, n, 10 + n) for n in (17, 5, 34)]
    engine, sched = _paged_engine(cfg, ours, prompts)
    so = sched.schedule()
    assert [r.blocks.cached for r in so.requests] == [0, 32, 32]  # two whole blocks of the 47-token prefix
    fb = engine.build_forward_batch(so)
    logits = engine.forward(fb).float()
    assert list(engine.prefill_graphs._entries) == [(1, 64)]  # the first row's graph; the others ran eagerly
    for row, ids in enumerate(prompts):
        x = torch.tensor([ids], device=DEV)
        with torch.inference_mode():
            want = oracle(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].float()
            peer_logits = peer(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].float()
        err, peer_err = _rel(logits[row], want.flatten()), _rel(peer_logits.flatten(), want.flatten())
        print(f"\nrow {row}: shared-prefix prefill {err:.2e} off float32, transformers bf16 {peer_err:.2e}")
        assert err < REL_BOUND and err <= 1.5 * peer_err


def test_decode_with_cascade_attention_matches_the_per_row_kernel(models):
    """Rows sharing a 150-token prompt prefix (9 cached blocks) decode through the captured graphs with
    their cascade plan (runners/cascade_attention.py): the shared keys attended once a group. Each
    step's logits within bf16 rounding of the same step without a plan (the per-row kernel, held to
    transformers by the tests above), over steps that rewrite the same positions."""

    cfg, _, _, ours = models
    prefix = _prompt(cfg, 151, 3)[:-1]
    prompts = [prefix + _prompt(cfg, n, 20 + n) for n in (9, 30, 17)]
    engine, sched = _paged_engine(cfg, ours, prompts)
    assert engine.cascade
    engine.forward(engine.build_forward_batch(sched.schedule()))
    g = torch.Generator(device=DEV).manual_seed(0)
    for step in range(3):
        fb = engine.build_forward_batch(sched.schedule())
        assert fb.cascade_cpu is not None and fb.cascade_cpu.shared.tolist() == [144] * 3
        fb.model_inputs = {"audio_codes": torch.randint(0, cfg.codebook_size, (3, 1, cfg.num_codebooks),
                                                        generator=g, device=DEV)}
        with_plan = engine.forward(fb).float()
        plain = engine.forward(dataclasses.replace(fb, cascade_cpu=None)).float()
        err = _rel(with_plan.flatten(), plain.flatten())
        print(f"\nstep {step}: cascade against the per-row kernel {err:.2e}")
        assert err < REL_BOUND
