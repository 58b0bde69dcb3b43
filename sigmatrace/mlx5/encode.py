"""Encoders: genuine mlx5 WQE bytes (the SimPy model and the tests build WQEs with these).

The byte layouts are those of ref §1 and are checked in the tests against
bytes produced by rdma-core's own inline helpers (``mlx5dv_set_ctrl_seg``,
``mlx5dv_set_data_seg``) and struct definitions from ``infiniband/mlx5dv.h``.
"""
from __future__ import annotations

import struct
from typing import Iterable, Sequence

from .layouts import (
    AV_FULL_SIZE, DS_MASK, DS_UNIT, EXT_ATOMIC_OPMOD_4_BYTE, EXT_ATOMIC_OPMOD_8_BYTE,
    EXTENDED_UD_AV, GATHER_ONLY_OPCODES, INLINE_LENGTH_MASK, INLINE_SEG_FLAG,
    MASKED_ATOMIC_OPCODES, OPAQUE_OPCODES, OPCODE_NAMES, PLAIN_ATOMIC_OPCODES, RDMA_OPCODES,
    SEND_OPCODES, WQEBB_SIZE, Opcode,
)


def build_ctrl(opcode: int, wqe_index: int, qpn: int, ds: int, fm_ce_se: int = 0, opmod: int = 0,
               imm: int = 0, signature: int = 0, dci_stream_channel_id: int = 0) -> bytes:
    """16-byte control segment (ref §1.2), the same bytes as ``mlx5dv_set_ctrl_seg``.

    ``wqe_index`` is taken modulo 2**16 (the ctrl index wraps at 0xffff regardless of the
    ring size); ``imm`` is the BE32 value of bytes 12-15 (verbs imm_data is already network
    order, so pass ``ntohl(imm_data)``; for SEND_INVAL the rkey to invalidate).
    """
    if not 0 <= opcode <= 0xFF or not 0 <= opmod <= 0xFF:
        raise ValueError("opcode and opmod are 8-bit")
    if not 0 <= qpn <= 0xFFFFFF:
        raise ValueError(f"QPN {qpn:#x} is wider than 24 bits")
    if not 0 < ds <= DS_MASK:
        raise ValueError(f"DS {ds} outside 1..{DS_MASK}")
    return struct.pack(">IIBHBI", (opmod << 24) | ((wqe_index & 0xFFFF) << 8) | opcode,
                       (qpn << 8) | ds, signature, dci_stream_channel_id, fm_ce_se, imm & 0xFFFFFFFF)


def build_raddr_seg(raddr: int, rkey: int) -> bytes:
    """16-byte remote address segment: raddr BE64, rkey BE32, reserved 0 (ref §1.3)."""
    return struct.pack(">QII", raddr, rkey, 0)


def build_data_seg(byte_count: int, lkey: int, addr: int) -> bytes:
    """16-byte data segment (ref §1.4), the same bytes as ``mlx5dv_set_data_seg``."""
    if byte_count & INLINE_SEG_FLAG:
        raise ValueError("bit 31 of a pointer segment's byte_count is the inline flag")
    return struct.pack(">IIQ", byte_count, lkey, addr)


def build_inline_seg(data: bytes) -> bytes:
    """Inline segment: BE32(len | MLX5_INLINE_SEG) + raw bytes, padded to 16 (ref §1.5)."""
    data = bytes(data)
    if len(data) > INLINE_LENGTH_MASK:
        raise ValueError("inline data too long")
    seg = struct.pack(">I", len(data) | INLINE_SEG_FLAG) + data
    return seg + bytes(-len(seg) % DS_UNIT)


def build_atomic_seg(swap_add: int, compare: int = 0) -> bytes:
    """16-byte ``mlx5_wqe_atomic_seg``: swap_add BE64, compare BE64 (ref §1.6)."""
    return struct.pack(">QQ", swap_add, compare)


def build_masked_atomic_segs(opcode: int, opmod: int, swap_add: int, compare: int = 0,
                             swap_add_mask: int = 0, compare_mask: int = 0,
                             field_boundary: int = 0) -> bytes:
    """Masked/extended atomic segment(s) for ATOMIC_MASKED_CS/FA (ref §1.7)."""
    is_cs = opcode == Opcode.ATOMIC_MASKED_CS
    if opmod == EXT_ATOMIC_OPMOD_4_BYTE:      # 32-bit forms, one 16-byte segment
        if is_cs:
            return struct.pack(">IIII", swap_add, compare, swap_add_mask, compare_mask)
        return struct.pack(">IIQ", swap_add, field_boundary, 0)
    if opmod == EXT_ATOMIC_OPMOD_8_BYTE:      # 64-bit forms
        if is_cs:   # two 16-byte segments: {swap, compare}, {swap_mask, compare_mask}
            return struct.pack(">QQQQ", swap_add, compare, swap_add_mask, compare_mask)
        return struct.pack(">QQ", swap_add, field_boundary)
    if opmod == 0:  # generic 32-byte mlx5_wqe_masked_atomic_seg
        return struct.pack(">QQQQ", swap_add, compare, swap_add_mask, compare_mask)
    raise ValueError(f"extended-atomic opmod {opmod:#x} is not defined in the reference (ref §1.7)")


