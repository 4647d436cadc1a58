"""The sampler: per-slot sampling state and a step's logit processing and draw, on the device.

Rows: a request contributes ``num_streams`` distributions per frame (Higgs: 8
codebooks), each over ``vocab_size`` entries. Per-request parameters live in
device tables indexed by KV slot, written once at prefill (``install``), so a
decode step gathers them with no host->device traffic beyond the slot indices.

``sample`` takes the model's processed scores (after its own masks, such as
Higgs' delay pattern) and runs the shared processing, in this order:
repetition penalty over each stream's earlier tokens, suppress tokens, the
seeded draw (temperature, top-k, top-p, min-p; ops.draw_rows, or on CUDA the
one-kernel fused_draw_rows), repetition-aware sampling (RAS) and the raw
logprobs. It may draw a subset of the streams, [first, first + n) of
``num_streams`` (one sub-step of an inner loop, such as a code predictor's
codebook groups): stream c of frame t is drawn at position
t * num_streams + c and written to the history at [slot, c, t], whatever the
subset, so drawing a frame in any partition of its streams gives the tokens
and logprobs of one full draw with the same scores. Every stream reads only its
own history, so the earlier sub-steps of a frame do not change the later ones.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..attention import fused_kernels_available
from ..device import upload
from .ops import apply_repetition_penalty, apply_suppress_tokens, draw_rows, ras_replace_mask, seeded_argmax
from .seeds import derive_seed

# per-slot sampling tables: name -> (dtype, value of a request)
SLOT_PARAMS = {
    "temperature": (torch.float32, lambda r: r.params.temperature),
    "top_k": (torch.int64, lambda r: r.params.top_k),
    "top_p": (torch.float32, lambda r: r.params.top_p),
    "min_p": (torch.float32, lambda r: r.params.min_p),
    "penalty": (torch.float32, lambda r: r.params.repetition_penalty),
    "ras_win_len": (torch.int64, lambda r: r.params.ras_win_len),
    "ras_max_repeat": (torch.int64, lambda r: r.params.ras_win_max_num_repeat),
    "min_new_frames": (torch.int64, lambda r: r.params.min_new_frames),
    "seed": (torch.int64, lambda r: r.seed),
    # RAS redraws use their own stream of noise, or a redraw would repeat the draw
    "ras_seed": (torch.int64, lambda r: derive_seed("omni-cli-ras", r.seed)),
}


@dataclass(frozen=True)
class SampleFlags:
    """The host-side choices of a step's sampling (they key the step's CUDA graph)."""

    penalty: bool  # some row has a repetition penalty
    suppress: bool  # some row suppresses tokens
    ras_window: int  # widest RAS window in the batch (0: no RAS)
    history: int  # frames of history the penalty scans

    @classmethod
    def of(cls, requests, steps_cpu: list[int], full_history: int | None) -> "SampleFlags":
        """full_history: scan every history position (a graph's shapes cannot follow the
        steps; unwritten positions hold -1 and count for nothing), else up to the batch's step."""
        penalty = any(r.params.repetition_penalty != 1.0 for r in requests)
        return cls(penalty=penalty, suppress=any(r.params.suppress_tokens for r in requests),
                   ras_window=max(r.params.ras_win_len for r in requests),
                   history=(full_history or max(max(steps_cpu), 1)) if penalty else 0)


class Drawn(NamedTuple):
    """A draw's results for streams [first, first + n) of B rows."""

    tokens: torch.Tensor  # [B, n] int64
    logprobs: torch.Tensor  # [B, n] float32, under the distribution drawn from
    raw: torch.Tensor | None  # [B, n] float32: the unprocessed model logprobs, with raw_logprobs


