"""The native Qwen3-TTS-12Hz pieces (runners/qwen3_tts/) against qwen-tts 0.1.1's golden outputs.

Goldens: tests/golden/make_qwen3_tts.py, run with the reference package on tiny random
checkpoints in the released layout (float32, CPU, greedy at both levels). Each parity check
sits beside a negative control that must fail the same bound. Bounds:
  codes, token ids, prompt layout (frames included) exact
  first-frame logits (talker and predictor)          1e-4 relative (max |diff| / max |ref|)
  prompt embeddings                                  1e-5 relative
The codec, encoder and speaker encoder: test_qwen3_tts_codec.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from omni_cli.runners.attention import AttentionContext, KVCache
from omni_cli.runners.errors import ConfigError
from omni_cli.runners.qwen3_tts.config import GenerationDefaults, Qwen3TTSConfig, read_limits
from omni_cli.runners.qwen3_tts.loading import resolve_checkpoint
from omni_cli.runners.qwen3_tts.prompt import PromptBuilder, prefill_arrays, trailing_table
from omni_cli.runners.qwen3_tts.talker import CODEC_FRAME, CODEC_SPEAKER
from omni_cli.runners.qwen3_tts.tokenizer import TextTokenizer, mistral_regex_applies
from tests.qwen3_reference import (GOLDEN, Session, arrays, builder, case, case_names, ckpt, configs,  # noqa: F401
                                   greedy_generate, have_goldens, manifest, one_thread, prompt_of, rel, talker)

pytestmark = pytest.mark.skipif(not have_goldens(), reason="tests/golden/qwen3_tts/ not generated")

LOGITS_REL = 1e-4
EMBED_REL = 1e-5


def max_new() -> int:
    return manifest()["api_generation_kwargs"]["max_new_tokens"]


@pytest.fixture(scope="module")
def generated():
    """Every golden case generated once by the native pieces (greedy, batch 1)."""
    out = {}
    for name in case_names():
        kind = case(name)["ckpt"]
        out[name] = greedy_generate(talker(kind), prompt_of(name), configs(kind)[1], max_new())
    return out


# ---- configs ----

def test_configs_and_limits_read_without_weights():
    for kind in ("base", "custom_voice", "voice_design"):
        cfg, gen, codec_cfg = configs(kind)
        raw = json.loads((ckpt(kind) / "config.json").read_text())
        assert cfg.tts_model_type == kind and cfg.num_streams == 16
        assert cfg.talker.vocab_size == raw["talker_config"]["vocab_size"]
        assert cfg.code_vocab == raw["talker_config"]["code_predictor_config"]["vocab_size"]
        assert codec_cfg.decoder.total_upsample == 1920
        lim = read_limits(ckpt(kind))
        assert lim.control_ids == (cfg.talker.codec_eos_token_id,)
        assert "auto" in lim.languages and not any("dialect" in x for x in lim.languages)
        # generation_config.json's values, over the package's hard defaults
        file_gen = json.loads((ckpt(kind) / "generation_config.json").read_text())
        assert gen.max_new_tokens == file_gen["max_new_tokens"] and gen.repetition_penalty == 1.05
    cv = read_limits(ckpt("custom_voice"))
    assert set(cv.speakers) >= {"eric", "dylan", "ryan"} and cv.dialects["eric"].endswith("dialect")
    assert read_limits(ckpt("base")).speakers == ()
    assert GenerationDefaults().temperature == 0.9  # no file: the hard defaults


def test_config_errors_name_file_and_key(tmp_path):
    raw = json.loads((ckpt("base") / "config.json").read_text())
    del raw["talker_config"]["text_vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"config\.json: key 'talker_config\.text_vocab_size'"):
        Qwen3TTSConfig.from_file(tmp_path / "config.json")
    raw["talker_config"]["text_vocab_size"] = 8
    raw["talker_config"]["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="talker_config.hidden_act"):
        Qwen3TTSConfig.from_file(tmp_path / "config.json")


# ---- text tokenizer ----

def test_token_ids_match_the_reference():
    for name in case_names():
        z, c = arrays(name), case(name)
        tok = builder(c["ckpt"]).tokenizer
        text = c["args"]["text"]
        assert tok.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n") == z["text_ids"].tolist()
        if "instruct_ids" in z:
            assert tok.encode(f"<|im_start|>user\n{c['args']['instruct']}<|im_end|>\n") == z["instruct_ids"].tolist()
        if "ref_ids" in z:
            assert tok.encode(f"<|im_start|>assistant\n{c['args']['ref_text']}<|im_end|>\n") == z["ref_ids"].tolist()


def _big_vocab_folder(tmp_path, small):
    """The golden rule's large vocabulary: the small one plus unreachable entries past 100000."""
    vocab = json.loads((small / "vocab.json").read_text(encoding="utf-8"))
    n = len(vocab)
    vocab.update({f"<fill{i}>": n + i for i in range(100001 - n)})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    shutil.copy(small / "merges.txt", tmp_path)
    shutil.copy(small / "config.json", tmp_path)
    cfg = json.loads((small / "tokenizer_config.json").read_text(encoding="utf-8"))
    first = min(int(k) for k in cfg["added_tokens_decoder"])
    cfg["added_tokens_decoder"] = {str(int(k) - first + len(vocab)): v for k, v in cfg["added_tokens_decoder"].items()}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
    return tmp_path


