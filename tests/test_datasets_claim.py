"""README's datasets claim, as written: with `pip install 'omni-cli[datasets]'`, an output folder
(a failed row included) loads with `datasets.load_dataset("audiofolder", data_dir=OUT)`, the
status filter keeps the ok rows, and each decoded row's audio is its file's samples (soundfile
is the oracle). The test extra installs what the datasets extra pins, so CI runs it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import REPO, read_manifest, run_cli, write_jsonl

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower()


def test_the_test_extra_installs_what_the_datasets_extra_pins():
    extras = _extras()
    test = {_name(r): r for r in extras["test"]}
    for req in extras["datasets"]:
        if _name(req) != "soundfile":  # a dependency of omni-cli itself
            assert test.get(_name(req)) == req


def test_readme_names_the_extra_and_the_call():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "pip install 'omni-cli[datasets]'" in readme
    assert 'datasets.load_dataset("audiofolder", data_dir="out", split="train")' in readme
    assert 'ds.filter(lambda s: s == "ok", input_columns="status")' in readme


def test_output_folder_loads_as_an_audiofolder(tmp_path):
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("librosa")  # datasets 3.x decodes audio through it
    from importlib.metadata import version

    from packaging.requirements import Requirement

    pin = next(Requirement(r) for r in _extras()["datasets"] if _name(r) == "datasets")
    if version("datasets") not in pin.specifier:
        pytest.skip(f"datasets {version('datasets')} is not what 'omni-cli[datasets]' pins ({pin})")

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hello there."},
                                                  {"id": "b", "text": ""},  # failed: no audio file
                                                  {"id": "c", "text": "See you soon.", "max_new_frames": 12}])
    out = tmp_path / "out"
    assert run_cli("generate", prompts, "-o", out, "--max-new-frames", "20", "-q").exit_code == 1
    manifest = {m["id"]: m for m in read_manifest(out)}

    # the README's lines, verbatim but for the folder
    ds = datasets.load_dataset("audiofolder", data_dir=str(out), split="train")
    ok = ds.filter(lambda s: s == "ok", input_columns="status")

    assert sorted(ds["id"]) == sorted(manifest) and sorted(ok["id"]) == ["a", "c"]
    for row in ok:
        m = manifest[row["id"]]
        want, sr = sf.read(out / m["file_name"], dtype="float64")
        assert Path(row["audio"]["path"]).resolve() == (out / m["file_name"]).resolve()
        assert row["audio"]["sampling_rate"] == sr == 24000
        assert len(want) == round(m["duration_s"] * sr) > 0
        np.testing.assert_allclose(row["audio"]["array"], want, atol=1e-6)
        assert row["text"] == m["text"] and row["frames"] == m["frames"]


def test_datasets_4_and_later_without_torchcodec_refuse_the_folder(tmp_path):
    """What README says of a plain `pip install datasets` today; runs only where that is installed."""
    datasets = pytest.importorskip("datasets")
    if int(datasets.__version__.split(".")[0]) < 4:
        pytest.skip(f"datasets {datasets.__version__}: the extra's version, tested above")
    try:
        import torchcodec  # noqa: F401
        pytest.skip("torchcodec is installed here")
    except (ImportError, OSError):
        pass
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hello there."}])
    assert run_cli("generate", prompts, "-o", tmp_path / "out", "--max-new-frames", "9", "-q").exit_code == 0
    with pytest.raises(Exception) as info:
        datasets.load_dataset("audiofolder", data_dir=str(tmp_path / "out"), split="train")
    chain, e = [], info.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("torchcodec" in msg for msg in chain)