class Sampler:
    """Per-slot sampling state (parameter tables, suppress masks, token history) and the draw."""

    def __init__(self, num_slots: int, num_streams: int, vocab_size: int, max_seq_len: int, device: torch.device,
                 ras_excluded_tokens: tuple[int, ...] = (), raw_logprobs: bool = False, fused: bool | None = None,
                 invariant: bool = False):
        """num_slots: slots requests can own; the tables hold one more, the slot that padding
        rows of a graphed or fixed-shape step use (the engine's spare KV slot).
        ras_excluded_tokens: never counted as repeats (stream BOS/EOS). raw_logprobs: also
        report the unprocessed model logprobs. fused: the one-kernel Triton draw (default: on
        CUDA with Triton), else the PyTorch one. invariant: a row's draw the same whatever the
        rows beside it (deterministic mode; the PyTorch draw is already, row by row)."""
        self.num_streams, self.vocab_size, self.device = num_streams, vocab_size, device
        self.raw_logprobs = raw_logprobs
        s, c, v = num_slots + 1, num_streams, vocab_size
        self.slot_gpu = {name: torch.zeros(s, dtype=dt, device=device) for name, (dt, _) in SLOT_PARAMS.items()}
        self.suppress_gpu = torch.zeros(s, v, dtype=torch.bool, device=device)
        # every token sampled so far, per slot and stream; -1 = none yet
        self.history_gpu = torch.full((s, c, max_seq_len), -1, dtype=torch.int64, device=device)
        self.ras_excluded_gpu = torch.zeros(v, dtype=torch.bool, device=device)
        self.ras_excluded_gpu[list(ras_excluded_tokens)] = True
        self.draw_rows = draw_rows
        if fused_kernels_available(device) if fused is None else fused:
            from .fused_draw import fused_draw_rows

            self.draw_rows = functools.partial(fused_draw_rows, invariant=invariant)

    def install(self, slots_gpu: torch.Tensor, requests) -> None:
        """Write each new request's parameters into its slot's tables and clear its history
        (at prefill: one host->device copy per table)."""
        for name, (dtype, get) in SLOT_PARAMS.items():
            self.slot_gpu[name][slots_gpu] = upload([get(r) for r in requests], self.device, dtype)
        suppress = torch.zeros(len(requests), self.vocab_size, dtype=torch.bool)
        for i, r in enumerate(requests):
            suppress[i, list(r.params.suppress_tokens)] = True
        self.suppress_gpu[slots_gpu] = upload(suppress, self.device)
        # NOTE: index_fill_, not `[slots_gpu] = -1`: a Python scalar set through a device index is copied to the
        # device blocking, a stream sync that waits for the decode step launched beside this prefill
        self.history_gpu.index_fill_(0, slots_gpu, -1)

    def flags(self, requests, steps_cpu: list[int], graphed: bool = False) -> SampleFlags:
        """The step's SampleFlags; ``graphed``: the penalty scans the whole history (graph shapes are fixed)."""
        return SampleFlags.of(requests, steps_cpu, self.history_gpu.shape[-1] if graphed else None)

    def param(self, name: str, slots: torch.Tensor) -> torch.Tensor:
        return self.slot_gpu[name][slots]

    @torch.inference_mode()
    def sample(self, scores: torch.Tensor, logits: torch.Tensor, slots: torch.Tensor, steps: torch.Tensor,
               flags: SampleFlags, first: int = 0) -> Drawn:
        """Process and draw streams [first, first + n) of B rows, all on the device, no host sync.

        scores [B, n, V]: the model's processed scores of those streams; logits: their
        unprocessed model logits, B * n * V values in the same order (RAS redraws from
        them, raw logprobs report them); slots, steps [B] int64: each row's slot and the
        frame it samples. Writes the drawn tokens into the history at [slot, stream, step].
        ``first`` and n are host ints: a captured graph holds one sub-step's subset.
        """
        b, n, v = scores.shape
        rows = scores.reshape(b * n, v)
        if flags.penalty or flags.suppress or flags.ras_window:
            slot_rows = slots.repeat_interleave(n)  # [B*n]
        if flags.penalty:
            hist = self.history_gpu[slots, first: first + n, : flags.history].reshape(b * n, -1)
            rows = apply_repetition_penalty(rows, hist, self.param("penalty", slot_rows))
        if flags.suppress:
            rows = apply_suppress_tokens(rows, self.suppress_gpu[slot_rows])
        # the draw also writes each token into history_gpu at its row's step
        tokens, logprobs = self.draw_rows(rows, slots, steps, self.slot_gpu, n, self.history_gpu, first,
                                          self.num_streams)
        ras = flags.ras_window > 0
        # the unprocessed distribution: RAS redraws from it, raw_logprobs reports it
        raw = logits.reshape(b * n, v).float().log_softmax(dim=-1) if ras or self.raw_logprobs else None
        if ras:
            tokens, logprobs = self._ras(tokens, logprobs, raw, slots, steps, flags.ras_window, slot_rows, first, n)
        raw_lp = raw.gather(1, tokens[:, None]).view(b, n) if self.raw_logprobs else None
        return Drawn(tokens.view(b, n), logprobs.view(b, n), raw_lp)

    def _ras(self, tokens, logprobs, raw, slots, steps, w: int, slot_rows, first: int, n: int):
        """Repetition-aware sampling: redraw, from the unprocessed distribution (no
        temperature, no filters, as transformers' Higgs ``_sample``), any code that
        already occurs ras_win_max_num_repeat times among its stream's last
        ras_win_len frames. The redraw has its own seed stream, at the draw's
        positions; the history gets the final tokens. Rows: streams [first, first + n)."""
        c = self.num_streams  # w: the widest window in the batch (host-known)
        p = lambda name: self.param(name, slot_rows)  # noqa: E731
        offsets = torch.arange(-w, 0, device=self.device)  # [w]: frames -w .. -1
        steps_r = steps.repeat_interleave(n)  # [R]
        frame = steps_r[:, None] + offsets[None, :]  # [R, w]
        valid = (frame >= 0) & (offsets[None, :] >= -p("ras_win_len")[:, None])
        stream = torch.arange(first, first + n, device=self.device).repeat(slots.shape[0])  # [R]: absolute index
        window = self.history_gpu[slot_rows[:, None], stream[:, None], frame.clamp(min=0)]  # [R, w]
        redo = ras_replace_mask(window, valid, tokens, self.ras_excluded_gpu, p("ras_max_repeat"))
        redo &= p("ras_win_len") > 0
        redraw = seeded_argmax(raw, p("ras_seed"), steps_r * c + stream)
        tokens = torch.where(redo, redraw, tokens)
        logprobs = torch.where(redo, raw.gather(1, redraw[:, None])[:, 0], logprobs)
        self.history_gpu[slots, first: first + n, steps] = tokens.view(-1, n)
        return tokens, logprobs
