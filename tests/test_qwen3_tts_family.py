"""Qwen3-TTS as a ModelFamily (runners/qwen3_tts/family.py, runner.py, prompter.py), on the CPU in
float32, against qwen-tts 0.1.1's goldens (tests/golden/qwen3_tts/, greedy at both levels).

Rows go through the scheduler loop as `omni generate` drives them (omni_cli/loop.py: prefill,
continuous batching over fewer slots than rows, sync or async). Each comparison sits beside a
negative control that must fail it. Bounds:
  codes (every voice mode, batched)                    exact
  written samples (int16, through the codec stage,     floor(x * 32768) / 32768 within 1/32768 + 1e-5
    in-context rows decoded after their reference     of the reference's float wav
    and cut by prefix_cut)
  deterministic mode, batch 1 vs 4; async vs sync      byte-identical tokens and logprobs
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from omni_cli.loop import run_loop
from omni_cli.runners.engine import FixedShapes
from omni_cli.runners.errors import ConfigError
from omni_cli.runners.family import AudioTurn, LoadSpec, PromptFieldError, family_class
from omni_cli.runners.qwen3_tts.family import Qwen3TTS, TalkerKVShape
from omni_cli.runners.qwen3_tts.prompter import ROW_FIELDS, Qwen3Prompter
from omni_cli.runners.sampling.params import SamplingParams
from omni_cli.scheduler import Request, Scheduler
from tests.qwen3_reference import (GOLDEN, arrays, case, case_names, ckpt, have_goldens, manifest,  # noqa: F401
                                   one_thread, rel)

pytestmark = pytest.mark.skipif(not have_goldens(), reason="tests/golden/qwen3_tts/ not generated")

CPU = torch.device("cpu")
KINDS = ("custom_voice", "voice_design", "base")
PCM_ABS = 1 / 32768 + 1e-5
MAX_SEQ = 128


def max_frames() -> int:
    return manifest()["api_generation_kwargs"]["max_new_tokens"] - 1  # the reference's last token gets no frame


def load(kind: str, batch: int = 4, deterministic: bool = False, raw: bool = False) -> Qwen3TTS:
    spec = LoadSpec(source="test", checkpoint=str(ckpt(kind)), codec=str(ckpt(kind)), dtype=torch.float32,
                    device=CPU, max_batch_size=batch, max_seq_len=MAX_SEQ, deterministic=deterministic,
                    raw_logprobs=raw)
    return family_class("qwen3_tts").load(spec)


def names_of(kind: str) -> list[str]:
    return [n for n in case_names() if case(n)["ckpt"] == kind]


def turn(name: str) -> tuple:
    """A Base row's reference as the job hands it over: transcript, codes and x-vector (x-vector rows
    get the same clip's codes, which their mode ignores)."""
    if case(name)["ckpt"] != "base":
        return ()
    a = case(name)["args"]
    return (AudioTurn(a.get("ref_text"), arrays("base_icl_long_stream")["ref_codes"], arrays(name)["spk_embedding"]),)


def prompts(family: Qwen3TTS, names: list[str]) -> list:
    rendered = []
    for n in names:
        a = case(n)["args"]
        fields = {k: a[k] for k in ROW_FIELDS if k in a}
        rendered.append(family.render_prompt(a["text"], "ignored system", "ignored scene", turn(n), fields))
    return family.encode_prompts(rendered)


def params(kind: str, **over) -> SamplingParams:
    base = SamplingParams().with_overrides(**dict(Qwen3TTS.limits(str(ckpt(kind))).sampling_defaults))
    return base.with_overrides(**({"temperature": 0.0, "subtalker_temperature": 0.0, "max_new_frames": max_frames()}
                                  | over))


def run(family: Qwen3TTS, names: list[str], p: SamplingParams, seeds=None, async_decode: bool = False) -> list:
    sched = Scheduler.for_runner(family.runner, MAX_SEQ)
    seeds = seeds or list(range(len(names)))
    reqs = [Request(rid=n, prompt=pi, params=p, seed=s) for n, pi, s in zip(names, prompts(family, names), seeds)]
    for r in reqs:
        sched.add(r)
    run_loop(sched, family.runner, lambda rs: None, lambda n, st: None, async_decode)
    return reqs


def family_codec_cfg(kind: str):
    from omni_cli.runners.qwen3_tts.loading import read_configs

    return read_configs(ckpt(kind))[2]


