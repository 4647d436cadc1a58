"""omni bench for Higgs Audio v2: our engine and transformers' HiggsAudioV2ForConditionalGeneration
on the same random weights (transformers initialises them once and our engine loads them)."""

from __future__ import annotations

import time

import numpy as np
import torch

from omni_cli.runners.budget import KVShape
from omni_cli.runners.device import blas_library
from omni_cli.runners.engine import DETERMINISTIC_SHAPES, Engine
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from omni_cli.runners.higgs_audio_v2.runner import HiggsRunner
from omni_cli.runners.higgs_audio_v2.shapes import param_counts, shape_config, transformers_config
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request

from .common import BenchRow, RunResult, drive, failed_note, floor_ms, progress, sync

SHAPES = ("higgs-audio-v2-3b", "tiny-higgs-audio-v2")
PEERS = ("sync", "async", "deterministic", "transformers")
DEFAULT_PEERS = ("sync", "async", "transformers")
AUDIO_S_PER_FRAME = 960 / 24000
DELAY_FRAMES = 8  # the delay pattern's ramp: frames that carry no sound
MIN_FRAMES = 9  # the delay pattern's first whole frame of audio


def random_model(shape: str, dtype: torch.dtype, device: torch.device, max_seq_len: int):
    """(transformers model, our model with the same random weights)."""
    from transformers import HiggsAudioV2ForConditionalGeneration

    cfg = shape_config(shape)
    torch.manual_seed(0)
    with torch.device(device):
        ref = HiggsAudioV2ForConditionalGeneration(transformers_config(cfg)).to(dtype).eval()
        model = HiggsAudioV2LM(cfg, max_seq_len)
    model.load_state_dict(ref.state_dict(), strict=False)  # the same weights; ref lacks only our rope buffers
    return ref, model.to_runtime(device, dtype)


def _prompts(cfg, n: int, prompt_len: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    top = min(cfg.audio_bos_token_id, cfg.vocab_size) - 16
    return [rng.integers(0, top, prompt_len - 1).tolist() + [cfg.audio_bos_token_id] for _ in range(n)]


def run_requests(model, n_req: int, max_batch: int, frames: int, prompt_len: int, max_seq_len: int,
                 async_decode: bool, device: torch.device, fixed_shapes=None) -> RunResult:
    """n_req requests of exactly `frames` frames through the scheduler loop (graphs on CUDA)."""
    cfg = model.cfg
    # the paged cache and its pool, as omni generate builds them (runners/budget.py)
    kv, pool = KVShape(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim).paged(max_batch, max_seq_len, next(model.parameters()).dtype, device,
                                                      share=fixed_shapes is None)
    engine = Engine(model, kv, device, fixed_shapes, blocks=pool)
    if device.type == "cuda":
        engine.use_graphs()
    runner = HiggsRunner(engine, cfg, max_batch, max_seq_len, device)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_new_frames=frames, min_new_frames=frames)
    reqs = [Request(rid=f"r{i}", prompt=ids, params=params, seed=1000 + i)
            for i, ids in enumerate(_prompts(cfg, n_req, prompt_len))]
    return drive(runner, reqs, max_batch, max_seq_len, async_decode, device)


def _transformers(ref, cfg, batch, frames, prompt_len, device):
    ids = torch.tensor(_prompts(cfg, batch, prompt_len), device=device)
    sync(device)
    t0 = time.perf_counter()
    # transformers as PyTorch runs it by default (our engine made cuBLASLt the process's BLAS)
    with torch.inference_mode(), blas_library("default"):
        out = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=frames, do_sample=True,
                           temperature=1.0, top_k=50, top_p=0.95)
    sync(device)
    wall = time.perf_counter() - t0
    steps = out.shape[1]  # audio_sequences [B, frames generated, C]: it may stop before `frames`
    return 1e3 * wall / steps, wall, steps


def host_bytes(shape: str, batches: list[int], frames: int, prompt_len: int, dtype: torch.dtype) -> int:
    """Both models built in float32 (one then cast, the other beside it), then our KV cache."""
    cfg = shape_config(shape)
    total, _ = param_counts(cfg)
    elem = torch.finfo(dtype).bits // 8
    return total * (4 + elem) + max(batches) * (prompt_len + frames) * cfg.num_hidden_layers * \
        cfg.num_key_value_heads * cfg.head_dim * 2 * elem


def run(shape: str, batches: list[int], frames: int, prompt_len: int, device: torch.device, dtype: torch.dtype,
        peers, notes: list[str]) -> list[BenchRow]:
    max_seq = prompt_len + frames
    ref, model = random_model(shape, dtype, device, max_seq)
    cfg = model.cfg
    elem = torch.finfo(dtype).bits // 8
    run_requests(model, 2, 2, 12, prompt_len, max_seq, True, device)  # warm-up
    _, per_step = param_counts(cfg)
    rows: list[BenchRow] = []
    for b in batches:
        seq = prompt_len + frames // 2
        kv = b * seq * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * elem
        floor = floor_ms(per_step * elem + kv, 2 * per_step * b, device)
        for peer in peers:
            try:
                if peer == "transformers":
                    ms, wall, steps = _transformers(ref, cfg, b, frames, prompt_len, device)
                else:
                    shapes = DETERMINISTIC_SHAPES[device.type] if peer == "deterministic" else None
                    res = run_requests(model, b, b, frames, prompt_len, max_seq, peer != "sync", device, shapes)
                    ms, wall, steps = res.ms_per_step, res.wall_s, frames
                rows.append(progress(BenchRow(peer, b, ms, b * max(steps - DELAY_FRAMES, 0) * AUDIO_S_PER_FRAME / wall,
                                              floor)))
            except Exception as e:  # one peer's failure (out of memory at a large batch) leaves the others
                notes.append(failed_note(peer, b, e))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows
