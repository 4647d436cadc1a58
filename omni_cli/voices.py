"""Reference voices: a row's ``ref_audio``/``ref_text`` or ``voice``, the voice bank, the clips and their codes.

A reference is read and checked before the model loads (missing, unreadable, empty or
silent audio fails its rows alone). After loading, each distinct clip (by the sha256 of its
file's bytes) is encoded once, whatever number of rows use it, in one call to the family's
``encode_audio``; its codes are cached on disk under the codec's identity, so a later run, or
``omni voices encode`` ahead of it, skips the encoder.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omni_cli.errors import OmniError, RowError
from omni_cli.voice_bank import Voice, read_bank_file

SILENT_PEAK = 1e-4  # -80 dBFS: below this a reference holds no voice to clone


@dataclass
class Clip:
    sha256: str  # of the file's bytes: what identifies a reference
    samples: np.ndarray  # [n] float32 mono, at the file's rate
    rate: int


def row_voice(r, bank: dict[str, Voice], base: Path) -> Voice | None:
    """The row's reference (RowError naming the field when it has a bad one), or None."""
    if r.voice is not None:
        if r.voice not in bank:
            known = ", ".join(sorted(bank)) or "none: give --voices or the config's voices"
            raise RowError(r.row, "voice", f"no voice {r.voice!r} in the voice bank (known: {known})")
        return bank[r.voice]
    if r.ref_audio is None:
        return None
    return Voice((base / Path(r.ref_audio).expanduser()).resolve(), r.ref_text)


def read_clip(path: Path) -> Clip:
    """The file's audio, downmixed to mono; ValueError says what is wrong with it."""
    import soundfile as sf

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read: {e.strerror or e}") from None
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001  (libsndfile's errors: not audio, a format it lacks)
        why = re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "the file", str(e)).strip(" :") or "no known format"
        raise ValueError(f"{path}: not audio that soundfile reads ({why})") from None
    if samples.shape[0] == 0:
        raise ValueError(f"{path}: the audio is empty")
    if (cut := wav_truncated(data)) is not None:
        raise ValueError(f"{path}: the file is cut short: {cut}")
    mono = samples.mean(axis=1, dtype=np.float32)  # downmix: the channels' mean
    if not np.isfinite(mono).all():
        raise ValueError(f"{path}: the audio holds NaN or infinite samples")
    if float(np.abs(mono).max()) < SILENT_PEAK:
        raise ValueError(f"{path}: the audio is silent (peak below {SILENT_PEAK:g})")
    return Clip(hashlib.sha256(data).hexdigest(), mono, int(rate))


def wav_truncated(data: bytes) -> str | None:
    """For a RIFF WAV file: what is missing where its data chunk's header promises more bytes than
    the file holds (a copy cut short: soundfile reads what is there without a word); else None."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    at = 12
    while at + 8 <= len(data):
        kind, size = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
        if kind == b"data":
            held = len(data) - at - 8
            if size != 0xFFFFFFFF and held < size:  # 0xFFFFFFFF: a stream's "unknown length"
                return f"its header promises {size} bytes of audio, the file holds {held}"
            return None
        at += 8 + size + (size & 1)  # chunks are padded to an even size
    return "it has no data chunk"


def check_references(rows: list, bank: dict[str, Voice], base: Path) -> dict[str, Clip]:
    """Before loading: each row's reference resolved and its file read and checked; a bad one
    fails its rows (r.error). Sets r.reference on good rows; returns the clips by sha256."""
    clips: dict[str, Clip] = {}
    by_path: dict[Path, Clip | str] = {}
    for r in rows:
        if r.error is not None:
            continue
        try:
            voice = row_voice(r, bank, base)
        except RowError as e:
            r.error = str(e)
            continue
        if voice is None:
            continue
        if voice.path not in by_path:
            try:
                by_path[voice.path] = read_clip(voice.path)
            except ValueError as e:
                by_path[voice.path] = str(e)
        clip = by_path[voice.path]
        if isinstance(clip, str):
            field = "voice" if voice.name else "ref_audio"
            r.error = str(RowError(r.row, field, f"{'voice ' + repr(voice.name) + ': ' if voice.name else ''}{clip}"))
            continue
        clips[clip.sha256] = clip
        r.reference = (voice, clip.sha256)
    return clips


def cache_root() -> Path:
    """$OMNI_CACHE_DIR, else $XDG_CACHE_HOME/omni-cli, else ~/.cache/omni-cli."""
    if os.environ.get("OMNI_CACHE_DIR"):
        return Path(os.environ["OMNI_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omni-cli"


def cache_dir() -> Path:
    """Where reference codes are kept: voices/ of the cache root, a folder per codec identity."""
    return cache_root() / "voices"


def codec_key(model) -> str:
    """The codec identity's first 32 hex digits, its folder's name; the digest is remembered in the
    cache's codec-identities/ (runners/digest.py), so a run with the same codec files reads none."""
    return _key(model.codec_identity(store=_identities()))


