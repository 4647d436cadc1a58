"""Deterministic decode attention: exact running softmax over fixed key blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omni_cli.runners.attention import DET_KEY_BLOCK, AttentionContext, KVCache, kv_bucket

ROWS, HEADS, KVH, D, MAX = 5, 6, 2, 16, 4 * DET_KEY_BLOCK
LENS = torch.tensor([1, 200, 256, 257, 700])


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = KVCache(1, ROWS + 2, KVH, MAX, D, torch.float32, torch.device("cpu"))
    kv.k_gpu.normal_(generator=g)
    kv.v_gpu.normal_(generator=g)
    q = torch.randn(ROWS, HEADS, 1, D, generator=g)
    slots = torch.tensor([3, 0, 6, 1, 4])  # scattered over the cache
    return kv, q, slots


def _attend(kv, q, slots, kv_len):
    mask = (torch.arange(kv_len)[None, :] < LENS[:, None])[:, None, None]
    ctx = AttentionContext(kv=kv, is_prefill=False, slots_gpu=slots, positions_gpu=(LENS - 1)[:, None],
                           mask_gpu=mask, kv_len=kv_len, deterministic=True)
    return ctx._blockwise(q, kv.k_gpu[0], kv.v_gpu[0])


def test_blockwise_equals_attention():
    kv, q, slots = _setup()
    got = _attend(kv, q, slots, MAX)
    keys, values = kv.k_gpu[0][slots], kv.v_gpu[0][slots]
    rep = HEADS // KVH
    mask = (torch.arange(MAX)[None, :] < LENS[:, None])[:, None, None]
    want = F.scaled_dot_product_attention(q, keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1),
                                          attn_mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_masked_key_blocks_change_no_bit():
    """Attending over more key positions (masked, holding garbage) gives the same bits."""
    kv, q, slots = _setup()
    short = _attend(kv, q, slots, 3 * DET_KEY_BLOCK)  # covers the longest row (700)
    kv.k_gpu[0][:, :, 700:] = 1e4  # beyond every row's length
    kv.v_gpu[0][:, :, 700:] = -3e3
    assert torch.equal(_attend(kv, q, slots, MAX), short)


def test_kv_bucket():
    assert kv_bucket(1, 2048) == DET_KEY_BLOCK == 256
    assert kv_bucket(257, 2048) == 512 and kv_bucket(1025, 2048) == 2048 and kv_bucket(1025, 1500) == 1500
