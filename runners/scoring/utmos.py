"""UTMOS: the UTMOS22 strong learner's predicted MOS (1 to 5, higher is better) at 16 kHz.

The model (Saeki et al., 2022): a wav2vec 2.0 base encoder, whose frames are joined with a data-domain
embedding and a listener embedding, a bidirectional LSTM, a two-layer projection, averaged over frames,
x 2 + 3. Its weights come from a folder (or hub repository) holding `utmos_state_dict.pt`, the state
dict with fairseq's module names that utmos-pytorch loads (its conversion of the released checkpoint).

The encoder is transformers' `Wav2Vec2Model` (post-LN, a group norm in the first conv layer: the base
model's form) with fairseq's weights mapped onto it; the pos-conv's weight norm is folded into one
weight as the reference folds it. Domain 0 and listener 288 are the reference's scoring condition.
Each clip runs alone: its group norm over time and its attention then see no padding (the reference
recommends one clip a call for the same reason).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .base import RowScores, ScoreInput, Scorer, model_dtype, to_rate, torch_device

RATE = 16000
WEIGHTS = "utmos_state_dict.pt"
DOMAIN, LISTENER = 0, 288  # the reference's scoring condition
SSL = "feature_extractors.0.ssl_model."
# the wav2vec 2.0 base front's strides (not in the weights; the kernels are)
STRIDES = (5, 2, 2, 2, 2, 2, 2)
MIN_SAMPLES = 400  # the front's receptive field: one frame


def find_weights(model: str | Path) -> Path:
    """The state dict file of a folder, or of a hub repository (downloaded once by huggingface_hub)."""
    local = Path(model).expanduser()
    if local.is_dir():
        path = local / WEIGHTS
        if not path.is_file():
            raise FileNotFoundError(f"{local} holds no {WEIGHTS} (the UTMOS22 strong learner's state dict)")
        return path
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id=str(model), filename=WEIGHTS))


def _encoder(sd: dict[str, torch.Tensor]):
    """transformers' Wav2Vec2Model shaped by the state dict, with its weights: (model, missing keys)."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    convs = sorted(int(m.group(1)) for k in sd if (m := re.fullmatch(re.escape(SSL) + r"feature_extractor\.conv_layers\.(\d+)\.0\.weight", k)))
    layers = sorted({int(m.group(1)) for k in sd if (m := re.fullmatch(re.escape(SSL) + r"encoder\.layers\.(\d+)\..*", k))})
    if len(convs) != len(STRIDES) or not layers:
        raise ValueError(f"not a UTMOS22 strong learner's state dict: {len(convs)} conv layers (the base model has "
                         f"{len(STRIDES)}), {len(layers)} encoder layers")
    proj = sd[SSL + "post_extract_proj.weight"]  # [hidden, conv_dim]
    pos_v = sd[SSL + "encoder.pos_conv.0.weight_v"]  # [hidden, hidden / groups, kernel]
    hidden = proj.shape[0]
    cfg = Wav2Vec2Config(
        hidden_size=hidden, num_hidden_layers=len(layers), num_attention_heads=hidden // 64,
        intermediate_size=sd[SSL + "encoder.layers.0.fc1.weight"].shape[0],
        conv_dim=[sd[SSL + f"feature_extractor.conv_layers.{i}.0.weight"].shape[0] for i in convs],
        conv_kernel=[sd[SSL + f"feature_extractor.conv_layers.{i}.0.weight"].shape[-1] for i in convs],
        conv_stride=list(STRIDES), conv_bias=SSL + "feature_extractor.conv_layers.0.0.bias" in sd,
        feat_extract_norm="group", do_stable_layer_norm=False, num_conv_pos_embeddings=pos_v.shape[-1],
        num_conv_pos_embedding_groups=hidden // pos_v.shape[1], hidden_act="gelu", feat_extract_activation="gelu",
        layer_norm_eps=1e-5, apply_spec_augment=False, mask_time_prob=0.0)
    model = Wav2Vec2Model(cfg).eval()
    conv = model.encoder.pos_conv_embed.conv
    if hasattr(conv, "parametrizations"):  # the weight norm folded, as the reference folds it
        torch.nn.utils.parametrize.remove_parametrizations(conv, "weight")
    elif hasattr(conv, "weight_g"):
        torch.nn.utils.remove_weight_norm(conv)
    names = {"post_extract_proj": "feature_projection.projection", "layer_norm": "feature_projection.layer_norm",
             "encoder.layer_norm": "encoder.layer_norm", "encoder.pos_conv.0": "encoder.pos_conv_embed.conv"}
    mapped = {"encoder.pos_conv_embed.conv.weight": torch._weight_norm(pos_v, sd[SSL + "encoder.pos_conv.0.weight_g"], 2)}
    for key, value in sd.items():
        if not key.startswith(SSL):
            continue
        k = key[len(SSL):]
        if m := re.fullmatch(r"feature_extractor\.conv_layers\.(\d+)\.0\.(weight|bias)", k):
            mapped[f"feature_extractor.conv_layers.{m.group(1)}.conv.{m.group(2)}"] = value
        elif m := re.fullmatch(r"feature_extractor\.conv_layers\.0\.2\.(weight|bias)", k):  # the group norm
            mapped[f"feature_extractor.conv_layers.0.layer_norm.{m.group(1)}"] = value
        elif m := re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)", k):
            part = {"self_attn.k_proj": "attention.k_proj", "self_attn.v_proj": "attention.v_proj",
                    "self_attn.q_proj": "attention.q_proj", "self_attn.out_proj": "attention.out_proj",
                    "self_attn_layer_norm": "layer_norm", "fc1": "feed_forward.intermediate_dense",
                    "fc2": "feed_forward.output_dense", "final_layer_norm": "final_layer_norm"}[m.group(2)]
            mapped[f"encoder.layers.{m.group(1)}.{part}.{m.group(3)}"] = value
        elif (m := re.fullmatch(r"(.+)\.(weight|bias)", k)) and m.group(1) in names:
            mapped[f"{names[m.group(1)]}.{m.group(2)}"] = value
    missing, _ = model.load_state_dict(mapped, strict=False)
    return model, [k for k in missing if k != "masked_spec_embed"]


