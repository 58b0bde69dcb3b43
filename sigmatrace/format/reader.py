"""Reader of trace format v1.

Two levels:
  * ``iter_chunks(path)`` streams validated chunks of one file (constant
    memory; used by the correlator for captures larger than RAM);
  * ``read_capture(path_or_paths)`` loads a whole capture (one file, a list
    of files, or a directory of per-process files) into numpy arrays.

Errors: a file cut at any byte decodes up to its last complete chunk and
the lost tail is reported in ``Capture.losses``; anything else that is wrong
(bad magic, CRC mismatch, impossible lengths, unknown version) raises
``sigmatrace.TraceFormatError`` with the file and offset — or, with
``errors="recover"``, is skipped up to the next valid chunk and reported as a
loss.  No length field is trusted before it is checked against the bytes that
are really there, so corrupt input cannot cause large allocations.
"""
import json
import mmap
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError
from . import events as E
from . import layout as L

_HEADER = struct.Struct("<IHHQIIII")
_MAGIC_BYTES = struct.pack("<I", L.MAGIC)
CAPTURE_SUFFIXES = (".trace", ".bin", ".sttrace")
READ_WHOLE_LIMIT = 1 << 30  # larger files are memory-mapped instead of read


@dataclass
class Chunk:
    path: str
    offset: int  # of the chunk header in the file
    kind: int
    process_uid: int
    thread_index: int
    count: int
    payload: memoryview


@dataclass
class Loss:
    path: str
    offset: int
    nbytes: int
    reason: str


def side_json(data, side_id=None):
    """The object of a JSON side record; TraceFormatError when it is not JSON."""
    try:
        return json.loads(bytes(data).decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"JSON side record {side_id}: {e}") from None


_PRM_HEAD = struct.Struct("<II")
_WQE_HEAD = struct.Struct("<IHHII")


def side_prm(data, side_id=None):
    """(in_bytes, out_bytes) of a PRM_COMMAND side record (docs/format.md)."""
    if len(data) < _PRM_HEAD.size:
        raise TraceFormatError(f"PRM side record {side_id}: {len(data)} bytes, shorter than its header")
    in_len, out_len = _PRM_HEAD.unpack_from(data, 0)
    if 8 + in_len + out_len > len(data):
        raise TraceFormatError(f"PRM side record {side_id} lengths exceed its data")
    return data[8 : 8 + in_len], data[8 + in_len : 8 + in_len + out_len]


def side_wqe(data, side_id=None):
    """((qpn, first_wqe_index, num_wqebb, log_sq_size, flags), WQE bytes) of a WQE_BYTES side record."""
    if len(data) < _WQE_HEAD.size + 4:
        raise TraceFormatError(f"WQE side record {side_id}: {len(data)} bytes, shorter than its header")
    head = _WQE_HEAD.unpack_from(data, 0)
    body = data[16:]
    if len(body) != head[2] * 64:
        raise TraceFormatError(f"WQE side record {side_id}: {len(body)} bytes for {head[2]} WQEBBs")
    return head, body


def json_chunk(payload, path, offset, kind_name):
    """The object of a PROCESS / THREAD / END chunk; TraceFormatError (path, offset) when it is not one."""
    try:
        obj = json.loads(bytes(payload).rstrip(b"\0").decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"bad JSON in {kind_name} chunk: {e}", path, offset) from None
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{kind_name} chunk JSON is not an object", path, offset)
    return obj


@dataclass
class SideRecord:
    side_id: int
    kind: int
    flags: int
    data: bytes

    def json(self):
        return side_json(self.data, self.side_id)

    def text(self):
        return self.data.decode()

    def prm(self):
        """(in_bytes, out_bytes) of a PRM_COMMAND record."""
        return side_prm(self.data, self.side_id)

    def wqe(self):
        """(header dict, WQE bytes) of a WQE_BYTES record."""
        (qpn, first, num, log_sq, flags), body = side_wqe(self.data, self.side_id)
        return dict(qpn=qpn, first_wqe_index=first, num_wqebb=num, log_sq_size=log_sq, flags=flags), body


