"""`omni bench`: omni sync, omni async and transformers `generate`, in one process run.

A random-weight Higgs Audio v2 model of a named shape (no checkpoint): the
transformers model is initialised once and our engine loads its weights, so
both peers run the same weights. For each batch size every request decodes
exactly `frames` frames from a `prompt_len`-token prompt with sampling on
(temperature 1, top-k 50, top-p 0.95); the peer "deterministic" is the async
loop under --deterministic. Reported: decode ms per step and
audio-s/s over the whole run (prefill included; graph captures and kernel
compiles are paid before it, in the warm-up omni generate runs), each against the floor set
by the bytes a step must read (weights, plus KV) and the FLOPs it must do.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omni_cli.loop import LoopStats, run_loop
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from omni_cli.warmup import warm_up_lm
from omni_cli.runners.attention import KVCache
from omni_cli.runners.device import blas_library
from omni_cli.runners.engine import DETERMINISTIC_SHAPES, Engine
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from omni_cli.runners.higgs_audio_v2.runner import HiggsRunner
from omni_cli.runners.higgs_audio_v2.shapes import param_counts, shape_config, transformers_config

# what `--peers` may name: omni's sync and async loops, the async loop under --deterministic
# (batch-invariant arithmetic), transformers generate
PEERS = ("sync", "async", "deterministic", "transformers")
# H200 ceilings: device-copy bytes/s, bf16 matmul FLOP/s (shared/design/facts.md)
H200_BYTES_PER_S, H200_FLOPS = 4.27e12, 801e12
AUDIO_S_PER_FRAME = 960 / 24000


@dataclass
class BenchRow:
    peer: str
    batch: int
    ms_per_step: float
    audio_s_per_s: float
    floor_ms: float | None

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["of_floor"] = round(self.floor_ms / self.ms_per_step, 3) if self.floor_ms else None
        return d


def _floor_ms(cfg, batch: int, seq: int, elem: int, device: torch.device) -> float | None:
    """Weights and KV read once per step, or the step's FLOPs, whichever takes longer (H200 only)."""
    if device.type != "cuda" or "H200" not in torch.cuda.get_device_name(device):
        return None
    _, per_step = param_counts(cfg)
    kv = batch * seq * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * elem
    return 1e3 * max((per_step * elem + kv) / H200_BYTES_PER_S, 2 * per_step * batch / H200_FLOPS)


def _prompts(cfg, n: int, prompt_len: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    top = min(cfg.audio_bos_token_id, cfg.vocab_size) - 16
    return [rng.integers(0, top, prompt_len - 1).tolist() + [cfg.audio_bos_token_id] for _ in range(n)]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class RunResult:
    stats: LoopStats
    wall_s: float
    hits: int
    misses: int
    tokens: dict[str, np.ndarray]  # per request [frames, C]
    logprobs: dict[str, np.ndarray]

    @property
    def ms_per_step(self) -> float:
        steps = self.stats.step_ms
        return float(np.median(steps[min(5, len(steps) - 1):]))  # past the first steps (graph captures)


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


def run_requests(model, n_req: int, max_batch: int, frames: int, prompt_len: int, max_seq_len: int,
                 async_decode: bool, device: torch.device, fixed_shapes=None) -> RunResult:
    """n_req requests of exactly `frames` frames through the scheduler loop (graphs on CUDA)."""
    cfg = model.cfg
    kv = KVCache(cfg.num_hidden_layers, max_batch + 1, cfg.num_key_value_heads, max_seq_len, cfg.head_dim,
                 next(model.parameters()).dtype, device)
    engine = Engine(model, kv, device, fixed_shapes)
    if device.type == "cuda":
        engine.use_graphs()
    runner = HiggsRunner(engine, cfg, max_batch, max_seq_len, device)
    sched = Scheduler(max_batch, max_seq_len)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_new_frames=frames, min_new_frames=frames)
    reqs = [Request(rid=f"r{i}", prompt=ids, params=params, seed=1000 + i)
            for i, ids in enumerate(_prompts(cfg, n_req, prompt_len))]
    # as omni generate does before its first row: the graph captures (and a cold process's
    # kernel compiles) are startup, not part of the measured run
    warm_up_lm(runner, reqs[:max_batch], max_seq_len, async_decode)
    for r in reqs:
        sched.add(r)
    _sync(device)
    t0 = time.perf_counter()
    stats = run_loop(sched, runner, lambda rs: None, lambda rows, st: None, async_decode)
    wall = time.perf_counter() - t0
    return RunResult(stats, wall, runner.async_query_hit, runner.async_query_miss,
                     {r.rid: r.frames.array for r in reqs}, {r.rid: r.logprobs.array for r in reqs})


def _transformers(ref, cfg, batch, frames, prompt_len, device):
    ids = torch.tensor(_prompts(cfg, batch, prompt_len), device=device)
    _sync(device)
    t0 = time.perf_counter()
    # transformers as PyTorch runs it by default (our engine made cuBLASLt the process's BLAS)
    with torch.inference_mode(), blas_library("default"):
        out = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=frames, do_sample=True,
                           temperature=1.0, top_k=50, top_p=0.95)
    _sync(device)
    wall = time.perf_counter() - t0
    steps = out.shape[1]  # audio_sequences [B, frames generated, C]: it may stop before `frames`
    return 1e3 * wall / steps, wall, steps