def test_fix_mistral_regex_rule_matches_the_reference(tmp_path):
    """Small vocabulary: the Qwen2 split; over 100000 entries (local folder, transformers_version
    4.57.3): the package swaps in the Mistral split. Both give the reference's ids; the other split
    on the large vocabulary (the negative control) does not."""
    rule = json.loads((GOLDEN / manifest()["tokenizer_rule"]).read_text(encoding="utf-8"))
    small = ckpt("base")
    big = _big_vocab_folder(tmp_path, small)
    toks = {"small_vocab": TextTokenizer(small), "large_vocab": TextTokenizer(big)}
    for label, tok in toks.items():
        assert tok.mistral_regex == rule[label]["regex_patched"]
        assert tok.encode_batch(rule["texts"]) == rule[label]["ids"]
        assert [tok.pieces(t) for t in rule["texts"]] == rule[label]["pieces"]
    assert rule["large_vocab"]["regex_patched"] and not rule["small_vocab"]["regex_patched"]
    other = TextTokenizer(big, mistral_regex=False)  # the negative control
    assert other.encode_batch(rule["texts"]) != rule["large_vocab"]["ids"]
    assert toks["large_vocab"].pieces("HelloWorld") != other.pieces("HelloWorld")  # camel case split


def test_mistral_rule_follows_transformers_versions():
    big = 151643
    assert mistral_regex_applies(big, {"model_type": "qwen3_tts", "transformers_version": "4.57.3"})
    assert mistral_regex_applies(big, {"model_type": "qwen3_tts"})  # no version named: patched
    assert not mistral_regex_applies(big, {"model_type": "qwen3_tts", "transformers_version": "4.57.2"})
    assert mistral_regex_applies(big, {"model_type": "mistral", "transformers_version": "4.40.0"})
    assert not mistral_regex_applies(big, {"model_type": "qwen3_tts", "transformers_version": "5.0.0"})
    assert not mistral_regex_applies(big, None)  # no config.json beside the tokenizer
    assert not mistral_regex_applies(100000, {"model_type": "qwen3_tts"})


# ---- prompt layout ----

def _golden_codec_track(z):
    codec = z["prompt_codec_ids"].copy()
    codec = np.where(z["prompt_ref_frame"] >= 0, CODEC_FRAME, codec)
    return np.where(z["prompt_codec_ids"] == -2, CODEC_SPEAKER, codec)