@pytest.fixture(scope="module")
def generated():
    """Every golden case, greedy at both levels, each kind's rows batched through 4 slots."""
    out = {}
    for kind in KINDS:
        family = load(kind)
        out[kind] = (family, run(family, names_of(kind), params(kind)))
    return out


# ---- codes ----

@pytest.mark.parametrize("kind", KINDS)
def test_codes_equal_the_references_in_every_voice_mode(kind, generated):
    family, reqs = generated[kind]
    for r in reqs:
        z, c = arrays(r.rid), case(r.rid)
        assert np.array_equal(r.frames.array, z["codes"]), r.rid  # no EOS frame, no reference codes
        assert r.finish_reason == ("stop" if c["stopped_on_eos"] else "length")
        lp = r.logprobs.array
        assert lp.shape == z["codes"].shape and (lp <= 0).all()
    # control: without the reference's repetition penalty some row's codes differ
    other = run(family, names_of(kind), params(kind, repetition_penalty=1.0))
    assert any(not np.array_equal(r.frames.array, arrays(r.rid)["codes"]) for r in other)


def test_waveform_through_the_codec_stage(generated):
    """What the audio stage writes: frames (after the reference's codes for in-context rows) through
    the codec stage one row at a time (the CPU's path), int16, the reference's part cut."""
    checked = 0
    for kind in KINDS:
        family, reqs = generated[kind]
        for r in reqs:
            tokens, prefix = r.frames.array, family.codec_prefix(r.prompt)
            decoded = tokens if prefix is None else np.concatenate([prefix, tokens])
            samples = family.codec.decode([decoded], batched=False)[0]
            if prefix is not None:
                icl = case(r.rid)["icl_cut"]
                assert (len(prefix), len(decoded), len(samples)) == (icl["ref_frames"], icl["total_frames"],
                                                                     icl["decoded_samples"])
                cut = family.prefix_cut(len(prefix), len(decoded), len(samples))
                assert cut == icl["cut"]
                samples = samples[cut:]
            wav = arrays(r.rid)["wav"]
            assert samples.shape == wav.shape and np.abs(samples / 32768.0 - wav).max() < PCM_ABS, r.rid
            checked += 1
    assert checked == len(case_names())
    # controls: an in-context row decoded without its reference, and a row with one code changed
    family, reqs = generated["base"]
    r = next(r for r in reqs if family.codec_prefix(r.prompt) is not None)
    alone = family.codec.decode([r.frames.array], batched=False)[0]
    assert np.abs(alone / 32768.0 - arrays(r.rid)["wav"]).max() > PCM_ABS
    bad = r.frames.array.copy()
    bad[1, 4] = (bad[1, 4] + 1) % family.cfg.code_vocab
    prefix = family.codec_prefix(r.prompt)
    samples = family.codec.decode([np.concatenate([prefix, bad])], batched=False)[0]
    cut = family.prefix_cut(len(prefix), len(prefix) + len(bad), len(samples))
    assert np.abs(samples[cut:] / 32768.0 - arrays(r.rid)["wav"]).max() > PCM_ABS


def test_prefix_sharing_keeps_the_codes(monkeypatch):
    """Rows of one voice share their prompt's prefix KV blocks (runners/kv_blocks.py); their content
    keys hold both tracks, frames and x-vectors, so the codes stay the reference's."""
    family = load("base")
    names = names_of("base")
    sched = Scheduler.for_runner(family.runner, MAX_SEQ)
    # each case twice in one run: the second copy of a prompt takes all but its last block from the cache
    reqs = [Request(rid=f"{n}#{copy}", prompt=pi, params=params("base"), seed=i)
            for copy in range(2) for i, (n, pi) in enumerate(zip(names, prompts(family, names)))]
    for r in reqs:
        sched.add(r)
    run_loop(sched, family.runner, lambda rs: None, lambda n, st: None, False)
    assert family.runner.kv_blocks.stats.reused_positions > 0  # control: a prefix was shared
    for r in reqs:
        assert np.array_equal(r.frames.array, arrays(r.rid.split("#")[0])["codes"]), r.rid