@dataclass
class ProcessInfo:
    index: int
    uid: int
    path: str
    header: dict = None
    threads: dict = field(default_factory=dict)
    calibration: np.ndarray = None
    aggregates: np.ndarray = None
    aggregate_thread: np.ndarray = None
    side: dict = field(default_factory=dict)
    end: dict = None
    event_count: int = 0

    @property
    def complete(self) -> bool:
        """True when the process wrote its END chunk (clean exit)."""
        return self.end is not None

    @property
    def host(self):
        return (self.header or {}).get("host")

    @property
    def rank(self):
        return (self.header or {}).get("rank")

    @property
    def pid(self):
        return (self.header or {}).get("pid")

    @property
    def untraced_libraries(self):
        """Libraries this process loaded that the tracer did not trace (provider disabled or not built):
        [{"library", "path", "provider", "reason"}] from the header (docs/format.md)."""
        return header_untraced(self.header)


def header_untraced(header):
    """The ``untraced_libraries`` of one PROCESS header (docs/format.md): well-formed entries only."""
    libs = (header or {}).get(L.HEADER_UNTRACED_LIBRARIES) or []
    return [x for x in libs if isinstance(x, dict) and x.get("library")] if isinstance(libs, list) else []


def untraced_libraries(headers):
    """The libraries the processes of these PROCESS headers loaded untraced, one entry per (library, provider,
    reason): {"library", "provider", "reason", "processes": [position in ``headers``, ...], "enabled": the
    providers the first of them traced}, in order of first appearance."""
    out = {}
    for i, h in enumerate(headers):
        for x in header_untraced(h):
            key = (x["library"], x.get("provider"), x.get("reason"))
            e = out.setdefault(key, {"library": key[0], "provider": key[1], "reason": key[2], "processes": [],
                                     "enabled": (h or {}).get("providers")})   # the first process's selection
            e["processes"].append(i)
    return list(out.values())


def _corrupt(path, offset, why):
    return TraceFormatError(why, path, offset)


def _valid_chunk_at(buf, off) -> bool:
    """True when a complete chunk with a correct CRC starts at off."""
    n = len(buf)
    if off + L.CHUNK_HEADER_SIZE > n:
        return False
    magic, version, kind, uid, thread, plen, count, crc = _HEADER.unpack_from(buf, off)
    if magic != L.MAGIC or plen > L.MAX_PAYLOAD or plen % 8 or off + 32 + plen > n:
        return False
    return (zlib.crc32(buf[off + 32 : off + 32 + plen], zlib.crc32(buf[off : off + 28])) & 0xFFFFFFFF) == crc


def _searchable(buf):
    """``buf`` itself when it has ``find``, else one bytes copy (made once per file, not per search)."""
    return buf if isinstance(buf, (bytes, bytearray, mmap.mmap)) else bytes(buf)


def _next_valid_chunk(buf, start, raw=None):
    raw = _searchable(buf) if raw is None else raw
    pos = start
    while True:
        pos = raw.find(_MAGIC_BYTES, pos)
        if pos < 0:
            return -1
        if _valid_chunk_at(buf, pos):
            return pos
        pos += 1


def _check_payload(kind, plen, count, payload, path, off):
    """Structural checks that need no allocation; returns a reason or None."""
    if kind == L.CHUNK_EVENTS:
        if plen != count * L.EVENT_SIZE:
            return f"EVENTS chunk: {plen} bytes for {count} records"
        if count and int.from_bytes(payload[8:10], "little") == E.EXT:
            return "EVENTS chunk starts with an EXT record"
    elif kind == L.CHUNK_CALIBRATION:
        if plen != count * L.CALIBRATION_DTYPE.itemsize:
            return f"CALIBRATION chunk: {plen} bytes for {count} records"
    elif kind == L.CHUNK_AGGREGATE:
        if plen != count * L.AGGREGATE_DTYPE.itemsize:
            return f"AGGREGATE chunk: {plen} bytes for {count} records"
    elif kind == L.CHUNK_SIDE:
        pos = 0
        for _ in range(count):
            if pos + L.SIDE_HEADER_SIZE > plen:
                return "SIDE chunk: record header past the payload"
            length = int.from_bytes(payload[pos + 8 : pos + 12], "little")
            pos += L.SIDE_HEADER_SIZE + length + L.pad8(length)
            if pos > plen:
                return "SIDE chunk: record data past the payload"
        if pos != plen:
            return "SIDE chunk: trailing bytes after the last record"
    elif kind not in L.CHUNK_KIND_NAMES:
        return f"unknown chunk kind {kind}"
    return None


