"""The CUDA kernels (attention, fused norm/rope/silu path, batch-1 GEMVs, the draw, Higgs
masks and publish, the codec's Snake and residual units, Qwen3-TTS's fused frame), checked on
the CPU in Triton's interpreter."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")


# longest first (the background thread's order): the checks left when the suite's own tests end, short, share the cores
@pytest.mark.parametrize("script", ["interpret_fused_codec", "interpret_invariant_decode", "interpret_fused_draw",
                                    "interpret_qwen3_decode", "interpret_fused_decode", "interpret_cascade_attention",
                                    "interpret_decode_attention", "interpret_higgs_step", "interpret_invariant_mm"])
def test_kernels_in_interpreter(script):
    from tests import background

    res = background.result(script)  # run on the background thread since collection (tests/background.py)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]


# cascade: 0 none; 1 continue from the group's partials; 2 leave a grouped row's own (joined beside)
@pytest.mark.parametrize("block, warps, cascade", [(32, 2, 0), (64, 4, 0), (64, 4, 1), (32, 2, 2), (64, 4, 2)])
def test_multi_row_attention_compiles_for_hopper(block, warps, cascade):
    """The interpreter runs a kernel as Python, so it misses what only Triton's compiler rejects
    (a variable typed int32 before a loop and int64 inside it, in a version of this kernel, failed
    on the GPU only). Triton compiles for sm_90 without a GPU: the multi-row kernel as the engine
    launches it (int64 slots and lengths, bf16 at the 3B shape's heads), at both of its tiles, with and
    without a cascade's first part, continuing from it or joined beside it; and that first part's kernel
    and the merge (runners/cascade_attention.py)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from omni_cli.runners.cascade_attention import _merge_kernel, _shared_prefix_kernel
    from omni_cli.runners.decode_attention import _decode_attention_kernel

    strides = ("stride_cs", "stride_ch", "stride_ct")
    sig = {**{p: "*bf16" for p in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}, "slots_ptr": "*i64", "lengths_ptr": "*i64",
           "table_ptr": "*i32", "shared_ptr": "*i32", **{p: "*fp32" for p in ("m_part_ptr", "l_part_ptr", "acc_part_ptr")},
           **{s: "i32" for s in ("stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_tb", *strides)},
           "scale": "fp32"}
    consts = {"REP": 3, "REP_PAD": 16, "D": 128, "BLOCK": block, "USE_DOT": True, "PRECISION": "tf32", "BS": 16,
              "PDL": False, "CASCADE": cascade}
    src = ASTSource(_decode_attention_kernel, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
    target = GPUTarget("cuda", 90, 32)
    assert triton.compile(src, target=target, options={"num_warps": warps}).asm["cubin"]
    if cascade:
        sig = {**{p: "*bf16" for p in ("q_ptr", "k_ptr", "v_ptr")}, "slots_ptr": "*i64", "table_ptr": "*i32",
               "tile_rows_ptr": "*i32", "tile_len_ptr": "*i32", **{p: "*fp32" for p in ("m_ptr", "l_ptr", "acc_ptr")},
               **{s: "i32" for s in ("stride_qb", "stride_qh", "stride_tb", *strides)}, "scale": "fp32"}
        consts = {"H": 24, "REP": 3, "ROWS": 16, "M_PAD": 64, "D": 128, "BLOCK": block, "USE_DOT": True,
                  "PRECISION": "tf32", "BS": 16}
        src = ASTSource(_shared_prefix_kernel, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
        assert triton.compile(src, target=target, options={"num_warps": 4}).asm["cubin"]
    if cascade == 2:
        sig = {"out_ptr": "*bf16", "shared_ptr": "*i32", **{p: "*fp32" for p in ("m_a", "l_a", "acc_a", "m_b", "l_b",
                                                                                   "acc_b")},
               "stride_ob": "i32", "stride_oh": "i32"}
        consts = {"H": 24, "H_PAD": 32, "D": 128}
        src = ASTSource(_merge_kernel, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
        assert triton.compile(src, target=target, options={"num_warps": 4}).asm["cubin"]


@pytest.mark.parametrize("kind, rows", [("gate_up", 256), ("down", 256), ("head", 64)])
def test_invariant_projection_compiles_for_hopper_with_tma(kind, rows):
    """Deterministic mode's projection kernel as invariant_mm launches it at the 3B shape, with
    its shipped TMA tiles (gate/up's two tiles, down's k-range partials, the head's float32
    out), compiled for sm_90 without a GPU: it must load through bulk tensor copies and
    multiply on wgmma, which the interpreter cannot show."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from omni_cli.runners.invariant_mm import SPLITS, _inv_mm_kernel, pick_tile

    k = {"gate_up": 3072, "down": 8192, "head": 3072}[kind]
    splits = SPLITS.get(kind, 1)
    bm, bn, bk, warps, stages, tma = pick_tile(rows, kind, k // splits)
    assert tma
    sig = {"x_ptr": f"tensordesc<bf16[{bm}, {bk}]>", "w_ptr": f"tensordesc<bf16[{bn}, {bk}]>", "b_ptr": "*bf16",
           "y_ptr": "*bf16" if kind == "gate_up" else "*fp32", "m": "i32", "n": "i32", "k": "i32", "stride_x": "i32"}
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "HAS_BIAS": False,
              "EPILOGUE": {"gate_up": 2, "down": 3, "head": 0}[kind], "PRECISION": "tf32", "PDL": False,
              "SPLITS": splits, "TMA": True}
    src = ASTSource(_inv_mm_kernel, {**sig, **{c: "constexpr" for c in consts}}, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
                         ).asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma" in ptx


@pytest.mark.parametrize("streams, total", [(8, 8), (3, 8)])
def test_fused_draw_compiles_for_hopper(streams, total):
    """The one-kernel draw as the sampler launches it, a full frame and a subset of its streams
    (a runtime first stream, a constexpr total), compiled for sm_90 without a GPU: the interpreter
    misses what only the compiler rejects."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from omni_cli.runners.sampling.fused_draw import _draw_kernel, blocks

    main, tail = blocks(1026)
    sig = {"scores_ptr": "*fp32", "slots_ptr": "*i64", "steps_ptr": "*i64", "temp_ptr": "*fp32", "top_k_ptr": "*i64",
           "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "seed_ptr": "*i64", "tok_ptr": "*i64", "lp_ptr": "*fp32",
           "hist_ptr": "*i64", "hist_len": "i32", "vocab": "i32", "first": "i32"}
    consts = {"STREAMS": streams, "TOTAL": total, "MAIN": main, "TAIL": tail}
    src = ASTSource(_draw_kernel, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
    assert triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["cubin"]
