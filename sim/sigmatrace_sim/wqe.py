"""Genuine mlx5 send WQEs and NVSHMEM-convention doorbells (reference/mlx5.md §1, §3).

Private, speed-oriented encoders for the model: one precompiled struct per
segment composition, so that posting a WQE costs one pack.  The decoder
the tests check against is sigmatrace.mlx5 (independent code); the model's
NIC uses the small `peek` parser below to execute what the GPU wrote.
"""
import struct

WQEBB = 64
NOP, RDMA_WRITE, RDMA_WRITE_IMM, SEND, RDMA_READ = 0x00, 0x08, 0x09, 0x0A, 0x10
ATOMIC_CS, ATOMIC_FA, ATOMIC_MASKED_CS, ATOMIC_MASKED_FA = 0x11, 0x12, 0x14, 0x15
CQ_UPDATE = 0x08
INLINE_SEG = 0x80000000
OPCODE_NAMES = {NOP: "NOP", RDMA_WRITE: "RDMA_WRITE", RDMA_WRITE_IMM: "RDMA_WRITE_IMM", SEND: "SEND",
                RDMA_READ: "RDMA_READ", ATOMIC_CS: "ATOMIC_CS", ATOMIC_FA: "ATOMIC_FA",
                ATOMIC_MASKED_CS: "ATOMIC_MASKED_CS", ATOMIC_MASKED_FA: "ATOMIC_MASKED_FA"}

_CTRL = ">IIBHBI"                       # opmod_idx_opcode, qpn_ds, signature, dci_stream, fm_ce_se, imm
_RDMA = struct.Struct(_CTRL + "QII" + "IIQ")             # ctrl + raddr + 1 data seg = 48 B, DS 3
_ATOM = struct.Struct(_CTRL + "QII" + "QQ" + "IIQ")      # ctrl + raddr + atomic + data = 64 B, DS 4
_MFA32 = struct.Struct(_CTRL + "QII" + "II8x" + "IIQ")   # masked FA 32-bit (opmod 0x08), DS 4
_MCS64 = struct.Struct(_CTRL + "QII" + "QQ" + "QQ" + "IIQ")  # masked CS 64-bit (opmod 0x09), DS 5, 2 WQEBBs
_INL = struct.Struct(_CTRL + "QII" + "I")                # ctrl + raddr + inline header (payload follows)
_DSEG = struct.Struct(">IIQ")
_PEEK = struct.Struct(">II")


def ctrl_words(opcode, idx, qpn, ds, opmod=0):
    return ((opmod & 0xFF) << 24) | ((idx & 0xFFFF) << 8) | opcode, ((qpn & 0xFFFFFF) << 8) | ds


def _pad(b):
    n = -len(b) % WQEBB
    return b + b"\0" * n if n else b


def rdma(opcode, idx, qpn, raddr, rkey, nbytes, laddr, lkey, fm_ce_se=CQ_UPDATE, sges=1):
    """RDMA_WRITE / RDMA_READ with `sges` equal scatter entries (DS = 2 + sges)."""
    if sges == 1:
        a, b = ctrl_words(opcode, idx, qpn, 3)
        return _RDMA.pack(a, b, 0, 0, fm_ce_se, 0, raddr, rkey, 0, nbytes, lkey, laddr) + bytes(16)
    a, b = ctrl_words(opcode, idx, qpn, 2 + sges)
    head = struct.pack(_CTRL + "QII", a, b, 0, 0, fm_ce_se, 0, raddr, rkey, 0)
    per = nbytes // sges
    segs = b"".join(_DSEG.pack(per if i < sges - 1 else nbytes - per * (sges - 1), lkey, laddr + i * per)
                    for i in range(sges))
    return _pad(head + segs)


