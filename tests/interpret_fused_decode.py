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
composition at sizes that are no multiple of their tiles. (The codec's
kernels: tests/interpret_fused_codec.py.)
"""

from __future__ import annotations

import copy
import dataclasses
import sys

import torch

from tests.interpret_decode_attention import _patch_interpreter_calls, _patch_interpreter_scalars, paged


def unpaged(blocks: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """Blocks [N, KVH, bs, D] read through table [S, width] -> the slot cache [S, KVH, length, D]."""
    x = blocks[table.long()]  # [S, width, KVH, bs, D]
    s, w, kvh, bs, d = x.shape
    return x.transpose(1, 2).reshape(s, kvh, w * bs, d)[:, :, :length]


def main() -> int:
    _patch_interpreter_calls()
    _patch_interpreter_scalars()
    import omni_cli.runners.attention as attention
    import omni_cli.runners.cuda_graphs as cuda_graphs
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine, ForwardBatch
    from omni_cli.runners.higgs_audio_v2.model import HiggsAudioV2LM
    from omni_cli.runners.higgs_audio_v2.shapes import shape_config

    cfg = dataclasses.replace(shape_config("tiny-higgs-audio-v2"), hidden_size=64, intermediate_size=96,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=16)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    plain = HiggsAudioV2LM(cfg, 64).eval()
    fused = copy.deepcopy(plain)

    def engine(model, blocks: bool = False):
        """Slots of 64 positions, or blocks of 4 (ten a slot, in a shuffled order; slot 4 the spare)."""
        if blocks:
            kv = KVCache.paged(cfg.num_hidden_layers, 5, cfg.num_key_value_heads, 64, cfg.head_dim, torch.float32, cpu,
                               num_blocks=40, block_size=4)
            order = torch.randperm(40, generator=torch.Generator().manual_seed(7)).tolist()
            kv.assign(list(range(4)), [order[slot * 10: (slot + 1) * 10] for slot in range(4)])
        else:
            kv = KVCache(cfg.num_hidden_layers, 5, cfg.num_key_value_heads, 64, cfg.head_dim, torch.float32, cpu)
        e = Engine(model, kv, cpu)
        e.use_graphs(capture=False)
        return e

    e_plain = engine(plain)
    # from here on the CPU counts as a device with the kernels (they run interpreted)
    attention.fused_kernels_available = cuda_graphs.fused_kernels_available = lambda device: True
    fused.to_runtime(cpu, torch.float32)
    assert fused.fused
    e_fused = engine(fused, blocks=True)  # the kernels read and write through block tables
    assert e_fused.graphs.kernel and not e_plain.graphs.kernel
    e_gemv = engine(copy.deepcopy(fused), blocks=True)  # fed row 1 alone: the one-row GEMV path
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
    import omni_cli.runners.fused_gemv as fused_gemv

    shipped_tile, fused_gemv.TILE = fused_gemv.TILE, (128, 64, 4, 64)
    import omni_cli.runners.fused_mm as fused_mm

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
    return 0 if ok else 1


def _mm_matches() -> bool:
    """fused_mm.mm, plain and with silu * up, against PyTorch (float32) at row counts on both
    sides of the 16-row tile and column counts that are no multiple of the tiles."""
    import torch.nn.functional as F

    from omni_cli.runners.fused_mm import mm

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

    from omni_cli.runners.fused_gemv import gemv
    from omni_cli.runners.higgs_audio_v2.model import RMSNorm

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
    from omni_cli.runners.fused_gemv import gemv, qkv_rope
    from omni_cli.runners.fused_ops import rope_kv_write

    g = torch.Generator().manual_seed(5)
    h, kvh, d, k, length = 6, 2, 16, 100, 20
    x, w = torch.randn(1, k, generator=g), torch.randn((h + 2 * kvh) * d, k, generator=g)
    nw = (torch.rand(k, generator=g) + 0.5, 1e-5)
    ang = torch.rand(length, d, generator=g) * 6
    pos, slot = torch.tensor([13]), torch.tensor([2])
    kc, vc = (torch.randn(4, kvh, length, d, generator=g) for _ in range(2))
    ident = torch.arange(4, dtype=torch.int32)[:, None]  # the slot cache: slot s is block s
    want_kv = [kc.clone(), vc.clone()]
    want = rope_kv_write(gemv(x, w, norm=nw), ang.cos(), ang.sin(), pos, slot, *want_kv, ident, h, kvh)
    worst = 0.0
    for tile in (None, (4, 32, 4, 32), (4, 16, 4, 64)):
        kb, vb, table = paged(kc, vc, 8, g)  # qkv_rope writes through a block table
        got = qkv_rope(x, w, nw, ang.cos(), ang.sin(), pos, slot, kb, vb, table, h, kvh, tile=tile)
        for a, b in ((got, want), (unpaged(kb, table, length), want_kv[0]), (unpaged(vb, table, length), want_kv[1])):
            worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
    print(f"qkv_rope against gemv then rope_kv_write: max relative difference {worst:.2e}")
    return worst < 1e-5


if __name__ == "__main__":
    sys.exit(main())
