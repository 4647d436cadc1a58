"""GPU tests: skipped where there is no CUDA device (CI), run on the device machine."""

from __future__ import annotations

import json
import random

import pytest

import torch

from tests.audio_controls import (assert_written_audio_follows_its_codes, change_codec_frame, change_one_frame,
                                  codec_stage, longest_row, max_lsb)
from tests.conftest import TINY, read_manifest, run_cli, write_config, write_jsonl

pytestmark = pytest.mark.gpu

TEXTS = ["Hi.", "The sun rises in the east.", "A longer sentence, to make this prompt longer than the rest.",
         "Medium length prompt!", "Five.", "Sixth row of the batch here.", "Seven", "Eighth and last prompt."]


def _gen(tmp_path, name, cfg, rows, *args):
    prompts = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / name
    res = run_cli("generate", prompts, "-o", out, "--model", cfg, "-q", "--max-new-frames", "60",
                  "--temperature", "0.9", "--top-k", "40", "--top-p", "0.9", "--ras-win-len", "7", *args)
    run = out / "run.json"  # a run fault: its traceback (run.json) names the frame that raised
    assert res.exit_code == 0, res.output + ("".join(json.loads(run.read_text())["totals"].get("run_traceback") or [])
                                             if run.exists() else "")
    return out


def test_deterministic_bf16_cuda_is_batch_invariant(tmp_path):
    cfg = write_config(tmp_path / "m.yaml", TINY, max_seq_len=256)
    cfg.write_text(cfg.read_text().replace("dtype: float32", "dtype: bfloat16").replace("device: cpu", "device: cuda"))
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)]
    runs = {b: _gen(tmp_path, f"b{b}", cfg, rows, "--seed", "11", "--max-batch-size", str(b), "--deterministic")
            for b in (1, 3, 8)}
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    runs["shuffled"] = _gen(tmp_path, "sh", cfg, shuffled, "--seed", "11", "--max-batch-size", "3", "--deterministic")
    base = runs[8]
    seeds = {m["id"]: m["seed"] for m in read_manifest(base)}
    runs["alone"] = _gen(tmp_path, "alone", cfg, [{**rows[5], "seed": seeds["r5"]}], "--deterministic")
    for name, out in runs.items():
        for m in read_manifest(out):
            for rel in (m["file_name"], m["logprobs_file"]):
                assert (out / rel).read_bytes() == (base / rel).read_bytes(), (name, rel)
    # control: the files are their codes' audio (rows alone, as --deterministic decodes them),
    # and other codes' audio has other bytes
    stage = codec_stage(TINY, torch.bfloat16, torch.device("cuda"))
    assert_written_audio_follows_its_codes(stage, base, longest_row(read_manifest(base)))


def test_async_matches_sync_on_cuda_bf16(tmp_path, eos_ckpt):
    cfg = write_config(tmp_path / "m.yaml", eos_ckpt, max_seq_len=256)
    cfg.write_text(cfg.read_text().replace("dtype: float32", "dtype: bfloat16").replace("device: cpu", "device: cuda"))
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)]
    outs = {}
    for mode in ("--async-decode", "--no-async-decode"):
        outs[mode] = _gen(tmp_path, mode.strip("-"), cfg, rows, "--seed", "5", "--max-batch-size", "3",
                          "--deterministic", mode)
    a, s = outs["--async-decode"], outs["--no-async-decode"]
    differ = [rel for m in read_manifest(s) for rel in (m["file_name"], m["logprobs_file"])
              if (a / rel).read_bytes() != (s / rel).read_bytes()]
    assert not differ, differ  # every file named: the codes (npz) apart from the audio (wav)
    # control: the files are their codes' audio, and other codes' audio has other bytes
    stage = codec_stage(eos_ckpt, torch.bfloat16, torch.device("cuda"))
    assert_written_audio_follows_its_codes(stage, s, longest_row(read_manifest(s)))