def write_inline(idx, qpn, raddr, rkey, payload: bytes, fm_ce_se=CQ_UPDATE):
    """RDMA_WRITE with inline data (flags, signals); DS = 2 + ceil((4+n)/16)."""
    n = len(payload)
    ds = 2 + (4 + n + 15) // 16
    a, b = ctrl_words(RDMA_WRITE, idx, qpn, ds)
    body = _INL.pack(a, b, 0, 0, fm_ce_se, 0, raddr, rkey, 0, n | INLINE_SEG) + payload
    return _pad(body)


def atomic(opcode, idx, qpn, raddr, rkey, laddr, lkey, add_or_swap=0, compare=0, fm_ce_se=CQ_UPDATE):
    """ATOMIC_FA / ATOMIC_CS (8 bytes, DS 4)."""
    a, b = ctrl_words(opcode, idx, qpn, 4)
    return _ATOM.pack(a, b, 0, 0, fm_ce_se, 0, raddr, rkey, 0, add_or_swap, compare, 8, lkey, laddr)


def masked_fa32(idx, qpn, raddr, rkey, laddr, lkey, add, fm_ce_se=CQ_UPDATE):
    a, b = ctrl_words(ATOMIC_MASKED_FA, idx, qpn, 4, opmod=0x08)
    return _MFA32.pack(a, b, 0, 0, fm_ce_se, 0, raddr, rkey, 0, add & 0xFFFFFFFF, 0, 4, lkey, laddr)


def masked_cs64(idx, qpn, raddr, rkey, laddr, lkey, swap, compare, fm_ce_se=CQ_UPDATE):
    """64-bit masked CS as NVSHMEM builds atomic set/swap: DS 5, two WQEBBs."""
    a, b = ctrl_words(ATOMIC_MASKED_CS, idx, qpn, 5, opmod=0x09)
    body = _MCS64.pack(a, b, 0, 0, fm_ce_se, 0, raddr, rkey, 0, swap, compare,
                       0xFFFFFFFFFFFFFFFF, 0, 8, lkey, laddr)
    return _pad(body)


def peek(buf, off=0):
    """(opcode, opmod, wqe_index, qpn, ds) of the ctrl segment at buf[off]."""
    a, b = _PEEK.unpack_from(buf, off)
    return a & 0xFF, a >> 24, (a >> 8) & 0xFFFF, b >> 8, b & 0x3F


def payload_bytes(wqe: bytes):
    """Bytes moved by a WQE as the NIC sees them: sum of data segments or inline length."""
    opcode, opmod, idx, qpn, ds = peek(wqe)
    total = 0
    off = 16
    if opcode in (RDMA_WRITE, RDMA_WRITE_IMM, RDMA_READ):
        off = 32
    elif opcode in (ATOMIC_CS, ATOMIC_FA, ATOMIC_MASKED_FA):
        off = 48
    elif opcode == ATOMIC_MASKED_CS:
        off = 64
    end = ds * 16
    while off < end:
        (bc,) = struct.unpack_from(">I", wqe, off)
        if bc & INLINE_SEG:
            return bc & 0x7FFFFFFF
        total += bc
        off += 16
    return total


# ---------------------------------------------------------------------------------
# Precompiled templates for the model's hot path.
#
# An operation is a plain tuple (see gpu.py, OP_* field positions) and is written
# straight into the SQ ring with ONE Struct.pack_into per WQE: each template below
# is the complete byte layout of one WQE shape, padded to whole WQEBBs with "x"
# pad bytes (which pack_into writes as zeros, so a reused slot holds no stale bytes
# of a previous WQE).  The bytes are identical to what the reference encoders above
# produce (tests decode them with sigmatrace.mlx5).
K_RDMA, K_INLINE, K_ATOMIC, K_MFA32, K_MCS64 = 0, 1, 2, 3, 4
_T_RDMA1 = struct.Struct(_CTRL + "QII" + "IIQ" + "16x")                   # 1 WQEBB
_T_ATOM = _ATOM                                                           # 1 WQEBB
_T_MFA32 = _MFA32                                                         # 1 WQEBB
_T_MCS64 = struct.Struct(_CTRL + "QII" + "QQ" + "QQ" + "IIQ" + "48x")     # 2 WQEBBs
_T_RDMA_SGE = {}
_T_INL = {}


