"""Finding checkpoints (local folder or hub id) and loading safetensors weights.

Two ways in: ``read_safetensors`` + ``load_into`` build a host state dict
first (the codec, whose weight-norm pairs are folded on the way), and
``stream_into`` copies a file's bytes straight into a module's tensors where
they already live (the LM: 10.8 GB at the 3B shape), through pinned staging
buffers that threads fill while the previous ones are copied to the device.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import OmniError
from .device import host_buffer, new_event, role_stream


# what a checkpoint folder needs besides its weights (configs, tokenizer, chat template)
META_PATTERNS = ["*.json", "*.jinja", "*.model", "*.txt"]
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PTH = "model.pth"  # the original codec layout's weights (runners/higgs_audio_v2/codec_layout.py)


def parse_hub_id(spec: str) -> tuple[str, str | None]:
    """``owner/name@rev`` -> (``owner/name``, ``rev``); no ``@``: (spec, None)."""
    repo, at, rev = spec.partition("@")
    if at and not (repo and rev):
        raise OmniError(f"{spec!r}: a hub id with a revision is owner/name@revision")
    return repo, (rev if at else None)


def resolve_folder(spec: str, what: str, pth: bool = False) -> Path:
    """A local folder as it is; a hub id (``owner/name[@revision]``) through huggingface_hub's
    cache: its metadata, then the weight files transformers would pick (weight_files): the
    single file if the repo has one, else the index's shards; ``pth``: else model.pth (codecs)."""
    local = Path(spec)
    if local.is_dir():
        return local
    repo, revision = parse_hub_id(spec)
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import EntryNotFoundError

        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=META_PATTERNS))
        names = [SINGLE]
        if (folder / INDEX).is_file():
            names += _index_shards(folder)
        if pth:
            names.append(PTH)
        # model.safetensors if the repo has it (stale shards beside it are not fetched), else the
        # index's shards, else (codecs) model.pth; a shard that is not there fails in weight_files
        for name in names:
            try:
                hf_hub_download(repo, name, revision=revision)
            except EntryNotFoundError:
                continue
            if name == SINGLE or name == PTH:
                break
        return folder
    except OmniError:
        raise
    except Exception as e:  # offline, unknown repo, auth: all are the user's to fix
        raise OmniError(f"{what} {spec!r}: not a local folder, and the hub download failed: {e}") from None


def resolve_meta(spec: str, what: str) -> Path:
    """A local folder as it is; a hub id's metadata only (configs, tokenizer, chat template: no weights)."""
    local = Path(spec)
    if local.is_dir():
        return local
    repo, revision = parse_hub_id(spec)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, revision=revision, allow_patterns=META_PATTERNS))
    except Exception as e:  # offline, unknown repo, auth: all are the user's to fix
        raise OmniError(f"{what} {spec!r}: not a local folder, and the hub download failed: {e}") from None


def resolve_file(spec: str, name: str, what: str) -> Path:
    """One file of a local folder or a hub repository (only that file is downloaded)."""
    local = Path(spec)
    if local.is_dir():
        path = local / name
        if not path.is_file():
            raise OmniError(f"{what} {spec!r}: no {name} in that folder")
        return path
    repo, revision = parse_hub_id(spec)
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo, name, revision=revision))
    except Exception as e:  # offline, unknown repo, auth: all are the user's to fix
        raise OmniError(f"{what} {spec!r}: not a local folder, and the hub download failed: {name}: {e}") from None


