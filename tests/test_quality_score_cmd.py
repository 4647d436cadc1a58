"""`omni score OUT` (omni_cli/quality/rescore.py): a finished folder scored after the fact, over the
planted ASR (tests/planted_asr.py). The oracle for an omni folder is `omni generate --score` itself:
the same rows scored in the run write the same fields; for a plain folder, jiwer and the planted
transcript of each file. Resumable after a kill, and every flag error before a scorer is built."""

from __future__ import annotations

import csv
import json
import shutil

import jiwer
import numpy as np
import pytest
import soundfile as sf
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from tests.conftest import read_manifest, run_cli, write_jsonl
from tests.planted_asr import PlantedAsr, planted

ROWS = [{"id": f"q{i}", "text": f"the quick brown fox number {i} jumps over it", "max_new_frames": 10 + i % 3}
        for i in range(6)]
GEN = ("--deterministic", "--seed", "11", "--max-batch-size", "4", "-q")
SCORE = ("--score", "asr", "--reject", "wer>0.1")
ORACLE = ("--score", "asr,degenerate", "--reject", "wer>0.1,loop_s>1")  # degenerate: the npz's codes and logprobs
FIELDS = ("status", "scores", "score_notes", "transcript", "rejected_by")
NORM = EnglishTextNormalizer({})


class Counting(PlantedAsr):
    """The planted ASR, recording the ids of each batch it scores; `stop_at`: the call that raises
    KeyboardInterrupt (a kill there)."""

    calls: list[list[str]] = []
    stop_at: int | None = None

    def score(self, batch):
        if Counting.stop_at is not None and len(Counting.calls) + 1 == Counting.stop_at:
            raise KeyboardInterrupt
        Counting.calls.append([row.id for row in batch])
        return super().score(batch)


@pytest.fixture(autouse=True)
def counting_asr(monkeypatch):
    from omni_cli.quality import job

    Counting.calls, Counting.stop_at = [], None
    monkeypatch.setitem(job.FACTORIES, "asr", lambda settings, device: Counting())
    return Counting


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """ROWS generated without scoring, and with ORACLE's scoring."""
    from tests.planted_asr import planted_asr

    tmp = tmp_path_factory.mktemp("score-cmd")
    prompts = write_jsonl(tmp / "p.jsonl", ROWS)
    with planted_asr():
        for name, extra in (("plain", ()), ("scored", ORACLE)):
            res = run_cli("generate", prompts, "-o", tmp / name, *GEN, *extra)
            assert res.exit_code == 0, res.output
    return tmp / "plain", tmp / "scored"


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def wer(text: str, transcript: str) -> float:
    return jiwer.wer(NORM(text).strip(), NORM(transcript).strip())


