"""Speaker similarity: cosine between a row's x-vector and its reference voice's, at 16 kHz.

`WavLMForXVector` (transformers) from a hub id or folder (e.g. microsoft/wavlm-base-plus-sv).
Each clip is resampled to 16 kHz (runners/resample.py) and run through the checkpoint's
feature extractor alone (its normalisation sees only that clip), then clips run batched,
zero-padded, with an attention mask. Where padding would reach a clip's numbers, this scorer
keeps that part per clip, so a batched embedding is the one-clip embedding (within float
rounding):
- checkpoints whose conv front starts with a group norm (feat_extract_norm "group", the
  base models) normalise each channel over all time steps, padding included: the first conv
  layer runs per clip over the clip's own samples, the rest batched;
- statistics pooling: transformers' `WavLMForXVector` counts the TDNN output of a padded clip
  as (frames - sum(kernel - 1)), ignoring dilation, so it averages frames that saw padding;
  here the pooled frames are (frames - sum((kernel - 1) * dilation)), exactly those of the
  clip alone.
Reference voices are embedded once per scorer (cached by the sha256 of their samples and rate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .base import (EmbeddingCache, RowScores, ScoreInput, Scorer, chunks, model_dtype, samples_digest, to_rate,
                   torch_device)

RATE = 16000


class _ClipwiseFront(torch.nn.Module):
    """A WavLM conv front whose first layer (conv + group norm over time) runs per clip."""

    def __init__(self, front: torch.nn.Module):
        super().__init__()
        self.front = front
        self.lengths: list[int] = []  # each row's samples, set before every forward

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:  # [B, samples] -> [B, C, frames]
        layers = self.front.conv_layers
        firsts = [layers[0](input_values[i:i + 1, None, :n]) for i, n in enumerate(self.lengths)]  # [1, C, T_i]
        width = max(f.shape[-1] for f in firsts)
        hidden = torch.cat([F.pad(f, (0, width - f.shape[-1])) for f in firsts])  # padding: frames no valid one reads
        for layer in layers[1:]:
            hidden = layer(hidden)
        return hidden


class SpeakerScorer(Scorer):
    """`speaker_sim` of each row with a reference voice (the module's doc)."""

    name = "speaker"
    score_names = ("speaker_sim",)
    thresholds = {
        "speaker_sim": ("<", 0.86, "the threshold in the microsoft/wavlm-base-plus-sv model card's verification "
                        "example ('dataset-dependent'); holds for that checkpoint's x-vectors only: recalibrate for "
                        "another"),
    }

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str | torch.dtype | None = "float32",
                 batch_size: int = 16):
        from transformers import AutoFeatureExtractor, WavLMForXVector

        self.device = torch_device(device)
        self.dtype = model_dtype(self.device, dtype)
        self.batch_size = int(batch_size)
        self.feature_extractor = AutoFeatureExtractor.from_pretrained(str(model))
        self.model = WavLMForXVector.from_pretrained(str(model), dtype=self.dtype).to(self.device).eval()
        cfg = self.model.config
        self._front = None
        if cfg.feat_extract_norm == "group":
            self._front = _ClipwiseFront(self.model.wavlm.feature_extractor)
            self.model.wavlm.feature_extractor = self._front
        self._tdnn_shrink = sum((k - 1) * d for k, d in zip(cfg.tdnn_kernel, cfg.tdnn_dilation))
        self.min_samples = self._min_samples()
        self.cache = EmbeddingCache()

    def _min_samples(self) -> int:
        """Fewest 16 kHz samples that leave two pooled frames (a standard deviation needs two)."""
        n = 2 + self._tdnn_shrink
        for kernel, stride in reversed(list(zip(self.model.config.conv_kernel, self.model.config.conv_stride))):
            n = (n - 1) * stride + kernel
        return n

    @torch.inference_mode()
    def _embed_batch(self, clips_16k: Sequence[np.ndarray]) -> np.ndarray:
        values = [self.feature_extractor(c, sampling_rate=RATE, return_tensors="np")["input_values"][0]
                  .astype(np.float32) for c in clips_16k]  # each normalised alone
        lengths = [len(v) for v in values]
        padded_host = np.zeros((len(values), max(lengths)), np.float32)
        mask_host = np.zeros(padded_host.shape, np.int64)
        for i, v in enumerate(values):
            padded_host[i, :len(v)] = v
            mask_host[i, :len(v)] = 1
        values_gpu = torch.from_numpy(padded_host).to(self.device, self.dtype)  # [B, samples] (model's device)
        mask_gpu = torch.from_numpy(mask_host).to(self.device)
        if self._front is not None:
            self._front.lengths = lengths
        m = self.model
        out = m.wavlm(values_gpu, attention_mask=mask_gpu, output_hidden_states=m.config.use_weighted_layer_sum)
        if m.config.use_weighted_layer_sum:
            weights = torch.softmax(m.layer_weights, dim=-1)
            hidden = (torch.stack(out.hidden_states, dim=1) * weights.view(-1, 1, 1)).sum(dim=1)
        else:
            hidden = out.last_hidden_state  # [B, frames, H]
        hidden = m.projector(hidden)
        for layer in m.tdnn:
            hidden = layer(hidden)  # [B, frames', D]: valid convs, no padding of their own
        frames = m._get_feat_extract_output_lengths(mask_gpu.sum(dim=1)) - self._tdnn_shrink
        pooled = torch.stack([torch.cat([hidden[i, :n].mean(dim=0), hidden[i, :n].std(dim=0)])
                              for i, n in enumerate(frames.tolist())])
        return m.feature_extractor(pooled).float().cpu().numpy()  # [B, xvector_dim]

    def embed(self, clips_16k: Sequence[np.ndarray]) -> np.ndarray:
        """Clips [samples] float32 at 16 kHz (each at least `min_samples`) -> [n, D] float32."""
        out = [self._embed_batch(part) for part in chunks(list(clips_16k), self.batch_size)]
        return np.concatenate(out) if out else np.zeros((0, self.model.config.xvector_output_dim), np.float32)

    def reference_embeddings(self, refs: Sequence[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """(audio, rate) of each reference -> its embedding; each distinct clip embedded once per scorer."""
        keys = [samples_digest(a, r) for a, r in refs]
        todo = {k: (a, r) for k, (a, r) in zip(keys, refs) if k not in self.cache.store}
        self.cache.hits += len(keys) - len(todo)
        self.cache.misses += len(todo)
        if todo:
            embs = self.embed([to_rate(a, r, RATE) for a, r in todo.values()])
            self.cache.store.update(zip(todo, embs))
        return [self.cache.store[k] for k in keys]

    def score(self, batch: Sequence[ScoreInput]) -> list[RowScores]:
        results = [RowScores() for _ in batch]
        short = f"shorter than the model's {self.min_samples / RATE:.2f} s at 16 kHz"
        live, clips, refs = [], [], []
        for i, row in enumerate(batch):
            clip = to_rate(row.audio, row.sample_rate, RATE) if len(row.audio) else row.audio
            ref_len = 0 if row.reference is None else round(len(row.reference) * RATE / row.reference_rate)
            if row.reference is None:
                results[i].missing(self.score_names, "no reference voice")
            elif len(clip) < self.min_samples:
                results[i].missing(self.score_names, f"the clip is {short}")
            elif ref_len < self.min_samples:
                results[i].missing(self.score_names, f"the reference voice is {short}")
            else:
                live.append(i)
                clips.append(clip)
                refs.append((row.reference, int(row.reference_rate)))
        if live:
            row_embs = self.embed(clips)
            for i, emb, ref in zip(live, row_embs, self.reference_embeddings(refs)):
                results[i]["speaker_sim"] = cosine(emb, ref)
        return results

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        self.cache.store.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors, in float64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))
