"""Async decode (one-step lookahead) against the synchronous path, on the CPU.

On the CPU an event is complete once recorded, so every launch/resolve,
staging and skip path runs here exactly as on a GPU, minus the waiting.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from omni_cli.config import load_config
from omni_cli.loop import run_loop
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from omni_cli.runners.base import ModelRunner
from tests.audio_controls import assert_written_audio_follows_its_codes, codec_stage, longest_row
from tests.conftest import load_family, read_manifest, run_cli, write_config, write_jsonl

TEXTS = ["Hi.", "The sun rises in the east.", "A longer sentence, to make this prompt longer than the rest.",
         "Medium length prompt!", "Five.", "Sixth row of the batch here.", "Seven", "Eighth and last prompt.",
         "Ninth.", "Tenth row, which joins late."]


def _gen(tmp_path, name, cfg, *args):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)])
    out = tmp_path / name
    res = run_cli("generate", prompts, "-o", out, "--model", cfg, "-q", "--max-new-frames", "70", *args)
    assert res.exit_code == 0, res.output
    return out


def _bytes(out):
    return {m["id"]: ((out / m["file_name"]).read_bytes(), (out / m["logprobs_file"]).read_bytes())
            for m in read_manifest(out)}


SAMPLING = {"greedy": ["--temperature", "0"], "seeded": ["--seed", "7", "--ras-win-len", "5"]}


@pytest.fixture(scope="module")
def sync_bytes(tmp_path_factory, eos_ckpt):
    """sampling -> the files of the synchronous run at one row a step: under --deterministic the
    bytes of every batch size (tests/test_seeded.py and others hold that), so one run is the baseline
    of every batch size's lookahead run. Its controls run once: staggered stops, and files that are
    their codes' audio."""
    made: dict[str, dict] = {}

    def get(sampling: str) -> dict:
        if sampling not in made:
            tmp = tmp_path_factory.mktemp(f"sync-{sampling}")
            cfg = write_config(tmp / "m.yaml", eos_ckpt, max_seq_len=256)
            sync = _gen(tmp, "sync", cfg, "--no-async-decode", "--max-batch-size", "1", "--deterministic",
                        *SAMPLING[sampling])
            reasons = [m["finish_reason"] for m in read_manifest(sync)]
            assert "stop" in reasons and len({m["frames"] for m in read_manifest(sync)}) > 3
            assert_written_audio_follows_its_codes(codec_stage(eos_ckpt), sync, longest_row(read_manifest(sync)))
            made[sampling] = _bytes(sync)
        return made[sampling]

    return get


# 1: the one-row path; 3: rows join mid-run, refills beside decode (batch 8, most rows at once: tests/test_seeded.py
# holds its deterministic bytes to these, and its lookahead adds no path the 3-row run does not take on the CPU)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_async_byte_identical_to_sync(tmp_path, eos_ckpt, sync_bytes, batch, sampling):
    """Staggered stops (the EOS-pushed checkpoint) and 10 rows through fewer slots (joins mid-run):
    the lookahead run at each batch size gives the synchronous run's bytes."""
    cfg = write_config(tmp_path / "m.yaml", eos_ckpt, max_seq_len=256)
    lookahead = _gen(tmp_path, "async", cfg, "--async-decode", "--max-batch-size", str(batch), "--deterministic",
                     *SAMPLING[sampling])
    assert _bytes(lookahead) == sync_bytes(sampling)


def test_default_mode_async_keeps_codes_and_audio(tmp_path, eos_ckpt):
    """Without --deterministic the lookahead changes which rows share a step, so
    logprobs may differ in the last bits; codes and audio stay equal."""
    cfg = write_config(tmp_path / "m.yaml", eos_ckpt, max_seq_len=256)
    sync = _gen(tmp_path, "sync", cfg, "--no-async-decode", "--seed", "3", "--max-batch-size", "4")
    lookahead = _gen(tmp_path, "async", cfg, "--async-decode", "--seed", "3", "--max-batch-size", "4")
    for m in read_manifest(sync):
        a, b = np.load(sync / m["logprobs_file"]), np.load(lookahead / m["logprobs_file"])
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-4)
        assert (sync / m["file_name"]).read_bytes() == (lookahead / m["file_name"]).read_bytes()
    # control: the files are their codes' audio, and other codes' audio has other bytes
    assert_written_audio_follows_its_codes(codec_stage(eos_ckpt), sync, longest_row(read_manifest(sync)))


