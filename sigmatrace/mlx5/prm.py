"""PRM (DEVX) command buffers: a generic field accessor and the QP/CQ commands.

The DEVX bit rule (ref §0, from mlx5dv.h ``__devx_dw_bit_off``/``_devx_set``):
a field of width w at bit offset o lives in big-endian dword o/32, at bits
[31-(o%32) .. 32-w-(o%32)] of that BE32.  64-bit fields are 64-bit aligned and
stored as one BE64 (``_devx_set64``); wider fields (e.g. a 128-bit GID) are
dword-aligned byte arrays, read here as one big-endian integer.

Each command is a table ``{name: PrmField(bit_offset, width)}``; the parser
and the builder of a command both read the same table, so a field is declared
exactly once.  Offsets are from the start of the command buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .errors import Mlx5DecodeError
from .layouts import (
    CREATE_QP_IN_SIZE, CREATE_QP_OUT_SIZE, MODIFY_QP_IN_SIZE, PRM_OPCODE_NAMES,
    QP_TRANSITION_OPCODES, QP_TRANSITIONS, QPC_MTU_BYTES, QP_TRANSITIONS_WITH_QPC, WQEBB_SIZE, PrmOpcode,
    QpcRqType,
)


@dataclass(frozen=True)
class PrmField:
    bit_offset: int
    width: int

    @property
    def byte_offset(self) -> int:
        return self.bit_offset // 8

    @property
    def end_byte(self) -> int:
        """First byte after the dword(s) holding the field."""
        return ((self.bit_offset + self.width + 31) // 32) * 4

    def __post_init__(self):
        if self.width <= 0:
            raise ValueError("PRM field width must be positive")
        if self.width <= 32:
            if (self.bit_offset % 32) + self.width > 32:
                raise ValueError(f"PRM field at bit {self.bit_offset:#x} width {self.width} crosses a dword")
        elif self.width == 64:
            if self.bit_offset % 64:
                raise ValueError("64-bit PRM fields are 64-bit aligned (ref §0, _devx_set64)")
        elif self.bit_offset % 32 or self.width % 32:
            raise ValueError("PRM fields wider than 32 bits must be whole dwords")


def prm_get(buf, bit_offset: int, width: int) -> int:
    """Read one field per the DEVX bit rule (ref §0)."""
    if width <= 32:
        dword = int.from_bytes(buf[(bit_offset // 32) * 4:(bit_offset // 32) * 4 + 4], "big")
        shift = 32 - width - (bit_offset % 32)
        return (dword >> shift) & ((1 << width) - 1)
    start = bit_offset // 8
    return int.from_bytes(buf[start:start + width // 8], "big")


def prm_set(buf: bytearray, bit_offset: int, width: int, value: int) -> None:
    """Write one field per the DEVX bit rule (ref §0); other bits of the dword are kept."""
    value = int(value)
    if (bit_offset + width + 7) // 8 > len(buf):
        raise ValueError(f"PRM field at bit {bit_offset:#x} lies past the {len(buf)}-byte buffer")
    if value < 0 or value >> width:
        raise ValueError(f"value {value:#x} does not fit a {width}-bit PRM field")
    if width <= 32:
        start = (bit_offset // 32) * 4
        shift = 32 - width - (bit_offset % 32)
        mask = ((1 << width) - 1) << shift
        dword = int.from_bytes(buf[start:start + 4], "big")
        buf[start:start + 4] = ((dword & ~mask) | (value << shift)).to_bytes(4, "big")
    else:
        start = bit_offset // 8
        buf[start:start + width // 8] = value.to_bytes(width // 8, "big")


def _fields(**spec: tuple[int, int]) -> dict[str, PrmField]:
    return {name: PrmField(*bw) for name, bw in spec.items()}


# Command header shared by the QP/CQ commands (ref §4.3, §4.4).
_CMD_IN_HEADER = _fields(
    opcode=(0x000, 16), uid=(0x010, 16), op_mod=(0x030, 16),
)

# qpc fields, offsets from the command start: the qpc begins at bit 0xc0 (byte 0x18) both in
# create_qp_in (ref §4.3) and in the RST2INIT/INIT2RTR/RTR2RTS inputs (ref §4.4).
QPC_FIELDS = _fields(
    st=(0x0C8, 8), pm_state=(0x0D3, 2), pd=(0x0E8, 24),                        # ref §4.3
    mtu=(0x100, 3), log_msg_max=(0x103, 5), log_rq_size=(0x109, 4),            # ref §4.3
    log_rq_stride=(0x10D, 3), no_sq=(0x110, 1), log_sq_size=(0x111, 4),        # ref §4.3
    counter_set_id=(0x120, 8), uar_page=(0x128, 24),                           # ref §4.3
    send_dbr_mode=(0x140, 2), user_index=(0x148, 24),                          # ref §4.3 (send_dbr_mode: DOCA copy only)
    log_page_size=(0x163, 5), remote_qpn=(0x168, 24),                          # ref §4.3
    # primary_address_path (ads) starts at 0x180; byte/dword positions from ref §4.4:
    pkey_index=(0x190, 16),          # byte 0x32
    grh=(0x1A8, 1),                  # DW13 bit 23
    rlid=(0x1B0, 16),                # byte 0x36
    ack_timeout=(0x1C0, 5),          # DW14 31:27
    src_addr_index=(0x1C8, 8),       # byte 0x39
    hop_limit=(0x1D8, 8),            # byte 0x3b
    tclass=(0x1E4, 8),               # DW15 27:20
    rgid_rip=(0x200, 128),           # bytes 0x40-0x4f
    dscp=(0x28A, 6),                 # DW20 21:16
    udp_sport=(0x290, 16),           # byte 0x52
    eth_prio=(0x2A1, 3),             # DW21 30:28
    sl=(0x2A4, 4),                   # DW21 27:24
    vhca_port_num=(0x2A8, 8),        # byte 0x55
    rmac_47_32=(0x2B0, 16),          # byte 0x56
    rmac_31_0=(0x2C0, 32),           # byte 0x58
    log_ack_req_freq=(0x440, 4),     # DW34 31:28
    log_sra_max=(0x448, 3),          # DW34 23:21
    retry_count=(0x44D, 3),          # DW34 18:16
    rnr_retry=(0x450, 3),            # DW34 15:13
    next_send_psn=(0x488, 24),       # DW36 23:0 (byte 0x91)
    cqn_snd=(0x4A8, 24),             # ref §4.3, DW37 23:0
    log_rra_max=(0x548, 3),          # DW42 23:21
    atomic_mode=(0x54C, 4),          # DW42 19:16
    rre=(0x550, 1), rwe=(0x551, 1), rae=(0x552, 1),   # DW42 bits 15/14/13
    page_offset=(0x554, 6),          # ref §4.3, DW42 11:6
    min_rnr_nak=(0x563, 5),          # DW43 28:24
    next_rcv_psn=(0x568, 24),        # DW43 23:0
    cqn_rcv=(0x5A8, 24),             # ref §4.3, DW45 23:0
    dbr_addr=(0x5C0, 64),            # ref §4.3, DW46-47
    rq_type=(0x625, 3),              # ref §4.3, DW49 26:24
    srqn_rmpn_xrqn=(0x628, 24),      # ref §4.3, DW49 23:0
    cs_req=(0x6F0, 8), cs_res=(0x6F8, 8),  # ref §4.3
    dbr_umem_valid=(0x743, 1),       # ref §4.3, DW58 bit 28
    dbr_umem_id=(0x7E0, 32),         # ref §4.3, DW63 (reserved in the old kernel copy, ref §8)
)

CREATE_QP_IN_FIELDS = {
    **_CMD_IN_HEADER,
    "opt_param_mask": PrmField(0x080, 32),   # ref §4.3
    "ece": PrmField(0x0A0, 32),              # ref §4.3 (kernel copy only)
    **QPC_FIELDS,
    "wq_umem_offset": PrmField(0x800, 64),   # ref §4.3 (NVSHMEM copy only, ref §8)
    "wq_umem_id": PrmField(0x840, 32),       # ref §4.3
    "wq_umem_valid": PrmField(0x860, 1),     # ref §4.3, DW67 bit 31
}

CREATE_QP_OUT_FIELDS = _fields(status=(0x00, 8), syndrome=(0x20, 32), qpn=(0x48, 24), ece=(0x60, 32))  # ref §4.3

MODIFY_QP_IN_FIELDS = {
    **_CMD_IN_HEADER,
    "qpn": PrmField(0x048, 24),              # ref §4.4, DW2 23:0
    "opt_param_mask": PrmField(0x080, 32),   # ref §4.4
    **QPC_FIELDS,
}
_MODIFY_QP_HEADER_FIELDS = ("opcode", "uid", "op_mod", "qpn", "opt_param_mask")

CREATE_CQ_IN_FIELDS = {
    **_CMD_IN_HEADER,
    # cq_context at bit 0x80 (byte 0x10), ref §4.5
    "dbr_umem_valid": PrmField(0x086, 1), "cqe_sz": PrmField(0x088, 3),
    "cc": PrmField(0x08B, 1), "oi": PrmField(0x08E, 1),
    "dbr_umem_id": PrmField(0x0A0, 32), "log_cq_size": PrmField(0x0E3, 5),
    "uar_page": PrmField(0x0E8, 24), "c_eqn": PrmField(0x138, 8),
    "log_page_size": PrmField(0x143, 5), "dbr_addr": PrmField(0x240, 64),
    "cq_umem_offset": PrmField(0x280, 64), "cq_umem_id": PrmField(0x2C0, 32),
    "cq_umem_valid": PrmField(0x2E0, 1),
}
CREATE_CQ_OUT_FIELDS = _fields(status=(0x00, 8), syndrome=(0x20, 32), cqn=(0x48, 24))  # ref §4.5 (cqn @0x48)

# The reference gives no total size for create_cq_in; build buffers that cover the declared
# fields (0x60 bytes).  Parsing only needs the declared fields.
CREATE_CQ_IN_SIZE = max(f.end_byte for f in CREATE_CQ_IN_FIELDS.values())
CREATE_CQ_OUT_SIZE = 16


def decode_fields(buf, table: Mapping[str, PrmField], names=None) -> dict[str, int]:
    """Read every field of ``table`` (or just ``names``) from ``buf``."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    wanted = table if names is None else {n: table[n] for n in names}
    need = max(f.end_byte for f in wanted.values())
    if len(mv) < need:
        raise Mlx5DecodeError(f"PRM buffer of {len(mv)} bytes is shorter than the {need} its fields need")
    return {name: prm_get(mv, f.bit_offset, f.width) for name, f in wanted.items()}


