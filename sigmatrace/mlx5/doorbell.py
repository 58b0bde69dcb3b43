"""The 8-byte UAR doorbell store and the doorbell record (DBR), ref §3.

Three writer conventions exist (ref §3.3); all store the bytes of a ctrl
segment's first 8 bytes, so one decoder serves them all: bytes 1-2 are the
16-bit WQE index, bytes 4-6 the QPN.

* rdma-core: the last posted WQE's own ``opmod_idx_opcode`` + ``qpn_ds`` (its
  own index, opcode and DS), so the new producer index is index + ceil(DS/4).
* NVSHMEM / DeepEP GPU: BE32(pi16 << 8), BE32(qpn << 8): index = next free WQEBB.
* DOCA / NVSHMEM CPU proxy: BE32((u32)(pi64 << 8)), BE32(qpn << 8): byte 0 holds
  index bits 23:16, which the NIC ignores.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import Mlx5DecodeError
from .layouts import DS_MASK, DOORBELL_SIZE, WQE_INDEX_MODULUS


@dataclass(frozen=True)
class Doorbell:
    raw: bytes              # the 8 bytes as stored in memory / on the bus
    producer_index: int     # bytes 1-2: 16-bit WQE index (ref §3.3)
    qpn: int                # bytes 4-6 (ref §3.3)
    byte0: int              # opmod (rdma-core) or index bits 23:16 (DOCA); ignored by the NIC
    opcode: int             # byte 3: the last WQE's opcode (rdma-core), else 0
    ds: int                 # byte 7 bits 5:0: the last WQE's DS (rdma-core), else 0

    @property
    def value(self) -> int:
        """The u64 a little-endian CPU loads from the 8 bytes."""
        return int.from_bytes(self.raw, "little")

    @property
    def names_last_wqe(self) -> bool:
        """True for the rdma-core convention (DS != 0): the index is the last WQE's own index."""
        return self.ds != 0

    @property
    def end_index(self) -> int:
        """The producer index the doorbell announces (the WQEBB after the last posted WQE).

        rdma-core names the last WQE, so its WQEBB count (ceil(DS/4), ref §1.1) is added;
        NVSHMEM/DeepEP/DOCA already store the next free index."""
        if self.ds:
            return (self.producer_index + (self.ds + 3) // 4) % WQE_INDEX_MODULUS
        return self.producer_index

    @property
    def convention(self) -> str:
        """Best reading of the writer: 'rdma-core' (DS set), 'doca' (byte 0 set, DS 0),
        or 'nvshmem/doca' (both index-only writers give the same bytes below 0x10000)."""
        if self.ds:
            return "rdma-core"
        return "doca" if self.byte0 else "nvshmem/doca"


def _doorbell_raw(value) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    elif isinstance(value, memoryview) or getattr(value, "ndim", 0) > 0:   # memoryview / numpy array
        raw = bytes(memoryview(value).cast("B"))
    else:
        v = int(value)
        if not 0 <= v < 1 << 64:
            raise Mlx5DecodeError(f"doorbell value {v:#x} is not a u64")
        return v.to_bytes(8, "little")
    if len(raw) != DOORBELL_SIZE:
        raise Mlx5DecodeError(f"a doorbell write is {DOORBELL_SIZE} bytes, got {len(raw)}")
    return raw


def parse_doorbell(value) -> Doorbell:
    """Decode an 8-byte doorbell write: 8 bytes as stored, or the u64 loaded little-endian
    from them (ref §3.3).  Accepts all three writer conventions."""
    raw = _doorbell_raw(value)
    return Doorbell(raw=raw, producer_index=int.from_bytes(raw[1:3], "big"),
                    qpn=int.from_bytes(raw[4:7], "big"), byte0=raw[0], opcode=raw[3],
                    ds=raw[7] & DS_MASK)


def doorbell_bytes(pi: int, qpn: int, convention: str = "nvshmem", *, opcode: int = 0,
                   opmod: int = 0, ds: int = 0) -> bytes:
    """The 8 bytes a writer of ``convention`` stores for producer index ``pi`` (ref §3.3).

    'nvshmem' (also DeepEP): ``pi`` = next free WQEBB (16-bit).  'doca': ``pi`` may be the
    64-bit index (bits 23:16 land in byte 0).  'rdma-core': ``pi`` = the index of the last
    WQE posted, with its ``opcode``, ``opmod`` and ``ds`` (the first 8 bytes of its ctrl).
    """
    if not 0 <= qpn <= 0xFFFFFF:
        raise ValueError("QPN is 24 bits")
    if convention == "nvshmem":
        first = (pi & 0xFFFF) << 8
        second = qpn << 8
    elif convention == "doca":
        first = (pi << 8) & 0xFFFFFFFF
        second = qpn << 8
    elif convention == "rdma-core":
        if not 0 < ds <= DS_MASK:
            raise ValueError("the rdma-core doorbell carries the last WQE's DS (1..63)")
        first = (opmod << 24) | ((pi & 0xFFFF) << 8) | opcode
        second = (qpn << 8) | ds
    else:
        raise ValueError(f"unknown doorbell convention {convention!r} (rdma-core, nvshmem, doca)")
    return struct.pack(">II", first, second)


def doorbell_value(pi: int, qpn: int, convention: str = "nvshmem", **kw) -> int:
    """``doorbell_bytes`` as the u64 a little-endian CPU stores (ref §3.3, e.g. DB1 0x0023010000060000)."""
    return int.from_bytes(doorbell_bytes(pi, qpn, convention, **kw), "little")


def dbr_bytes(pi: int) -> bytes:
    """SQ doorbell-record value at DBR+4: BE32(pi & 0xffff), the next free WQEBB (ref §3.1)."""
    return struct.pack(">I", pi & 0xFFFF)


def parse_dbr(value) -> int:
    """16-bit producer index from a 4-byte DBR word (bytes, or the u32 loaded little-endian)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) != 4:
            raise Mlx5DecodeError(f"a DBR counter is 4 bytes, got {len(raw)}")
    else:
        raw = int(value).to_bytes(4, "little")
    word = int.from_bytes(raw, "big")
    if word >> 16:
        raise Mlx5DecodeError(f"DBR value {word:#010x} has bits above 15 set (ref §3.1: upper 16 bits are 0)")
    return word
