"""64-byte completion queue entries (``struct mlx5_cqe64`` / ``struct mlx5_err_cqe``), ref §2.2."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import Mlx5DecodeError
from .layouts import (
    CQE_OPCODE_NAMES, CQE_OWNER_MASK, CQE_SIZE, CQE_SYNDROME_NAMES, ERROR_CQE_OPCODES,
    OPCODE_NAMES, CqeOpcode,
)

# Offsets inside the 64-byte CQE (ref §2.2).
_TAIL = struct.Struct(">IIBBHIQIHBB")   # @32: srqn_uidx, imm_inval_pkey, app, app_op, app_info,
#                                         byte_cnt, timestamp, sop_drop_qpn, wqe_counter, signature, op_own
_TAIL_OFFSET = 32
_ERR_SYND_OFFSET = 54                   # mlx5_err_cqe: vendor_err_synd @54, syndrome @55


@dataclass(frozen=True)
class CQE:
    opcode: int              # op_own bits 7:4
    opcode_name: str
    owner: int               # op_own bit 0
    format: int              # op_own bits 3:2
    se: int                  # op_own bit 1
    qpn: int                 # sop_drop_qpn bits 23:0
    send_opcode: int         # sop_drop_qpn bits 31:24: opcode of the completed WQE (requester CQEs)
    wqe_counter: int         # wqe_index of the completed WQE
    user_index: int          # srqn_uidx bits 23:0 (qpc.user_index with CQE version 1)
    byte_cnt: int | None     # None on error CQEs (reserved there)
    timestamp: int | None    # None on error CQEs (reserved there)
    imm_inval_pkey: int | None
    signature: int
    op_own: int
    syndrome: int | None = None          # error CQEs only
    vendor_err_synd: int | None = None   # error CQEs only

    @property
    def is_error(self) -> bool:
        return self.opcode in ERROR_CQE_OPCODES

    @property
    def send_opcode_name(self) -> str:
        return OPCODE_NAMES.get(self.send_opcode, f"0x{self.send_opcode:02x}")

    @property
    def syndrome_name(self) -> str | None:
        if self.syndrome is None:
            return None
        return CQE_SYNDROME_NAMES.get(self.syndrome, f"0x{self.syndrome:02x}")

    def is_valid_for(self, consumer_index: int, cqe_count: int) -> bool:
        """Whether software owns this CQE at ``consumer_index`` (see ``cqe_owner_valid``)."""
        return cqe_owner_valid(self.op_own, consumer_index, cqe_count)


def cqe_owner_valid(op_own: int, consumer_index: int, cqe_count: int) -> bool:
    """The CQE at consumer index ``ci`` is new when its opcode is not INVALID and
    ``(op_own & 1) == !!(ci & cqe_count)``: the expected owner flips each pass (ref §2.2)."""
    if cqe_count <= 0 or cqe_count & (cqe_count - 1):
        raise ValueError("cqe_count must be a power of two")
    if (op_own >> 4) == CqeOpcode.INVALID:
        return False
    return (op_own & CQE_OWNER_MASK) == (1 if consumer_index & cqe_count else 0)


def parse_cqe(buf, offset: int = 0) -> CQE:
    """Decode the 64-byte CQE at ``offset`` (ref §2.2); error CQEs (REQ_ERR, RESP_ERR) use the
    ``mlx5_err_cqe`` layout and carry ``syndrome``/``vendor_err_synd``."""
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    if offset < 0 or offset + CQE_SIZE > len(mv):
        raise Mlx5DecodeError(f"a CQE is {CQE_SIZE} bytes, buffer has {len(mv) - offset}", offset)
    (srqn_uidx, imm_inval_pkey, _app, _app_op, _app_info, byte_cnt, timestamp, sop_drop_qpn,
     wqe_counter, signature, op_own) = _TAIL.unpack_from(mv, offset + _TAIL_OFFSET)
    opcode = op_own >> 4
    common = dict(opcode=opcode, opcode_name=CQE_OPCODE_NAMES.get(opcode, f"CQE_OPCODE_{opcode}"),
                  owner=op_own & CQE_OWNER_MASK, format=(op_own >> 2) & 0x3, se=(op_own >> 1) & 0x1,
                  qpn=sop_drop_qpn & 0xFFFFFF, send_opcode=sop_drop_qpn >> 24, wqe_counter=wqe_counter,
                  user_index=srqn_uidx & 0xFFFFFF, signature=signature, op_own=op_own)
    if opcode in ERROR_CQE_OPCODES:
        vendor, syndrome = mv[offset + _ERR_SYND_OFFSET], mv[offset + _ERR_SYND_OFFSET + 1]
        return CQE(**common, byte_cnt=None, timestamp=None, imm_inval_pkey=None,
                   syndrome=syndrome, vendor_err_synd=vendor)
    return CQE(**common, byte_cnt=byte_cnt, timestamp=timestamp, imm_inval_pkey=imm_inval_pkey)


def build_cqe(opcode: int = CqeOpcode.REQ, *, qpn: int = 0, wqe_counter: int = 0, send_opcode: int = 0,
              owner: int = 0, byte_cnt: int = 0, timestamp: int = 0, user_index: int = 0,
              imm_inval_pkey: int = 0, se: int = 0, format: int = 0, signature: int = 0,
              syndrome: int = 0, vendor_err_synd: int = 0, fill: int = 0) -> bytes:
    """A 64-byte CQE (ref §2.2).  For REQ_ERR/RESP_ERR the ``mlx5_err_cqe`` layout is used
    (``byte_cnt``/``timestamp`` are reserved there and must stay 0).  ``fill``: value of the
    bytes no field covers (NVSHMEM pre-fills CQ rings with 0xff)."""
    if not 0 <= opcode <= 15:
        raise ValueError("CQE opcode is 4 bits")
    buf = bytearray([fill]) * CQE_SIZE
    op_own = (opcode << 4) | ((format & 0x3) << 2) | ((se & 1) << 1) | (owner & CQE_OWNER_MASK)
    if opcode in ERROR_CQE_OPCODES:
        if byte_cnt or timestamp or imm_inval_pkey:
            raise ValueError("byte_cnt/timestamp/imm are reserved in an error CQE")
        struct.pack_into(">I", buf, 32, user_index & 0xFFFFFF)          # srqn
        buf[_ERR_SYND_OFFSET] = vendor_err_synd
        buf[_ERR_SYND_OFFSET + 1] = syndrome
        struct.pack_into(">IHBB", buf, 56, (send_opcode << 24) | qpn, wqe_counter, signature, op_own)
    else:
        if syndrome or vendor_err_synd:
            raise ValueError("syndromes exist only in error CQEs")
        struct.pack_into(">II", buf, 32, user_index & 0xFFFFFF, imm_inval_pkey)
        struct.pack_into(">IQIHBB", buf, 44, byte_cnt, timestamp, (send_opcode << 24) | qpn,
                         wqe_counter, signature, op_own)
    return bytes(buf)
