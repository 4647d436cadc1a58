"""Run the Triton decode-attention kernel in Triton's CPU interpreter and check it.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1
(the variable must be set before the kernel is defined). The interpreter
computes in float32 here: its bf16 tl.dot gives garbage on the CPU, so bf16
is left to the GPU tests.
"""

from __future__ import annotations

import sys

import torch
import triton.runtime.interpreter as interp


def _patch_interpreter_scalars() -> None:
    # triton 3.6's interpreter keeps a scalar as a 1-element array, and numpy 2
    # refuses int() of one: a loop bound loaded from memory (`range(0, length, B)`)
    # fails in the interpreter only. Read the element instead.
    orig = interp._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched


def _patch_interpreter_calls() -> None:
    # a @triton.jit helper's every call re-runs _patch_lang: nothing left to do in a launch that patched its modules
    import inspect

    import triton.language as tl

    patch_lang, launch = interp._patch_lang, interp.GridExecutor.__call__
    patched: list[set] = []  # per launch under way: the modules its _patch_lang calls patched
    langs: dict = {}  # fn -> the language modules its globals hold (what _patch_lang patches for it)

    def lazy_patch_lang(fn):
        if fn not in langs:
            langs[fn] = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if patched and langs[fn] and langs[fn] <= patched[-1]:
            return interp._LangPatchScope()  # nothing to restore: the launch's scope restores them
        scope = patch_lang(fn)
        if patched:
            patched[-1] |= langs[fn]
        return scope

    def tracked_launch(self, *args, **kwargs):
        patched.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()

    interp._patch_lang = lazy_patch_lang
    interp.GridExecutor.__call__ = tracked_launch


def _patch_interpreter_dot() -> None:
    # the interpreter's tl.dot is numpy's float32 matmul, whose BLAS picks its blocking (and so its
    # rounding) from the tile's shape: the GPU's tensor cores add a row's products in k order
    # whatever the tile. Emulate that: each tile's sum in k order from zero, then added to the
    # accumulator (so a different k step still rounds differently, as the negative control needs).
    import numpy as np

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return orig(self, a, b, d, input_precision, max_num_imprecise_acc)
        x, y = a.data, b.data  # [M, K] @ [K, N] (a leading batch dim too)
        products = x[..., :, :, None] * y[..., None, :, :]  # [M, K, N], each rounded to float32
        tile = np.add.accumulate(products, axis=-2, dtype=np.float32)[..., -1, :]  # in k order, one add at a time
        return interp.TensorHandle((tile + d.data).astype(d.data.dtype), d.dtype.scalar)

    orig = interp.InterpreterBuilder.create_dot
    interp.InterpreterBuilder.create_dot = dot


def _reference(q, kc, vc, slots, lengths):
    """Plain attention per row over its own keys, in float64. q [B, H, 1, D]."""
    b, h, _, d = q.shape
    rep = h // kc.shape[1]
    out = torch.empty(b, h, 1, d, dtype=torch.float64)
    for i in range(b):
        k = kc[slots[i], :, : lengths[i]].double().repeat_interleave(rep, 0)  # [H, n, D]
        v = vc[slots[i], :, : lengths[i]].double().repeat_interleave(rep, 0)
        out[i] = torch.softmax(q[i].double() @ k.transpose(-1, -2) * d ** -0.5, -1) @ v
    return out


def identity(slots_n: int) -> torch.Tensor:
    """The slot cache's block table: slot s is block s."""
    return torch.arange(slots_n, dtype=torch.int32)[:, None]