def check_bench(shape: str, batches: list[int], frames: int, prompt_len: int, device: str, dtype: torch.dtype,
                peers) -> str:
    """The flags before anything is built (OmniError, exit 2); returns the device to run on. A real
    shape needs a GPU: on a machine without CUDA it is refused at once (its two random models, ours
    and transformers', would take most of the host's memory), and on --device cpu when the host's
    available memory cannot hold them."""
    from omni_cli.config import MAX_BATCH_SIZE
    from omni_cli.errors import OmniError
    from omni_cli.runners.device import host_available, pick_device
    from omni_cli.runners.sampling.params import INT_MAX

    try:
        cfg = shape_config(shape)
    except ValueError as e:
        raise OmniError(f"--shape: {e}") from None
    if not batches or not all(1 <= b <= MAX_BATCH_SIZE for b in batches):
        raise OmniError(f"--batch: each must be from 1 to {MAX_BATCH_SIZE}, got {batches}")
    if not 9 <= frames <= INT_MAX or not 2 <= prompt_len <= INT_MAX:
        raise OmniError(f"--frames must be >= 9 (the delay pattern's first frame of audio) and --prompt-len >= 2, "
                        f"got {frames} and {prompt_len}")
    where = pick_device(device)
    if shape == "tiny-higgs-audio-v2":
        return device
    cpu = "omni bench --shape tiny-higgs-audio-v2 --device cpu"
    if where.type != "cuda" and device != "cpu":
        raise OmniError(f"omni bench --shape {shape} needs a GPU and this machine has no CUDA device; "
                        f"on the CPU run `{cpu}`")
    total, _ = param_counts(cfg)
    elem = torch.finfo(dtype).bits // 8
    # both models are built in float32 (one then cast, the other beside it), then our KV cache
    need = total * (4 + elem) + max(batches) * (prompt_len + frames) * cfg.num_hidden_layers * \
        cfg.num_key_value_heads * cfg.head_dim * 2 * elem
    available = host_available()
    if where.type == "cpu" and available is not None and need > available:
        raise OmniError(f"omni bench --shape {shape} on the CPU needs about {need / 2**30:.0f} GiB (two models' "
                        f"weights and the KV cache) and {available / 2**30:.0f} GiB is available; run `{cpu}`, "
                        "or on a GPU")
    return device


def run_bench(shape: str, batches: list[int], frames: int, prompt_len: int, device: torch.device,
              dtype: torch.dtype, out_json: Path | None, plot: Path | None, peers=("sync", "async", "transformers")):
    max_seq = prompt_len + frames
    ref, model = random_model(shape, dtype, device, max_seq)
    cfg = model.cfg
    elem = torch.finfo(dtype).bits // 8
    run_requests(model, 2, 2, 12, prompt_len, max_seq, True, device)  # warm-up
    rows: list[BenchRow] = []
    for b in batches:
        floor = _floor_ms(cfg, b, prompt_len + frames // 2, elem, device)
        for peer in peers:
            if peer == "transformers":
                ms, wall, steps = _transformers(ref, cfg, b, frames, prompt_len, device)
            else:
                shapes = DETERMINISTIC_SHAPES[device.type] if peer == "deterministic" else None
                res = run_requests(model, b, b, frames, prompt_len, max_seq, peer != "sync", device, shapes)
                ms, wall, steps = res.ms_per_step, res.wall_s, frames
            # reverted audio: 8 frames of the delay ramp carry no sound
            rows.append(BenchRow(peer, b, ms, b * max(steps - 8, 0) * AUDIO_S_PER_FRAME / wall, floor))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    table = _table(rows)
    print(table)
    info = {"shape": shape, "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
            "dtype": str(dtype), "frames": frames, "prompt_len": prompt_len, "torch": torch.__version__,
            "rows": [r.as_dict() for r in rows]}
    if out_json:
        out_json.write_text(json.dumps(info, indent=2))
    if plot:
        _plot(rows, plot, shape, info["device"])
    return rows


def _table(rows: list[BenchRow]) -> str:
    lines = [f"{'peer':<13} {'batch':>5} {'ms/step':>9} {'audio-s/s':>10} {'floor ms':>9} {'of floor':>9}"]
    for r in rows:
        floor = f"{r.floor_ms:9.2f}" if r.floor_ms else f"{'-':>9}"
        frac = f"{r.floor_ms / r.ms_per_step:9.1%}" if r.floor_ms else f"{'-':>9}"
        lines.append(f"{r.peer:<13} {r.batch:>5} {r.ms_per_step:>9.2f} {r.audio_s_per_s:>10.2f} {floor} {frac}")
    return "\n".join(lines)


def _plot(rows: list[BenchRow], path: Path, shape: str, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for peer in dict.fromkeys(r.peer for r in rows):
        pts = [(r.batch, r.audio_s_per_s) for r in rows if r.peer == peer]
        ax.plot(*zip(*pts), marker="o", label=f"omni {peer}" if peer != "transformers" else "transformers generate")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("audio seconds per second")
    ax.set_title(f"{shape} on {device}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
