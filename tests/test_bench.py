"""`omni bench` runs its peers (all three by default) on one set of random weights and writes its table, JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    assert all(r["floor_ms"] is None for r in info["rows"])  # floors are for the cards it knows only
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


# ---- Qwen3-TTS-12Hz ----

QWEN_REF = Path("/work/venvs/qwen-ref/bin/python")  # tests/golden/README.md's venv, where this machine has it


def test_bench_tiny_qwen_shape_runs_on_the_cpu(tmp_path):
    """The Qwen3-TTS family's omni rows at the tiny shape: its default peers, no floor off a known card."""
    out = tmp_path / "bench.json"
    res = run_cli("bench", "--shape", "tiny-qwen3-tts", "--batch", "1", "--batch", "2", "--frames", "4",
                  "--prompt-len", "6", "--dtype", "float32", "--device", "cpu", "--out", out)
    assert res.exit_code == 0, res.output
    info = json.loads(out.read_text())
    assert [(r["peer"], r["batch"]) for r in info["rows"]] == [("sync", 1), ("async", 1), ("sync", 2), ("async", 2)]
    assert all(r["ms_per_step"] > 0 and r["audio_s_per_s"] > 0 and r["floor_ms"] is None for r in info["rows"])
    assert info["failed"] == [] and "audio-s/s" in res.output


@pytest.mark.parametrize("shape", ["qwen3-tts-12hz-0.6b", "qwen3-tts-12hz-1.7b"])
def test_bench_refuses_real_qwen_shapes_without_a_gpu(monkeypatch, shape):
    import torch

    from omni_cli.bench import qwen

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(qwen, "random_model", lambda *a, **k: pytest.fail("a model was built"))
    res = run_cli("bench", "--shape", shape)
    assert res.exit_code == 2 and "--shape tiny-qwen3-tts --device cpu" in res.output, res.output


def test_bench_peers_belong_to_their_family(tmp_path):
    """transformers has no Qwen3-TTS and qwen-tts runs nothing else: each refused before anything loads."""
    for shape, peer in (("tiny-qwen3-tts", "transformers"), ("tiny-higgs-audio-v2", "qwen-tts")):
        res = run_cli("bench", "--shape", shape, "--device", "cpu", "--peers", f"sync,{peer}",
                      "--out", tmp_path / "x.json")
        assert res.exit_code == 2 and "--peers" in res.output and peer in res.output, res.output
        assert not (tmp_path / "x.json").exists()


def test_a_failing_qwen_tts_peer_is_one_line_and_the_rest_stands(tmp_path):
    """The peer's process exits 3 saying why: the table keeps omni's rows and says so in one line."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'qwen_tts: no such package here'\nexit 3\n")
    fake.chmod(0o755)
    out = tmp_path / "bench.json"
    res = run_cli("bench", "--shape", "tiny-qwen3-tts", "--batch", "1", "--frames", "3", "--prompt-len", "6",
                  "--dtype", "float32", "--device", "cpu", "--peers", "sync,qwen-tts", "--qwen-tts-python", fake,
                  "--out", out)
    assert res.exit_code == 0, res.output
    info = json.loads(out.read_text())
    assert [(r["peer"], r["batch"]) for r in info["rows"]] == [("sync", 1)]
    assert info["failed"] == ["qwen-tts: failed (exit 3): qwen_tts: no such package here"]
    assert "qwen-tts: failed (exit 3)" in res.output


@pytest.mark.skipif(not QWEN_REF.exists(), reason="needs the qwen-tts reference venv (tests/golden/README.md)")
def test_qwen_tts_peer_rows_join_the_table(tmp_path):
    """qwen-tts's generate in its own interpreter, at the same tiny shape, beside omni's rows."""
    out = tmp_path / "bench.json"
    res = run_cli("bench", "--shape", "tiny-qwen3-tts", "--batch", "1", "--frames", "3", "--prompt-len", "16",
                  "--dtype", "float32", "--device", "cpu", "--qwen-tts-python", QWEN_REF, "--out", out)
    assert res.exit_code == 0, res.output
    info = json.loads(out.read_text())
    assert [r["peer"] for r in info["rows"]] == ["sync", "async", "qwen-tts"]  # given an interpreter: a default peer
    assert info["failed"] == [] and info["qwen_tts"]["versions"]["qwen-tts"] == "0.1.1"


@pytest.fixture
def meta_talker(monkeypatch):
    """Our Talker of a shape on the meta device (no memory): its rope tables made there too."""
    import torch

    import omni_cli.runners.qwen3_tts.predictor as predictor
    import omni_cli.runners.qwen3_tts.talker as talker

    def tables(theta, head_dim, length, device=None):
        return torch.zeros(length, head_dim, device="meta"), torch.zeros(length, head_dim, device="meta")

    monkeypatch.setattr(talker, "rope_tables", tables)
    monkeypatch.setattr(predictor, "rope_tables", tables)

    def build(cfg):
        with torch.device("meta"):
            return talker.Talker(cfg, 16)
    return build


@pytest.mark.parametrize("shape", ["qwen3-tts-12hz-0.6b", "qwen3-tts-12hz-1.7b", "tiny-qwen3-tts"])
def test_qwen_shape_reads_per_frame_count_the_modules_parameters(meta_talker, shape):
    """param_count is the model's; a frame reads the talker's layers, norm, head and text MLP once, the
    predictor's layers, norm and projection once a sub-step (15), each of its 15 heads once, and a
    row's one text-embedding row and 16 code-embedding rows."""
    from omni_cli.runners.qwen3_tts.shapes import frame_params, param_count, shape_config

    cfg = shape_config(shape)
    model = meta_talker(cfg)
    params = dict(model.named_parameters())
    size = lambda prefixes: sum(p.numel() for n, p in params.items() if n.startswith(prefixes))  # noqa: E731
    talker = size(("model.layers.", "model.norm.", "codec_head.", "text_projection."))
    sub_step = size(("code_predictor.model.layers.", "code_predictor.model.norm.",
                     "code_predictor.small_to_mtp_projection."))
    heads = size(("code_predictor.lm_head.",))
    row = (params["model.text_embedding.weight"].shape[1] + params["model.codec_embedding.weight"].shape[1]
           + sum(p.shape[1] for n, p in params.items() if n.startswith("code_predictor.model.codec_embedding.")))
    f = frame_params(cfg)
    assert param_count(cfg) == sum(p.numel() for p in params.values())
    assert (f.shared, f.per_row) == (talker + 15 * sub_step + heads, row)


