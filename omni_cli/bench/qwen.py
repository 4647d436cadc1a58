"""omni bench for Qwen3-TTS-12Hz: our talker and code predictor with random weights built on the
device (transformers has no Qwen3-TTS; the reference peer is qwen-tts's own generate, peer.py).

A frame is the talker's step, the predictor's 15 sub-steps and 16 draws; every row is a text-only
prompt of prompt_len positions making exactly `frames` frames, sampling as the release's
generation_config.json sets it."""

from __future__ import annotations

import numpy as np
import torch

from omni_cli.runners.budget import KVShape
from omni_cli.runners.device import default_dtype
from omni_cli.runners.engine import DETERMINISTIC_SHAPES, Engine
from omni_cli.runners.qwen3_tts.config import GenerationDefaults
from omni_cli.runners.qwen3_tts.runner import Qwen3Runner
from omni_cli.runners.qwen3_tts.shapes import (SHAPES, frame_bytes, frame_flops, param_count,  # noqa: F401 (SHAPES: ours)
                                                shape_config)
from omni_cli.runners.qwen3_tts.talker import Talker
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request

from .common import BenchRow, RunResult, drive, failed_note, floor_ms, progress

PEERS = ("sync", "async", "deterministic", "qwen-tts")
DEFAULT_PEERS = ("sync", "async")
AUDIO_S_PER_FRAME = 1920 / 24000
MIN_FRAMES = 2  # frame 0 comes with the prefill: one decode step at least


def random_model(shape: str, dtype: torch.dtype, device: torch.device, max_seq_len: int) -> Talker:
    """The talker (with its code predictor) of a shape, random weights built in dtype on device."""
    cfg = shape_config(shape)
    torch.manual_seed(0)
    with torch.device(device), default_dtype(dtype):
        model = Talker(cfg, max_seq_len)
    return model.to_runtime(device, dtype)


def _params(frames: int) -> SamplingParams:
    """generation_config.json's sampling at both levels; no end of speech before `frames`."""
    g = GenerationDefaults()
    return SamplingParams(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                          repetition_penalty=g.repetition_penalty, max_new_frames=frames, min_new_frames=frames,
                          subtalker_temperature=g.subtalker_temperature, subtalker_top_k=g.subtalker_top_k,
                          subtalker_top_p=g.subtalker_top_p)


def run_requests(model: Talker, n_req: int, max_batch: int, frames: int, prompt_len: int, max_seq_len: int,
                 async_decode: bool, device: torch.device, fixed_shapes=None) -> RunResult:
    """n_req rows of exactly `frames` frames through the scheduler loop (graphs on CUDA)."""
    cfg = model.cfg
    t = cfg.talker
    # the paged cache and its pool, as omni generate builds them (runners/budget.py)
    kv, pool = KVShape(t.num_hidden_layers, t.num_key_value_heads, t.head_dim).paged(max_batch, max_seq_len, model.codec_head.weight.dtype, device,
                                                      share=fixed_shapes is None)
    engine = Engine(model, kv, device, fixed_shapes, blocks=pool)
    if device.type == "cuda":
        engine.use_graphs()
    runner = Qwen3Runner(engine, cfg, GenerationDefaults(), max_batch, max_seq_len, device)
    rng = np.random.default_rng(0)
    reqs = [Request(rid=f"r{i}", prompt=rng.integers(0, t.text_vocab_size, prompt_len).tolist(),
                    params=_params(frames), seed=1000 + i) for i in range(n_req)]
    return drive(runner, reqs, max_batch, max_seq_len, async_decode, device)


def host_bytes(shape: str, batches: list[int], frames: int, prompt_len: int, dtype: torch.dtype) -> int:
    """The talker built straight in dtype, and the KV cache of the widest batch."""
    cfg = shape_config(shape)
    t = cfg.talker
    elem = torch.finfo(dtype).bits // 8
    kv = max(batches) * (prompt_len + frames) * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * elem
    return param_count(cfg) * elem + kv


def floor_of(cfg, batch: int, seq: int, elem: int, device: torch.device) -> float | None:
    """A frame's floor: the weights and KV it reads (shapes.frame_bytes), or its FLOPs."""
    return floor_ms(frame_bytes(cfg, batch, seq, elem), frame_flops(cfg, batch), device)


def run(shape: str, batches: list[int], frames: int, prompt_len: int, device: torch.device, dtype: torch.dtype,
        peers, notes: list[str]) -> list[BenchRow]:
    """The omni peers' rows (qwen-tts runs apart, in its own process: peer.py)."""
    ours = [p for p in peers if p != "qwen-tts"]
    if not ours:
        return []
    max_seq = prompt_len + frames
    model = random_model(shape, dtype, device, max_seq)
    elem = torch.finfo(dtype).bits // 8
    run_requests(model, 2, 2, 4, prompt_len, max_seq, True, device)  # warm-up
    rows: list[BenchRow] = []
    for b in batches:
        floor = floor_of(model.cfg, b, prompt_len + frames // 2, elem, device)
        for peer in ours:
            try:
                shapes = DETERMINISTIC_SHAPES[device.type] if peer == "deterministic" else None
                res = run_requests(model, b, b, frames, prompt_len, max_seq, peer != "sync", device, shapes)
                rows.append(progress(BenchRow(peer, b, res.ms_per_step, b * frames * AUDIO_S_PER_FRAME / res.wall_s,
                                              floor)))
            except Exception as e:  # one peer's failure (out of memory at a large batch) leaves the others
                notes.append(failed_note(peer, b, e))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    del model
    return rows