def test_prefills_launched_behind_decode_steps_never_wait_for_them(tmp_path, eos_ckpt):
    """Every prefill of an async run (the first wave alone, each refill behind its decode step) is launched
    under torch's sync debug mode set to raise: nothing in it waits for the device (a Python scalar set
    through a device index did: a blocking copy, so the refill waited for the decode step beside it)."""
    from dataclasses import replace

    from omni_cli.config import load_config
    from omni_cli.loop import run_loop
    from omni_cli.runners.sampling.params import SamplingParams
    from omni_cli.scheduler import Request, Scheduler
    from tests.conftest import load_family

    config = replace(load_config(write_config(tmp_path / "r.yaml", eos_ckpt, max_seq_len=256)), max_batch_size=3,
                     deterministic=False)
    family = load_family(config, torch.bfloat16, torch.device("cuda"))
    runner, prompts = family.runner, family.prompts.builder
    launch, launched = runner.execute_prefill_launch, []

    def guarded(so):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(so)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            launched.append(so.beside is not None)

    for guard in (False, True):  # the first run captures what a first use captures (graphs sync)
        sched = Scheduler.for_runner(runner, 256)
        for i, t in enumerate(TEXTS):
            sched.add(Request(rid=f"r{i}", prompt=prompts.build(t, config.system_prompt, None),
                              params=SamplingParams(temperature=1.0, max_new_frames=8 + 3 * i), seed=i))
        runner.execute_prefill_launch = guarded if guard else launch
        run_loop(sched, runner, lambda rs: None, lambda rows, st: None, async_decode=True)
    assert launched[0] is False and sum(launched) >= 4  # the first wave alone, then refills beside decode


def test_step_trace_times_the_gaps_a_late_host_leaves(tmp_path, eos_ckpt, monkeypatch):
    """OMNI_TRACE_STEPS (runners/step_trace.py): with the scheduler made 20 ms late at every step, the loop
    stream's gaps between launched steps are about that long; untouched, far shorter; untraced, no record."""
    import time

    from omni_cli.scheduler import Scheduler

    cfg = write_config(tmp_path / "m.yaml", eos_ckpt, max_seq_len=256)
    cfg.write_text(cfg.read_text().replace("dtype: float32", "dtype: bfloat16").replace("device: cpu", "device: cuda"))
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)]
    plain = _gen(tmp_path, "plain", cfg, rows, "--seed", "5", "--async-decode")
    assert "trace" not in json.loads((plain / "run.json").read_text())["async_decode"]
    monkeypatch.setenv("OMNI_TRACE_STEPS", "1")
    fast = json.loads((_gen(tmp_path, "fast", cfg, rows, "--seed", "5", "--async-decode") / "run.json")
                      .read_text())["async_decode"]["trace"]
    schedule = Scheduler.schedule

    def late(self):
        time.sleep(0.02)
        return schedule(self)
    monkeypatch.setattr(Scheduler, "schedule", late)
    slow = json.loads((_gen(tmp_path, "slow", cfg, rows, "--seed", "5", "--async-decode") / "run.json")
                      .read_text())["async_decode"]["trace"]
    assert fast["decode_steps"] == slow["decode_steps"] > 10 and fast["gaps"] > 10
    assert slow["gap_ms"]["p50"] > 10 > fast["gap_ms"]["p50"] >= 0
    assert 0 <= fast["idle_share"] < slow["idle_share"] <= 1


def test_role_streams_are_distinct_cuda_streams_after_the_pool_wraps():
    """torch hands out a pool of streams per priority in turn: after 40 draws by others it has
    given some stream twice, yet the capture, codec, load and loop roles are four different
    CUDA streams, none the default one, and each role keeps its own."""
    from omni_cli.runners.device import role_stream

    dev = torch.device("cuda")
    drawn = [torch.cuda.Stream() for _ in range(40)]
    assert len({s.cuda_stream for s in drawn}) < 40  # the pool came round (the hazard, on this torch)
    roles = {r: role_stream(dev, r) for r in ("capture", "codec", "load")}
    roles["loop"] = role_stream(dev, "loop", priority=-100)
    handles = [s.cuda_stream for s in roles.values()]
    assert len(set(handles)) == 4 and torch.cuda.default_stream().cuda_stream not in handles
    drawn += [torch.cuda.Stream() for _ in range(40)]
    assert all(role_stream(dev, r) is s for r, s in roles.items())