def _tiny_model(ckpt, tmp_path, max_batch_size=4, deterministic=True):
    config = replace(load_config(write_config(tmp_path / "r.yaml", ckpt, max_seq_len=256)),
                     max_batch_size=max_batch_size, deterministic=deterministic)
    return load_family(config, torch.float32, torch.device("cpu")), config


def _tiny_runner(ckpt, tmp_path, max_batch_size=4, deterministic=True):
    model, config = _tiny_model(ckpt, tmp_path, max_batch_size, deterministic)
    return model.runner, model.prompts.builder, config


class FakeEvent:
    """query() answers from a script; synchronize() is recorded."""

    def __init__(self, answers):
        self.answers = answers
        self.synced = False

    def record(self):
        pass

    def query(self):
        return self.answers.pop(0)

    def synchronize(self):
        self.synced = True


def test_hit_miss_accounting_and_ping_pong(tmp_path, eos_ckpt, monkeypatch):
    import omni_cli.runners.base as base

    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path)
    sched = Scheduler.for_runner(runner, 256)
    for i in range(3):
        sched.add(Request(rid=f"r{i}", prompt=prompts.build(TEXTS[i], config.system_prompt, None),
                          params=SamplingParams(temperature=0, max_new_frames=20), seed=i))
    runner.execute(sched.schedule())  # prefill
    events = iter([FakeEvent([True]), FakeEvent([False]), FakeEvent([False])])
    monkeypatch.setattr(base, "new_event", lambda device: next(events))
    p1 = runner.execute_launch(sched.schedule())
    p2 = runner.execute_launch(sched.schedule())
    assert p1.launch_buf is not p2.launch_buf  # ping-pong: launch N+1 writes the other buffer
    assert p1.host_staged and p2.host_staged  # Higgs stages its collect on the host
    runner.execute_resolve(p1)
    assert (runner.async_query_hit, runner.async_query_miss) == (1, 0) and not p1.event.synced
    p3 = runner.execute_launch(sched.schedule())
    assert p3.launch_buf is p1.launch_buf  # the buffer resolve(N) read is reused by launch(N+2)
    runner.execute_resolve(p2)
    assert (runner.async_query_hit, runner.async_query_miss) == (1, 1) and p2.event.synced
    runner.execute_resolve(p3)
    assert runner.async_query_miss == 2
    assert runner.execute_resolve(None) is None


def test_a_runner_without_the_async_hooks_says_so(tmp_path, eos_ckpt):
    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path)

    class NoAsync(type(runner)):
        post_decode_launch = ModelRunner.post_decode_launch

    runner.__class__ = NoAsync
    sched = Scheduler.for_runner(runner, 256)
    sched.add(Request(rid="a", prompt=prompts.build("x", config.system_prompt, None),
                      params=SamplingParams(max_new_frames=5), seed=0))
    runner.execute(sched.schedule())
    with pytest.raises(NotImplementedError, match="does not support async decode"):
        runner.execute_launch(sched.schedule())


@pytest.fixture(scope="module")
def early_eos_ckpt(tmp_path_factory):
    """Pushed harder than eos_ckpt: rows stop within about 20 frames."""
    from tests.tiny_checkpoint import build

    return build(tmp_path_factory.mktemp("early-eos"), seed=0, eos_boost=(6, 1.2))


REQUESTS = 400  # random lengths, limits and stops through 6 slots


def test_random_requests_free_every_slot_once(tmp_path, early_eos_ckpt):
    """Random lengths, limits and stops; lookahead steps of finished requests are dropped."""
    runner, prompts, config = _tiny_runner(early_eos_ckpt, tmp_path, max_batch_size=6, deterministic=False)
    rng = random.Random(0)
    sched = Scheduler.for_runner(runner, 256)
    # prompts cost a tokenizer call each: reuse a few
    ids = [prompts.build(t, config.system_prompt, None) for t in TEXTS[:4]]
    reqs = []
    for i in range(REQUESTS):
        n = rng.randint(1, 24)
        p = SamplingParams(temperature=rng.choice([0.0, 1.0]), max_new_frames=n, min_new_frames=rng.randint(0, n))
        reqs.append(Request(rid=f"q{i}", prompt=ids[i % 4], params=p, seed=i))
        sched.add(reqs[-1])
    finished = []
    freed = []
    real_free = sched.slots.free
    sched.slots.free = lambda slot: (freed.append(slot), real_free(slot))[1]
    stats = run_loop(sched, runner, finished.extend, lambda rows, st: None, async_decode=True)
    assert len(finished) == REQUESTS and len({r.rid for r in finished}) == REQUESTS
    assert len(freed) == REQUESTS and sched.slots.num_free == 6 and not sched.running
    stops = 0
    for r in reqs:
        tokens = r.frames.array
        assert len(tokens) <= r.params.max_new_frames
        all_eos = (tokens == 1025).all(axis=1)
        if r.finish_reason == "stop":
            stops += 1
            # the stop frame is the last one: the lookahead frame after it was dropped
            assert all_eos[-1] and not all_eos[:-1].any()
        else:
            assert r.finish_reason == "length" and len(tokens) == r.params.max_new_frames and not all_eos.any()
    assert stops > REQUESTS // 20  # the EOS-pushed checkpoint really stops rows mid-lookahead
    assert runner.async_query_hit > REQUESTS and runner.async_query_miss == 0  # CPU events: always complete
    assert stats.sync_routed == 0