def test_fixed_decode_rows_pad_the_prefill_frame():
    """Deterministic mode with two rows a chunk: the prefill's frame 0 runs in padded chunks of two,
    as the decode steps do (3 rows: one padding row on the spare slot)."""
    family = load("voice_design", deterministic=True)
    engine = family.runner.engine
    engine.fixed_shapes = FixedShapes(decode_rows=2, prefill_rows=1, prefill_bucket=1)
    engine.use_graphs(capture=False)
    names = names_of("voice_design")[:3]
    for r in run(family, names, params("voice_design")):
        assert np.array_equal(r.frames.array, arrays(r.rid)["codes"]), r.rid
    assert engine.graphs.fixed_rows == 2


# ---- batch invariance, async, sampling levels ----

def _bytes(reqs) -> dict:
    return {r.rid: (r.frames.array.tobytes(), r.logprobs.array.tobytes(), r.finish_reason) for r in reqs}


SAMPLED = dict(temperature=0.9, subtalker_temperature=0.9, top_k=50, subtalker_top_k=20, top_p=0.95)


def test_deterministic_rows_are_byte_identical_across_batch_sizes():
    """Base rows (in-context and x-vector), greedy and sampled at both levels, at 1 and 4 slots."""
    kind = "base"
    names = names_of(kind)[2:7]
    seeds = [101 + i for i in range(len(names))]
    got = {}
    for label, p in (("greedy", params(kind)), ("sampled", params(kind, **SAMPLED))):
        one = run(load(kind, 1, deterministic=True), names, p, seeds)
        got[label] = _bytes(run(load(kind, 4, deterministic=True), names, p, seeds))
        assert _bytes(one) == got[label]
    # controls: sampling changed the rows, and another seed for row 0 changes row 0 alone
    assert all(got["greedy"][n] != got["sampled"][n] for n in names)
    reseeded = _bytes(run(load(kind, 4, deterministic=True), names, params(kind, **SAMPLED), [7] + seeds[1:]))
    assert reseeded[names[0]] != got["sampled"][names[0]]
    assert {n: reseeded[n] for n in names[1:]} == {n: got["sampled"][n] for n in names[1:]}


@pytest.mark.parametrize("deterministic", [True, False])
def test_async_equals_sync(deterministic):
    """Deterministic: byte-identical rows. Default mode: the lookahead changes which rows share a
    step, so logprobs may move in the last bits (1e-4); codes stay equal."""
    kind = "custom_voice"
    names = names_of(kind)[:6]
    p = params(kind, **SAMPLED)
    sync_family, async_family = load(kind, 4, deterministic), load(kind, 4, deterministic)
    sync = run(sync_family, names, p, async_decode=False)
    lookahead = run(async_family, names, p, async_decode=True)
    if deterministic:
        assert _bytes(sync) == _bytes(lookahead)
    for a, b in zip(sync, lookahead):
        assert np.array_equal(a.frames.array, b.frames.array) and a.finish_reason == b.finish_reason
        assert np.abs(a.logprobs.array - b.logprobs.array).max() < 1e-4
    assert {r.finish_reason for r in sync} == {"stop", "length"}  # rows leave mid-run and at the end
    # control: the lookahead path ran (launches resolved after the next launch), the sync one did not
    runner = async_family.runner
    assert runner.async_query_hit + runner.async_query_miss > 0
    assert sync_family.runner.async_query_hit + sync_family.runner.async_query_miss == 0


def test_subtalker_values_reach_the_predictor_draws():
    """Talker greedy, predictor sampled: every row's first code 0 is the reference's (its prefill
    logits are the same), while codebooks 1-15 are drawn, so frame 0 differs from the greedy one."""
    kind = "custom_voice"
    reqs = run(load(kind), names_of(kind), params(kind, subtalker_temperature=1.0))
    for r in reqs:
        assert r.frames.array[0, 0] == arrays(r.rid)["codes"][0, 0]
    assert any(not np.array_equal(r.frames.array[0, 1:], arrays(r.rid)["codes"][0, 1:]) for r in reqs)


def test_raw_logprobs_come_with_every_stream():
    family = load("voice_design", raw=True)
    reqs = run(family, names_of("voice_design")[:2], params("voice_design"))
    for r in reqs:
        raw = r.raw_logprobs.array
        assert np.array_equal(r.frames.array, arrays(r.rid)["codes"])
        assert raw.shape == r.frames.array.shape and (raw <= 0).all() and np.isfinite(raw).all()


# ---- the family's other members ----