def _identities() -> Path:
    return cache_root() / "codec-identities"


def _key(identity: str) -> str:
    return identity.replace("sha256:", "")[:32]


def encodes_any(family, spec, clips: dict[str, Clip]) -> bool:
    """Before the load: whether a clip has no codes in the cache, so that the family loads its
    encoder with the model (runners/family.py: LoadSpec.encode_references) instead of at the first
    encode, inside the generate phase. Keyed as codec_key keys the loaded model's."""
    from omni_cli.runners.family import codec_identity_of

    if not clips:
        return False
    try:
        files = family.codec_files_of(spec)
    except NotImplementedError:
        return False
    folder = cache_dir() / _key(codec_identity_of(files, _identities()))
    return any(not (folder / f"{sha}.npy").is_file() for sha in clips)


@dataclass
class EncodeStats:
    distinct: int = 0  # distinct references the run's rows use
    encoded: int = 0  # of them, run through the encoder in this run
    cached: int = 0  # of them, read from the cache

    def as_record(self) -> dict:
        return {"distinct": self.distinct, "encoded": self.encoded, "cached": self.cached}


def encode_clips(model, clips: dict[str, Clip], read_cache: bool = True) -> tuple[dict, EncodeStats]:
    """sha256 -> codes [frames, streams] int64, or the exception that encoding it raised. Each
    clip is resampled to the model's rate (runners/resample.py: torchaudio's algorithm) and
    encoded once; all uncached clips go to the encoder in one call (one by one after a failure,
    so that only a clip that fails fails its rows)."""
    stats = EncodeStats(distinct=len(clips))
    folder = cache_dir() / codec_key(model)
    out: dict[str, np.ndarray | Exception] = {}
    todo = []
    for sha in sorted(clips):
        path = folder / f"{sha}.npy"
        if read_cache and path.is_file():
            try:
                out[sha] = np.load(path, allow_pickle=False)
                stats.cached += 1
                continue
            except (OSError, ValueError):
                pass  # a damaged entry: encode again, and replace it
        todo.append(sha)
    if not todo:
        return out, stats
    audio = {sha: at_rate(clips[sha], model.sample_rate) for sha in todo}
    try:
        codes = dict(zip(todo, model.encode_audio([audio[s] for s in todo])))
    except Exception:  # noqa: BLE001  (one bad clip must not fail the others: again one by one)
        codes = {}
        for sha in todo:
            try:
                codes[sha] = model.encode_audio([audio[sha]])[0]
            except Exception as e:  # noqa: BLE001
                codes[sha] = e
    for sha, got in codes.items():
        out[sha] = got
        if isinstance(got, np.ndarray):
            stats.encoded += 1
            _store(folder / f"{sha}.npy", got)
    return out, stats


def at_rate(clip: Clip, rate: int) -> np.ndarray:
    """The clip's samples at `rate` (runners/resample.py: torchaudio's algorithm), mono float32."""
    import torch

    from omni_cli.runners.resample import resample

    return resample(torch.from_numpy(clip.samples), clip.rate, rate).numpy() if clip.rate != rate else clip.samples


def speakers_of(model, clips: dict[str, Clip]) -> dict[str, np.ndarray | Exception]:
    """sha256 -> the clip's speaker embedding, where the family's prompts take one (else {})."""
    shas = sorted(clips)
    try:
        got = model.speaker_embeddings([at_rate(clips[s], model.sample_rate) for s in shas])
    except Exception as e:  # noqa: BLE001  (the rows of these clips fail, the run goes on)
        return dict.fromkeys(shas, e)
    return {} if got is None else dict(zip(shas, got))


