"""The scorer registry and the checked forms of --score and --reject (runners/scoring/registry.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omni_cli.runners import scoring
from omni_cli.runners.scoring import (SCORERS, Rule, ScoreSpecError, broken, default_rules, parse_reject,
                                      parse_scorers, score_owners)
from omni_cli.runners.scoring import registry


def test_parse_scorers():
    assert parse_scorers("asr,mos,speaker,degenerate") == ("asr", "mos", "speaker", "degenerate")
    assert parse_scorers(" Degenerate , asr ") == ("degenerate", "asr")
    assert parse_scorers(["mos"]) == ("mos",)  # the YAML's list


@pytest.mark.parametrize("spec, message", [
    ("asr,mso", "--score: 'mso' is not a scorer; the scorers are asr, mos, speaker, degenerate"),
    ("asr,,mos", "--score: an empty name in 'asr,,mos'"),
    ("asr,asr", "--score: 'asr' is named twice"),
    ("", "--score: an empty name"),
])
def test_parse_scorers_errors_name_the_part(spec, message):
    with pytest.raises(ScoreSpecError) as err:
        parse_scorers(spec)
    assert str(err.value).startswith(message)
    assert err.value.exit_code == 2


def test_parse_reject():
    rules = parse_reject("wer>0.1, dnsmos_ovrl<3.0,speaker_sim <= 0.5,loop_s>=2",
                         ("asr", "mos", "speaker", "degenerate"))
    assert rules == (Rule("wer", ">", 0.1), Rule("dnsmos_ovrl", "<", 3.0), Rule("speaker_sim", "<=", 0.5),
                     Rule("loop_s", ">=", 2.0))
    assert [str(r) for r in rules] == ["wer>0.1", "dnsmos_ovrl<3", "speaker_sim<=0.5", "loop_s>=2"]
    wer, ovrl, sim, loop = rules
    assert wer.rejects(0.2) and not wer.rejects(0.1) and not wer.rejects(None)
    assert ovrl.rejects(2.9) and not ovrl.rejects(3.0) and sim.rejects(0.5) and loop.rejects(2.0)
    assert parse_reject(["wer>0.2", "cer>0.3"], ("asr",)) == (Rule("wer", ">", 0.2), Rule("cer", ">", 0.3))
    # two bounds on one score are two rules
    assert len(parse_reject("seconds_per_char>0.3,seconds_per_char<0.02", ("degenerate",))) == 2


@pytest.mark.parametrize("spec, message", [
    ("wer>0.1,speaker_sim<0.8", "--reject: 'speaker_sim<0.8': 'speaker_sim' comes from the speaker scorer, which "
                                "--score does not enable (it enables asr, mos)"),
    ("wre>0.1", "--reject: 'wre>0.1': 'wre' is not a score; the scores are cer,"),
    ("wer=0.1", "--reject: 'wer=0.1' is not a rule"),
    ("wer>0.1,", "--reject: an empty rule in 'wer>0.1,'"),
    ("wer>abc", "--reject: 'wer>abc': 'abc' is not a finite number"),
    ("wer>inf", "--reject: 'wer>inf': 'inf' is not a finite number"),
    ("wer>0.1,wer>0.1", "--reject: 'wer>0.1' is given twice"),
])
def test_parse_reject_errors_name_the_part(spec, message):
    with pytest.raises(ScoreSpecError) as err:
        parse_reject(spec, ("asr", "mos"))
    assert str(err.value).startswith(message), str(err.value)


def test_default_rules_and_broken():
    owners = score_owners()
    assert set(owners) == {n for cls in SCORERS.values() for n in cls.score_names}
    rules = default_rules(("asr", "mos", "speaker", "degenerate"))
    assert {r.name for r in rules} >= {"wer", "cer", "dnsmos_ovrl", "speaker_sim", "loop_s", "hit_max_frames"}
    assert all(r.why and owners[r.name] for r in rules)
    assert [str(r) for r in default_rules(("asr", "mos"))] == ["wer>0.1", "cer>0.1", "dnsmos_ovrl<3"]
    scores = {"wer": 0.25, "cer": None, "dnsmos_ovrl": 3.4}
    assert broken(default_rules(("asr", "mos")), scores) == ["wer=0.25>0.1"]


def test_missing_packages_fail_before_loading_with_the_command(monkeypatch):
    real = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name: None if name == "speechmos" else real(name))
    registry.check_installed(("asr", "speaker", "degenerate"))
    with pytest.raises(ScoreSpecError,
                       match=r"mos needs speechmos\. Install them with: pip install 'omni-cli\[quality\]'"):
        registry.check_installed(("asr", "mos"))


def test_importing_the_package_loads_no_model_library():
    code = ("import sys, omni_cli.runners.scoring as s; "
            "print(sorted(m for m in ('transformers', 'onnxruntime', 'jiwer', 'speechmos', 'librosa') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert scoring.__all__ and all(hasattr(scoring, n) for n in scoring.__all__)