def _rdma_template(sges):
    t = _T_RDMA_SGE.get(sges)
    if t is None:
        size = 32 + 16 * sges
        pad = -size % WQEBB
        t = _T_RDMA_SGE[sges] = struct.Struct(_CTRL + "QII" + "IIQ" * sges + f"{pad}x")
    return t


def _inline_template(n):
    t = _T_INL.get(n)
    if t is None:
        size = 36 + n
        ds = 2 + (4 + n + 15) // 16
        pad = ds * 16 - size + (-(ds * 16) % WQEBB)
        t = _T_INL[n] = struct.Struct(_CTRL + "QII" + "I" + f"{n}s" + f"{pad}x")
    return t


def encode_into(buf, off, op, idx, qpn, rkey, lkey, fm_ce_se):
    """Write WQE `op` (an operation tuple, gpu.py) with wqe_index `idx` at buf[off:].

    One pack_into of a precompiled template; only the per-WQE fields are patched."""
    kind, opcode, nw, nbytes, raddr, laddr, a_, b_, payload, sges = op[:10]
    ctrl_a = ((idx & 0xFFFF) << 8) | opcode
    q = (qpn & 0xFFFFFF) << 8
    if kind == K_RDMA:
        if sges == 1:
            _T_RDMA1.pack_into(buf, off, ctrl_a, q | 3, 0, 0, fm_ce_se, 0, raddr, rkey, 0, nbytes, lkey, laddr)
            return
        per = nbytes // sges
        segs = []
        for i in range(sges):
            segs += (per if i < sges - 1 else nbytes - per * (sges - 1), lkey, laddr + i * per)
        _rdma_template(sges).pack_into(buf, off, ctrl_a, q | (2 + sges), 0, 0, fm_ce_se, 0, raddr, rkey, 0, *segs)
    elif kind == K_ATOMIC:
        _T_ATOM.pack_into(buf, off, ctrl_a, q | 4, 0, 0, fm_ce_se, 0, raddr, rkey, 0, a_, b_, 8, lkey, laddr)
    elif kind == K_INLINE:
        n = len(payload)
        _inline_template(n).pack_into(buf, off, ctrl_a, q | (2 + (4 + n + 15) // 16), 0, 0, fm_ce_se, 0,
                                      raddr, rkey, 0, n | INLINE_SEG, payload)
    elif kind == K_MFA32:
        _T_MFA32.pack_into(buf, off, ctrl_a | (0x08 << 24), q | 4, 0, 0, fm_ce_se, 0, raddr, rkey, 0,
                           a_ & 0xFFFFFFFF, 0, 4, lkey, laddr)
    elif kind == K_MCS64:
        _T_MCS64.pack_into(buf, off, ctrl_a | (0x09 << 24), q | 5, 0, 0, fm_ce_se, 0, raddr, rkey, 0, a_, b_,
                           0xFFFFFFFFFFFFFFFF, 0, 8, lkey, laddr)
    else:
        raise ValueError(f"operation kind {kind} not modelled")


def doorbell_raw(pi, qpn):
    """NVSHMEM/DeepEP GPU doorbell: {BE32(pi16<<8), BE32(qpn<<8)} read as a little-endian u64."""
    return int.from_bytes(struct.pack(">II", (pi & 0xFFFF) << 8, (qpn & 0xFFFFFF) << 8), "little")


def parse_doorbell_raw(raw):
    """(pi16, qpn) from a doorbell's little-endian u64 view (bytes 1-2 = index, 4-6 = QPN)."""
    b = int(raw).to_bytes(8, "little")
    return (b[1] << 8) | b[2], (b[4] << 16) | (b[5] << 8) | b[6]
