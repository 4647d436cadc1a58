"""Loading the 3B LM's weights: the host state dict path against streaming into the device tensors.

Writes the random 3B checkpoint e2e_generate.py writes (10.8 GB of bf16
safetensors), builds the LM on the GPU as `runners.higgs_audio_v2.build`
does, and fills it, alternately, by
  state dict: read_safetensors (every tensor to host memory) + load_into
              (load_state_dict, a pageable host-to-device copy per tensor);
  stream:     stream_into (runners/checkpoint.py: pinned staging buffers that
              reader threads fill while the previous ones are copied).
Each is timed from the empty model to the weights on the device
(synchronized), --rounds times; the file was just written, so both read it
from the page cache (the first round's first load may not: it is listed
apart). The two models' tensors are checked equal, byte for byte.
Prints a table and writes JSON.

  python benchmarks/load_probe.py --rounds 2 --out load_probe.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.e2e_generate import write_checkpoint  # noqa: E402
from omni_cli.runners.checkpoint import load_into, read_safetensors, stream_into  # noqa: E402
from omni_cli.runners.higgs_audio_v2 import IGNORED_KEYS, _default_dtype  # noqa: E402
from omni_cli.runners.higgs_audio_v2.config import HiggsConfig  # noqa: E402
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM  # noqa: E402
from benchmarks.timing import write_results  # noqa: E402


def empty_model(folder: Path) -> HiggsAudioV2LM:
    with torch.device("cuda"), _default_dtype(torch.bfloat16):
        model = HiggsAudioV2LM(HiggsConfig.from_file(folder / "config.json"), 512)
    torch.cuda.synchronize()
    return model


def timed(way: str, folder: Path) -> tuple[float, HiggsAudioV2LM]:
    model = empty_model(folder)
    t0 = time.perf_counter()
    if way == "state dict":
        load_into(model, read_safetensors(folder), folder, ignore=IGNORED_KEYS)
    else:
        stream_into(model, folder, ignore=IGNORED_KEYS)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("load_probe.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_checkpoint(root)
        folder = root / "model"
        gb = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e9
        rows = []
        for r in range(args.rounds):
            models = {}
            for way in ("state dict", "stream"):
                s, models[way] = timed(way, folder)
                rows.append({"round": r, "way": way, "s": s, "gb_per_s": gb / s})
                print(f"round {r} {way:>10}: {s:6.2f} s  {gb / s:5.2f} GB/s", flush=True)
            a, b = (m.state_dict() for m in models.values())
            same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            rows[-1]["equal_to_state_dict_path"] = same
            print(f"round {r}: streamed tensors equal the state dict path's: {same}")
            del models, a, b
            torch.cuda.empty_cache()
    print(f"{'way':>10} {'best s':>7} {'GB/s':>6}")
    for way in ("state dict", "stream"):
        best = min(x["s"] for x in rows if x["way"] == way)
        print(f"{way:>10} {best:>7.2f} {gb / best:>6.2f}")
    write_results(args.out, checkpoint_gb=gb, runs=rows)


if __name__ == "__main__":
    main()
