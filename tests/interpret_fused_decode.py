"""The fused CUDA decode path against the plain PyTorch one, in Triton's CPU interpreter.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1.
One random model (head_dim 16: tl.dot needs 16), copied: the copy runs decode
through fused QKV / gate-up GEMMs, add_rmsnorm, rope_kv_write, silu_mul and
the decode-attention kernel (prefill: causal SDPA over the keys the fused
path wrote to the cache); the original through the plain modules with
PyTorch attention. Three rows of different lengths, one with audio-position
tokens among its text (the dual FFN routes per token), prefill then decode
steps through the padded (uncaptured) graph path; logits must agree in float32.
Also the codec's fused Snake activation against transformers' Snake1d, and
its masked form (zero past each row's length) against Snake1d then zeros,
and the tiny codec's masked batch decode through it against the plain one.
"""

from __future__ import annotations

import copy
import dataclasses
import sys

import torch

from tests.interpret_decode_attention import _patch_interpreter_scalars


def main() -> int:
    _patch_interpreter_scalars()
    import runners.attention as attention
    import runners.cuda_graphs as cuda_graphs
    from runners.attention import KVCache
    from runners.engine import Engine, ForwardBatch
    from runners.higgs_audio_v2.model import HiggsAudioV2LM
    from runners.higgs_audio_v2.shapes import shape_config

    cfg = dataclasses.replace(shape_config("tiny-higgs-audio-v2"), hidden_size=64, intermediate_size=96,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=16)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    plain = HiggsAudioV2LM(cfg, 64).eval()
    fused = copy.deepcopy(plain)

    def engine(model):
        kv = KVCache(cfg.num_hidden_layers, 5, cfg.num_key_value_heads, 64, cfg.head_dim, torch.float32, cpu)
        e = Engine(model, kv, cpu)
        e.use_graphs(capture=False)
        return e

    e_plain = engine(plain)
    # from here on the CPU counts as a device with the kernels (they run interpreted)
    attention.fused_kernels_available = cuda_graphs.fused_kernels_available = lambda device: True
    fused.to_runtime(cpu, torch.float32)
    assert fused.fused
    e_fused = engine(fused)
    assert e_fused.graphs.kernel and not e_plain.graphs.kernel

    g = torch.Generator().manual_seed(1)
    lens, slots = [5, 9, 3], torch.tensor([2, 0, 3])
    t = max(lens)
    ids = torch.randint(0, cfg.audio_bos_token_id - 16, (3, t), generator=g)
    # row b mixes in audio-position tokens: its norms and MLPs route per token (TokenSplit)
    ids[1, 2], ids[1, 5:7] = cfg.audio_token_id, cfg.audio_delay_token_id
    worst = 0.0
    for step in range(7):
        if step == 0:
            fb = dict(is_prefill=True, lengths_cpu=lens, positions_gpu=torch.arange(t).expand(3, t),
                      model_inputs={"input_ids": ids})
        else:
            pos = [n + step - 1 for n in lens]
            codes = torch.randint(0, cfg.codebook_size, (3, 1, cfg.num_codebooks), generator=g)
            fb = dict(is_prefill=False, lengths_cpu=[p + 1 for p in pos], positions_gpu=torch.tensor(pos)[:, None],
                      model_inputs={"audio_codes": codes})
        out = [e.forward(ForwardBatch(rids=["a", "b", "c"], slots_gpu=slots, steps_cpu=[step] * 3,
                                      steps_gpu=torch.full((3,), step), **fb)) for e in (e_plain, e_fused)]
        err = ((out[1] - out[0]).abs().max() / out[0].abs().max()).item()
        worst = max(worst, err)
    print(f"max relative logit difference {worst:.2e}")
    return 0 if worst < 1e-5 and _snake_matches() and _masked_codec_matches() else 1


def _masked_codec_matches() -> bool:
    """The tiny codec's padded, masked batch decode with the fused (masking) Snake kernels
    against the same decode with transformers' Snake1d and a multiply (float32)."""
    from transformers.models.dac.modeling_dac import Snake1d

    from runners.higgs_audio_v2.codec import HiggsCodecDecoder, _FusedSnake1d
    from tests.conftest import TINY

    plain = HiggsCodecDecoder.load(TINY / "codec", torch.float32, torch.device("cpu"))
    fused = copy.deepcopy(plain)
    for m in fused.acoustic_decoder.modules():
        if isinstance(m, Snake1d):
            m.__class__ = _FusedSnake1d
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 1024, (2, plain.num_quantizers, 12), generator=g)
    lengths = torch.tensor([12, 7])
    want, got = plain.decode(codes, lengths), fused.decode(codes, lengths)
    hop = plain.hop_length
    err = max((got[i, : n * hop] - want[i, : n * hop]).abs().max().item() for i, n in enumerate(lengths.tolist()))
    print(f"masked codec batch, fused against plain: max abs difference {err:.2e}")
    return err < 1e-5


def _snake_matches() -> bool:
    """The codec's fused Snake against transformers' Snake1d (float32)."""
    from transformers.models.dac.modeling_dac import Snake1d

    from runners.fused_ops import snake

    g = torch.Generator().manual_seed(2)
    ref = Snake1d(5)
    with torch.no_grad():
        ref.alpha.copy_(torch.rand(1, 5, 1, generator=g) * 2 + 0.1)
    x = torch.randn(2, 5, 1500, generator=g) * 3  # T not a multiple of the block
    want = ref(x).detach()
    err = (snake(x, ref.alpha.detach()) - want).abs().max().item()
    # masked (the codec's padded batches): zero from lengths[b] * rate on, even over inf
    lengths, rate = torch.tensor([100, 37]), 8
    x[1, :, 37 * rate:] = float("inf")
    keep = (torch.arange(1500)[None, :] < lengths[:, None] * rate)[:, None, :]
    masked = snake(x, ref.alpha.detach(), lengths, rate)
    err_masked = (masked - torch.where(keep, want, 0.0)).abs().max().item()
    print(f"snake max abs difference {err:.2e}, masked {err_masked:.2e}")
    return err < 1e-5 and err_masked < 1e-5


if __name__ == "__main__":
    sys.exit(main())