def _embeds(model, p):
    spk = None
    if p.speaker is not None:
        spk = torch.zeros(1, len(p), model.hidden_size)
        spk[0, p.speaker_pos] = torch.from_numpy(p.speaker)
    with torch.inference_mode():
        return model.prompt_embeds(torch.from_numpy(p.text_ids)[None], torch.from_numpy(p.codec_ids)[None],
                                   torch.from_numpy(p.prompt_codes(16))[None], spk)[0].numpy()


@pytest.mark.parametrize("name", case_names())
def test_prompt_layout_and_embeddings_match_the_reference(name):
    z, p = arrays(name), prompt_of(name)
    assert p.text_ids.tolist() == z["prompt_text_ids"].tolist()
    assert p.codec_ids.tolist() == _golden_codec_track(z).tolist()
    frames = z["prompt_ref_frame"]
    if (frames >= 0).any():
        assert p.ref_start == int(np.flatnonzero(frames >= 0)[0])
        assert np.array_equal(p.ref_codes[frames[frames >= 0]], z["ref_codes"][frames[frames >= 0]])
    # the reference pads trailing text with tts_pad; past its end a row reads tts_pad too
    trailing = [p.trailing_at(s) for s in range(len(z["trailing_text_ids"]) + 2)]
    assert trailing == z["trailing_text_ids"].tolist() + [p.tts_pad_id] * (len(trailing) - len(z["trailing_text_ids"]))
    model = talker(case(name)["ckpt"])
    assert rel(_embeds(model, p), z["prompt_embeds"]) < EMBED_REL
    with torch.inference_mode():  # the text track a decode step adds
        steps = torch.tensor(trailing[: len(z["trailing_text_ids"])])
        assert rel(model.text_embed(steps).numpy(), z["trailing_text_embeds"]) < EMBED_REL
        assert rel(model.text_embed(torch.tensor(p.tts_pad_id)).numpy(), z["tts_pad_embed"]) < EMBED_REL


def test_prompt_layout_negative_control():
    """The other text mode lays the same row out differently (the layout checks can fail)."""
    name = "cv_ryan_english"
    c, z = case(name), arrays(name)
    flipped = builder("custom_voice").build(text=c["args"]["text"], speaker="Ryan", language="English",
                                            non_streaming_mode=False)
    assert flipped.text_ids.tolist() != z["prompt_text_ids"].tolist()


def test_prompt_fields_the_reference_refuses():
    cv, base, vd = builder("custom_voice"), builder("base"), builder("voice_design")
    with pytest.raises(ValueError, match="speaker"):
        cv.build(text="Hi", speaker="nobody")
    with pytest.raises(ValueError, match="language"):
        cv.build(text="Hi", speaker="Ryan", language="Klingon")
    with pytest.raises(ValueError, match="language"):  # dialects come from the speaker, not the row
        cv.build(text="Hi", speaker="Ryan", language="sichuan_dialect")
    with pytest.raises(ValueError, match="ref_text"):
        base.build(text="Hi", x_vector=np.zeros(32, np.float32), ref_codes=np.zeros((3, 16), np.int64))
    with pytest.raises(ValueError, match="speaker"):
        vd.build(text="Hi", speaker="Ryan")
    x_only = base.build(text="Hi", x_vector=np.zeros(base.cfg.talker.hidden_size, np.float32), x_vector_only_mode=True,
                        ref_codes=np.zeros((3, 16), np.int64), ref_text="ignored")
    assert x_only.ref_codes is None and CODEC_SPEAKER in x_only.codec_ids.tolist()
    # 0.6B CustomVoice: the reference drops instruct (its tts_model_size in "0b6"); 1.7B keeps it
    small = PromptBuilder(replace(cv.cfg, tts_model_size="0b6"), cv.tokenizer)
    plain = small.build(text="Hi there", speaker="Ryan").text_ids.tolist()
    assert small.build(text="Hi there", speaker="Ryan", instruct="Speak slowly.").text_ids.tolist() == plain
    assert cv.build(text="Hi there", speaker="Ryan", instruct="Speak slowly.").text_ids.tolist() != plain


