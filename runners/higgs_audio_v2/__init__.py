"""Higgs Audio v2: native model, runner hooks, codec decode and prompt building."""

from __future__ import annotations

import contextlib
import time

import torch

from omni_cli.config import ModelConfig
from ..errors import OmniError
from omni_cli.scheduler import prefill_token_budget
from ..attention import KVCache
from ..checkpoint import resolve_folder, stream_into
from ..device import RUNTIME_SLACK_BYTES, free_memory, kv_slots_within, peak_bytes
from ..engine import Engine, FixedShapes, ForwardBatch
from .codec import HiggsCodecDecoder
from .config import HiggsConfig
from .model import HiggsAudioV2LM
from .prompt import PromptBuilder
from .runner import CODEC_BATCH_FRAMES, HiggsRunner, codec_bytes

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
    laps = _Laps(device)  # where start-up goes (run.json: timings.load_phases)
    lm_dir = resolve_folder(config.checkpoint, "checkpoint")
    codec_dir = resolve_folder(config.codec, "codec")
    cfg = HiggsConfig.from_file(lm_dir / "config.json")
    with torch.device(device), _default_dtype(dtype):
        # built where and as it will run: a 5.4 B-parameter model initialised in
        # float32 on the host took ~30 s of a 40 s startup (measured on the H200 machine)
        model = HiggsAudioV2LM(cfg, config.max_seq_len)
    laps("model_s")  # the first CUDA work: includes creating the context
    stream_into(model, lm_dir, ignore=IGNORED_KEYS)  # into the tensors just made, on the device
    laps("weights_s")
    model = model.to_runtime(device, dtype)
    laps("fuse_s")
    codec = HiggsCodecDecoder.load(codec_dir, dtype, device)
    laps("codec_s")
    slots, budget = _kv_slots(config, cfg, model, dtype, device)
    laps("kv_budget_s")
    # one spare slot for padding rows (deterministic chunks, CUDA-graph buckets) to write to
    kv = KVCache(cfg.num_hidden_layers, slots + 1, cfg.num_key_value_heads, config.max_seq_len,
                 cfg.head_dim, dtype, device)
    engine = Engine(model, kv, device, DETERMINISTIC_SHAPES[device.type] if config.deterministic else None)
    if device.type == "cuda":
        engine.use_graphs()  # the CPU path stays eager
    runner = HiggsRunner(engine, cfg, codec, slots, config.max_seq_len, device, raw_logprobs)
    runner.kv_budget = budget
    laps("cache_s")
    prompts = PromptBuilder(lm_dir, cfg.audio_bos_token_id)
    laps("tokenizer_s")
    runner.load_phases = laps.done
    return runner, prompts


class _Laps:
    """Seconds between calls, by name; each waits for the device first, so a phase's queued
    kernels count in that phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.done: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.done[name] = round(now - self._t, 3)
        self._t = now


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _kv_slots(config: ModelConfig, cfg: HiggsConfig, model: HiggsAudioV2LM, dtype: torch.dtype,
              device: torch.device) -> tuple[int, dict | None]:
    """Requests that may run at once: max_batch_size, or fewer where the KV cache of that
    many would not fit in the memory left once weights and codec are loaded and room is kept
    for the rest of the run: the widest prefill's activations (measured here), the codec's
    calls beside the loop, RUNTIME_SLACK_BYTES. Also the budget's terms (run.json), None
    where there is no budget (the CPU)."""
    per_slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * config.max_seq_len * cfg.head_dim
    per_slot *= torch.finfo(dtype).bits // 8
    if free_memory(device) is None:
        return config.max_batch_size, None
    t0 = time.perf_counter()
    prefill = _widest_prefill_bytes(config, cfg, model, dtype, device)
    measured_s = time.perf_counter() - t0  # a cold process compiles the prefill's kernels here
    free = free_memory(device)  # after the measurement: the workspaces it created stay
    # the codec's calls beside the loop, at the per-frame peak measured for the released
    # codec (runners/higgs_audio_v2/runner.py), twice where they are batched and graphed
    # (CUDA, default mode): the graphs' pool and the eager first calls of shapes not
    # captured yet each keep a call's activations (runners/codec_graphs.py); the drain's
    # calls are smaller
    graphed = device.type == "cuda" and not config.deterministic
    codec = codec_bytes(CODEC_BATCH_FRAMES, dtype) * (2 if graphed else 1)
    headroom = prefill + codec + RUNTIME_SLACK_BYTES
    slots = kv_slots_within(free, per_slot, config.max_batch_size, headroom)
    if slots < 1:
        raise OmniError(f"{config.path}: not enough free memory on {device} for one request's KV cache at "
                        f"max_seq_len {config.max_seq_len} ({per_slot / 2**20:.0f} MiB per request, "
                        f"{free / 2**30:.1f} GiB free, {headroom / 2**30:.1f} GiB of it kept for "
                        f"activations, codec and workspaces): lower max_seq_len")
    mib = lambda n: round(n / 2**20, 1)  # noqa: E731
    return slots, {"free_mib": mib(free), "kv_slot_mib": mib(per_slot), "prefill_peak_mib": mib(prefill),
                   "codec_mib": mib(codec), "slack_mib": mib(RUNTIME_SLACK_BYTES),
                   "kv_mib": mib(per_slot * (slots + 1)), "prefill_measured_in_s": round(measured_s, 3)}


def _widest_prefill_bytes(config: ModelConfig, cfg: HiggsConfig, model: HiggsAudioV2LM, dtype: torch.dtype,
                          device: torch.device) -> int:
    """Activation bytes of the widest prefill a step admits (omni_cli/scheduler.py: at most
    max_batch_size rows, rows x the longest prompt within prefill_token_budget), measured by
    running one at least as wide: rows of max_seq_len text tokens, as many as cover the
    budget (where max_seq_len does not divide it, up to one row more than it admits), through
    the path the run takes (fused, or deterministic mode's fixed chunks, which pad to their
    own row count), on a one-slot cache that every row writes (what it then holds, and the
    logits, are garbage, and dropped)."""
    t = config.max_seq_len
    rows = min(-(-prefill_token_budget(t) // t), config.max_batch_size)
    kv = KVCache(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, t, cfg.head_dim, dtype, device)
    engine = Engine(model, kv, device, DETERMINISTIC_SHAPES[device.type] if config.deterministic else None)
    zeros = torch.zeros(rows, dtype=torch.int64, device=device)
    fb = ForwardBatch(is_prefill=True, rids=[str(i) for i in range(rows)], slots_gpu=zeros, lengths_cpu=[t] * rows,
                      steps_cpu=[0] * rows, steps_gpu=zeros,
                      positions_gpu=torch.arange(t, device=device).expand(rows, t),
                      model_inputs={"input_ids": torch.zeros(rows, t, dtype=torch.int64, device=device)})
    peak = peak_bytes(lambda: engine.forward(fb), device)
    del engine, kv
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the one-slot cache too
    return peak