def test_limits_row_fields_and_spec():
    lim = Qwen3TTS.limits(str(ckpt("base")))
    cfg = json.loads((ckpt("base") / "config.json").read_text())["talker_config"]
    assert (lim.num_streams, lim.vocab_size) == (16, cfg["code_predictor_config"]["vocab_size"])
    assert lim.control_ids == (cfg["codec_eos_token_id"],) and lim.unused_fields == ("ras_win_len", "ras_win_max_num_repeat")
    d = dict(lim.sampling_defaults)
    assert d["repetition_penalty"] == 1.05 and d["subtalker_top_k"] == 50 and d["temperature"] == 0.9
    assert Qwen3TTS.row_fields() == {"language": str, "speaker": str, "instruct": str, "x_vector_only_mode": bool,
                                     "non_streaming_mode": bool}
    spec = LoadSpec(source="m.yaml", checkpoint=str(ckpt("base")), codec="/elsewhere", dtype=torch.float32,
                    device=CPU, max_batch_size=1, max_seq_len=MAX_SEQ, deterministic=False)
    with pytest.raises(ConfigError, match="codec"):
        Qwen3TTS.load(spec)


def test_prompter_reads_no_weights(tmp_path):
    src = ckpt("custom_voice")
    shutil.copytree(src, tmp_path / "c", ignore=shutil.ignore_patterns("*.safetensors"))
    prompter = Qwen3TTS.prompter(str(tmp_path / "c"), str(tmp_path / "c"))
    assert isinstance(prompter, Qwen3Prompter) and prompter.frame_rate == 12.5 and prompter.sample_rate == 24000
    fields = {"speaker": "Ryan", "language": "English"}
    got = prompter.encode_prompts([prompter.render_prompt("Hello there.", "", None, (), fields)])[0]
    family = load("custom_voice")
    want = family.encode_prompts([family.render_prompt("Hello there.", "", None, (), fields)])[0]
    assert got.ids == want.ids and got.content == want.content
    assert prompter.reference_frames(24000) == 13 and prompter.reference_frames(0) == 0


def _problems(prompter, fields, reference=False, ref_text=False):
    return {(p.field, p.warning) for p in prompter.field_problems(fields, reference, ref_text)}


def test_field_problems_name_the_field():
    cv, vd, base = (Qwen3TTS.prompter(str(ckpt(k)), str(ckpt(k))) for k in KINDS)
    assert _problems(cv, {"speaker": "Ryan", "instruct": "Calmly."}) == set()  # 1.7B CustomVoice reads instruct
    assert _problems(cv, {}) == {("speaker", False)}
    assert _problems(cv, {"speaker": "nobody"}) == {("speaker", False)}
    assert _problems(cv, {"speaker": "ryan", "language": "Klingon"}) == {("language", False)}
    assert _problems(cv, {"speaker": "ryan", "language": "sichuan_dialect"}) == {("language", False)}
    assert _problems(cv, {"speaker": "ryan"}, reference=True, ref_text=True) == {("ref_audio", False)}
    small = Qwen3Prompter(replace(cv.cfg, tts_model_size="0b6"), cv.builder.tokenizer,
                          family_codec_cfg("custom_voice"))
    assert _problems(small, {"speaker": "ryan", "instruct": "Calmly."}) == {("instruct", True)}
    assert _problems(vd, {"instruct": "Warm.", "language": "English"}) == set()
    assert _problems(vd, {"speaker": "Ryan", "x_vector_only_mode": True}) == {("speaker", False),
                                                                              ("x_vector_only_mode", False)}
    assert _problems(base, {}) == {("ref_audio", False)}
    assert _problems(base, {}, reference=True) == {("ref_text", False)}
    assert _problems(base, {}, reference=True, ref_text=True) == set()
    assert _problems(base, {"x_vector_only_mode": True}, reference=True) == set()
    assert _problems(base, {"x_vector_only_mode": True}, reference=True, ref_text=True) == {("ref_text", True)}
    assert _problems(base, {"instruct": "x", "speaker": "Ryan"}, reference=True, ref_text=True) == {
        ("instruct", False), ("speaker", False)}
    with pytest.raises(PromptFieldError) as e:
        cv.render_prompt("Hi", "", None, (), {"speaker": "nobody"})
    assert e.value.field == "speaker"