def test_prompt_content_keys_tell_voices_apart():
    """content(): what prefix sharing must compare. Equal inputs, equal keys; another x-vector,
    speaker or reference frame changes the key at its position only."""
    base, cv = builder("base"), builder("custom_voice")
    x = arrays("base_xvec_auto_stream")["spk_embedding"]
    a = base.build(text="Hi there", x_vector=x, x_vector_only_mode=True)
    assert a.content() == base.build(text="Hi there", x_vector=x.copy(), x_vector_only_mode=True).content()
    b = base.build(text="Hi there", x_vector=x * 1.5, x_vector_only_mode=True)
    diff = [i for i, (u, v) in enumerate(zip(a.content(), b.content())) if u != v]
    assert diff == [a.speaker_pos]
    ref = arrays("base_icl_long_stream")["ref_codes"]
    c = base.build(text="Hi there", x_vector=x, ref_codes=ref, ref_text="Ref.")
    moved = ref.copy()
    moved[3, 5] = (moved[3, 5] + 1) % 32
    d = base.build(text="Hi there", x_vector=x, ref_codes=moved, ref_text="Ref.")
    assert [i for i, (u, v) in enumerate(zip(c.content(), d.content())) if u != v] == [c.ref_start + 3]
    assert cv.build(text="Hi", speaker="Ryan").content() != cv.build(text="Hi", speaker="Aiden").content()


def test_trailing_table_pads_with_tts_pad():
    rows = [prompt_of("cv_serena_chinese_stream"), prompt_of("cv_vivian_auto_en")]
    width = len(rows[0].trailing_ids) + 3
    table = trailing_table(rows, width)
    for row, p in zip(table, rows):
        assert row.tolist() == [p.trailing_at(s) for s in range(width)]


# ---- talker and code predictor, end to end ----

@pytest.mark.parametrize("name", case_names())
def test_greedy_codes_and_first_frame_logits_match_the_reference(name, generated):
    z, g = arrays(name), generated[name]
    assert g.codes.shape == z["codes"].shape and np.array_equal(g.codes, z["codes"])
    assert rel(g.talker_logits0, z["talker_logits0"]) < LOGITS_REL
    assert rel(g.cp_logits0, z["cp_logits0"]) < LOGITS_REL


def test_some_rows_stop_on_eos_and_some_run_to_the_limit(generated):
    stops = {c["name"]: c["stopped_on_eos"] for c in manifest()["cases"]}
    assert any(stops.values()) and not all(stops.values())
    for name, g in generated.items():
        assert (len(g.codes) < max_new() - 1) == stops[name]


def test_end_to_end_negative_controls():
    """A perturbed head fails the logits bound; the other text mode fails exact codes."""
    name = "cv_ryan_english"
    c, z = case(name), arrays(name)
    model = talker("custom_voice")
    gen = configs("custom_voice")[1]
    saved = model.codec_head.weight.detach().clone()
    try:
        with torch.no_grad():
            model.codec_head.weight.mul_(1.001)
        assert rel(Session(model, 64).prefill(prompt_of(name), 16)[0][0].numpy(), z["talker_logits0"]) > LOGITS_REL
    finally:
        with torch.no_grad():
            model.codec_head.weight.copy_(saved)
    p = builder("custom_voice").build(text=c["args"]["text"], speaker="Ryan", language="English",
                                      non_streaming_mode=False)
    other = greedy_generate(model, p, gen, 6).codes
    assert len(other) and not np.array_equal(other, z["codes"][: len(other)])


