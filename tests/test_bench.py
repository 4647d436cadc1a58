"""`omni bench` runs its peers (all three by default) on one set of random weights and writes its table, JSON and plot."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_bench_tiny_shape_writes_json_and_plot(tmp_path):
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    res = run_cli("bench", "--shape", "tiny-higgs-audio-v2", "--batch", "1", "--batch", "3", "--frames", "16",
                  "--prompt-len", "12", "--dtype", "float32", "--device", "cpu", "--out", out, "--plot", plot)
    assert res.exit_code == 0, res.output
    info = json.loads(out.read_text())
    got = {(r["peer"], r["batch"]) for r in info["rows"]}
    assert got == {(p, b) for p in ("sync", "async", "transformers") for b in (1, 3)}
    assert all(r["ms_per_step"] > 0 and r["audio_s_per_s"] > 0 for r in info["rows"])
    assert all(r["floor_ms"] is None for r in info["rows"])  # floors are for the H200 only
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "transformers" in res.output and "audio-s/s" in res.output


def test_bench_peers_measures_deterministic_mode_beside_the_default(tmp_path):
    """--peers picks the rows of the table, deterministic mode's among them; a peer it does not
    know is refused by name before anything loads (exit 2)."""
    out = tmp_path / "bench.json"
    res = run_cli("bench", "--shape", "tiny-higgs-audio-v2", "--batch", "2", "--frames", "12", "--prompt-len", "10",
                  "--dtype", "float32", "--device", "cpu", "--out", out, "--peers", "async,deterministic")
    assert res.exit_code == 0, res.output
    assert [r["peer"] for r in json.loads(out.read_text())["rows"]] == ["async", "deterministic"]
    bad = run_cli("bench", "--shape", "tiny-higgs-audio-v2", "--peers", "async,fast", "--out", tmp_path / "x.json")
    assert bad.exit_code == 2 and "--peers" in bad.output and not (tmp_path / "x.json").exists()


def test_bench_shape_3b_matches_the_release():
    """Parameter counts against transformers' model of that config (on the meta device: no memory)."""
    import torch
    from transformers import HiggsAudioV2ForConditionalGeneration

    from omni_cli.runners.higgs_audio_v2.shapes import param_counts, shape_config, transformers_config

    cfg = shape_config("higgs-audio-v2-3b")
    with torch.device("meta"):
        ref = HiggsAudioV2ForConditionalGeneration(transformers_config(cfg))
    params = dict(ref.named_parameters())
    total, per_step = param_counts(cfg)
    assert total == sum(p.numel() for p in params.values())
    # a decode step reads the audio path: not the text embedding, text MLPs or text norms, and
    # only 8 rows of the audio embedding table
    skip = ("model.embed_tokens.", "model.embed_audio_tokens.", ".mlp.", ".input_layernorm.",
            ".post_attention_layernorm.")
    assert per_step == sum(p.numel() for n, p in params.items() if not any(t in n for t in skip))
