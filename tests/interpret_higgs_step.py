"""Higgs Audio v2's fused delay masks and publish (runners/higgs_audio_v2/fused_step.py) in Triton's
CPU interpreter, against the runner's PyTorch methods, which define them.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1.
Rows on distinct slots in a shuffled order, with counters on both sides of
every threshold (start ramp on and off, staircase reached or not, delay
started or not, before and after min_new_frames); tokens with no, some and
all but one and all codebooks at stream-EOS; the payload with and without raw logprobs.
Scores, payloads and every counter must be equal, bit for bit.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from omni_cli.runners.higgs_audio_v2.fused_step import delay_masks, publish
from omni_cli.runners.higgs_audio_v2.runner import HiggsRunner

C, V, BOS, EOS, SLOTS = 8, 1026, 1024, 1025, 12  # the real codebook count and vocabulary


def _state(g: torch.Generator) -> SimpleNamespace:
    """What HiggsRunner.process_logits and .publish read and write, random."""
    cols = torch.arange(V)
    return SimpleNamespace(
        num_streams=C, vocab_size=V, _fused=False,
        cfg=SimpleNamespace(audio_stream_bos_id=BOS, audio_stream_eos_id=EOS),
        slot_gpu={"min_new_frames": torch.randint(0, 6, (SLOTS,), generator=g)},
        bos_delay_gpu=torch.randint(-3, 4, (SLOTS, C), generator=g),
        eos_delay_gpu=torch.randint(-2, 9, (SLOTS, C), generator=g),
        delay_started_gpu=torch.rand(SLOTS, generator=g) < 0.5,
        last_codes_gpu=torch.randint(0, V, (SLOTS, C), generator=g),
        _not_bos_gpu=cols != BOS, _not_eos_gpu=cols != EOS)


def _copy(st: SimpleNamespace) -> SimpleNamespace:
    fields = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in vars(st).items()}
    return SimpleNamespace(**{**fields, "slot_gpu": {k: v.clone() for k, v in st.slot_gpu.items()}})


def _same(a: SimpleNamespace, b: SimpleNamespace) -> list[str]:
    names = ("bos_delay_gpu", "eos_delay_gpu", "delay_started_gpu", "last_codes_gpu")
    return [name for name in names if not torch.equal(getattr(a, name), getattr(b, name))]


def main() -> int:
    from tests.interpret_decode_attention import _patch_interpreter_calls

    _patch_interpreter_calls()
    g = torch.Generator().manual_seed(0)
    failures = []
    for trial in range(4):
        st = _state(g)
        b = 7
        slots = torch.randperm(SLOTS, generator=g)[:b]
        fb = SimpleNamespace(slots_gpu=slots, steps_gpu=torch.randint(0, 8, (b,), generator=g), batch_size=b)
        logits = torch.randn(b, C * V, generator=g)
        ref, got = _copy(st), _copy(st)
        want = HiggsRunner.process_logits(ref, logits, fb, None)
        out = delay_masks(logits, slots, fb.steps_gpu, got.slot_gpu["min_new_frames"], got.bos_delay_gpu,
                          got.eos_delay_gpu, got.delay_started_gpu, BOS, EOS)
        if not torch.equal(out, want):
            failures.append(f"trial {trial}: delay-masked scores differ")
        failures += [f"trial {trial}: {name} after the masks" for name in _same(ref, got)]

        tokens = torch.randint(0, V, (b, C), generator=g)
        tokens[0] = EOS  # every codebook: the stop flag
        tokens[1, 3] = EOS  # one codebook: the delay starts
        tokens[2, 1:] = EOS  # all but one: no stop
        lp, raw = -torch.rand(b, C, generator=g), -torch.rand(b, C, generator=g)
        for r in (None, raw):
            ref, got = _copy(st), _copy(st)
            result = SimpleNamespace(next_token_ids_gpu=tokens, logprobs_gpu=lp, raw_logprobs_gpu=r)
            want = HiggsRunner.publish(ref, result, fb)
            out = publish(tokens, lp, r, slots, got.last_codes_gpu, got.delay_started_gpu, EOS)
            tag = f"trial {trial}, raw {'on' if r is not None else 'off'}"
            if not torch.equal(out, want):
                failures.append(f"{tag}: payload differs")
            failures += [f"{tag}: {name} after publish" for name in _same(ref, got)]
    print("\n".join(failures) or "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