def build_av_seg(key: int, dqp_dct: int, full: bool = False) -> bytes:
    """Datagram address vector (ref §1.8): 16-byte half AV, or the 48-byte full AV (routing
    fields left 0) with MLX5_EXTENDED_UD_AV set in dqp_dct."""
    head = struct.pack(">QI", key, (dqp_dct & 0xFFFFFF) | (EXTENDED_UD_AV if full else 0)) + bytes(4)
    return head + bytes(AV_FULL_SIZE - len(head)) if full else head


def build_wqe(opcode: int, wqe_index: int, qpn: int, *,
              sgl: Iterable[Sequence[int]] = (), inline: bytes | None = None,
              raddr: int | None = None, rkey: int = 0, imm: int = 0, fm_ce_se: int = 0,
              opmod: int | None = None, swap_add: int = 0, compare: int = 0,
              swap_add_mask: int = 0, compare_mask: int = 0, field_boundary: int = 0,
              atomic_size: int = 8, payload: bytes | None = None, av: bytes | None = None,
              ds: int | None = None, signature: int = 0, pad: bool = True) -> bytes:
    """A whole send WQE, ``num_wqebbs * 64`` bytes (or exactly DS×16 with ``pad=False``).

    Compositions (ref §1.9): RDMA_WRITE(_IMM)/RDMA_READ = ctrl + raddr + (sgl | inline);
    SEND(_IMM/_INVAL) = ctrl + (sgl | inline); ATOMIC_CS/FA = ctrl + raddr + atomic + sgl;
    ATOMIC_MASKED_CS/FA = ctrl + raddr + masked segment(s) + sgl, where ``atomic_size`` 4
    selects opmod 0x08 and 8 opmod 0x09 unless ``opmod`` is given (0 = generic 32-byte
    masked segment); DUMP = ctrl + sgl; NOP = ctrl (pass ``ds=2`` for NVSHMEM's NOP).
    Opcodes without a reference layout take ``payload``: raw bytes after the ctrl.
    ``sgl``: (byte_count, lkey, addr) triples.  ``av``: a datagram AV (``build_av_seg``) put
    right after the ctrl.  ``ds`` may enlarge the WQE beyond its content (zero filled).
    """
    if opcode not in OPCODE_NAMES:
        raise ValueError(f"opcode {opcode:#x} is not in the mlx5 send opcode table")
    sgl = [tuple(s) for s in sgl]
    if inline is not None and sgl:
        raise ValueError("a WQE carries either inline data or a gather list, not both")
    parts: list[bytes] = []
    if av is not None:
        parts.append(bytes(av))
    if opcode == Opcode.NOP:
        if sgl or inline is not None or payload:
            raise ValueError("NOP carries no segments")
        opmod = opmod or 0
    elif opcode in OPAQUE_OPCODES:
        if sgl or inline is not None or raddr is not None:
            raise ValueError(f"{OPCODE_NAMES[opcode]} has no segment layout in the reference: use payload=")
        parts.append(bytes(payload or b""))
        opmod = opmod or 0
    else:
        if payload is not None:
            raise ValueError("payload= is only for opcodes without a reference layout")
        if opcode in RDMA_OPCODES or opcode in PLAIN_ATOMIC_OPCODES or opcode in MASKED_ATOMIC_OPCODES:
            if raddr is None:
                raise ValueError(f"{OPCODE_NAMES[opcode]} needs raddr/rkey")
            parts.append(build_raddr_seg(raddr, rkey))
        if opcode in PLAIN_ATOMIC_OPCODES:
            if opmod:
                raise ValueError("plain atomics use opmod 0 (ref §1.6)")
            opmod = 0
            parts.append(build_atomic_seg(swap_add, compare))
        elif opcode in MASKED_ATOMIC_OPCODES:
            if opmod is None:
                opmod = {4: EXT_ATOMIC_OPMOD_4_BYTE, 8: EXT_ATOMIC_OPMOD_8_BYTE}[atomic_size]
            parts.append(build_masked_atomic_segs(opcode, opmod, swap_add, compare, swap_add_mask,
                                                  compare_mask, field_boundary))
        else:
            opmod = opmod or 0
        if inline is not None:
            if opcode not in RDMA_OPCODES | SEND_OPCODES or opcode == Opcode.RDMA_READ:
                raise ValueError(f"{OPCODE_NAMES[opcode]} cannot carry inline data")
            parts.append(build_inline_seg(inline))
        else:
            if opcode in GATHER_ONLY_OPCODES and not sgl:
                raise ValueError("DUMP needs a data segment")
            parts.extend(build_data_seg(*s) for s in sgl)
    body = b"".join(parts)
    if len(body) % DS_UNIT:
        raise ValueError("segments must be whole 16-byte units (pad payload)")
    content_ds = 1 + len(body) // DS_UNIT
    if ds is None:
        ds = content_ds
    elif ds < content_ds:
        raise ValueError(f"ds={ds} is smaller than the {content_ds} units the segments need")
    if ds > DS_MASK:
        raise ValueError(f"WQE needs DS {ds}, more than the 6-bit field holds")
    wqe = build_ctrl(opcode, wqe_index, qpn, ds, fm_ce_se, opmod, imm, signature) + body
    size = ((ds + 3) // 4) * WQEBB_SIZE if pad else ds * DS_UNIT
    return wqe + bytes(size - len(wqe))
