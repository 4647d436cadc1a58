"""Long-form text: sentence splitting, chunk packing, chunk seeds, the crossfade join (pure), and
long rows end to end on the tiny default model: reproducible across runs, batch sizes and
row orders, boundaries recorded, each chunk conditioned on the previous ones, failures per row."""

from __future__ import annotations

import hashlib
import io
import json
import random

import numpy as np
import pytest
import soundfile as sf

from omni_cli.longform import (CROSSFADE_S, chunk_seed, crossfade_join, crossfade_samples, estimate_frames,
                               plan_chunks, split_sentences)
from tests.audio_controls import codec_stage, decode_as_the_run
from tests.conftest import TINY, read_manifest, run_cli, write_jsonl


# ---- splitting ----

TEXTS = [
    "Hello there. Dr. Smith came home! Did he? Yes... and then he left. \"Really?\" she asked. OK.",
    "Use e.g. this one. It costs 3.14 dollars. J. R. R. Tolkien wrote it. Mrs. Brown met Prof. Green at 5 p.m. today.",
    "Wait... What?! (Yes.) «Fine.» Done",
    "  Leading   spaces.\n\nA new paragraph!\tTabbed? ",
    "No stop at all",
    "你好。我是谁？再见！好",
    "他说：“走吧。”然后离开了。Then English. 最後です。",
    "...",
    "Mixed—dashes… and ellipses… Then. More!!! Yes?!",
]


def _nonspace(s: str) -> str:
    return "".join(s.split())


@pytest.mark.parametrize("text", TEXTS)
def test_split_keeps_every_character_in_order(text):
    parts = split_sentences(text)
    assert all(p == p.strip() and p for p in parts)
    if not any(c in text for c in "。！？"):  # a CJK stop may split a run without spaces
        assert " ".join(parts).split() == text.split()
    assert _nonspace("".join(parts)) == _nonspace(text)
    at = 0
    for p in parts:  # each sentence is a slice of the text, in order
        at = text.index(p, at) + len(p)
    for method in ("auto", "sentence", "none"):
        for budget in (1, 30, 10_000):
            chunks = plan_chunks(text, method, budget)
            assert _nonspace("".join(chunks)) == _nonspace(text), (method, budget)


def test_split_words_round_trip_on_random_text():
    rng = random.Random(0)
    pieces = ["Dr.", "e.g.", "word", "Word", "3.5", "end.", "End!", "why?", "U.S.", "...", "…", "\"Quote.\"", "(x.)",
              "J.", "a", "。", "好", "！", "\n", "  "]
    for _ in range(300):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        if not text.strip():
            continue
        parts = split_sentences(text)
        assert _nonspace("".join(parts)) == _nonspace(text), text
        if not any(c in text for c in "。！"):  # CJK stops split inside a whitespace-free run
            assert " ".join(parts).split() == text.split(), text


def test_split_sentence_rules():
    assert split_sentences(TEXTS[0]) == ["Hello there.", "Dr. Smith came home!", "Did he?",
                                         "Yes... and then he left.", "\"Really?\" she asked.", "OK."]
    assert split_sentences(TEXTS[1]) == ["Use e.g. this one.", "It costs 3.14 dollars.", "J. R. R. Tolkien wrote it.",
                                         "Mrs. Brown met Prof. Green at 5 p.m. today."]
    assert split_sentences(TEXTS[2]) == ["Wait...", "What?!", "(Yes.)", "«Fine.»", "Done"]
    assert split_sentences("你好。我是谁？再见！好") == ["你好。", "我是谁？", "再见！", "好"]
    assert split_sentences("他说：“走吧。”然后离开了。") == ["他说：“走吧。”", "然后离开了。"]
    assert split_sentences("No stop at all") == ["No stop at all"]


def test_plan_chunks_methods():
    five = "One is here. Two is here. Three is here. Four is here. Five is here."
    assert plan_chunks(five, "sentence", 2048) == split_sentences(five)
    assert plan_chunks(five, "none", 20) == [five]
    assert plan_chunks(five, "auto", 2048) == [five]  # fits: not split
    long = " ".join(f"Sentence number {i} is a little longer than the rest." for i in range(20))
    budget = 150
    assert estimate_frames(long) > budget
    chunks = plan_chunks(long, "auto", budget)
    assert len(chunks) > 1 and all(estimate_frames(c) <= budget for c in chunks)
    assert " ".join(chunks) == long  # sentences packed whole, in order
    # packing is greedy: no two neighbours would have fit together
    assert all(estimate_frames(a + " " + b) > budget for a, b in zip(chunks, chunks[1:]))
    with pytest.raises(ValueError):
        plan_chunks(five, "words", 10)


