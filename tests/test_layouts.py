"""Both released layouts of Higgs Audio v2 checkpoints load, the original as transformers'
conversion scripts translate it (tests/original_layout.py writes it, by their mappings inverted)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni_cli.errors import ConfigError, OmniError
from omni_cli.runners import checkpoint
from omni_cli.runners.checkpoint import read_safetensors, resolve_file, resolve_folder, stream_into
from omni_cli.runners.higgs_audio_v2.codec import HiggsCodecDecoder
from omni_cli.runners.higgs_audio_v2.codec_layout import read_codec
from omni_cli.runners.higgs_audio_v2.config import HiggsConfig
from omni_cli.runners.higgs_audio_v2.family import IGNORED_KEYS, HiggsAudioV2
from omni_cli.runners.higgs_audio_v2.layouts import ORIGINAL, ORIGINAL_TEMPLATE, chat_template_fallback, lm_key
from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
from omni_cli.runners.higgs_audio_v2.prompt import PromptBuilder
from tests.conftest import TINY, read_manifest, run_cli, write_config, write_jsonl
from tests.original_layout import write_original, write_original_lm
from tests.reference import HiggsAudioV2ForConditionalGeneration
from tests.test_checkpoint_roundtrip import _prefill_logits
from tests.tiny_checkpoint import SPECIAL_TOKENS


@pytest.fixture(scope="module")
def orig(tmp_path_factory) -> Path:
    """The embedded tiny checkpoint pair, rewritten in the original layout."""
    return write_original(TINY, tmp_path_factory.mktemp("original"))


def _lm(folder: Path) -> HiggsAudioV2LM:
    cfg = HiggsConfig.from_file(folder / "config.json")
    model = HiggsAudioV2LM(cfg, max_seq_len=64)
    stream_into(model, folder, ignore=IGNORED_KEYS, rename=lm_key if cfg.layout == ORIGINAL else None)
    return model.eval()


def test_original_files_are_as_published(orig):
    """The builder wrote what the facts describe: nested config, three shards + index, no template."""
    raw = json.loads((orig / "model" / "config.json").read_text())
    assert raw["model_type"] == "higgs_audio" and "audio_delay_token_id" not in raw and raw["audio_codebook_size"] == 1024
    assert sorted(p.name for p in (orig / "model").glob("*.safetensors")) == \
        [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    keys = set(json.loads((orig / "model" / "model.safetensors.index.json").read_text())["weight_map"])
    assert {"embed_tokens.weight", "norm.weight", "audio_codebook_embeddings.weight",
            "audio_decoder_proj.audio_lm_head.weight", "audio_decoder_proj.text_lm_head.weight"} <= keys
    assert not (orig / "model" / "chat_template.jinja").exists()
    assert "chat_template" not in json.loads((orig / "model" / "tokenizer_config.json").read_text())
    pth = torch.load(orig / "codec" / "model.pth", weights_only=True)
    assert "decoder_2.model.0.weight_v" in pth and "quantizer.vq.layers.7._codebook.embed" in pth
    assert "fc_post2.weight" in pth and "encoder.block.0.weight_g" in pth


def test_original_lm_config_is_the_converted_one(orig):
    ours = HiggsConfig.from_file(orig / "model" / "config.json")
    want = HiggsConfig.from_file(TINY / "model" / "config.json")
    assert ours.layout == ORIGINAL and want.layout != ORIGINAL
    assert ours == want  # every field (the layout is not compared)


def test_original_lm_gives_the_same_logits(orig):
    """(a) prefill logits of the original layout equal the transformers layout's exactly (CPU fp32),
    and transformers' own model's on the transformers-layout folder."""
    ids = torch.randint(0, 256, (1, 19), generator=torch.Generator().manual_seed(0))
    got = _prefill_logits(_lm(orig / "model"), ids)
    want = _prefill_logits(_lm(TINY / "model"), ids)
    assert torch.equal(got, want)
    ref = HiggsAudioV2ForConditionalGeneration.from_pretrained(TINY / "model").eval()
    with torch.no_grad():
        torch.testing.assert_close(got, ref(input_ids=ids).logits[0].float(), atol=1e-5, rtol=1e-5)


def test_original_lm_keys_are_all_renamed(orig):
    """Every stored key maps to a model key (or the text head, ignored), none twice, as stream_into checks."""
    stored = read_safetensors(orig / "model")
    renamed = {lm_key(k) for k in stored}
    model = HiggsAudioV2LM(HiggsConfig.from_file(orig / "model" / "config.json"), max_seq_len=8)
    assert renamed - set(IGNORED_KEYS) == set(model.state_dict())
    assert set(model.state_dict()) == set(load_file(TINY / "model" / "model.safetensors"))


def test_original_codec_reads_as_the_transformers_one(orig):
    """(b) read_codec's state equals the transformers layout's key for key (weight-norm folds to
    float rounding), and it loads strictly into transformers' HiggsAudioV2TokenizerModel built
    from read_codec's config."""
    from transformers import HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel

    cfg, state = read_codec(orig / "codec")
    want_cfg, want = read_codec(TINY / "codec")
    assert set(state) == set(want)
    for k, v in want.items():
        if k.startswith(("acoustic_encoder.", "acoustic_decoder.")) and k.endswith(".weight"):
            torch.testing.assert_close(state[k], v, atol=0, rtol=1e-6, msg=k)
        else:
            assert torch.equal(state[k], v), k
    ours, ref = HiggsAudioV2TokenizerConfig(**cfg), HiggsAudioV2TokenizerConfig(**want_cfg)
    assert (ours.num_quantizers, ours.hop_length, ours.frame_rate, ours.hidden_size, ours.codebook_dim) == \
        (ref.num_quantizers, ref.hop_length, ref.frame_rate, ref.hidden_size, ref.codebook_dim)
    assert list(ours.target_bandwidths) == list(ref.target_bandwidths)
    for key in ("encoder_hidden_size", "decoder_hidden_size", "hidden_size", "upsampling_ratios"):
        assert getattr(ours.acoustic_model_config, key) == getattr(ref.acoustic_model_config, key), key
    HiggsAudioV2TokenizerModel(ours).load_state_dict(state, strict=True)


