"""CUDA graphs of the decode step: one per row bucket (per key-length bucket without Triton),
and of small prefills: one per (rows, tokens) bucket.

An eager decode step of the 3B model launches ~900 kernels and is host-bound:
its launches take longer than its GPU work (BENCHMARKS.md, omni bench). A graph
replays the whole step with one launch: the forward and, given a ``post``
(the runner's logit processing, draw and publish), everything after it up to
the payload the host reads. Shapes must be static, so a step is padded to the
next row bucket (padding rows read and write the spare KV slot and the
runner's spare table slot that no request owns). With the Triton
decode-attention kernel (CUDA with Triton) each row's length is a graph input
and one graph serves every key length; without it a step attends over a
key-length bucket (positions at or past a row's length are masked), one graph
per bucket. The step's inputs are copied into the graph's static buffers; its
outputs are copied out before the next replay.

``capture=False`` runs the same padding and buffers eagerly: deterministic
mode decodes that way wherever graphs are not captured (the CPU), so the
bucketing logic runs, and is tested, where there is no GPU.
"""

from __future__ import annotations

import numpy as np
import torch

from .attention import AttentionContext, KVCache, fused_kernels_available, kv_bucket
from .device import CAPTURE_LOCK, role_stream
from .batch import ForwardBatch
from .kv_blocks import TILE_ROWS


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def warm_and_capture(fn, device: torch.device, pool):
    """fn run twice eagerly, then captured into a graph in ``pool`` -> (graph, what fn returned
    inside the capture: the graph's own tensors), all on the process's capture stream."""
    side = role_stream(device, "capture")
    side.wait_stream(torch.cuda.current_stream())
    # warm-up (kernel selection, workspaces) off the capture, on the stream that captures (its
    # cuBLAS workspace then exists). CAPTURE_LOCK: a kernel's first launch loads it, which may
    # synchronize the device: not while the codec thread captures
    with CAPTURE_LOCK, torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the codec thread keeps decoding audio on its own stream while this thread
    # captures (the default mode fails its CUDA calls); CAPTURE_LOCK: not while it captures
    with CAPTURE_LOCK, torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
        out = fn()
    return graph, out


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device, capture: bool,
                 fixed_rows: int | None = None):
        self.model, self.kv, self.device, self.capture = model, kv, device, capture
        self.fixed_rows = fixed_rows  # deterministic mode's chunks (the CPU): always this many rows
        self.kernel = fused_kernels_available(device)  # attention reads lengths, not a mask
        self._entries: dict[tuple, tuple] = {}  # (rows, keys, has post, post key, cascade) -> buffers, graph, outputs
        # steps may come with a cascade plan (runners/engine.py sets it): once a step has had one, a bucket's
        # first step builds both graphs, so the warm-up (whose widest step has the run's first rows) captures
        # the one with a plan too, whether or not that bucket's own rows share. NOTE: not before: in a run
        # with no plan, a captured cascade twin (a side-stream fork, cascade_attention.BESIDE) made every
        # plain step slower (BENCHMARKS.md, reference voices)
        self.cascade = False
        self._planned = False
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def buckets(self, rows: int, kv_len: int) -> tuple[int, int]:
        keys = 0 if self.kernel else kv_bucket(kv_len, self.kv.max_seq_len)  # 0: any length
        return self.fixed_rows or _next_pow2(rows), keys

    def _build(self, rows: int, k: int, deterministic: bool, inputs_like: dict[str, torch.Tensor], post,
               cascade: bool = False):
        """Static buffers and the padded forward; captured as a graph (with this `post`) when capturing.
        cascade: the step's rows in groups by shared prompt blocks (runners/cascade_attention.py), a plan
        copied in before each replay; the warm-up and capture run with no tiles."""
        pad_slot = self.kv.spare_slot
        st = {
            "slots": torch.full((rows,), pad_slot, dtype=torch.int64, device=self.device),
            "positions": torch.zeros(rows, 1, dtype=torch.int64, device=self.device),
            "steps": torch.zeros(rows, dtype=torch.int64, device=self.device),
        }
        groups = None
        if cascade:
            from .cascade_attention import CascadeInputs

            tiles = max(1, rows // 2)  # a group has g >= 2 rows in ceil(g / TILE_ROWS) <= g / 2 tiles
            groups = CascadeInputs(torch.zeros(rows, dtype=torch.int32, device=self.device),
                                   torch.full((tiles, TILE_ROWS), -1, dtype=torch.int32, device=self.device),
                                   torch.zeros(tiles, dtype=torch.int32, device=self.device))
        if self.kernel:
            st["lengths"] = torch.ones(rows, dtype=torch.int64, device=self.device)
        else:
            st["mask"] = torch.zeros(rows, 1, 1, k, dtype=torch.bool, device=self.device)
            st["mask"][..., 0] = True
        inputs = {name: torch.zeros((rows, *v.shape[1:]), dtype=v.dtype, device=self.device)
                  for name, v in inputs_like.items()}
        # the batch `post` sees: the static buffers; its host lists are empty on
        # purpose (a graph replays with other values: nothing host-side may be read)
        static_fb = ForwardBatch(is_prefill=False, rids=[""] * rows, slots_gpu=st["slots"], lengths_cpu=[],
                                 steps_cpu=[], steps_gpu=st["steps"], positions_gpu=st["positions"],
                                 model_inputs=inputs)

        def forward(post):
            attn = AttentionContext(kv=self.kv, is_prefill=False, slots_gpu=st["slots"], positions_gpu=st["positions"],
                                    mask_gpu=st.get("mask"), kv_len=k, deterministic=deterministic,
                                    lengths_gpu=st.get("lengths"), cascade=groups)
            logits = self.model.compute_logits(self.model(attn, **inputs)[:, 0], invariant=deterministic)
            return logits if post is None else post(static_fb, logits)

        st["cascade"] = groups
        if not self.capture:
            return st, inputs, forward, None
        # Warm-up and capture run with every row on the padding slot, so the
        # state `post` advances (per-slot tables) is touched for that slot only.
        graph, out = warm_and_capture(lambda: forward(post), self.device, self.pool)
        return st, inputs, graph, out

    def run(self, fb: ForwardBatch, deterministic: bool, post=None, post_key=None):
        """One padded decode step of fb's rows -> logits [rows, ...], or post's dict of
        [rows, ...] tensors (fresh tensors either way).

        Hazard: a graph replays the kernels ``post`` launched at capture, so post's
        work must depend only on ``post_key`` and on state outside the call.
        """
        n = fb.batch_size
        rows, k = self.buckets(n, max(fb.lengths_cpu))
        plan = fb.cascade_cpu if self.kernel else None
        # eager runs take this call's `post`; a graph keeps the one it was captured with
        key = (rows, k, post is not None, post_key if self.capture else None, plan is not None)
        self._planned = self._planned or plan is not None
        if key not in self._entries:
            self._entries[key] = self._build(rows, k, deterministic, fb.model_inputs, post, plan is not None)
            other = (*key[:-1], plan is None)
            if self._planned and self.cascade and self.kernel and rows > 1 and other not in self._entries:
                self._entries[other] = self._build(rows, k, deterministic, fb.model_inputs, post, plan is None)
        st, inputs, runner, out = self._entries[key]
        if plan is not None and st.get("plan") is not plan:  # a new plan only when the rows changed
            _copy_plan(plan, st["cascade"], n)
            st["plan"] = plan
        # padding rows [n, rows) are reset (a wider step may have left a real row there); at
        # n == rows, batch 1 always, that is no kernel at all (four fewer a step)
        st["slots"][n:] = self.kv.spare_slot
        st["slots"][:n] = fb.slots_gpu
        st["positions"][n:] = 0
        st["positions"][:n] = fb.positions_gpu
        st["steps"][n:] = 0
        st["steps"][:n] = fb.steps_gpu
        lens = torch.tensor(fb.lengths_cpu + [1] * (rows - n), dtype=torch.int64)  # padding rows: one key
        if self.kernel:
            st["lengths"].copy_(lens, non_blocking=True)
        else:
            st["mask"].copy_((torch.arange(k)[None, :] < lens[:, None])[:, None, None], non_blocking=True)
        for name, v in fb.model_inputs.items():
            inputs[name][n:] = 0
            inputs[name][:n] = v
        if out is None:  # eager (capture=False)
            out = runner(post)
        else:
            runner.replay()
        # clone: the next replay overwrites `out`
        if isinstance(out, dict):
            return {name: t[:n].clone() for name, t in out.items()}
        return out[:n].clone()


def _copy_plan(plan, dst, n: int) -> None:
    """A host plan (runners/kv_blocks.py: CascadePlan) of n rows into a graph's static CascadeInputs;
    padding rows and tiles past the plan's get none."""
    shared = np.zeros(dst.shared_gpu.shape[0], dtype=np.int32)
    shared[:n] = plan.shared
    tiles = len(plan.tile_len)
    tile_rows = np.full(tuple(dst.tile_rows_gpu.shape), -1, dtype=np.int32)
    tile_rows[:tiles] = plan.tile_rows
    tile_len = np.zeros(dst.tile_len_gpu.shape[0], dtype=np.int32)
    tile_len[:tiles] = plan.tile_len
    for host, gpu in zip((shared, tile_rows, tile_len), dst):
        gpu.copy_(torch.from_numpy(host), non_blocking=True)  # pageable: staged before the call returns


# A prefill replays a graph up to this many (padded) rows x tokens. Below it the
# eager fused prefill is host-bound, mostly launches, and a replay is several times
# faster; at 4,096 tokens the GPU work dominates (BENCHMARKS.md, prefill).
# Graphs share the decode graphs' memory pool.
PREFILL_GRAPH_TOKENS = 1024
_MIN_PREFILL_TOKENS = 16  # the smallest token bucket


class PrefillGraphs:
    """Graphs of the fused prefill of a few prompts, captured on first use per bucket.

    A batch is padded to a power-of-two number of rows (padding rows on the
    spare KV slot) and of tokens; like the eager prefill, every row runs
    positions 0..T-1 and writes their KV, which is exact for right-padded
    rows (runners/attention.py: attend_cached_causal). The bucket's T must fit
    the slot, and the model must accept the prompts for a graph
    (``model.prefill_graph_inputs``: a graph cannot route tokens by their
    values), or the prefill runs eagerly. Logits differ from the eager
    prefill's by bf16 rounding only: the padded shapes may pick other kernels.
    """

    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device, pool):
        self.model, self.kv, self.device, self.pool = model, kv, device, pool
        self._entries: dict[tuple[int, int], tuple] = {}  # (rows, tokens) -> buffers, graph, logits

    def _build(self, rows: int, t: int, extra: dict):
        # Hazard: every tensor the graph reads must outlive it (kept in the entry): one made
        # outside the capture and dropped after it goes back to the allocator, and a replay
        # then reads whatever reuses that memory (an illegal address on the device, seen).
        st = {"ids": torch.zeros(rows, t, dtype=torch.int64, device=self.device),
              "slots": torch.zeros(rows, dtype=torch.int64, device=self.device),
              "last": torch.zeros(rows, dtype=torch.int64, device=self.device),  # each row's last prompt token
              "positions": torch.arange(t, device=self.device).expand(rows, t)}

        def forward():
            attn = AttentionContext(kv=self.kv, is_prefill=True, slots_gpu=st["slots"], positions_gpu=st["positions"],
                                    mask_gpu=None, kv_len=t)
            hidden = self.model(attn, input_ids=st["ids"], **extra)  # [rows, T, H]
            return self.model.compute_logits(hidden[torch.arange(rows, device=self.device), st["last"]])

        st["slots"].fill_(self.kv.spare_slot)  # warm-up and capture write the spare slot only
        graph, logits = warm_and_capture(forward, self.device, self.pool)
        return st, graph, logits

    def run(self, fb: ForwardBatch) -> torch.Tensor | None:
        """Logits [B, ...] of each row's last prompt token, or None where this prefill runs eagerly."""
        n, longest = fb.batch_size, max(fb.lengths_cpu)
        rows, t = _next_pow2(n), min(max(_next_pow2(longest), _MIN_PREFILL_TOKENS), self.kv.max_seq_len)
        if rows * t > PREFILL_GRAPH_TOKENS or longest > t or len(fb.prompts_cpu) != n:
            return None
        extra = self.model.prefill_graph_inputs(fb.prompts_cpu)
        if extra is None:
            return None
        if (rows, t) not in self._entries:
            self._entries[(rows, t)] = self._build(rows, t, extra)
        st, graph, logits = self._entries[(rows, t)]
        st["ids"].zero_()
        st["ids"][:n, :longest] = fb.model_inputs["input_ids"]
        st["slots"][n:] = self.kv.spare_slot
        st["slots"][:n] = fb.slots_gpu
        last = torch.tensor([x - 1 for x in fb.lengths_cpu] + [0] * (rows - n), dtype=torch.int64)
        st["last"].copy_(last, non_blocking=True)
        graph.replay()
        return logits[:n].clone()  # the next replay overwrites `logits`
