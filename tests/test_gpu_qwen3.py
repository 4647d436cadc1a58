"""Qwen3-TTS on CUDA (issue 44): the decode step (talker step and 15 predictor sub-steps) replays
as a CUDA graph, and gives, in float32, the reference's greedy codes for the golden cases; async
decode writes what sync does. Skipped where there is no CUDA device (CI)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tests.conftest import read_manifest, run_cli, write_jsonl
from tests.qwen3_reference import arrays, cases, golden_row, model_yaml

pytestmark = pytest.mark.gpu


def test_graphed_float32_decode_gives_the_reference_codes(tmp_path):
    """Every golden case, several rows a step through graphed decode steps (default mode, greedy at
    both levels): the reference's codes, except where the reference's own margin is within float32
    rounding of a different arithmetic order (reported, not hidden)."""
    from omni_cli.runners.qwen3_tts.family import Qwen3TTS

    captured = []
    real = Qwen3TTS.load.__func__

    def load(cls, spec):
        family = real(cls, spec)
        captured.append(family.runner.engine.captures_graphs())
        return family

    Qwen3TTS.load = classmethod(load)
    try:
        differing = []
        for kind in ("custom_voice", "voice_design", "base"):
            chosen = [c for c in cases() if c["ckpt"] == kind]
            prompts = write_jsonl(tmp_path / f"{kind}.jsonl", [golden_row(c) for c in chosen])
            out = tmp_path / kind
            res = run_cli("generate", prompts, "-o", out, "--model", model_yaml(tmp_path, kind, device="cuda"), "-q", "--temperature",
                          "0", "--subtalker-temperature", "0", "--max-new-frames", "15", "--max-batch-size", "4")
            assert res.exit_code == 0, res.output
            for c in chosen:
                tokens = np.load(out / f"logprobs/{c['name']}.npz")["tokens"]
                want = arrays(c["name"])["codes"]
                if tokens.shape != want.shape or not np.array_equal(tokens, want):
                    differing.append((c["name"], c["min_talker_margin"], c["min_cp_margin"]))
    finally:
        Qwen3TTS.load = classmethod(real)
    assert captured and all(captured)  # the decode steps replayed graphs
    assert not differing, differing


def test_async_writes_what_sync_writes_on_cuda_bf16(tmp_path):
    rows = [{"id": f"r{i}", "text": t, "language": "English", "instruct": "A calm voice."}
            for i, t in enumerate(["Hello there.", "A longer sentence than the first one.", "Yes.", "Goodbye."])]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    got = {}
    for mode in ("--async-decode", "--no-async-decode"):
        out = tmp_path / mode
        res = run_cli("generate", prompts, "-o", out, "--model", model_yaml(tmp_path, "voice_design", "bfloat16", "cuda"), "-q",
                      "--seed", "3", "--max-new-frames", "30", "--max-batch-size", "4", mode)
        assert res.exit_code == 0, res.output
        got[mode] = {m["id"]: np.load(out / m["logprobs_file"])["tokens"] for m in read_manifest(out)}
        got[mode + "wav"] = {m["id"]: hashlib.sha256((out / m["file_name"]).read_bytes()).hexdigest()
                             for m in read_manifest(out)}
    for rid, tokens in got["--no-async-decode"].items():
        np.testing.assert_array_equal(got["--async-decode"][rid], tokens, err_msg=rid)
    assert got["--async-decode" + "wav"] == got["--no-async-decode" + "wav"]


def _fused_pair(**dims):
    """A random talker at these widths on CUDA twice: the plain modules, and the fused kernels."""
    import copy

    import torch

    from omni_cli.runners.qwen3_tts.talker import Talker
    from tests.interpret_qwen3_decode import tiny_config

    cfg = tiny_config(**dims)
    torch.manual_seed(0)
    plain = Talker(cfg, 64).eval()
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand_like(p) + 0.5)
    fused = copy.deepcopy(plain).to_runtime(torch.device("cuda"), torch.float32)
    assert fused.fused and not plain.fused
    return cfg, plain.to("cuda"), fused


RELEASE_HEADS = dict(hidden=1024, inter=3072, heads=16, kv_heads=8, head_dim=128, cp_hidden=1024, cp_inter=3072,
                     cp_layers=2)


@pytest.mark.parametrize("rows, deterministic", [([0, 1, 2], False), ([1], False), ([0, 1, 2], True)])
def test_fused_talker_step_matches_the_plain_modules(rows, deterministic):
    """The compiled kernels (GEMVs, q/k-norm rope, decode attention, fused_mm, invariant_mm) at the
    release's head shapes, float32: the talker's logits and hidden within TF32-level rounding of
    the plain modules'."""
    import torch

    from tests.interpret_qwen3_decode import talker_logits

    cfg, plain, fused = _fused_pair(**RELEASE_HEADS)
    worst, _ = talker_logits(plain, fused, cfg, rows, deterministic, torch.device("cuda"))
    assert worst < 2e-3