def test_original_codec_decodes_the_same_audio(orig):
    """(b) the original-layout codec decodes codes to the transformers layout's audio."""
    dev = torch.device("cpu")
    codes = torch.randint(0, 1024, (2, 8, 11), generator=torch.Generator().manual_seed(2))
    got = HiggsCodecDecoder.load(orig / "codec", torch.float32, dev).decode(codes)
    want = HiggsCodecDecoder.load(TINY / "codec", torch.float32, dev).decode(codes)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    with pytest.raises(AssertionError):  # control: other codes fail the same bound
        torch.testing.assert_close(HiggsCodecDecoder.load(orig / "codec", torch.float32, dev).decode(codes.flip(2)),
                                   want, atol=1e-6, rtol=1e-5)


def _perturbed(state: dict) -> dict:
    return {k: v + 1 for k, v in state.items()}


def test_single_file_wins_over_stale_shards_and_an_index_names_its_shards(tmp_path):
    """(c) transformers' choice: model.safetensors if present (stale shards with other weights
    beside it are not read), else exactly the index's shards (a stray file is not read)."""
    folder = tmp_path / "m"
    shutil.copytree(TINY / "model", folder)
    new = load_file(folder / "model.safetensors")
    old = _perturbed(new)
    keys = sorted(old)
    save_file({k: old[k] for k in keys[::2]}, folder / "model-00001-of-00002.safetensors")
    save_file({k: old[k] for k in keys[1::2]}, folder / "model-00002-of-00002.safetensors")
    index = {"weight_map": {k: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, k in enumerate(keys)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert checkpoint.weight_files(folder) == [folder / "model.safetensors"]
    got = _lm(folder).state_dict()
    assert all(torch.equal(got[k], new[k]) for k in new)
    (folder / "model.safetensors").unlink()
    save_file({keys[0]: new[keys[0]]}, folder / "stray.safetensors")  # named by no index: never read
    assert [p.name for p in checkpoint.weight_files(folder)] == \
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    got = _lm(folder).state_dict()
    assert all(torch.equal(got[k], old[k]) for k in old)
    assert read_safetensors(folder).keys() == old.keys()
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(OmniError, match="names shards that are not in the folder.*model-00002-of-00002"):
        _lm(folder)


def test_delay_token_id_comes_from_the_tokenizer(tmp_path):
    """(d) the original config names no delay token: its id is the tokenizer's id of
    <|reserved_special_token_6|>, as HiggsAudioV2Processor reads it (transformers' tokenizer here)."""
    from transformers import AutoTokenizer

    folder = write_original_lm(TINY / "model", tmp_path / "m")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # tests/tiny_checkpoint.py's tokenizer with the delay token moved to the end: another id
    base = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))},
                                merges=[]))
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    moved = [t for t in SPECIAL_TOKENS[1:] if t != "<|reserved_special_token_6|>"] + ["<|reserved_special_token_6|>"]
    PreTrainedTokenizerFast(tokenizer_object=base, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                            pad_token="<|end_of_text|>", additional_special_tokens=moved).save_pretrained(folder)
    want = AutoTokenizer.from_pretrained(str(folder)).convert_tokens_to_ids("<|reserved_special_token_6|>")
    tiny = HiggsConfig.from_file(TINY / "model" / "config.json").audio_delay_token_id
    assert want not in (tiny, 128014)
    assert HiggsConfig.from_file(folder / "config.json").audio_delay_token_id == want
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != "<|reserved_special_token_6|>"]
    tokenizer["model"]["vocab"].pop("<|reserved_special_token_6|>", None)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match=r"tokenizer.json: key '<\|reserved_special_token_6\|>'"):
        HiggsConfig.from_file(folder / "config.json")