def test_reference_encoders_and_codec_members():
    import soundfile as sf

    audio, sr = sf.read(GOLDEN / manifest()["ref_audio"], dtype="float32")
    base, cv = load("base", 1), load("custom_voice", 1)
    z = arrays("base_icl_long_stream")
    codes = base.encode_audio([audio])[0]
    assert np.array_equal(codes, z["ref_codes"])
    assert not np.array_equal(base.encode_audio([np.roll(audio, 480)])[0], z["ref_codes"])  # control
    spk = base.speaker_embeddings([audio])[0]
    assert spk.dtype == np.float32 and rel(spk, z["spk_embedding"]) < 1e-5
    assert rel(base.speaker_embeddings([audio * 0.5 + 0.01])[0], z["spk_embedding"]) > 1e-5  # control
    assert cv.speaker_embeddings([audio]) is None
    from tests.test_digest import sha256_of

    assert base.codec_identity() == "sha256:" + sha256_of(base.codec_files())
    assert [f.parent.name + "/" + f.name for f in base.codec_files()] == ["speech_tokenizer/config.json",
                                                                          "speech_tokenizer/model.safetensors"]
    icl, xvec = prompts(base, ["base_icl_long_stream", "base_xvec_auto_stream"])
    assert np.array_equal(base.codec_prefix(icl), z["ref_codes"]) and base.codec_prefix(xvec) is None
    tokens = np.array([[5, 31, 0], [base.cfg.talker.codec_eos_token_id, 3, 2]])
    assert base.real_code_mask(tokens).tolist() == [[True, True, True], [False, True, True]]


def test_validation_stand_in_reference_gives_the_prompts_length():
    """Validation renders a Base row with zero codes of the clip's frame count and a one-value
    stand-in x-vector (omni_cli/validate.py): the prompt it tokenizes is as long as the real one."""
    prompter = Qwen3TTS.prompter(str(ckpt("base")), str(ckpt("base")))
    name = "base_icl_long_nonstream"
    a, real = case(name)["args"], turn(name)[0]
    fields = {k: a[k] for k in ROW_FIELDS if k in a}
    stand_in = AudioTurn(real.text, np.zeros_like(real.codes), np.zeros(1, np.float32))
    got = [prompter.encode_prompts([prompter.render_prompt(a["text"], "", None, (t,), fields)])[0]
           for t in (stand_in, real)]
    assert len(got[0]) == len(got[1]) == case(name)["prompt_len"]
    assert got[0].content != got[1].content  # control: other codes and x-vector, other content keys


def test_budget_measurement_and_text_only_prompts():
    """The memory budget measures a prefill of input_ids alone (no codec track) and a slot's bytes
    count the per-slot state beside the KV; a prompt of ids alone (the warm-up's) runs as text."""
    from omni_cli.runners.budget import KVShape, widest_prefill_bytes

    family = load("voice_design", 2)
    t = family.cfg.talker
    spec = LoadSpec(source="test", checkpoint="", codec="", dtype=torch.float32, device=CPU, max_batch_size=2,
                    max_seq_len=MAX_SEQ, deterministic=False)
    kv = KVShape(t.num_hidden_layers, t.num_key_value_heads, t.head_dim)
    assert widest_prefill_bytes(spec, kv, family.runner.model) == 0  # the CPU keeps no budget; it ran
    extra = TalkerKVShape(t.num_hidden_layers, t.num_key_value_heads, t.head_dim, 5)
    assert extra.slot_bytes(MAX_SEQ, torch.float32) == kv.slot_bytes(MAX_SEQ, torch.float32) + 5
    assert family.runner.engine.kv.num_slots == 3  # two slots and the padding rows' spare one
    sched = Scheduler.for_runner(family.runner, MAX_SEQ)
    p = prompts(family, ["vd_short_stream"])[0]
    reqs = [Request(rid="ids", prompt=list(p.ids), params=params("voice_design", max_new_frames=4), seed=0),
            Request(rid="row", prompt=p, params=params("voice_design"), seed=0)]
    for r in reqs:
        sched.add(r)
    run_loop(sched, family.runner, lambda rs: None, lambda n, st: None, False)
    assert len(reqs[0].frames) == 4 and reqs[0].finish_reason == "length"
    assert np.array_equal(reqs[1].frames.array, arrays("vd_short_stream")["codes"])  # its batch-mate unharmed
