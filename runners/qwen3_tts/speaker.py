"""The Base checkpoints' speaker encoder: 24 kHz audio -> x-vector [enc_dim] (ECAPA-TDNN).

As the reference's ``extract_speaker_embedding``:
  audio [n] -> reflect-pad (n_fft - hop) / 2 each side -> |STFT| (n_fft 1024, hop 256, periodic
  Hann, not centred; magnitude sqrt(re^2 + im^2 + 1e-9)) -> 128 mel bands (librosa's Slaney
  filterbank, 0-12 kHz) -> log(max(., 1e-5))                                   [frames, 128]
  -> a TDNN, SE-Res2Net blocks, multi-layer aggregation of their outputs, attentive statistics
     pooling, a 1x1 conv                                                          [enc_dim]
The filterbank is librosa.filters.mel's arithmetic in numpy (librosa is not a runtime
dependency; a test holds the two equal). Module names equal the checkpoint's under
``speaker_encoder.`` in model.safetensors.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import SpeakerEncoderConfig

N_FFT, HOP, WIN, FMIN, FMAX = 1024, 256, 1024, 0.0, 12000.0  # the reference's mel settings


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asanyarray(f, dtype=np.float64)
    sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / sp, np.log(6.4) / 27.0
    mels = f / sp
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-300) / min_log_hz) / logstep, mels)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), sp * m)


def mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) (htk False, Slaney norm, float32):
    triangles between consecutive mel points, each scaled to unit area."""
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fft_freqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2: n_mels + 2] - mel_f[:n_mels]))[:, np.newaxis]
    return weights


def log_mel(audio: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """audio [B, n] float32 -> log mel [B, n_mels, frames] (the reference's mel_spectrogram)."""
    pad = (N_FFT - HOP) // 2
    y = F.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(WIN, device=audio.device)
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WIN, window=window, center=False,
                      normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, mag), min=1e-5))


class _TDNN(nn.Module):
    """Conv1d ('same' length, reflect padding) then ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class _Res2Net(nn.Module):
    """Channels in `scale` groups: the first passes; group i > 0 is TDNN(group i + output of i - 1)."""

    def __init__(self, cin: int, cout: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(_TDNN(cin // scale, cout // scale, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                out = part
            elif i == 1:
                out = self.blocks[0](part)
            else:
                out = self.blocks[i - 1](part + out)
            outs.append(out)
        return torch.cat(outs, dim=1)


class _SqueezeExcite(nn.Module):
    def __init__(self, cin: int, se: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv1d(cin, se, 1, padding="same", padding_mode="reflect")
        self.conv2 = nn.Conv1d(se, cout, 1, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class _SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = _TDNN(cin, cout, 1, 1)
        self.res2net_block = _Res2Net(cout, cout, scale, kernel, dilation)
        self.tdnn2 = _TDNN(cout, cout, 1, 1)
        self.se_block = _SqueezeExcite(cout, se, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class _AttentiveStatsPool(nn.Module):
    """Per-channel mean and std over time, weighted by a learnt attention that sees the global
    (uniformly weighted) mean and std beside each frame. [B, C, T] -> [B, 2C, 1]."""

    def __init__(self, channels: int, attention: int):
        super().__init__()
        self.tdnn = _TDNN(channels * 3, attention, 1, 1)
        self.conv = nn.Conv1d(attention, channels, 1, padding="same", padding_mode="reflect")

    @staticmethod
    def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        ones = torch.ones((x.shape[0], 1, t), dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, ones / ones.sum(dim=2, keepdim=True))  # every frame valid, as the reference
        ctx = torch.cat([x, mean.unsqueeze(2).repeat(1, 1, t), std.unsqueeze(2).repeat(1, 1, t)], dim=1)
        attn = F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = self._stats(x, attn)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [_TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(_SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = _TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = _AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1, padding="same", padding_mode="reflect")
        # float32 always (not a buffer: a module cast to 16 bits must not round it)
        self.mel_basis = torch.from_numpy(mel_filters(cfg.sample_rate, N_FFT, cfg.mel_dim, FMIN, FMAX))

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels [B, frames, mel_dim] -> x-vectors [B, enc_dim]."""
        h = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        h = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio: np.ndarray) -> torch.Tensor:
        """One mono float32 clip at cfg.sample_rate -> its x-vector [enc_dim] (on this module's
        device and dtype; the mel front end runs in float32)."""
        p = next(self.parameters())
        wav = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))[None].to(p.device)
        mels = log_mel(wav, self.mel_basis.to(p.device, torch.float32)).transpose(1, 2)
        return self(mels.to(p.dtype))[0]
