"""Golden files for the native Qwen3-TTS-12Hz family, made with the reference package.

Run with the reference venv's python (see tests/golden/README.md):
    /work/venvs/qwen-ref/bin/python tests/golden/make_qwen3_tts.py

It builds tiny random checkpoints in the released layout under
tests/golden/qwen3_tts/ckpt/<type>/, runs qwen-tts 0.1.1's Qwen3TTSModel API on
them in float32 on the CPU with greedy decoding at both levels, and writes one
npz per case plus manifest.json. Running it twice gives identical bytes.

Stand-in: torchaudio cannot be installed beside the CPU torch 2.13 wheel (PyPI's
torchaudio 2.11 fails to load its library). qwen-tts imports
torchaudio.compliance.kaldi at module level for its 25 Hz tokenizer only, never
on the 12 Hz path used here, so an empty module object is put in sys.modules
(install_torchaudio_standin); calling into it would raise AttributeError. The
`sox` Python package imports but warns that the SoX binary is missing; it too
is used only by the 25 Hz tokenizer.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
OUT = os.path.join(HERE, "qwen3_tts")
MAX_NEW = 16  # max_new_tokens: at most MAX_NEW - 1 frames
EOS_GAIN = 1.2  # codec_head's EOS row is scaled by this so greedy rows can stop early
RES_GAIN, OUT_GAIN = 0.3, 0.25  # speech tokenizer decoder: residual-branch and output-conv scales
GEN = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": MAX_NEW}


def install_torchaudio_standin() -> None:
    """Empty torchaudio modules: only the 25 Hz tokenizer's import line needs them."""
    try:
        import torchaudio.compliance.kaldi  # noqa: F401  (a working real install wins)
        return
    except Exception:
        for name in [n for n in sys.modules if n.startswith("torchaudio")]:
            del sys.modules[name]
    names = ["torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"]
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__version__ = "0.0.0+standin"
        sys.modules[name] = mod
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


install_torchaudio_standin()
import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import qwen3_tts_tiny as tiny  # noqa: E402
from qwen3_tts_layout import prompt_layout, verify_layout  # noqa: E402

EN = ["Hello world, this is a test.", "The quick brown fox jumps over the lazy dog.",
      "Good morning! How are you today?"]
ZH = ["你好，世界。", "今天天气很好，我们去公园吧。"]
LONG = "Once upon a time, in a small village by the sea, there lived an old fisherman."
REF_TEXT = "This is the reference voice."
SHORT = ["Hi there.", "Okay.", "Hi."]  # streaming rows whose trailing text runs out early
INSTRUCT = ["Speak slowly and calmly.", "A warm, deep male voice with a slight rasp.", "用欢快的语气说话。"]
RULE_TEXTS = ["HelloWorld and camelCaseText", "XMLHttpRequest iPhone15Pro getHTTPResponse",
              "Wait...!!! Really?!/ ok\n\n", "Version 3.14159 costs $1,234.50 in 2024",
              "don't STOP, it's DON'T 2024年12月", "naïve café ŚWIĘTO cafe\u0301 ÉCOLE"]
ARRAYS = {
    "codes": "[frames, 16] greedy codes, codebook 0 first; no EOS frame, no reference codes",
    "text_ids / instruct_ids / ref_ids": "the ids the API tokenized (role header and tail included)",
    "prompt_embeds": "[T, talker_hidden] talker prefill inputs_embeds as the reference built them",
    "prompt_text_ids / prompt_codec_ids / prompt_ref_frame": "[T] symbolic prompt: each position sums "
    "text_projection(text_embedding(text id)) + codec_embedding(codec id) + ref frame embedding; -1 absent, "
    "codec id -2 = the Base speaker vector; checked against prompt_embeds",
    "trailing_text_ids / trailing_text_embeds": "text added to decode step k's input (tts_pad after the end)",
    "tts_pad_embed": "[talker_hidden] text_projection(text_embedding(tts_pad_token_id))",
    "talker_logits0": "[talker vocab] raw codec_head logits at the last prefill position (frame 0, code 0)",
    "cp_logits0": "[15, codes] raw predictor logits of frame 0, sub-steps 1..15 (lm_head[0..14])",
    "spk_embedding": "[talker_hidden] Base speaker-encoder output", "ref_codes": "[R, 16] 12 Hz encode of ref",
    "wav": "float32 24 kHz waveform the API returned (ICL: after the reference part is cut)",
    "codes_batched": "present only where the batched call gave other codes than the single-row call"}