def test_fused_predictor_frame_matches_and_is_batch_invariant():
    """A frame of the predictor on each kernel set gives the plain frame's greedy codes; in
    deterministic mode a row's sub-step logits are the same bits alone as among three, and so are
    the talker's outputs."""
    import torch

    from tests.interpret_qwen3_decode import predictor_frame, talker_logits

    cfg, plain, fused = _fused_pair(**RELEASE_HEADS)
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(3, cfg.talker.hidden_size, generator=g).cuda()
    code0 = torch.randint(0, cfg.code_vocab, (3,), generator=g).cuda()
    want, _ = predictor_frame(plain, hidden, code0, False)
    for h, c, inv, part in ((hidden, code0, False, slice(None)), (hidden[1:2], code0[1:2], False, slice(1, 2)),
                            (hidden, code0, True, slice(None))):
        codes, _ = predictor_frame(fused, h, c, inv)
        assert torch.equal(codes, want[part])
    _, alone = predictor_frame(fused, hidden[1:2], code0[1:2], True)
    _, among = predictor_frame(fused, hidden, code0, True)
    assert torch.equal(alone[:, 0], among[:, 1])
    _, one = talker_logits(plain, fused, cfg, [1], True, torch.device("cuda"))
    _, three = talker_logits(plain, fused, cfg, [0, 1, 2], True, torch.device("cuda"))
    assert torch.equal(one[:, 0], three[:, 1])


def test_deterministic_bf16_rows_identical_across_batch_sizes_and_async(tmp_path):
    """--deterministic in bf16 on CUDA: every row's codes, logprobs and wav bytes are the same at
    --max-batch-size 1, 3 and 8, sync and async."""
    texts = ["Hello there.", "A longer sentence than the first one, with a clause.", "Yes.", "Goodbye now.",
             "Numbers: one, two, three.", "Short.", "The quick brown fox jumps over the lazy dog.", "Fine."]
    rows = [{"id": f"r{i}", "text": t, "language": "English", "instruct": "A calm voice."} for i, t in enumerate(texts)]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    runs = {}
    for batch, mode in (("1", "--no-async-decode"), ("3", "--async-decode"), ("8", "--no-async-decode"),
                        ("8", "--async-decode")):
        out = tmp_path / f"b{batch}{mode}"
        res = run_cli("generate", prompts, "-o", out, "--model", model_yaml(tmp_path, "voice_design", "bfloat16", "cuda"), "-q",
                      "--seed", "11", "--max-new-frames", "24", "--max-batch-size", batch, "--deterministic", mode)
        assert res.exit_code == 0, res.output
        runs[(batch, mode)] = {m["id"]: ((out / m["file_name"]).read_bytes(), np.load(out / m["logprobs_file"]))
                               for m in read_manifest(out)}
    first = runs[("1", "--no-async-decode")]
    assert len(first) == len(rows)
    for key, got in runs.items():
        for rid, (wav, npz) in first.items():
            assert got[rid][0] == wav, (key, rid)
            for name in ("tokens", "logprobs"):
                np.testing.assert_array_equal(got[rid][1][name], npz[name], err_msg=f"{key} {rid} {name}")


def test_fused_vocoder_at_the_release_widths_within_bf16_rounding():
    """The 12 Hz decoder at the release's widths (random weights; its 384-channel units folded), bf16
    on CUDA with the vocoder fused: rows of different lengths in one call are each within the bf16
    modules' own distance from float32 (x1.5) of the float32 modules' decode of that row alone;
    control: a frame's codes changed fails that bound."""
    import copy

    import torch

    from benchmarks.qwen3_codec import build
    from tests.audio_controls import change_codec_frame

    dev = torch.device("cuda")
    ref = build(torch.float32, dev)
    fused, plain = copy.deepcopy(ref), copy.deepcopy(ref)
    fused.decoder, plain.decoder = fused.decoder.to(torch.bfloat16), plain.decoder.to(torch.bfloat16)
    fused.decoder.fused, plain.decoder.fused, ref.decoder.fused = True, False, False
    g = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 2048, (3, 16, 40), generator=g).to(dev)
    lengths = torch.tensor([40, 23, 31], device=dev)
    hop = ref.hop_length
    with torch.inference_mode():
        got = fused.decode(codes, lengths)
        for i, n in enumerate(lengths.tolist()):
            row = codes[i: i + 1, :, :n]
            want = ref.decode(row, None)[0]
            bound = 1.5 * (plain.decode(row, None)[0] - want).abs().max().item()
            assert (got[i, : n * hop] - want).abs().max().item() <= bound, i
            other = ref.decode(change_codec_frame(row, 0, n // 2), None)[0]
            assert (got[i, : n * hop] - other).abs().max().item() > bound, i
