"""Property-based fuzzing of what users hand the tool: prompt files (JSONL, CSV, text, JSON
arrays), per-row fields and model configs. Nothing but the tool's own errors escapes, and
every bad row names its line, id and field."""

from __future__ import annotations

import json
import re

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni_cli.config import load_config
from omni_cli.errors import OmniError
from omni_cli.prompts import ROW_FIELDS, read_prompts
from omni_cli.runners.sampling.params import FIELD_NAMES, SamplingParams, check_field

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# integers of any size: past int32, int64 and float64's range (10**400), as typos make them
integers = st.integers() | st.integers(min_value=2**31 - 2, max_value=2**31 + 2) | st.integers(min_value=10**18) \
    | st.integers(max_value=-10**18) | st.integers(min_value=10**300, max_value=10**400)
values = st.recursive(st.none() | st.booleans() | integers | st.floats(allow_nan=True)
                      | st.text(max_size=12), lambda inner: st.lists(inner, max_size=3), max_leaves=4)
rows = st.dictionaries(st.sampled_from(ROW_FIELDS + ("colour",)), values, max_size=6)
ERROR = re.compile(r"^row (\d+)(, field '(.*?)')?: .+", re.S)


def _read(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    try:
        return read_prompts(str(path))
    except OmniError:  # a file that cannot be read at all: exit 2, before anything runs
        return None


def _check_rows(result, lines: dict[int, int] | None = None) -> None:
    """Every row either valid or with an error naming its own row (its line) and, where one
    field is to blame, that field; its id is a usable file name."""
    for r in result or ():
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", r.id), r.id
        if r.error is None:
            assert isinstance(r.text, str) and r.text.strip()
            continue
        m = ERROR.match(r.error)
        assert m and int(m.group(1)) == r.row, r.error
        if m.group(3) is not None and m.group(3) not in ROW_FIELDS:  # a field the tool does not know: named so
            assert "unknown field" in r.error, r.error


@FUZZ
@given(st.lists(rows, min_size=1, max_size=6), st.lists(st.sampled_from(["", " ", "not json", "[1]"]), max_size=2))
def test_jsonl_rows_fail_alone_naming_line_and_field(tmp_path, objs, junk):
    lines = [json.dumps(o) for o in objs] + junk
    result = _read(tmp_path, "p.jsonl", "\n".join(lines).encode())
    _check_rows(result)
    if result is not None:  # every non-blank line is one row, numbered by its line
        assert [r.row for r in result] == [n for n, ln in enumerate(lines, start=1) if ln.strip()]


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(["p.jsonl", "p.csv", "p.txt", "p.json", "pipe"]))
def test_any_bytes_give_rows_or_a_clean_error(tmp_path, data, name):
    _check_rows(_read(tmp_path, name, data))


@FUZZ
@given(st.text(max_size=120), st.sampled_from(["p.jsonl", "p.csv", "p.txt", "p.json"]))
def test_any_text_gives_rows_or_a_clean_error(tmp_path, text, name):
    _check_rows(_read(tmp_path, name, text.encode("utf-8", "surrogatepass")))


@FUZZ
@given(st.sampled_from(FIELD_NAMES), values)
def test_a_field_is_accepted_as_a_value_the_sampler_can_run_or_refused(name, value):
    try:
        got = check_field(name, value)
    except ValueError:
        return
    params = SamplingParams().with_overrides(**{name: got})  # accepted: finite and in range
    for v in params.as_record().values():
        assert all(isinstance(x, int) for x in v) if isinstance(v, list) else v == v and abs(v) < float("inf")


NUMERIC_FLAGS = {"temperature": float, "top_p": float, "min_p": float, "repetition_penalty": float, "top_k": int,
                 "ras_win_len": int, "ras_win_max_num_repeat": int, "max_new_frames": int, "min_new_frames": int,
                 "max_batch_size": int, "max_failures": int, "chunk_buffer": int, "seed": int}


@FUZZ
@given(st.sampled_from(sorted(NUMERIC_FLAGS)), integers | st.floats(allow_nan=True))
def test_any_number_in_any_flag_is_taken_or_refused_naming_it(name, value):
    """What Typer hands a flag (an int of any size, or a float for a float flag) is refused naming the
    flag before anything loads, or taken as a value the device holds."""
    from pathlib import Path

    from omni_cli.generate import GenerateOptions
    from omni_cli.job_settings import check_flags
    from omni_cli.runners.family import family_class
    from omni_cli.runners.sampling.params import INT_MAX
    from omni_cli.validate import check_run

    if NUMERIC_FLAGS[name] is int and not isinstance(value, int):
        return
    opts = GenerateOptions(prompts="-", out=Path("."), **{name: value})
    try:
        config, params = check_flags(opts)
        check_run([], params, config, family_class(config.family).limits(config.checkpoint), opts.fmt)
    except OmniError as e:
        assert f"--{name.replace('_', '-')}" in str(e) or name == "min_new_frames" and "--max-new-frames" in str(e)
        return
    for v in params.as_record().values():
        assert all(0 <= x <= INT_MAX for x in v) if isinstance(v, list) else v == v and abs(v) <= INT_MAX
    assert 1 <= config.max_batch_size <= 2**16


@FUZZ
@given(st.dictionaries(st.sampled_from(["family", "checkpoint", "codec", "dtype", "device", "max_batch_size",
                                        "max_seq_len", "async_decode", "deterministic", "system_prompt", "sampling",
                                        "typo"]), values | st.dictionaries(st.sampled_from(FIELD_NAMES), values,
                                                                            max_size=3), max_size=8))
def test_config_loader_raises_only_config_errors(tmp_path, mapping):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(mapping))
    try:
        load_config(str(path))
    except OmniError as e:
        assert str(path) in str(e)
