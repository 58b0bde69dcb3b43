"""Vectorised WQE decoding for the correlator: many 64-byte WQEBB slots at once, no per-WQE loop.

``decode_wqebbs(slots)`` takes slots in WQEBB-counter order (slot k holds counter
``first_index + k``; use ``gather_slots`` to cut them out of a ring with wrap) and
returns one row per slot of a numpy structured array (dtype ``WQEBB_DTYPE``).
Ctrl fields are decoded for every row; the segment-derived columns are filled for
WQE heads only (0 elsewhere).  Multi-WQEBB WQEs are followed through their DS:
a WQE of ceil(DS/4) WQEBBs covers the next slots, which get ``is_head = False``.

The segment columns cover the compositions of ref §1.9 (RC, no datagram AV):
RDMA_WRITE(_IMM)/READ, SEND(_IMM/_INVAL), DUMP, plain and masked atomics, NOP.
``valid`` says a head decodes without error the way ``parse_wqe`` would; rows where
it is False should go through ``parse_wqe``/``walk_send_queue`` for a diagnosis.
"""
from __future__ import annotations

import numpy as np

from .layouts import (
    DS_MASK, EXT_ATOMIC_OPMOD_4_BYTE, EXT_ATOMIC_OPMOD_8_BYTE, GATHER_ONLY_OPCODES, INLINE_LENGTH_MASK,
    INLINE_SEG_FLAG, MASKED_ATOMIC_OPCODES, OPAQUE_OPCODES, OPCODE_NAMES, PLAIN_ATOMIC_OPCODES,
    RDMA_OPCODES, SEND_OPCODES, WQEBB_SIZE, Opcode,
)

WQEBB_DTYPE = np.dtype([
    # ctrl segment, every row (ref §1.2)
    ("opcode", "u1"), ("opmod", "u1"), ("wqe_index", "u2"), ("qpn", "u4"), ("ds", "u1"),
    ("signature", "u1"), ("fm_ce_se", "u1"), ("imm", "u4"),
    # structure
    ("num_wqebbs", "u1"), ("is_head", "?"), ("known_opcode", "?"), ("index_ok", "?"), ("valid", "?"),
    # segments, heads only (ref §1.3-§1.7)
    ("has_raddr", "?"), ("raddr", "u8"), ("rkey", "u4"),
    ("num_data_segments", "u1"), ("dseg_byte_count", "u4"), ("dseg_lkey", "u4"), ("dseg_addr", "u8"),
    ("inline", "?"), ("inline_len", "u4"),
    ("atomic_size", "u1"), ("atomic_swap_add", "u8"), ("atomic_compare", "u8"),
    ("total_bytes", "u8"),
])

# Opcode -> composition class (ref §1.9); lookup table indexed by the opcode byte.
_C_UNKNOWN, _C_NOP, _C_RDMA, _C_SEND, _C_DUMP, _C_PLAIN_AMO, _C_MASKED_AMO, _C_OPAQUE = range(8)
_CLASS = np.zeros(256, np.uint8)
_CLASS[list(RDMA_OPCODES)] = _C_RDMA
_CLASS[list(SEND_OPCODES)] = _C_SEND
_CLASS[list(GATHER_ONLY_OPCODES)] = _C_DUMP
_CLASS[list(PLAIN_ATOMIC_OPCODES)] = _C_PLAIN_AMO
_CLASS[list(MASKED_ATOMIC_OPCODES)] = _C_MASKED_AMO
_CLASS[list(OPAQUE_OPCODES)] = _C_OPAQUE
_CLASS[Opcode.NOP] = _C_NOP
_KNOWN = np.zeros(256, bool)
_KNOWN[list(OPCODE_NAMES)] = True


def as_slots(slots) -> np.ndarray:
    """View ``slots`` (bytes-like, or a numpy uint8 array of shape (N, 64) or (N*64,)) as (N, 64)."""
    if isinstance(slots, np.ndarray):
        a = np.ascontiguousarray(slots, dtype=np.uint8)
    else:
        a = np.frombuffer(slots, dtype=np.uint8)
    if a.size % WQEBB_SIZE:
        raise ValueError(f"{a.size} bytes is not a whole number of {WQEBB_SIZE}-byte WQEBBs")
    return a.reshape(-1, WQEBB_SIZE)


def gather_slots(sq_bytes, log_sq_size: int, from_pi: int, count: int) -> np.ndarray:
    """The ``count`` WQEBB slots from counter ``from_pi`` on, in counter order, wrapping the ring
    (slot = counter & (2**log_sq_size - 1), ref §1.1).  Returns a (count, 64) copy."""
    ring = as_slots(sq_bytes)[: 1 << log_sq_size]
    if ring.shape[0] != 1 << log_sq_size:
        raise ValueError("ring buffer shorter than 2**log_sq_size WQEBBs")
    return ring[(from_pi + np.arange(count)) & ((1 << log_sq_size) - 1)]