def iter_chunks(path, errors="raise", losses=None, data=None, start=0, stop=None):
    """Yield the valid chunks of one file, in file order.

    errors="raise": corruption raises TraceFormatError(path, offset).
    errors="recover": corrupt spans are skipped to the next valid chunk and
    appended to ``losses`` (a list) as Loss records.  A truncated tail is
    always a Loss, never an error.
    ``start``/``stop``: read only the chunks that start in [start, stop)
    (``start`` must be a chunk boundary, e.g. from ``chunk_spans``); a
    corrupt span that would run past ``stop`` is reported up to ``stop``.
    """
    if errors not in ("raise", "recover"):
        raise ValueError("errors must be 'raise' or 'recover'")
    path = str(path)
    if losses is None:
        losses = []
    buf = data
    if buf is None:
        buf = _map(path)
    n = len(buf)
    off = int(start)
    lim = n if stop is None else min(n, int(stop))
    raw = None          # a searchable view of buf, made on the first resynchronisation
    while off < lim:
        reason = None
        if n - off < L.CHUNK_HEADER_SIZE:
            losses.append(Loss(path, off, n - off, "truncated chunk header"))
            return
        magic, version, kind, uid, thread, plen, count, crc = _HEADER.unpack_from(buf, off)
        end = off + L.CHUNK_HEADER_SIZE + plen
        if magic != L.MAGIC:
            reason = "bad magic (not a sigmatrace chunk)" if off else "not a sigmatrace capture (bad magic)"
        elif version != L.VERSION:
            reason = f"unsupported format version {version} (this reader reads version {L.VERSION})"
        elif plen > L.MAX_PAYLOAD or plen % 8:
            reason = f"impossible payload length {plen}"
        elif end > n:
            raw = _searchable(buf) if raw is None else raw
            nxt = _next_valid_chunk(buf, off + 1, raw)
            if nxt < 0:
                losses.append(Loss(path, off, n - off, f"truncated chunk ({n - off} of {end - off} bytes)"))
                return
            reason = f"payload length {plen} runs into the next chunk"
        else:
            head_crc = zlib.crc32(buf[off : off + 28])
            payload = memoryview(buf)[off + 32 : end]
            if (zlib.crc32(payload, head_crc) & 0xFFFFFFFF) != crc:
                reason = "CRC mismatch"
            else:
                reason = _check_payload(kind, plen, count, payload, path, off)
        if reason is not None:
            if errors == "raise":
                raise _corrupt(path, off, reason)
            raw = _searchable(buf) if raw is None else raw
            nxt = _next_valid_chunk(buf, off + 1, raw)
            skip_to = n if nxt < 0 else nxt
            if stop is not None and skip_to > lim:
                skip_to = lim
            losses.append(Loss(path, off, skip_to - off, reason))
            off = skip_to
            continue
        yield Chunk(path, off, kind, uid, thread, count, payload)
        off = end


class HeaderFile:
    """A capture file whose chunk headers are read on demand (``os.pread`` of PAGE bytes where a header is), not
    the file: ``chunk_spans``, ``bounded_spans``, ``repeated_from`` and ``process_spans`` walk a file of any
    size through it holding one small window (the cluster report's plan runs in a worker with bounded memory;
    a memory map would leave every page it touched resident).  ``read_bytes``: what was read (tests)."""

    PAGE = 512         # bytes read at a header: the headers of small chunks that follow it come along

    def __init__(self, path):
        self.fd = os.open(str(path), os.O_RDONLY)
        self.n = os.fstat(self.fd).st_size
        self.base, self.page, self.read_bytes = 0, b"", 0

    def __len__(self):
        return self.n

    def header(self, off):
        if not (self.base <= off and off + L.CHUNK_HEADER_SIZE <= self.base + len(self.page)):
            self.base, self.page = off, os.pread(self.fd, self.PAGE, off)
            self.read_bytes += len(self.page)
        return _HEADER.unpack_from(self.page, off - self.base)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _header_at(buf, off):
    """The chunk header at ``off`` of a file's bytes or of a ``HeaderFile`` (the caller checked it fits)."""
    return buf.header(off) if isinstance(buf, HeaderFile) else _HEADER.unpack_from(buf, off)


