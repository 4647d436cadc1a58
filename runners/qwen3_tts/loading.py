"""Loading a released Qwen3-TTS-12Hz folder as it is, from a local folder or a hub id.

The layout (qwen-tts's Qwen3TTSModel.from_pretrained reads the same files):
  config.json, generation_config.json         config.py
  vocab.json, merges.txt, tokenizer_config.json   tokenizer.py (no tokenizer.json)
  model.safetensors                           ``talker.*`` (talker.py, predictor.py) and, on Base
                                              checkpoints, ``speaker_encoder.*`` (speaker.py)
  speech_tokenizer/config.json, model.safetensors  ``decoder.*`` (codec.py), ``encoder.*`` (encoder.py)
A hub id ``owner/name[@revision]`` is fetched through huggingface_hub's cache as
runners/checkpoint.py fetches Higgs checkpoints, plus speech_tokenizer/'s weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import load_into, parse_hub_id, read_safetensors, resolve_file, resolve_folder, stream_into
from ..device import default_dtype
from ..errors import OmniError
from .codec import Qwen3Codec, load_decoder
from .codec_config import SpeechTokenizerConfig
from .config import GenerationDefaults, Qwen3TTSConfig, Qwen3TTSLimits, limits_of
from .encoder import SpeechEncoder
from .speaker import SpeakerEncoder
from .talker import Talker
from .tokenizer import TextTokenizer

SPEECH_TOKENIZER = "speech_tokenizer"
CODEC_WEIGHTS = f"{SPEECH_TOKENIZER}/model.safetensors"


def resolve_checkpoint(spec: str) -> Path:
    """The checkpoint folder: a local folder as it is, or a hub snapshot holding its configs, its
    tokenizer, model.safetensors and the speech tokenizer's weights."""
    folder = resolve_folder(spec, "checkpoint")
    if Path(spec).is_dir() or (folder / CODEC_WEIGHTS).is_file():
        return folder
    repo, revision = parse_hub_id(spec)
    try:
        from huggingface_hub import hf_hub_download

        hf_hub_download(repo, CODEC_WEIGHTS, revision=revision)
    except Exception as e:  # offline, auth, missing file: the user's to fix
        raise OmniError(f"checkpoint {spec!r}: cannot fetch {CODEC_WEIGHTS}: {e}") from None
    return folder


def read_checkpoint_limits(spec: str) -> Qwen3TTSLimits:
    """The checkpoint's limits from config.json and generation_config.json alone (no weights)."""
    cfg = Qwen3TTSConfig.from_file(resolve_file(spec, "config.json", "checkpoint"))
    try:
        generation = GenerationDefaults.from_file(resolve_file(spec, "generation_config.json", "checkpoint"))
    except OmniError:
        generation = GenerationDefaults()  # the file is optional: the reference falls back to its defaults
    return limits_of(cfg, generation)


def read_configs(folder: Path) -> tuple[Qwen3TTSConfig, GenerationDefaults, SpeechTokenizerConfig]:
    folder = Path(folder)
    return (Qwen3TTSConfig.from_file(folder / "config.json"),
            GenerationDefaults.from_file(folder / "generation_config.json"),
            SpeechTokenizerConfig.from_file(folder / SPEECH_TOKENIZER / "config.json"))


class _Root(torch.nn.Module):
    """model.safetensors' top level: its ``talker.*`` keys land in the talker."""

    def __init__(self, talker: Talker):
        super().__init__()
        self.talker = talker


def load_talker(folder: Path, cfg: Qwen3TTSConfig, max_seq_len: int, dtype: torch.dtype,
                device: torch.device) -> Talker:
    """The talker (with its code predictor), built on ``device`` in ``dtype`` and filled straight
    from model.safetensors; rope tables float32."""
    with torch.device(device), default_dtype(dtype):
        talker = Talker(cfg, max_seq_len)
    rename = lambda key: key if key.startswith("talker.") else None  # noqa: E731  (speaker_encoder.*: speaker.py)
    stream_into(_Root(talker), Path(folder), rename=rename)
    return talker.to_runtime(device, dtype)


def load_speaker_encoder(folder: Path, cfg: Qwen3TTSConfig, device: torch.device,
                         dtype: torch.dtype = torch.float32) -> SpeakerEncoder:
    """The Base checkpoint's x-vector model from model.safetensors' ``speaker_encoder.*``."""
    if cfg.tts_model_type != "base":
        raise OmniError(f"{cfg.path}: a {cfg.tts_model_type} checkpoint has no speaker encoder")
    state = read_safetensors(Path(folder), prefixes=("speaker_encoder.",))
    enc = SpeakerEncoder(cfg.speaker_encoder)
    load_into(enc, {k[len("speaker_encoder."):]: v for k, v in state.items()}, Path(folder))
    return enc.to(device=device, dtype=dtype).eval()


def load_codec(folder: Path, cfg: Qwen3TTSConfig, codec_cfg: SpeechTokenizerConfig, dtype: torch.dtype,
               device: torch.device) -> Qwen3Codec:
    dec = load_decoder(Path(folder) / SPEECH_TOKENIZER, codec_cfg, dtype, device)
    if dec.cfg.num_quantizers != cfg.num_streams:
        raise OmniError(f"{codec_cfg.path}: the codec has {dec.cfg.num_quantizers} quantizers, the talker "
                        f"{cfg.num_streams} codebooks")
    if dec.cfg.codebook_size != cfg.code_vocab:
        raise OmniError(f"{codec_cfg.path}: the codec's codebooks hold {dec.cfg.codebook_size} codes, the "
                        f"code predictor's {cfg.code_vocab}")
    return Qwen3Codec(dec, cfg.talker.codec_eos_token_id, codec_cfg.output_sample_rate)


def load_encoder(folder: Path, codec_cfg: SpeechTokenizerConfig, device: torch.device) -> SpeechEncoder:
    """Reference audio -> codes, float32 as the released speech tokenizer runs."""
    return SpeechEncoder.load(Path(folder) / SPEECH_TOKENIZER, codec_cfg, device)


def load_tokenizer(folder: Path, mistral_regex: bool | None = None) -> TextTokenizer:
    return TextTokenizer(Path(folder), mistral_regex)