def _store(path: Path, codes: np.ndarray) -> None:
    """Atomically: a reader never sees half a file (runs may share a cache)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(codes, dtype=np.int64))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs a later run the encoding


def prompt_base(prompts: str) -> Path:
    """What a row's relative ref_audio is relative to: the prompt file's folder (stdin, a pipe: here)."""
    path = Path(prompts)
    return path.resolve().parent if prompts != "-" and path.is_file() else Path.cwd()


def attach_references(rows: list, model, clips: dict[str, Clip]) -> EncodeStats:
    """After loading: each distinct clip encoded once, and each row with a reference given its
    context (a user turn with the transcript, an assistant turn with the codes); a clip that
    fails to encode fails its rows."""
    from omni_cli.runners.family import AudioTurn

    if not clips:
        return EncodeStats()
    codes, stats = encode_clips(model, clips)
    speakers = speakers_of(model, clips)
    for r in rows:
        if r.error is not None or r.reference is None:
            continue
        voice, sha = r.reference
        got, speaker = codes[sha], speakers.get(sha)
        failed = got if isinstance(got, Exception) else speaker if isinstance(speaker, Exception) else None
        if failed is not None:
            field = "voice" if voice.name else "ref_audio"
            r.error = str(RowError(r.row, field, f"encoding {voice.path} failed: {type(failed).__name__}: {failed}"))
            continue
        r.context = (AudioTurn(voice.text, got, speaker),)
    return stats


def queue_order(rows: list):
    """The job's queue order, as a sort key of (row, ...) entries: the first row of each voice,
    then the others by voice (rows without one: voice ""); sort is stable, so input order within."""
    first = {}
    for r in rows:
        if r.reference is not None:
            first.setdefault(r.reference[1], id(r))

    def key(entry) -> tuple[int, str]:
        voice = entry[0].reference[1] if entry[0].reference is not None else ""
        return (0 if first.get(voice) == id(entry[0]) else 1, voice)

    return key


def too_long(r, prompt_len: int, ref_frames: int, max_new_frames: int, max_seq_len: int,
             frame_rate: float) -> tuple[str, str]:
    """(field, message) for a row whose reference (ref_frames codec frames in its prompt of
    prompt_len positions) makes its prompt and frames overflow the context."""
    fixed = prompt_len - ref_frames  # every position but the reference's own frames
    room = max_seq_len - max_new_frames - fixed
    field = "voice" if r.reference[0].name else "ref_audio"
    have = ref_frames / frame_rate
    if room <= 0:
        return "max_new_frames", (f"the prompt and max_new_frames ({max_new_frames}) leave no room in the context "
                                  f"({max_seq_len} positions) for the reference")
    return field, (f"the reference is {have:.2f} s; with this row's text and max_new_frames ({max_new_frames}) "
                   f"the context ({max_seq_len} positions) takes at most {room / frame_rate:.2f} s of it")


def run_encode_bank(bank_file: Path | None, model: str | None, force: bool) -> list[tuple[str, str]]:
    """`omni voices encode`: every voice of the bank (the file's, else the config's) read, checked
    and encoded into the cache; returns (name, what happened) a voice, in the bank's order."""
    from omni_cli.config import load_config
    from omni_cli.runners.device import DTYPES, pick_device
    from omni_cli.runners.family import LoadSpec, family_class

    config = load_config(model)
    bank = read_bank_file(bank_file) if bank_file is not None else config.voices
    if not bank:
        raise OmniError("no voices to encode: give a voice bank file, or a model config with voices:")
    report: dict[str, str] = {}
    clips: dict[str, Clip] = {}
    for name, voice in bank.items():
        try:
            clip = read_clip(voice.path)
        except ValueError as e:
            report[name] = f"failed: {e}"
            continue
        clips[clip.sha256] = clip
        report[name] = clip.sha256
    if clips:
        family = family_class(config.family, config.path)
        spec = LoadSpec(source=str(config.path), checkpoint=config.checkpoint, codec=config.codec,
                        dtype=DTYPES[config.dtype], device=pick_device(config.device), max_batch_size=1,
                        max_seq_len=config.max_seq_len, deterministic=config.deterministic)
        loaded = family.load(spec)
        codes, _ = encode_clips(loaded, clips, read_cache=not force)  # --force: encode, replace the cache's
        for name, sha in list(report.items()):
            if sha in codes:
                got = codes[sha]
                report[name] = (f"failed: {type(got).__name__}: {got}" if isinstance(got, Exception) else
                                f"{len(got)} frames ({len(got) / loaded.frame_rate:.2f} s), sha256 {sha[:12]}")
    return list(report.items())
