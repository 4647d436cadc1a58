"""Model configs: validated at load, errors name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_cli.config import CONFIG_DIR, find_config, load_config
from omni_cli.errors import ConfigError
from tests.conftest import TINY


def _yaml(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(body)
    return p


BASE = f"family: higgs_audio_v2\ncheckpoint: {TINY / 'model'}\ncodec: {TINY / 'codec'}\n"


def test_shipped_configs_load():
    tiny = load_config(None)
    assert tiny.path == CONFIG_DIR / "tiny-higgs-audio-v2.yaml"
    assert Path(tiny.checkpoint) == TINY / "model"  # resolved relative to the YAML
    big = load_config("higgs-audio-v2-3b")
    assert big.checkpoint == "bosonai/higgs-audio-v2-generation-3B-base"  # a hub id stays one
    assert big.dtype == "bfloat16"
    assert find_config(str(CONFIG_DIR / "higgs-audio-v2-3b.yaml")) == big.path


@pytest.mark.parametrize(
    "extra, key, message",
    [
        ("temprature: 1.0\n", "temprature", "unknown key"),
        ("max_batch_size: eight\n", "max_batch_size", "must be an integer"),
        ("max_batch_size: true\n", "max_batch_size", "must be an integer"),
        ("max_seq_len: 0\n", "max_seq_len", "from 1 to"),
        ("dtype: float8\n", "dtype", "must be one of"),
        ("device: tpu\n", "device", "auto, cpu, cuda"),
        ("sampling:\n  top_p: 1.5\n", "sampling.top_p", "(0, 1]"),
        ("sampling:\n  temperature: -1\n", "sampling.temperature", ">= 0"),
        ("sampling:\n  topk: 5\n", "sampling.topk", "unknown key"),
        ("async_decode: yes-please\n", "async_decode", "true or false"),
    ],
)
def test_bad_values_name_file_and_key(tmp_path, extra, key, message):
    path = _yaml(tmp_path, BASE + extra)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == key
    assert str(path) in str(e.value) and f"key '{key}'" in str(e.value) and message in str(e.value)


def test_missing_required_key_and_folder(tmp_path):
    with pytest.raises(ConfigError, match="key 'codec': is required"):
        load_config(_yaml(tmp_path, f"family: higgs_audio_v2\ncheckpoint: {TINY / 'model'}\n"))
    with pytest.raises(ConfigError, match=r"key 'checkpoint': folder .*nowhere does not exist"):
        load_config(_yaml(tmp_path, f"family: higgs_audio_v2\ncheckpoint: ./nowhere\ncodec: {TINY / 'codec'}\n"))


def test_missing_config_file():
    with pytest.raises(ConfigError, match="no such config file"):
        load_config("does-not-exist")


def test_config_is_frozen():
    cfg = load_config(None)
    with pytest.raises(Exception):
        cfg.max_batch_size = 3  # type: ignore[misc]


def test_hub_checkpoint_unreachable_is_a_clear_error(tmp_path, monkeypatch):
    """A hub id goes through huggingface_hub; offline, the error names the key and the id."""
    import huggingface_hub.constants

    from tests.conftest import run_cli

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = tmp_path / "hub.yaml"
    cfg.write_text(f"family: higgs_audio_v2\ncheckpoint: someone/no-such-model\ncodec: {TINY / 'codec'}\n")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    res = run_cli("generate", prompts, "-o", tmp_path / "out", "--model", cfg)
    assert res.exit_code == 2
    assert "checkpoint 'someone/no-such-model': not a local folder, and the hub download failed" in res.output