def _sound(magic, version, plen):
    """A chunk header the header walks trust (no CRC): the format's magic and version, a possible length."""
    return magic == L.MAGIC and version == L.VERSION and plen <= L.MAX_PAYLOAD and not plen % 8


def chunk_spans(path, parts, data=None):
    """Split one file into at most ``parts`` byte ranges [start, stop) that begin on chunk boundaries.

    Walks the chunk headers only (no CRC); where a header looks wrong the walk
    stops and the rest of the file is the last range (``iter_chunks`` with
    errors="recover" then deals with it).  Ranges cover the file exactly.
    """
    buf = data if data is not None else _map(str(path))
    n = len(buf)
    parts = max(1, int(parts))
    if parts == 1 or n == 0:
        return [(0, n)]
    target = n / parts
    cuts = [0]
    off = 0
    while off + L.CHUNK_HEADER_SIZE <= n and len(cuts) < parts:
        magic, version, kind, uid, thread, plen, count, crc = _header_at(buf, off)
        if not _sound(magic, version, plen):
            break
        nxt = off + L.CHUNK_HEADER_SIZE + plen
        if nxt >= n:
            break
        if nxt >= target * len(cuts):
            cuts.append(nxt)
        off = nxt
    cuts.append(n)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def bounded_spans(buf, start=0, stop=None, max_bytes=1 << 28):
    """Split [start, stop) of one file (``buf``: its bytes or a ``HeaderFile``) into byte ranges that begin on
    chunk boundaries and hold at most ``max_bytes`` each (a single chunk larger than that is a range of its
    own), so that whoever decodes a range holds a bounded part of the file whatever its size.

    Walks the chunk headers only (no CRC), like ``chunk_spans``: where a header looks wrong the walk stops
    and the rest is the last range (``iter_chunks`` with errors="recover" deals with it).  The ranges cover
    [start, stop) exactly; the last one ends at ``stop`` as given (None: the end of the file)."""
    n = len(buf) if stop is None else min(len(buf), int(stop))
    max_bytes = max(1, int(max_bytes))
    cuts, off, lo = [], int(start), int(start)
    while off + L.CHUNK_HEADER_SIZE <= n:
        magic, version, kind, uid, thread, plen, count, crc = _header_at(buf, off)
        if not _sound(magic, version, plen):
            break
        nxt = off + L.CHUNK_HEADER_SIZE + plen
        if nxt > n:
            break
        if nxt - lo > max_bytes and off > lo:      # the chunk would overflow the range: it starts the next
            cuts.append(off)
            lo = off
        off = nxt
    bounds = [int(start)] + cuts
    return [(a, b) for a, b in zip(bounds, cuts + [stop])]


def repeated_from(path, data=None):
    """(offset, chunks, uids) when the file holds processes again after their END chunk — a capture
    concatenated with itself, or a process file appended twice — else None.

    ``offset``: the first such chunk; the tail from there is dropped by the readers only when every chunk
    in it belongs to a process that had already ended (the usual ``cat a.bin a.bin``); ``chunks``: how many
    chunks come after their process's END.  Walks the chunk headers only (no CRC), stopping where a header
    looks wrong (``iter_chunks`` deals with that part)."""
    buf = data if data is not None else _map(str(path))
    n = len(buf)
    ended, first, count, uids, only_repeats = set(), None, 0, set(), True
    off = 0
    while off + L.CHUNK_HEADER_SIZE <= n:
        magic, version, kind, uid, thread, plen, cnt, crc = _header_at(buf, off)
        if not _sound(magic, version, plen):
            break
        if uid in ended:
            if first is None:
                first = off
            count += 1
            uids.add(uid)
        elif first is not None:
            only_repeats = False
        if kind == L.CHUNK_END and first is None:
            ended.add(uid)
        off += L.CHUNK_HEADER_SIZE + plen
    if first is None:
        return None
    return first, count, sorted(uids), only_repeats