def test_ineligible_batches_take_the_sync_path(tmp_path, eos_ckpt):
    runner, prompts, config = _tiny_runner(eos_ckpt, tmp_path)
    calls = []
    runner.lookahead_eligible = lambda so: calls.append(1) or len(calls) % 3 != 0
    outs = {}
    for async_decode in (False, True):
        sched = Scheduler.for_runner(runner, 256)
        reqs = [Request(rid=f"r{i}", prompt=prompts.build(t, config.system_prompt, None),
                        params=SamplingParams(temperature=1.0, max_new_frames=30), seed=i)
                for i, t in enumerate(TEXTS[:6])]
        for r in reqs:
            sched.add(r)
        stats = run_loop(sched, runner, lambda rs: None, lambda rows, st: None, async_decode=async_decode)
        outs[async_decode] = ({r.rid: r.frames.array for r in reqs}, {r.rid: r.logprobs.array for r in reqs})
    assert stats.sync_routed > 5
    for rid in outs[False][0]:
        np.testing.assert_array_equal(outs[True][0][rid], outs[False][0][rid])
        np.testing.assert_array_equal(outs[True][1][rid], outs[False][1][rid])


def test_ctrl_c_writes_what_is_complete(tmp_path, monkeypatch):
    from omni_cli import progress

    calls = {"n": 0}
    real_step = progress.Progress.step

    def step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt
        return real_step(self, *a, **k)

    monkeypatch.setattr(progress.Progress, "step", step)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": t, "max_new_frames": 9 + 6 * i}
                                                 for i, t in enumerate(TEXTS)])
    out = tmp_path / "out"
    res = run_cli("generate", prompts, "-o", out, "-q", "--async-decode", "--max-batch-size", "3")
    assert res.exit_code == 130
    rows = read_manifest(out)
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(len(TEXTS))]  # every row accounted for
    done = [r for r in rows if r["status"] == "ok"]
    assert done and any(r["status"] == "interrupted" for r in rows)
    for r in done:
        assert np.load(out / r["logprobs_file"])["tokens"].shape == (r["frames"], 8)
    assert not list(out.glob("**/.*partial*"))


def test_summary_line_and_run_json_record_the_path(tmp_path):
    import json

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS[:4])])
    on = run_cli("generate", prompts, "-o", tmp_path / "on", "--async-decode", "--max-new-frames", "12")
    off = run_cli("generate", prompts, "-o", tmp_path / "off", "--no-async-decode", "--max-new-frames", "12")
    assert on.exit_code == off.exit_code == 0
    assert [ln for ln in on.output.splitlines() if "async decode" in ln][0].startswith(
        "omni: async decode on: query hit rate 100.0%")
    assert "omni: async decode off" in off.output
    run = json.loads((tmp_path / "on" / "run.json").read_text())
    hits = run["async_decode"]["query_hits"]
    assert run["async_decode"]["enabled"] and hits > 0 and run["async_decode"]["query_misses"] == 0
    assert set(run["timings"]["step_ms"]) == {"p50", "p90", "p99"}
    assert json.loads((tmp_path / "off" / "run.json").read_text())["async_decode"]["query_hits"] == 0


def test_live_display_shows_the_hit_rate():
    from rich.console import Console

    from omni_cli.progress import Progress

    p = Progress(total=5, quiet=True)
    p.row_done(2.0, "ok")
    p.step(8, hits=19, misses=1, sync_routed=2)
    console = Console(width=100, record=True)
    console.print(p._render())
    text = console.export_text()
    assert "1/5" in text and "95.0% (19/20)" in text and "2 steps routed to sync" in text