def _heads(step: np.ndarray) -> np.ndarray:
    """Slots reached from slot 0 by jumping ``step[i]`` (>= 1) slots: the orbit of 0 under
    f(i) = i + step[i], computed by pointer doubling (log2 N vector passes, no per-WQE loop)."""
    n = step.shape[0]
    is_head = np.zeros(n, bool)
    if n == 0:
        return is_head
    if (step == 1).all():            # the common case: single-WQEBB WQEs only
        is_head[:] = True
        return is_head
    jump = np.empty(n + 1, np.int64)
    np.minimum(np.arange(n, dtype=np.int64) + step, n, out=jump[:n])
    jump[n] = n                      # sink past the end
    k = np.arange(n, dtype=np.int64)  # the k-th head is f^k(0)
    pos = np.zeros(n, np.int64)
    bit = 0
    while (1 << bit) < n:
        take = ((k >> bit) & 1).astype(bool)
        pos[take] = jump[pos[take]]
        jump = jump[jump]
        bit += 1
    is_head[pos[pos < n]] = True
    return is_head


def decode_wqebbs(slots, *, first_index: int | None = None) -> np.ndarray:
    """Decode N WQEBB slots in bulk; slot 0 must be a WQE head.  See the module docstring.

    ``first_index``: the 16-bit counter of slot 0; when given, ``index_ok`` checks each head's
    ctrl ``wqe_index`` against its position (and ``valid`` requires it).
    """
    a = as_slots(slots)
    n = a.shape[0]
    out = np.zeros(n, WQEBB_DTYPE)
    if n == 0:
        return out
    # One byte swap up front: big-endian dwords/qwords (ref §1) to native integers.
    w32 = a.view(">u4").astype(np.uint32)       # (N, 16)
    flat32 = w32.reshape(-1)
    flat64 = a.view(">u8").astype(np.uint64).reshape(-1)
    nbytes = n * WQEBB_SIZE

    opmod_idx_opcode = w32[:, 0]        # ref §1.2
    qpn_ds = w32[:, 1]
    opcode = (opmod_idx_opcode & 0xFF).astype(np.uint8)
    opmod = (opmod_idx_opcode >> 24).astype(np.uint8)
    ds = (qpn_ds & DS_MASK).astype(np.int64)
    nwqebbs = (ds + 3) // 4
    out["opcode"] = opcode
    out["opmod"] = opmod
    out["wqe_index"] = (opmod_idx_opcode >> 8) & 0xFFFF
    out["qpn"] = qpn_ds >> 8
    out["ds"] = ds
    out["signature"] = a[:, 8]
    out["fm_ce_se"] = a[:, 11]
    out["imm"] = w32[:, 3]
    out["num_wqebbs"] = nwqebbs

    is_head = _heads(np.maximum(nwqebbs, 1))
    known = _KNOWN[opcode]
    rows = np.arange(n, dtype=np.int64)
    if first_index is None:
        index_ok = np.ones(n, bool)
    else:
        index_ok = out["wqe_index"] == ((first_index + rows) & 0xFFFF)
    cls = np.where(known, _CLASS[opcode], _C_UNKNOWN)
    ok = is_head & known & (ds > 0) & index_ok & (rows + nwqebbs <= n)

    has_raddr = (cls == _C_RDMA) | (cls == _C_PLAIN_AMO) | (cls == _C_MASKED_AMO)
    masked = cls == _C_MASKED_AMO
    plain = cls == _C_PLAIN_AMO
    is_cs_masked = masked & (opcode == Opcode.ATOMIC_MASKED_CS)
    # atomic area after raddr (ref §1.6, §1.7)
    amo_bytes = np.where(plain, 16, 0)
    amo_bytes = np.where(masked & (opmod == EXT_ATOMIC_OPMOD_4_BYTE), 16, amo_bytes)
    amo_bytes = np.where(masked & (opmod == EXT_ATOMIC_OPMOD_8_BYTE), np.where(is_cs_masked, 32, 16), amo_bytes)
    amo_bytes = np.where(masked & (opmod == 0), 32, amo_bytes)
    bad_opmod = (masked & ~np.isin(opmod, (0, EXT_ATOMIC_OPMOD_4_BYTE, EXT_ATOMIC_OPMOD_8_BYTE))) \
        | (plain & (opmod != 0))
    ok &= ~bad_opmod
    carries_data = (cls == _C_RDMA) | (cls == _C_SEND) | (cls == _C_DUMP) | plain | masked
    prefix = 16 + np.where(has_raddr, 16, 0) + amo_bytes     # bytes before the first data segment
    n_dsegs = np.where(carries_data, ds - prefix // 16, 0)
    ok &= n_dsegs >= 0
    n_dsegs = np.maximum(n_dsegs, 0)
    wqe_start = rows * WQEBB_SIZE

    def gather32(byte_pos):
        return flat32[np.minimum(byte_pos, nbytes - 4) // 4]

    def gather64(byte_pos):
        return flat64[np.minimum(byte_pos, nbytes - 8) // 8]

    # raddr segment at +16 (ref §1.3)
    out["has_raddr"] = has_raddr & ok
    out["raddr"] = np.where(has_raddr & ok, flat64[np.minimum(rows * 8 + 2, flat64.size - 1)], 0)
    out["rkey"] = np.where(has_raddr & ok, w32[:, 6], 0)

    # first data segment (ref §1.4) and the inline flag (ref §1.5)
    dseg_pos = wqe_start + prefix
    first_bc = np.where(n_dsegs > 0, gather32(dseg_pos), 0)
    inline = ((cls == _C_RDMA) | (cls == _C_SEND)) & (n_dsegs > 0) & ((first_bc & INLINE_SEG_FLAG) != 0)
    inline_len = np.where(inline, first_bc & INLINE_LENGTH_MASK, 0)
    # an inline segment takes align(len+4, 16) bytes; pointer segments may follow it (UCX rc_mlx5 am_zcopy:
    # the AM header inline, then the payload's data segments), which add their byte counts
    inl_units = (inline_len + 4 + 15) // 16
    ok &= ~inline | (inl_units <= n_dsegs)
    ok &= ~(inline & (opcode == Opcode.RDMA_READ))
    pointer = carries_data & ~inline
    # every pointer segment: sum the byte counts, reject inline flags inside a gather list
    total = np.zeros(n, np.int64)
    ptr_rows = np.nonzero(pointer & ok & (n_dsegs > 0))[0]
    if ptr_rows.size:
        nd = n_dsegs[ptr_rows]
        base = dseg_pos[ptr_rows]
        for j in range(int(nd.max())):          # loop over segment position, not over WQEs
            sel = nd > j
            bc = gather32(base[sel] + 16 * j)
            total[ptr_rows[sel]] += bc & INLINE_LENGTH_MASK
            flagged = (bc & INLINE_SEG_FLAG) != 0
            if flagged.any():
                ok[ptr_rows[sel][flagged]] = False
    inl_extra = np.zeros(n, np.int64)
    after = np.nonzero(inline & ok & (inl_units < n_dsegs))[0]
    if after.size:                              # pointer segments after an inline one
        nd = n_dsegs[after] - inl_units[after]
        base = dseg_pos[after] + 16 * inl_units[after]
        for j in range(int(nd.max())):
            sel = nd > j
            bc = gather32(base[sel] + 16 * j)
            inl_extra[after[sel]] += bc & INLINE_LENGTH_MASK
            flagged = (bc & INLINE_SEG_FLAG) != 0
            if flagged.any():
                ok[after[sel][flagged]] = False
    first_is_ptr = pointer & ok & (n_dsegs > 0)
    out["num_data_segments"] = np.where(ok & pointer, n_dsegs, 0)
    out["dseg_byte_count"] = np.where(first_is_ptr, first_bc, 0)
    out["dseg_lkey"] = np.where(first_is_ptr, gather32(dseg_pos + 4), 0)
    out["dseg_addr"] = np.where(first_is_ptr, gather64(dseg_pos + 8), 0)
    out["inline"] = inline & ok
    out["inline_len"] = np.where(ok, inline_len, 0)

    # atomic operands at +32 (ref §1.6, §1.7)
    amo = (plain | masked) & ok
    four = masked & (opmod == EXT_ATOMIC_OPMOD_4_BYTE)
    atomic_size = np.where(amo, np.where(four, 4, 8), 0)
    a64_0 = gather64(wqe_start + 32)
    a64_1 = gather64(wqe_start + 40)
    a32_0 = gather32(wqe_start + 32)
    a32_1 = gather32(wqe_start + 36)
    is_cs = (opcode == Opcode.ATOMIC_CS) | (opcode == Opcode.ATOMIC_MASKED_CS)
    # compare is absent (0) for FA forms, except the generic 32-byte masked segment (opmod 0)
    has_compare = is_cs | (masked & (opmod == 0))
    out["atomic_size"] = atomic_size
    out["atomic_swap_add"] = np.where(amo, np.where(four, a32_0, a64_0), 0)
    out["atomic_compare"] = np.where(amo & has_compare, np.where(four, a32_1, a64_1), 0)

    total = np.where(inline, inline_len + inl_extra, total)
    total = np.where(amo, atomic_size, total)
    out["total_bytes"] = np.where(ok, total, 0)
    out["is_head"] = is_head
    out["known_opcode"] = known
    out["index_ok"] = index_ok
    out["valid"] = ok
    return out
