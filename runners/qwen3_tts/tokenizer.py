"""Qwen3-TTS's text tokenizer from vocab.json + merges.txt (the release has no tokenizer.json).

What the reference runs is transformers 4.57.3's Qwen2TokenizerFast, converted from those two
files (its Qwen2Converter: byte-level BPE, NFC, a split regex then byte-level pre-tokenizing),
with tokenizer_config.json's added tokens, loaded with ``fix_mistral_regex=True``. That flag
matters where transformers' _patch_mistral_regex runs at all, which is when
  - the model vocabulary (added tokens not counted) holds more than 100000 entries, and
  - the checkpoint is a local folder whose config.json either names no transformers_version,
    or one above 4.57.2 and below 5.0.0 (at 4.57.2 or below it skips models whose model_type is
    not Mistral's; from 5.0.0 it always skips): the release's config.json says 4.57.3.
There it swaps the split regex for MISTRAL_SPLIT, which splits camel case ("HelloWorld" ->
"Hello", "World"), drops the English contraction rule ("don't" -> "don", "'t") and lets a run
of punctuation take trailing slashes. A hub id given to the reference (not a local folder)
is checked against the hub's tags instead, where Qwen3-TTS is not a Mistral model: that path
keeps the Qwen2 regex. omni always reads a local folder (a hub id is downloaded first), so it
follows the local rule; ``mistral_regex`` overrides it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import OmniError

QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
               r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
MISTRAL_SPLIT = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
                 r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
                 r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
PATCH_MIN_VOCAB = 100000  # transformers patches only vocabularies larger than this
MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")
_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _version(text: str) -> tuple[int, ...]:
    """A release version's leading numbers ("4.57.3" -> (4, 57, 3); "5.0.0.dev0" -> (5, 0, 0))."""
    out = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def mistral_regex_applies(vocab_size: int, model_config: dict | None) -> bool:
    """Whether transformers 4.57.3 with fix_mistral_regex=True swaps in MISTRAL_SPLIT for a local
    folder with this many model-vocabulary entries and this config.json (None: no such file)."""
    if vocab_size <= PATCH_MIN_VOCAB or model_config is None:
        return False
    version = model_config.get("transformers_version")
    if version:
        v = _version(str(version))
        if v <= (4, 57, 2):
            kind = model_config.get("model_type")
            if kind is not None and kind not in MISTRAL_MODEL_TYPES:
                return False
        elif v >= (5, 0, 0):
            return False
    return True


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise OmniError(f"{path}: cannot read it ({e})") from None


def read_merges(path: Path) -> list[tuple[str, str]]:
    """merges.txt as the slow Qwen2Tokenizer reads it: a '#version:' first line and blank lines
    skipped, each other line stripped and split on whitespace."""
    merges = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                line = line.strip()
                if (i == 0 and line.startswith("#version:")) or not line:
                    continue
                pair = tuple(line.split())
                if len(pair) != 2:
                    raise OmniError(f"{path}: line {i + 1} is not a pair of symbols: {line!r}")
                merges.append(pair)
    except OSError as e:
        raise OmniError(f"{path}: cannot read it ({e})") from None
    return list(dict.fromkeys(merges))


class TextTokenizer:
    """The checkpoint folder's text tokenizer: ``encode`` gives the reference's ids."""

    def __init__(self, folder: Path, mistral_regex: bool | None = None):
        folder = Path(folder)
        vocab = _read_json(folder / "vocab.json")
        merges = read_merges(folder / "merges.txt")
        config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        model_config = _read_json(folder / "config.json") if (folder / "config.json").is_file() else None
        if mistral_regex is None:
            mistral_regex = mistral_regex_applies(len(vocab), model_config)
        self.mistral_regex = mistral_regex
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                                   continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                   byte_fallback=False))
        tok.normalizer = normalizers.NFC()
        split = pre_tokenizers.Split(Regex(MISTRAL_SPLIT if mistral_regex else QWEN2_SPLIT),
                                     behavior="isolated", invert=False)
        prefix = bool(config.get("add_prefix_space", False))
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=prefix,
                                                                                     use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.no_truncation()
        tok.no_padding()
        added = config.get("added_tokens_decoder") or {}
        self.specials: set[str] = set()
        for key in sorted(added, key=int):
            entry = added[key]
            content = entry.get("content")
            if not isinstance(content, str):
                raise OmniError(f"{folder / 'tokenizer_config.json'}: added token {key} has no content")
            flags = {f: bool(entry.get(f, f == "normalized" and not entry.get("special", False))) for f in _FLAGS}
            token = AddedToken(content, **flags)
            if content in vocab:
                got = vocab[content]  # an added token already in the vocabulary keeps its id
                tok.add_tokens([token])
            else:
                tok.add_tokens([token])
                got = tok.token_to_id(content)
            if got != int(key):
                raise OmniError(f"{folder / 'tokenizer_config.json'}: added token {content!r} is id {key}, but "
                                f"vocab.json and the tokens before it make it {got}")
            self.specials.add(content)
        self.tokenizer = tok
        self.vocab_size = len(vocab)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids; the batch runs in parallel in Rust, outside the GIL."""
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def token_id(self, token: str) -> int:
        got = self.tokenizer.token_to_id(token)
        if got is None:
            raise OmniError(f"the tokenizer has no token {token!r}")
        return got

    def pieces(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces of a text as given (byte-level symbols; encode applies NFC first)."""
        return [p for p, _ in self.tokenizer.pre_tokenizer.pre_tokenize_str(text)]
