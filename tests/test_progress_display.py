"""The live display (omni_cli/progress.py): the rich bar, rejected rows, score means, the plain path."""

from __future__ import annotations

import io
import statistics
import sys
import threading

import pytest
from rich.console import Console

from omni_cli.device_progress import DeviceProgress
from omni_cli.progress import Progress


def _text(progress: Progress) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    console.print(progress._render())
    return console.export_text()


def _bar_line(text: str) -> str:
    lines = [line for line in text.splitlines() if "━" in line]
    assert len(lines) == 1, text
    return lines[0]


def test_bar_shows_rows_done_of_total_and_counts():
    statuses = ["ok", "rejected", "failed"]
    total = 10
    p = Progress(total, quiet=False)
    for s in statuses:
        p.row_done(1.0, s)
    bar = _bar_line(_text(p))
    assert f"{len(statuses)}/{total}" in bar
    assert f"{statuses.count('rejected')} rejected" in bar and f"{statuses.count('failed')} failed" in bar


def test_rejected_rows_count_as_done_with_their_audio():
    rows = [(1.25, "ok"), (2.5, "rejected"), (0.0, "failed"), (4.0, "rejected"), (3.0, True)]
    p = Progress(len(rows), quiet=False)
    for audio_s, status in rows:
        p.row_done(audio_s, status)
    assert p.done == len(rows)
    assert p.rejected == sum(s == "rejected" for _, s in rows)
    assert p.failed == sum(s == "failed" for _, s in rows)
    assert p.audio_s == pytest.approx(sum(a for a, _ in rows))


def test_score_means_are_the_mean_of_the_numbers_given():
    rows = [{"wer": 0.04, "dnsmos_ovrl": 3.1, "speaker_sim": None},
            {"wer": 0.11, "dnsmos_ovrl": None, "speaker_sim": 0.93},
            {"wer": 0.0, "dnsmos_ovrl": 3.45, "speaker_sim": 0.88},
            {"wer": None, "never_scored": None}]
    p = Progress(len(rows), quiet=False)
    for r in rows:
        p.scores(r)
    expected = {name: statistics.mean(r[name] for r in rows if r.get(name) is not None)
                for name in ("wer", "dnsmos_ovrl", "speaker_sim")}
    means = p.score_means()
    assert list(means) == ["wer", "dnsmos_ovrl", "speaker_sim"]  # first-seen order; all-None names absent
    for name, value in expected.items():
        assert means[name] == pytest.approx(value)
    line = next(line for line in _text(p).splitlines() if line.startswith("scores"))
    for name, value in expected.items():
        assert f"{name} {value:.3g}" in line
    assert "never_scored" not in line


def test_scores_from_many_threads_lose_nothing():
    values = [i / 7 for i in range(400)]
    p = Progress(len(values), quiet=False)
    threads = [threading.Thread(target=lambda part=values[k::8]: [p.scores({"wer": v}) for v in part])
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.score_means()["wer"] == pytest.approx(statistics.mean(values))


def test_live_scores_line_shows_at_most_six_names():
    names = [f"s{i}" for i in range(9)]
    p = Progress(1, quiet=False)
    p.scores({n: float(i) for i, n in enumerate(names)})
    line = next(line for line in _text(p).splitlines() if line.startswith("scores"))
    assert all(n in line.split() for n in names[:6]) and not any(n in line.split() for n in names[6:])
    assert len(p.score_means()) == len(names)


def test_summary_carries_rejected_count_and_means():
    wer = [0.2, None, 0.05]
    p = Progress(3, quiet=False)
    for status, w in zip(("ok", "rejected", "rejected"), wer):
        p.row_done(1.0, status)
        p.scores({"wer": w})
    s = p.summary()
    assert "3/3 rows (2 rejected)" in s
    assert s.endswith(f"; mean wer {statistics.mean(w for w in wer if w is not None):.3g}")


def test_summary_without_failures_or_scores_keeps_its_form():
    p = Progress(2, quiet=False)
    p.row_done(1.0, "ok")
    s = p.summary()
    assert "1/2 rows (0 failed) in " in s and "mean" not in s and s.endswith("audio-s/s")


def test_describe_is_the_first_line():
    p = Progress(4, quiet=False)
    p.describe("tiny-higgs-audio-v2", "cpu")
    first = _text(p).splitlines()[0]
    assert "tiny-higgs-audio-v2" in first and "cpu" in first
    assert "━" not in first  # the bar comes after it


def test_eta_comes_from_the_mean_time_per_row_done():
    p = Progress(10, quiet=False)
    for _ in range(4):
        p.row_done(0.0, "ok")
    p._bar.tasks[0].start_time -= 100.0  # as if the 4 rows took 100 s: 6 left take 150 s
    bar = _bar_line(_text(p))
    assert "0:01:40" in bar and "0:02:30" in bar


def test_non_tty_prints_a_start_line_and_a_summary_only(capsys):
    with Progress(3, quiet=False) as p:
        p.describe("tiny-higgs-audio-v2", "cpu")
        p.step(12, 1, 1, 0)
        for status in ("ok", "rejected", "failed"):
            p.row_done(1.0, status)
        p.scores({"wer": 0.1})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == "omni: generating 3 rows"
    assert lines[1].startswith("omni: 3/3 rows (1 failed, 1 rejected) in ") and "mean wer 0.1" in lines[1]


def test_quiet_prints_nothing(capsys):
    with Progress(1, quiet=True) as p:
        p.row_done(1.0, "rejected")
        p.scores({"wer": 0.3})
    assert capsys.readouterr().err == ""


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tty_path_draws_the_bar_through_live(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Tty())
    p = Progress(2, quiet=False)
    p._console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    with p:
        p.describe("m", "cuda:0")
        p.row_done(1.0, "ok")
        p.scores({"wer": 0.5})
        p.row_done(1.0, "rejected")
    text = p._console.export_text()
    assert "model m on cuda:0" in text and "2/2" in text and "1 rejected" in text and "wer 0.5" in text
    assert sys.stderr.getvalue() == ""  # the summary line only when the run ended early


def test_device_rows_go_under_the_bar():
    p = DeviceProgress(3, quiet=False, devices=("cuda:0", "cuda:1"))
    p.device_row(1, 2.0, "rejected")
    lines = _text(p).splitlines()
    bar = next(i for i, line in enumerate(lines) if "━" in line)
    assert "1/3" in lines[bar] and "1 rejected" in lines[bar]
    assert any(line.startswith("cuda:1") and "1 rows" in line for line in lines[bar + 1:])
