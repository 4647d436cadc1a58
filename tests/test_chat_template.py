"""runners/chat_template.py against transformers: the same text from the same template and
conversation, the same ids from the same text, the same errors."""

from __future__ import annotations

import json
import shutil

import jinja2
import pytest
from transformers import AutoTokenizer

from omni_cli.errors import OmniError
from omni_cli.runners.chat_template import ChatTokenizer
from tests.conftest import TINY

# each exercises what Jinja under transformers' settings does differently from plain Jinja:
# trim_blocks / lstrip_blocks whitespace, loop controls, the tojson filter (no HTML escaping,
# its options), the special-token variables, namespace, the generation tag
TEMPLATES = {
    "shipped": (TINY / "model" / "chat_template.jinja").read_text(),
    "whitespace": (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'system' %}\n"
        "<<SYS>> {{ m['content'][0]['text'] }} <</SYS>>\n"
        "    {% else %}\n"
        "[{{ m['role'] | upper }}]\n  {{ m['content'][0]['text'] }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}[ASSISTANT]{{ eos_token }}{% endif %}"),
    "controls": (
        "{% set ns = namespace(n=0) %}"
        "{% for m in messages %}{% if m['role'] == 'scene' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{% if ns.n > 2 %}{% break %}{% endif %}"
        "{{ ns.n }}={{ m | tojson }};{{ m['content'] | tojson(indent=2, sort_keys=True) }}"
        "{% endfor %}{% generation %}<|audio_out_bos|>{% endgeneration %}{{ pad_token }}"),
}
CONVERSATIONS = [
    [{"role": "system", "content": [{"type": "text", "text": "Speak slowly."}]},
     {"role": "user", "content": [{"type": "text", "text": "Hello world."}]}],
    [{"role": "system", "content": [{"type": "text", "text": "  padded <b>&amp;</b> \"quoted\" "}]},
     {"role": "scene", "content": [{"type": "text", "text": "A noisy café — 🎉"}]},
     {"role": "user", "content": [{"type": "text", "text": "Ünïcödé, tabs\tand\nnewlines."}]}],
]


def _folder(tmp_path, template: str | None, **config_changes):
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(TINY / "model" / "tokenizer.json", folder)
    config = json.loads((TINY / "model" / "tokenizer_config.json").read_text())
    config.update(config_changes)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_render_and_ids_equal_transformers(tmp_path, name, generation_prompt):
    folder = _folder(tmp_path, TEMPLATES[name])
    ours, ref = ChatTokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    rendered, want_ids = [], []
    for conv in CONVERSATIONS:
        want = ref.apply_chat_template(conv, add_generation_prompt=generation_prompt, tokenize=False)
        got = ours.render(conv, add_generation_prompt=generation_prompt)
        assert got == want
        want_ids.append(ref(want, add_special_tokens=False)["input_ids"])
        rendered.append(got)
    assert ours.encode_batch(rendered) == want_ids  # row by row, in one batch
    assert ours.specials == set(ref.all_special_tokens) | {str(t) for t in ref.added_tokens_decoder.values()}


@pytest.mark.parametrize("form", ["string", "named list"])
def test_template_from_the_tokenizer_config(tmp_path, form):
    template = TEMPLATES["whitespace"]
    value = template if form == "string" else [{"name": "tool_use", "template": "x"},
                                               {"name": "default", "template": template}]
    folder = _folder(tmp_path, None, chat_template=value)
    want = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(CONVERSATIONS[1], tokenize=False)
    assert ChatTokenizer(folder).render(CONVERSATIONS[1], add_generation_prompt=False) == want


def test_raise_exception_fails_the_render_as_in_transformers(tmp_path):
    folder = _folder(tmp_path, "{{ raise_exception('no scenes here') if messages[1]['role'] == 'scene' }}")
    with pytest.raises(jinja2.TemplateError, match="no scenes here"):
        AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(CONVERSATIONS[1], tokenize=False)
    with pytest.raises(ValueError, match="no scenes here"):
        ChatTokenizer(folder).render(CONVERSATIONS[1], add_generation_prompt=False)
    assert ChatTokenizer(folder).render(CONVERSATIONS[0], add_generation_prompt=False) == ""


def test_missing_template_and_unknown_special_tokens_are_errors(tmp_path):
    with pytest.raises(OmniError, match="has no chat template"):
        ChatTokenizer(_folder(tmp_path, None))
    shutil.rmtree(tmp_path / "tok")
    with pytest.raises(OmniError, match=r"names special tokens .* as added tokens: \['<\|not_in_vocab\|>'\]"):
        ChatTokenizer(_folder(tmp_path, "x", extra_special_tokens=["<|eot_id|>", "<|not_in_vocab|>"]))
    shutil.rmtree(tmp_path / "tok")
    with pytest.raises(OmniError, match="does not parse"):
        ChatTokenizer(_folder(tmp_path, "{% for %}"))


def test_truncation_and_padding_saved_in_tokenizer_json_are_off_as_in_transformers(tmp_path):
    from tokenizers import Tokenizer

    folder = _folder(tmp_path, TEMPLATES["shipped"])
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(4)
    tok.enable_padding()  # a batch would be padded to its longest text
    tok.save(str(folder / "tokenizer.json"))
    texts = [ChatTokenizer(folder).render(c, add_generation_prompt=True) for c in CONVERSATIONS[:2]]
    ref = AutoTokenizer.from_pretrained(str(folder))
    want = [ref(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert len(want[0]) != len(want[1]) and min(map(len, want)) > 4
    assert ChatTokenizer(folder).encode_batch(texts) == want


def test_legacy_special_tokens_map_feeds_the_template_as_in_transformers(tmp_path):
    folder = _folder(tmp_path, "{{ bos_token }}|{{ eos_token }}")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("bos_token")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<|end_of_text|>"}}))
    want = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(CONVERSATIONS[0], tokenize=False)
    assert want == "<|end_of_text|>|<|eot_id|>"
    assert ChatTokenizer(folder).render(CONVERSATIONS[0], add_generation_prompt=False) == want


def test_what_transformers_would_rebuild_is_refused(tmp_path):
    from tokenizers import Tokenizer

    eot = Tokenizer.from_file(str(TINY / "model" / "tokenizer.json")).token_to_id("<|eot_id|>")
    flags = {"content": "<|eot_id|>", "lstrip": False, "rstrip": True, "single_word": False, "normalized": False,
             "special": True}
    folder = _folder(tmp_path, "x", added_tokens_decoder={str(eot): flags})
    with pytest.raises(OmniError, match=rf"added token {eot} \('<\|eot_id\|>'\) differs from tokenizer.json's"):
        ChatTokenizer(folder)
    shutil.rmtree(folder)
    ChatTokenizer(_folder(tmp_path, "x", added_tokens_decoder={str(eot): {**flags, "rstrip": False}}))
    shutil.rmtree(tmp_path / "tok")
    with pytest.raises(OmniError, match="tokenizer_class 'LlamaTokenizerFast'"):
        ChatTokenizer(_folder(tmp_path, "x", tokenizer_class="LlamaTokenizerFast"))
