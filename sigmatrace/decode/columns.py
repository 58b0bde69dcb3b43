"""Per-file decode: one capture file (or one byte range of it) -> compact output (runs in a worker).

Streams the file chunk by chunk with ``iter_chunks`` (errors="recover", so a
cut or corrupt file yields what is sound plus a list of losses) and keeps,
per process found in the range:

* the metadata (header JSON, threads, calibration rows, END footer,
  aggregates) and the side records the correlator interprets (JSON, PRM
  commands, recovered WQE bytes);
* only the event records the correlator joins on (``CORRELATOR_TYPES``:
  doorbells, WQE records, work requests, completions, QP set-up, UCX /
  libfabric operations, ...), per type as the narrow columns the correlator
  reads (``TYPE_COLUMNS``: record fields, EXT slots, thread);
* an index of its EVENTS chunks (file offset, record count, thread) so that
  the events table can be written later by streaming the file again
  (``iter_event_batches``) with the final time base, and per-chunk TSC
  bounds and counts.

Events are processed in batches of whole chunks (``batch_records``), so the
memory a worker needs is bounded by the batch, not by the file.  No
per-event Python: each batch is a handful of vector operations.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import TraceFormatError
from ..format import events as E
from ..format import layout as L
from ..format.reader import iter_chunks, json_chunk, side_json, side_prm, side_wqe
from . import kernel as _kernel
from .types import CORRELATOR_TYPE_LUT, DEFAULT_BATCH_RECORDS, TYPE_COLUMNS

EXT = E.EXT
_SIDE_HEAD = struct.Struct("<QIHH")

def concat_tables(parts):
    """Concatenate lists of per-type column dicts (file order)."""
    out = {}
    names = []
    for p in parts:
        for k in p:
            if k not in out:
                out[k] = []
                names.append(k)
            out[k].append(p[k])
    res = {}
    for k in names:
        lst = out[k]
        res[k] = lst[0] if len(lst) == 1 else {c: np.concatenate([d[c] for d in lst]) for c in lst[0]}
    return res


def drop_redundant_posts(tables):
    """IBV_POST_SEND / IBV_WR_COMPLETE on a QP that has IBV_SEND_WR records never become operations (the
    work requests do): drop them early (the correlator filters the rest, e.g. across byte ranges)."""
    wr = tables.get("IBV_SEND_WR")
    if wr is None or not len(wr["qpn"]):
        return tables
    qs = np.unique(wr["qpn"])
    for name in ("IBV_POST_SEND", "IBV_WR_COMPLETE"):
        t = tables.get(name)
        if t is not None and len(t["qpn"]):
            keep = ~np.isin(t["qpn"], qs)
            if not keep.all():
                tables[name] = {c: v[keep] for c, v in t.items()}
    return tables


CHUNK_INDEX_DTYPE = np.dtype([("offset", "<i8"), ("count", "<i8"), ("thread", "<u4"), ("events", "<i8"),
                              ("tsc_min", "<u8"), ("tsc_max", "<u8")])


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
    tables: dict = None                            # correlator records: type name -> narrow columns, file order
    chunks: np.ndarray = None                      # CHUNK_INDEX_DTYPE, file order
    n_events: int = 0                              # primary records
    n_records: int = 0                             # primary + EXT
    header_dups: int = 0
    # build-time scratch (not filled by workers)
    _calib: list = field(default_factory=list)
    _aggs: list = field(default_factory=list)
    _typed: list = field(default_factory=list)
    _chunks: list = field(default_factory=list)

    def finish(self):
        self.calibration = np.concatenate(self._calib) if self._calib else np.zeros(0, L.CALIBRATION_DTYPE)
        if self._aggs:
            self.aggregates = np.concatenate([a for a, _ in self._aggs])
            self.aggregate_thread = np.repeat(np.array([t for _, t in self._aggs], np.uint32),
                                              np.array([len(a) for a, _ in self._aggs], np.int64))
        else:
            self.aggregates = np.zeros(0, L.AGGREGATE_DTYPE)
            self.aggregate_thread = np.zeros(0, np.uint32)
        self.tables = drop_redundant_posts(concat_tables(self._typed))
        self.chunks = np.concatenate(self._chunks) if self._chunks else np.zeros(0, CHUNK_INDEX_DTYPE)
        self._calib, self._aggs, self._typed, self._chunks = [], [], [], []
        return self


@dataclass
class FileDecode:
    path: str
    start: int = 0
    processes: list = field(default_factory=list)
    losses: list = field(default_factory=list)     # (path, offset, nbytes, reason)
    warnings: list = field(default_factory=list)
    error: str | None = None
    records: int = 0


def _json(payload, path, off, kind, warnings):
    """A PROCESS / THREAD / END chunk's object, or None with a warning (``format.reader.json_chunk``'s rule:
    the same message ``read_capture`` gives)."""
    try:
        return json_chunk(payload, path, off, L.CHUNK_KIND_NAMES[kind])
    except TraceFormatError as e:
        warnings.append(str(e))
        return None


def _sides(proc: ProcDecode, payload, count):
    """The side records the correlator interprets (format.reader's parsers); a malformed one is counted."""
    p = payload
    pos = 0
    for _ in range(count):
        sid, length, kind, flags = _SIDE_HEAD.unpack_from(p, pos)
        data = bytes(p[pos + 16: pos + 16 + length])
        pos += 16 + length + L.pad8(length)
        try:
            if kind == L.SIDE_JSON:
                proc.side_json[sid] = side_json(data, sid)
            elif kind == L.SIDE_PRM_COMMAND:
                proc.side_prm[sid] = side_prm(data, sid)
            elif kind == L.SIDE_WQE_BYTES:
                proc.side_wqe[sid] = side_wqe(data, sid)
        except TraceFormatError:
            proc.side_bad += 1


def open_buffer(path):
    """Read-only mmap of a file (b"" when empty); pages can be dropped behind the reader."""
    size = os.path.getsize(path)
    if size == 0:
        return b""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def drop_pages(buf, upto):
    """Release the mapped pages below ``upto`` (the page cache keeps them; RSS does not)."""
    if isinstance(buf, mmap.mmap) and upto > 0 and hasattr(mmap, "MADV_DONTNEED"):
        upto -= upto % mmap.PAGESIZE
        if upto > 0:
            try:
                buf.madvise(mmap.MADV_DONTNEED, 0, upto)
            except (OSError, ValueError):
                pass


class _Batch:
    """EVENTS chunks waiting to be split (whole chunks only: a chunk never starts with EXT)."""

    def __init__(self, cap=0):
        self.arrays, self.procs, self.counts, self.threads, self.offsets = [], [], [], [], []
        self.n = 0
        self._buf = None
        self._cap = int(cap)

    def add(self, arr, proc_i, thread, offset):
        self.arrays.append(arr)
        self.procs.append(proc_i)
        self.counts.append(len(arr))
        self.threads.append(thread)
        self.offsets.append(offset)
        self.n += len(arr)

    def flush(self, plist):
        if not self.arrays:
            return
        n = self.n
        if self._buf is None or len(self._buf) < n:
            self._buf = np.empty(max(n, self._cap), L.EVENT_DTYPE)
        if len(self.arrays) > 1:
            ev = np.concatenate(self.arrays, out=self._buf[:n])
        else:
            ev = self.arrays[0]
        counts = np.array(self.counts, np.int64)
        starts = np.zeros(len(counts), np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        types = ev["type"]
        is_ext = types == EXT
        tsc = ev["tsc"]
        if is_ext.any():
            prim_per_chunk = counts - np.add.reduceat(is_ext, starts, dtype=np.int64)
            tmin = np.minimum.reduceat(np.where(is_ext, np.uint64(0xFFFFFFFFFFFFFFFF), tsc), starts)
            tmax = np.maximum.reduceat(np.where(is_ext, np.uint64(0), tsc), starts)
        else:
            prim_per_chunk = counts
            tmin = np.minimum.reduceat(tsc, starts)
            tmax = np.maximum.reduceat(tsc, starts)
        ci = np.zeros(len(counts), CHUNK_INDEX_DTYPE)
        ci["offset"], ci["count"], ci["thread"] = self.offsets, counts, self.threads
        ci["events"], ci["tsc_min"], ci["tsc_max"] = prim_per_chunk, tmin, tmax
        procs = np.asarray(self.procs, np.int64)
        for pi in np.unique(procs).tolist():
            m = np.flatnonzero(procs == pi)
            p = plist[pi]
            p.n_events += int(prim_per_chunk[m].sum())
            p.n_records += int(counts[m].sum())
            p._chunks.append(ci[m])
        sel = np.flatnonzero(CORRELATOR_TYPE_LUT[types])
        if len(sel):
            c = np.searchsorted(starts, sel, side="right") - 1
            thr = np.asarray(self.threads, np.uint32)[c]
            cp = procs[c]
            if (cp == cp[0]).all():
                plist[int(cp[0])]._typed.append(_type_tables(ev, is_ext, sel, thr))
            else:
                o = np.argsort(cp, kind="stable")
                cuts = np.flatnonzero(np.diff(cp[o])) + 1
                for part in np.split(o, cuts):
                    plist[int(cp[part[0]])]._typed.append(_type_tables(ev, is_ext, sel[part], thr[part]))
        self.arrays, self.procs, self.counts, self.threads, self.offsets = [], [], [], [], []
        self.n = 0


# slot -> (record field, read from the following EXT record)
_SLOT_FIELD = dict(aux=("aux", False), obj=("obj", False), arg=("arg", False), x0=("tsc", True),
                   x1=("aux", True), x2=("obj", True), x3=("arg", True))


def _type_tables(ev, is_ext, sel, thr):
    """Correlator records ``sel`` of a batch (one process, file order) -> {type name: {column: array}}.

    One gather per kept column straight from the record fields (EXT slots from the next record when it
    is an EXT — a chunk never starts with EXT, so that record belongs to the same chunk)."""
    out = {}
    n = len(ev)
    t = ev["type"][sel]
    u = np.uint64
    for tv in np.unique(t).tolist():
        name, cols = TYPE_COLUMNS[tv]
        m = t == tv
        idx = sel[m] if not m.all() else sel
        d = {"tsc": ev["tsc"][idx], "thread": thr[m] if not m.all() else thr}
        nxt = idx + 1
        has = nxt < n
        has[has] = is_ext[nxt[has]]
        hx = nxt[has]
        for col, sl, lo, width, dt in cols:
            f, from_ext = _SLOT_FIELD[sl]
            if from_ext:
                v = np.zeros(len(idx), ev.dtype[f])
                v[has] = ev[f][hx]
            else:
                v = ev[f][idx]
            if width is not None:
                v = (v >> np.asarray(lo, v.dtype)) & np.asarray((1 << width) - 1, v.dtype)
            d[col] = v.astype(dt, copy=False)
        out[name] = d
    return out


def decode_file(path, start=0, stop=None, batch_records=DEFAULT_BATCH_RECORDS, kernel=None) -> FileDecode:
    """Decode one file (or the chunks that start in [start, stop)); never raises for bad content.

    Uses the C decode kernel (``_kernel``) when it is built and not disabled (``SIGMATRACE_NO_KERNEL=1``),
    else the numpy path below; both give identical results.  ``kernel``: True / False forces one."""
    if kernel is None or kernel:
        k = _kernel.get()
        if k is not None:
            try:
                return _decode_file_kernel(k, path, start, stop, batch_records)
            except (_KernelMismatch, RuntimeError):
                pass   # the kernel and the reader disagreed about a chunk (or a kernel call failed): numpy path
        elif kernel:
            raise RuntimeError("decode kernel not available")
    return _decode_file_numpy(path, start, stop, batch_records)


class _KernelMismatch(Exception):
    pass


def _decode_begins(path, start, batch_records):
    """What both decode paths start a file with: its path as a string, its FileDecode, process_uid -> index
    into the ProcDecode list, that list, the losses, and the batch size (at least 1)."""
    path = str(path)
    procs: dict[int, int] = {}
    plist: list[ProcDecode] = []
    return path, FileDecode(path, start=int(start)), procs, plist, [], max(1, int(batch_records))


def _decode_file_kernel(k, path, start=0, stop=None, batch_records=DEFAULT_BATCH_RECORDS) -> FileDecode:
    """``decode_file`` with the C kernel: chunk validation + CRC, EXT join and per-type scatter in C; the
    Python side handles metadata chunks and does O(chunks) work per batch.  Chunks the kernel rejects are
    handed to ``iter_chunks`` (recover mode), which reports the loss and finds the next valid chunk."""
    path, out, procs, plist, losses, batch_records = _decode_begins(path, start, batch_records)
    buf = None
    try:
        buf = open_buffer(path)
        n = len(buf)
        lim = n if stop is None else min(n, int(stop))
        off = int(start)
        with k.buffer(buf) as bp:
            while off < lim:
                ch, tc, nxt, status = k.scan(bp, n, off, lim, batch_records)
                if len(ch):
                    _kernel_batch(k, bp, n, buf, ch, tc, procs, plist, out)
                off = nxt
                if status == 2:   # the reader decides what the chunk at `off` is (loss, resync, end)
                    g = iter_chunks(path, errors="recover", losses=losses, data=buf, start=off, stop=stop)
                    try:
                        c = next(g, None)
                    finally:
                        g.close()
                    if c is None:
                        break
                    if c.offset == off:
                        raise _KernelMismatch(off)
                    off = c.offset
    except TraceFormatError as e:
        out.error = str(e)
    except OSError as e:
        out.error = f"{path}: {e}"
    out.losses = [(l.path, l.offset, l.nbytes, l.reason) for l in losses]
    out.processes = [p.finish() for p in plist]
    return out


def _kernel_batch(k, bp, n, buf, ch, tc, procs, plist, out):
    """One scan result (validated chunks, file order) -> process metadata, chunk index, typed columns."""
    uids = ch["uid"]
    uq, first, inv = np.unique(uids, return_index=True, return_inverse=True)
    for j in np.argsort(first, kind="stable").tolist():   # processes in order of first appearance
        u = int(uq[j])
        if u not in procs:
            procs[u] = len(plist)
            plist.append(ProcDecode(u, out.path))
    pmap = np.array([procs[int(u)] for u in uq.tolist()], np.int64)
    pidx = pmap[inv.reshape(-1)]
    kind = ch["kind"]
    is_ev = kind == L.CHUNK_EVENTS
    if not is_ev.all():
        mv = memoryview(buf)
        for j in np.flatnonzero(~is_ev).tolist():
            r = ch[j]
            o, kd, cnt, thread = int(r["offset"]), int(r["kind"]), int(r["count"]), int(r["thread"])
            payload = mv[o + L.CHUNK_HEADER_SIZE: o + L.CHUNK_HEADER_SIZE + int(r["plen"])]
            proc = plist[int(pidx[j])]
            _meta_chunk(proc, kd, payload, cnt, thread, o, out)
        del mv, payload
    ev = ch[is_ev]
    if not len(ev):
        return
    out.records += int(ev["count"].sum())
    nz = ev["count"] > 0
    ev = ev[nz]
    if not len(ev):
        return
    evp = pidx[is_ev][nz]
    tc = tc[is_ev][nz]
    ci = np.zeros(len(ev), CHUNK_INDEX_DTYPE)
    ci["offset"], ci["count"], ci["thread"] = ev["offset"], ev["count"], ev["thread"]
    ci["events"], ci["tsc_min"], ci["tsc_max"] = ev["events"], ev["tsc_min"], ev["tsc_max"]
    groups = [(int(evp[0]), slice(None))] if (evp == evp[0]).all() else \
        [(pi, np.flatnonzero(evp == pi)) for pi in np.unique(evp).tolist()]
    for pi, m in groups:
        p = plist[pi]
        c = ci[m]
        p.n_events += int(c["events"].sum())
        p.n_records += int(c["count"].sum())
        p._chunks.append(c)
        tabs = k.fill(bp, n, c["offset"], c["count"], c["thread"], tc[m].sum(0, dtype=np.int64))
        if tabs:
            p._typed.append(tabs)
    drop_pages(buf, int(ev["offset"][-1]))


def _meta_chunk(proc, kind, payload, count, thread, offset, out):
    """A non-EVENTS chunk: header, side records, calibration, aggregates, thread info, end (both paths)."""
    path = out.path
    if kind == L.CHUNK_PROCESS:
        h = _json(payload, path, offset, kind, out.warnings)
        if h is not None:
            v = h.get("format_version", L.VERSION)
            if v != L.VERSION:
                out.warnings.append(f"{path}: process {proc.uid:#x} header says format version {v}; "
                                    f"read as version {L.VERSION}")
            # the last PROCESS chunk of a process is its header (docs/format.md: the tracer rewrites it
            # when NICs / GPUs become known)
            proc.header = h
    elif kind == L.CHUNK_SIDE:
        _sides(proc, payload, count)
    elif kind == L.CHUNK_CALIBRATION:
        proc._calib.append(np.frombuffer(payload, L.CALIBRATION_DTYPE, count).copy())
    elif kind == L.CHUNK_AGGREGATE:
        proc._aggs.append((np.frombuffer(payload, L.AGGREGATE_DTYPE, count).copy(), thread))
    elif kind == L.CHUNK_THREAD:
        t = _json(payload, path, offset, kind, out.warnings)
        if t is not None:
            proc.threads[thread] = t
    elif kind == L.CHUNK_END:
        proc.end = _json(payload, path, offset, kind, out.warnings)


def _decode_file_numpy(path, start=0, stop=None, batch_records=DEFAULT_BATCH_RECORDS) -> FileDecode:
    """The numpy path of ``decode_file`` (no compiled kernel)."""
    path, out, procs, plist, losses, batch_records = _decode_begins(path, start, batch_records)
    batch = _Batch(batch_records + 2730)
    buf = None
    try:
        buf = open_buffer(path)
        for ch in iter_chunks(path, errors="recover", losses=losses, data=buf, start=start, stop=stop):
            pi = procs.get(ch.process_uid)
            if pi is None:
                pi = procs[ch.process_uid] = len(plist)
                plist.append(ProcDecode(ch.process_uid, path))
            proc = plist[pi]
            k = ch.kind
            if k == L.CHUNK_EVENTS:
                if not ch.count:
                    continue
                batch.add(np.frombuffer(ch.payload, L.EVENT_DTYPE, ch.count), pi, ch.thread_index, ch.offset)
                out.records += ch.count
                if batch.n >= batch_records:
                    batch.flush(plist)
                    drop_pages(buf, ch.offset)
            else:
                _meta_chunk(proc, k, ch.payload, ch.count, ch.thread_index, ch.offset, out)
        batch.flush(plist)
    except TraceFormatError as e:  # unreadable file
        out.error = str(e)
    except OSError as e:
        out.error = f"{path}: {e}"
    batch = None
    out.losses = [(l.path, l.offset, l.nbytes, l.reason) for l in losses]
    out.processes = [p.finish() for p in plist]
    return out


def merge_ranges(results):
    """Results of several byte ranges of one file (in file order) -> one FileDecode."""
    if len(results) == 1:
        return results[0]
    head = FileDecode(results[0].path, 0)
    by_uid = {}
    for r in results:
        head.losses.extend(r.losses)
        head.warnings.extend(r.warnings)
        head.records += r.records
        if r.error and head.error is None:
            head.error = r.error
        for p in r.processes:
            q = by_uid.get(p.uid)
            if q is None:
                by_uid[p.uid] = p
                head.processes.append(p)
                continue
            if p.header is not None:   # ranges come in file order: the later header wins
                q.header = p.header
            q.threads.update(p.threads)
            if p.end is not None:
                q.end = p.end
            q.side_json.update(p.side_json)
            q.side_prm.update(p.side_prm)
            q.side_wqe.update(p.side_wqe)
            q.side_bad += p.side_bad
            q.calibration = np.concatenate([q.calibration, p.calibration])
            q.aggregates = np.concatenate([q.aggregates, p.aggregates])
            q.aggregate_thread = np.concatenate([q.aggregate_thread, p.aggregate_thread])
            q.tables = concat_tables([q.tables, p.tables])
            q.chunks = np.concatenate([q.chunks, p.chunks])
            q.n_events += p.n_events
            q.n_records += p.n_records
    return head


def finish_warnings(fd: FileDecode):
    for p in fd.processes:
        if p.header is None:
            fd.warnings.append(f"{fd.path}: process uid {p.uid:#x} has no PROCESS header (file cut or damaged); "
                               f"its events are kept with unknown host/rank")
    return fd


# ---------------------------------------------------------------------------------------------
def iter_event_batches(procs, batch_records=DEFAULT_BATCH_RECORDS):
    """Stream the primary records of every process again, process by process (global order).

    Yields (process index, dict of numpy columns: thread, tsc, type, aux, obj, arg, x0..x3) per
    batch of whole chunks.  Each chunk's records are read with ``preadv`` straight into the batch
    array (no memory map: no page faults, nothing of the file resident beyond the batch).
    """
    kern = _kernel.get()
    fds = {}
    batch_records = max(1, int(batch_records))
    rec = L.EVENT_DTYPE.itemsize
    try:
        for i, p in enumerate(procs):
            ch = p.chunks
            if ch is None or not len(ch):
                continue
            fd = fds.get(p.path)
            if fd is None:
                for f in fds.values():
                    os.close(f)
                fds = {p.path: os.open(p.path, os.O_RDONLY)}
                fd = fds[p.path]
            counts = ch["count"]
            cum = np.cumsum(counts)
            j = 0
            while j < len(ch):
                k = int(np.searchsorted(cum, cum[j] - counts[j] + batch_records, side="right"))
                k = min(max(k, j + 1), len(ch))
                sl = ch[j:k]
                cnt = sl["count"].tolist()
                ev = np.empty(sum(cnt), L.EVENT_DTYPE)
                mv = memoryview(ev.view(np.uint8))
                pos = 0
                for o, c in zip(sl["offset"].tolist(), cnt):
                    nb = c * rec
                    got = os.preadv(fd, [mv[pos:pos + nb]], o + L.CHUNK_HEADER_SIZE)
                    if got != nb:
                        raise OSError(f"{p.path}: short read at offset {o} (file changed since it was decoded?)")
                    pos += nb
                del mv
                cols = None
                if kern is not None:
                    cols = kern.split(ev, sl["count"], sl["thread"], int(sl["events"].sum()))
                if cols is None:
                    cols = split_ext(ev, np.repeat(sl["thread"], sl["count"]))
                yield i, cols
                j = k
    finally:
        for f in fds.values():
            os.close(f)


def split_ext(ev, thr):
    """Records (whole chunks) -> primary columns with their first EXT's slots (0 when absent).

    One gather per output column straight from the record fields (each output contiguous, ready for
    Arrow): no intermediate 24-byte row copies, no shift/mask passes."""
    ev = ev.view(L.EVENT_DTYPE)
    n = len(ev)
    types = ev["type"]
    is_ext = types == EXT
    if not is_ext.any():
        z = np.zeros(n, np.uint64)
        return dict(thread=np.ascontiguousarray(thr), tsc=ev["tsc"].copy(), type=types.copy(), aux=ev["aux"].copy(),
                    obj=ev["obj"].copy(), arg=ev["arg"].copy(), x0=z, x1=np.zeros(n, np.uint16),
                    x2=np.zeros(n, np.uint32), x3=z.copy())
    prim = np.flatnonzero(~is_ext)
    nxt = prim + 1
    has = nxt < n
    has[has] = is_ext[nxt[has]]
    hx = nxt[has]
    m = len(prim)

    def ext(field, dt):
        out = np.zeros(m, dt)
        out[has] = ev[field][hx]
        return out
    return dict(thread=thr[prim], tsc=ev["tsc"][prim], type=types[prim], aux=ev["aux"][prim], obj=ev["obj"][prim],
                arg=ev["arg"][prim], x0=ext("tsc", np.uint64), x1=ext("aux", np.uint16), x2=ext("obj", np.uint32),
                x3=ext("arg", np.uint64))