ROLE = ["<|im_start|>assistant\n", "<|im_start|>user\n", "<|im_end|>\n"]


def cases() -> list[dict]:
    """Every voice mode; `args` are the API call's keyword arguments besides GEN."""
    cv, vd, b = "custom_voice", "voice_design", "base"
    ref = {"ref_audio": "ref_audio.wav"}
    rows = [
        (cv, "cv_vivian_auto_en", dict(text=EN[0], speaker="Vivian", language="Auto")),
        (cv, "cv_ryan_english", dict(text=EN[1], speaker="Ryan", language="English")),
        (cv, "cv_eric_dialect_auto_zh", dict(text=ZH[0], speaker="Eric", language="Auto")),
        (cv, "cv_dylan_dialect_chinese", dict(text=ZH[1], speaker="Dylan", language="Chinese")),
        (cv, "cv_eric_english", dict(text=EN[2], speaker="Eric", language="English")),
        (cv, "cv_aiden_instruct", dict(text=EN[2], speaker="Aiden", language="English",
                                       instruct=INSTRUCT[0])),
        (cv, "cv_serena_chinese_stream", dict(text=ZH[1], speaker="Serena", language="Chinese",
                                              non_streaming_mode=False)),
        (cv, "cv_sohee_auto_stream", dict(text=EN[1], speaker="sohee", language="Auto",
                                          non_streaming_mode=False)),
        (cv, "cv_uncle_fu_short_stream", dict(text=SHORT[0], speaker="Uncle_Fu", language="English",
                                              non_streaming_mode=False)),
        (vd, "vd_instruct_english", dict(text=EN[0], instruct=INSTRUCT[1], language="English")),
        (vd, "vd_instruct_auto_zh", dict(text=ZH[0], instruct=INSTRUCT[2], language="Auto")),
        (vd, "vd_no_instruct_auto", dict(text=EN[2], instruct="", language="Auto")),
        (vd, "vd_instruct_chinese_stream", dict(text=ZH[1], instruct=INSTRUCT[1],
                                                language="Chinese", non_streaming_mode=False)),
        (vd, "vd_instruct_english_stream", dict(text=LONG, instruct=INSTRUCT[0],
                                                language="English", non_streaming_mode=False)),
        (vd, "vd_short_stream", dict(text=SHORT[1], instruct=INSTRUCT[0], language="English",
                                     non_streaming_mode=False)),
        (b, "base_icl_short_stream", dict(text=SHORT[1], language="English", ref_text=SHORT[2], **ref)),
        (b, "base_icl_english_stream", dict(text=EN[0], language="English", ref_text=REF_TEXT, **ref)),
        (b, "base_icl_long_stream", dict(text=LONG, language="Auto", ref_text=REF_TEXT, **ref)),
        (b, "base_icl_chinese_nonstream", dict(text=ZH[1], language="Chinese", ref_text=REF_TEXT,
                                               non_streaming_mode=True, **ref)),
        (b, "base_icl_long_nonstream", dict(text=LONG, language="English", ref_text=REF_TEXT,
                                            non_streaming_mode=True, **ref)),
        (b, "base_xvec_auto_stream", dict(text=EN[1], language="Auto", x_vector_only_mode=True, **ref)),
        (b, "base_xvec_english_nonstream", dict(text=EN[2], language="English", x_vector_only_mode=True,
                                                non_streaming_mode=True, **ref)),
        (b, "base_xvec_chinese_stream", dict(text=ZH[0], language="Chinese", x_vector_only_mode=True,
                                             **ref)),
    ]
    method = {cv: "generate_custom_voice", vd: "generate_voice_design", b: "generate_voice_clone"}
    return [dict(ckpt=k, name=n, method=method[k], args=a) for k, n, a in rows]


