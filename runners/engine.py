"""The engine (the seed's ``tp_worker`` role): model weights, KV cache, forward.

Its interface is deliberately narrow, so another backend can stand in for it:
  build_forward_batch(scheduler_output) -> ForwardBatch | None
  forward(forward_batch, post=None, post_key=None) -> logits of each row's
      last position [B, ...], or for a decode step post(batch, logits)'s
      outputs, run inside the step's CUDA graph where graphs are captured
  captures_graphs() -> bool
The runner decides what goes in ``forward_batch.model_inputs`` (through its
hooks) and what ``post`` does (sampling); the engine decides how attention,
the KV cache and graph capture work.

What the engine needs of a model (a family's nn.Module), and nothing more:
  model(attn: AttentionContext, **model_inputs) -> hidden [B, T, H]
      prefill: model_inputs holds input_ids [B, T], and prompt_codes
      [B, T, streams] where a prompt has audio spans (zeros off the spans);
      decode: whatever the
      runner's before_decode put there (Higgs: audio_codes [B, 1, C])
  model.compute_logits(hidden [B, H], invariant=False) -> logits [B, ...]
      (invariant: a row's bits whatever B; deterministic decode asks for it)
  model.prefill_graph_inputs(prompts content) -> dict | None: the extra
      keyword arguments a CUDA-graphed prefill of these prompts passes, the
      same for every prompt it accepts; None keeps that prefill eager
  model.prefill_inputs(prompts content, start, t, device) -> dict (optional):
      extra keyword arguments of an eager prefill of positions start..start+t-1,
      known on the host (Higgs: the tokens' routing, which it would otherwise
      read back from the device)

Deterministic mode makes each row's arithmetic independent of its batch-mates
and of the batch size, so outputs are byte-identical however rows are
batched. cuBLAS and PyTorch's kernels pick their blocking (and so their
rounding) from the shapes they see, so where they run every shape is fixed
(FixedShapes), and attention is pinned to a kernel measured to be bit-stable
(see AttentionContext.deterministic). Prefill pads each prompt to a length
bucket that depends on its own length only and runs chunks of a fixed number
of prompts of one bucket. Decode on CUDA runs the whole step at once on
batch-invariant kernels (the model's decode with ctx.deterministic, and
compute_logits(invariant=True)); elsewhere it runs chunks of a fixed number
of rows, with attention over fixed key blocks whose masked tail is an exact
no-op, so the key-length bucket may follow the batch. Padding rows use a
spare KV slot that no request owns.

Shared prompt prefixes (runners/kv_blocks.py): with a block pool, a row admitted
with the first P positions of its prompt already in cached blocks (its block
table points at them) runs only positions P.. of its prompt. Rows of one
prefill may depend on each other: a row that reuses blocks another row of the
same prefill computes (at a smaller P) runs after it; rows of one P run as one
forward, in order of P. Every key a query sees is the one the row's own
whole prefill would have written, up to the rounding of a different batch
shape; deterministic mode shares nothing (its pool hands out fresh blocks only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionContext, KVCache
from .batch import ForwardBatch
from .kv_blocks import BlockPool, cascade_plan
from .cuda_graphs import DecodeGraphs, PrefillGraphs
from .device import upload, use_engine_blas

__all__ = ["DETERMINISTIC_SHAPES", "Engine", "FixedShapes", "ForwardBatch"]


@dataclass(frozen=True)
class FixedShapes:
    """The shapes deterministic mode runs at (constants per device type)."""

    decode_rows: int | None  # rows per decode forward; None: the whole step (batch-invariant kernels)
    prefill_rows: int  # prompts per prefill forward
    prefill_bucket: int  # prompts are padded to a multiple of this many tokens


# Deterministic mode's shapes: constants per device type, so results do not depend on
# --max-batch-size. On CUDA decode runs every row in one step on batch-invariant kernels
# (runners/higgs_audio_v2/invariant_step.py); 32 prompts a prefill keep the eager prefill's
# launches amortised. On the CPU the GEMMs' row tiles have remainder paths, so every row and
# prompt goes alone.
DETERMINISTIC_SHAPES = {"cuda": FixedShapes(decode_rows=None, prefill_rows=32, prefill_bucket=64),
                        "cpu": FixedShapes(decode_rows=1, prefill_rows=1, prefill_bucket=1)}


class Engine:
    def __init__(self, model: torch.nn.Module, kv: KVCache, device: torch.device,
                 fixed_shapes: FixedShapes | None = None, blocks: BlockPool | None = None):
        self.model = model
        self.kv = kv  # one slot more than requests can own (the padding rows' slot)
        # the paged cache's host side (the scheduler admits through it; None: one block a slot, and
        # whoever builds the batches places the rows)
        self.blocks = blocks
        self.device = device
        use_engine_blas(device)  # process-wide (runners/device.py)
        self.fixed_shapes = fixed_shapes  # None: default mode (shapes follow the batch)
        # padded decode (runners/cuda_graphs.py): deterministic mode always
        # decodes through it; use_graphs() makes it replay CUDA graphs
        self.graphs = None
        self.prefill_graphs = None  # small prefills replay graphs too (default mode, with use_graphs())
        # decode steps plan cascade attention (runners/cascade_attention.py): rows sharing prompt blocks,
        # on the attention kernel, in the default mode (use_graphs sets it)
        self.cascade = False
        self._plan: tuple[tuple, object] | None = None  # (the tables' version and the step's slots, its plan)
        if fixed_shapes is not None:
            self.use_graphs(capture=False)

    def use_graphs(self, capture: bool = True) -> None:
        """Decode through DecodeGraphs (CUDA graphs when capture; the same padding eagerly otherwise)."""
        shapes = self.fixed_shapes
        self.graphs = DecodeGraphs(self.model, self.kv, self.device, capture,
                                   fixed_rows=shapes.decode_rows if shapes else None)
        if capture and shapes is None:  # deterministic prefill keeps its fixed shapes
            self.prefill_graphs = PrefillGraphs(self.model, self.kv, self.device, self.graphs.pool)
        self.cascade = self.graphs.kernel and shapes is None and self.blocks is not None and self.blocks.share
        self.graphs.cascade = self.cascade

    @property
    def deterministic(self) -> bool:
        return self.fixed_shapes is not None

    def _tensor(self, data, dtype=torch.int64, pin: bool = False) -> torch.Tensor:
        """Host data -> device, int64 unless told (runners/device.py: upload; pin: a prefill's inputs)."""
        return upload(data, self.device, dtype, pin)

    def build_forward_batch(self, scheduler_output) -> ForwardBatch | None:
        reqs = scheduler_output.requests
        if not reqs:
            return None
        slots = [r.slot for r in reqs]
        if scheduler_output.is_prefill:
            lens = [len(r.prompt) for r in reqs]
            t = max(lens)
            ids = [r.prompt.ids + [0] * (t - len(r.prompt)) for r in reqs]
            positions = [list(range(t)) for _ in reqs]
            model_inputs = {"input_ids": self._tensor(ids, pin=True)}
            if any(r.prompt.audio for r in reqs):
                model_inputs["prompt_codes"] = self._tensor(_prompt_codes([r.prompt for r in reqs], t), pin=True)
            prompts = [r.prompt.content for r in reqs]  # compared by content: audio codes included
            cached, tables = [], []
            if self.blocks is not None:  # each row's blocks (some cached: its prompt runs from there)
                if any(r.blocks is None for r in reqs):
                    raise RuntimeError("a request without KV blocks: admit it through the runner's block pool "
                                       "(omni_cli/scheduler.py: Scheduler.for_runner)")
                tables = [r.blocks.table for r in reqs]
                cached = [r.blocks.cached for r in reqs]
                self.kv.assign(slots, tables)
        else:
            cached, tables = [], []
            # frame s-1 is fed at position prompt_len + s - 1 to sample frame s
            pos = [len(r.prompt) + s - 1 for r, s in zip(reqs, scheduler_output.steps)]
            lens = [p + 1 for p in pos]
            positions = [[p] for p in pos]
            model_inputs, prompts = {}, []
        cascade = None if scheduler_output.is_prefill or not self.cascade else self._cascade_plan(reqs, slots)
        steps = list(scheduler_output.steps)
        return ForwardBatch(
            is_prefill=scheduler_output.is_prefill,
            rids=[r.rid for r in reqs],
            slots_gpu=self._tensor(slots),
            lengths_cpu=lens,
            steps_cpu=steps,
            steps_gpu=self._tensor(steps),
            positions_gpu=self._tensor(positions, pin=scheduler_output.is_prefill),
            model_inputs=model_inputs,
            prompts_cpu=prompts,
            slots_cpu=slots,
            cached_cpu=cached,
            tables_cpu=tables,
            cascade_cpu=cascade,
        )

    def _cascade_plan(self, reqs, slots: list[int]):
        """The decode step's groups by shared prompt blocks: planned again only when the rows or the
        tables changed (an admission assigns tables), else the last plan (the same object)."""
        key = (self.kv.assigned, tuple(slots))
        if self._plan is None or self._plan[0] != key:
            shareable = [len(r.blocks.hashes) if r.blocks is not None else 0 for r in reqs]
            self._plan = (key, cascade_plan(self.kv.table_host, slots, shareable, self.kv.block_size))
        return self._plan[1]

    def _batch_attention(self, fb: ForwardBatch, prefix: int = 0) -> AttentionContext:
        """The default path's attention: the batch as it is, keys up to its longest row
        (a prefill's queries from position ``prefix`` on, the keys before it in the cache).
        Its mask is built only if attention asks for it."""
        k = max(fb.lengths_cpu)

        def mask() -> torch.Tensor:
            ar = torch.arange(k)
            valid = ar[None, :] < torch.tensor(fb.lengths_cpu)[:, None]  # [B, K]: never onto right padding
            if fb.is_prefill:
                m = (ar[prefix:, None] >= ar[None, :])[None] & valid[:, None, :]  # [B, T, K], causal
            else:
                m = valid[:, None, :]  # [B, 1, K]
            return m[:, None].to(self.device, non_blocking=True)

        return AttentionContext(kv=self.kv, is_prefill=fb.is_prefill, slots_gpu=fb.slots_gpu,
                                positions_gpu=fb.positions_gpu[:, prefix:], mask_gpu=None, kv_len=k, mask_fn=mask,
                                prefix_len=prefix)

    def captures_graphs(self) -> bool:
        """Decode steps replay CUDA graphs (a ``post`` given to forward runs inside them)."""
        return self.graphs is not None and self.graphs.capture

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, post=None, post_key=None):
        """Logits of each row's last position [B, ...]; for a decode step with ``post``,
        post(batch, logits) -> dict of [rows, ...] tensors, returned instead (inside the
        step's graph where graphs are captured; ``post_key`` says which graph)."""
        if self.graphs is not None and not fb.is_prefill:
            rows = self.graphs.fixed_rows
            if rows is None:  # the whole step at once (its cascade plan with it)
                return self.graphs.run(fb, self.deterministic, post, post_key)
            outs = [self.graphs.run(fb.rows(i, i + rows), self.deterministic, post, post_key)
                    for i in range(0, fb.batch_size, rows)]
            if post is None:
                return torch.cat(outs)
            return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}
        if self.deterministic:  # prefill; decode went through self.graphs above
            return self._prefill_fixed(fb)
        if fb.is_prefill and any(fb.cached_cpu):
            parts = self._prefill_parts(fb)
            outs = torch.cat([self._prefill(fb.select(rows), start) for rows, start in parts])
            logits = torch.empty_like(outs)
            logits[self._tensor([i for rows, _ in parts for i in rows])] = outs  # back in the batch's row order
            return logits if post is None else post(fb, logits)
        if fb.is_prefill:
            return self._prefill(fb, 0, post)
        hidden = self.model(self._batch_attention(fb), **fb.model_inputs)[:, 0]  # [B, H]
        logits = self.model.compute_logits(hidden)
        return logits if post is None else post(fb, logits)

    def _prefill(self, fb: ForwardBatch, start: int, post=None) -> torch.Tensor:
        """Logits of each row's last prompt position, running positions start.. of every row (the
        ones before in the cache already): a graph replay where one fits, else eagerly."""
        if not start and self.prefill_graphs is not None:
            logits = self.prefill_graphs.run(fb)
            if logits is not None:
                return logits if post is None else post(fb, logits)
        inputs = {k: v[:, start:] for k, v in fb.model_inputs.items()}
        known = getattr(self.model, "prefill_inputs", None)
        if known is not None and len(fb.prompts_cpu) == fb.batch_size:
            inputs.update(known(fb.prompts_cpu, start, inputs["input_ids"].shape[1], self.device))
        hidden = self.model(self._batch_attention(fb, start), **inputs)  # [B, T - start, H]
        last = self._tensor([n - 1 - start for n in fb.lengths_cpu])
        logits = self.model.compute_logits(hidden[torch.arange(fb.batch_size, device=hidden.device), last])
        return logits if post is None else post(fb, logits)

    def _prefill_parts(self, fb: ForwardBatch) -> list[tuple[list[int], int]]:
        """A prefill whose rows reuse cached blocks, as forwards in the order they must run: (rows,
        their first uncached position), by that position ascending. A row writes positions from its
        start on and reads cached blocks below it, so a block it reads that another row of this
        prefill writes (both admitted together: the first computes a voice, the rest reuse it) comes
        from a row of a smaller start, whose forward runs first; rows of one start never read each
        other's blocks (whole blocks are cached), so they run as one forward."""
        parts: dict[int, list[int]] = {}
        for i, start in enumerate(fb.cached_cpu):
            parts.setdefault(start, []).append(i)
        return sorted(((rows, start) for start, rows in parts.items()), key=lambda part: part[1])

    def _prefill_fixed(self, fb: ForwardBatch) -> torch.Tensor:
        """Prompts grouped by length bucket, in chunks of exactly `prefill_rows` rows of bucket length."""
        shapes, dev = self.fixed_shapes, self.device
        rows = shapes.prefill_rows
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(fb.lengths_cpu):  # the bucket depends on the prompt's own length only
            t = min(-(-n // shapes.prefill_bucket) * shapes.prefill_bucket, self.kv.max_seq_len)
            groups.setdefault(t, []).append(i)
        out: list[torch.Tensor | None] = [None] * fb.batch_size
        for t, members in groups.items():
            ar = torch.arange(t)
            for start in range(0, len(members), rows):
                chunk = members[start: start + rows]
                pad = rows - len(chunk)
                lens = [fb.lengths_cpu[i] for i in chunk] + [1] * pad
                idx = torch.tensor(chunk, device=dev)
                valid = ar[None, :] < torch.tensor(lens)[:, None]
                mask = ((ar[None, :, None] >= ar[None, None, :]) & valid[:, None, :])[:, None].to(dev)
                attn = AttentionContext(
                    kv=self.kv, is_prefill=True,
                    slots_gpu=torch.cat([fb.slots_gpu[idx], torch.full((pad,), self.kv.spare_slot, device=dev)]),
                    positions_gpu=ar.expand(rows, t).to(dev), mask_gpu=mask, kv_len=t, deterministic=True)
                inputs = {}
                for name, v in fb.model_inputs.items():
                    x = v.new_zeros((rows, t, *v.shape[2:]))
                    w = min(t, v.shape[1])
                    x[: len(chunk), :w] = v[idx, :w]
                    inputs[name] = x
                hidden = self.model(attn, **inputs)
                last = hidden[torch.arange(rows, device=dev), torch.tensor(lens, device=dev) - 1]
                logits = self.model.compute_logits(last)  # the head at the fixed shape too
                for j, i in enumerate(chunk):
                    out[i] = logits[j]
        return torch.stack(out)


def _prompt_codes(prompts: list, t: int) -> np.ndarray:
    """Each prompt's audio spans laid out at their positions: [B, t, streams] int64, zeros elsewhere."""
    streams = next(span.codes.shape[1] for p in prompts for span in p.audio)
    out = np.zeros((len(prompts), t, streams), dtype=np.int64)
    for i, p in enumerate(prompts):
        for span in p.audio:
            out[i, span.start: span.start + len(span.codes)] = span.codes
    return out