class UtmosScorer(Scorer):
    """`utmos` of every row (the module's doc)."""

    name = "utmos"
    score_names = ("utmos",)
    thresholds = {
        "utmos": ("<", 3.0, "the DNSMOS bar (Emilia-Pipe's) on the same 1-5 MOS scale; no UTMOS bar is standard: "
                  "set your own from your data"),
    }

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str | torch.dtype | None = "float32"):
        self.device = torch_device(device)
        self.dtype = model_dtype(self.device, dtype)
        sd = torch.load(find_weights(model), map_location="cpu", weights_only=True)
        self.encoder, missing = _encoder(sd)
        if missing:
            raise ValueError(f"the state dict lacks {', '.join(missing[:4])}")
        head = "output_layers."
        cond = torch.cat([sd["feature_extractors.1.embedding.weight"][DOMAIN],
                          sd[head + "0.judge_embedding.weight"][LISTENER]])  # [domain + listener dims]
        w_ih = sd[head + "0.decoder_rnn.weight_ih_l0"]
        self.rnn = torch.nn.LSTM(w_ih.shape[1], w_ih.shape[0] // 4, batch_first=True, bidirectional=True)
        self.rnn.load_state_dict({k.removeprefix(head + "0.decoder_rnn."): v for k, v in sd.items()
                                  if k.startswith(head + "0.decoder_rnn.")})
        first, last = sd[head + "1.net.0.weight"], sd[head + "1.net.3.weight"]
        self.proj = torch.nn.Sequential(torch.nn.Linear(first.shape[1], first.shape[0]), torch.nn.ReLU(),
                                        torch.nn.Linear(last.shape[1], last.shape[0]))
        self.proj.load_state_dict({"0.weight": first, "0.bias": sd[head + "1.net.0.bias"], "2.weight": last,
                                   "2.bias": sd[head + "1.net.3.bias"]})
        for m in (self.encoder, self.rnn, self.proj):
            m.to(self.device, self.dtype).eval()
        self.cond_gpu = cond.to(self.device, self.dtype)  # [C]

    @torch.inference_mode()
    def predict(self, clip_16k: np.ndarray) -> float:
        """One clip [samples] float32 at 16 kHz (at least MIN_SAMPLES) -> its predicted MOS."""
        wav_gpu = torch.from_numpy(np.ascontiguousarray(clip_16k, dtype=np.float32))[None].to(self.device, self.dtype)
        frames = self.encoder(wav_gpu).last_hidden_state  # [1, T, H]
        x = torch.cat([frames, self.cond_gpu.expand(1, frames.shape[1], -1)], dim=2)
        out, _ = self.rnn(x)  # [1, T, 2 x rnn]
        return float(self.proj(out).float().mean()) * 2 + 3

    def score(self, batch: Sequence[ScoreInput]) -> list[RowScores]:
        out = []
        for row in batch:
            clip = to_rate(row.audio, row.sample_rate, RATE)
            if len(clip) < MIN_SAMPLES:
                out.append(RowScores().missing(self.score_names, f"shorter than {MIN_SAMPLES} samples at 16 kHz"))
            else:
                out.append(RowScores(utmos=self.predict(clip)))
        return out

    def close(self) -> None:
        self.encoder = self.rnn = self.proj = None