def test_estimate_counts_wide_characters_slower():
    assert estimate_frames("好" * 10) > estimate_frames("a" * 10)


# ---- seeds ----

def test_chunk_seed_depends_only_on_row_seed_and_index():
    assert chunk_seed(12345, 0) == 12345
    for s, k in ((0, 1), (12345, 3), (2**31 - 1, 7)):
        digest = hashlib.blake2b(f"omni-cli-chunk:{s}:{k}".encode(), digest_size=8).digest()
        assert chunk_seed(s, k) == int.from_bytes(digest, "little") & 0x7FFFFFFF
    seeds = [chunk_seed(99, k) for k in range(50)]
    assert len(set(seeds)) == 50


# ---- the crossfade ----

def test_crossfade_of_two_constants_is_an_equal_power_ramp():
    sr = 24000
    k = crossfade_samples(sr)
    assert k == round(CROSSFADE_S * sr) == 960
    a, b = np.full(3000, 10000, np.int16), np.full(2000, -6000, np.int16)
    joined, offsets = crossfade_join([a, b], k)
    assert len(joined) == 3000 + 2000 - k and offsets == [0, 3000 - k, len(joined)]
    # through a real file: what a reader gets back
    buf = io.BytesIO()
    sf.write(buf, joined, sr, format="WAV", subtype="PCM_16")
    back, _ = sf.read(io.BytesIO(buf.getvalue()), dtype="int16")
    assert (back[:3000 - k] == 10000).all() and (back[3000:] == -6000).all()
    t = (np.arange(k) + 0.5) / k
    ramp = np.rint(10000 * np.cos(np.pi / 2 * t) - 6000 * np.sin(np.pi / 2 * t))
    assert np.array_equal(back[3000 - k:3000], ramp.astype(np.int16))
    # equal power: two equal constants stay near their level (sin + cos >= 1 in the middle)
    same, _ = crossfade_join([np.full(2000, 1000, np.int16)] * 2, k)
    assert same.min() == 1000 and same.max() <= 1415


def test_crossfade_short_chunks_and_three_way():
    joined, offsets = crossfade_join([np.ones(100, np.int16), np.ones(50, np.int16), np.ones(400, np.int16)], 960)
    assert offsets == [0, 50, 50, 450] and len(joined) == 550 - 50 - 50  # an overlap never exceeds a chunk
    joined, offsets = crossfade_join([np.zeros(0, np.int16), np.ones(10, np.int16)], 960)
    assert len(joined) == 10 and offsets == [0, 0, 10]


# ---- end to end on the tiny default model ----

FIVE = ("The first sentence is here. Then a second one follows! Is this the third? Yes, the fourth. "
        "And the fifth ends it.")
OTHERS = [{"id": "a", "text": "Short one."}, {"id": "b", "text": "Another short row here, a bit longer."},
          {"id": "c", "text": "Third plain row."}, {"id": "d", "text": "Four."}, {"id": "e", "text": "Fifth plain."}]
LONG = {"id": "long", "text": FIVE, "chunk": "sentence"}


def _gen(tmp_path, name, rows, *args, code=0):
    prompts = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / name
    res = run_cli("generate", prompts, "-o", out, "-q", "--max-new-frames", "20", "--seed", "5", *args)
    assert res.exit_code == code, res.output
    return out


def _files(out, rid):
    return (out / f"audio/{rid}.wav").read_bytes(), (out / f"logprobs/{rid}.npz").read_bytes()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("longform")
    shuffled = OTHERS + [LONG]
    random.Random(2).shuffle(shuffled)
    return {
        "b4": _gen(tmp, "b4", [LONG] + OTHERS, "--deterministic", "--max-batch-size", "4"),
        "b4-again": _gen(tmp, "b4-again", [LONG] + OTHERS, "--deterministic", "--max-batch-size", "4"),
        "b1": _gen(tmp, "b1", [LONG] + OTHERS, "--deterministic", "--max-batch-size", "1"),
        "shuffled": _gen(tmp, "shuffled", shuffled, "--deterministic", "--max-batch-size", "3", "--async-decode"),
        "alone": _gen(tmp, "alone", [LONG], "--deterministic"),
        "tmp": tmp,
    }


