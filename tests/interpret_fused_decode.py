"""The fused CUDA decode path against the plain PyTorch one, in Triton's CPU interpreter.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1.
One random model (head_dim 16: tl.dot needs 16), copied: the copy runs decode
through fused QKV / gate-up GEMMs, add_rmsnorm, rope_kv_write, silu_mul and
the decode-attention kernel (prefill: causal SDPA over the keys the fused
path wrote to the cache); the original through the plain modules with
PyTorch attention. Three rows of different lengths, one with audio-position
tokens among its text (the dual FFN routes per token), prefill then decode
steps through the padded (uncaptured) graph path with the fused GEMMs, and
the second row fed alone through the one-row GEMVs (runners/fused_gemv.py);
logits must agree in float32. The decode's three rows take the gate/up
kernel (runners/fused_mm.py), the prefill's text tokens cuBLAS and silu_mul. The GEMV and
mm kernels alone, with each fused neighbour, against their unfused
composition at sizes that are no multiple of their tiles.
Also the codec's fused Snake activation against transformers' Snake1d, and
its masked form (zero past each row's length) against Snake1d then zeros;
the tiny codec with its fused kernels (those Snakes, the residual-unit kernel)
against the modules, masked batch and whole row; and in float16 at a
512-channel decoder, every width the unit kernel takes.
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
    e_gemv = engine(copy.deepcopy(fused))  # fed row 1 alone: the one-row GEMV path
    assert fused._gemv_rows(1) and not fused._gemv_rows(2)

    g = torch.Generator().manual_seed(1)
    lens, slots = [5, 9, 3], torch.tensor([2, 0, 3])
    t = max(lens)
    ids = torch.randint(0, cfg.audio_bos_token_id - 16, (3, t), generator=g)
    # row b mixes in audio-position tokens: its norms and MLPs route per token (TokenSplit)
    ids[1, 2], ids[1, 5:7] = cfg.audio_token_id, cfg.audio_delay_token_id
    worst = 0.0
    # a wide one-matrix tile: the interpreter runs program by program, and the head's 8,208 rows at
    # the shipped 4-row tile take minutes (the checks after this loop run the shipped tiles)
    import runners.fused_gemv as fused_gemv

    shipped_tile, fused_gemv.TILE = fused_gemv.TILE, (128, 64, 4, 64)
    import runners.fused_mm as fused_mm

    shipped_rows = fused_mm.MAX_ROWS
    for step in range(7):
        # the prefill's 24 text tokens through cuBLAS and silu_mul (its 3 audio-position tokens,
        # routed to the audio MLP, and the one-row engine's prefill through fused_mm), the
        # decode's 3 rows through fused_mm
        fused_mm.MAX_ROWS = 16 if step == 0 else shipped_rows
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
        one = {**fb, "lengths_cpu": fb["lengths_cpu"][1:2], "positions_gpu": fb["positions_gpu"][1:2],
               "model_inputs": {name: v[1:2] for name, v in fb["model_inputs"].items()}}
        out.append(e_gemv.forward(ForwardBatch(rids=["b"], slots_gpu=slots[1:2], steps_cpu=[step],
                                               steps_gpu=torch.full((1,), step), **one)))
        for got, want in ((out[1], out[0]), (out[2], out[0][1:2])):
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    fused_gemv.TILE = shipped_tile
    print(f"max relative logit difference (fused GEMMs, GEMVs) {worst:.2e}")
    ok = worst < 3e-6 and _gemv_matches() and _mm_matches()
    return 0 if ok and _snake_matches() and _masked_codec_matches() and _half_codec_matches() else 1


def _mm_matches() -> bool:
    """fused_mm.mm, plain and with silu * up, against PyTorch (float32) at row counts on both
    sides of the 16-row tile and column counts that are no multiple of the tiles."""
    import torch.nn.functional as F

    from runners.fused_mm import mm

    g = torch.Generator().manual_seed(6)
    n, k = 37, 96  # k: three 32-column steps at the small tile, one 32-wide step at the shipped one
    w = torch.randn(2 * n, k, generator=g)
    worst = 0.0
    for m in (3, 17):
        x = torch.randn(m, k, generator=g)
        for tile in (None, (16, 32, 4, 2)):
            for got, want in ((mm(x, w[:n], tile=tile), F.linear(x, w[:n])),
                              (mm(x, w, silu_mul=True, tile=tile), F.silu(F.linear(x, w[:n])) * F.linear(x, w[n:]))):
                assert got.shape == want.shape
                worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    print(f"mm against PyTorch: max relative difference {worst:.2e}")
    return worst < 1e-5


def _gemv_matches() -> bool:
    """gemv with each of its fused neighbours against PyTorch (float32), at the shipped tile and at
    two that loop over k after a first tile of their own width and of four times it."""
    import torch.nn.functional as F

    from runners.fused_gemv import gemv
    from runners.higgs_audio_v2.model import RMSNorm

    g = torch.Generator().manual_seed(4)
    n, k = 37, 100  # no multiple of the tiles' 8 rows and 32..1024 columns
    x, res = torch.randn(1, k, generator=g), torch.randn(1, n, generator=g)
    w, w2 = torch.randn(n, k, generator=g), torch.randn(2 * n, k, generator=g)
    norm = RMSNorm(k, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=g) + 0.5)
    h = norm(x).detach()
    nw = (norm.weight.detach(), 1e-5)
    cases = {
        "plain": (lambda t: gemv(x, w, tile=t), F.linear(x, w)),
        "norm": (lambda t: gemv(x, w, norm=nw, tile=t), F.linear(h, w)),
        "residual": (lambda t: gemv(x, w, residual=res, tile=t), res + F.linear(x, w)),
        "norm, silu * up": (lambda t: gemv(x, w2, norm=nw, silu_mul=True, tile=t),
                            F.silu(F.linear(h, w2[:n])) * F.linear(h, w2[n:])),
    }
    worst = 0.0
    for name, (run, want) in cases.items():
        for tile in (None, (8, 32, 4, 32), (8, 16, 4, 64)):
            got = run(tile)
            assert got.shape == want.shape, name
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    print(f"gemv against PyTorch: max relative difference {worst:.2e}")
    return worst < 1e-5 and _qkv_rope_matches()


def _qkv_rope_matches() -> bool:
    """qkv_rope against gemv (norm) then rope_kv_write: the same q and the same cache writes."""
    from runners.fused_gemv import gemv, qkv_rope
    from runners.fused_ops import rope_kv_write

    g = torch.Generator().manual_seed(5)
    h, kvh, d, k, length = 6, 2, 16, 100, 20
    x, w = torch.randn(1, k, generator=g), torch.randn((h + 2 * kvh) * d, k, generator=g)
    nw = (torch.rand(k, generator=g) + 0.5, 1e-5)
    ang = torch.rand(length, d, generator=g) * 6
    pos, slot = torch.tensor([13]), torch.tensor([2])
    base = [torch.randn(4, kvh, length, d, generator=g) for _ in range(2)]  # k and v caches
    caches = [[c.clone() for c in base] for _ in range(2)]  # for the reference, for qkv_rope
    want = rope_kv_write(gemv(x, w, norm=nw), ang.cos(), ang.sin(), pos, slot, *caches[0], h, kvh)
    worst = 0.0
    for tile in (None, (4, 32, 4, 32), (4, 16, 4, 64)):
        got = qkv_rope(x, w, nw, ang.cos(), ang.sin(), pos, slot, *caches[1], h, kvh, tile=tile)
        for a, b in ((got, want), *zip(caches[1], caches[0])):
            worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
    print(f"qkv_rope against gemv then rope_kv_write: max relative difference {worst:.2e}")
    return worst < 1e-5


def _masked_codec_matches() -> bool:
    """The tiny codec with its fused kernels (the masking Snakes; the unit kernel at its 32
    channels, dilations 1, 3 and 9) against the modules' forward (float32): a padded, masked
    batch against the plain masked decode, and one row whole."""
    from runners.higgs_audio_v2.codec import HiggsCodecDecoder, _FusedResidualUnit, use_fused_kernels
    from tests.conftest import TINY

    plain = HiggsCodecDecoder.load(TINY / "codec", torch.float32, torch.device("cpu"))
    fused = copy.deepcopy(plain)
    use_fused_kernels(fused.acoustic_decoder)
    widths = sorted(m.conv1.in_channels for m in fused.modules() if isinstance(m, _FusedResidualUnit))
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 1024, (2, plain.num_quantizers, 12), generator=g)
    lengths = torch.tensor([12, 7])
    want, got = plain.decode(codes, lengths), fused.decode(codes, lengths)
    hop = plain.hop_length
    err = max((got[i, : n * hop] - want[i, : n * hop]).abs().max().item() for i, n in enumerate(lengths.tolist()))
    whole = (fused.decode(codes[1:, :, :7]) - plain.decode(codes[1:, :, :7])).abs().max().item()
    print(f"codec, fused (units at {widths} channels) against the modules: masked batch {err:.2e}, "
          f"a whole row {whole:.2e} (max abs difference)")
    return widths == [32] * 3 and err < 1e-5 and whole < 1e-5


def _half_codec_matches() -> bool:
    """The fused codec in float16 (the interpreter's 16-bit dot; its bf16 dot is broken) at a
    decoder of 512 channels (units of 256 to 16: the kernel takes 128, 64 and 32) within twice
    the modules' own float16 distance from their float32 decode."""
    from pathlib import Path

    from runners.higgs_audio_v2.codec import HiggsCodecDecoder, _FusedResidualUnit, use_fused_kernels
    from tests.tiny_checkpoint import tiny_codec_config

    torch.manual_seed(0)
    cfg = tiny_codec_config()
    cfg.acoustic_model_config.decoder_hidden_size = 512
    dec = HiggsCodecDecoder(cfg.to_dict(), Path("codec")).eval()
    with torch.no_grad():
        for q in dec.quantizer.quantizers:  # spread codebooks (their init is zeros)
            q.codebook.embed.normal_()
    codes = torch.randint(0, 1024, (1, 8, 12))
    want = dec.decode(codes)
    half = copy.deepcopy(dec).to(torch.float16)
    plain_err = (half.decode(codes) - want).abs().max() / want.abs().max()
    use_fused_kernels(half.acoustic_decoder)
    widths = sorted({m.conv1.in_channels for m in half.modules() if isinstance(m, _FusedResidualUnit)})
    err = (half.decode(codes) - want).abs().max() / want.abs().max()
    print(f"codec, fused, in float16: {err:.2e} off float32 (the modules in float16: {plain_err:.2e})")
    return widths == [32, 64, 128] and bool(err <= 2 * plain_err)


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
