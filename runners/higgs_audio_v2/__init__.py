"""Higgs Audio v2: native model, runner hooks, codec decode and prompt building."""

from __future__ import annotations

import contextlib

import torch

from omni_cli.config import ModelConfig
from omni_cli.errors import OmniError
from runners.attention import KVCache
from runners.checkpoint import load_into, read_safetensors, resolve_folder
from runners.device import free_memory, kv_slots_within
from runners.engine import Engine, FixedShapes
from runners.higgs_audio_v2.codec import HiggsCodecDecoder
from runners.higgs_audio_v2.config import HiggsConfig
from runners.higgs_audio_v2.model import HiggsAudioV2LM
from runners.higgs_audio_v2.prompt import PromptBuilder
from runners.higgs_audio_v2.runner import HiggsRunner

# present in released checkpoints, unused for generation (as in transformers,
# which lists it in _keys_to_ignore_on_load_unexpected)
IGNORED_KEYS = ("text_lm_head.weight",)
# Deterministic mode's shapes: constants per device type, so results do not
# depend on --max-batch-size. On an H200, 64 decode rows fill a step well and a
# row's bits were measured not to depend on its place in the chunk. Prefill
# goes 32 prompts per forward: an eager prefill forward is host-bound (~25 ms
# of launches) up to about that size, and 8 per forward cost 0.52 s against
# 0.09 s for 64 prompts in one forward (measured at batch 64). On the CPU
# they do (the GEMM kernels' row tiles have remainder paths), so there every
# row and every prompt goes alone, at its own length.
DETERMINISTIC_SHAPES = {"cuda": FixedShapes(decode_rows=64, prefill_rows=32, prefill_bucket=64),
                        "cpu": FixedShapes(decode_rows=1, prefill_rows=1, prefill_bucket=1)}


def build(config: ModelConfig, dtype: torch.dtype, device: torch.device,
          raw_logprobs: bool = False) -> tuple[HiggsRunner, PromptBuilder]:
    lm_dir = resolve_folder(config.checkpoint, "checkpoint")
    codec_dir = resolve_folder(config.codec, "codec")
    cfg = HiggsConfig.from_file(lm_dir / "config.json")
    with torch.device(device), _default_dtype(dtype):
        # built where and as it will run: a 5.4 B-parameter model initialised in
        # float32 on the host took ~30 s of a 40 s startup (measured on the H200 machine)
        model = HiggsAudioV2LM(cfg, config.max_seq_len)
    load_into(model, read_safetensors(lm_dir), lm_dir, ignore=IGNORED_KEYS)
    model = model.to_runtime(device, dtype)
    codec = HiggsCodecDecoder.load(codec_dir, dtype, device)
    slots = _kv_slots(config, cfg, dtype, device)
    # one spare slot for padding rows (deterministic chunks, CUDA-graph buckets) to write to
    kv = KVCache(cfg.num_hidden_layers, slots + 1, cfg.num_key_value_heads, config.max_seq_len,
                 cfg.head_dim, dtype, device)
    engine = Engine(model, kv, device, DETERMINISTIC_SHAPES[device.type] if config.deterministic else None)
    if device.type == "cuda":
        engine.use_graphs()  # the CPU path stays eager
    runner = HiggsRunner(engine, cfg, codec, slots, config.max_seq_len, device, raw_logprobs)
    return runner, PromptBuilder(lm_dir, cfg.audio_bos_token_id)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _kv_slots(config: ModelConfig, cfg: HiggsConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Requests that may run at once: max_batch_size, or fewer where the KV cache of that
    many would not fit in the memory left once weights and codec are loaded."""
    per_slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * config.max_seq_len * cfg.head_dim
    per_slot *= torch.finfo(dtype).bits // 8
    free = free_memory(device)
    if free is None:
        return config.max_batch_size
    slots = kv_slots_within(free, per_slot, config.max_batch_size)
    if slots < 1:
        raise OmniError(f"{config.path}: not enough free memory on {device} for one request's KV cache at "
                        f"max_seq_len {config.max_seq_len} ({per_slot / 2**20:.0f} MiB per request, "
                        f"{free / 2**30:.1f} GiB free): lower max_seq_len")
    return slots
