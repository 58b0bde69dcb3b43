"""sigmatrace.mlx5 against the byte vectors written out in ../shared/reference/mlx5.md §7.

The hex strings below are transcribed from the reference (its "…" are the ctrl bytes
8-15 and data segments of the same vectors, spelled out here as V1 spells them).
"""
from __future__ import annotations

import pytest

from sigmatrace import mlx5
from sigmatrace.mlx5 import Mlx5DecodeError, Opcode

pytestmark = pytest.mark.sim

RADDR = "00 00 7f 00 12 34 56 78 00 ab cd ef 00 00 00 00"        # ref §7 common parameters
DATA8 = "00 00 00 08 00 00 12 34 00 00 7f 00 aa bb 00 00"        # 8-byte result to 0x7f00aabb0000
V1 = ("00 00 05 08 00 01 23 03 00 00 00 08 00 00 00 00", RADDR,
      "00 00 10 00 00 00 12 34 00 00 7f 00 aa bb cc 00")
V2 = ("00 00 06 09 00 01 23 03 00 00 00 08 de ad be ef", RADDR, "80 00 00 04 44 33 22 11 00 00 00 00 00 00 00 00")
V3 = ("08 00 07 15 00 01 23 04 00 00 00 08 00 00 00 00", "00 00 7f 00 00 00 10 00 00 ab cd ef 00 00 00 00",
      "00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00", "00 00 00 04 00 00 12 34 00 00 7f 00 aa bb 00 00")
V4 = ("00 00 08 12 00 01 23 04 00 00 00 08 00 00 00 00", RADDR,
      "00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00", DATA8)
V5 = ("00 00 09 11 00 01 23 04 00 00 00 08 00 00 00 00", RADDR,
      "00 00 00 00 00 00 00 10 00 00 00 00 00 00 00 20", DATA8)
V6 = ("00 ff ff 10 00 01 23 03 00 00 00 08 00 00 00 00", RADDR,
      "00 00 10 00 00 00 12 34 00 00 7f 00 aa bb cc 00")
V7 = ("00 00 0a 00 00 01 23 02 00 00 00 08 00 00 00 00", "00" * 16)
V8 = ("00 00 0b 0a 00 01 23 02 00 00 00 0a 00 00 00 00", "00 00 01 00 00 00 12 34 00 00 7f 00 aa bb cc 00")
V9 = ("09 00 0c 14 00 01 23 05 00 00 00 08 00 00 00 00", RADDR,
      "11 22 33 44 55 66 77 88 00 00 00 00 00 00 00 00", "ff ff ff ff ff ff ff ff 00 00 00 00 00 00 00 00",
      DATA8)


def hx(*parts: str) -> bytes:
    return bytes.fromhex(" ".join(parts))


def test_v1_rdma_write():
    w = mlx5.parse_wqe(hx(*V1))
    assert (w.opcode_name, w.wqe_index, w.qpn, w.ds, w.num_wqebbs) == ("RDMA_WRITE", 5, 0x123, 3, 1)
    assert w.completion_mode == mlx5.CompletionMode.CQE_ALWAYS and w.signaled
    assert (w.raddr, w.rkey) == (0x00007F0012345678, 0x00ABCDEF)
    assert w.data_segments == [(4096, 0x1234, 0x7F00AABBCC00)] and w.total_bytes == 4096
    assert mlx5.build_wqe(Opcode.RDMA_WRITE, 5, 0x123, raddr=0x7F0012345678, rkey=0xABCDEF,
                          sgl=[(4096, 0x1234, 0x7F00AABBCC00)], fm_ce_se=8, pad=False) == hx(*V1)


def test_v2_deepep_4_byte_inline_write_is_ds3():
    w = mlx5.parse_wqe(hx(*V2))
    assert w.opcode == Opcode.RDMA_WRITE_IMM and w.ds == 3 and w.imm == 0xDEADBEEF
    assert w.inline_data == (0x11223344).to_bytes(4, "little") and w.total_bytes == 4   # raw, no swap
    assert mlx5.build_wqe(Opcode.RDMA_WRITE_IMM, 6, 0x123, raddr=0x7F0012345678, rkey=0xABCDEF,
                          imm=0xDEADBEEF, inline=bytes.fromhex("44332211"), fm_ce_se=8, pad=False) == hx(*V2)


