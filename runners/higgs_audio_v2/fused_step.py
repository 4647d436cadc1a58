"""The delay pattern's logit masks and the step's publish as one Triton kernel each (CUDA only).

HiggsRunner.process_logits and .publish (runner.py) are ~30 small PyTorch
kernels a step: gathers of the slots' counters, comparisons, three
masked_fills over [B, C, V], scatters back. Inside the decode graph each
costs a launch and a wait for the one before, while the work is a few
hundred bytes a row. These kernels do the same arithmetic, in the same
order, one program per (row, codebook) and one per row, and shorten the
step at every batch size (BENCHMARKS.md, the delay masks and publish as one
kernel each). The PyTorch methods stay the definition (and
the CPU's path); tests/interpret_higgs_step.py holds these kernels to them.

Hazard: padding rows share one slot, so their counter updates race; that
slot's state is garbage either way (runners/cuda_graphs.py) and no real row
reads it. Within a program the counters are read by every warp before any
warp writes them back (a barrier): a warp that read a counter already
advanced masked its columns by the next step's ramp, which changed rows'
codes from run to run at 256 rows (BENCHMARKS.md, batch invariance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _delay_masks_kernel(logits_ptr, scores_ptr, slots_ptr, steps_ptr, min_new_ptr, bos_delay_ptr, eos_delay_ptr,
                        started_ptr, v, bos_id, eos_id, C: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    s = tl.load(slots_ptr + b)
    early = tl.load(steps_ptr + b) < tl.load(min_new_ptr + s)  # no stream-EOS before min_new_frames
    bos = tl.load(bos_delay_ptr + s * C + c)
    force_bos = bos >= 0  # the start ramp: stream-BOS only, then one step less
    eos = tl.load(eos_delay_ptr + s * C + c) - tl.load(started_ptr + s).to(tl.int64)
    force_eos = eos <= 0  # the staircase: stream-EOS only
    # NOTE: every warp loads these scalars itself; without the barrier a warp could read a counter
    # another warp already stored (its read-modify-write), so it masked by the next step's ramp
    tl.debug_barrier()
    tl.store(bos_delay_ptr + s * C + c, tl.where(force_bos, bos - 1, bos))
    tl.store(eos_delay_ptr + s * C + c, eos)
    cols = tl.arange(0, BLOCK_V)
    ok = cols < v
    row = (b * C + c).to(tl.int64) * v
    x = tl.load(logits_ptr + row + cols, mask=ok, other=0.0)
    ban = (early & (cols == eos_id)) | (force_bos & (cols != bos_id)) | (force_eos & (cols != eos_id))
    tl.store(scores_ptr + row + cols, tl.where(ban, float("-inf"), x), mask=ok)


@triton.jit
def _publish_kernel(tokens_ptr, logprobs_ptr, raw_ptr, slots_ptr, last_codes_ptr, started_ptr, payload_ptr, eos_id,
                    C: tl.constexpr, C_POW2: tl.constexpr, RAW: tl.constexpr):
    b = tl.program_id(0)
    s = tl.load(slots_ptr + b)
    c = tl.arange(0, C_POW2)
    ok = c < C
    t = tl.load(tokens_ptr + b * C + c, mask=ok, other=0)
    tl.store(last_codes_ptr + s * C + c, t, mask=ok)  # the next step's input stays on the device
    is_eos = (t == eos_id) & ok
    n_eos = tl.sum(is_eos.to(tl.int32), 0)
    started = tl.load(started_ptr + s)
    tl.store(started_ptr + s, started | (n_eos > 0))
    width: tl.constexpr = 3 * C + 1 if RAW else 2 * C + 1
    out = payload_ptr + b * width
    tl.store(out + c, t.to(tl.float32), mask=ok)
    tl.store(out + C + c, tl.load(logprobs_ptr + b * C + c, mask=ok, other=0.0), mask=ok)
    tl.store(out + 2 * C, (n_eos == C).to(tl.float32))  # the stop flag: every codebook at EOS
    if RAW:
        tl.store(out + 2 * C + 1 + c, tl.load(raw_ptr + b * C + c, mask=ok, other=0.0), mask=ok)


def delay_masks(logits: torch.Tensor, slots: torch.Tensor, steps: torch.Tensor, min_new_frames: torch.Tensor,
                bos_delay: torch.Tensor, eos_delay: torch.Tensor, delay_started: torch.Tensor, bos_id: int,
                eos_id: int) -> torch.Tensor:
    """HiggsRunner.process_logits: logits [B, C * V] float32 -> scores [B, C, V]; advances
    bos_delay and eos_delay [S, C] (int64) of the rows' slots in place. slots, steps [B] int64;
    min_new_frames [S] int64; delay_started [S] bool."""
    b, c = slots.shape[0], bos_delay.shape[1]
    v = logits.shape[1] // c
    scores = torch.empty((b, c, v), dtype=logits.dtype, device=logits.device)
    _delay_masks_kernel[(b, c)](logits.contiguous(), scores, slots, steps, min_new_frames, bos_delay, eos_delay,
                                delay_started, v, bos_id, eos_id, C=c, BLOCK_V=triton.next_power_of_2(v))
    return scores


def publish(tokens: torch.Tensor, logprobs: torch.Tensor, raw: torch.Tensor | None, slots: torch.Tensor,
            last_codes: torch.Tensor, delay_started: torch.Tensor, eos_id: int) -> torch.Tensor:
    """HiggsRunner.publish: tokens [B, C] int64, logprobs and raw [B, C] float32 -> the payload
    [B, 2C + 1 (+ C)] float32; writes last_codes [S, C] and ORs delay_started [S] in place."""
    b, c = tokens.shape
    payload = torch.empty((b, 3 * c + 1 if raw is not None else 2 * c + 1), dtype=torch.float32, device=tokens.device)
    _publish_kernel[(b,)](tokens.contiguous(), logprobs.contiguous(), raw.contiguous() if raw is not None else logprobs,
                          slots, last_codes, delay_started, payload, eos_id, C=c, C_POW2=triton.next_power_of_2(c),
                          RAW=raw is not None)
    return payload
