"""Thousands of rows with hostile ones mixed in (issue 32): every input row ends in the
manifest exactly once (the bad ones failed with their line, id and field, the good ones ok
with their files on disk), and every KV slot is free at the end."""

from __future__ import annotations

import json
import random

import omni_cli.generate as generate
from tests.conftest import read_manifest, run_cli

ROWS = 2000
HOSTILE = [  # (fields beyond id and text, the field its error names); one in twenty rows
    ({"suppress_tokens": [5000]}, "suppress_tokens"), ({"suppress_tokens": [1024]}, "suppress_tokens"),
    ({"ras_win_len": 10**9}, "ras_win_len"), ({"temperature": 1e308}, "temperature"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"), ({"repetition_penalty": 1e300}, "repetition_penalty"),
    ({"text": "surrogate \ud800 here"}, "text"), ({"max_new_frames": 0}, "max_new_frames"),
    ({"top_p": 0}, "top_p"), ({"text": "word " * 1000}, "text"),
]


def test_two_thousand_rows_with_hostile_ones_lose_none_and_leak_no_slot(tmp_path, monkeypatch):
    rng = random.Random(5)
    lines, want = [], {}
    for n in range(1, ROWS + 1):
        row = {"id": f"r{n}", "text": " ".join(rng.choice(["la", "da", "sun", "moon"]) for _ in range(rng.randint(1, 30))),
               "max_new_frames": rng.randint(1, 5)}
        if n % 20 == 0:
            fields, field = HOSTILE[(n // 20) % len(HOSTILE)]
            row.update(fields)
            want[f"r{n}"] = field
        lines.append(json.dumps(row))
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")

    schedulers = []

    class Recorded(generate.Scheduler):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            schedulers.append(self)

    monkeypatch.setattr(generate, "Scheduler", Recorded)
    out = tmp_path / "out"
    res = run_cli("generate", src, "-o", out, "-q", "--seed", "3", "--max-batch-size", "32")
    assert res.exit_code == 1, res.output
    manifest = read_manifest(out)
    assert [m["id"] for m in manifest] == [f"r{n}" for n in range(1, ROWS + 1)]  # every row once, in input order
    for m in manifest:
        if m["id"] in want:
            assert m["status"] == "failed" and m["error"].startswith(f"row {m['row']}, field '{want[m['id']]}'"), m
        else:
            assert m["status"] == "ok" and (out / m["file_name"]).is_file() and (out / m["logprobs_file"]).is_file()
    (sched,) = schedulers
    assert sched.slots.num_free == sched.max_batch_size and not sched.running and not sched.waiting