def _index_shards(folder: Path) -> list[str]:
    """The shard names an index's weight_map names, in order of first mention."""
    path = folder / INDEX
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
        return list(dict.fromkeys(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise OmniError(f"{path}: not a readable safetensors index ({e!r}); key 'weight_map'") from None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files transformers loads from ``folder``: model.safetensors if present,
    else the shards model.safetensors.index.json names; never every *.safetensors (stale
    shards beside a new single file, say)."""
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    if (folder / INDEX).is_file():
        files = [folder / name for name in _index_shards(folder)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise OmniError(f"{folder / INDEX} names shards that are not in the folder: {missing[:5]}")
        return files
    raise OmniError(f"no weights in {folder}: neither {SINGLE} nor {INDEX} "
                    f"(found: {sorted(p.name for p in folder.iterdir())[:10]})")


def read_safetensors(folder: Path, prefixes: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """All tensors of the folder's weight files (weight_files: sharded or not).

    ``prefixes`` keeps only keys starting with one of them.
    """
    out: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if prefixes is None or key.startswith(prefixes):
                    out[key] = st.get_tensor(key)
    return out


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Turn weight-norm pairs into plain weights: w = g * v / ||v|| (norm over all dims but 0).

    Checkpoints converted from DAC may store either ``weight_g``/``weight_v`` or
    the parametrization's ``parametrizations.weight.original0/1``.
    """
    out = dict(state)
    pairs = (("weight_g", "weight_v"), ("parametrizations.weight.original0", "parametrizations.weight.original1"))
    for key in list(state):
        for g_name, v_name in pairs:
            if key.endswith(g_name):
                base = key[: -len(g_name)]
                g, v = out.pop(base + g_name), out.pop(base + v_name)
                norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
                out[base + "weight"] = g * v / norm
    return out


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
              ignore: tuple[str, ...] = ()) -> None:
    """Load ``state`` into ``module``; any missing or unexpected key is an error naming it."""
    state = {k: v for k, v in state.items() if k not in ignore}
    _check_keys(module.state_dict().keys(), state.keys(), source)
    module.load_state_dict(state, strict=True)


def _check_keys(expected, found, source: Path) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise OmniError(
            f"weights in {source} do not match the model: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )


# safetensors' dtype names (https://github.com/huggingface/safetensors, format)
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
# Staging: each buffer is filled by one reader thread while the others' bytes are copied to
# the device. 64 MiB reads keep the disk (or the page cache) streaming; four in flight overlap
# reading with copying without pinning much host memory (pinning costs time too).
STAGE_BYTES = 64 << 20
STAGES = 4
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


@dataclass(frozen=True)
class _Entry:
    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int
    stored: str = ""  # the file's own name for it, where renamed


def _entries(path: Path) -> list[_Entry]:
    """The tensors a safetensors file holds, by offset: an 8-byte little-endian header size,
    the JSON header, then every tensor's bytes. Checked as the safetensors library checks
    them: each tensor's bytes are its shape's, inside the file, overlapping no other's."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size > min(MAX_HEADER_BYTES, file_size - 8):  # a Git LFS pointer reads as ~2e18
                raise OmniError(f"{path}: not a safetensors file (its header would be {size} bytes, the file is "
                                f"{file_size}; a Git LFS pointer not pulled?)")
            header = json.loads(f.read(size))
        base = 8 + size
        out = []
        for key, info in header.items():
            if key == "__metadata__":
                continue
            if info["dtype"] not in _DTYPES:
                raise OmniError(f"{path}: tensor {key!r} has dtype {info['dtype']}, which omni cannot load")
            dtype, shape = _DTYPES[info["dtype"]], tuple(int(n) for n in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
            if not 0 <= begin <= end or end - begin != math.prod(shape) * dtype.itemsize \
                    or base + end > file_size:
                raise OmniError(f"{path}: tensor {key!r} has bytes [{begin}, {end}) for shape {list(shape)} of "
                                f"{info['dtype']} in a data section of {file_size - base} bytes")
            out.append(_Entry(key, dtype, shape, base + begin, base + end))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OmniError(f"{path}: not a readable safetensors file ({e})") from None
    out.sort(key=lambda e: (e.begin, e.end))
    for a, b in zip(out, out[1:]):
        if b.begin < a.end:
            raise OmniError(f"{path}: the bytes of tensors {a.key!r} and {b.key!r} overlap")
    return out


def stream_into(module: torch.nn.Module, folder: Path, ignore: tuple[str, ...] = (),
                rename: Callable[[str], str | None] | None = None) -> None:
    """Fill every tensor of ``module``'s state dict, in place and on its device, from the
    folder's weight files (weight_files); a missing or unexpected key, a shape that differs, is
    an error naming it. A stored dtype other than the tensor's is converted on the device.
    ``rename`` maps a stored key to the module's (None: not loaded), for a checkpoint in
    another layout; ``ignore`` holds module-side names."""
    files = weight_files(folder)
    targets = module.state_dict()
    per_file = []
    for f in files:
        es = []
        for e in _entries(f):
            key = rename(e.key) if rename else e.key
            if key is not None and key not in ignore:
                es.append(_Entry(key, e.dtype, e.shape, e.begin, e.end, e.key))
        per_file.append((f, es))
    seen: dict[str, str] = {}
    for f, es in per_file:
        for e in es:
            if e.key in seen:  # two shards (or two stored names) for one tensor: which is meant is unknown
                raise OmniError(f"weights in {folder}: {e.key!r} is in both {seen[e.key]} and {f.name}")
            seen[e.key] = f.name
    _check_keys(targets.keys(), seen.keys(), folder)
    for f, es in per_file:
        for e in es:
            if tuple(targets[e.key].shape) != e.shape:
                stored = f" (stored as {e.stored!r})" if e.stored and e.stored != e.key else ""
                raise OmniError(f"weights in {folder}: {e.key!r}{stored} has shape {list(e.shape)} in {f.name}, "
                                f"the model's config makes it {list(targets[e.key].shape)}")
    device = next(iter(targets.values())).device
    with torch.no_grad():
        for f, es in per_file:
            if es:
                _stream_file(f, es, targets, device)


def _stream_file(path: Path, entries: list[_Entry], targets: dict[str, torch.Tensor],
                 device: torch.device) -> None:
    """Reads the span the entries cover in STAGE_BYTES windows, STAGES at a time on reader
    threads, each into its own host buffer, and copies each window's pieces to where they go
    on a side stream (a tensor's own bytes; or a scratch tensor of the stored dtype, converted
    into the tensor once whole). A buffer is read into again only after the copies out of it
    have finished (its event)."""
    start, stop = entries[0].begin, max(e.end for e in entries)
    windows = [(o, min(o + STAGE_BYTES, stop)) for o in range(start, stop, STAGE_BYTES)]
    if not windows:  # only empty tensors
        return
    buffers = [host_buffer((min(STAGE_BYTES, stop - start),), torch.uint8, device)
               for _ in range(min(STAGES, len(windows)))]
    done = [new_event(device) for _ in buffers]
    cuda = device.type == "cuda"
    copies = role_stream(device, "load") if cuda else None
    if cuda:
        # hazard: the tensors were made (and initialised) on the current stream: the copies
        # must come after that, and what reads the weights after the copies (synchronize below)
        copies.wait_stream(torch.cuda.current_stream(device))
    fd = os.open(path, os.O_RDONLY)

    def read(i: int) -> None:
        slot = i % len(buffers)
        done[slot].synchronize()  # the copies out of this buffer's previous window are done
        lo, hi = windows[i]
        view = memoryview(buffers[slot].numpy())[: hi - lo]
        got = 0
        while got < hi - lo:
            n = os.preadv(fd, [view[got:]], lo + got)
            if n == 0:
                raise OmniError(f"{path}: the file ends at byte {lo + got}; its header says {stop}")
            got += n

    scratch: dict[str, torch.Tensor] = {}  # entries being converted, until their last piece
    pool = ThreadPoolExecutor(len(buffers), thread_name_prefix="omni-load")
    try:
        with torch.cuda.stream(copies) if cuda else contextlib.nullcontext():
            reads = [pool.submit(read, i) for i in range(len(buffers))]  # reads[i]: window i
            k = 0  # the first entry that may overlap the current window
            for i, (lo, hi) in enumerate(windows):
                reads[i].result()
                buf = buffers[i % len(buffers)]
                while k < len(entries) and entries[k].end <= lo:
                    k += 1
                j = k
                while j < len(entries) and entries[j].begin < hi:
                    e, target = entries[j], targets[entries[j].key]
                    a, b = max(e.begin, lo), min(e.end, hi)
                    if target.dtype == e.dtype and target.is_contiguous():
                        raw = target.view(-1).view(torch.uint8)
                    else:
                        if e.key not in scratch:
                            scratch[e.key] = torch.empty(e.shape, dtype=e.dtype, device=device)
                        raw = scratch[e.key].view(-1).view(torch.uint8)
                    raw[a - e.begin:b - e.begin].copy_(buf[a - lo:b - lo], non_blocking=cuda)
                    if b == e.end and e.key in scratch:  # its last piece: convert, free the scratch
                        target.copy_(scratch.pop(e.key))
                    j += 1
                done[i % len(buffers)].record()
                if i + len(buffers) < len(windows):
                    reads.append(pool.submit(read, i + len(buffers)))
    finally:
        pool.shutdown(cancel_futures=True)  # after a failure, the reads queued behind it are not wanted
        try:
            if cuda:
                copies.synchronize()  # before the host buffers go, and before anything reads the weights
        finally:
            os.close(fd)
