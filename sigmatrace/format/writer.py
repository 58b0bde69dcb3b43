"""Python writer of trace format v1.

Used by the SimPy model (which must write exactly what the native tracer
writes) and by tests.  Events are written in bulk from numpy arrays; the
writer splits them into chunks without ever separating a record from its EXT
continuation records.

    with TraceWriter("p0.trace", process_uid=0x1234) as w:
        w.process({"host": "node0", "pid": 7, ...})
        w.thread(1, tid=7, name="main")
        w.calibration([...])
        w.events(1, records)                   # EVENT_DTYPE array
        sid = w.side(SIDE_JSON, b'{"a": 1}')
        w.end({"reason": "exit"})
"""
import json
import os
import struct
import zlib

import numpy as np

from . import layout as L
from .events import EXT as _EXT

_HEADER = struct.Struct("<IHHQIIII")  # chunk header, same order as st_chunk_header


def chunk_bytes(kind: int, process_uid: int, thread_index: int, count: int, payload: bytes) -> bytes:
    """One complete chunk: header with CRC-32 over header bytes 0..27 and payload."""
    if len(payload) % 8:
        raise ValueError("chunk payload must be a multiple of 8 bytes")
    if len(payload) > L.MAX_PAYLOAD:
        raise ValueError("chunk payload too large")
    head = _HEADER.pack(L.MAGIC, L.VERSION, kind, process_uid, thread_index, len(payload), count, 0)[:28]
    crc = zlib.crc32(payload, zlib.crc32(head)) & 0xFFFFFFFF
    return head + struct.pack("<I", crc) + payload


def json_payload(obj) -> bytes:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return data + b"\0" * L.pad8(len(data))


def split_points(types: np.ndarray, max_records: int):
    """Chunk boundaries (start indices) so that no EXT record starts a chunk."""
    n = len(types)
    starts = [0]
    while starts[-1] + max_records < n:
        cut = starts[-1] + max_records
        # move the cut back to the primary record of a trailing EXT group
        while cut > starts[-1] and types[cut] == _EXT:
            cut -= 1
        if cut == starts[-1]:
            raise ValueError("an EXT group is longer than a chunk")
        starts.append(cut)
    return starts



class TraceWriter:
    """Writes one process's chunks to a file object or path (append-safe)."""

    def __init__(self, dest, process_uid: int, chunk_records: int = 2730):
        if isinstance(dest, (str, os.PathLike)):
            self._f = open(dest, "wb")
            self._own = True
        else:
            self._f = dest
            self._own = False
        self.process_uid = int(process_uid)
        self.chunk_records = int(chunk_records)
        self._next_side_id = 1
        self._side_buf = []
        self._side_count = 0
        self._side_bytes = 0
        self.bytes_written = 0
        self.events_written = 0

    # -- low level -------------------------------------------------------
    def _chunk(self, kind, thread_index, count, payload):
        b = chunk_bytes(kind, self.process_uid, thread_index, count, payload)
        self._f.write(b)
        self.bytes_written += len(b)

    # -- records ---------------------------------------------------------
    def process(self, header: dict):
        self._chunk(L.CHUNK_PROCESS, 0, 0, json_payload(header))

    def thread(self, thread_index: int, **info):
        info = dict(info, thread_index=thread_index)
        self._chunk(L.CHUNK_THREAD, thread_index, 0, json_payload(info))

    def calibration(self, records, thread_index: int = 0):
        arr = np.asarray(records, dtype=L.CALIBRATION_DTYPE)
        self._chunk(L.CHUNK_CALIBRATION, thread_index, len(arr), arr.tobytes())

    def events(self, thread_index: int, records):
        arr = np.ascontiguousarray(records, dtype=L.EVENT_DTYPE)
        if len(arr) == 0:
            return
        if arr["type"][0] == _EXT:
            raise ValueError("an event stream cannot start with an EXT record")
        starts = split_points(arr["type"], self.chunk_records) + [len(arr)]
        for a, b in zip(starts[:-1], starts[1:]):
            self._chunk(L.CHUNK_EVENTS, thread_index, b - a, arr[a:b].tobytes())
        self.events_written += len(arr)

    def aggregate(self, records, thread_index: int = 0):
        arr = np.asarray(records, dtype=L.AGGREGATE_DTYPE)
        self._chunk(L.CHUNK_AGGREGATE, thread_index, len(arr), arr.tobytes())

    def side(self, kind: int, data: bytes, side_id=None, flags: int = 0) -> int:
        """Queue a side record; returns its side_id (flushed with flush_side())."""
        if side_id is None:
            side_id = self._next_side_id
        self._next_side_id = max(self._next_side_id, side_id + 1)
        data = bytes(data)
        rec = np.zeros(1, L.SIDE_HEADER_DTYPE)
        rec["side_id"], rec["length"], rec["kind"], rec["flags"] = side_id, len(data), kind, flags
        self._side_buf.append(rec.tobytes() + data + b"\0" * L.pad8(len(data)))
        self._side_count += 1
        self._side_bytes += len(self._side_buf[-1])
        if self._side_bytes >= (1 << 20):
            self.flush_side()
        return side_id

    def side_json(self, obj) -> int:
        return self.side(L.SIDE_JSON, json.dumps(obj, sort_keys=True).encode())

    def side_prm(self, in_buf: bytes, out_buf: bytes) -> int:
        head = struct.pack("<II", len(in_buf), len(out_buf))
        return self.side(L.SIDE_PRM_COMMAND, head + bytes(in_buf) + bytes(out_buf))

    def side_wqe(self, qpn, first_wqe_index, log_sq_size, wqe_bytes: bytes, flags=L.WQE_F_VERIFIED) -> int:
        if len(wqe_bytes) % 64:
            raise ValueError("WQE bytes must be whole 64-byte WQEBBs")
        head = struct.pack("<IHHII", qpn, first_wqe_index & 0xFFFF, len(wqe_bytes) // 64, log_sq_size, flags)
        return self.side(L.SIDE_WQE_BYTES, head + bytes(wqe_bytes))

    def flush_side(self):
        if self._side_buf:
            self._chunk(L.CHUNK_SIDE, 0, self._side_count, b"".join(self._side_buf))
            self._side_buf, self._side_count, self._side_bytes = [], 0, 0

    def end(self, footer: dict):
        self.flush_side()
        self._chunk(L.CHUNK_END, 0, 0, json_payload(footer))

    def close(self):
        self.flush_side()
        if self._own:
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
