"""`omni bench`: omni's sync, async and deterministic loops against the family's reference, in one run.

A random-weight model of a named shape (no checkpoint). Higgs Audio v2 (higgs.py): transformers
initialises its model once and our engine loads those weights, so both run the same weights.
Qwen3-TTS-12Hz (qwen.py): our talker is built on the device; qwen-tts's own generate runs at the
same shape in a process of its own (peer.py). For each batch size every row decodes exactly
`frames` frames from a `prompt_len`-token prompt with sampling on; the peer "deterministic" is the
async loop under --deterministic. Reported: ms a decode step (a Qwen3-TTS frame: the talker step,
15 predictor sub-steps, 16 draws) and audio-s/s over the whole run (prefill included; graph
captures and kernel compiles are paid before it, in omni generate's warm-up), each against the
floor set by the bytes a step must read (weights, plus KV) or the FLOPs it must do: at the copy rate
common.CARD_BYTES_PER_S gives the card, or on another card its copy rate as measured in the run.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

from . import higgs, qwen
from .common import (H200_FLOPS, PEERS, BenchRow, card_bytes_per_s, device_label, measured_copy_bytes_per_s,
                     plot as _plot, table)
from .higgs import AUDIO_S_PER_FRAME, random_model, run_requests
from .peer import PeerEnv, run_qwen_tts

__all__ = ["AUDIO_S_PER_FRAME", "H200_FLOPS", "PEERS", "BenchRow", "PeerEnv", "check_bench", "default_peers",
           "random_model", "run_bench", "run_requests"]
FAMILIES = {**{s: higgs for s in higgs.SHAPES}, **{s: qwen for s in qwen.SHAPES}}
TINY = {higgs: "tiny-higgs-audio-v2", qwen: "tiny-qwen3-tts"}


def default_peers(shape: str, qwen_tts: PeerEnv | None = None) -> tuple[str, ...]:
    """The family's default rows: Higgs sync, async, transformers; Qwen3-TTS sync, async, and
    qwen-tts where an environment for it is given."""
    fam = FAMILIES.get(shape, higgs)
    extra = ("qwen-tts",) if fam is qwen and qwen_tts is not None and qwen_tts.given else ()
    return fam.DEFAULT_PEERS + extra


def check_bench(shape: str, batches: list[int], frames: int, prompt_len: int, device: str, dtype: torch.dtype,
                peers) -> str:
    """The flags before anything is built (OmniError, exit 2); returns the device to run on. A real
    shape needs a GPU: on a machine without CUDA it is refused at once (its random models would
    take much of the host's memory), and on --device cpu when the host's available memory cannot
    hold them."""
    from omni_cli.config import MAX_BATCH_SIZE
    from omni_cli.errors import OmniError
    from omni_cli.runners.device import host_available, pick_device
    from omni_cli.runners.sampling.params import INT_MAX

    fam = FAMILIES.get(shape)
    if fam is None:
        raise OmniError(f"--shape: unknown shape {shape!r} (known: {', '.join(FAMILIES)})")
    if not batches or not all(1 <= b <= MAX_BATCH_SIZE for b in batches):
        raise OmniError(f"--batch: each must be from 1 to {MAX_BATCH_SIZE}, got {batches}")
    if not fam.MIN_FRAMES <= frames <= INT_MAX or not 2 <= prompt_len <= INT_MAX:
        why = "the delay pattern's first frame of audio" if fam is higgs else "a decode step after the prefill's frame"
        raise OmniError(f"--frames must be >= {fam.MIN_FRAMES} ({why}) and --prompt-len >= 2, "
                        f"got {frames} and {prompt_len}")
    wrong = [p for p in peers if p not in fam.PEERS]
    if wrong:
        raise OmniError(f"--peers {','.join(wrong)}: not a peer of {shape} (its peers: {', '.join(fam.PEERS)}; "
                        "transformers has no Qwen3-TTS model, qwen-tts runs only Qwen3-TTS)")
    where = pick_device(device)
    if shape == TINY[fam]:
        return device
    cpu = f"omni bench --shape {TINY[fam]} --device cpu"
    if where.type != "cuda" and device != "cpu":
        raise OmniError(f"omni bench --shape {shape} needs a GPU and this machine has no CUDA device; "
                        f"on the CPU run `{cpu}`")
    need = fam.host_bytes(shape, batches, frames, prompt_len, dtype)
    available = host_available()
    if where.type == "cpu" and available is not None and need > available:
        raise OmniError(f"omni bench --shape {shape} on the CPU needs about {need / 2**30:.0f} GiB (model weights "
                        f"and the KV cache) and {available / 2**30:.0f} GiB is available; run `{cpu}`, or on a GPU")
    return device


def run_bench(shape: str, batches: list[int], frames: int, prompt_len: int, device: torch.device,
              dtype: torch.dtype, out_json: Path | None, plot: Path | None, peers=None,
              qwen_tts: PeerEnv | None = None) -> list[BenchRow]:
    """Prints the table (rows, then a line per failed run), writes the JSON and plot; a failed omni
    run ends it with OmniError exit 1 after that (qwen-tts's failures are its lines only)."""
    from omni_cli.errors import OmniError

    fam = FAMILIES[shape]
    peers = tuple(peers or default_peers(shape, qwen_tts))
    notes: list[str] = []
    rows = fam.run(shape, batches, frames, prompt_len, device, dtype, peers, notes)
    failed = len(notes)
    peer_info = {}
    if "qwen-tts" in peers:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        cfg, elem = qwen.shape_config(shape), torch.finfo(dtype).bits // 8
        floors = {b: qwen.floor_of(cfg, b, prompt_len + frames // 2, elem, device) for b in batches}
        got, peer_info = run_qwen_tts(qwen_tts or PeerEnv.of(None, None), shape, batches, frames, prompt_len,
                                      device, dtype, floors, notes)
        rows += got
    rows.sort(key=lambda r: (batches.index(r.batch), peers.index(r.peer)))
    print(table(rows, notes, "frame" if fam is qwen else "step"))
    info = {"shape": shape, "device": device_label(device), "dtype": str(dtype), "frames": frames,
            "prompt_len": prompt_len, "torch": torch.__version__, "floor_bytes_per_s": card_bytes_per_s(device),
            "measured_copy_bytes_per_s": measured_copy_bytes_per_s(device), "rows": [r.as_dict() for r in rows],
            "failed": notes}
    if peer_info:
        info["qwen_tts"] = peer_info
    if out_json:
        out_json.write_text(json.dumps(info, indent=2))
    if plot:
        _plot(rows, plot, shape, info["device"])
    if failed:
        err = OmniError(f"{failed} omni run(s) failed: {'; '.join(notes[:failed])}")
        err.exit_code = 1
        raise err
    return rows