def test_batched_prefill_equals_each_row_alone():
    """Right-padded rows of different lengths in one prefill (the engine's layout): each row's
    last logits equal its batch-1 ones."""
    names = ["base_icl_long_nonstream", "base_xvec_auto_stream", "base_icl_english_stream"]
    model = talker("base")
    prompts = [prompt_of(n) for n in names]
    t = max(len(p) for p in prompts)
    inputs = {k: torch.from_numpy(v) for k, v in prefill_arrays(prompts, t, 16, model.hidden_size).items()}
    tc = model.cfg.talker
    kv = KVCache(tc.num_hidden_layers, len(names) + 1, tc.num_key_value_heads, t, tc.head_dim, torch.float32,
                 torch.device("cpu"))
    lens = torch.tensor([len(p) for p in prompts])
    ar = torch.arange(t)
    mask = ((ar[None, :, None] >= ar[None, None, :]) & (ar[None, None, :] < lens[:, None, None]))[:, None]
    ctx = AttentionContext(kv=kv, is_prefill=True, slots_gpu=torch.arange(len(names)),
                           positions_gpu=ar.expand(len(names), t), mask_gpu=mask, kv_len=t)
    with torch.inference_mode():
        hidden = model(ctx, **inputs)
        out = model.compute_logits(hidden[torch.arange(len(names)), lens - 1])
    logits, h = model.split_output(out)
    assert h.shape == (len(names), model.hidden_size)
    for i, n in enumerate(names):
        assert rel(logits[i].numpy(), arrays(n)["talker_logits0"]) < LOGITS_REL


def test_predictor_runs_rows_together_in_static_buffers():
    """One run_frame over three rows (one buffer set, reused across frames): each row's codes and
    sub-step logits equal its own; the draw callback sees codebooks 1..15 in order."""
    model = talker("base")
    rows = ["base_xvec_auto_stream", "base_xvec_english_nonstream", "base_icl_long_stream"]
    hidden, code0 = [], []
    for n in rows:
        logits, h = Session(model, 128).prefill(prompt_of(n), 16)
        hidden.append(h)
        code0.append(int(arrays(n)["codes"][0, 0]))
    hidden = torch.cat(hidden)
    bufs = model.new_predictor_buffers(len(rows))
    seen = []

    def draw(k, lg):
        seen.append((k, tuple(lg.shape)))
        return lg.argmax(dim=-1)

    with torch.inference_mode():
        model.predict_frame(hidden.flip(0), torch.tensor(code0[::-1]), bufs, draw)  # dirties the buffers
        seen.clear()
        codes = model.predict_frame(hidden, torch.tensor(code0), bufs, draw).clone()
    assert seen == [(k, (len(rows), model.cfg.code_vocab)) for k in range(1, 16)]
    for i, n in enumerate(rows):
        assert np.array_equal(codes[i].numpy(), arrays(n)["codes"][0])
    with torch.inference_mode():
        expect = model.frame_embed(codes)
    assert torch.equal(bufs.frame_embed_gpu, expect)  # the next step's codec input, as decode_embeds sums it


def test_interleaved_mrope_with_equal_components_is_plain_rope():
    """The reference's interleaved MRoPE (sections [24, 20, 20]) picks, per rotary pair, one of three
    components' angles; with the three equal (speech positions) that is plain rope, which the
    talker applies. Unequal components (the control) differ."""
    d, sections = 128, [24, 20, 20]
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))

    def interleaved(pos3):  # pos3 [3, T] -> cos [T, D]
        freqs = pos3[:, :, None].float() * inv  # [3, T, D/2]
        out = freqs[0].clone()
        for i, n in enumerate(sections[1:], 1):
            out[..., i:n * 3:3] = freqs[i][..., i:n * 3:3]
        return torch.cat([out, out], -1).cos()

    pos = torch.arange(40)
    plain = talker("base").rope_cos[:40]
    assert torch.equal(interleaved(pos.expand(3, -1)), plain)
    assert not torch.equal(interleaved(torch.stack([pos, pos + 1, pos])), plain)


def test_local_checkpoint_resolves_as_it_is():
    assert resolve_checkpoint(str(ckpt("base"))) == ckpt("base")
