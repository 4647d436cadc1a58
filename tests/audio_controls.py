"""Negative controls for the tests that compare decoded audio (issue 31).

A comparison of two decodes within a bound shows something only if audio decoded from
other codes fails that bound. These helpers make the other codes (one codec frame
changed; callers swap rows themselves) and check a written row against its own codes'
decode and against the changed codes' decode.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

# the tiny checkpoints' stream BOS / EOS tokens (codebook_size 1026: 1024 codes, then these)
STREAM_BOS, STREAM_EOS = 1024, 1025
CODES = 1024


def other_codes(codes):
    """Each code moved half the codebook along: never the code it was (numpy or torch)."""
    return (codes + CODES // 2) % CODES


def change_codec_frame(codes: torch.Tensor, row: int = 0, frame: int | None = None) -> torch.Tensor:
    """codes [B, Q, T] -> a copy whose row `row` has other codes at `frame` (default the middle) in every quantizer."""
    out = codes.clone()
    t = codes.shape[-1] // 2 if frame is None else frame
    out[row, :, t] = other_codes(codes[row, :, t])
    return out


def change_one_frame(tokens: np.ndarray) -> np.ndarray:
    """Generated frames [T, C] (delay pattern: codebook k runs k frames late) -> a copy whose
    codec codes (after the delay is reverted, as HiggsCodec.span / codes_into read them) differ
    at one codec frame, the middle one, in every codebook."""
    c = tokens.shape[1]
    all_bos = np.flatnonzero((tokens == STREAM_BOS).all(axis=1))
    start = int(all_bos[-1]) if all_bos.size else 0
    all_eos = np.flatnonzero((tokens[start:] == STREAM_EOS).all(axis=1))
    end = start + int(all_eos[0]) if all_eos.size else len(tokens)
    first, n = start + 1, end - start - 1 - c + 1
    assert n > 0, "no codec frames to change"
    out = tokens.copy()
    j = n // 2
    for k in range(c):
        out[first + j + k, k] = other_codes(min(int(tokens[first + j + k, k]), CODES - 1))
    return out


def max_lsb(a: np.ndarray, b: np.ndarray) -> int:
    """Largest difference of two int16 signals in quantisation steps (over their common length)."""
    n = min(len(a), len(b))
    return int(np.abs(a[:n].astype(np.int32) - b[:n].astype(np.int32)).max())


@functools.lru_cache(maxsize=4)
def codec_stage(ckpt: Path, dtype: torch.dtype = torch.float32, device: torch.device = torch.device("cpu")):
    """The codec stage a family loaded from tiny checkpoint `ckpt` decodes with (HiggsAudioV2.load's)."""
    from omni_cli.runners.codec_stage import CodecStage
    from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder
    from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
    from omni_cli.runners.higgs_audio_v2.family import HiggsCodec

    cfg = HiggsConfig.from_file(Path(ckpt) / "model" / "config.json")
    return CodecStage(HiggsCodec(cfg, HiggsCodecDecoder.load(Path(ckpt) / "codec", dtype, device)), device)


def longest_row(manifest: list[dict]) -> dict:
    """The manifest row with the most frames (the most codec frames to change)."""
    return max(manifest, key=lambda m: m["frames"])


def decode_as_the_run(stage, out: Path, tokens: list[np.ndarray]) -> list[np.ndarray]:
    """stage.decode of each row alone, on the torch threads the run in `out` decoded with (a
    --deterministic CPU run takes one: runners/device.py, deterministic_cpu_threads)."""
    import json

    from omni_cli.runners.device import deterministic_cpu_threads

    deterministic = json.loads((Path(out) / "run.json").read_text())["config"]["deterministic"]
    with deterministic_cpu_threads(stage.device, deterministic):
        return stage.decode(tokens, batched=False)


def assert_written_audio_follows_its_codes(stage, out: Path, m: dict, tol: int = 0) -> None:
    """Row m's written audio (a PCM_16 file) is its own codes' decode, each row alone through
    `stage`, within `tol` steps; the control: its codes with one codec frame changed decode to
    audio more than `tol` steps off the file. So a byte comparison of this file across runs
    (tol 0) fails for a run whose codes differ."""
    import soundfile as sf

    tokens = np.load(out / m["logprobs_file"])["tokens"]
    written, _ = sf.read(out / m["file_name"], dtype="int16")
    same, changed = decode_as_the_run(stage, out, [tokens, change_one_frame(tokens)])
    assert same.shape == written.shape and max_lsb(same, written) <= tol, (m["id"], max_lsb(same, written))
    assert max_lsb(changed, written) > max(tol, 100), (m["id"], max_lsb(changed, written))  # control
