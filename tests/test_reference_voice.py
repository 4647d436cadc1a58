"""Voice cloning from reference audio: parity with transformers, the voice bank, the cache, errors.

The oracle for generation is transformers' HiggsAudioV2Processor (it encodes the reference
with HiggsAudioV2TokenizerModel, wraps and delays the codes, expands <|AUDIO_OUT|>) and
HiggsAudioV2ForConditionalGeneration.generate on what it builds. The embedded tiny codec's
encode side is driven by its audio (tests/tiny_checkpoint.py: drive_encoder), so different
clips give different codes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.conftest import TINY, read_manifest, run_cli, write_config, write_jsonl

SR = 24000
MAX_FRAMES = 40


def _clip(seconds: float, freq: float, seed: int, rate: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


@pytest.fixture()
def voices(tmp_path, monkeypatch):
    """Two reference clips (one at 44.1 kHz stereo, lengths not a whole number of frames), a bank, a cache."""
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path / "cache"))
    sf.write(tmp_path / "alice.wav", _clip(1.77, 220, 0), SR)
    stereo = np.stack([_clip(1.3, 330, 1, 44100), _clip(1.3, 440, 2, 44100)], axis=1)
    sf.write(tmp_path / "bob.flac", stereo, 44100)
    (tmp_path / "voices.yaml").write_text("voices:\n  alice: {audio: alice.wav, text: This is Alice speaking.}\n"
                                          "  bob: {audio: bob.flac, text: Bob here.}\n")
    return tmp_path


def _generate(tmp_path, rows, *flags, name="out", cfg=None):
    prompts = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / name
    args = ["generate", prompts, "-o", out, "--voices", tmp_path / "voices.yaml", "--quiet", *map(str, flags)]
    if cfg is not None:
        args += ["--model", cfg]
    return run_cli(*args), out


def _encoder_calls(monkeypatch) -> list[int]:
    """Clips each call of the codec encoder received."""
    from omni_cli.runners.higgs_audio_v2.encoder import HiggsCodecEncoder

    calls: list[int] = []
    real = HiggsCodecEncoder.encode

    def counting(self, audio):
        calls.append(len(audio))
        return real(self, audio)

    monkeypatch.setattr(HiggsCodecEncoder, "encode", counting)
    return calls


def test_greedy_with_a_reference_equals_transformers(voices):
    from tests.reference import SYSTEM, Reference

    rows = [{"id": "a", "text": "Hello world.", "voice": "alice"},
            {"id": "b", "text": "A second row, longer than the first.", "voice": "bob"},
            {"id": "c", "text": "Hello world.", "ref_audio": "alice.wav", "ref_text": "This is Alice speaking."},
            {"id": "d", "text": "No reference at all."}]
    res, out = _generate(voices, rows, "--temperature", 0, "--max-new-frames", MAX_FRAMES, "--max-batch-size", 2)
    assert res.exit_code == 0, res.output
    ref = Reference(TINY)
    refs = {"alice": ("alice.wav", "This is Alice speaking."), "bob": ("bob.flac", "Bob here.")}
    for m, row in zip(read_manifest(out), rows):
        name = row.get("voice") or ("alice" if "ref_audio" in row else None)
        conv = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]}]
        audio = None
        if name:
            file, transcript = refs[name]
            samples, rate = sf.read(voices / file, dtype="float32", always_2d=True)
            samples = samples.mean(axis=1, dtype=np.float32)
            if rate != SR:  # the processor takes audio at the codec's rate
                from omni_cli.runners.resample import resample

                samples = resample(torch.from_numpy(samples), rate, SR).numpy()
            audio = [samples]
            conv += [{"role": "user", "content": [{"type": "text", "text": transcript}]},
                     {"role": "assistant", "content": [{"type": "audio", "audio": "<|AUDIO_OUT|>"}]}]
            assert m["reference"]["sha256"] and m["reference"]["text"] == transcript
        conv.append({"role": "user", "content": [{"type": "text", "text": row["text"]}]})
        text = ref.processor.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        inputs = ref.processor(text=text, audio=audio, return_tensors="pt")
        with torch.no_grad():
            got = ref.model.generate(**inputs, max_new_tokens=MAX_FRAMES, do_sample=False,
                                     return_dict_in_generate=True, output_scores=True)
        # transformers' audio_sequences start with the prompt's (delayed) reference frames
        given = inputs["audio_input_ids"].shape[1] if audio else 0
        codes_ref = got.audio_sequences[0][given:].numpy()
        z = np.load(out / m["logprobs_file"])
        # the row's own frames only, from its stream-BOS frame on: the reference is not repeated
        np.testing.assert_array_equal(z["tokens"], codes_ref)
        scores = torch.stack(got.scores, dim=0)[:, 0]
        lp_ref = scores.log_softmax(-1).gather(-1, torch.from_numpy(codes_ref)[:, :, None])[..., 0].numpy()
        np.testing.assert_allclose(z["logprobs"], lp_ref, atol=1e-5, rtol=0)


def test_a_voice_is_encoded_once_and_then_read_from_the_cache(voices, monkeypatch):
    calls = _encoder_calls(monkeypatch)
    rows = [{"id": f"r{i}", "text": f"Row number {i}.", "voice": "alice"} for i in range(50)]
    res, out = _generate(voices, rows, "--max-new-frames", 9, "--max-batch-size", 4, "--deterministic", "--seed", 1)
    assert res.exit_code == 0, res.output
    assert calls == [1]  # 50 rows, one clip through the encoder
    run = json.loads((out / "run.json").read_text())
    assert run["references"] == {"distinct": 1, "encoded": 1, "cached": 0}
    assert "encoder_s" in run["timings"]["load_phases"]  # a clip the cache lacked: the encoder loaded with the model
    res, out2 = _generate(voices, rows[:3], "--max-new-frames", 9, "--deterministic", "--seed", 1, name="again")
    assert res.exit_code == 0, res.output
    assert calls == [1]  # the second run never ran the encoder
    run2 = json.loads((out2 / "run.json").read_text())
    assert run2["references"] == {"distinct": 1, "encoded": 0, "cached": 1}
    assert "encoder_s" not in run2["timings"]["load_phases"]  # every clip cached: no encoder loaded
    # the cached codes are the same codes: the rows' files are byte-identical to the first run's
    for rid in ("r0", "r1", "r2"):
        assert (out / f"audio/{rid}.wav").read_bytes() == (out2 / f"audio/{rid}.wav").read_bytes()


def test_voices_encode_fills_the_cache(voices, monkeypatch):
    calls = _encoder_calls(monkeypatch)
    res = run_cli("voices", "encode", voices / "voices.yaml")
    assert res.exit_code == 0, res.output
    assert sorted(calls) == [2]  # both voices, one call
    assert "alice:" in res.output and "bob:" in res.output
    res, out = _generate(voices, [{"id": "a", "text": "Hi.", "voice": "bob"}], "--max-new-frames", 9)
    assert res.exit_code == 0, res.output
    assert calls == [2]


def test_different_voices_never_share_a_prefix(voices, monkeypatch):
    """Two voices with equal transcripts and equal lengths give prompts of equal ids; only their
    audio codes differ. Batched (the prefix cache shares what their content has in common), each row
    must equal itself run alone."""
    sf.write(voices / "carol.wav", _clip(1.77, 523, 7), SR)  # alice's length, other audio
    (voices / "voices.yaml").write_text("voices:\n  alice: {audio: alice.wav, text: Same words.}\n"
                                        "  carol: {audio: carol.wav, text: Same words.}\n")
    rows = [{"id": "a", "text": "Identical text.", "voice": "alice"},
            {"id": "c", "text": "Identical text.", "voice": "carol"}]
    res, together = _generate(voices, rows, "--temperature", 0, "--max-new-frames", 12, "--max-batch-size", 2)
    assert res.exit_code == 0, res.output
    alone = {}
    for row in rows:
        res, alone[row["id"]] = _generate(voices, [row], "--temperature", 0, "--max-new-frames", 12,
                                         name=f"alone-{row['id']}")
        assert res.exit_code == 0, res.output
    a = np.load(together / "logprobs/a.npz")["tokens"]
    c = np.load(together / "logprobs/c.npz")["tokens"]
    assert not np.array_equal(a, c)  # the voices matter: a shared prefix would have made these one
    for rid in ("a", "c"):
        np.testing.assert_array_equal(np.load(together / f"logprobs/{rid}.npz")["tokens"],
                                      np.load(alone[rid] / f"logprobs/{rid}.npz")["tokens"])


def test_every_bad_reference_fails_its_row_alone(voices):
    (voices / "notaudio.wav").write_text("this is not a wav file")
    sf.write(voices / "empty.wav", np.zeros(0, np.float32), SR)
    sf.write(voices / "silent.wav", np.zeros(SR, np.float32), SR)
    sf.write(voices / "long.wav", _clip(12.0, 200, 3), SR)
    cfg = write_config(voices / "small.yaml", TINY, max_seq_len=256)
    bad = {"missing": {"ref_audio": "nope.wav", "ref_text": "x"},
           "unreadable": {"ref_audio": "notaudio.wav", "ref_text": "x"},
           "empty": {"ref_audio": "empty.wav", "ref_text": "x"},
           "silent": {"ref_audio": "silent.wav", "ref_text": "x"},
           "toolong": {"ref_audio": "long.wav", "ref_text": "x"},
           "unknown": {"voice": "nobody"}}
    rows = [{"id": "ok1", "text": "Fine.", "voice": "alice"}]
    rows += [{"id": k, "text": "Some words.", **v} for k, v in bad.items()]
    rows += [{"id": "ok2", "text": "Also fine."}]
    res, out = _generate(voices, rows, "--max-new-frames", 9, cfg=cfg)
    assert res.exit_code == 1, res.output
    manifest = {m["id"]: m for m in read_manifest(out)}
    assert manifest["ok1"]["status"] == "ok" and manifest["ok2"]["status"] == "ok"
    for k in bad:
        assert manifest[k]["status"] == "failed", k
        field = "voice" if k == "unknown" else "ref_audio"
        assert f"field '{field}'" in manifest[k]["error"], manifest[k]["error"]
    assert "no such file" in manifest["missing"]["error"]
    assert "empty" in manifest["empty"]["error"] and "silent" in manifest["silent"]["error"]
    assert "at most" in manifest["toolong"]["error"] and " s" in manifest["toolong"]["error"]


def test_validate_names_reference_problems_before_loading(voices):
    prompts = write_jsonl(voices / "v.jsonl", [
        {"id": "a", "text": "x", "ref_audio": "alice.wav"},
        {"id": "b", "text": "x", "voice": "alice", "ref_audio": "alice.wav", "ref_text": "y"},
        {"id": "c", "text": "x", "voice": "zed"},
        {"id": "d", "text": "x", "voice": "alice"}])
    res = run_cli("validate", prompts, "--voices", voices / "voices.yaml")
    assert res.exit_code == 2
    assert "row 1, field 'ref_text'" in res.output and "row 2, field 'voice'" in res.output
    assert "row 3, field 'voice'" in res.output and "id 'd'" not in res.output


def test_verify_regenerates_voice_rows(voices):
    rows = [{"id": f"r{i}", "text": f"Words {i}.", "voice": "alice" if i % 2 else "bob"} for i in range(4)]
    res, out = _generate(voices, rows, "--max-new-frames", 10, "--deterministic", "--seed", 3)
    assert res.exit_code == 0, res.output
    res = run_cli("verify", out, "--sample", "0", "--quiet")
    assert res.exit_code == 0, res.output


def test_deterministic_rows_sharing_a_voice_are_byte_identical_across_batch_sizes(voices):
    """--deterministic with rows that share a voice and a row that has none: every row's wav and npz
    are the same bytes at --max-batch-size 1 and 4 (the prefix cache shares nothing in this mode,
    so a row's keys never come from another row's prefill shape)."""
    import hashlib

    rows = [{"id": f"a{i}", "text": t, "voice": "alice"} for i, t in enumerate(["One.", "Two words.", "Three."])]
    rows += [{"id": "b0", "text": "Bob too.", "voice": "bob"}, {"id": "plain", "text": "No voice."}]
    got = {}
    for batch in (1, 4):
        res, out = _generate(voices, rows, "--deterministic", "--seed", 3, "--max-new-frames", 12,
                             "--max-batch-size", batch, name=f"b{batch}")
        assert res.exit_code == 0, res.output
        got[batch] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for d in ("audio", "logprobs")
                      for p in sorted((out / d).glob("*"))}
        assert json.loads((out / "run.json").read_text())["prefix_cache"]["reused_positions"] == 0
    assert got[1] == got[4] and len(got[1]) == 2 * len(rows)
    assert len(set(got[1].values())) == len(got[1])  # control: every file its own


def test_the_queue_takes_each_voices_first_row_then_each_voice_together():
    """omni_cli/voices.py: queue_order, as the job sorts rows: the first row of every voice first
    (their prefixes computed side by side), then every voice's other rows together, input order
    kept within a voice; rows without a reference form one group."""
    from types import SimpleNamespace

    from omni_cli.voices import queue_order

    voices = ["b", None, "a", "b", "c", None, "a", "b"]
    rows = [SimpleNamespace(i=i, reference=None if v is None else (object(), v)) for i, v in enumerate(voices)]
    entries = sorted([(r, "rest of the entry") for r in rows], key=queue_order(rows))
    order = [e[0].i for e in entries]
    firsts = {v: voices.index(v) for v in ("a", "b", "c")}
    assert sorted(order[:3]) == sorted(firsts.values())  # one first row a voice, ahead of every other row
    rest = order[3:]
    assert sorted(rest) == sorted(set(range(8)) - set(firsts.values()))
    for v in ("a", "b", None):  # each voice's other rows contiguous, in input order
        at = [k for k, i in enumerate(rest) if voices[i] == v]
        assert at == list(range(at[0], at[0] + len(at))) and [rest[k] for k in at] == sorted(rest[k] for k in at)
