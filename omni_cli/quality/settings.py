"""A run's quality settings: which scorers, which rules reject a row, how many attempts a row gets.

From the model YAML's `quality:` section, then the flags over it (`--score`, `--reject`,
`--best-of`, `--retry`, `--drop-rejected`, `--asr-model`, `--speaker-model`, `--mos-model`, `--utmos-model`).
Checked before anything loads: a bad value is an OmniError naming the YAML file and key
(`quality.reject`) or the flag, and a scorer whose packages are missing names the install command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_cli.errors import ConfigError, OmniError

if TYPE_CHECKING:  # the scorers' package imports torch: `omni --help` reads the config's keys without it
    from omni_cli.runners.scoring import Rule

# the models a scorer loads when none is named (hub ids: users online fetch them once)
DEFAULT_ASR_MODEL = "openai/whisper-large-v3-turbo"
DEFAULT_SPEAKER_MODEL = "microsoft/wavlm-base-plus-sv"  # the speaker_sim default threshold is this model's
MAX_ATTEMPTS = 16  # best_of + retry: a row's attempts at most (each one a full generation)
KEYS = ("score", "reject", "best_of", "retry", "drop_rejected", "asr_model", "speaker_model", "mos_model",
        "utmos_model", "batch_size", "asr_beams")
MODEL_KEYS = ("asr_model", "speaker_model", "mos_model", "utmos_model")


@dataclass(frozen=True)
class QualitySettings:
    scorers: tuple[str, ...] = ()  # runners/scoring names, in the order given
    rules: tuple[Rule, ...] = ()  # a row breaking any is rejected
    best_of: int = 1  # attempts made of every row; the best is kept
    retry: int = 0  # more attempts, one at a time, while the kept one is rejected
    drop_rejected: bool = False  # rejected rows' files go under rejected/ instead of audio/ and logprobs/
    asr_model: str | None = None
    speaker_model: str | None = None
    mos_model: str | None = None  # a folder holding DNSMOS's ONNX files; None: speechmos's own
    utmos_model: str | None = None  # a folder (or hub repo) holding UTMOS's utmos_state_dict.pt; no default
    batch_size: int = 16  # rows a scorer call takes at most
    asr_beams: int | None = None  # Whisper's beams; None: the ASR pipeline's default (faster with 1)

    @property
    def enabled(self) -> bool:
        return bool(self.scorers)

    @property
    def max_attempts(self) -> int:
        return self.best_of + self.retry

    def as_record(self) -> dict[str, Any]:
        """run.json's `quality`, and what a row's hash covers where scoring is on (it picks the row's bytes)."""
        return {"scorers": list(self.scorers), "reject": [str(r) for r in self.rules], "best_of": self.best_of,
                "retry": self.retry, "drop_rejected": self.drop_rejected, "asr_model": self.asr_model,
                "speaker_model": self.speaker_model, "mos_model": self.mos_model, "utmos_model": self.utmos_model,
                "asr_beams": self.asr_beams}


def parse_section(raw: Any, path: Path) -> dict[str, Any]:
    """The YAML's `quality:` mapping, its keys and types checked (ConfigError naming quality.<key>)."""
    if not isinstance(raw, dict):
        raise ConfigError(path, "quality", f"must be a mapping, got {raw!r}")
    for key, value in raw.items():
        if key not in KEYS:
            raise ConfigError(path, f"quality.{key}", f"unknown key (known: {', '.join(KEYS)})")
        if key in ("best_of", "retry", "batch_size", "asr_beams") and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(path, f"quality.{key}", f"must be an integer, got {value!r}")
        if key == "drop_rejected" and not isinstance(value, bool):
            raise ConfigError(path, f"quality.{key}", f"must be true or false, got {value!r}")
        if key in MODEL_KEYS and not isinstance(value, str):
            raise ConfigError(path, f"quality.{key}", f"must be a string (a hub id or a folder), got {value!r}")
        if key in ("score", "reject") and not (isinstance(value, str) or
                                               (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise ConfigError(path, f"quality.{key}", f"must be a string or a list of strings, got {value!r}")
    return dict(raw)


def quality_settings(section: dict[str, Any], path: Path | None, opts) -> QualitySettings:
    """The YAML section with the flags over it, every value checked; a folder given for a model is made
    absolute (a YAML's relative to the YAML file). Nothing enabled: QualitySettings()."""
    from omni_cli.runners.scoring import ScoreSpecError, check_installed, default_rules, parse_reject, parse_scorers
    from omni_cli.runners.scoring.faster_whisper import is_ctranslate2_folder
    from omni_cli.runners.scoring.faster_whisper import problems as ct2_problems

    def where(key: str, flag: str) -> tuple[Any, str, bool]:
        given = getattr(opts, key, None)
        if given is not None:
            return given, flag, True
        return section.get(key), f"quality.{key}", False

    def fail(place: str, from_flag: bool, message: str):
        if from_flag or path is None:
            raise OmniError(f"{place}: {message}")
        raise ConfigError(path, place, message)

    spec, place, flag = where("score", "--score")
    try:
        scorers = parse_scorers(spec, place) if spec not in (None, "", []) else ()
    except ScoreSpecError as e:
        fail(place, flag, str(e).removeprefix(f"{place}: "))
    counts = {}
    for key, flag_name, low in (("best_of", "--best-of", 1), ("retry", "--retry", 0), ("batch_size", None, 1),
                                ("asr_beams", None, 1)):
        value, place, flag = where(key, flag_name or f"quality.{key}")
        if value is None and key == "asr_beams":
            counts[key] = None
            continue
        value = {"best_of": 1, "retry": 0, "batch_size": 16}[key] if value is None else value
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            fail(place, flag, f"must be an integer >= {low}, got {value!r}")
        counts[key] = value
    if counts["best_of"] + counts["retry"] > MAX_ATTEMPTS:
        fail("--best-of/--retry", True, f"a row gets best_of + retry attempts, at most {MAX_ATTEMPTS}; got "
             f"{counts['best_of']} + {counts['retry']}")
    spec, place, flag = where("reject", "--reject")
    if not scorers:
        for key, flag_name in (("reject", "--reject"), ("best_of", "--best-of"), ("retry", "--retry")):
            value, place, flag = where(key, flag_name)
            if value not in (None, "", [], 0) and not (key == "best_of" and value == 1):
                fail(place, flag, "needs scorers to act on: name them with --score (or quality.score)")
        return QualitySettings()
    if isinstance(spec, str) and spec.strip().lower() == "none":
        rules = ()  # scores recorded, nothing rejected
    elif spec in (None, "", []):
        rules = default_rules(scorers)
    else:
        try:
            rules = parse_reject(spec, scorers, place)
        except ScoreSpecError as e:
            fail(place, flag, str(e).removeprefix(f"{place}: "))
    if not rules and (counts["retry"] or counts["best_of"] > 1):
        fail("--retry" if counts["retry"] else "--best-of", True,
             "needs rules that reject rows (--reject none turns them all off)")
    try:
        check_installed(scorers, "--score")
    except ScoreSpecError as e:
        raise OmniError(str(e)) from None
    models = {}
    for key, flag_name, default in (("asr_model", "--asr-model", DEFAULT_ASR_MODEL if "asr" in scorers else None),
                                    ("speaker_model", "--speaker-model",
                                     DEFAULT_SPEAKER_MODEL if "speaker" in scorers else None),
                                    ("mos_model", "--mos-model", None), ("utmos_model", "--utmos-model", None)):
        value, place, flag = where(key, flag_name)
        if key == "utmos_model" and "utmos" in scorers and value is None:
            fail(flag_name, True, "--score utmos needs the model's weights (or quality.utmos_model): a folder holding "
                 "utmos_state_dict.pt (the UTMOS22 strong learner as utmos-pytorch loads it), or a hub repository "
                 "with that file")
        models[key] = _location(value, place, flag, path, fail) if value is not None else default
        if key == "asr_model" and "asr" in scorers and is_ctranslate2_folder(models[key]):
            for problem in ct2_problems(models[key]):  # the faster-whisper backend's, before anything loads
                fail(place, flag, f"the CTranslate2 model {models[key]} {problem}")
    drop, _, _ = where("drop_rejected", "--drop-rejected")
    return QualitySettings(scorers=scorers, rules=rules, best_of=counts["best_of"], retry=counts["retry"],
                           drop_rejected=bool(drop), batch_size=counts["batch_size"], asr_beams=counts["asr_beams"],
                           **models)


def _location(value: str, place: str, from_flag: bool, path: Path | None, fail) -> str:
    """A folder (relative to the YAML for a YAML value, to the working directory for a flag), or a hub id."""
    value = str(value)
    base = Path.cwd() if from_flag or path is None else path.parent
    local = (base / Path(value).expanduser())
    if value.startswith((".", "/", "~")) or local.exists():
        if not local.is_dir():
            fail(place, from_flag, f"folder {local.resolve()} does not exist")
        return str(local.resolve())
    if value.count("/") != 1 or any(not part for part in value.split("/")):
        fail(place, from_flag, f"{value!r} is neither an existing folder nor a hub id (owner/name)")
    return value
