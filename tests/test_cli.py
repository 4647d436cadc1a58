"""`omni generate` end to end on the embedded default, in-process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from tests.audio_controls import change_one_frame, max_lsb
from tests.conftest import read_manifest, run_cli, write_jsonl


def test_bad_rows_fail_alone_and_are_recorded(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "text": "hello"},
        {"id": "b", "text": "x", "top_p": 2},
        {"id": "c", "text": "has <|AUDIO_OUT|> inside"},
        {"id": "d", "text": "too long", "max_new_frames": 100000},
        {"id": "e", "text": "world"},
    ])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "--seed", "1", "--max-new-frames", "12")
    assert res.exit_code == 1  # some rows failed; the rest were written
    m = {r["id"]: r for r in read_manifest(out)}
    assert [r["id"] for r in read_manifest(out)] == ["a", "b", "c", "d", "e"]  # input order
    assert m["a"]["status"] == m["e"]["status"] == "ok"
    assert (out / "audio/a.wav").is_file() and (out / "logprobs/e.npz").is_file()
    assert m["b"]["status"] == "failed" and "row 2, field 'top_p'" in m["b"]["error"]
    assert "row 3, field 'text'" in m["c"]["error"] and "special token" in m["c"]["error"]
    assert "row 4, field 'max_new_frames'" in m["d"]["error"] and "max_seq_len" in m["d"]["error"]
    assert not (out / "audio/b.wav").exists()
    assert "row 2, field 'top_p'" in res.output


def test_refuses_to_overwrite_results(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    out = tmp_path / "out"
    assert run_cli("generate", prompts, "-o", out, "--max-new-frames", "10", "-q").exit_code == 0
    res = run_cli("generate", prompts, "-o", out, "--max-new-frames", "10", "-q")
    assert res.exit_code == 2 and "already holds results" in res.output
    assert run_cli("generate", prompts, "-o", out, "--max-new-frames", "10", "-q", "--overwrite").exit_code == 0


def test_usage_errors_exit_2(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n")
    res = run_cli("generate", prompts, "-o", tmp_path / "o1", "--model", "no-such-model")
    assert res.exit_code == 2 and "no such config file" in res.output
    res = run_cli("generate", prompts, "-o", tmp_path / "o2", "--temperature", "-1")
    assert res.exit_code == 2 and "temperature" in res.output
    res = run_cli("generate", prompts, "-o", tmp_path / "o3", "--format", "mp3")
    assert res.exit_code == 2 and "--format" in res.output
    res = run_cli("generate", tmp_path / "missing.jsonl", "-o", tmp_path / "o4")
    assert res.exit_code == 2 and "does not exist" in res.output


def test_flac_and_stdin(tmp_path):
    out = tmp_path / "out"
    res = run_cli("generate", "-", "-o", out, "--format", "flac", "-q", "--temperature", "0",
                  stdin='{"id": "s1", "text": "from stdin", "max_new_frames": 20}\n')
    assert res.exit_code == 0, res.output
    (row,) = read_manifest(out)
    assert row["file_name"] == "audio/s1.flac"
    audio, sr = sf.read(out / row["file_name"])
    assert sr == 24000 and len(audio) == round(row["duration_s"] * sr)
    run = json.loads((out / "run.json").read_text())
    assert run["totals"]["ok"] == 1 and run["totals"]["frames"] == row["frames"] == 20
    assert {"torch", "transformers", "tokenizers", "omni_cli"} <= set(run["versions"])
    t = run["timings"]
    assert 0 <= t["prefill_s"] <= t["loop_s"] and t["write_tail_s"] >= 0 and t["prefill_steps"] == 1
    assert t["loop_s"] + t["write_tail_s"] <= t["generate_s"] + 0.0015  # each rounded to the millisecond
    assert t["tail_codec_s"] <= t["write_tail_s"] + 0.001 and 0 < t["write_busy_s"] <= t["generate_s"]
    assert set(t["load_phases"]) >= {"imports_s", "weights_s", "codec_s", "tokenizer_s"}
    assert sum(t["load_phases"].values()) <= t["load_s"] + 0.001 * len(t["load_phases"])
    z = np.load(out / "logprobs/s1.npz")
    assert z["tokens"].shape == z["logprobs"].shape == z["mask"].shape == (20, 8)


def test_a_row_whose_files_cannot_be_written_fails_alone(tmp_path, monkeypatch):
    """A row whose file cannot be written (its wav's name is taken by a folder) fails alone, its
    partial file removed; every row's frames are dropped once, after its files were written or
    failed (a long run keeps its Requests, not their frames)."""
    from omni_cli.scheduler import Request

    released, real_release = [], Request.release
    monkeypatch.setattr(Request, "release", lambda self: (released.append(self.rid), real_release(self))[1])
    (tmp_path / "out" / "audio" / "b.wav").mkdir(parents=True)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": i, "text": f"row {i}"} for i in ("a", "b", "c")])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "-q", "--max-new-frames", "10")
    assert res.exit_code == 1
    m = {r["id"]: r for r in read_manifest(tmp_path / "out")}
    assert m["a"]["status"] == m["c"]["status"] == "ok"
    assert m["b"]["status"] == "failed" and "row 2: writing its outputs failed" in m["b"]["error"]
    assert "Is a directory" in m["b"]["error"]
    assert not [p.name for p in (tmp_path / "out").rglob("*partial*")]
    assert sorted(released) == ["a", "b", "c"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pcm16_matches_libsndfile(dtype):
    """Our float -> PCM_16 conversion (runners/audio.py, as the codec's output is converted on its
    device, float32 or bf16) writes the bytes libsndfile's own conversion writes."""
    import io

    import torch

    from omni_cli.runners.audio import pcm16

    rng = np.random.default_rng(0)
    # normal audio, clipping, and the exact multiples of 1/32768 and their halves where rounding rules differ
    audio = torch.from_numpy(np.concatenate([rng.standard_normal(200_000) * 0.5, rng.uniform(-3, 3, 1000),
                                             rng.integers(-65536, 65537, 50_000) / 65536]).astype(np.float32))
    audio = audio.to(getattr(torch, dtype)).float().numpy()  # the values a bf16 codec can produce
    ours, theirs = io.BytesIO(), io.BytesIO()
    samples = pcm16(torch.from_numpy(audio).to(getattr(torch, dtype))).numpy()
    assert samples.dtype == np.int16
    sf.write(ours, samples, 24000, format="WAV", subtype="PCM_16")
    sf.write(theirs, np.clip(audio, -1, 1), 24000, format="WAV", subtype="PCM_16")
    assert ours.getvalue() == theirs.getvalue()


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_audio_files_are_the_bytes_libsndfile_writes_to_a_path(tmp_path, fmt):
    """Encoded in memory and written at once, a row's audio file is byte for byte the file
    libsndfile writes itself to a path (which seeks and fsyncs: output.py)."""
    from omni_cli.output import OutputWriter

    rng = np.random.default_rng(1)
    samples = rng.integers(-32768, 32768, 48_001).astype(np.int16)
    tokens = rng.integers(0, 1024, (20, 8))
    writer = OutputWriter(tmp_path / "out", fmt, 24000)
    writer.write_ok(1, "r", samples, tokens, np.zeros((20, 8), np.float32), np.ones((20, 8), bool), {"row": 1})
    writer.close()
    sf.write(tmp_path / f"want.{fmt}", samples, 24000, format=fmt.upper(), subtype="PCM_16")
    assert (tmp_path / f"out/audio/r.{fmt}").read_bytes() == (tmp_path / f"want.{fmt}").read_bytes()


def test_npz_files_hold_what_np_savez_would():
    """A row's npz, written without zipfile (output.py: npz_stored), against the oracles: np.savez's
    member names, dates and storage for the same arrays, np.load reading them back, each member
    the bytes np.save writes, and zipfile's CRC check of every member. Empty arrays (a row that
    made no frames) and every dtype a row has."""
    import io
    import zipfile

    from omni_cli.output import npz_stored

    rng = np.random.default_rng(2)
    for frames in (200, 1, 0):
        arrays = {"tokens": rng.integers(0, 1026, (frames, 8)), "logprobs": rng.standard_normal((frames, 8)).astype(
            np.float32), "mask": rng.random((frames, 8)) < 0.9, "raw_logprobs": rng.standard_normal((frames, 8)).astype(
            np.float32)[:, ::-1]}  # a strided view, as a caller may pass
        ours = b"".join(bytes(p) for p in npz_stored(arrays))
        theirs = io.BytesIO()
        np.savez(theirs, **arrays)
        z, want = zipfile.ZipFile(io.BytesIO(ours)), zipfile.ZipFile(io.BytesIO(theirs.getvalue()))
        assert z.testzip() is None and z.namelist() == want.namelist()
        assert [(i.date_time, i.compress_type) for i in z.infolist()] == [(i.date_time, i.compress_type)
                                                                       for i in want.infolist()]
        loaded = np.load(io.BytesIO(ours))
        for name, a in arrays.items():
            got = loaded[name]
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
            saved = io.BytesIO()
            np.save(saved, a)  # each member is the .npy file numpy writes for its array, byte for byte
            assert z.read(f"{name}.npy") == saved.getvalue()
        assert ours == b"".join(bytes(p) for p in npz_stored(arrays))  # the same bytes every time


def _codec_calls(monkeypatch, fail=lambda batch, call: False):
    """Record (codes shape, raised) of every codec decode (writer threads call it at once);
    raise a RuntimeError where fail(batch, call number) says."""
    import threading

    from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder

    real, calls, lock = HiggsCodecDecoder.decode, [], threading.Lock()

    def decode(self, codes, lengths=None):
        with lock:
            raised = fail(codes.shape[0], len(calls) + 1)
            calls.append((tuple(codes.shape), raised))
        if raised:
            raise RuntimeError("CUDA out of memory (test)")
        return real(self, codes, lengths)

    monkeypatch.setattr(HiggsCodecDecoder, "decode", decode)
    return calls


def _tiny_codec():
    import torch

    from omni_cli.config import load_config
    from tests.conftest import load_family

    return load_family(load_config(None), torch.float32, torch.device("cpu")).codec


def _frames(rng, n: int) -> np.ndarray:
    """Generated frames [n, 8] as the runner samples them: BOS ramp, codes, EOS staircase."""
    t = rng.integers(0, 1024, (n, 8))
    for k in range(8):
        t[:k + 1, k] = 1024
        t[n - 8 + k:, k] = 1025
    return t


def test_batched_codec_pads_rows_to_shared_shapes_and_sounds_as_if_alone(monkeypatch):
    """Rows of different lengths share calls of a bucketed length and a power-of-two batch
    (at most CODEC_BATCH_FRAMES frames); each row's audio is its own, as decoded alone,
    to within a conv's rounding: the padding is masked."""
    import omni_cli.runners.codec_stage as codec_stage

    stage = _tiny_codec()
    rng = np.random.default_rng(0)
    lengths = (40, 30, 40, 40, 30, 40, 60, 9)  # codec frames: 31, 21, ..., 51; 9 frames: no audio at all
    tokens = [_frames(rng, n) for n in lengths]
    monkeypatch.setattr(codec_stage, "CODEC_LENGTH_BUCKET", 32)
    monkeypatch.setattr(codec_stage, "CODEC_BATCH_FRAMES", 4 * 32)
    calls = _codec_calls(monkeypatch)
    batched = stage.decode(tokens, batched=True)
    # bucket 32: six rows in calls of 4 and 2; bucket 64: one row (a call of 128 frames holds 2, batch 1)
    assert sorted(calls) == [((1, 8, 64), False), ((2, 8, 32), False), ((4, 8, 32), False)]
    alone = [stage.decode([t], batched=False)[0] for t in tokens]
    assert len(batched[-1]) == 0 == len(alone[-1])
    for got, want in zip(batched[:-1], alone[:-1]):
        assert got.shape == want.shape and got.dtype == want.dtype == np.int16
        assert np.abs(got.astype(np.int32) - want).max() <= 1
    # controls: a row against another row of its length (rows mixed up), or against its codes
    # with one frame changed, fails the bound
    changed = stage.decode([change_one_frame(tokens[0])], batched=False)[0]
    assert max_lsb(batched[0], alone[2]) > 1 and max_lsb(batched[0], changed) > 1


def test_codec_calls_after_the_loop_hold_fewer_rows_and_sound_the_same(monkeypatch):
    """At the drain (the decode loop has stopped) calls hold a power of two of rows: about a
    CODEC_DRAIN_CALLS-th of the drain's rows, at least what CODEC_DRAIN_FRAMES hold, at most
    what a call beside the loop holds; each row's audio stays its own, and the warm-up decodes
    at every batch either kind of call takes, so the drain captures none."""
    import omni_cli.runners.codec_stage as codec_stage

    stage = _tiny_codec()
    rng = np.random.default_rng(2)
    tokens = [_frames(rng, 40) for _ in range(8)]  # 31 codec frames each: bucket 32
    monkeypatch.setattr(codec_stage, "CODEC_LENGTH_BUCKET", 32)
    monkeypatch.setattr(codec_stage, "CODEC_BATCH_FRAMES", 4 * 32)
    monkeypatch.setattr(codec_stage, "CODEC_DRAIN_FRAMES", 3 * 32)  # 3 rows: a batch of 2
    calls = _codec_calls(monkeypatch)
    during = stage.decode(tokens, batched=True)
    assert sorted(calls) == [((4, 8, 32), False)] * 2
    calls.clear()
    drained = stage.decode(tokens, batched=True, drain=True)
    assert sorted(calls) == [((2, 8, 32), False)] * 4
    calls.clear()
    stage.decode(tokens[:7], batched=True, drain=True)  # 2 + 2 + 2 + 1
    assert sorted(calls) == [((1, 8, 32), False)] + [((2, 8, 32), False)] * 3
    assert stage._rows_per_call(32, drain_rows=8) == 2 and stage.rows_per_call(40) == 4
    monkeypatch.setattr(codec_stage, "CODEC_DRAIN_CALLS", 2)  # a larger drain: about two calls
    assert [stage._rows_per_call(32, drain_rows=n) for n in (4, 6, 8, 64)] == [2, 2, 4, 4]
    monkeypatch.setattr(codec_stage, "CODEC_DRAIN_FRAMES", 64 * 32)  # never more than a usual call
    assert stage._rows_per_call(32, drain_rows=8) == 4
    for got, want in zip(drained, during):
        assert got.shape == want.shape
        assert np.abs(got.astype(np.int32) - want).max() <= 1
    # controls: rows swapped, or one frame's codes changed, fail the bound
    changed = stage.decode([change_one_frame(tokens[0])], batched=False)[0]
    assert max_lsb(drained[0], during[1]) > 1 and max_lsb(drained[0], changed) > 1
    monkeypatch.setattr(codec_stage, "CODEC_DRAIN_FRAMES", 3 * 32)
    monkeypatch.setattr(codec_stage, "CODEC_DRAIN_CALLS", 8)
    for slots, batches in ((3, [1, 2, 4]), (1, [1]), (8, [1, 2, 4])):
        calls.clear()
        stage.warm(40, rows=slots, batched=True)
        assert sorted(shape[0] for shape, _ in calls) == batches, slots
        calls.clear()
        for n in range(1, slots + 1):  # every drain the run can have
            stage.decode(tokens[:n], batched=True, drain=True)
        assert {shape[0] for shape, _ in calls} <= set(batches), slots


def test_codec_calls_are_queued_before_the_first_rows_come_out(monkeypatch):
    """The batched codec queues CODEC_CALLS_AHEAD calls beyond the one it collects: by the time
    the first call's rows come out, that many more have been launched (here all three)."""
    import omni_cli.runners.codec_stage as codec_stage

    stage = _tiny_codec()
    rng = np.random.default_rng(4)
    tokens = [_frames(rng, 40) for _ in range(7)]
    monkeypatch.setattr(codec_stage, "CODEC_LENGTH_BUCKET", 32)
    monkeypatch.setattr(codec_stage, "CODEC_BATCH_FRAMES", 3 * 32)  # calls of 3, 3, then 1
    calls = _codec_calls(monkeypatch)
    out = stage.decode_calls(tokens, batched=True)
    rows, _ = next(out)
    assert rows == [0, 1, 2] and len(calls) == min(3, codec_stage.CODEC_CALLS_AHEAD + 1) == 3
    assert sorted(i for rows, _ in out for i in rows) == [3, 4, 5, 6]


@pytest.mark.parametrize("failing", [2, 3])
def test_a_codec_call_that_fails_after_others_are_queued_keeps_the_rows_before_it(monkeypatch, failing):
    """Calls run ahead (the next ones are queued before the oldest one's audio is taken): when
    the second or third call fails, the rows of the calls before it still come out, once each,
    before the error; the rest are left to decode_rows' retries, which then give every row
    exactly once."""
    import omni_cli.runners.codec_stage as codec_stage
    from omni_cli.audio_stage import decode_rows

    stage = _tiny_codec()
    rng = np.random.default_rng(4)
    tokens = [_frames(rng, 40) for _ in range(7)]
    monkeypatch.setattr(codec_stage, "CODEC_LENGTH_BUCKET", 32)
    monkeypatch.setattr(codec_stage, "CODEC_BATCH_FRAMES", 3 * 32)  # calls of 3, 3, then 1
    want = stage.decode(tokens, batched=True)
    _codec_calls(monkeypatch, fail=lambda batch, call: call == failing)
    seen = []
    with pytest.raises(RuntimeError, match="out of memory"):
        for rows, waves in stage.decode_calls(tokens, batched=True):
            seen += rows
            for i, w in zip(rows, waves):
                np.testing.assert_array_equal(w, want[i])
    assert len(seen) == 3 * (failing - 1) and len(set(seen)) == len(seen)
    calls = _codec_calls(monkeypatch, fail=lambda batch, call: call == failing)
    got = list(decode_rows(stage, tokens, batched=True))
    assert sorted(i for i, _ in got) == list(range(7)) and calls[failing - 1][1]
    for i, w in got:  # the first call's rows as batched, the rest decoded alone: a conv's rounding
        assert np.abs(w.astype(np.int32) - want[i]).max() <= 1
    # controls: another row's audio (all rows are 40 frames), or one frame's codes changed, fail both bounds
    changed = stage.decode([change_one_frame(tokens[0])], batched=False)[0]
    assert max_lsb(want[1], want[0]) > 1 and max_lsb(changed, want[0]) > 1


def test_a_codec_batch_that_fails_is_retried_row_by_row(monkeypatch):
    from omni_cli.audio_stage import decode_rows

    stage = _tiny_codec()
    rng = np.random.default_rng(1)
    tokens = [_frames(rng, 30) for _ in range(6)]
    want = [stage.decode([t], batched=False)[0] for t in tokens]
    # every batch fails, and so does every third single-row call: only those rows are lost
    calls = _codec_calls(monkeypatch, fail=lambda batch, call: batch > 1 or call % 3 == 0)
    got = [wave for _, wave in sorted(decode_rows(stage, tokens, batched=True), key=lambda iw: iw[0])]
    assert calls[0][0][0] == 8 and calls[0][1] and [shape[0] for shape, _ in calls[1:]] == [1] * 6
    for (b, raised), g, w in zip(calls[1:], got, want):
        if raised:
            assert isinstance(g, RuntimeError) and "out of memory" in str(g)
        else:
            np.testing.assert_array_equal(g, w)
    # controls: another row's audio, or one frame's codes changed, are not equal
    changed = stage.decode([change_one_frame(tokens[1])], batched=False)[0]
    assert max_lsb(want[0], want[1]) > 0 and max_lsb(changed, want[1]) > 0
