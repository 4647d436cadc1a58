"""HuBERT as the codec's semantic branch runs it: audio -> the hidden states of every layer.

The same computation as transformers' HubertModel in eval mode, for the layout HuBERT base
and the released codec use (feat_extract_norm "group", post-norm encoder layers, GELU,
no positional batch norm), under transformers' parameter names so a checkpoint's
``semantic_model.*`` tensors load as they are. Written here so that a voice's first encode
does not import transformers, whose import, not HuBERT's weights, was most of the encoder's
load. Other layouts are a clear error.

  audio [B, samples] (16 kHz)
    feature extractor: conv (GroupNorm on the first) + GELU, 7 times   -> [B, C, T]
    projection: LayerNorm (feat_proj_layer_norm), Linear               -> [B, T, H]
    + positional conv (weight-normed, grouped, even kernel: last frame dropped) + GELU
    LayerNorm, then each layer: attention, residual, LayerNorm, MLP, residual, LayerNorm
  hidden states: the input of every layer and the last layer's output  -> L + 1 x [B, T, H]
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError

# HubertConfig's defaults (HuBERT base) for what a semantic_model_config leaves out
HUBERT_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                   "hidden_act": "gelu", "layer_norm_eps": 1e-5, "feat_extract_norm": "group",
                   "feat_extract_activation": "gelu", "conv_dim": (512,) * 7, "conv_stride": (5, 2, 2, 2, 2, 2, 2),
                   "conv_kernel": (10, 3, 3, 3, 3, 2, 2), "conv_bias": False, "num_conv_pos_embeddings": 128,
                   "num_conv_pos_embedding_groups": 16, "conv_pos_batch_norm": False,
                   "do_stable_layer_norm": False, "feat_proj_layer_norm": True}
# the layout this module computes: a config that differs in one of these is refused
_LAYOUT = {"feat_extract_norm": "group", "hidden_act": "gelu", "feat_extract_activation": "gelu",
           "conv_pos_batch_norm": False, "do_stable_layer_norm": False}


def hubert_config(config: dict, source: object) -> dict:
    """The semantic_model_config with HubertConfig's defaults filled in; a layout this module does
    not compute is a ConfigError naming the key."""
    cfg = {**HUBERT_DEFAULTS, **config}
    for key, want in _LAYOUT.items():
        if cfg[key] != want:
            raise ConfigError(source, f"semantic_model_config.{key}",
                              f"{cfg[key]!r} is not supported (the codec's HuBERT computes {want!r})")
    return cfg


class _ConvLayer(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int, bias: bool, group_norm: bool):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, bias=bias)
        self.layer_norm = nn.GroupNorm(cout, cout, affine=True) if group_norm else None  # the first layer only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return F.gelu(self.layer_norm(x) if self.layer_norm is not None else x)


class _FeatureExtractor(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        dims = [1, *cfg["conv_dim"]]
        self.conv_layers = nn.ModuleList(
            _ConvLayer(dims[i], dims[i + 1], cfg["conv_kernel"][i], cfg["conv_stride"][i], cfg["conv_bias"], i == 0)
            for i in range(len(cfg["conv_dim"])))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:  # [B, samples] -> [B, C, T]
        x = audio[:, None]
        for layer in self.conv_layers:
            x = layer(x)
        return x


class _FeatureProjection(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.layer_norm = nn.LayerNorm(cfg["conv_dim"][-1], eps=cfg["layer_norm_eps"]) \
            if cfg["feat_proj_layer_norm"] else None
        self.projection = nn.Linear(cfg["conv_dim"][-1], cfg["hidden_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.layer_norm(x) if self.layer_norm is not None else x)


class _PositionalConv(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, k = cfg["hidden_size"], cfg["num_conv_pos_embeddings"]
        # the checkpoint's weight-norm pair is folded into `weight` at load (fold_hubert_weight_norm)
        self.conv = nn.Conv1d(h, h, k, padding=k // 2, groups=cfg["num_conv_pos_embedding_groups"])
        self.drop_last = k % 2 == 0  # an even kernel pads one frame too many

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, T] -> [B, H, T]
        y = self.conv(x)
        return F.gelu(y[:, :, :-1] if self.drop_last else y)


class _Attention(nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H]: one clip a row, no padding, no mask
        b, t, h = x.shape
        q, k, v = (p(x).view(b, t, self.heads, h // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h))


class _FeedForward(nn.Module):
    def __init__(self, h: int, inter: int):
        super().__init__()
        self.intermediate_dense = nn.Linear(h, inter)
        self.output_dense = nn.Linear(inter, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(x)))


class _Layer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
        self.attention = _Attention(h, cfg["num_attention_heads"])
        self.layer_norm = nn.LayerNorm(h, eps=eps)
        self.feed_forward = _FeedForward(h, cfg["intermediate_size"])
        self.final_layer_norm = nn.LayerNorm(h, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # post-norm
        x = self.layer_norm(x + self.attention(x))
        return self.final_layer_norm(x + self.feed_forward(x))


class _Encoder(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.pos_conv_embed = _PositionalConv(cfg)
        self.layer_norm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg["num_hidden_layers"]))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.layer_norm(x + self.pos_conv_embed(x.transpose(1, 2)).transpose(1, 2))
        states = [x]
        for layer in self.layers:
            x = layer(x)
            states.append(x)
        return states


class Hubert(nn.Module):
    """HubertModel's eval forward: audio [B, samples] -> its hidden states, L + 1 x [B, T, hidden]."""

    def __init__(self, config: dict, source: object = "codec"):
        super().__init__()
        cfg = hubert_config(config, source)
        self.feature_extractor = _FeatureExtractor(cfg)
        self.feature_projection = _FeatureProjection(cfg)
        self.encoder = _Encoder(cfg)

    def forward(self, audio: torch.Tensor) -> list[torch.Tensor]:
        features = self.feature_extractor(audio).transpose(1, 2)  # [B, T, C]
        return self.encoder(self.feature_projection(features))


def fold_hubert_weight_norm(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The positional conv's weight-norm pair (weight_g / weight_v, or parametrizations' original0 /
    original1) folded into one ``weight`` by the function transformers' parametrization calls
    (torch._weight_norm over dim 2): the same bits as its forward computes each call."""
    conv = prefix + "encoder.pos_conv_embed.conv."
    pairs = [(conv + "weight_g", conv + "weight_v"),
             (conv + "parametrizations.weight.original0", conv + "parametrizations.weight.original1")]
    out = dict(state)
    for g_key, v_key in pairs:
        if g_key in out and v_key in out:
            g, v = out.pop(g_key), out.pop(v_key)
            out[conv + "weight"] = torch._weight_norm(v, g, 2)
    return out
