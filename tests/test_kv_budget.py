"""KV budget: how many requests run at once when device memory is the limit."""

from __future__ import annotations

from omni_cli.runners.device import kv_slots_within

MIB = 1 << 20


def test_all_wanted_slots_when_they_fit():
    assert kv_slots_within(free_bytes=100 * MIB + 65 * 10 * MIB, per_slot_bytes=10 * MIB, wanted=64,
                           headroom=100 * MIB) == 64


def test_fewer_slots_when_memory_is_short():
    # 10 slots' worth past the headroom: 9 for requests, 1 for the padding rows
    assert kv_slots_within(free_bytes=100 * MIB + 10 * 10 * MIB + 5 * MIB, per_slot_bytes=10 * MIB, wanted=64,
                           headroom=100 * MIB) == 9


def test_no_slot_when_not_even_one_fits():
    assert kv_slots_within(free_bytes=50 * MIB, per_slot_bytes=10 * MIB, wanted=64, headroom=100 * MIB) == 0


def _patch_free(monkeypatch, free_bytes: int) -> None:
    import omni_cli.runners.budget as budget

    monkeypatch.setattr(budget, "free_memory", lambda device: free_bytes)


def test_rows_run_as_many_at_once_as_their_own_lengths_fit(tmp_path, monkeypatch):
    """Memory for the KV of 2 rows at max_seq_len 256, as blocks (runners/budget.py): 5 short rows
    (12 frames) all run at once, where a slot a row ran 2; rows of 150 frames each need most of a
    slot's blocks, and only 2 run at once. Every row finishes either way."""
    import json

    from omni_cli.runners.device import RUNTIME_SLACK_BYTES
    from omni_cli.runners.codec_stage import CODEC_BATCH_FRAMES
    from omni_cli.runners.higgs_audio_v2.family import CODEC_FRAME_BYTES
    from omni_cli.runners.kv_blocks import BLOCK_SIZE
    from tests.conftest import TINY, read_manifest, run_cli, write_config, write_jsonl

    # tiny checkpoint: 2 layers x 2 KV heads x 256 positions x head_dim 8 x (K, V) x 4 bytes per slot
    per_slot = 2 * 2 * 2 * 256 * 8 * 4
    # kept free: the codec's calls (float32: twice the bf16 bytes a frame) and the slack; the
    # widest prefill's peak is measured on CUDA only (0 here)
    kept = CODEC_BATCH_FRAMES * CODEC_FRAME_BYTES * 2 + RUNTIME_SLACK_BYTES
    _patch_free(monkeypatch, kept + 3 * per_slot + per_slot // 2)  # 3 slots' worth: 2 rows + the spare
    cfg = write_config(tmp_path / "m.yaml", TINY, max_seq_len=256)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": f"Row {i}."} for i in range(5)])
    for frames, together in ((12, 5), (150, 2)):
        out = tmp_path / f"out{frames}"
        res = run_cli("generate", prompts, "-o", out, "--model", cfg, "--max-batch-size", "8",
                      "--max-new-frames", str(frames), "--min-new-frames", str(frames))
        assert res.exit_code == 0, res.output
        assert "device memory holds 512 KV positions" in res.output
        run = json.loads((out / "run.json").read_text())
        assert run["kv_cache"]["blocks"] * BLOCK_SIZE == 2 * 256
        assert run["kv_cache"]["peak_rows"] == together, frames
        assert [m["status"] for m in read_manifest(out)] == ["ok"] * 5


def test_generate_refuses_when_not_one_request_fits(tmp_path, monkeypatch):
    from tests.conftest import TINY, run_cli, write_config, write_jsonl

    _patch_free(monkeypatch, 1 << 20)
    cfg = write_config(tmp_path / "m.yaml", TINY, max_seq_len=256)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hello."}])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--model", cfg, "--max-new-frames", "12")
    assert res.exit_code == 2
    assert "not enough free memory" in res.output and "lower max_seq_len" in res.output
