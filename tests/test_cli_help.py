"""`omni --help` and `omni --version`: what they say is what a run does."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml

from tests.conftest import REPO, run_cli

EXIT_CODES = ("0 every row ok", "1 some rows failed", "2 bad usage, config or input file", "130 interrupted")


def _help(*args: str) -> str:
    from typer.testing import CliRunner

    from omni_cli.cli import app

    # wide: at 80 columns the formatter wraps inside words at hyphens (--no-|deterministic)
    res = CliRunner().invoke(app, [*args, "--help"], terminal_width=1000, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def _default_shown(text: str, option: str) -> str:
    """The `[default: ...]` of one option's entry in `omni generate --help`."""
    m = re.search(rf"(?:^| ){re.escape(option)} [^\[]*\[default: ([^\]]*)\]", text)
    assert m, f"no default shown for {option}"
    return m.group(1)


def test_version_is_the_installed_metadata_version():
    import omni_cli

    res = run_cli("--version")
    assert res.exit_code == 0
    assert res.output.split() == ["omni-cli", importlib.metadata.version("omni-cli")]
    assert omni_cli.__version__ == importlib.metadata.version("omni-cli")


def test_generate_help_shows_the_default_model_configs_values():
    from omni_cli.config import ModelConfig
    from omni_cli.runners.sampling.params import SamplingParams

    raw = yaml.safe_load((REPO / "configs/tiny-higgs-audio-v2.yaml").read_text())
    text = _help("generate")
    assert "tiny-higgs-audio-v2.yaml" in text and "--model changes them" in text
    sampling = {f.name: f.default for f in fields(SamplingParams) if f.name != "suppress_tokens"}
    sampling |= raw["sampling"]
    assert {"temperature": 1.0, "top_k": 50, "top_p": 0.95, "max_new_frames": 75}.items() <= sampling.items()
    for name, want in sampling.items():
        shown = _default_shown(text, f"--{name.replace('_', '-')}")
        if want is None:  # a field this model does not use (the code predictor's)
            assert shown == "from the model config", (name, shown)
            continue
        value, source = shown.split(", ")
        assert float(value) == want and source == "from the model config", (name, shown)
    assert _default_shown(text, "--suppress-tokens") == "none, from the model config"
    assert _default_shown(text, "--max-batch-size") == f"{raw['max_batch_size']}, from the model config"
    model_defaults = {f.name: f.default for f in fields(ModelConfig)}
    for name in ("deterministic", "async_decode"):
        on = raw.get(name, model_defaults[name])
        flag = f"--{'' if on else 'no-'}{name.replace('_', '-')}"
        assert _default_shown(text, f"--{name.replace('_', '-')} /") == f"{flag}, from the model config"


def test_help_still_renders_when_the_default_config_does_not_load(monkeypatch):
    import omni_cli.config
    from omni_cli.errors import ConfigError

    def broken(spec):
        raise ConfigError("tiny-higgs-audio-v2.yaml", None, "broken")

    monkeypatch.setattr(omni_cli.config, "load_config", broken)
    text = _help("generate")
    assert _default_shown(text, "--temperature") == "from the model config"


@pytest.mark.parametrize("command", [(), ("generate",), ("verify",), ("bench",)])
def test_switches_have_no_value_metavar(command):
    text = _help(*command)
    assert "<bool>" not in text and "BOOLEAN" not in text and "<boolean>" not in text.lower()
    if command == ("generate",):
        assert "--deterministic / --no-deterministic Byte-identical" in text
        assert "-q, --quiet Print nothing" in text


@pytest.mark.parametrize("command", [(), ("generate",)])
def test_help_lists_the_exit_codes(command):
    text = _help(*command)
    for code in EXIT_CODES:
        assert code in text


def test_help_does_not_import_torch():
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "omni_cli", "generate", "--help"],
                         cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[default: 1.0, from the model config]" in " ".join(res.stdout.split())
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "omni_cli.config" in imported  # the help read the YAML
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", "transformers")}
    assert "omni_cli.generate" not in imported
