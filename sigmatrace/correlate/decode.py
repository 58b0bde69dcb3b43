"""Per-file decode: one capture file -> compact columnar output (runs in a worker).

Streams the file chunk by chunk with ``iter_chunks`` (errors="recover", so a
cut or corrupt file yields what is sound plus a list of losses) and keeps,
per process found in the file:

* the metadata (header JSON, threads, calibration rows, END footer,
  aggregates) and the side records the correlator interprets (JSON, PRM
  commands, recovered WQE bytes);
* the event records as numpy columns with EXT continuations removed from the
  primary stream and kept aside (``ext_pos`` = index of the primary record a
  continuation belongs to, plus its four slots).

No per-event Python: each EVENTS chunk is one ``np.frombuffer`` and the
final split into columns is a handful of vector operations.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import TraceFormatError
from ..format import events as E
from ..format import layout as L
from ..format.reader import iter_chunks

EXT = E.EXT
_SIDE_HEAD = struct.Struct("<QIHH")


@dataclass
class ProcDecode:
    uid: int
    path: str
    header: dict | None = None
    threads: dict = field(default_factory=dict)
    calibration: np.ndarray = None
    end: dict | None = None
    aggregates: np.ndarray = None
    aggregate_thread: np.ndarray = None
    side_json: dict = field(default_factory=dict)
    side_prm: dict = field(default_factory=dict)   # side_id -> (in bytes, out bytes)
    side_wqe: dict = field(default_factory=dict)   # side_id -> (header tuple, bytes)
    side_bad: int = 0
    # events (primary records only)
    tsc: np.ndarray = None
    type: np.ndarray = None
    aux: np.ndarray = None
    obj: np.ndarray = None
    arg: np.ndarray = None
    thread: np.ndarray = None
    # EXT continuations: index into the primary arrays + the slots
    ext_pos: np.ndarray = None
    ext_x0: np.ndarray = None
    ext_x1: np.ndarray = None
    ext_x2: np.ndarray = None
    ext_x3: np.ndarray = None

    @property
    def n_events(self) -> int:
        return 0 if self.tsc is None else len(self.tsc)


@dataclass
class FileDecode:
    path: str
    processes: list = field(default_factory=list)
    losses: list = field(default_factory=list)     # (path, offset, nbytes, reason)
    warnings: list = field(default_factory=list)
    error: str | None = None
    records: int = 0


def _json(payload, path, off, warnings):
    try:
        obj = json.loads(bytes(payload).rstrip(b"\0").decode())
        return obj if isinstance(obj, dict) else None
    except (ValueError, UnicodeDecodeError) as e:
        warnings.append(f"{path}: bad JSON chunk at offset {off}: {e}")
        return None


def _sides(proc: ProcDecode, payload, count):
    p = payload
    pos = 0
    for _ in range(count):
        sid, length, kind, flags = _SIDE_HEAD.unpack_from(p, pos)
        data = bytes(p[pos + 16: pos + 16 + length])
        pos += 16 + length + L.pad8(length)
        try:
            if kind == L.SIDE_JSON:
                proc.side_json[sid] = json.loads(data.decode())
            elif kind == L.SIDE_PRM_COMMAND:
                in_len, out_len = struct.unpack_from("<II", data, 0)
                if 8 + in_len + out_len > len(data):
                    raise ValueError("PRM lengths exceed the record")
                proc.side_prm[sid] = (data[8:8 + in_len], data[8 + in_len:8 + in_len + out_len])
            elif kind == L.SIDE_WQE_BYTES:
                head = struct.unpack_from("<IHHII", data, 0)
                body = data[16:]
                if len(body) != head[2] * 64:
                    raise ValueError("WQE record length does not match num_wqebb")
                proc.side_wqe[sid] = (head, body)
        except (ValueError, UnicodeDecodeError, struct.error):
            proc.side_bad += 1


def decode_file(path) -> FileDecode:
    """Decode one file; never raises for bad content (errors land in the result)."""
    path = str(path)
    out = FileDecode(path)
    procs: dict[int, ProcDecode] = {}
    parts: dict[int, list] = {}
    tparts: dict[int, list] = {}
    calib: dict[int, list] = {}
    aggs: dict[int, list] = {}
    losses = []
    try:
        for ch in iter_chunks(path, errors="recover", losses=losses):
            proc = procs.get(ch.process_uid)
            if proc is None:
                proc = procs[ch.process_uid] = ProcDecode(ch.process_uid, path)
            k = ch.kind
            if k == L.CHUNK_EVENTS:
                arr = np.frombuffer(ch.payload, L.EVENT_DTYPE, ch.count)
                parts.setdefault(ch.process_uid, []).append(arr.copy())
                tparts.setdefault(ch.process_uid, []).append((ch.thread_index, ch.count))
                out.records += ch.count
            elif k == L.CHUNK_PROCESS:
                h = _json(ch.payload, path, ch.offset, out.warnings)
                if h is not None:
                    v = h.get("format_version", L.VERSION)
                    if v != L.VERSION:
                        out.warnings.append(f"{path}: process {ch.process_uid:#x} header says format version {v}; "
                                            f"read as version {L.VERSION}")
                    if proc.header is not None:
                        out.warnings.append(f"{path}: process uid {ch.process_uid:#x} has two PROCESS headers; "
                                            f"the first is kept")
                    else:
                        proc.header = h
            elif k == L.CHUNK_SIDE:
                _sides(proc, ch.payload, ch.count)
            elif k == L.CHUNK_CALIBRATION:
                calib.setdefault(ch.process_uid, []).append(np.frombuffer(ch.payload, L.CALIBRATION_DTYPE, ch.count))
            elif k == L.CHUNK_AGGREGATE:
                aggs.setdefault(ch.process_uid, []).append(
                    (np.frombuffer(ch.payload, L.AGGREGATE_DTYPE, ch.count).copy(), ch.thread_index))
            elif k == L.CHUNK_THREAD:
                t = _json(ch.payload, path, ch.offset, out.warnings)
                if t is not None:
                    proc.threads[ch.thread_index] = t
            elif k == L.CHUNK_END:
                proc.end = _json(ch.payload, path, ch.offset, out.warnings)
    except TraceFormatError as e:  # unreadable file
        out.error = str(e)
    except OSError as e:
        out.error = f"{path}: {e}"
    out.losses = [(l.path, l.offset, l.nbytes, l.reason) for l in losses]
    for uid, proc in procs.items():
        cal = calib.get(uid)
        proc.calibration = np.concatenate(cal) if cal else np.zeros(0, L.CALIBRATION_DTYPE)
        ap = aggs.get(uid)
        if ap:
            proc.aggregates = np.concatenate([a for a, _ in ap])
            proc.aggregate_thread = np.repeat(np.array([t for _, t in ap], np.uint32),
                                              np.array([len(a) for a, _ in ap], np.int64))
        else:
            proc.aggregates = np.zeros(0, L.AGGREGATE_DTYPE)
            proc.aggregate_thread = np.zeros(0, np.uint32)
        _split_events(proc, parts.get(uid, []), tparts.get(uid, []))
        if proc.header is None:
            out.warnings.append(f"{path}: process uid {uid:#x} has no PROCESS header (file cut or damaged); "
                                f"its events are kept with unknown host/rank")
        out.processes.append(proc)
    return out


def _split_events(proc: ProcDecode, parts, tparts):
    if parts:
        ev = np.concatenate(parts) if len(parts) > 1 else parts[0]
        thr = np.repeat(np.array([t for t, _ in tparts], np.uint32), np.array([c for _, c in tparts], np.int64))
    else:
        ev = np.zeros(0, L.EVENT_DTYPE)
        thr = np.zeros(0, np.uint32)
    is_ext = ev["type"] == EXT
    if is_ext.any():
        prim = ~is_ext
        # index (in the primary stream) of the record each EXT continues
        prim_rank = np.cumsum(prim) - 1
        ext_idx = np.flatnonzero(is_ext)
        owner = prim_rank[ext_idx]
        # only the first EXT after a primary record carries x0..x3
        first = np.ones(len(ext_idx), bool)
        first[1:] = owner[1:] != owner[:-1]
        ext_idx, owner = ext_idx[first], owner[first]
        ok = owner >= 0
        ext_idx, owner = ext_idx[ok], owner[ok]
        e = ev[ext_idx]
        proc.ext_pos = owner.astype(np.int64)
        proc.ext_x0, proc.ext_x1, proc.ext_x2, proc.ext_x3 = e["tsc"], e["aux"], e["obj"], e["arg"]
        ev = ev[prim]
        thr = thr[prim]
    else:
        proc.ext_pos = np.zeros(0, np.int64)
        proc.ext_x0 = np.zeros(0, np.uint64)
        proc.ext_x1 = np.zeros(0, np.uint16)
        proc.ext_x2 = np.zeros(0, np.uint32)
        proc.ext_x3 = np.zeros(0, np.uint64)
    proc.tsc = np.ascontiguousarray(ev["tsc"])
    proc.type = np.ascontiguousarray(ev["type"])
    proc.aux = np.ascontiguousarray(ev["aux"])
    proc.obj = np.ascontiguousarray(ev["obj"])
    proc.arg = np.ascontiguousarray(ev["arg"])
    proc.thread = thr