def test_qwen_release_shapes_are_the_released_configs():
    """talker_config and code_predictor_config of Qwen/Qwen3-TTS-12Hz-0.6B-* and -1.7B-* (config.json)."""
    from omni_cli.runners.qwen3_tts.shapes import shape_config

    for shape, hidden, inter in (("qwen3-tts-12hz-0.6b", 1024, 3072), ("qwen3-tts-12hz-1.7b", 2048, 6144)):
        t, p = shape_config(shape).talker, shape_config(shape).predictor
        assert (t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads,
                t.num_key_value_heads, t.head_dim, t.vocab_size, t.text_vocab_size, t.text_hidden_size) == \
            (hidden, inter, 28, 16, 8, 128, 3072, 151936, 2048)
        assert (p.hidden_size, p.intermediate_size, p.num_hidden_layers, p.vocab_size) == (1024, 3072, 5, 2048)


def test_floor_is_the_reads_at_the_cards_copy_rate(monkeypatch):
    """On an H200 a shorter floor than on an H100 (faster memory), in proportion to the bytes read
    where the FLOPs are not what binds; on a card the table does not name, the bytes at the card's
    own copy rate, measured once; none off CUDA."""
    import torch

    from omni_cli.bench import common
    from omni_cli.bench.common import floor_ms

    measured = []
    monkeypatch.setattr(common, "measured_copy_bytes_per_s", lambda d: measured.append(d) or 1.5e12)
    monkeypatch.setattr(common, "_MEASURED", {})
    cuda = torch.device("cuda")
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None, n=name: n)
        got = [floor_ms(n, 0, cuda) for n in (1 << 30, 2 << 30)]
        assert got[1] == pytest.approx(2 * got[0])
        if "A100" in name:
            assert got[0] == pytest.approx(1e3 * (1 << 30) / 1.5e12) and len(measured) == 1  # measured once
            continue
        if "H100" in name:
            h100 = got[0]
    assert got[0] < h100  # the H200 ran last
    assert len(measured) == 1  # the named cards use the table
    assert floor_ms(1 << 30, 0, torch.device("cpu")) is None


def test_e2e_random_qwen_checkpoint_rows_make_exactly_their_frames(tmp_path):
    """benchmarks/e2e_generate.py's random CustomVoice checkpoint (the released layout) through omni
    generate: every row makes --frames frames, 1920 samples of 24 kHz audio each."""
    from benchmarks.e2e_generate import ensure_checkpoint, run

    ensure_checkpoint(tmp_path, "qwen3_tts", "tiny-qwen3-tts")
    got = run(tmp_path, rows=3, batch=2, frames=9, async_decode=True, family="qwen3_tts")
    assert got["audio_s"] == pytest.approx(3 * 9 * 1920 / 24000)