def test_v3_masked_fa_32_bit():
    w = mlx5.parse_wqe(hx(*V3))
    assert (w.opcode, w.opmod, w.ds, w.num_wqebbs) == (Opcode.ATOMIC_MASKED_FA, 0x08, 4, 1)
    assert w.atomic.size == 4 and w.atomic.swap_add == 1 and w.total_bytes == 4
    assert w.raddr == 0x7F0000001000 and w.data_segments == [(4, 0x1234, 0x7F00AABB0000)]


def test_v4_v5_plain_atomics():
    fa, cs = mlx5.parse_wqe(hx(*V4)), mlx5.parse_wqe(hx(*V5))
    assert fa.opcode_name == "ATOMIC_FA" and fa.atomic.swap_add == 5 and fa.atomic.compare is None
    assert cs.opcode_name == "ATOMIC_CS" and (cs.atomic.swap_add, cs.atomic.compare) == (0x10, 0x20)
    assert fa.total_bytes == cs.total_bytes == 8


def test_v6_index_ffff_and_successor():
    w = mlx5.parse_wqe(hx(*V6))
    assert w.opcode_name == "RDMA_READ" and w.wqe_index == 0xFFFF and w.end_index == 0x0000


def test_v7_nvshmem_nop_ds2():
    w = mlx5.parse_wqe(hx(*V7))
    assert (w.opcode_name, w.wqe_index, w.ds, w.num_wqebbs, w.total_bytes) == ("NOP", 0xA, 2, 1, 0)
    assert mlx5.build_wqe(Opcode.NOP, 0xA, 0x123, ds=2, fm_ce_se=8, pad=False) == hx(*V7)


def test_v8_send_solicited():
    w = mlx5.parse_wqe(hx(*V8))
    assert w.opcode_name == "SEND" and w.solicited and w.signaled and w.total_bytes == 0x100


def test_v9_masked_cs_64_bit_two_wqebbs():
    w = mlx5.parse_wqe(hx(*V9))
    assert (w.opmod, w.ds, w.num_wqebbs) == (0x09, 5, 2)
    a = w.atomic
    assert (a.size, a.swap_add, a.compare, a.swap_add_mask, a.compare_mask) == \
        (8, 0x1122334455667788, 0, 0xFFFFFFFFFFFFFFFF, 0)
    assert w.data_segments == [(8, 0x1234, 0x7F00AABB0000)]   # the data segment sits at +0x40


def test_doorbell_conventions_db1_db2_db3():
    db1 = mlx5.parse_doorbell(hx("00 00 06 00 00 01 23 00"))
    assert (db1.producer_index, db1.qpn, db1.end_index) == (6, 0x123, 6)
    assert mlx5.parse_doorbell(0x0023010000060000) == db1                      # the LE u64 view
    assert mlx5.doorbell_value(0x10006, 0x123, "nvshmem") == 0x0023010000060000
    db2 = mlx5.parse_doorbell(hx("01 00 06 00 00 01 23 00"))                    # DOCA: byte 0 = bits 23:16
    assert (db2.producer_index, db2.qpn, db2.byte0, db2.convention) == (6, 0x123, 1, "doca")
    assert mlx5.doorbell_bytes(0x10006, 0x123, "doca") == hx("01 00 06 00 00 01 23 00")
    db3 = mlx5.parse_doorbell(hx("00 00 05 08 00 01 23 03"))                    # rdma-core after V1
    assert (db3.producer_index, db3.opcode, db3.ds, db3.end_index, db3.convention) == (5, 8, 3, 6, "rdma-core")
    assert mlx5.parse_dbr(hx("00 00 00 06")) == db3.end_index == 6


