"""Test helpers for the native Qwen3-TTS pieces: the golden files, and a slow batch-1 greedy
``generate`` chaining the pieces as qwen-tts 0.1.1's Qwen3TTSForConditionalGeneration.generate
does (prefill; then per frame: talker logits, code 0 by argmax after the repetition penalty,
min_new_tokens and suppress_tokens; the predictor's greedy sub-steps; the next step's input).

The golden files come from tests/golden/make_qwen3_tts.py, run with the reference package.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_cli.runners.attention import AttentionContext, KVCache
from omni_cli.runners.qwen3_tts.config import GenerationDefaults, Qwen3TTSConfig
from omni_cli.runners.qwen3_tts.loading import load_talker, load_tokenizer, read_configs
from omni_cli.runners.qwen3_tts.prompt import PromptBuilder, TalkerPrompt, prefill_arrays
from omni_cli.runners.qwen3_tts.talker import Talker

# QWEN3_GOLDEN: another copy of the golden folder (a fresh run of the generator, say)
GOLDEN = Path(os.environ.get("QWEN3_GOLDEN", Path(__file__).parent / "golden" / "qwen3_tts"))


def rel(a, b) -> float:
    """max |a - b| / max |b|: a relative bound on a whole tensor."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for a test module, as the goldens were made: tiny ops run faster without
    a thread pool, and a reduction's order (so its rounding) does not follow the core count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def have_goldens() -> bool:
    return (GOLDEN / "manifest.json").is_file()


@lru_cache(maxsize=None)
def manifest() -> dict:
    return json.loads((GOLDEN / "manifest.json").read_text())


def cases() -> list[dict]:
    return manifest()["cases"] if have_goldens() else []


def case_names() -> list[str]:
    return [c["name"] for c in cases()]


def case(name: str) -> dict:
    return next(c for c in cases() if c["name"] == name)


@lru_cache(maxsize=None)
def arrays(name: str) -> dict:
    with np.load(GOLDEN / case(name)["file"]) as z:
        return {k: z[k] for k in z.files}


def ckpt(kind: str) -> Path:
    return GOLDEN / "ckpt" / kind


@lru_cache(maxsize=None)
def model_yaml(tmp_path: Path, kind: str, dtype: str = "float32", device: str = "cpu") -> Path:
    """A model YAML naming golden checkpoint `kind`."""
    path = tmp_path / f"{kind}-{dtype}-{device}.yaml"
    path.write_text(f"family: qwen3_tts\ncheckpoint: {ckpt(kind)}\ndtype: {dtype}\ndevice: {device}\nmax_seq_len: 256\n")
    return path


def golden_row(case: dict) -> dict:
    """A golden call's arguments as a prompt row (the reference's field names); an empty instruct is none."""
    row = {"id": case["name"], **{k: v for k, v in case["args"].items() if v != ""}}
    if "ref_audio" in row:
        row["ref_audio"] = str(GOLDEN / row["ref_audio"])
    return row


def configs(kind: str):
    return read_configs(ckpt(kind))


@lru_cache(maxsize=None)
def talker(kind: str, max_seq_len: int = 256) -> Talker:
    cfg = configs(kind)[0]
    return load_talker(ckpt(kind), cfg, max_seq_len, torch.float32, torch.device("cpu"))


@lru_cache(maxsize=None)
def builder(kind: str) -> PromptBuilder:
    return PromptBuilder(configs(kind)[0], load_tokenizer(ckpt(kind)))


def prompt_of(name: str) -> TalkerPrompt:
    """The case's row fields through PromptBuilder, the Base x-vector and reference codes taken
    from the golden file (their own parity is tested apart)."""
    c, z = case(name), arrays(name)
    a = c["args"]
    kw = dict(text=a["text"], language=a.get("language", "Auto"), speaker=a.get("speaker"),
              instruct=a.get("instruct"), non_streaming_mode=a.get("non_streaming_mode"),
              x_vector_only_mode=a.get("x_vector_only_mode", False), ref_text=a.get("ref_text"))
    if c["ckpt"] == "base":
        kw["x_vector"] = z["spk_embedding"]
        if "ref_codes" in z:
            kw["ref_codes"] = z["ref_codes"]
    return builder(c["ckpt"]).build(**kw)


