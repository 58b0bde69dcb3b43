"""decode_wqebbs (bulk, numpy) agrees with parse_wqe (scalar) on thousands of random valid WQEs."""
from __future__ import annotations

import random

import numpy as np
import pytest

from sigmatrace import mlx5
from sigmatrace.mlx5 import Opcode

pytestmark = pytest.mark.sim


def random_wqe(rng: random.Random, idx: int) -> bytes:
    """A random valid WQE built with the encoders (compositions of ref §1.9)."""
    qpn = rng.randrange(1 << 24)
    common = dict(fm_ce_se=rng.choice([0, 0x08, 0x0A, 0x48, 0x80]), imm=rng.randrange(1 << 32),
                  signature=rng.randrange(256))
    remote = dict(raddr=rng.randrange(1 << 64), rkey=rng.randrange(1 << 32))

    def sgl(max_n):
        return [(rng.randrange(1 << 31), rng.randrange(1 << 32), rng.randrange(1 << 64))
                for _ in range(rng.randint(0, max_n))]

    kind = rng.randrange(10)
    if kind == 0:
        return mlx5.build_wqe(Opcode.NOP, idx, qpn, ds=rng.choice([1, 2]), **common)
    if kind in (1, 2):
        op = rng.choice([Opcode.RDMA_WRITE, Opcode.RDMA_WRITE_IMM, Opcode.RDMA_READ])
        if op != Opcode.RDMA_READ and rng.random() < 0.4:
            return mlx5.build_wqe(op, idx, qpn, inline=rng.randbytes(rng.randint(0, 60)), **remote, **common)
        return mlx5.build_wqe(op, idx, qpn, sgl=sgl(6), **remote, **common)
    if kind in (3, 4):
        op = rng.choice([Opcode.SEND, Opcode.SEND_IMM, Opcode.SEND_INVAL])
        if rng.random() < 0.4:
            return mlx5.build_wqe(op, idx, qpn, inline=rng.randbytes(rng.randint(0, 60)), **common)
        return mlx5.build_wqe(op, idx, qpn, sgl=sgl(7), **common)
    if kind == 5:
        return mlx5.build_wqe(Opcode.DUMP, idx, qpn, sgl=[(1, 5, rng.randrange(1 << 64))], **common)
    if kind == 6:
        op = rng.choice([Opcode.ATOMIC_CS, Opcode.ATOMIC_FA])
        return mlx5.build_wqe(op, idx, qpn, swap_add=rng.randrange(1 << 64), compare=rng.randrange(1 << 64),
                              sgl=[(8, 1, rng.randrange(1 << 64))], **remote, **common)
    if kind in (7, 8):
        op = rng.choice([Opcode.ATOMIC_MASKED_CS, Opcode.ATOMIC_MASKED_FA])
        opmod = rng.choice([0x00, 0x08, 0x09])
        width = 32 if opmod == 0x08 else 64
        vals = {k: rng.randrange(1 << width) for k in
                ("swap_add", "compare", "swap_add_mask", "compare_mask", "field_boundary")}
        return mlx5.build_wqe(op, idx, qpn, opmod=opmod, sgl=[(width // 8, 1, rng.randrange(1 << 64))],
                              **vals, **remote, **common)
    op = rng.choice(sorted(mlx5.layouts.OPAQUE_OPCODES))
    return mlx5.build_wqe(op, idx, qpn, payload=rng.randbytes(16 * rng.randint(0, 5)), **common)


def expected_row(w: mlx5.WQE) -> dict:
    a = w.atomic
    pointers = w.data_segments
    first = pointers[0] if pointers else (0, 0, 0)
    return dict(opcode=w.opcode, opmod=w.opmod, wqe_index=w.wqe_index, qpn=w.qpn, ds=w.ds,
                signature=w.signature, fm_ce_se=w.fm_ce_se, imm=w.imm, num_wqebbs=w.num_wqebbs,
                has_raddr=w.raddr is not None, raddr=w.raddr or 0, rkey=w.rkey or 0,
                num_data_segments=len(pointers), dseg_byte_count=first[0], dseg_lkey=first[1],
                dseg_addr=first[2], inline=w.inline_data is not None,
                inline_len=len(w.inline_data) if w.inline_data is not None else 0,
                atomic_size=a.size if a else 0, atomic_swap_add=a.swap_add if a else 0,
                atomic_compare=(a.compare or 0) if a else 0, total_bytes=w.total_bytes)


def test_vectorised_equals_scalar_on_random_wqes():
    rng = random.Random(1234)
    first_index = 0xFF80            # the 16-bit index wraps inside the batch
    chunks, idx = [], first_index
    for _ in range(3000):
        wqe = random_wqe(rng, idx)
        chunks.append(wqe)
        idx = (idx + len(wqe) // 64) & 0xFFFF
    buf = b"".join(chunks)
    table = mlx5.decode_wqebbs(np.frombuffer(buf, np.uint8).reshape(-1, 64), first_index=first_index)
    heads = np.nonzero(table["is_head"])[0]
    assert len(heads) == len(chunks)
    assert table["valid"][heads].all() and table["index_ok"][heads].all()
    expected_heads = np.cumsum([0] + [len(c) // 64 for c in chunks[:-1]])
    assert (heads == expected_heads).all()
    for row, offset in zip(heads, expected_heads * 64):
        w = mlx5.parse_wqe(buf, int(offset))
        got = {name: table[name][row].item() for name in expected_row(w)}
        assert got == expected_row(w), (row, w.opcode_name)
    cont = ~table["is_head"]
    assert not table["valid"][cont].any() and not table["total_bytes"][cont].any()


def test_bytes_input_and_single_wqebb_fast_path():
    wqes = [mlx5.build_wqe(Opcode.RDMA_WRITE, i, 5, raddr=i, rkey=1, sgl=[(i + 1, 2, 3)]) for i in range(50)]
    table = mlx5.decode_wqebbs(b"".join(wqes), first_index=0)
    assert table["is_head"].all() and table["valid"].all()
    assert table["total_bytes"].tolist() == list(range(1, 51))
    assert table["raddr"].tolist() == list(range(50))


def test_invalid_rows_are_flagged():
    good = mlx5.build_wqe(Opcode.SEND, 0, 1, sgl=[(10, 1, 1)])
    bad_opcode = bytearray(mlx5.build_wqe(Opcode.SEND, 1, 1, sgl=[(10, 1, 1)]))
    bad_opcode[3] = 0x07
    wrong_index = mlx5.build_wqe(Opcode.SEND, 9, 1, sgl=[(10, 1, 1)])
    truncated = mlx5.build_wqe(Opcode.RDMA_WRITE, 3, 1, raddr=0, rkey=0, sgl=[(1, 1, 1)] * 4)[:64]
    table = mlx5.decode_wqebbs(good + bytes(bad_opcode) + wrong_index + truncated, first_index=0)
    assert table["valid"].tolist() == [True, False, False, False]
    assert table["known_opcode"].tolist() == [True, False, True, True]
    assert table["index_ok"].tolist() == [True, True, False, True]


def test_gather_slots_follows_the_ring():
    ring = bytearray(8 * 64)
    pi = 0xFFFE
    for _ in range(6):
        wqe = mlx5.build_wqe(Opcode.SEND, pi, 1, sgl=[(pi, 1, 1)])
        mlx5.write_wqe_to_ring(ring, 3, pi, wqe)
        pi = (pi + 1) & 0xFFFF
    slots = mlx5.gather_slots(ring, 3, 0xFFFE, 6)
    table = mlx5.decode_wqebbs(slots, first_index=0xFFFE)
    assert table["valid"].all()
    assert table["wqe_index"].tolist() == [0xFFFE, 0xFFFF, 0, 1, 2, 3]