def test_long_row_is_byte_identical_across_runs_batch_sizes_and_order(runs):
    base = runs["b4"]
    for name in ("b4-again", "b1", "shuffled", "alone"):
        assert _files(runs[name], "long") == _files(base, "long"), name
    for r in OTHERS:  # the long row's chunks left the other rows as they are
        assert _files(runs["b1"], r["id"]) == _files(base, r["id"])
        assert _files(runs["shuffled"], r["id"]) == _files(base, r["id"])


def test_boundaries_are_recorded_and_consistent(runs):
    out = runs["b4"]
    m = {r["id"]: r for r in read_manifest(out)}["long"]
    assert m["status"] == "ok" and m["chunks"] == 5 and m["chunk"] == "sentence"
    assert m["finish_reason"] == "length"  # every chunk ran to its 20 frames
    z = np.load(out / "logprobs/long.npz")
    frames, offsets, texts = z["chunk_frames"], z["chunk_samples"], list(z["chunk_texts"])
    assert texts == split_sentences(FIVE) and " ".join(texts) == FIVE
    assert frames[0] == 0 and frames[-1] == len(z["tokens"]) == len(z["logprobs"]) == len(z["mask"]) == m["frames"]
    assert (np.diff(frames) > 0).all() and len(frames) == 6 and len(offsets) == 6
    audio, sr = sf.read(out / "audio/long.wav", dtype="int16")
    assert offsets[0] == 0 and offsets[-1] == len(audio) and m["duration_s"] == round(len(audio) / sr, 6)
    # oracle: each chunk's frames decoded on their own, crossfaded, are the file's samples
    from omni_cli.runners.device import pick_device

    stage = codec_stage(TINY, device=pick_device("auto"))  # where the run decoded (CUDA on a GPU machine)
    tokens = z["tokens"]
    parts = decode_as_the_run(stage, out, [tokens[frames[i]:frames[i + 1]] for i in range(5)])
    joined, expect = crossfade_join(parts, crossfade_samples(sr))
    assert list(offsets) == expect and np.array_equal(joined, audio)
    assert all(offsets[i + 1] - offsets[i] == len(parts[i]) - crossfade_samples(sr) for i in range(4))


def test_each_chunk_conditions_on_the_previous_ones(runs):
    """Chunk 0 is the first sentence as a row of its own (same seed, no context): the positive
    control. Chunk 2 with its own seed but without chunks 0 and 1 before it differs from chunk 2
    of the long row; and with a buffer of 1 (chunk 1 only) it differs again."""
    tmp, base = runs["tmp"], runs["b4"]
    z = np.load(base / "logprobs/long.npz")
    frames, texts = z["chunk_frames"], list(z["chunk_texts"])
    seed = {r["id"]: r for r in read_manifest(base)}["long"]["seed"]
    alone = _gen(tmp, "chunks-alone", [{"id": "c0", "text": texts[0], "seed": chunk_seed(seed, 0)},
                                       {"id": "c2", "text": texts[2], "seed": chunk_seed(seed, 2)}], "--deterministic")
    c0, c2 = np.load(alone / "logprobs/c0.npz"), np.load(alone / "logprobs/c2.npz")
    span = [slice(frames[i], frames[i + 1]) for i in range(5)]
    for key in ("tokens", "logprobs"):
        assert np.array_equal(c0[key], z[key][span[0]])
    # the tiny random model's draws barely move with the context (the same codes, here), its
    # distributions do: without chunks 0 and 1 before it, chunk 2's logprobs are not the long row's
    assert np.abs(c2["logprobs"] - z["logprobs"][span[2]]).max() > 1e-3
    buf1 = np.load(_gen(tmp, "buffer1", [LONG], "--deterministic", "--chunk-buffer", "1") / "logprobs/long.npz")
    assert np.array_equal(buf1["logprobs"][:frames[2]], z["logprobs"][:frames[2]])  # chunks 0, 1: same context
    assert np.abs(buf1["logprobs"][span[2]] - z["logprobs"][span[2]]).max() > 1e-3


