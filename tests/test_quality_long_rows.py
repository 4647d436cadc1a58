"""Scoring's attempts for long rows (issue 46; omni_cli/chunked.py: ChunkedRows.retry): a long row that
fails the gate runs every chunk again at the attempt's derived seed, from chunk 0, under request ids of
its own, beside plain rows' attempts. Over the planted ASR (tests/planted_asr.py): the seeds are the
issue's, the statuses follow jiwer's WER, the kept file is its attempt's (transcript planted from the
file), a run without scoring at the kept seed writes the same bytes, reruns are byte-identical, and
--best-of runs each long row's chunks that many times."""

from __future__ import annotations

import json

import pytest

from tests.conftest import digests, read_manifest, run_cli, write_jsonl
from tests.test_quality_job import audio_of, oracle_seed, planted_asr, wer  # noqa: F401  (its autouse fixture)

FIVE = "The first sentence is here. Then a second one follows! Is this the third? Yes, the fourth."
ROWS = [{"id": "long1", "text": FIVE, "chunk": "sentence"},
        {"id": "plain", "text": "the quick brown fox jumps over it"},
        {"id": "long2", "text": "One more row. It has two sentences.", "chunk": "sentence"}]
FLAGS = ("--deterministic", "--seed", "11", "--max-batch-size", "4", "-q", "--max-new-frames", "20",
         "--score", "asr", "--reject", "wer>0.1")


@pytest.fixture(scope="module")
def retried(tmp_path_factory):
    from tests.planted_asr import run_twice

    return run_twice(tmp_path_factory.mktemp("long-retry"), ROWS, (*FLAGS, "--retry", "3"))[1:]


def test_a_long_row_is_retried_whole_at_derived_seeds(retried):
    from tests.planted_asr import planted

    out, _ = retried
    rows = {r["id"]: r for r in read_manifest(out)}
    assert list(rows) == [r["id"] for r in ROWS]
    for rid in ("long1", "long2"):
        r = rows[rid]
        assert r["chunks"] > 1
        attempts = r["attempts"]
        assert [a["seed"] for a in attempts] == [oracle_seed(attempts[0]["seed"], k) for k in range(len(attempts))]
        for a in attempts:
            assert a["scores"]["wer"] == pytest.approx(wer(r["text"], a["transcript"]), rel=1e-5)
            assert a["status"] == ("rejected" if a["scores"]["wer"] > 0.1 else "ok")
        if any(a["status"] == "ok" for a in attempts):  # the first that passes ends the row
            assert [a["status"] for a in attempts].index("ok") == len(attempts) - 1
        kept = attempts[r["attempt"]]
        assert r["seed"] == kept["seed"] and r["transcript"] == planted(r["text"], audio_of(out / r["file_name"]))
    assert any(len(rows[rid]["attempts"]) > 1 for rid in ("long1", "long2")), "no long row retried: shows nothing"
    assert any(rows[rid]["attempt"] > 0 for rid in ("long1", "long2")), "no retry kept"


def test_the_kept_attempt_is_the_long_row_run_alone_at_its_seed(retried, tmp_path):
    out, _ = retried
    kept = [r for r in read_manifest(out) if r["id"].startswith("long") and r["attempt"] > 0]
    again = write_jsonl(tmp_path / "p.jsonl", [{**next(x for x in ROWS if x["id"] == r["id"]), "seed": r["seed"]}
                                               for r in kept])
    res = run_cli("generate", again, "-o", tmp_path / "plain", "--deterministic", "-q", "--max-new-frames", "20")
    assert res.exit_code == 0, res.output
    for r in kept:
        assert (out / r["file_name"]).read_bytes() == (tmp_path / "plain/audio" / f"{r['id']}.wav").read_bytes()
        assert (out / r["logprobs_file"]).read_bytes() == \
            (tmp_path / "plain/logprobs" / f"{r['id']}.npz").read_bytes()


def test_rerun_is_byte_identical_and_counts_the_retries(retried):
    a, b = retried
    assert digests(a) == digests(b)
    run = json.loads((a / "run.json").read_text())
    assert run["quality"]["retries"] == sum(len(r["attempts"]) - 1 for r in read_manifest(a))


def test_best_of_runs_a_long_row_that_many_times(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", ROWS[:1])
    res = run_cli("generate", prompts, "-o", tmp_path / "out", *FLAGS, "--best-of", "2")
    assert res.exit_code == 0, res.output
    (r,) = read_manifest(tmp_path / "out")
    assert [a["seed"] for a in r["attempts"]] == [oracle_seed(r["attempts"][0]["seed"], k) for k in range(2)]
    best = min(r["attempts"], key=lambda a: (a["status"] != "ok", a["scores"]["wer"], a["attempt"]))
    assert r["attempt"] == best["attempt"] and r["chunks"] > 1


def test_resume_after_a_kill_among_a_long_rows_attempts(retried, tmp_path):
    """Killed after the last chunk but one of the run is written (among a retried long row's chunks):
    --resume starts unfinished rows' attempts over and writes the uninterrupted run's bytes."""
    from tests.planted_asr import killed_then_resumed

    reference, _ = retried
    rows = read_manifest(reference)
    chunks = sum(r.get("chunks", 0) * len(r["attempts"]) for r in rows)
    assert any(r.get("chunks") and len(r["attempts"]) > 1 for r in rows)
    out = tmp_path / "out"
    killed_then_resumed(write_jsonl(tmp_path / "p.jsonl", ROWS), out, (*FLAGS, "--retry", "3"), f"chunk:{chunks - 1}")
    assert digests(out) == digests(reference)