def encode_fields(size: int, table: Mapping[str, PrmField], values: Mapping[str, int]) -> bytearray:
    """A zeroed buffer of ``size`` bytes with ``values`` written per ``table``."""
    buf = bytearray(size)
    for name, value in values.items():
        if name not in table:
            raise KeyError(f"unknown PRM field {name!r}")
        f = table[name]
        if f.end_byte > size:
            raise ValueError(f"field {name} ends at byte {f.end_byte}, past the {size}-byte buffer")
        prm_set(buf, f.bit_offset, f.width, value)
    return buf


class PrmRecord:
    """Decoded PRM command: every table field is an attribute; ``fields`` holds them all."""

    command: str = "PRM"

    def __init__(self, fields: dict[str, int | None]):
        self.fields = fields

    def __getattr__(self, name):
        fields = self.__dict__.get("fields")
        if fields is not None and name in fields:
            return fields[name]
        raise AttributeError(name)

    def as_dict(self) -> dict:
        return dict(self.fields)

    def __eq__(self, other):
        return type(self) is type(other) and self.fields == other.fields

    def __repr__(self):
        shown = ", ".join(f"{k}={v:#x}" if isinstance(v, int) else f"{k}={v!r}"
                          for k, v in self.fields.items() if v)
        return f"{type(self).__name__}({shown})"