def test_auto_splits_only_rows_that_do_not_fit(runs):
    tmp = runs["tmp"]
    out = _gen(tmp, "auto", [{"id": "long", "text": FIVE}, OTHERS[0]], "--deterministic")
    m = {r["id"]: r for r in read_manifest(out)}
    assert m["long"]["chunks"] > 1 and "chunks" not in m["a"]
    z = np.load(out / "logprobs/long.npz")
    assert " ".join(z["chunk_texts"]) == FIVE
    # none: the long row is one request, as without chunking; a plain row has no chunk arrays
    out = _gen(tmp, "none", [{"id": "long", "text": FIVE}], "--chunk-method", "none")
    assert "chunks" not in read_manifest(out)[0]
    assert "chunk_frames" not in np.load(out / "logprobs/long.npz")


def test_a_failed_chunk_fails_only_its_row(tmp_path):
    """Chunk 2's prompt holds chunk 1's 300 frames: with its own 300, past max_seq_len 512. The
    row fails, naming the chunk; the others are written as without it."""
    bad = {"id": "bad", "text": FIVE, "chunk": "sentence", "max_new_frames": 300, "min_new_frames": 300}
    out = _gen(tmp_path, "fail", [bad] + OTHERS[:2], "--deterministic", code=1)
    m = {r["id"]: r for r in read_manifest(out)}
    assert m["bad"]["status"] == "failed" and "chunk 2 of 5" in m["bad"]["error"]
    assert "max_seq_len 512" in m["bad"]["error"] and m["bad"]["chunk"] == "sentence"
    assert not (out / "audio/bad.wav").exists()
    assert m["a"]["status"] == m["b"]["status"] == "ok"
    ok = _gen(tmp_path, "ok", OTHERS[:2], "--deterministic")
    assert _files(ok, "a") == _files(out, "a")


def test_the_buffer_shrinks_to_fit_max_seq_len(tmp_path):
    """160-frame chunks: chunk 3 after two of them would pass max_seq_len 512, so it follows the
    latest one only (as --chunk-buffer 1 gives); the row is written."""
    row = {"id": "long", "text": FIVE, "chunk": "sentence", "max_new_frames": 160, "min_new_frames": 160}
    two = np.load(_gen(tmp_path, "two", [row], "--deterministic") / "logprobs/long.npz")
    one = np.load(_gen(tmp_path, "one", [row], "--deterministic", "--chunk-buffer", "1") / "logprobs/long.npz")
    assert np.array_equal(two["logprobs"], one["logprobs"]) and two["chunk_frames"][-1] == 5 * 160


def test_a_chunk_whose_decode_fails_fails_its_row(tmp_path, monkeypatch):
    """Chunk 4's audio fails (as a codec error reaches the writer): the row is failed once, its
    chunk 5 (already running) is dropped, the other rows are written."""
    from omni_cli.chunked import ChunkedRows

    real = ChunkedRows.write

    def write(self, req, tokens, samples):
        real(self, req, tokens, RuntimeError("codec broke") if req.rid == "long#3" else samples)

    monkeypatch.setattr(ChunkedRows, "write", write)
    out = _gen(tmp_path, "decode", [LONG] + OTHERS[:2], "--deterministic", code=1)
    m = read_manifest(out)
    assert [r["id"] for r in m] == ["long", "a", "b"]
    assert m[0]["status"] == "failed" and m[0]["error"] == "row 1, chunk 4 of 5: decoding its audio failed: codec broke"
    assert m[1]["status"] == m[2]["status"] == "ok"
    assert not (out / "audio/long.wav").exists() and not (out / "logprobs/long.npz").exists()
    assert json.loads((out / "run.json").read_text())["totals"]["failed"] == 1


def test_verify_regenerates_long_rows(runs):
    res = run_cli("verify", runs["b4"], "--sample", "0")
    assert res.exit_code == 0, res.output
    assert "long\taudio =\tnpz =\tok" in res.output


