"""qwen-tts's own `generate` at a Qwen3-TTS-12Hz shape with random weights: omni bench's peer.

qwen-tts 0.1.1 pins transformers 4.57.3, which omni's environment cannot hold, so this runs in an
environment of its own: a venv with qwen-tts, or a Python with torch whose PYTHONPATH starts with
the wheels of .whl-qwen/ installed into a folder (omni bench --qwen-tts-site does that). The
wheels (git-excluded, about 17 MB) come from PyPI: qwen-tts and its pins; the huggingface_hub
(< 1.0) and tokenizers (<= 0.23) that transformers 4.57.3 accepts; requests and its own (hub 0.36
uses them, a transformers 5 environment may not have them); psutil (accelerate's); einops:
  pip download --no-deps --python-version 3.12 --only-binary=:all: -d .whl-qwen qwen-tts==0.1.1 \
      transformers==4.57.3 accelerate==1.12.0 huggingface_hub==0.36.2 tokenizers==0.22.2 psutil einops \
      requests urllib3 idna certifi charset-normalizer
  pip install --no-deps --no-index --no-compile --target /tmp/qwen-site .whl-qwen/*.whl
  PYTHONPATH=/tmp/qwen-site python benchmarks/qwen_tts_peer.py --shape qwen3-tts-12hz-0.6b \
      --batch 1 --batch 8 --frames 100 --out peer.json
  /work/venvs/qwen-ref/bin/python benchmarks/qwen_tts_peer.py --shape tiny-qwen3-tts --device cpu \
      --dtype float32 --batch 1 --batch 2 --frames 6

It builds Qwen3TTSForConditionalGeneration from the shape's config.json (runners/qwen3_tts/shapes.py,
or --config-json) with random weights in --dtype on --device, and times its generate on B
CustomVoice rows (speaker ryan, English, non-streaming: the package's default for CustomVoice)
of --prompt-len talker positions each, sampling as generation_config.json sets it. Every row makes
exactly --frames frames: the talker's generate gets min_new_tokens = max_new_tokens, so codec EOS
is never drawn (the package fixes min_new_tokens at 2 and passes no override through). ms a frame
is the whole generate (prefill included) over --frames; audio-s/s is B x frames x 0.08 s over it.

Stand-ins: qwen-tts imports librosa, onnxruntime, sox, torchaudio.compliance.kaldi and einops at
module level; on this path only its 25 Hz tokenizer and reference-audio loading use them, never
called here. Any of them that does not import is replaced by an empty module whose attributes
raise when called (the JSON lists which); a real install wins.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import json
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# module -> the attributes qwen-tts imports from it at module level (all unused on this path)
STANDINS = {"torchaudio": (), "torchaudio.compliance": (), "torchaudio.compliance.kaldi": (), "librosa": (),
            "librosa.filters": ("mel",), "onnxruntime": (), "sox": (), "einops": ("rearrange", "repeat")}
FRAME_S = 1920 / 24000  # audio seconds a 12.5 Hz frame
PROMPT_EXTRA = 11  # talker positions a CustomVoice non-streaming prompt adds around its text tokens


def _unused(name: str):
    def call(*a, **k):
        raise RuntimeError(f"{name} is a stand-in (benchmarks/qwen_tts_peer.py): this path must not call it")
    return call


def install_standins() -> list[str]:
    """Empty modules for the imports above that fail; returns the names replaced."""
    replaced = []
    for name, attrs in STANDINS.items():
        try:
            importlib.import_module(name)
            continue
        except Exception:
            for n in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[n]
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__version__ = "0.0.0+standin"
        for a in attrs:
            setattr(mod, a, _unused(f"{name}.{a}"))
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], leaf, mod)
        replaced.append(name)
    return replaced


def shape_dict(shape: str, config_json: Path | None) -> dict:
    if config_json is not None:
        return json.loads(Path(config_json).read_text())
    sys.path.insert(0, str(REPO))
    from runners.qwen3_tts.shapes import config_dict  # the repo's shapes: plain Python, no omni_cli

    return config_dict(shape, "custom_voice")


def build(cfg: dict, device, dtype):
    """The package's model of that config, random weights (its own init) in dtype on device."""
    import torch
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**cfg))
    finally:
        torch.set_default_dtype(before)
    talker = model.talker
    plain = talker.generate

    def generate(**kw):  # every row runs to max_new_tokens: no codec EOS before it
        kw["min_new_tokens"] = kw["max_new_tokens"]
        return plain(**kw)

    talker.generate = generate
    return model.eval()


