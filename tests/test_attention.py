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
    return ctx._blockwise(q, *kv.gather(0, slots, kv_len))


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


def test_attention_through_block_tables_gives_the_slot_caches_bits():
    """The same keys as shuffled blocks of 16 positions (garbage past every row's blocks): decode
    attention (deterministic mode's blockwise, and the default mode's SDPA) and a prefill's write
    then attend read them through the block tables and give the slot cache's bits."""
    from tests.interpret_decode_attention import paged

    kv, q, slots = _setup()
    g = torch.Generator().manual_seed(1)
    blocks = KVCache.paged(1, ROWS + 2, KVH, MAX, D, torch.float32, torch.device("cpu"),
                           num_blocks=(ROWS + 2) * MAX // 16, block_size=16)
    kb, vb, table = paged(kv.k_gpu[0], kv.v_gpu[0], 16, g)
    blocks.k_gpu[0], blocks.v_gpu[0] = kb, vb
    blocks.table_gpu.copy_(table[:, : blocks.table_gpu.shape[1]])
    assert torch.equal(_attend(blocks, q, slots, MAX), _attend(kv, q, slots, MAX))
    for cache in (kv, blocks):
        assert torch.equal(cache.gather(0, slots, 700)[1], kv.v_gpu[0][slots, :, :700])
    # a prefill of 3 positions from position 100 (keys before it in the cache), then its decode SDPA
    k_new, v_new = torch.randn(2, ROWS, KVH, 3, D, generator=g)
    outs = []
    for cache in (kv, blocks):
        ctx = AttentionContext(kv=cache, is_prefill=True, slots_gpu=slots,
                               positions_gpu=torch.arange(100, 103).expand(ROWS, 3), mask_gpu=None, kv_len=103,
                               mask_fn=lambda: torch.ones(ROWS, 1, 3, 103, dtype=torch.bool), prefix_len=100)
        qp = torch.randn(ROWS, HEADS, 3, D, generator=torch.Generator().manual_seed(2))
        outs.append(ctx.attend(0, qp, k_new, v_new))
        dec = AttentionContext(kv=cache, is_prefill=False, slots_gpu=slots, positions_gpu=torch.full((ROWS, 1), 103),
                               mask_gpu=torch.ones(ROWS, 1, 1, 104, dtype=torch.bool), kv_len=104)
        outs.append(dec.attend(0, q, k_new[:, :, :1], v_new[:, :, :1]))
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    assert torch.equal(blocks.gather(0, slots, 104)[0], kv.k_gpu[0][slots, :, :104])