def ref_waveform() -> np.ndarray:
    """1.5 s at 24 kHz (18.75 frames: the encoder's ceil gives 19): chirp + formant-ish tones + noise."""
    t = np.arange(36000, dtype=np.float64) / 24000.0
    env = np.minimum(1.0, t / 0.05) * np.minimum(1.0, (1.5 - t) / 0.05)
    sig = 0.3 * np.sin(2 * np.pi * (120 * t + 40 * t * t)) + 0.15 * np.sin(2 * np.pi * 700 * t)
    sig += 0.05 * np.random.default_rng(1234).standard_normal(t.shape)
    return (0.8 * env * sig).astype(np.float32)


def build_checkpoints() -> dict:
    """Writes ckpt/<type>/ for the three types; returns each type's config dict."""
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    vocab, merges = tiny.build_bpe(EN + ZH + [LONG, REF_TEXT] + SHORT + INSTRUCT, ROLE + RULE_TEXTS)
    st_cfg = tiny.speech_tokenizer_config()
    st_model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**st_cfg))
    st_sd = tiny.fill_weights(st_model.state_dict(), 7)
    for k in st_sd:
        if k.startswith("decoder.decoder.") and ".conv2." in k:
            st_sd[k] = st_sd[k] * RES_GAIN  # tames growth through the residual units
    last = max(k for k in st_sd if k.startswith("decoder.decoder.") and k.endswith("conv.weight"))
    st_sd[last] = st_sd[last] * OUT_GAIN  # keeps the decoded wave inside the clamp to [-1, 1]
    configs = {}
    for kind in ("base", "custom_voice", "voice_design"):
        d = os.path.join(OUT, "ckpt", kind)
        os.makedirs(os.path.join(d, "speech_tokenizer"), exist_ok=True)
        first = tiny.write_tokenizer(d, vocab, merges)
        cfg = tiny.model_config(kind, first)
        tiny.write_json(os.path.join(d, "config.json"), cfg)
        tiny.write_json(os.path.join(d, "generation_config.json"), tiny.GENERATION_CONFIG)
        tiny.write_json(os.path.join(d, "preprocessor_config.json"),
                        {"processor_class": "Qwen3TTSProcessor"})
        torch.manual_seed(0)
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**cfg))
        sd = tiny.fill_weights(model.state_dict(), tiny.SHAPES[kind][-1])
        eos = cfg["talker_config"]["codec_eos_token_id"]
        sd["talker.codec_head.weight"][eos] *= EOS_GAIN
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        sdir = os.path.join(d, "speech_tokenizer")
        tiny.write_json(os.path.join(sdir, "config.json"), st_cfg)
        tiny.write_json(os.path.join(sdir, "preprocessor_config.json"), tiny.ENCODEC_PREPROCESSOR)
        save_file(st_sd, os.path.join(sdir, "model.safetensors"), metadata={"format": "pt"})
        configs[kind] = cfg
    return configs