class CreateQP(PrmRecord):
    command = "CREATE_QP"

    @property
    def rq_size_bytes(self) -> int:
        """Bytes of the QP's own RQ in the WQ umem: 2^log_rq_size entries of 2^(log_rq_stride+4) B
        (ref §4.3), counted only for a regular RQ (rq_type 0) with log_rq_size > 0."""
        if self.rq_type == QpcRqType.REGULAR and self.log_rq_size > 0:
            return (1 << self.log_rq_size) << (self.log_rq_stride + 4)
        return 0

    @property
    def sq_offset(self) -> int:
        """SQ start inside umem ``wq_umem_id``: wq_umem_offset + RQ size (ref §4.3)."""
        return self.wq_umem_offset + self.rq_size_bytes

    @property
    def sq_size_bytes(self) -> int:
        """2^log_sq_size WQEBBs of 64 B (ref §4.3); 0 when no_sq."""
        return 0 if self.no_sq else (1 << self.log_sq_size) * WQEBB_SIZE

    @property
    def sq_wqebbs(self) -> int:
        return 0 if self.no_sq else 1 << self.log_sq_size


class CreateCQ(PrmRecord):
    command = "CREATE_CQ"

    @property
    def num_cqes(self) -> int:
        return 1 << self.log_cq_size

    @property
    def cqe_size(self) -> int:
        return 128 if self.cqe_sz == 1 else 64  # cqc.cqe_sz 64B=0, 128B=1, ref §4.2


class ModifyQP(PrmRecord):
    command = "MODIFY_QP"

    @property
    def mtu_bytes(self) -> int | None:
        return QPC_MTU_BYTES.get(self.mtu) if self.mtu is not None else None


def _check_opcode(opcode: int, expected: int, what: str) -> None:
    if opcode != expected:
        name = PRM_OPCODE_NAMES.get(opcode, f"{opcode:#x}")
        raise Mlx5DecodeError(f"{what}: command opcode is {name}, expected {expected:#x}")