class Session:
    """One row's talker on a one-slot KV cache: prefill, then one decode step at a time."""

    def __init__(self, model: Talker, max_seq_len: int):
        t = model.cfg.talker
        self.model = model
        self.kv = KVCache(t.num_hidden_layers, 2, t.num_key_value_heads, max_seq_len, t.head_dim,
                          torch.float32, torch.device("cpu"))
        self.length = 0

    def _ctx(self, prefill: bool, t: int) -> AttentionContext:
        k = self.length + t
        pos = torch.arange(self.length, k)[None]
        mask = (torch.arange(k)[None, :] <= pos[0][:, None])[None, None]  # [1, 1, t, k], causal
        return AttentionContext(kv=self.kv, is_prefill=prefill, slots_gpu=torch.tensor([0]), positions_gpu=pos,
                                mask_gpu=mask, kv_len=k)

    @torch.inference_mode()
    def prefill(self, p: TalkerPrompt, streams: int) -> tuple[torch.Tensor, torch.Tensor]:
        arrays = prefill_arrays([p], len(p), streams, self.model.hidden_size)
        inputs = {k: torch.from_numpy(v) for k, v in arrays.items()}
        hidden = self.model(self._ctx(True, len(p)), **inputs)
        self.length = len(p)
        return self.model.split_output(self.model.compute_logits(hidden[:, -1]))

    @torch.inference_mode()
    def step(self, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(self._ctx(False, 1), inputs_embeds=embeds)
        self.length += 1
        return self.model.split_output(self.model.compute_logits(hidden[:, -1]))


def process_talker_logits(logits: torch.Tensor, history: list[int], step: int, cfg: Qwen3TTSConfig,
                          gen: GenerationDefaults) -> torch.Tensor:
    """transformers' greedy processing as the reference configures it: repetition penalty over the
    earlier codes 0, codec EOS banned for the first min_new_tokens, the suppressed ids."""
    out = logits.clone()
    if history and gen.repetition_penalty != 1.0:
        idx = torch.tensor(sorted(set(history)))[None]
        score = torch.gather(out, 1, idx)
        score = torch.where(score < 0, score * gen.repetition_penalty, score / gen.repetition_penalty)
        out.scatter_(1, idx, score)
    if step < gen.min_new_tokens:
        out[:, cfg.talker.codec_eos_token_id] = float("-inf")
    out[:, list(cfg.suppressed_ids())] = float("-inf")
    return out


@dataclass
class Generated:
    codes: np.ndarray  # [frames, 16]
    talker_logits0: np.ndarray  # [vocab]: the prefill's raw logits
    cp_logits0: np.ndarray  # [15, code vocab]: frame 0's predictor logits, raw


@torch.inference_mode()
def greedy_generate(model: Talker, p: TalkerPrompt, gen: GenerationDefaults, max_new_tokens: int) -> Generated:
    cfg = model.cfg
    sess = Session(model, len(p) + max_new_tokens + 1)
    logits, hidden = sess.prefill(p, cfg.num_streams)
    first = logits[0].clone()
    cp_first: list[torch.Tensor] = []
    history: list[int] = []
    frames = []
    for step in range(max_new_tokens):
        code0 = int(process_talker_logits(logits, history, step, cfg, gen).argmax(dim=-1))
        history.append(code0)
        if code0 == cfg.talker.codec_eos_token_id or step == max_new_tokens - 1:
            break  # the reference stops here: the last token gets no frame

        def draw(k, lg):
            if step == 0:
                cp_first.append(lg[0].clone())
            return lg.argmax(dim=-1)

        bufs = model.new_predictor_buffers(1)
        codes = model.predict_frame(hidden, torch.tensor([code0]), bufs, draw).clone()
        frames.append(codes[0].numpy())
        embeds = model.decode_embeds(codes, torch.tensor([p.trailing_at(step)]))
        logits, hidden = sess.step(embeds)
    cp = torch.stack(cp_first).numpy() if cp_first else np.zeros((0, cfg.code_vocab), np.float32)
    codes = np.stack(frames) if frames else np.zeros((0, cfg.num_streams), np.int64)
    return Generated(codes.astype(np.int64), first.numpy(), cp)