class Recorder:
    """Wraps the loaded model to capture what the reference built and returned for one call."""

    def __init__(self, q):
        self.q, self.calls, self.hooks = q, {}, []
        talker = q.model.talker
        orig_gen, orig_model_gen = talker.generate, q.model.generate
        orig_prompt = q.create_voice_clone_prompt

        def talker_generate(**kw):
            kept = {k: v for k, v in kw.items() if not torch.is_tensor(v)}
            sup = kept.pop("suppress_tokens")  # 1023 ids: summarised as a range minus EOS
            kept["suppress_tokens"] = {"from": min(sup), "to_inclusive": max(sup), "count": len(sup)}
            self.calls["talker_kwargs"] = kept
            for k in ("inputs_embeds", "trailing_text_hidden", "tts_pad_embed", "attention_mask"):
                self.calls[k] = kw[k].detach().clone()
            return orig_gen(**kw)

        def model_generate(**kw):
            self.calls["api_inputs"] = {k: kw.get(k) for k in ("input_ids", "instruct_ids", "ref_ids")}
            codes, hid = orig_model_gen(**kw)
            self.calls["codes"] = [c.detach().clone() for c in codes]
            return codes, hid

        def voice_clone_prompt(**kw):
            items = orig_prompt(**kw)
            self.calls["clone_items"] = items
            return items

        talker.generate, q.model.generate = talker_generate, model_generate
        q.create_voice_clone_prompt = voice_clone_prompt
        self.hooks.append(talker.codec_head.register_forward_hook(self._talker_hook))
        for i, head in enumerate(talker.code_predictor.lm_head):
            self.hooks.append(head.register_forward_hook(self._cp_hook(i)))

    def _talker_hook(self, mod, inp, out):
        self.calls.setdefault("talker_logits", []).append(out[:, -1].detach().clone())

    def _cp_hook(self, i):
        def hook(mod, inp, out):
            self.calls.setdefault(f"cp_logits_{i}", []).append(out[:, -1].detach().clone())
        return hook

    def reset(self):
        self.calls = {}


def margins(logits: list, allowed: torch.Tensor) -> float:
    """Smallest top-1 minus top-2 gap over calls (row 0), over the allowed ids only."""
    gaps = []
    for lg in logits:
        top = torch.topk(lg[0][allowed], 2).values
        gaps.append(float(top[0] - top[1]))
    return min(gaps) if gaps else float("nan")


def run_case(q, rec, case, cfg, wav_path) -> tuple[dict, dict]:
    """One API call for one row; returns (arrays, manifest entry)."""
    args = dict(case["args"])
    if "ref_audio" in args:
        args["ref_audio"] = wav_path
    rec.reset()
    wavs, sr = getattr(q, case["method"])(**args, **GEN)
    c = rec.calls
    tc = cfg["talker_config"]
    codes = c["codes"][0].numpy()
    ids = {k: (v[0][0].numpy() if v is not None and v[0] is not None else None)
           for k, v in c["api_inputs"].items()}
    item = c.get("clone_items", [None])[0]
    lang = args.get("language", "Auto").lower()
    lang_id = None if lang == "auto" else tc["codec_language_id"][lang]
    spk = args.get("speaker")
    if spk is not None and lang in ("chinese", "auto") and tc["spk_is_dialect"][spk.lower()]:
        lang_id = tc["codec_language_id"][tc["spk_is_dialect"][spk.lower()]]
    spk_code = tc["spk_id"][spk.lower()] if spk else (-2 if item is not None else None)
    icl = item is not None and not item.x_vector_only_mode
    ref_len = int(item.ref_code.shape[0]) if icl else 0
    lay = prompt_layout(cfg, ids["input_ids"], ids["instruct_ids"], ids["ref_ids"], ref_len, lang_id,
                        spk_code, icl, args.get("non_streaming_mode", case["method"] != "generate_voice_clone"))
    verify_layout(q.model, lay, c, item)
    n_codes = tc["vocab_size"] - 1024
    allowed = torch.tensor(list(range(n_codes)) + [tc["codec_eos_token_id"]])
    arrays = {"codes": codes.astype(np.int64), "text_ids": ids["input_ids"].astype(np.int64),
              "prompt_embeds": c["inputs_embeds"][0].numpy(),
              "trailing_text_embeds": c["trailing_text_hidden"][0].numpy(),
              "tts_pad_embed": c["tts_pad_embed"].reshape(-1).numpy(),
              "talker_logits0": c["talker_logits"][0][0].numpy(),
              "cp_logits0": np.stack([c[f"cp_logits_{i}"][0][0].numpy() for i in range(15)]),
              "wav": wavs[0].astype(np.float32), **{k: v.astype(np.int64) for k, v in lay.items()}}
    for k in ("instruct_ids", "ref_ids"):
        if ids[k] is not None:
            arrays[k] = ids[k].astype(np.int64)
    if item is not None:
        arrays["spk_embedding"] = item.ref_spk_embedding.float().numpy()
        if icl:
            arrays["ref_codes"] = item.ref_code.numpy().astype(np.int64)
    frames = int(codes.shape[0])
    entry = {"name": case["name"], "ckpt": case["ckpt"], "method": case["method"],
             "args": case["args"], "file": case["name"] + ".npz", "frames": frames,
             "stopped_on_eos": frames < MAX_NEW - 1, "prompt_len": int(lay["prompt_text_ids"].shape[0]),
             "trailing_len": int(lay["trailing_text_ids"].shape[0]), "wav_samples": int(wavs[0].shape[0]),
             "min_talker_margin": margins(c["talker_logits"][:frames + 1], allowed),
             "min_cp_margin": min(margins(c[f"cp_logits_{i}"], torch.arange(n_codes)) for i in range(15))}
    if icl:
        total = ref_len + frames
        entry["icl_cut"] = {"ref_frames": ref_len, "total_frames": total,
                            "decoded_samples": total * 1920,
                            "cut": int(ref_len / max(total, 1) * total * 1920)}
    rec.calls["_talker_kwargs"] = c["talker_kwargs"]
    return arrays, entry