def test_supplied_chat_template_renders_the_same_prompt_ids(orig):
    """(e) a plain row's prompt ids with the supplied template (the conversion script's) equal
    the transformers layout's, and transformers' apply_chat_template with that template."""
    from transformers import AutoTokenizer

    cfg = HiggsConfig.from_file(orig / "model" / "config.json")
    with pytest.raises(OmniError, match="has no chat template"):  # without the fallback: none
        PromptBuilder(orig / "model", cfg.audio_bos_token_id)
    ours = PromptBuilder(orig / "model", cfg.audio_bos_token_id, chat_template_fallback(orig / "model", cfg.layout))
    want = PromptBuilder(TINY / "model", cfg.audio_bos_token_id)
    row = ("Hello there, how are you?", "Generate audio following instruction.", None)
    assert ours.build(*row) == want.build(*row)
    ref = AutoTokenizer.from_pretrained(str(orig / "model"))
    ids = ref.apply_chat_template(ours.conversation(*row), chat_template=ORIGINAL_TEMPLATE.read_text(),
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.build(*row) == list(ids)
    assert chat_template_fallback(TINY / "model", "higgs_audio_v2") is None


def test_unloadable_layouts_say_what_they_found(tmp_path, orig):
    """(f) no config, an unknown model_type, no weight files: errors naming the file, the key and the way out."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="cannot read checkpoint config"):
        HiggsConfig.from_file(empty / "config.json")
    (empty / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match=r"config.json: key 'model_type': is 'llama'.*'higgs_audio_v2'.*'higgs_audio'"):
        HiggsConfig.from_file(empty / "config.json")
    with pytest.raises(OmniError, match=r"no weights in .*neither model.safetensors nor model.safetensors.index.json"):
        checkpoint.weight_files(empty)
    with pytest.raises(ConfigError, match="no codec config.json"):
        read_codec(tmp_path)
    with pytest.raises(ConfigError, match=r"key 'model_type': is 'llama' and the original layout's fields"):
        read_codec(empty)
    codec = tmp_path / "codec"
    shutil.copytree(orig / "codec", codec)
    (codec / "model.pth").unlink()
    with pytest.raises(OmniError, match="original codec layout, whose weights are model.pth; there is none"):
        read_codec(codec)
    shutil.copy(orig / "codec" / "model.pth", codec / "model.pth")
    shutil.copy(TINY / "codec" / "config.json", codec / "config.json")  # transformers' config, original weights
    with pytest.raises(OmniError, match="transformers' codec layout but the weights are model.pth"):
        read_codec(codec)


def test_hub_ids_take_a_revision(tmp_path, monkeypatch):
    """owner/name@rev reaches huggingface_hub as repo id and revision; the weight files fetched
    are transformers' choice (the single file, else the index's shards; model.pth for codecs)."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    calls = []
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors",
                                                                                   "b": "s2.safetensors"}}))
    hub = {"model.safetensors": False, "s1.safetensors": True, "s2.safetensors": True, "model.pth": True}

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append(("snapshot", repo_id, revision))
        return str(snap)

    def hf_hub_download(repo_id, filename, revision=None):
        calls.append(("file", repo_id, filename, revision))
        if not hub.get(filename, True):
            raise EntryNotFoundError(filename)
        return str(snap / filename)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    assert resolve_folder("bosonai/higgs-audio-v2-generation-3B-base@1084018", "checkpoint") == snap
    repo, rev = "bosonai/higgs-audio-v2-generation-3B-base", "1084018"
    assert calls == [("snapshot", repo, rev), ("file", repo, "model.safetensors", rev),
                     ("file", repo, "s1.safetensors", rev), ("file", repo, "s2.safetensors", rev)]
    calls.clear()
    hub["model.safetensors"] = True
    resolve_folder("owner/name", "checkpoint")
    assert calls == [("snapshot", "owner/name", None), ("file", "owner/name", "model.safetensors", None)]
    calls.clear()
    (snap / "model.safetensors.index.json").unlink()
    hub["model.safetensors"] = False
    resolve_folder("bosonai/higgs-audio-v2-tokenizer@9d4988f", "codec", pth=True)
    assert calls[-1] == ("file", "bosonai/higgs-audio-v2-tokenizer", "model.pth", "9d4988f")
    calls.clear()
    assert resolve_file("owner/name@main", "config.json", "checkpoint") == snap / "config.json"
    assert calls == [("file", "owner/name", "config.json", "main")]
    assert resolve_folder(str(tmp_path), "checkpoint") == tmp_path  # a local folder as it is
    with pytest.raises(OmniError, match="owner/name@revision"):
        resolve_folder("owner/name@", "checkpoint")


