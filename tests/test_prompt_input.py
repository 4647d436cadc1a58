"""Prompts as ids plus audio codes (runners/prompt_input.py): what the engine compares is the
content, so two rows whose ids agree but whose audio differs never share a prefix's KV."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_cli.runners.attention import KVCache
from omni_cli.runners.engine import Engine, shared_prefix
from omni_cli.runners.prompt_input import AudioSpan, PromptInput
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, SchedulerOutput

IDS = [5, 6, 7, 9, 9, 9, 9, 8, 3]  # positions 3..6: an audio span's placeholders


def _codes(seed: int, frames: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, (frames, 8))


def test_different_audio_behind_equal_ids_shares_only_the_text_before_it():
    a = PromptInput(IDS, (AudioSpan(3, _codes(0)),))
    b = PromptInput(IDS, (AudioSpan(3, _codes(1)),))
    assert a.ids == b.ids
    assert shared_prefix([a.ids, b.ids]) == len(IDS) - 1  # by ids alone they would share all but the last
    assert shared_prefix([a.content, b.content]) == 3


def test_audio_that_differs_in_one_frame_shares_up_to_that_frame():
    codes = _codes(0)
    later = codes.copy()
    later[2, 5] = (later[2, 5] + 1) % 1024
    a, b = PromptInput(IDS, (AudioSpan(3, codes),)), PromptInput(IDS, (AudioSpan(3, later),))
    assert shared_prefix([a.content, b.content]) == 3 + 2


def test_equal_audio_shares_like_equal_text():
    a, b = (PromptInput(IDS, (AudioSpan(3, _codes(0)),)) for _ in range(2))
    assert a.content == b.content and shared_prefix([a.content, b.content]) == len(IDS) - 1
    assert all(k < 0 for k in a.content[3:7]) and a.content[:3] == IDS[:3] and a.content[7:] == IDS[7:]


def test_text_only_content_is_the_ids_and_a_span_must_fit():
    assert PromptInput(IDS).content == IDS
    with pytest.raises(ValueError, match="outside"):
        PromptInput(IDS, (AudioSpan(7, _codes(0)),))


def test_the_engine_compares_prompts_by_content():
    """build_forward_batch hands prefix sharing each row's content, not its ids."""
    kv = KVCache(1, 3, 1, 32, 4, torch.float32, torch.device("cpu"))
    engine = Engine(torch.nn.Identity(), kv, torch.device("cpu"))
    reqs = [Request(rid=f"r{i}", prompt=PromptInput(IDS, (AudioSpan(3, _codes(i)),)), params=SamplingParams(),
                    seed=0) for i in range(2)]
    for slot, r in enumerate(reqs):
        r.slot = slot
    fb = engine.build_forward_batch(SchedulerOutput(is_prefill=True, requests=reqs, steps=[0, 0]))
    assert fb.model_inputs["input_ids"].tolist() == [IDS, IDS]
    assert fb.prompts_cpu == [r.prompt.content for r in reqs] and shared_prefix(fb.prompts_cpu) == 3