def test_interrupted_mid_row_then_resume_is_byte_identical(runs, tmp_path, monkeypatch):
    """Ctrl-C once chunk 3 of the long row has finished: the row is recorded interrupted (no
    files), its finished chunks are kept (.chunks/long/), the rows done are kept; --resume goes on
    from the first chunk not kept, and the folder's files equal an uninterrupted run's."""
    from omni_cli.chunked import ChunkedRows

    real = ChunkedRows.finished

    def finished(self, reqs):
        real(self, reqs)
        if any(r.rid == "long#2" for r in reqs):
            raise KeyboardInterrupt

    prompts = write_jsonl(tmp_path / "p.jsonl", [LONG] + OTHERS)
    out = tmp_path / "o"
    cmd = ["generate", prompts, "-o", out, "-q", "--max-new-frames", "20", "--seed", "5", "--deterministic",
           "--max-batch-size", "4"]
    with monkeypatch.context() as mp:
        mp.setattr(ChunkedRows, "finished", finished)
        assert run_cli(*cmd).exit_code == 130
    m = {r["id"]: r for r in read_manifest(out)}
    assert m["long"]["status"] == "interrupted" and not (out / "audio/long.wav").exists()
    kept = sorted(p.name for p in (out / ".chunks" / "long").glob("[0-9]*.npz"))
    assert kept[:3] == ["0.npz", "1.npz", "2.npz"], kept
    queued = []
    real_request = ChunkedRows._request

    def request(self, lr, k, prompt):
        queued.append(k)
        return real_request(self, lr, k, prompt)

    monkeypatch.setattr(ChunkedRows, "_request", request)
    res = run_cli(*cmd, "--resume")
    assert res.exit_code == 0, res.output
    assert queued and min(queued) == len(kept)  # the kept chunks were not generated again
    for r in [LONG] + OTHERS:
        assert _files(out, r["id"]) == _files(runs["b4"], r["id"]), r["id"]
    assert not (out / ".chunks" / "long").exists()  # the row written: its chunks go


def test_chunk_field_and_flags_are_validated(tmp_path):
    rows = [{"id": "x", "text": "Hi.", "chunk": "words"}, {"id": "y", "text": "Hi.", "chunk": "none"}]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    res = run_cli("validate", prompts)
    assert res.exit_code == 2 and "id 'x': row 1, field 'chunk': must be one of auto, sentence, none" in res.output
    assert "'y'" not in res.output
    csv = tmp_path / "p.csv"
    csv.write_text("id,text,chunk\nx,Hi.,sentences\ny,Hi.,sentence\n")
    res = run_cli("validate", csv)
    assert res.exit_code == 2 and "row 1, field 'chunk'" in res.output and "'y'" not in res.output
    for flag in (["--chunk-method", "word"], ["--chunk-buffer", "0"]):
        res = run_cli("generate", prompts, "-o", tmp_path / "o", *flag)
        assert res.exit_code == 2 and flag[0] in res.output
        assert not (tmp_path / "o" / "metadata.jsonl").exists()


def test_resume_redoes_a_row_whose_chunking_changed(tmp_path):
    rows = [{"id": "long", "text": FIVE}, OTHERS[0]]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "o"
    base = ["generate", prompts, "-o", out, "-q", "--max-new-frames", "20", "--seed", "5", "--deterministic"]
    assert run_cli(*base).exit_code == 0
    first = {r["id"]: r for r in read_manifest(out)}
    assert first["long"]["chunks"] > 1
    res = run_cli(*base, "--resume", "--chunk-method", "none")
    assert res.exit_code == 0
    second = {r["id"]: r for r in read_manifest(out)}
    assert second["a"] == first["a"]  # not chunked either way: kept
    assert second["long"]["row_hash"] != first["long"]["row_hash"] and "chunks" not in second["long"]
    res = run_cli(*base, "--resume", "--chunk-buffer", "1")  # chunked again, another buffer: redone
    third = {r["id"]: r for r in read_manifest(out)}
    assert res.exit_code == 0 and third["long"]["chunks"] == first["long"]["chunks"]
    assert third["long"]["row_hash"] not in (first["long"]["row_hash"], second["long"]["row_hash"])
    res = run_cli(*base, "--resume", "--chunk-buffer", "1")  # unchanged: kept byte for byte
    assert {r["id"]: r for r in read_manifest(out)} == third
    assert json.loads((out / "run.json").read_text())["totals"]["kept"] == 2
