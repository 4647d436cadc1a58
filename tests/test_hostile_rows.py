"""A thousand rows with hostile ones mixed in (issues 32 and 43): every input row ends in the
manifest exactly once under an id of its own (the bad ones failed with their line, id and field,
the good ones ok with their files on disk), and every KV slot is free at the end."""

from __future__ import annotations

import json
import random

import omni_cli.generate as generate
from tests.conftest import read_manifest, run_cli

ROWS = 1000  # every hostile kind about three times over
HOSTILE = [  # (fields beyond id and text, the field its error names); one in twenty rows
    ({"suppress_tokens": [5000]}, "suppress_tokens"), ({"suppress_tokens": [1024]}, "suppress_tokens"),
    ({"ras_win_len": 10**9}, "ras_win_len"), ({"temperature": 1e308}, "temperature"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"), ({"repetition_penalty": 1e300}, "repetition_penalty"),
    ({"text": "surrogate \ud800 here"}, "text"), ({"max_new_frames": 0}, "max_new_frames"),
    ({"top_p": 0}, "top_p"), ({"text": "word " * 1000}, "text"),
    # issue 43's classes: integers past the device's, no audio, invisible text, a URL, a cut clip, a bad id
    ({"top_k": 10**30}, "top_k"), ({"ras_win_max_num_repeat": 10**20}, "ras_win_max_num_repeat"),
    ({"max_new_frames": 5}, "max_new_frames"), ({"text": "\u200b\u200b"}, "text"),
    ({"ref_audio": "https://example.com/a.wav", "ref_text": "A."}, "ref_audio"),
    ({"ref_audio": "cut.wav", "ref_text": "A."}, "ref_audio"), ({"id": "a/b"}, "id"),
]


def test_a_thousand_rows_with_hostile_ones_lose_none_and_leak_no_slot(tmp_path, monkeypatch):
    (tmp_path / "cut.wav").write_bytes(_wav_header(promised=48000) + bytes(56))  # a clip cut short
    rng = random.Random(5)
    rows, want = [], {}
    for n in range(1, ROWS + 1):
        row = {"id": f"r{n}", "text": " ".join(rng.choice(["la", "da", "sun", "moon"]) for _ in range(rng.randint(1, 30))),
               "max_new_frames": 9}
        if n % 20 == 0:
            fields, field = HOSTILE[(n // 20) % len(HOSTILE)]
            row.update(fields)
            want[n] = field
        rows.append(row)
    # the id the tool would make up, given by a later row
    for n in [n for n, field in want.items() if field == "id" and n + 9 < ROWS]:
        rows[n + 9]["id"] = f"row-{n}"
    lines = [json.dumps(row) for row in rows]
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
    assert [m["row"] for m in manifest] == list(range(1, ROWS + 1))  # every row once, in input order
    assert len({m["id"] for m in manifest}) == ROWS  # under an id of its own: no two rows share a file name
    given = [json.loads(line).get("id") for line in lines]
    assert all(m["id"] == given[m["row"] - 1] for m in manifest if given[m["row"] - 1] != "a/b")
    for m in manifest:
        if m["row"] in want:
            assert m["status"] == "failed" and m["error"].startswith(f"row {m['row']}, field '{want[m['row']]}'"), m
        else:
            assert m["status"] == "ok" and (out / m["file_name"]).is_file() and (out / m["logprobs_file"]).is_file()
    (sched,) = schedulers
    assert sched.slots.num_free == sched.max_batch_size and not sched.running and not sched.waiting


def _wav_header(promised: int) -> bytes:
    """A 24 kHz mono 16-bit WAV header whose data chunk promises `promised` bytes."""
    import struct

    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, 24000, 48000, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + promised) + b"WAVE" + fmt + b"data" + struct.pack("<I", promised)
