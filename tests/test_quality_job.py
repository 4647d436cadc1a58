"""Scoring in the job (issue 46): the gate over a planted ASR (tests/planted_asr.py: the real
AsrScorer and jiwer, a transcript planted from each attempt's audio), attempts with derived seeds,
best-of, --drop-rejected, byte-identical reruns, --resume after a kill among retries, and every
--score / --reject / quality: error before anything loads."""

from __future__ import annotations

import hashlib
import json

import jiwer
import numpy as np
import pytest
import soundfile as sf
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from tests.conftest import TINY, digests, read_manifest, run_cli, write_jsonl

ROWS = [{"id": f"q{i}", "text": f"the quick brown fox number {i} jumps over it", "max_new_frames": 10 + i % 3}
        for i in range(6)]
FLAGS = ("--deterministic", "--seed", "11", "--max-batch-size", "4", "-q", "--score", "asr", "--reject", "wer>0.1")
NORM = EnglishTextNormalizer({})


@pytest.fixture(autouse=True)
def planted_asr(monkeypatch):
    from omni_cli.quality import job
    from tests.planted_asr import PlantedAsr

    monkeypatch.setitem(job.FACTORIES, "asr", lambda settings, device: PlantedAsr())


def oracle_seed(row_seed: int, attempt: int) -> int:
    """The issue's derived seed, from its definition: BLAKE2b-64 of 'omni-cli-attempt:seed:k', 31 bits."""
    if attempt == 0:
        return row_seed
    digest = hashlib.blake2b(f"omni-cli-attempt:{row_seed}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def wer(text: str, transcript: str) -> float:
    return jiwer.wer(NORM(text).strip(), NORM(transcript).strip())


def audio_of(path) -> np.ndarray:
    pcm, _ = sf.read(path, dtype="int16")
    return pcm.astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def retried(tmp_path_factory):
    """ROWS under --retry 3, and the same run again into a second folder."""
    from tests.planted_asr import run_twice

    return run_twice(tmp_path_factory.mktemp("retry"), ROWS, (*FLAGS, "--retry", "3"))


def test_retries_follow_the_gate_with_derived_seeds(retried, tmp_path):
    prompts, out, _ = retried
    rows = read_manifest(out)
    assert [r["id"] for r in rows] == [r["id"] for r in ROWS]
    for r in rows:
        attempts = r["attempts"]
        first = attempts[0]["seed"]
        assert [a["seed"] for a in attempts] == [oracle_seed(first, k) for k in range(len(attempts))]
        for a in attempts:  # each attempt's WER is jiwer's on its transcript, its status the rule's
            assert a["scores"]["wer"] == pytest.approx(wer(r["text"], a["transcript"]), rel=1e-5)
            assert a["status"] == ("rejected" if a["scores"]["wer"] > 0.1 else "ok")
        passing = [a for a in attempts if a["status"] == "ok"]
        if passing:  # the first attempt that passes ends the row's attempts and is kept
            assert passing == [attempts[-1]] and r["attempt"] == attempts[-1]["attempt"]
        else:  # four attempts, none passing: the lowest WER, the earlier on a tie
            assert len(attempts) == 4
            assert r["attempt"] == min(attempts, key=lambda a: (a["scores"]["wer"], a["attempt"]))["attempt"]
        kept = attempts[r["attempt"]]
        assert r["seed"] == kept["seed"] and r["status"] == kept["status"]
        # the kept file is that attempt's: its transcript planted from the file's own samples
        assert r["transcript"] == kept["transcript"] == planted_from_file(out / r["file_name"], r["text"])
    assert any(len(r["attempts"]) > 1 for r in rows), "no row was retried: the test shows nothing"
    assert any(r["attempt"] > 0 and r["status"] == "ok" for r in rows), "no retry passed"


def planted_from_file(path, text):
    from tests.planted_asr import planted

    return planted(text, audio_of(path))


def test_a_kept_attempt_is_the_row_run_alone_at_its_seed(retried, tmp_path):
    """The kept attempt's files are what a run without scoring writes for the row at that seed."""
    prompts, out, _ = retried
    rows = [r for r in read_manifest(out) if r["attempt"] > 0]
    again = write_jsonl(tmp_path / "p.jsonl", [{**next(x for x in ROWS if x["id"] == r["id"]), "seed": r["seed"]}
                                               for r in rows])
    res = run_cli("generate", again, "-o", tmp_path / "plain", "--deterministic", "-q")
    assert res.exit_code == 0, res.output
    for r in rows:
        assert (out / r["file_name"]).read_bytes() == (tmp_path / "plain" / "audio" / f"{r['id']}.wav").read_bytes()
        assert (out / r["logprobs_file"]).read_bytes() == \
            (tmp_path / "plain" / "logprobs" / f"{r['id']}.npz").read_bytes()


def test_rerun_is_byte_identical(retried):
    _, a, b = retried
    assert digests(a) == digests(b)
    run = json.loads((a / "run.json").read_text())
    assert run["quality"]["retries"] == sum(len(r["attempts"]) - 1 for r in read_manifest(a))
    assert run["totals"]["ok"] + run["totals"]["rejected"] == len(ROWS)
    from omni_cli.quality.settings import QualitySettings

    q = run["quality"]  # the scoring calls: each within the (default) batch size, together every attempt
    assert 1 <= q["largest_call"] <= QualitySettings.batch_size
    assert q["score_calls"] * q["largest_call"] >= q["rows_scored"]
    assert q["rows_scored"] == sum(len(r["attempts"]) for r in read_manifest(a))


def test_resume_after_a_kill_among_retries(retried, tmp_path):
    prompts, reference, _ = retried
    out = tmp_path / "out"
    attempts = sum(len(r["attempts"]) for r in read_manifest(reference))
    assert attempts - len(ROWS) >= 2, "fewer than two retries: the kill would not fall among them"
    from tests.planted_asr import killed_then_resumed

    # killed with one attempt left: the retries before it are written, the run's last still to come
    killed_then_resumed(prompts, out, (*FLAGS, "--retry", "3"), f"mid:{attempts - 1}")
    assert digests(out) == digests(reference)


def test_best_of_keeps_the_best_attempt_and_drop_rejected_moves_files(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", ROWS[:4])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--best-of", "3", "--drop-rejected")
    assert res.exit_code == 0, res.output
    for r in read_manifest(out):
        attempts = r["attempts"]
        assert len(attempts) == 3
        assert [a["seed"] for a in attempts] == [oracle_seed(attempts[0]["seed"], k) for k in range(3)]
        best = min(attempts, key=lambda a: (a["status"] != "ok", a["scores"]["wer"], a["attempt"]))
        assert r["attempt"] == best["attempt"] and r["status"] == best["status"]
        folder = "rejected/" if r["status"] == "rejected" else ""
        assert r["file_name"] == f"{folder}audio/{r['id']}.wav" and (out / r["file_name"]).is_file()
        assert r["logprobs_file"] == f"{folder}logprobs/{r['id']}.npz" and (out / r["logprobs_file"]).is_file()


def test_resume_keeps_rejected_rows_and_verify_checks_them(retried, tmp_path):
    import shutil

    prompts, reference, _ = retried
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    res = run_cli("generate", prompts, "-o", out, *FLAGS, "--retry", "3", "--resume")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "run.json").read_text())["totals"]["kept"] == len(ROWS)  # nothing redone
    assert digests(out) == digests(reference)
    res = run_cli("verify", out, "--sample", "0", "-q")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("flags, message", [
    (("--retry", "2"), "--retry: needs scorers"),
    (("--score", "asr,bogus"), "'bogus' is not a scorer"),
    (("--score", "mos", "--reject", "wer>0.1"), "comes from the asr scorer"),
    (("--score", "asr", "--reject", "none", "--best-of", "2"), "--best-of: needs rules"),
    (("--score", "degenerate", "--best-of", "0"), "--best-of: must be an integer >= 1"),
    (("--score", "speaker", "--speaker-model", "./no/such/folder"), "--speaker-model: folder"),
])
def test_bad_flags_exit_2_before_loading(tmp_path, flags, message):
    prompts = write_jsonl(tmp_path / "p.jsonl", ROWS[:1])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", *flags)
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "out").exists()  # nothing loaded, nothing written


