"""Seeded generation: a row depends only on its text, parameters and seed."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from omni_cli.runners.sampling.seeds import derive_seed, row_seed
from tests.audio_controls import assert_written_audio_follows_its_codes, codec_stage, longest_row
from tests.conftest import TINY, read_manifest, run_cli, write_jsonl

TEXTS = ["Hi.", "The sun rises in the east.", "A longer sentence, to make this prompt longer than the rest.",
         "Medium length prompt!", "Five.", "Sixth row of the batch here.", "Seven", "Eighth and last prompt, longest of all of them."]
SAMPLING = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.02",
            "--repetition-penalty", "1.05", "--ras-win-len", "7", "--ras-win-max-num-repeat", "2"]


def _rows():
    return [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)]


def _gen(tmp_path, name, rows, *args):
    prompts = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / name
    res = run_cli("generate", prompts, "-o", out, "-q", "--max-new-frames", "40", *SAMPLING, *args)
    assert res.exit_code == 0, res.output
    return out


def _files(out, rid):
    return (out / f"audio/{rid}.wav").read_bytes(), (out / f"logprobs/{rid}.npz").read_bytes()


def test_derive_seed_scheme():
    import hashlib

    digest = hashlib.blake2b(b"omni-cli-row:42:r7", digest_size=8).digest()
    assert row_seed(None, 42, "r7") == int.from_bytes(digest, "little") & 0x7FFFFFFF
    assert derive_seed("ns", 1) == int.from_bytes(hashlib.blake2b(b"ns:1", digest_size=8).digest(), "little") & 0x7FFFFFFF
    assert row_seed(5, 42, "r7") == 5 and row_seed(-1, None, "x") == 0x7FFFFFFF


def test_no_run_seed_gives_fresh_recorded_seeds(tmp_path):
    rows = _rows()[:3]
    seeds = [[m["seed"] for m in read_manifest(_gen(tmp_path, f"f{i}", rows))] for i in range(2)]
    assert all(0 <= s <= 0x7FFFFFFF for s in seeds[0] + seeds[1])
    assert seeds[0] != seeds[1]  # 93 random bits: equal only with probability 2^-93


def test_same_seed_same_bytes_across_batching_order_and_alone(tmp_path):
    """--deterministic: byte-identical npz and wav at batch 1, 3 and 8, shuffled, and alone."""
    rows = _rows()
    runs = {b: _gen(tmp_path, f"b{b}", rows, "--seed", "11", "--max-batch-size", str(b), "--deterministic")
            for b in (1, 3, 8)}
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    runs["shuffled"] = _gen(tmp_path, "shuffled", shuffled, "--seed", "11", "--max-batch-size", "3", "--deterministic")
    base = runs[8]
    seeds = {m["id"]: m["seed"] for m in read_manifest(base)}
    # one row alone, with its recorded seed
    alone = _gen(tmp_path, "alone", [{**rows[5], "seed": seeds["r5"]}], "--deterministic")
    for rid in seeds:
        for name, out in runs.items():
            assert _files(out, rid) == _files(base, rid), (rid, name)
    assert _files(alone, "r5") == _files(base, "r5")
    # control: the files are their codes' audio, and other codes' audio has other bytes
    assert_written_audio_follows_its_codes(codec_stage(TINY), base, longest_row(read_manifest(base)))
    # the manifest records every effective seed, derived from (run seed, id)
    assert seeds == {r["id"]: row_seed(None, 11, r["id"]) for r in rows}


def test_default_mode_keeps_codes_and_audio_across_batch_sizes(tmp_path):
    """Without --deterministic the draws still ignore batch-mates: codes and audio stay equal."""
    rows = _rows()
    a = _gen(tmp_path, "a", rows, "--seed", "3", "--max-batch-size", "1")
    b = _gen(tmp_path, "b", rows, "--seed", "3", "--max-batch-size", "8")
    for r in rows:
        za, zb = np.load(a / f"logprobs/{r['id']}.npz"), np.load(b / f"logprobs/{r['id']}.npz")
        np.testing.assert_array_equal(za["tokens"], zb["tokens"])
        np.testing.assert_allclose(za["logprobs"], zb["logprobs"], atol=1e-4)
        assert (a / f"audio/{r['id']}.wav").read_bytes() == (b / f"audio/{r['id']}.wav").read_bytes()
    # control: the files are their codes' audio, and other codes' audio has other bytes
    assert_written_audio_follows_its_codes(codec_stage(TINY), a, longest_row(read_manifest(a)))


def test_different_seeds_differ(tmp_path):
    rows = _rows()[:3]
    a = _gen(tmp_path, "a", rows, "--seed", "1")
    b = _gen(tmp_path, "b", rows, "--seed", "2")
    for r in rows:
        assert not np.array_equal(np.load(a / f"logprobs/{r['id']}.npz")["tokens"],
                                  np.load(b / f"logprobs/{r['id']}.npz")["tokens"])


def test_logprobs_files_and_manifest_fields(tmp_path):
    out = _gen(tmp_path, "o", _rows()[:2], "--seed", "4", "--raw-logprobs", "--min-new-frames", "30")
    for m in read_manifest(out):
        z = np.load(out / m["logprobs_file"])
        assert set(z.files) == {"tokens", "logprobs", "mask", "raw_logprobs"}
        assert (z["logprobs"] <= 0).all() and (z["raw_logprobs"] <= 0).all()
        # no stream-EOS before min_new_frames
        assert not (z["tokens"][:30] == 1025).any()
        real = z["logprobs"][z["mask"]]
        assert m["mean_logprob"] == pytest.approx(float(real.mean()), rel=1e-6)
        windows = [z["logprobs"][i: i + 25][z["mask"][i: i + 25]].mean() for i in range(len(z["tokens"]) - 24)]
        assert m["min_window_logprob"] == pytest.approx(min(windows), rel=1e-6)
        assert m["ras_win_len"] == 7 and m["min_p"] == 0.02 and m["min_new_frames"] == 30


def test_verify_passes_then_catches_tampering(tmp_path):
    out = _gen(tmp_path, "v", _rows()[:5], "--seed", "9", "--max-batch-size", "4", "--deterministic")
    res = run_cli("verify", out, "--sample", "0", "-q")
    assert res.exit_code == 0, res.output
    assert "5 identical, 0 different" in res.output
    npz = out / "logprobs/r2.npz"
    data = dict(np.load(npz))
    data["logprobs"][3, 1] += 1e-3
    np.savez(npz, **data)
    res = run_cli("verify", out, "--sample", "0", "-q")
    assert res.exit_code == 1
    assert "r2\taudio =\tnpz !=\tDIFFERS" in res.output and "4 identical, 1 different" in res.output


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.5, ">= 0"), ("top_p", 0, "(0, 1]"), ("top_p", 1.01, "(0, 1]"), ("top_k", -1, "from 0"),
    ("min_p", 1.0, "[0, 1)"), ("min_p", -0.1, "[0, 1)"), ("repetition_penalty", 0, "> 0"),
    ("repetition_penalty", -1.0, "> 0"), ("ras_win_len", -2, "from 0"), ("suppress_tokens", [1, "x"], "token ids"),
    ("min_new_frames", 500, "exceeds max_new_frames"),
])
def test_invalid_values_name_row_and_field(tmp_path, field, value, message):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "ok", "text": "fine"}, {"id": "bad", "text": "x", field: value}])
    res = run_cli("generate", prompts, "-o", tmp_path / "o", "-q", "--max-new-frames", "9")
    assert res.exit_code == 1
    bad = [m for m in read_manifest(tmp_path / "o") if m["id"] == "bad"][0]
    assert bad["status"] == "failed"
    assert f"row 2, field '{field}'" in bad["error"] and message in bad["error"]
    assert json.loads((tmp_path / "o/run.json").read_text())["totals"]["ok"] == 1