def parse_create_qp(in_buf, out_buf=None) -> CreateQP:
    """Decode a CREATE_QP input (and optionally its output, for ``qpn``), ref §4.3."""
    fields = decode_fields(in_buf, CREATE_QP_IN_FIELDS)
    _check_opcode(fields["opcode"], PrmOpcode.CREATE_QP, "CREATE_QP")
    out = decode_fields(out_buf, CREATE_QP_OUT_FIELDS) if out_buf is not None else {}
    fields["qpn"] = out.get("qpn")
    fields["status"] = out.get("status")
    fields["syndrome"] = out.get("syndrome")
    return CreateQP(fields)


def parse_create_cq(in_buf, out_buf=None) -> CreateCQ:
    """Decode a CREATE_CQ input (and optionally its output, for ``cqn``), ref §4.5."""
    fields = decode_fields(in_buf, CREATE_CQ_IN_FIELDS)
    _check_opcode(fields["opcode"], PrmOpcode.CREATE_CQ, "CREATE_CQ")
    out = decode_fields(out_buf, CREATE_CQ_OUT_FIELDS) if out_buf is not None else {}
    fields["cqn"] = out.get("cqn")
    fields["status"] = out.get("status")
    return CreateCQ(fields)


def parse_modify_qp(in_buf) -> ModifyQP:
    """Decode a QP state-transition input (RST2INIT, INIT2RTR, RTR2RTS, ...), ref §4.4.

    ``transition`` is the name ("INIT2RTR"); qpc fields are ``None`` for
    transitions whose input carries no qpc (2ERR, 2RST).
    """
    header = decode_fields(in_buf, MODIFY_QP_IN_FIELDS, _MODIFY_QP_HEADER_FIELDS)
    opcode = header["opcode"]
    if opcode not in QP_TRANSITIONS:
        name = PRM_OPCODE_NAMES.get(opcode, f"{opcode:#x}")
        raise Mlx5DecodeError(f"PRM command {name} is not a QP state transition")
    if opcode in QP_TRANSITIONS_WITH_QPC:
        fields = decode_fields(in_buf, MODIFY_QP_IN_FIELDS)
    else:
        fields = {**dict.fromkeys(MODIFY_QP_IN_FIELDS), **header}
    fields["transition"] = QP_TRANSITIONS[opcode]
    return ModifyQP(fields)


# --- builders (the SimPy model and the tests use these) -------------------------------------

def build_create_qp_in(**fields: int) -> bytes:
    """A 272-byte CREATE_QP input (ref §4.3); ``opcode`` defaults to CREATE_QP."""
    fields.setdefault("opcode", PrmOpcode.CREATE_QP)
    return bytes(encode_fields(CREATE_QP_IN_SIZE, CREATE_QP_IN_FIELDS, fields))


def build_create_qp_out(qpn: int, status: int = 0, syndrome: int = 0) -> bytes:
    """A 16-byte CREATE_QP output (ref §4.3)."""
    return bytes(encode_fields(CREATE_QP_OUT_SIZE, CREATE_QP_OUT_FIELDS,
                               {"qpn": qpn, "status": status, "syndrome": syndrome}))


def build_modify_qp_in(transition, qpn: int, remote_qpn: int | None = None, **fields: int) -> bytes:
    """A 272-byte modify-QP input (ref §4.4). ``transition``: name ("INIT2RTR") or PRM opcode."""
    if isinstance(transition, str):
        try:
            opcode = QP_TRANSITION_OPCODES[transition.upper()]
        except KeyError:
            raise ValueError(f"unknown QP transition {transition!r}; known: {sorted(QP_TRANSITION_OPCODES)}")
    else:
        opcode = int(transition)
        if opcode not in QP_TRANSITIONS:
            raise ValueError(f"PRM opcode {opcode:#x} is not a QP state transition")
    values = {"opcode": opcode, "qpn": qpn, **fields}
    if remote_qpn is not None:
        values["remote_qpn"] = remote_qpn
    return bytes(encode_fields(MODIFY_QP_IN_SIZE, MODIFY_QP_IN_FIELDS, values))


def build_create_cq_in(**fields: int) -> bytes:
    """A CREATE_CQ input covering the declared fields (ref §4.5); ``size=`` pads it further."""
    size = fields.pop("size", CREATE_CQ_IN_SIZE)
    fields.setdefault("opcode", PrmOpcode.CREATE_CQ)
    return bytes(encode_fields(size, CREATE_CQ_IN_FIELDS, fields))


def build_create_cq_out(cqn: int, status: int = 0, syndrome: int = 0) -> bytes:
    return bytes(encode_fields(CREATE_CQ_OUT_SIZE, CREATE_CQ_OUT_FIELDS,
                               {"cqn": cqn, "status": status, "syndrome": syndrome}))