def test_yaml_quality_section_errors_name_file_and_key(tmp_path):
    from omni_cli.config import CONFIG_DIR, DEFAULT_CONFIG

    cfg = tmp_path / "m.yaml"
    base = (CONFIG_DIR / f"{DEFAULT_CONFIG}.yaml").read_text().replace("./tiny-higgs-audio-v2", str(TINY))
    cfg.write_text(base + "quality:\n  score: asr\n  reject: wer>>0.1\n")
    prompts = write_jsonl(tmp_path / "p.jsonl", ROWS[:1])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--model", cfg)
    assert res.exit_code == 2 and str(cfg) in res.output and "quality.reject" in res.output, res.output
    cfg.write_text(base + "quality:\n  score: asr\n  retries: 2\n")
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--model", cfg)
    assert res.exit_code == 2 and "quality.retries" in res.output and "unknown key" in res.output, res.output


def test_two_worker_processes_score_as_one_process(tmp_path):
    """--devices: each worker scores its share; the folder is byte-identical to one process's."""
    prompts = write_jsonl(tmp_path / "p.jsonl", ROWS)
    flags = ("--deterministic", "--seed", "11", "--score", "degenerate", "--reject", "seconds_per_char>0.15")
    assert run_cli("generate", prompts, "-o", tmp_path / "one", *flags).exit_code == 0
    res = run_cli("generate", prompts, "-o", tmp_path / "two", *flags, "--devices", "cpu,cpu")
    assert res.exit_code == 0, res.output
    assert digests(tmp_path / "two") == digests(tmp_path / "one")
    rows = read_manifest(tmp_path / "one")
    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["totals"]["ok"] + run["totals"]["rejected"] == len(ROWS) and {r["status"] for r in rows} <= {"ok", "rejected"}
    # the parent's summary line carries the means of the workers' scores
    mean = sum(r["scores"]["seconds_per_char"] for r in rows) / len(rows)
    assert f"seconds_per_char {mean:.3g}" in res.output, res.output
