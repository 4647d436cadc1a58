"""KV budget: how many requests run at once when device memory is the limit."""

from __future__ import annotations

from runners.device import kv_slots_within

MIB = 1 << 20


def test_all_wanted_slots_when_they_fit():
    assert kv_slots_within(free_bytes=100 * MIB + 65 * 10 * MIB, per_slot_bytes=10 * MIB, wanted=64,
                           headroom=100 * MIB) == 64


def test_fewer_slots_when_memory_is_short():
    # 10 slots' worth past the headroom: 9 for requests, 1 for the padding rows
    assert kv_slots_within(free_bytes=100 * MIB + 10 * 10 * MIB + 5 * MIB, per_slot_bytes=10 * MIB, wanted=64,
                           headroom=100 * MIB) == 9


def test_no_slot_when_not_even_one_fits():
    assert kv_slots_within(free_bytes=50 * MIB, per_slot_bytes=10 * MIB, wanted=64, headroom=100 * MIB) == 0
