"""Scalar decoding of mlx5 send WQEs and of a send queue between two producer indices.

Layouts: ref §1 (segments), §2.1 (opcodes), §3.4 (indices).  All fields are
big-endian.  ``parse_wqe`` raises ``Mlx5DecodeError`` on malformed bytes;
``walk_send_queue`` records problems instead of raising.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .errors import Mlx5DecodeError
from .layouts import (
    ATOMIC_OPCODES, AV_FULL_SIZE, AV_HALF_SIZE, CE_MASK, CE_SHIFT, CTRL_SEG_SIZE, DATA_SEG_SIZE,
    DS_MASK, DS_UNIT, EXT_ATOMIC_OPMOD_4_BYTE, EXT_ATOMIC_OPMOD_8_BYTE, EXTENDED_UD_AV, FM_SHIFT,
    GATHER_ONLY_OPCODES, INLINE_HDR_SIZE, INLINE_LENGTH_MASK, INLINE_SEG_FLAG,
    MASKED_ATOMIC_OPCODES, OPCODE_NAMES, PLAIN_ATOMIC_OPCODES, RADDR_SEG_SIZE, RDMA_OPCODES,
    SE_FLAG, SEND_OPCODES, WQE_INDEX_MODULUS, WQEBB_SIZE, CompletionMode, FenceMode, Opcode,
)

_CTRL = struct.Struct(">IIBHBI")      # opmod_idx_opcode, qpn_ds, signature, dci_stream_channel_id, fm_ce_se, imm (ref §1.2)
_RADDR = struct.Struct(">QI")         # raddr BE64, rkey BE32 (ref §1.3)
_DATA = struct.Struct(">IIQ")         # byte_count, lkey, addr (ref §1.4)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U32X4 = struct.Struct(">IIII")
_U64X2 = struct.Struct(">QQ")


@dataclass
class AtomicOperands:
    """Operands of an atomic WQE (ref §1.6, §1.7).

    ``size`` is the operand width in bytes (4 or 8).  ``compare`` is None for
    fetch-and-add forms; masks are set only for the masked forms that carry
    them; ``field_boundary`` only for masked FA with the 16-byte segment.
    """
    size: int
    swap_add: int
    compare: int | None = None
    swap_add_mask: int | None = None
    compare_mask: int | None = None
    field_boundary: int | None = None
    form: str = ""   # "plain", "masked_4b", "masked_8b", "masked_generic"


@dataclass
class WQE:
    """One decoded send WQE.  Field meanings: ref §1.2 (ctrl) and §1.3-§1.8 (segments)."""
    opcode: int
    opcode_name: str
    opmod: int
    wqe_index: int
    qpn: int
    ds: int
    signature: int
    dci_stream_channel_id: int
    fm_ce_se: int
    imm: int
    num_wqebbs: int
    raddr: int | None = None
    rkey: int | None = None
    data_segments: list[tuple[int, int, int]] = field(default_factory=list)
    inline_data: bytes | None = None
    atomic: AtomicOperands | None = None
    total_bytes: int = 0
    segments_decoded: bool = True      # False for opcodes whose segment layout the reference lacks
    payload: bytes | None = None       # bytes after ctrl when segments_decoded is False
    av_dqp_dct: int | None = None      # datagram (DCI) address vector, when decoded with datagram=True
    av_key: int | None = None
    av_rlid: int | None = None         # the destination port's LID (BE16 @14)
    av_rgid: bytes | None = None       # its GID (16 bytes @32), full 48-byte AV only
    offset: int = 0                    # byte offset of the ctrl segment in the caller's buffer
    slot: int | None = None            # ring slot (offset // 64) when decoded from a ring

    # --- fm_ce_se decoded (ref §1.2) ---
    @property
    def fence_mode(self) -> int:
        return self.fm_ce_se >> FM_SHIFT

    @property
    def fence_mode_name(self) -> str:
        try:
            return FenceMode(self.fence_mode).name
        except ValueError:
            return f"FM_{self.fence_mode}"

    @property
    def completion_mode(self) -> int:
        return (self.fm_ce_se & CE_MASK) >> CE_SHIFT

    @property
    def completion_mode_name(self) -> str:
        return CompletionMode(self.completion_mode).name

    @property
    def signaled(self) -> bool:
        """True when the WQE asks for a CQE on success (CE 2 or 3)."""
        return self.completion_mode >= CompletionMode.CQE_ALWAYS

    @property
    def solicited(self) -> bool:
        return bool(self.fm_ce_se & SE_FLAG)

    @property
    def end_index(self) -> int:
        """16-bit index of the WQEBB after this WQE (the producer index once it is posted)."""
        return (self.wqe_index + self.num_wqebbs) % WQE_INDEX_MODULUS

    @property
    def is_inline(self) -> bool:
        return self.inline_data is not None


def wqebbs_for_ds(ds: int) -> int:
    """WQEBBs a WQE of ``ds`` 16-byte units occupies: ceil(DS/4) (ref §1.1)."""
    return (ds + 3) // 4


def _as_bytes_view(buf) -> memoryview:
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv


def _check_ring(ring_size: int, buf_len: int) -> None:
    if ring_size < WQEBB_SIZE or ring_size & (ring_size - 1):
        raise ValueError(f"ring_size {ring_size} must be a power of two of at least {WQEBB_SIZE} bytes")
    if buf_len < ring_size:
        raise ValueError(f"ring buffer holds {buf_len} bytes, ring_size says {ring_size}")


def _gather(mv: memoryview, offset: int, size: int, ring_size: int | None) -> bytes:
    """``size`` bytes of the WQE at ``offset``; in a ring they continue at byte 0 (ref §1.1)."""
    if ring_size is None:
        if offset + size > len(mv):
            raise Mlx5DecodeError(f"WQE needs {size} bytes, buffer has {len(mv) - offset}", offset)
        return bytes(mv[offset:offset + size])
    if size > ring_size:
        raise Mlx5DecodeError(f"WQE of {size} bytes is larger than the {ring_size}-byte ring", offset)
    first = min(size, ring_size - offset)
    return bytes(mv[offset:offset + first]) + bytes(mv[0:size - first])


def parse_wqe(buf, offset: int = 0, *, ring_size: int | None = None, datagram: bool = False) -> WQE:
    """Decode the send WQE whose ctrl segment starts at byte ``offset`` of ``buf``.

    ``buf``: bytes, bytearray, memoryview or a numpy uint8 array.
    ``ring_size``: when given, ``buf[:ring_size]`` is the whole SQ ring and a WQE
    that runs past its end continues at byte 0 (ref §1.1); ``offset`` must then be
    a slot boundary.  ``datagram``: the QP is a DCI/UD QP, so an address vector
    (16-byte half AV or 48-byte full AV, ref §1.8) follows the ctrl segment.
    Raises ``Mlx5DecodeError`` for malformed bytes.
    """
    mv = _as_bytes_view(buf)
    if ring_size is not None:
        _check_ring(ring_size, len(mv))
        if offset % WQEBB_SIZE or not 0 <= offset < ring_size:
            raise ValueError(f"offset {offset} is not a slot of the {ring_size}-byte ring")
    if offset < 0 or offset + CTRL_SEG_SIZE > len(mv):
        raise Mlx5DecodeError("buffer too short for a 16-byte ctrl segment", offset)
    opmod_idx_opcode, qpn_ds, signature, stream_id, fm_ce_se, imm = _CTRL.unpack_from(mv, offset)
    opcode = opmod_idx_opcode & 0xFF              # bits 7:0, ref §1.2
    wqe_index = (opmod_idx_opcode >> 8) & 0xFFFF  # bits 23:8
    opmod = opmod_idx_opcode >> 24                # bits 31:24
    qpn = qpn_ds >> 8                             # bits 31:8
    ds = qpn_ds & DS_MASK                         # bits 5:0
    if ds == 0:
        raise Mlx5DecodeError("DS is 0 (a WQE counts at least its ctrl segment)", offset)
    if opcode not in OPCODE_NAMES:
        raise Mlx5DecodeError(f"opcode {opcode:#04x} is not in the mlx5 send opcode table", offset)
    wqe = WQE(opcode=opcode, opcode_name=OPCODE_NAMES[opcode], opmod=opmod, wqe_index=wqe_index,
              qpn=qpn, ds=ds, signature=signature, dci_stream_channel_id=stream_id, fm_ce_se=fm_ce_se,
              imm=imm, num_wqebbs=wqebbs_for_ds(ds), offset=offset,
              slot=None if ring_size is None else offset // WQEBB_SIZE)
    body = _gather(mv, offset, ds * DS_UNIT, ring_size)
    try:
        _decode_segments(wqe, body, datagram)
    except Mlx5DecodeError as exc:
        raise Mlx5DecodeError(f"{wqe.opcode_name} idx {wqe_index:#06x} DS {ds}: {exc.reason}", offset) from None
    return wqe


def _decode_segments(wqe: WQE, body: bytes, datagram: bool) -> None:
    op = wqe.opcode
    end = len(body)
    pos = CTRL_SEG_SIZE
    if op == Opcode.NOP:
        return  # NOP: ctrl only (NVSHMEM pads to DS=2, DOCA uses DS=1), ref §1.9
    if op not in RDMA_OPCODES | SEND_OPCODES | ATOMIC_OPCODES | GATHER_ONLY_OPCODES:
        wqe.segments_decoded = False     # layout not in the reference: keep the raw bytes
        wqe.payload = body[CTRL_SEG_SIZE:]
        return
    if datagram:
        pos = _decode_av(wqe, body, pos)
    if op in RDMA_OPCODES or op in ATOMIC_OPCODES:
        if pos + RADDR_SEG_SIZE > end:
            raise Mlx5DecodeError("DS too small for the remote address segment")
        wqe.raddr, wqe.rkey = _RADDR.unpack_from(body, pos)   # ref §1.3
        pos += RADDR_SEG_SIZE
    if op in ATOMIC_OPCODES:
        pos = _decode_atomic(wqe, body, pos)
        wqe.data_segments = _decode_pointer_segments(body, pos, end)
        wqe.total_bytes = wqe.atomic.size   # bytes an atomic operates on, ref §1.6/§1.7
        return
    # RDMA / SEND / DUMP: a gather list (possibly empty: zero-length operations) or one
    # inline segment (ref §1.4, §1.5).
    if op not in GATHER_ONLY_OPCODES and pos < end and _U32.unpack_from(body, pos)[0] & INLINE_SEG_FLAG:
        if op == Opcode.RDMA_READ:
            raise Mlx5DecodeError("RDMA_READ cannot carry inline data")
        length = _U32.unpack_from(body, pos)[0] & INLINE_LENGTH_MASK
        seg_size = -(-(INLINE_HDR_SIZE + length) // DS_UNIT) * DS_UNIT   # align(n+4, 16), ref §1.5
        if pos + seg_size > end:
            raise Mlx5DecodeError(f"inline segment of {length} bytes needs {seg_size} bytes, "
                                  f"DS leaves {end - pos}")
        wqe.inline_data = body[pos + INLINE_HDR_SIZE:pos + INLINE_HDR_SIZE + length]
        # pointer segments may follow (UCX rc_mlx5 am_zcopy: AM header inline, payload by pointer)
        wqe.data_segments = _decode_pointer_segments(body, pos + seg_size, end)
        wqe.total_bytes = length + sum(bc for bc, _, _ in wqe.data_segments)
        return
    wqe.data_segments = _decode_pointer_segments(body, pos, end)
    wqe.total_bytes = sum(bc for bc, _, _ in wqe.data_segments)


def _decode_pointer_segments(body: bytes, pos: int, end: int) -> list[tuple[int, int, int]]:
    segments = []
    while pos < end:
        if pos + DATA_SEG_SIZE > end:
            raise Mlx5DecodeError("partial data segment at the end of the WQE")
        byte_count, lkey, addr = _DATA.unpack_from(body, pos)
        if byte_count & INLINE_SEG_FLAG:
            raise Mlx5DecodeError("inline flag set on a data segment inside a gather list")
        segments.append((byte_count, lkey, addr))
        pos += DATA_SEG_SIZE
    return segments


def _decode_av(wqe: WQE, body: bytes, pos: int) -> int:
    """DCI/UD address vector (ref §1.8): key BE64 @0, dqp_dct BE32 @8, bit 31 = full 48-byte AV."""
    if pos + AV_HALF_SIZE > len(body):
        raise Mlx5DecodeError("DS too small for the address vector")
    wqe.av_key = _U64.unpack_from(body, pos)[0]
    dqp_dct = _U32.unpack_from(body, pos + 8)[0]
    wqe.av_dqp_dct = dqp_dct & 0x00FFFFFF
    wqe.av_rlid = _U16.unpack_from(body, pos + 14)[0]
    size = AV_FULL_SIZE if dqp_dct & EXTENDED_UD_AV else AV_HALF_SIZE
    if pos + size > len(body):
        raise Mlx5DecodeError("DS too small for the full address vector")
    if size == AV_FULL_SIZE:
        wqe.av_rgid = bytes(body[pos + 32:pos + 48])
    return pos + size


def _decode_atomic(wqe: WQE, body: bytes, pos: int) -> int:
    """Atomic segment(s) after raddr; returns the position of the result data segment."""
    op, opmod, end = wqe.opcode, wqe.opmod, len(body)

    def need(nbytes: int) -> None:
        if pos + nbytes > end:
            raise Mlx5DecodeError(f"DS too small for a {nbytes}-byte atomic segment")

    if op in PLAIN_ATOMIC_OPCODES:
        if opmod != 0:
            raise Mlx5DecodeError(f"opmod {opmod:#x} on a plain atomic is not defined in the reference")
        need(16)
        swap_add, compare = _U64X2.unpack_from(body, pos)       # mlx5_wqe_atomic_seg, ref §1.6
        wqe.atomic = AtomicOperands(8, swap_add, compare if op == Opcode.ATOMIC_CS else None, form="plain")
        return pos + 16
    assert op in MASKED_ATOMIC_OPCODES
    is_cs = op == Opcode.ATOMIC_MASKED_CS
    if opmod == EXT_ATOMIC_OPMOD_4_BYTE:                         # ref §1.7, 16-byte 32-bit segments
        need(16)
        a, b, c, d = _U32X4.unpack_from(body, pos)
        wqe.atomic = (AtomicOperands(4, a, b, c, d, form="masked_4b") if is_cs
                      else AtomicOperands(4, a, field_boundary=b, form="masked_4b"))
        return pos + 16
    if opmod == EXT_ATOMIC_OPMOD_8_BYTE:                         # ref §1.7, 64-bit forms
        if is_cs:
            need(32)  # {swap, compare} then {swap_mask, compare_mask}: 2 segments
            swap, compare = _U64X2.unpack_from(body, pos)
            swap_mask, compare_mask = _U64X2.unpack_from(body, pos + 16)
            wqe.atomic = AtomicOperands(8, swap, compare, swap_mask, compare_mask, form="masked_8b")
            return pos + 32
        need(16)
        add, boundary = _U64X2.unpack_from(body, pos)
        wqe.atomic = AtomicOperands(8, add, field_boundary=boundary, form="masked_8b")
        return pos + 16
    if opmod == 0:  # generic 32-byte mlx5_wqe_masked_atomic_seg (rdma-core wqe.h), ref §1.7
        need(32)
        swap_add, compare = _U64X2.unpack_from(body, pos)
        swap_add_mask, compare_mask = _U64X2.unpack_from(body, pos + 16)
        wqe.atomic = AtomicOperands(8, swap_add, compare, swap_add_mask, compare_mask, form="masked_generic")
        return pos + 32
    raise Mlx5DecodeError(f"extended-atomic opmod {opmod:#x} is not defined in the reference (ref §1.7)")


# --- walking a send queue ---------------------------------------------------------------------

@dataclass
class WalkProblem:
    """One slot ``walk_send_queue`` could not accept.  ``kind`` is one of
    index_mismatch, zero_ds, overrun, decode_error, qpn_mismatch, range_too_large."""
    kind: str
    index: int          # 16-bit WQEBB counter value where the problem was found
    slot: int | None
    message: str


@dataclass
class WalkResult:
    wqes: list[WQE]
    problems: list[WalkProblem]
    from_pi: int
    to_pi: int
    wqebbs_decoded: int = 0   # WQEBBs covered by the entries of ``wqes``

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def complete(self) -> bool:
        """True when the walk covered the whole range [from_pi, to_pi)."""
        return self.wqebbs_decoded == (self.to_pi - self.from_pi) % WQE_INDEX_MODULUS

    def __iter__(self):
        return iter(self.wqes)

    def __len__(self):
        return len(self.wqes)


def walk_send_queue(sq_bytes, log_sq_size: int, from_pi: int, to_pi: int, *,
                    qpn: int | None = None, datagram: bool = False) -> WalkResult:
    """The WQEs posted between 16-bit producer indices ``from_pi`` (inclusive) and ``to_pi``.

    ``sq_bytes`` is the SQ ring of 2**log_sq_size WQEBBs (its first byte is slot 0).
    Both the 16-bit index and the ring wrap (ref §3.4); a WQE may continue at slot 0
    (ref §1.1).  Each WQE's ctrl ``wqe_index`` must equal the running counter; a
    mismatch, DS = 0, a WQE running past ``to_pi`` or an undecodable WQE is recorded
    in ``problems`` and never guessed past where the WQE boundaries become unknown
    (mismatch, DS = 0, overrun end the walk; an undecodable WQE whose ctrl is
    consistent is skipped by its DS and the walk continues).  ``qpn``: optional
    expected QPN; a WQE with another QPN is reported (and kept out of ``wqes``).
    """
    mv = _as_bytes_view(sq_bytes)
    num_slots = 1 << log_sq_size
    ring_size = num_slots * WQEBB_SIZE
    _check_ring(ring_size, len(mv))
    from_pi &= 0xFFFF
    to_pi &= 0xFFFF
    result = WalkResult([], [], from_pi, to_pi)
    remaining = (to_pi - from_pi) % WQE_INDEX_MODULUS
    if remaining > num_slots:
        result.problems.append(WalkProblem(
            "range_too_large", from_pi, from_pi & (num_slots - 1),
            f"{remaining} WQEBBs posted between {from_pi:#06x} and {to_pi:#06x} exceed the "
            f"{num_slots}-slot ring: earlier WQEs were overwritten"))
        return result
    index = from_pi
    while remaining > 0:
        slot = index & (num_slots - 1)
        offset = slot * WQEBB_SIZE
        opmod_idx_opcode, qpn_ds = struct.unpack_from(">II", mv, offset)
        ctrl_index = (opmod_idx_opcode >> 8) & 0xFFFF
        ds = qpn_ds & DS_MASK
        if ctrl_index != index:
            result.problems.append(WalkProblem(
                "index_mismatch", index, slot,
                f"slot {slot}: ctrl wqe_index {ctrl_index:#06x}, expected {index:#06x}"))
            break
        if ds == 0:
            result.problems.append(WalkProblem("zero_ds", index, slot, f"slot {slot}: DS is 0"))
            break
        nwqebbs = wqebbs_for_ds(ds)
        if nwqebbs > remaining:
            result.problems.append(WalkProblem(
                "overrun", index, slot,
                f"slot {slot}: WQE of {nwqebbs} WQEBBs runs past to_pi {to_pi:#06x} "
                f"({remaining} WQEBBs left)"))
            break
        try:
            wqe = parse_wqe(mv, offset, ring_size=ring_size, datagram=datagram)
        except Mlx5DecodeError as exc:
            result.problems.append(WalkProblem("decode_error", index, slot, exc.reason))
        else:
            if qpn is not None and wqe.qpn != qpn:
                result.problems.append(WalkProblem(
                    "qpn_mismatch", index, slot, f"slot {slot}: QPN {wqe.qpn:#x}, expected {qpn:#x}"))
            else:
                result.wqes.append(wqe)
                result.wqebbs_decoded += nwqebbs
        index = (index + nwqebbs) % WQE_INDEX_MODULUS
        remaining -= nwqebbs
    return result


def ring_offset(wqe_index: int, log_sq_size: int) -> int:
    """Byte offset of the slot holding WQEBB counter ``wqe_index`` (ref §1.1)."""
    return (wqe_index & ((1 << log_sq_size) - 1)) * WQEBB_SIZE


def write_wqe_to_ring(ring: bytearray, log_sq_size: int, wqe_index: int, wqe_bytes: bytes) -> int:
    """Store ``wqe_bytes`` at the slot of ``wqe_index``, continuing at slot 0 past the ring end
    (as rdma-core does, ref §1.1).  Returns the slot written first."""
    ring_size = WQEBB_SIZE << log_sq_size
    if len(ring) < ring_size or len(wqe_bytes) > ring_size:
        raise ValueError("ring too small for this WQE")
    offset = ring_offset(wqe_index, log_sq_size)
    first = min(len(wqe_bytes), ring_size - offset)
    mv = memoryview(ring)
    mv[offset:offset + first] = wqe_bytes[:first]
    mv[0:len(wqe_bytes) - first] = wqe_bytes[first:]
    return offset // WQEBB_SIZE