def process_spans(path, data=None, stop=None):
    """Byte ranges [start, end) of the processes of one file, in file order, when each process's chunks are
    contiguous (per-process files concatenated: contract 1) and every chunk header before ``stop`` (default:
    the end) looks sound; else None (the file is then read as one range).  Walks the chunk headers only (no
    CRC): a damaged chunk inside a range is ``iter_chunks``' to recover, up to the range's end."""
    buf = data if data is not None else _map(str(path))
    n = len(buf) if stop is None else min(len(buf), int(stop))
    spans, seen, cur, start, off = [], set(), None, 0, 0
    while off < n:
        if off + L.CHUNK_HEADER_SIZE > n:
            return None
        magic, version, kind, uid, thread, plen, cnt, crc = _header_at(buf, off)
        end = off + L.CHUNK_HEADER_SIZE + plen
        if not _sound(magic, version, plen) or end > n:
            return None
        if uid != cur:
            if uid in seen:
                return None
            if cur is not None:
                spans.append((start, off))
            seen.add(uid)
            cur, start = uid, off
        off = end
    if cur is not None:
        spans.append((start, n))
    return spans


def repeat_warning(path, found):
    off, count, uids, dropped = found
    return (f"{path}: {count} chunk(s) of process(es) {', '.join(f'{u:#x}' for u in uids[:4])}"
            f"{'…' if len(uids) > 4 else ''} come after their END chunk, from offset {off} (the file holds them "
            f"twice: a capture concatenated with itself?); "
            + ("that tail is ignored" if dropped else "kept: counts from this file may be doubled"))


def _map(path):
    try:
        size = os.path.getsize(path)
        if size == 0:
            return b""
        with open(path, "rb") as f:
            if size <= READ_WHOLE_LIMIT:
                return f.read()  # one read() is the fastest way in; bytes are immutable
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror or e}", path) from None


def _parse_json(chunk, errors="raise", warnings=None):
    """A JSON chunk's object; with errors="recover" a bad one is a warning and None (the decoder's rule)."""
    try:
        return json_chunk(chunk.payload, chunk.path, chunk.offset, L.CHUNK_KIND_NAMES[chunk.kind])
    except TraceFormatError as e:
        if errors == "raise":
            raise
        warnings.append(str(e))
        return None


def _parse_side(chunk):
    out = []
    p = chunk.payload
    pos = 0
    for _ in range(chunk.count):
        side_id, length, kind, flags = struct.unpack_from("<QIHH", p, pos)
        data = bytes(p[pos + 16 : pos + 16 + length])
        out.append(SideRecord(side_id, kind, flags, data))
        pos += 16 + length + L.pad8(length)
    return out


def capture_files(path_or_paths):
    """Expand a file, a directory of process files, or a list of either."""
    if isinstance(path_or_paths, (str, os.PathLike)):
        items = [path_or_paths]
    else:
        items = list(path_or_paths)
    files = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and q.suffix in CAPTURE_SUFFIXES)
            if not found:
                raise TraceFormatError(f"no capture files ({', '.join(CAPTURE_SUFFIXES)}) in directory", p)
            files.extend(found)
        elif p.is_file():
            files.append(p)
        elif p.exists():
            raise TraceFormatError("not a regular file or a directory of capture files", p)
        else:
            raise TraceFormatError("no such capture file or directory", p)
    return files