def batched_check(q, rec, group: list, wav_path: str, singles: dict) -> None:
    """Same rows in one API call: records whether the reference's batch gives each row's codes."""
    method, keys = group[0]["method"], set()
    for case in group:
        keys |= set(case["args"]) - {"non_streaming_mode"}
    lists = {k: [case["args"].get(k, "" if k == "instruct" else None) for case in group] for k in keys}
    if "ref_audio" in lists:
        lists["ref_audio"] = [wav_path] * len(group)
        lists["x_vector_only_mode"] = [bool(x) for x in lists.get("x_vector_only_mode", [False] * len(group))]
    nsm = group[0]["args"].get("non_streaming_mode")
    extra = {} if nsm is None else {"non_streaming_mode": nsm}
    rec.reset()
    getattr(q, method)(**lists, **extra, **GEN)
    for case, codes in zip(group, rec.calls["codes"]):
        single = singles[case["name"]]
        same = codes.shape == single.shape and bool((codes.numpy() == single).all())
        case["_batched"] = {"equal": same, "rows": len(group),
                            "frames": int(codes.shape[0]), "codes": None if same else codes.numpy()}


def tokenizer_rule(folder: str) -> dict:
    """Ids of RULE_TEXTS as the package loads the tokenizer, small vocab vs. one over 100000 entries."""
    from qwen_tts import Qwen3TTSModel  # noqa: F401  (registers the processor class)
    from qwen_tts.core.models import Qwen3TTSProcessor

    big = os.path.join(OUT, "_big_vocab_tmp")
    shutil.rmtree(big, ignore_errors=True)
    os.makedirs(big)
    vocab = json.load(open(os.path.join(folder, "vocab.json"), encoding="utf-8"))
    n = len(vocab)
    vocab.update({f"<fill{i}>": n + i for i in range(100001 - n)})  # unreachable: no merge builds them
    shutil.copy(os.path.join(folder, "merges.txt"), big)
    shutil.copy(os.path.join(folder, "config.json"), big)
    tiny.write_json(os.path.join(big, "vocab.json"), vocab)
    tiny.write_json(os.path.join(big, "tokenizer_config.json"), tiny.tokenizer_config(len(vocab)))
    out = {"texts": RULE_TEXTS, "qwen2_split": tiny.QWEN2_SPLIT, "fix_mistral_split": tiny.MISTRAL_FIX_SPLIT,
           "note": "large_vocab = vocab.json plus unreachable filler entries up to 100001, so "
                   "ids of ordinary tokens are shared; added-token ids differ"}
    for label, path in (("small_vocab", folder), ("large_vocab", big)):
        tok = Qwen3TTSProcessor.from_pretrained(path, fix_mistral_regex=True).tokenizer
        pre = tok.backend_tokenizer.pre_tokenizer
        out[label] = {"vocab_size": tok.vocab_size,
                      "regex_patched": bool(getattr(tok, "fix_mistral_regex", False)),
                      "ids": [tok(t)["input_ids"] for t in RULE_TEXTS],
                      "pieces": [[p for p, _ in pre.pre_tokenize_str(t)] for t in RULE_TEXTS]}
    shutil.rmtree(big)
    return out