def test_scoring_a_folder_writes_what_generate_writes(folders, tmp_path, counting_asr):
    plain, scored = folders
    out = copy(plain, tmp_path / "out")
    res = run_cli("score", out, *ORACLE, "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "6 rows scored" in res.output and "mean wer" in res.output, res.output
    got, want = read_manifest(out), read_manifest(scored)
    assert [r["id"] for r in got] == [r["id"] for r in want]
    for g, w in zip(got, want):
        assert (out / g["file_name"]).read_bytes() == (scored / w["file_name"]).read_bytes()  # the same audio
        assert {k: g.get(k) for k in FIELDS} == {k: w.get(k) for k in FIELDS}, g["id"]
        assert {k: v for k, v in g.items() if k not in FIELDS} == \
            {k: v for k, v in read_manifest(plain)[got.index(g)].items() if k not in FIELDS}  # nothing else changed
    assert {r["status"] for r in got} == {"ok", "rejected"}, "the planted ASR should reject some rows"
    run = json.loads((out / "run.json").read_text())
    assert run["scoring"]["rows_scored"] == 6 and run["scoring"]["rules"] == ["wer>0.1", "loop_s>1"]
    assert run["scoring"]["scorers"] == ["asr", "degenerate"] and not (out / ".omni.lock").exists()

    # again: every row skipped, nothing scored, the manifest unchanged
    before, n = (out / "metadata.jsonl").read_bytes(), len(counting_asr.calls)
    res = run_cli("score", out, *ORACLE)
    assert res.exit_code == 0 and "0 rows scored, 6 already scored" in res.output, res.output
    assert len(counting_asr.calls) == n and (out / "metadata.jsonl").read_bytes() == before
    # other rules judge the scores already there, without scoring: --reject none rejects nothing
    res = run_cli("score", out, "--score", "asr,degenerate", "--reject", "none", "-q")
    assert res.exit_code == 0 and len(counting_asr.calls) == n, res.output
    assert all(r["status"] == "ok" and "rejected_by" not in r for r in read_manifest(out))
    assert [r["scores"] for r in read_manifest(out)] == [r["scores"] for r in want]
    # --rescore scores every row again
    res = run_cli("score", out, *ORACLE, "--rescore", "-q")
    assert res.exit_code == 0 and sum(map(len, counting_asr.calls[n:])) == 6, res.output
    assert [{k: r.get(k) for k in FIELDS} for r in read_manifest(out)] == [{k: r.get(k) for k in FIELDS} for r in want]


def _wav_folder(tmp_path, manifest: str):
    rng = np.random.default_rng(5)
    out = tmp_path / "wavs"
    (out / "clips").mkdir(parents=True)
    rows = []
    for i in range(5):
        shape = (1600 + 400 * i, 2) if i == 3 else (1600 + 400 * i,)  # one stereo file: its channels' mean
        sf.write(out / "clips" / f"c{i}.wav", rng.uniform(-0.5, 0.5, shape).astype(np.float32), 16000,
                 subtype="PCM_16")
        rows.append({"file_name": f"clips/c{i}.wav", "sentence": f"a plain clip number {i} said here",
                     "speaker": f"s{i % 2}"})
    if manifest == "csv":
        with open(out / "metadata.csv", "w", newline="") as f:
            w = csv.DictWriter(f, ["file_name", "sentence", "speaker"])
            w.writeheader()
            w.writerows(rows)
    else:
        write_jsonl(out / "metadata.jsonl", rows)
    return out, rows


def _expected(out, row):
    audio, _ = sf.read(out / row["file_name"], dtype="float32", always_2d=True)
    transcript = planted(row["sentence"], audio.mean(axis=1, dtype=np.float32))
    return transcript, wer(row["sentence"], transcript)


def test_a_plain_csv_folder_gets_score_columns(tmp_path):
    out, rows = _wav_folder(tmp_path, "csv")
    res = run_cli("score", out, *SCORE, "--text-column", "sentence", "--batch-size", "2")
    assert res.exit_code == 0, res.output
    with open(out / "metadata.csv", newline="") as f:
        reader = csv.DictReader(f)
        got = list(reader)
    assert reader.fieldnames[:3] == ["file_name", "sentence", "speaker"]  # the columns kept, in place
    assert {"status", "score_wer", "score_cer", "transcript", "rejected_by", "score_notes"} <= set(reader.fieldnames)
    assert not (out / "metadata.jsonl").exists()
    for g, row in zip(got, rows):
        transcript, want = _expected(out, row)
        assert {k: g[k] for k in ("file_name", "sentence", "speaker")} == row
        assert g["transcript"] == transcript and float(g["score_wer"]) == pytest.approx(want, rel=1e-5)
        assert g["score_cer"] == "" and "cer" in json.loads(g["score_notes"])
        assert g["status"] == ("rejected" if want > 0.1 else "ok")
        assert g["rejected_by"] == (f"wer={float(g['score_wer']):.4g}>0.1" if want > 0.1 else "")
    assert {g["status"] for g in got} == {"ok", "rejected"}
    # read back as scored: a second run scores nothing
    res = run_cli("score", out, *SCORE, "--text-column", "sentence")
    assert res.exit_code == 0 and "0 rows scored, 5 already scored" in res.output, res.output


def test_a_plain_jsonl_folder_gets_the_json_fields(tmp_path):
    out, rows = _wav_folder(tmp_path, "jsonl")
    res = run_cli("score", out, "--score", "asr", "--reject", "none", "--text-column", "sentence", "-q")
    assert res.exit_code == 0, res.output
    for g, row in zip(read_manifest(out), rows):
        transcript, want = _expected(out, row)
        assert g["transcript"] == transcript and g["scores"]["wer"] == pytest.approx(want, rel=1e-5)
        assert g["status"] == "ok" and "rejected_by" not in g and g["speaker"] == row["speaker"]


def test_a_killed_run_resumes_where_it_stopped(folders, tmp_path, counting_asr):
    plain, _ = folders
    whole = copy(plain, tmp_path / "whole")
    assert run_cli("score", whole, *SCORE, "--batch-size", "2", "-q").exit_code == 0
    counting_asr.calls.clear()

    out = copy(plain, tmp_path / "out")
    counting_asr.stop_at = 2  # the second batch's call: a kill after the first batch was saved
    res = run_cli("score", out, *SCORE, "--batch-size", "2", "-q")
    assert res.exit_code == 130 and "interrupted after 2 rows scored" in res.output, res.output
    first = counting_asr.calls[0]
    assert [r["id"] for r in read_manifest(out) if "scores" in r] == first == ["q0", "q1"]
    assert not (out / ".omni.lock").exists()

    counting_asr.stop_at, counting_asr.calls[:] = None, []
    res = run_cli("score", out, *SCORE, "--batch-size", "2")
    assert res.exit_code == 0 and "4 rows scored, 2 already scored" in res.output, res.output
    # the first batch was not scored again
    assert sorted(i for call in counting_asr.calls for i in call) == ["q2", "q3", "q4", "q5"]
    assert (out / "metadata.jsonl").read_bytes() == (whole / "metadata.jsonl").read_bytes()


@pytest.mark.parametrize("flags, message", [
    (("--reject", "wer>0.1"), "--score: name the scorers"),
    (("--score", "asr", "--reject", "wer=0.1"), "'wer=0.1' is not a rule"),
    (("--score", "asr", "--reject", "dnsmos_ovrl<3"), "comes from the mos scorer"),
    (("--score", "asr,bogus"), "'bogus' is not a scorer"),
    (("--score", "asr", "--device", "gpu"), "--device: must be auto, cpu, cuda or cuda:N"),
    (("--score", "asr", "--batch-size", "0"), "--batch-size: must be an integer >= 1"),
    (("--score", "speaker", "--speaker-model", "./no/such/folder"), "--speaker-model: folder"),
])
def test_bad_flags_exit_2_before_any_scorer(folders, tmp_path, monkeypatch, flags, message):
    from omni_cli.quality import job

    built = []
    for name in job.FACTORIES:
        monkeypatch.setitem(job.FACTORIES, name, lambda settings, device: built.append(1))
    out = copy(folders[0], tmp_path / "out")
    before = (out / "metadata.jsonl").read_bytes()
    res = run_cli("score", out, *flags)
    assert res.exit_code == 2 and message in res.output, res.output
    assert not built and (out / "metadata.jsonl").read_bytes() == before


def test_bad_folders_exit_2_naming_what_is_missing(tmp_path, counting_asr):
    res = run_cli("score", tmp_path / "nope", *SCORE)
    assert res.exit_code == 2 and "no such folder" in res.output, res.output
    (tmp_path / "wavs").mkdir()
    sf.write(tmp_path / "wavs" / "a.wav", np.zeros(160, np.float32), 16000)
    res = run_cli("score", tmp_path / "wavs", *SCORE)
    assert res.exit_code == 2 and "metadata.jsonl or metadata.csv" in res.output and "1 audio files" in res.output
    (tmp_path / "wavs" / "metadata.csv").write_text("file_name,sentence\na.wav,hello there\n")
    res = run_cli("score", tmp_path / "wavs", *SCORE)
    assert res.exit_code == 2 and "no column 'text'" in res.output, res.output
    assert not counting_asr.calls and not (tmp_path / "wavs" / ".omni.lock").exists()


def test_a_row_whose_audio_is_gone_is_named_and_the_rest_scored(folders, tmp_path):
    out = copy(folders[0], tmp_path / "out")
    (out / "audio" / "q2.wav").unlink()
    res = run_cli("score", out, *SCORE)
    assert res.exit_code == 1, res.output
    assert "metadata.jsonl line 3, id 'q2'" in res.output and "field 'file_name'" in res.output, res.output
    rows = read_manifest(out)
    assert [r["id"] for r in rows if "scores" in r] == ["q0", "q1", "q3", "q4", "q5"]
    assert rows[2] == read_manifest(folders[0])[2]  # left as it was
    assert "q2" in json.loads((out / "run.json").read_text())["scoring"]["unscored"][0]


def test_a_folder_in_use_is_refused(folders, tmp_path, counting_asr):
    """The lock `omni generate` holds: a score and a generate into one folder never run together."""
    from omni_cli.folder import prepare_out_dir

    out = copy(folders[0], tmp_path / "out")
    lock = prepare_out_dir(out, overwrite=False, resume=True)  # as a generate --resume running there
    try:
        res = run_cli("score", out, *SCORE)
        assert res.exit_code == 2 and "in use by another omni run" in res.output, res.output
    finally:
        lock.release()
    assert not counting_asr.calls and run_cli("score", out, *SCORE, "-q").exit_code == 0