class Capture:
    """A whole capture in memory: processes, their events and side data."""

    def __init__(self):
        self.paths = []
        self.processes = []
        self.events = np.zeros(0, L.EVENT_DTYPE)
        self.event_process = np.zeros(0, np.uint32)
        self.event_thread = np.zeros(0, np.uint32)
        self.losses = []
        self.warnings = []

    # -- lookups ---------------------------------------------------------
    def process(self, uid):
        for p in self.processes:
            if p.uid == uid:
                return p
        raise KeyError(uid)

    @property
    def lost_bytes(self) -> int:
        return sum(l.nbytes for l in self.losses)

    def dropped_events(self) -> int:
        """Events the tracer itself dropped (DROPS records and END totals)."""
        drops = self.events["arg"][self.events["type"] == E.DROPS]
        in_stream = int(drops.sum()) if len(drops) else 0
        footer = sum(int((p.end or {}).get("dropped_events", 0)) for p in self.processes)
        return max(in_stream, footer)

    def count_by_type(self):
        """{event name: count} of primary records."""
        types, counts = np.unique(self.events["type"], return_counts=True)
        return {E.name_of(t): int(c) for t, c in zip(types, counts) if t != E.EXT}

    def calls(self, name, process_index=None):
        """How many calls the records of one event type stand for: the last record of a run of idle polls
        counts the calls the recorder did not write (its ``polls``, events.IDLE_POLLS_SHIFT)."""
        t = self.table(name)
        keep = np.ones(len(t["tsc"]), bool) if process_index is None else t["process"] == process_index
        if "polls" not in t:
            return int(np.count_nonzero(keep))
        return int(np.maximum(t["polls"][keep].astype(np.int64), 1).sum())

    def table(self, name):
        """Columns of every record of one event type, EXT fields joined.

        Returns a dict of numpy arrays: tsc, process, thread and the named
        fields of the type (see events.py).  No per-event Python loop.
        """
        et = E.BY_NAME[name]
        ev = self.events
        idx = np.flatnonzero(ev["type"] == et.value)
        cols = {"tsc": ev["tsc"][idx], "process": self.event_process[idx], "thread": self.event_thread[idx]}
        ext_idx = None
        if et.has_ext:
            nxt = idx + 1
            nxt_c = np.minimum(nxt, max(len(ev) - 1, 0))
            has = (nxt < len(ev)) & (ev["type"][nxt_c] == E.EXT) if len(ev) else np.zeros(0, bool)
            ext_idx = (nxt_c, has)
        slot_src = {"aux": "aux", "obj": "obj", "arg": "arg", "x0": "tsc", "x1": "aux", "x2": "obj", "x3": "arg"}
        for col, slot, lo, width in et.columns():
            src = slot_src[slot]
            if slot.startswith("x"):
                nxt_c, has = ext_idx
                vals = np.where(has, ev[src][nxt_c], 0).astype(ev.dtype[src])
            else:
                vals = ev[src][idx]
            if width is not None:
                vals = (vals >> np.asarray(lo, vals.dtype)) & np.asarray((1 << width) - 1, vals.dtype)
            cols[col] = vals
        return cols

    def untraced_libraries(self):
        """The libraries some process loaded untraced (``untraced_libraries`` of the processes)."""
        return untraced_libraries([p.header for p in self.processes])

    def side_record(self, process_index, side_id):
        return self.processes[process_index].side.get(int(side_id))

    def summary(self) -> dict:
        return {
            "files": [str(p) for p in self.paths],
            "processes": len(self.processes),
            "events": int(np.count_nonzero(self.events["type"] != E.EXT)),
            "records": int(len(self.events)),
            "by_type": self.count_by_type(),
            "dropped_events": self.dropped_events(),
            "lost_bytes": self.lost_bytes,
            "incomplete_processes": [p.index for p in self.processes if not p.complete],
        }