def test_doorbell_rejects_wrong_sizes():
    with pytest.raises(Mlx5DecodeError):
        mlx5.parse_doorbell(bytes(7))
    with pytest.raises(Mlx5DecodeError):
        mlx5.parse_doorbell(1 << 64)


def test_cqe_c1_c2_c3():
    c1 = mlx5.parse_cqe(bytes(56) + hx("08 00 01 23 00 05 00 01"))
    assert (c1.opcode_name, c1.send_opcode_name, c1.qpn, c1.wqe_counter, c1.owner) == \
        ("REQ", "RDMA_WRITE", 0x123, 5, 1)
    c2 = mlx5.parse_cqe(bytes(54) + hx("81 15 09 00 01 23 00 06 00 d0"))
    assert c2.opcode_name == "REQ_ERR" and c2.syndrome_name == "TRANSPORT_RETRY_EXC_ERR"
    assert (c2.vendor_err_synd, c2.send_opcode, c2.qpn, c2.wqe_counter) == (0x81, 0x09, 0x123, 6)
    c3 = mlx5.parse_cqe(b"\xff" * 64)
    assert c3.opcode_name == "INVALID" and not c3.is_valid_for(0, 1024) and not c3.is_valid_for(1024, 1024)


def test_cqe_owner_bit_rule():
    # valid when (op_own & 1) == !!(ci & cqe_cnt): the expected owner flips on every pass (ref §2.2)
    cnt = 8
    for ci in range(4 * cnt):
        expected_owner = (ci // cnt) & 1
        for owner in (0, 1):
            op_own = (mlx5.CqeOpcode.REQ << 4) | owner
            assert mlx5.cqe_owner_valid(op_own, ci, cnt) == (owner == expected_owner), (ci, owner)
    with pytest.raises(ValueError):
        mlx5.cqe_owner_valid(0, 0, 6)


P1 = {0x000: "05000000", 0x018: "00001800", 0x01C: "00000abc", 0x020: "00005000", 0x024: "00000123",
      0x028: "00000007", 0x094: "00000789", 0x0B4: "0000078a", 0x0C4: "01000456", 0x0E8: "10000000",
      0x0FC: "00000012", 0x108: "00000011", 0x10C: "80000000"}
P2 = {0x000: "05030000", 0x008: "00000123", 0x020: "be000000", 0x02C: "00000456", 0x0A8: "00800000",
      0x0AC: "0c000000"}


def _image(dwords: dict[int, str], size: int = 272) -> bytes:
    buf = bytearray(size)
    for offset, text in dwords.items():
        buf[offset:offset + 4] = bytes.fromhex(text)
    return bytes(buf)


def test_p1_create_qp_field_offsets():
    qp = mlx5.parse_create_qp(_image(P1), mlx5.build_create_qp_out(0x4567))
    assert (qp.st, qp.pm_state, qp.pd, qp.uar_page, qp.user_index) == (0, 3, 0xABC, 0x123, 7)
    assert (qp.log_sq_size, qp.log_rq_size, qp.cqn_snd, qp.cqn_rcv) == (10, 0, 0x789, 0x78A)
    assert (qp.rq_type, qp.srqn_rmpn_xrqn) == (mlx5.QpcRqType.SRQ, 0x456)
    assert (qp.dbr_umem_valid, qp.dbr_umem_id, qp.dbr_addr) == (1, 0x12, 0)
    assert (qp.wq_umem_valid, qp.wq_umem_id, qp.wq_umem_offset) == (1, 0x11, 0)
    assert qp.qpn == 0x4567
    assert qp.sq_offset == 0 and qp.sq_size_bytes == 1024 * 64        # SRQ: no RQ in the umem
    rebuilt = mlx5.build_create_qp_in(pm_state=3, pd=0xABC, uar_page=0x123, user_index=7, log_sq_size=10,
                                      cqn_snd=0x789, cqn_rcv=0x78A, rq_type=1, srqn_rmpn_xrqn=0x456,
                                      dbr_umem_valid=1, dbr_umem_id=0x12, wq_umem_id=0x11, wq_umem_valid=1)
    assert rebuilt == _image(P1)


def test_p2_init2rtr():
    m = mlx5.parse_modify_qp(_image(P2))
    assert (m.transition, m.qpn, m.remote_qpn, m.mtu, m.log_msg_max, m.min_rnr_nak, m.log_rra_max) == \
        ("INIT2RTR", 0x123, 0x456, 5, 30, 12, 4)
    assert mlx5.build_modify_qp_in("INIT2RTR", 0x123, 0x456, mtu=5, log_msg_max=30, min_rnr_nak=12,
                                   log_rra_max=4) == _image(P2)


def test_modify_qp_without_qpc_and_bad_commands():
    m = mlx5.parse_modify_qp(mlx5.build_modify_qp_in("2ERR", 0x42))
    assert m.transition == "2ERR" and m.qpn == 0x42 and m.remote_qpn is None
    with pytest.raises(Mlx5DecodeError):
        mlx5.parse_modify_qp(_image(P1))                  # CREATE_QP is not a transition
    with pytest.raises(Mlx5DecodeError):
        mlx5.parse_create_qp(_image(P1)[:100])            # truncated
    with pytest.raises(Mlx5DecodeError):
        mlx5.parse_create_qp(_image(P2))                  # wrong command


def test_create_cq_fields():
    buf = mlx5.build_create_cq_in(cq_umem_id=0x20, cq_umem_valid=1, dbr_umem_valid=1, cc=1, oi=1,
                                  dbr_umem_id=0x21, log_cq_size=10, uar_page=0x123, c_eqn=3, log_page_size=4)
    assert buf[0x10] == 0x02 | 0x00 and buf[0x11] == 0x12      # DW4: dbr_umem_valid bit 25, cc bit 20, oi bit 17
    assert buf[0x5C] == 0x80                                    # cq_umem_valid, DW23 bit 31
    cq = mlx5.parse_create_cq(buf, mlx5.build_create_cq_out(0x99))
    assert (cq.cqn, cq.num_cqes, cq.cqe_size, cq.cc, cq.oi, cq.cq_umem_id) == (0x99, 1024, 64, 1, 1, 0x20)


def test_prm_accessor_bit_rule():
    buf = bytearray(32)
    mlx5.prm_set(buf, 0x0D3, 2, 3)          # qpc.pm_state: DW6 bits 12:11 (ref §4.3)
    assert buf[24:28] == (3 << 11).to_bytes(4, "big") and not any(buf[:24] + buf[28:])
    assert mlx5.prm_get(buf, 0x0D3, 2) == 3
    with pytest.raises(ValueError):
        mlx5.prm_set(bytearray(16), 0x0D3, 2, 3)   # past the end of the buffer
    with pytest.raises(ValueError):
        mlx5.PrmField(30, 4)                # crosses a dword
    with pytest.raises(ValueError):
        mlx5.prm_set(bytearray(8), 0, 4, 16)


@pytest.mark.parametrize("bad, why", [
    (hx("00 00 05 08 00 01 23 00") + bytes(8), "DS is 0"),
    (hx("00 00 05 07 00 01 23 01") + bytes(8), "opcode"),
    (hx(*V1)[:40], "needs 48 bytes"),
    (hx("00 00 05 08 00 01 23 03 00 00 00 08 00 00 00 00", RADDR, "80 00 00 20") + bytes(12), "inline"),
    (hx("00 00 05 10 00 01 23 03 00 00 00 08 00 00 00 00", RADDR, "80 00 00 04") + bytes(12), "RDMA_READ"),
    (hx("07 00 05 15 00 01 23 04 00 00 00 08 00 00 00 00", RADDR) + bytes(32), "opmod"),
    (hx("00 00 05 08 00 01 23 01 00 00 00 08 00 00 00 00"), "remote address"),
])
def test_malformed_wqes_raise(bad, why):
    with pytest.raises(Mlx5DecodeError, match=why) as info:
        mlx5.parse_wqe(bad)
    assert isinstance(info.value, ValueError)