def test_limits_of_an_original_checkpoint(orig):
    lim, want = HiggsAudioV2.limits(str(orig / "model")), HiggsAudioV2.limits(str(TINY / "model"))
    assert (lim.num_streams, lim.vocab_size, lim.control_ids) == (want.num_streams, want.vocab_size, want.control_ids)


def test_omni_generate_on_an_original_layout_pair(tmp_path, orig):
    """`omni generate` end to end on an original-layout folder pair, the same audio as the
    transformers layout's (greedy, same seed)."""
    import soundfile as sf

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "Hello there."}, {"id": "b", "text": "Bye."}])
    outs = {}
    for name, ckpt in (("orig", orig), ("tiny", TINY)):
        cfg = write_config(tmp_path / f"{name}.yaml", ckpt)
        res = run_cli("generate", prompts, "-o", tmp_path / name, "--model", cfg, "--seed", "3",
                      "--max-new-frames", "10", "-q")
        assert res.exit_code == 0, res.output
        outs[name] = {r["id"]: r for r in read_manifest(tmp_path / name)}
    assert outs["orig"].keys() == {"a", "b"}
    for rid in ("a", "b"):
        a, _ = sf.read(tmp_path / "orig" / outs["orig"][rid]["file_name"])
        b, _ = sf.read(tmp_path / "tiny" / outs["tiny"][rid]["file_name"])
        assert a.shape == b.shape and abs(a - b).max() <= 2 / 32768


def test_yaml_takes_hub_ids_with_a_revision(tmp_path):
    from omni_cli.config import load_config

    rev = "bosonai/higgs-audio-v2-generation-3B-base@10840182ca4ad5d9d9113b60b9bb3c1ef1ba3f84"
    path = tmp_path / "m.yaml"
    path.write_text(f"family: higgs_audio_v2\ncheckpoint: {rev}\ncodec: bosonai/higgs-audio-v2-tokenizer@refs/pr/1\n")
    cfg = load_config(str(path))
    assert (cfg.checkpoint, cfg.codec) == (rev, "bosonai/higgs-audio-v2-tokenizer@refs/pr/1")
    path.write_text("family: higgs_audio_v2\ncheckpoint: owner/name@\ncodec: a/b\n")
    with pytest.raises(ConfigError, match="key 'checkpoint'.*owner/name@revision"):
        load_config(str(path))