def read_capture(path_or_paths, errors="raise") -> Capture:
    """Load one capture (file, directory of process files, or a list).

    errors="raise": corrupt input raises TraceFormatError.  errors="recover": corrupt spans become
    ``losses`` and a bad JSON chunk (header, thread, end) a warning with its file and offset, as the
    correlator's decoder treats them (``format.reader.json_chunk`` is the one rule)."""
    cap = Capture()
    cap.paths = capture_files(path_or_paths)
    by_uid = {}
    owner_path = {}
    ev_parts, ev_proc, ev_thread = [], [], []
    calib = {}
    aggs = {}
    for path in cap.paths:
        data = _map(str(path))
        rep = repeated_from(path, data)
        stop = None
        if rep is not None:
            cap.warnings.append(repeat_warning(path, rep))
            stop = rep[0] if rep[3] else None
        for ch in iter_chunks(path, errors=errors, losses=cap.losses, data=data, stop=stop):
            proc = by_uid.get(ch.process_uid)
            if ch.kind == L.CHUNK_PROCESS:
                if proc is not None and proc.header is not None and owner_path.get(ch.process_uid) != ch.path:
                    cap.warnings.append(
                        f"{ch.path}: process uid {ch.process_uid:#x} duplicates one already read from "
                        f"{owner_path[ch.process_uid]}; its chunks in this file are ignored"
                    )
                    by_uid.setdefault(("dup", ch.path), set()).add(ch.process_uid)
                    continue
            if ch.process_uid in by_uid.get(("dup", ch.path), ()):
                continue
            if proc is None:
                proc = ProcessInfo(len(cap.processes), ch.process_uid, ch.path)
                cap.processes.append(proc)
                by_uid[ch.process_uid] = proc
                owner_path[ch.process_uid] = ch.path
            k = ch.kind
            if k == L.CHUNK_PROCESS:
                h = _parse_json(ch, errors, cap.warnings)
                if h is not None:
                    v = h.get("format_version", L.VERSION)
                    if v != L.VERSION:
                        if errors == "raise":
                            raise TraceFormatError(f"process header says format version {v}", ch.path, ch.offset)
                        cap.warnings.append(f"{ch.path}: process {ch.process_uid:#x} header says format version "
                                            f"{v}; read as version {L.VERSION}")
                    proc.header = h
            elif k == L.CHUNK_EVENTS:
                ev_parts.append(np.frombuffer(ch.payload, L.EVENT_DTYPE, ch.count))
                ev_proc.append((proc.index, ch.count))
                ev_thread.append((ch.thread_index, ch.count))
                proc.event_count += ch.count
            elif k == L.CHUNK_SIDE:
                for rec in _parse_side(ch):
                    proc.side[rec.side_id] = rec
            elif k == L.CHUNK_CALIBRATION:
                calib.setdefault(proc.index, []).append(np.frombuffer(ch.payload, L.CALIBRATION_DTYPE, ch.count))
            elif k == L.CHUNK_AGGREGATE:
                aggs.setdefault(proc.index, []).append(
                    (np.frombuffer(ch.payload, L.AGGREGATE_DTYPE, ch.count), ch.thread_index)
                )
            elif k == L.CHUNK_THREAD:
                t = _parse_json(ch, errors, cap.warnings)
                if t is not None:
                    proc.threads[ch.thread_index] = t
            elif k == L.CHUNK_END:
                proc.end = _parse_json(ch, errors, cap.warnings)
    if ev_parts:
        cap.events = np.concatenate(ev_parts)
        counts = np.fromiter((c for _, c in ev_proc), np.int64, len(ev_proc))
        cap.event_process = np.repeat(np.fromiter((p for p, _ in ev_proc), np.uint32, len(ev_proc)), counts)
        cap.event_thread = np.repeat(np.fromiter((t for t, _ in ev_thread), np.uint32, len(ev_thread)), counts)
    for proc in cap.processes:
        parts = calib.get(proc.index)
        proc.calibration = np.concatenate(parts) if parts else np.zeros(0, L.CALIBRATION_DTYPE)
        ap = aggs.get(proc.index)
        if ap:
            proc.aggregates = np.concatenate([a for a, _ in ap])
            proc.aggregate_thread = np.repeat(
                np.array([t for _, t in ap], np.uint32), np.array([len(a) for a, _ in ap], np.int64)
            )
        else:
            proc.aggregates = np.zeros(0, L.AGGREGATE_DTYPE)
            proc.aggregate_thread = np.zeros(0, np.uint32)
        if proc.header is None:
            cap.warnings.append(f"{proc.path}: process uid {proc.uid:#x} has no PROCESS header chunk")
    for l in cap.losses:
        cap.warnings.append(f"{l.path}: lost {l.nbytes} bytes at offset {l.offset}: {l.reason}")
    return cap
