"""walk_send_queue: index wrap, ring wrap, problems reported (never guessed), coalesced ranges."""
from __future__ import annotations

import pytest

from sigmatrace import mlx5
from sigmatrace.mlx5 import Opcode

pytestmark = pytest.mark.sim

QPN = 0x123


def write(idx, nbytes=64):
    return mlx5.build_wqe(Opcode.RDMA_WRITE, idx, QPN, raddr=0x1000, rkey=7, sgl=[(nbytes, 1, 0x2000)])


def masked_cs8(idx):   # 2 WQEBBs (ref §1.7)
    return mlx5.build_wqe(Opcode.ATOMIC_MASKED_CS, idx, QPN, raddr=0x1000, rkey=7, atomic_size=8,
                          swap_add=1, compare=2, swap_add_mask=3, compare_mask=4, sgl=[(8, 1, 0x3000)])


def post(ring, log, pi, builders):
    """Post WQEs from ``pi`` the way a poster does; returns the new producer index."""
    for build in builders:
        wqe = build(pi)
        mlx5.write_wqe_to_ring(ring, log, pi, wqe)
        pi = (pi + len(wqe) // 64) & 0xFFFF
    return pi


def test_wrap_of_the_16_bit_index():
    log, ring = 4, bytearray(16 * 64)
    end = post(ring, log, 0xFFFE, [write] * 5)
    assert end == 0x0003
    r = mlx5.walk_send_queue(ring, log, 0xFFFE, 0x0003)
    assert r.ok and r.complete
    assert [w.wqe_index for w in r.wqes] == [0xFFFE, 0xFFFF, 0x0000, 0x0001, 0x0002]
    assert [w.slot for w in r.wqes] == [14, 15, 0, 1, 2]


def test_two_wqebb_wqe_crossing_the_ring_end():
    log, ring = 3, bytearray(8 * 64)
    end = post(ring, log, 0x0105, [write, write, masked_cs8, write])   # masked CS at slot 7 -> slot 0
    r = mlx5.walk_send_queue(ring, log, 0x0105, end)
    assert r.ok and r.complete
    cs = r.wqes[2]
    assert (cs.slot, cs.num_wqebbs, cs.atomic.compare_mask) == (7, 2, 4)
    assert cs.data_segments == [(8, 1, 0x3000)]        # the data segment was read from slot 0
    assert r.wqes[3].slot == 1 and r.wqebbs_decoded == 5


def test_inconsistent_slot_is_reported_not_guessed():
    log, ring = 3, bytearray(8 * 64)
    end = post(ring, log, 10, [write] * 4)
    ring[4 * 64 + 2] ^= 0x40        # corrupt the wqe_index of the WQE at index 12 (slot 4)
    r = mlx5.walk_send_queue(ring, log, 10, end)
    assert [w.wqe_index for w in r.wqes] == [10, 11]
    assert not r.ok and not r.complete
    assert [(p.kind, p.index, p.slot) for p in r.problems] == [("index_mismatch", 12, 4)]


def test_zero_ds_and_overrun_and_unknown_opcode():
    log, ring = 3, bytearray(8 * 64)
    end = post(ring, log, 0, [write, masked_cs8, write])
    r = mlx5.walk_send_queue(ring, log, 0, 2)          # to_pi splits the 2-WQEBB WQE
    assert [p.kind for p in r.problems] == ["overrun"] and len(r.wqes) == 1
    bad = bytearray(ring)
    bad[3 * 64 + 7] = 0                                # DS of the WQE at index 3
    r = mlx5.walk_send_queue(bad, log, 0, end)
    assert [p.kind for p in r.problems] == ["zero_ds"] and len(r.wqes) == 2
    bad = bytearray(ring)
    bad[1 * 64 + 3] = 0x07                             # opcode 0x07 is not in the table
    r = mlx5.walk_send_queue(bad, log, 0, end)
    assert [p.kind for p in r.problems] == ["decode_error"]
    assert [w.wqe_index for w in r.wqes] == [0, 3]     # its DS is consistent: the walk goes on


def test_qpn_mismatch_and_range_larger_than_ring():
    log, ring = 3, bytearray(8 * 64)
    end = post(ring, log, 0, [write] * 3)
    r = mlx5.walk_send_queue(ring, log, 0, end, qpn=0x999)
    assert [p.kind for p in r.problems] == ["qpn_mismatch"] * 3 and not r.wqes
    r = mlx5.walk_send_queue(ring, log, 0, 9)
    assert [p.kind for p in r.problems] == ["range_too_large"] and not r.wqes


def test_empty_range():
    ring = bytearray(8 * 64)
    for pi in (0, 0x7FFF, 0xFFFF):
        r = mlx5.walk_send_queue(ring, 3, pi, pi)
        assert r.ok and r.complete and r.wqes == []


def test_coalesced_doorbell_covers_many_wqes():
    """One doorbell announcing many WQEs (NVSHMEM batches up to 32, ref §5.4) over several
    passes of the ring, with the 16-bit index wrapping on the way."""
    log, ring = 6, bytearray(64 * 64)
    pi = 0xFF00
    for _ in range(5):                                 # earlier passes leave stale WQEs behind
        pi = post(ring, log, pi, [write] * 20)
    start = pi
    kinds = [write, masked_cs8, write, write, masked_cs8] * 8  # 40 WQEs, 56 WQEBBs
    end = post(ring, log, start, kinds)
    db = mlx5.parse_doorbell(mlx5.doorbell_bytes(end, QPN, "nvshmem"))
    r = mlx5.walk_send_queue(ring, log, start, db.end_index, qpn=db.qpn)
    assert r.ok and r.complete and len(r.wqes) == 40
    assert sum(w.num_wqebbs for w in r.wqes) == 56 == (end - start) & 0xFFFF
    assert [w.opcode for w in r.wqes[:5]] == [Opcode.RDMA_WRITE, Opcode.ATOMIC_MASKED_CS,
                                              Opcode.RDMA_WRITE, Opcode.RDMA_WRITE, Opcode.ATOMIC_MASKED_CS]


def test_ring_argument_checks():
    with pytest.raises(ValueError):
        mlx5.walk_send_queue(bytearray(100), 3, 0, 1)
    with pytest.raises(ValueError):
        mlx5.parse_wqe(bytearray(8 * 64), 32, ring_size=8 * 64)   # not a slot boundary
