"""A checkpoint's text tokenizer and chat template, read without transformers.

transformers renders chat templates with Jinja and encodes with the
`tokenizers` library; importing it for that (AutoTokenizer pulls in its auto
classes) costs seconds of a run's start-up (BENCHMARKS.md, start-up). This
reads the same files and renders the same way, which tests check against transformers'
apply_chat_template:
  tokenizer.json         the tokenizers library's own format
  tokenizer_config.json  the named special tokens (bos_token, ...), which
                         templates see as variables; a chat_template key
                         (special_tokens_map.json too, where it has no
                         added_tokens_decoder, as transformers reads it)
  chat_template.jinja    the template, where it is a file of its own (first)
The Jinja environment is transformers': a sandbox with trim_blocks and
lstrip_blocks, loop controls, its tojson (no HTML escaping), raise_exception
and strftime_now, and the `generation` tag (rendered as its body).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from .errors import OmniError

# the special tokens a tokenizer config names one by one, and passes to templates
NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class _Generation(Extension):
    """{% generation %}...{% endgeneration %}: transformers marks assistant text with it (for
    training masks); rendering, it is its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _content(token) -> str | None:
    """A special token as tokenizer configs write it: a string, or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


# tokenizer classes that transformers loads from tokenizer.json as it is; others (LlamaTokenizerFast,
# say) may rebuild parts of it, which this does not
AS_SAVED = (None, "PreTrainedTokenizerFast", "TokenizersBackend")
# an added token's flags, as tokenizer_config.json's added_tokens_decoder and tokenizer.json write them
FLAGS = ("lstrip", "rstrip", "single_word", "normalized", "special")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, json.JSONDecodeError) as e:
        raise OmniError(f"{path}: cannot read it ({e})") from None


class ChatTokenizer:
    def __init__(self, folder: Path, default_template: str | None = None):
        """``default_template``: the template where the folder has none (a layout that ships without one)."""
        try:
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # tokenizers raises its own exception type
            raise OmniError(f"{folder / 'tokenizer.json'}: cannot load the tokenizer ({e})") from None
        # transformers encodes with neither, whatever tokenizer.json says
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        config_path = folder / "tokenizer_config.json"
        config = _read_json(config_path)
        if config.get("tokenizer_class") not in AS_SAVED:
            raise OmniError(f"{config_path}: tokenizer_class {config['tokenizer_class']!r}; omni reads tokenizers "
                            f"that transformers loads from tokenizer.json as saved: "
                            f"{', '.join(c for c in AS_SAVED if c)}")
        decoder = self.tokenizer.get_added_tokens_decoder()
        for key, token in (config.get("added_tokens_decoder") or {}).items():
            ours = decoder.get(int(key))
            if ours is None or ours.content != token.get("content") or any(
                    k in token and token[k] != getattr(ours, k) for k in FLAGS):
                raise OmniError(f"{config_path}: added token {key} ({token.get('content')!r}) differs from "
                                f"tokenizer.json's; transformers would apply the config's")
        if "added_tokens_decoder" not in config:  # as transformers does: the legacy file then counts
            config = {**config, **_read_json(folder / "special_tokens_map.json")}
        self.special_tokens = {k: _content(config[k]) for k in NAMED_SPECIALS if _content(config.get(k))}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        extra = extra.values() if isinstance(extra, dict) else extra
        added = {t.content for t in decoder.values()}
        named = set(self.special_tokens.values()) | {c for c in map(_content, extra) if c}
        # transformers would add these to the vocabulary (new ids): refuse instead of differing
        unknown = sorted(t for t in named if t not in added)
        if unknown:
            raise OmniError(f"{config_path} names special tokens that {folder / 'tokenizer.json'} does not hold "
                            f"as added tokens: {unknown[:5]}")
        self.specials = added | named  # text holding any of them would be read as control tokens
        source = self._template_source(folder, config, default_template)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise OmniError(f"the chat template in {folder} does not parse: {e}") from None

    @staticmethod
    def _template_source(folder: Path, config: dict, default: str | None = None) -> str:
        file = folder / "chat_template.jinja"
        if file.exists():
            return file.read_text(encoding="utf-8")
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if (not isinstance(template, str) or not template) and default:
            return default
        if not isinstance(template, str) or not template:
            raise OmniError(f"the tokenizer in {folder} has no chat template")
        return template

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text for a conversation, as transformers' apply_chat_template(tokenize=False)
        makes it. A template's raise_exception is a ValueError here."""
        try:
            return self.template.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.TemplateError as e:
            raise ValueError(str(e)) from None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, with no special tokens added around it; the batch is
        tokenized in parallel (in Rust, outside the GIL)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