def main() -> None:
    torch.set_num_threads(1)  # fixed reduction order for byte-identical reruns
    torch.use_deterministic_algorithms(True)
    from importlib.metadata import version

    from qwen_tts import Qwen3TTSModel

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    configs = build_checkpoints()
    wav_path = os.path.join(OUT, "ref_audio.wav")
    sf.write(wav_path, ref_waveform(), 24000, subtype="PCM_16")
    all_cases, models, entries, singles, talker_kwargs = cases(), {}, [], {}, {}
    for case in all_cases:
        kind = case["ckpt"]
        if kind not in models:
            q = Qwen3TTSModel.from_pretrained(os.path.join(OUT, "ckpt", kind), device_map="cpu",
                                              dtype=torch.float32)
            models[kind] = (q, Recorder(q))
        q, rec = models[kind]
        arrays, entry = run_case(q, rec, case, configs[kind], wav_path)
        talker_kwargs.setdefault(json.dumps(rec.calls["_talker_kwargs"], sort_keys=True), []).append(case["name"])
        case["_arrays"], case["_entry"] = arrays, entry
        singles[case["name"]] = arrays["codes"]
        print(f"{case['name']}: {entry['frames']} frames, prompt {entry['prompt_len']}", flush=True)
    groups: dict = {}
    for case in all_cases:
        groups.setdefault((case["ckpt"], case["args"].get("non_streaming_mode")), []).append(case)
    for (kind, _), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(group) > 1:
            batched_check(*models[kind], group, wav_path, singles)
    for case in all_cases:
        entry, arrays, bat = case["_entry"], case["_arrays"], case.get("_batched")
        if bat is not None:
            if bat["codes"] is not None:
                arrays["codes_batched"] = bat["codes"].astype(np.int64)
            entry["batched"] = {k: v for k, v in bat.items() if k != "codes"}
        tiny.save_npz(os.path.join(OUT, entry["file"]), arrays)
        entries.append(entry)
    rule = tokenizer_rule(os.path.join(OUT, "ckpt", "base"))
    tiny.write_json(os.path.join(OUT, "tokenizer_rule.json"), rule)
    attn = models["base"][0].model.config._attn_implementation
    manifest = {"generator": "tests/golden/make_qwen3_tts.py",
                "versions": {p: version(p) for p in ("qwen-tts", "transformers", "accelerate", "torch",
                                                     "numpy", "librosa", "safetensors", "tokenizers")},
                "arrays": ARRAYS,
                "dtype": "float32", "device": "cpu", "attn_implementation": attn,
                "api_generation_kwargs": GEN,
                "talker_generate_kwargs": [dict(json.loads(k), cases=v) for k, v in talker_kwargs.items()],
                "eos_gain": EOS_GAIN, "codes_per_codebook": tiny.CODES,
                "sample_rate": 24000, "ref_audio": "ref_audio.wav",
                "checkpoints": {k: {"path": f"ckpt/{k}", "tts_model_size": c["tts_model_size"],
                                    "talker_hidden": c["talker_config"]["hidden_size"],
                                    "talker_layers": c["talker_config"]["num_hidden_layers"],
                                    "predictor_hidden": c["talker_config"]["code_predictor_config"]["hidden_size"]}
                                for k, c in configs.items()},
                "tokenizer_rule": "tokenizer_rule.json", "cases": entries}
    tiny.write_json(os.path.join(OUT, "manifest.json"), manifest)


if __name__ == "__main__":
    main()