def test_kv_budget_keeps_room_for_the_widest_prefill_it_measured(tmp_path):
    """On CUDA the KV budget's prefill term is measured at start-up. A prefill of the widest
    shape the scheduler admits (as many rows as there are slots and max_seq_len tokens each
    fit in prefill_token_budget), run afterwards through the built runner's engine, allocates
    no more than that term. Its second call is measured: a first call may also make a stream's
    cuBLAS workspace, which stays and is RUNTIME_SLACK_BYTES's (the message shows both)."""
    import torch

    from tests.conftest import load_family
    from omni_cli.config import load_config
    from omni_cli.runners.budget import prefill_token_budget
    from omni_cli.runners.device import peak_bytes
    from omni_cli.runners.engine import ForwardBatch

    cfg = write_config(tmp_path / "m.yaml", TINY, max_seq_len=256)
    cfg.write_text(cfg.read_text().replace("dtype: float32", "dtype: bfloat16").replace("device: cpu", "device: cuda"))
    model = load_family(load_config(str(cfg)), torch.bfloat16, torch.device("cuda"))
    runner, budget = model.runner, model.kv_budget
    assert budget["prefill_peak_mib"] > 0
    dev, t = torch.device("cuda"), 256
    rows = min(prefill_token_budget(t) // t, runner.num_slots)
    slots = torch.arange(rows, device=dev)
    fb = ForwardBatch(is_prefill=True, rids=[str(i) for i in range(rows)], slots_gpu=slots, lengths_cpu=[t] * rows,
                      steps_cpu=[0] * rows, steps_gpu=torch.zeros_like(slots),
                      positions_gpu=torch.arange(t, device=dev).expand(rows, t),
                      model_inputs={"input_ids": torch.randint(0, runner.cfg.audio_bos_token_id - 16, (rows, t),
                                                               device=dev)})  # text tokens
    forward = lambda: runner.engine.forward(fb)  # noqa: E731
    base = torch.cuda.memory_allocated(dev)
    first = peak_bytes(forward, dev)
    kept = torch.cuda.memory_allocated(dev) - base  # what the first call left allocated (workspaces)
    peak = peak_bytes(forward, dev)  # the activations alone: workspaces are RUNTIME_SLACK_BYTES's
    assert peak <= budget["prefill_peak_mib"] * 2**20 * 1.05 + 2**20, (first, kept, peak, budget)


def test_small_prefills_replay_graphs_within_bf16_rounding_of_eager():
    """Prefills of one and of three prompts (padded rows and tokens) through PrefillGraphs against
    the eager fused prefill, on a 2-layer model at the 3B hidden sizes: logits and the KV written
    at the prompts' positions agree within bf16 rounding (two bf16 computations of a model that
    each sit ~1.3% off float32, tests/test_gpu_parity.py), and a second batch in the same bucket
    gets its own results, not the first one's."""
    import dataclasses

    import torch

    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine, ForwardBatch
    from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
    from omni_cli.runners.higgs_audio_v2.shapes import shape_config

    dev = torch.device("cuda")
    cfg = dataclasses.replace(shape_config("higgs-audio-v2-3b"), num_hidden_layers=2)
    torch.manual_seed(0)
    with torch.device(dev):
        model = HiggsAudioV2LM(cfg, 512).to_runtime(dev, torch.bfloat16)
    engines = []
    for graphs in (False, True):
        kv = KVCache(2, 5, cfg.num_key_value_heads, 512, cfg.head_dim, torch.bfloat16, dev)
        engines.append(Engine(model, kv, dev))
        if graphs:
            engines[-1].use_graphs()
    gen = torch.Generator().manual_seed(1)

    def batch(lengths, slots):
        prompts = [torch.randint(0, cfg.audio_bos_token_id - 16, (n,), generator=gen).tolist() for n in lengths]
        t = max(lengths)
        ids = torch.tensor([p + [0] * (t - len(p)) for p in prompts], device=dev)
        return ForwardBatch(is_prefill=True, rids=[str(i) for i in slots], slots_gpu=torch.tensor(slots, device=dev),
                            lengths_cpu=list(lengths), steps_cpu=[0] * len(slots),
                            steps_gpu=torch.zeros(len(slots), dtype=torch.int64, device=dev),
                            positions_gpu=torch.arange(t, device=dev).expand(len(slots), t),
                            model_inputs={"input_ids": ids}, prompts_cpu=prompts)

    rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
    for lengths, slots in (([40], [0]), ([37], [1]), ([10, 64, 33], [2, 0, 3]), ([5, 60, 20], [1, 3, 2])):
        fb = batch(lengths, slots)
        want, got = (e.forward(fb) for e in engines)
        err = rel(got, want)
        kv_err = max(rel(engines[1].kv.k_gpu[:, s, :, :n], engines[0].kv.k_gpu[:, s, :, :n])
                     for s, n in zip(slots, lengths))
        print(f"prefill {lengths}: logits {err:.1e}, keys {kv_err:.1e} off eager")
        assert got.shape == want.shape and err < 3e-2 and kv_err < 3e-2, (lengths, err, kv_err)
    assert sorted(engines[1].prefill_graphs._entries) == [(1, 64), (4, 64)]


def _counted_codec_graphs():
    """The tiny codec (bf16, CUDA), CodecGraphs over it, the shapes of the codec's decode calls
    it makes (eager runs and captures), and a check: one call's audio against the eager decode."""
    import torch

    from omni_cli.runners.codec_graphs import CodecGraphs
    from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder

    dev = torch.device("cuda")
    codec = HiggsCodecDecoder.load(TINY / "codec", torch.bfloat16, dev)
    calls = []

    def counted(codes, lengths):
        calls.append(tuple(codes.shape))
        return codec.decode(codes, lengths)

    graphs = CodecGraphs(counted, dev)

    def check(codes, lengths) -> None:  # numpy int64 [B, Q, T] and [B]
        with torch.inference_mode():
            want = codec.decode(torch.from_numpy(codes).to(dev), torch.from_numpy(lengths).to(dev)).cpu()
            got = graphs(torch.from_numpy(codes).pin_memory(), torch.from_numpy(lengths).pin_memory()).cpu()
            # control: the eager decode with one frame of row 0's codes changed (inside its length)
            other = codec.decode(change_codec_frame(torch.from_numpy(codes), 0, int(lengths[0]) // 2).to(dev),
                                 torch.from_numpy(lengths).to(dev)).cpu()
        assert torch.equal(got, want), (codes.shape, float((got - want).abs().max()))
        assert not torch.equal(got, other), codes.shape

    return codec.num_quantizers, calls, check


def test_codec_graphs_replay_what_the_eager_call_computes():
    """Batched codec calls through CodecGraphs (the tiny codec, bf16, masked rows): a shape's
    first call runs eagerly, its second captures and replays, later ones replay; every call's
    audio equals the eager decode of the same codes bit for bit, also after another shape's
    graph (sharing the memory pool) ran in between, and a replay gets its own codes' audio."""
    import numpy as np
    import torch

    q, calls, check = _counted_codec_graphs()
    rng = np.random.default_rng(0)
    with torch.cuda.stream(torch.cuda.Stream()):  # as on the codec thread: not the default stream
        for rows, frames in [(4, 64), (4, 64), (2, 128), (4, 64), (2, 128), (2, 128), (4, 64)]:
            check(rng.integers(0, 1024, (rows, q, frames), dtype=np.int64),
                  rng.integers(1, frames + 1, rows).astype(np.int64))
    # one eager call and one capture for each shape; the rest replayed
    assert calls == [(4, q, 64), (4, q, 64), (2, q, 128), (2, q, 128)], calls


def test_codec_graphs_capture_at_most_max_graphs_shapes():
    """Past MAX_GRAPHS captured shapes (each keeps its output allocated), a new shape's calls
    all run eagerly, and still give the eager decode's audio."""
    import numpy as np
    import torch

    from omni_cli.runners.codec_graphs import MAX_GRAPHS

    q, calls, check = _counted_codec_graphs()
    rng = np.random.default_rng(1)
    with torch.cuda.stream(torch.cuda.Stream()):
        for k in range(1, MAX_GRAPHS + 2):
            for _ in range(3):
                check(rng.integers(0, 1024, (1, q, 8 * k), dtype=np.int64), np.array([8 * k], dtype=np.int64))
    # an eager call and a capture for each of the first MAX_GRAPHS shapes; the last one's three calls eager
    assert [shape[-1] for shape in calls] == ([8 * k for k in range(1, MAX_GRAPHS + 1) for _ in range(2)]
                                              + [8 * (MAX_GRAPHS + 1)] * 3)


def test_default_mode_batches_the_codec_within_bf16_rounding(tmp_path):
    """Rows that finish together share a padded, masked codec call on CUDA: each row's audio
    stays within bf16's own rounding (our bf16 decode against float32) of the row decoded alone."""
    import numpy as np
    import soundfile as sf
    import torch

    from tests.conftest import load_family
    from omni_cli.config import load_config
    from omni_cli.runners.codec_graphs import CodecGraphs

    cfg = write_config(tmp_path / "m.yaml", TINY, max_seq_len=256)
    cfg.write_text(cfg.read_text().replace("dtype: float32", "dtype: bfloat16").replace("device: cpu", "device: cuda"))
    import omni_cli.generate as generate

    calls = []  # every batched call's rows, eager or replayed
    real, real_warm = CodecGraphs.__call__, generate._warm_up
    CodecGraphs.__call__ = lambda self, codes, lengths: (calls.append(codes.shape[0]), real(self, codes, lengths))[1]
    generate._warm_up = lambda *a: (real_warm(*a), calls.append("warmed"))[0]
    try:
        out = _gen(tmp_path, "d", cfg, [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)], "--seed", "2",
                   "--min-new-frames", "60", "--max-batch-size", "8")
    finally:
        CodecGraphs.__call__, generate._warm_up = real, real_warm
    warm = calls[: calls.index("warmed")]
    # the warm-up: batches 1, 2, 4, ..., two calls each (the second captures the shape's graph)
    assert warm == [1 << (i // 2) for i in range(len(warm))] and len(warm) % 2 == 0, calls
    assert calls[len(warm) + 1:] == [8], calls  # the 8 rows finish in one step and share one call
    dev = torch.device("cuda")
    runners = {dt: load_family(load_config(str(cfg)), dt, dev).codec for dt in (torch.bfloat16, torch.float32)}
    for m in read_manifest(out):
        tokens = np.load(out / m["logprobs_file"])["tokens"]
        alone = {dt: r.decode([tokens], batched=False)[0].astype(np.int32) for dt, r in runners.items()}
        got, _ = sf.read(out / m["file_name"], dtype="int16")
        bound = max(1, int(np.abs(alone[torch.bfloat16] - alone[torch.float32]).max()))
        assert np.abs(got.astype(np.int32) - alone[torch.bfloat16]).max() <= bound, m["id"]
        # control: the row's codes with one frame changed, decoded alone, fail the bound
        other = runners[torch.bfloat16].decode([change_one_frame(tokens)], batched=False)[0]
        assert max_lsb(got, other) > bound, (m["id"], max_lsb(got, other), bound)


@pytest.mark.parametrize("model_dtype", ["float32", "bfloat16"])
def test_stream_into_fills_cuda_tensors_as_safetensors_reads_them(tmp_path, monkeypatch, model_dtype):
    """The streaming loader on CUDA (pinned buffers, the side stream, buffers reused behind
    their events, bf16 stored into a float32 model converted on the device) against the
    safetensors library's own read of the files."""
    import torch
    from safetensors.torch import load_file

    import omni_cli.runners.checkpoint as checkpoint
    from omni_cli.runners.device import default_dtype
    from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
    from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
    from tests.reference import HiggsAudioV2ForConditionalGeneration
    from tests.tiny_checkpoint import build_tokenizer, tiny_lm_config

    monkeypatch.setattr(checkpoint, "STAGE_BYTES", 4099)
    torch.manual_seed(2)
    HiggsAudioV2ForConditionalGeneration(tiny_lm_config(build_tokenizer())).to(torch.bfloat16).save_pretrained(
        tmp_path, max_shard_size="200KB")
    dtype = getattr(torch, model_dtype)
    with torch.device("cuda"), default_dtype(dtype):
        model = HiggsAudioV2LM(HiggsConfig.from_file(tmp_path / "config.json"), max_seq_len=16)
    # work still queued on the current stream when the load starts (as a model's init is): if the
    # copies did not wait for it, these NaNs would land after them
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time
    for t in model.state_dict().values():
        t.fill_(float("nan")) if t.is_floating_point() else t.zero_()
    checkpoint.stream_into(model, tmp_path)
    got = model.state_dict()
    want = {k: v for f in sorted(tmp_path.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].device.type == "cuda" and got[k].dtype == dtype
        assert torch.equal(got[k].cpu(), v.to(dtype)), k


def test_fused_codec_units_match_the_reference_decode_on_cuda(tmp_path):
    """The CUDA codec with its residual-unit kernel (runners/fused_codec.py: 128, 64 and 32
    channels in bf16; cuDNN for the 256- and 16-channel units) against transformers'
    HiggsAudioV2TokenizerModel.decode on the same weights in float32 with TF32 off: within
    twice the reference's own bf16 distance from that (a 512-channel decoder, 40 frames);
    a padded, masked batch row against the same row decoded alone, within the same bound;
    and bit for bit against its own modules' forward, whose convolutions add their biases."""
    import torch
    from transformers import HiggsAudioV2TokenizerModel

    from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder, _FusedResidualUnit
    from tests.tiny_checkpoint import tiny_codec, tiny_codec_config

    cfg = tiny_codec_config()
    cfg.acoustic_model_config.decoder_hidden_size = 512
    torch.manual_seed(0)
    ref = tiny_codec(cfg)  # its audio the codes drive
    assert isinstance(ref, HiggsAudioV2TokenizerModel)
    ref.save_pretrained(tmp_path)
    dev = torch.device("cuda")
    codes = torch.randint(0, 1024, (3, 8, 40), generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.inference_mode():
        ref = ref.to(dev)
        torch.backends.cudnn.allow_tf32 = False
        try:
            want = ref.decode(codes, return_dict=False)[:, 0].float()  # audio [B, 1, samples] -> [B, samples]
        finally:
            torch.backends.cudnn.allow_tf32 = True
        peer = ref.to(torch.bfloat16).decode(codes, return_dict=False)[:, 0].float()
        scale = want.abs().max()
        bound = 2 * (peer - want).abs().max() / scale
        ours = HiggsCodecDecoder.load(tmp_path, torch.bfloat16, dev)
        widths = sorted({m.conv1.in_channels for m in ours.modules() if isinstance(m, _FusedResidualUnit)})
        assert widths == [32, 64, 128], widths
        err = (ours.decode(codes) - want).abs().max() / scale
        masked = ours.decode(codes, torch.tensor([40, 23, 0], device=dev))
        alone = ours.decode(codes[1:2, :, :23])[0]
        err_masked = (masked[1, : 23 * ours.hop_length] - alone).abs().max() / scale
        # the decode's bias and residual adds inside its Snakes (_decode_fused) against the
        # modules' forward, which leave them to ATen: the same roundings, so the same bits
        modules = ours.acoustic_decoder(ours.latent(codes))[:, 0].float()
        # controls: one frame's codes changed (row 0 at frame 20; row 1 at frame 11, inside its
        # 23) against the same targets, and the masked row against another row alone
        other = ours.decode(change_codec_frame(change_codec_frame(codes, 0, 20), 1, 11))
        err_other = (other - want).abs().max() / scale
        err_masked_other = (other[1, : 23 * ours.hop_length] - alone).abs().max() / scale
        err_swapped = (masked[1, : 23 * ours.hop_length] - ours.decode(codes[0:1, :, :23])[0]).abs().max() / scale
        print(f"bf16: {err:.1e} off the float32 reference (bound {bound:.1e}), masked row {err_masked:.1e}; "
              f"controls: {err_other:.1e}, masked {err_masked_other:.1e}, rows swapped {err_swapped:.1e}")
        assert err <= bound and err_masked <= bound, (err, err_masked, bound)
        assert torch.equal(ours.decode(codes), modules)
        assert min(err_other, err_masked_other, err_swapped) > bound, (err_other, err_masked_other, err_swapped, bound)
        assert not torch.equal(other, modules)