def paged(kc: torch.Tensor, vc: torch.Tensor, bs: int, g: torch.Generator):
    """The slot cache [S, KVH, L, D] laid out as blocks of bs positions in a shuffled order, plus a
    scratch block of garbage (1e4 keys, NaN values) where every table entry past L points ->
    (k blocks, v blocks, table [S, width + 1] int32)."""
    s, kvh, length, d = kc.shape
    width = -(-length // bs)
    pad = width * bs - length
    k = torch.cat([kc, kc.new_full((s, kvh, pad, d), 1e4)], 2).view(s, kvh, width, bs, d).transpose(1, 2)
    v = torch.cat([vc, vc.new_full((s, kvh, pad, d), float("nan"))], 2).view(s, kvh, width, bs, d).transpose(1, 2)
    order = torch.randperm(s * width, generator=g)  # block j of slot i goes to order[i * width + j]
    kb = torch.empty((s * width + 1, kvh, bs, d))
    vb = torch.empty_like(kb)
    kb[order], vb[order] = k.reshape(-1, kvh, bs, d), v.reshape(-1, kvh, bs, d)
    kb[-1], vb[-1] = 1e4, float("nan")
    table = torch.cat([order.view(s, width), torch.full((s, 1), s * width)], 1).to(torch.int32)
    return kb, vb, table


def _check(decode_attention, block: int, splits: int, d: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    # up to more blocks than a one-row call has programs, so some take two
    slots_n, kvh, max_len, h = 7, 2, (splits + 2) * block + 5, 6  # 3 query heads per KV head, as in Higgs 3B
    kc = torch.randn(slots_n, kvh, max_len, d, generator=g)
    vc = torch.randn(slots_n, kvh, max_len, d, generator=g)
    # lengths on both sides of the key-block edges; slots out of order
    slots = torch.tensor([4, 0, 6, 1, 3])
    lengths = torch.tensor([1, block, block + 1, 2 * block - 1, max_len])
    q = torch.randn(len(slots), 1, h, d, generator=g).transpose(1, 2)  # the model's [B, H, 1, D] view
    out = decode_attention(q, kc, vc, identity(slots_n), slots, lengths)
    err = (out.double() - _reference(q, kc, vc, slots, lengths)).abs().max().item()
    failures = []
    if not err < 1e-5:
        failures.append(f"max abs error {err} against the float64 reference")
    # rows 2 and 3 alone, with their keys' tail changed past their lengths, give the same bits
    garbage = kc.clone(), vc.clone()
    for i in (2, 3):
        garbage[0][slots[i], :, lengths[i]:] = 1e4
        garbage[1][slots[i], :, lengths[i]:] = float("nan")
    alone = decode_attention(q[2:4].contiguous(), *garbage, identity(slots_n), slots[2:4], lengths[2:4])
    if not torch.equal(alone, out[2:4]):
        failures.append("rows 2 and 3 alone (garbage past their lengths) differ from the batch")
    # the same keys in shuffled blocks of 16 and of 8 positions, read through block tables: the same bits
    kb, vb, table = paged(kc, vc, 16, g)
    if not torch.equal(decode_attention(q, kb, vb, table, slots, lengths), out):
        failures.append("the batch through 16-position blocks differs from the slot cache's")
    kb8, vb8, table8 = paged(kc, vc, 8, g)
    if not torch.equal(decode_attention(q, kb8, vb8, table8, slots, lengths), out):
        failures.append("the batch through 8-position blocks differs from the slot cache's")
    # one row: its keys split over programs (runners/decode_attention.py: ONE_ROW_SPLITS), merged by
    # the last to finish; twice each, so a merge counter left behind would show
    for i, n in enumerate([1, block, block + 1, 3 * block + 5, (splits + 1) * block + 3, max_len]):
        one = dict(slots=slots[i % 5: i % 5 + 1], lengths=torch.tensor([n]))
        qi = q[i % 5: i % 5 + 1].contiguous()
        want = _reference(qi, kc, vc, **one)
        g_kc, g_vc = kc.clone(), vc.clone()
        g_kc[one["slots"], :, n:] = 1e4
        g_vc[one["slots"], :, n:] = float("nan")
        for run in range(2):
            got = decode_attention(qi, g_kc, g_vc, identity(slots_n), one["slots"], one["lengths"])
            err = (got.double() - want).abs().max().item()
            if not err < 1e-5:
                failures.append(f"one row of {n} keys, call {run}: max abs error {err}")
        if i % 2 and not torch.equal(decode_attention(qi, kb, vb, table, one["slots"], one["lengths"]), got):
            failures.append(f"one row of {n} keys through blocks differs from the slot cache's")
    return failures


def main() -> int:
    _patch_interpreter_calls()
    _patch_interpreter_scalars()
    import omni_cli.runners.decode_attention as da
    from omni_cli.runners.decode_attention import BLOCK_N, ONE_ROW_SPLITS, decode_attention

    failures = []
    for d in (32, 8):  # tl.dot (head_dim >= 16) and the elementwise path for smaller heads
        failures += [f"head_dim {d}: {f}" for f in _check(decode_attention, BLOCK_N, ONE_ROW_SPLITS, d)]
    # the multi-row kernel at the 32-key blocks and 2 warps a GPU gives some row counts (da._tile;
    # the CPU always gets BLOCK_N); the one-row kernel keeps BLOCK_N
    da._tile = lambda programs, device: (32, 2)
    failures += [f"32-key blocks: {f}" for f in _check(decode_attention, BLOCK_N, ONE_ROW_SPLITS, 32)]
    print("\n".join(failures) or "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