def row_ids(cfg: dict, batch: int, prompt_len: int, seed: int):
    """input_ids as the package tokenizes a row: role header, text, closing header [1, 3 + T + 5]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    top = min(cfg["talker_config"]["text_vocab_size"], cfg["im_start_token_id"])
    text = max(prompt_len - PROMPT_EXTRA, 1)
    start, end = cfg["im_start_token_id"], cfg["im_end_token_id"]
    rows = []
    for _ in range(batch):
        body = torch.randint(0, top, (text,), generator=g).tolist()
        rows.append(torch.tensor([[start, 77 % top, 198 % top] + body + [end, 198 % top, start, 77 % top, 198 % top]]))
    return rows


def timed_generate(model, ids: list, frames: int, gen: dict, device) -> tuple[float, list[int]]:
    """Wall seconds of one generate of these rows, and the frames each row made."""
    import torch

    ids = [t.to(device) for t in ids]
    n = len(ids)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        codes, _ = model.generate(input_ids=ids, languages=["english"] * n, speakers=["ryan"] * n,
                                  non_streaming_mode=True, max_new_tokens=frames + 1, **gen)
    sync()
    return time.perf_counter() - t0, [int(c.shape[0]) for c in codes]


def versions(standins: list[str]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("qwen-tts", "transformers", "accelerate", "huggingface_hub", "tokenizers", "torch"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return {"versions": out, "standins": standins, "python": sys.version.split()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-tts-12hz-0.6b")
    ap.add_argument("--config-json", type=Path, help="config.json to build (default: the shape's)")
    ap.add_argument("--generation-json", type=Path, default=REPO / "configs/tiny-qwen3-tts/generation_config.json")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--prompt-len", type=int, default=64, help="talker prefill positions a row")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    standins = install_standins()
    import torch

    import qwen_tts  # noqa: F401  (fails here, named, when the environment lacks it)

    info = {"shape": a.shape, "frames": a.frames, "prompt_len": a.prompt_len, **versions(standins), "rows": []}
    cfg = shape_dict(a.shape, a.config_json)
    gen = {k: v for k, v in json.loads(a.generation_json.read_text()).items() if k != "max_new_tokens"}
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    model = build(cfg, device, dtype)
    info.update(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", dtype=a.dtype,
                generation=gen, attn_implementation=model.talker.config._attn_implementation)
    print(f"qwen-tts {info['versions']['qwen-tts']}, transformers {info['versions']['transformers']}, "
          f"stand-ins: {', '.join(standins) or 'none'}", flush=True)
    for b in a.batch or [1, 8]:
        row = {"peer": "qwen-tts", "batch": b}
        try:
            timed_generate(model, row_ids(cfg, b, a.prompt_len, 1), 2, gen, device)  # warm-up at this batch
            wall, made = timed_generate(model, row_ids(cfg, b, a.prompt_len, 2), a.frames, gen, device)
            if set(made) != {a.frames}:
                raise RuntimeError(f"rows made {min(made)}..{max(made)} frames, not {a.frames}")
            row.update(ms_per_step=1e3 * wall / a.frames, audio_s_per_s=b * a.frames * FRAME_S / wall, wall_s=wall)
            print(f"qwen-tts batch {b}: {row['ms_per_step']:.2f} ms a frame, {row['audio_s_per_s']:.2f} audio-s/s",
                  flush=True)
        except Exception as e:  # out of memory at a large batch: the smaller ones stand
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            print(f"qwen-tts batch {b}: {row['error']}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        info["rows"].append(row)
        if a.out:  # after every batch: a later one killed leaves the earlier ones
            a.out.write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
