"""What the tracer writes (per process, trace format v1) and what really happened.

ProcessRecorder collects, per traced process, exactly the records the native
tracer would write: thread-local event rows (TSC of that node's clock), side
records (PRM command buffers, WQE bytes, JSON), calibration pairs and aggregate
counters.  `write()` emits one process file through sigmatrace.format.TraceWriter;
the cluster concatenates them into capture.bin.

GroundTruth collects every WQE and every doorbell store with true times; it is
written as <capture>.truth.npz (numpy structured arrays) + <capture>.truth.json.
Format: docs/model.md §Ground truth.
"""
import io
import json
import struct

import numpy as np

from sigmatrace.format import TraceWriter, layout as L, events as E
from sigmatrace.format.writer import chunk_bytes

EXT = E.EXT
T = {name: E.value(name) for name in E.BY_NAME}

WQE_TRUTH_DTYPE = np.dtype([
    ("wqe_id", "<i8"), ("rank", "<i4"), ("node", "<i4"), ("gpu", "<i4"), ("qpn", "<u4"),
    ("peer_rank", "<i4"), ("peer_node", "<i4"), ("peer_qpn", "<u4"),
    ("wqe_index", "<i8"), ("wqe_index16", "<u2"), ("num_wqebb", "<u2"), ("opcode", "<u1"), ("opmod", "<u1"),
    ("bytes", "<u8"), ("raddr", "<u8"), ("rkey", "<u4"), ("laddr", "<u8"), ("lkey", "<u4"),
    ("t_post", "<f8"), ("t_fetch", "<f8"), ("t_exec", "<f8"), ("t_remote", "<f8"), ("t_complete", "<f8"),
    ("doorbell_id", "<i8"), ("recovered", "<i1"), ("traced", "<i1"), ("tag", "<i4"), ("phase", "<i4"),
])
DOORBELL_TRUTH_DTYPE = np.dtype([
    ("doorbell_id", "<i8"), ("rank", "<i4"), ("node", "<i4"), ("gpu", "<i4"), ("qpn", "<u4"),
    ("pi", "<i8"), ("pi16", "<u2"), ("raw", "<u8"), ("num_wqes", "<i4"),
    ("t_write", "<f8"), ("t_land", "<f8"), ("t_observed", "<f8"), ("t_forward", "<f8"),
    ("observed_as", "<i8"), ("coalesced", "?"), ("recorded", "?"),
])
BARRIER_TRUTH_DTYPE = np.dtype([("rank", "<i4"), ("level", "<i4"), ("t_arrive", "<f8"), ("t_leave", "<f8")])

# what the GPU side knows when it posts (GroundTruth.wqe_rows / doorbell_rows tuples, or blocks)
WQE_POST_DTYPE = np.dtype([
    ("gid", "<i8"), ("wqe_index", "<i8"), ("num_wqebb", "<u2"), ("opcode", "<u1"), ("opmod", "<u1"),
    ("bytes", "<u8"), ("raddr", "<u8"), ("laddr", "<u8"), ("t_post", "<f8"), ("doorbell_id", "<i8"),
    ("tag", "<i4"), ("phase", "<i4")])
DOORBELL_POST_DTYPE = np.dtype([("gid", "<i8"), ("pi", "<i8"), ("raw", "<u8"), ("num_wqes", "<i4"),
                                ("t_write", "<f8"), ("t_land", "<f8")])

# recovered codes in the WQE truth
REC_NOT_TRACED, REC_LOST, REC_RECOVERED, REC_PENDING = -1, 0, 1, 2


class ProcessRecorder:
    def __init__(self, uid, clock, header):
        self.uid = uid
        self.clock = clock
        self._tsc0 = clock.tsc0 if clock is not None else 0
        self._tpn = clock.ticks_per_ns if clock is not None else 1.0
        self.header = header
        self.threads = {}     # index -> (info dict, rows list)
        self.side = []
        self._next_side = 1
        self.aggregates = {}  # thread -> {(type, aux, obj, peer): [count, bytes]}
        self.calib = []
        self.bulk = {}        # thread -> list of EVENT_DTYPE arrays, in record order (closed-form runs)

    def add_thread(self, index, tid, name, role):
        self.threads[index] = ({"tid": tid, "name": name, "role": role}, [])
        return index

    def tsc(self, t_ns):
        """This node's TSC at true time t_ns (same as NodeClock.tsc, cached constants)."""
        return int(self._tsc0 + t_ns * self._tpn)

    def rows(self, thread):
        """The row list of a thread, for hot paths that append (tsc, type, aux, obj, arg) tuples
        themselves (aux/obj/arg already in range); converted to numpy in bulk by write()."""
        return self.threads[thread][1]

    def ev(self, thread, t_ns, etype, aux=0, obj=0, arg=0, ext=None):
        rows = self.threads[thread][1]
        rows.append((self.clock.tsc(t_ns), etype, aux & 0xFFFF, obj & 0xFFFFFFFF, arg & 0xFFFFFFFFFFFFFFFF))
        if ext is not None:
            x0, x1, x2, x3 = ext
            rows.append((x0 & 0xFFFFFFFFFFFFFFFF, EXT, x1 & 0xFFFF, x2 & 0xFFFFFFFF, x3 & 0xFFFFFFFFFFFFFFFF))

    def _side(self, kind, data, flags=0):
        sid = self._next_side
        self._next_side += 1
        self.side.append((sid, kind, bytes(data), flags))
        return sid

    def side_json(self, obj):
        return self._side(L.SIDE_JSON, json.dumps(obj, sort_keys=True).encode())

    def side_prm(self, in_buf, out_buf):
        return self._side(L.SIDE_PRM_COMMAND, struct.pack("<II", len(in_buf), len(out_buf)) + in_buf + out_buf)

    def side_wqe(self, qpn, first_index, log_sq_size, data, flags=L.WQE_F_VERIFIED):
        head = struct.pack("<IHHII", qpn, first_index & 0xFFFF, len(data) // 64, log_sq_size, flags)
        return self._side(L.SIDE_WQE_BYTES, head + data, flags)

    def aggregate(self, thread, etype, aux, obj, peer, count, nbytes):
        d = self.aggregates.setdefault(thread, {})
        c = d.get((etype, aux, obj, peer))
        if c is None:
            d[(etype, aux, obj, peer)] = [count, nbytes]
        else:
            c[0] += count
            c[1] += nbytes

    def calibration(self, t_ns, point):
        self.calib.append(self.clock.calibration(t_ns, point))

    def add_bulk(self, thread, arr):
        """Append a block of EVENT_DTYPE rows to a thread, after the rows it already has."""
        rows = self.threads[thread][1] if thread in self.threads else None
        parts = self.bulk.setdefault(thread, [])
        if rows:
            parts.append(rows_to_events(rows))
            rows.clear()
        parts.append(arr)

    def side_bulk(self, kind, data, flags=0):
        """N side records of one size at once: `data` is an (N, length) uint8 array.

        Returns the first side id (the block gets ids first .. first+N-1, in row order);
        write() lays them out exactly as N calls of _side would."""
        sid = self._next_side
        self._next_side += len(data)
        self.side.append((sid, kind, np.ascontiguousarray(data, dtype=np.uint8), flags))
        return sid

    def side_wqe_bulk(self, qpn, first_indices, log_sq_size, wqes, flags=L.WQE_F_VERIFIED):
        """One WQE_BYTES side record per row of `wqes` ((N, k*64) uint8), first index per row."""
        n = len(wqes)
        head = np.zeros(n, _WQE_HEAD)
        head["qpn"] = qpn
        head["first"] = np.asarray(first_indices) & 0xFFFF
        head["nwqebb"] = wqes.shape[1] // 64
        head["log_sq"] = log_sq_size
        head["flags"] = flags
        return self.side_bulk(L.SIDE_WQE_BYTES, np.hstack([head.view(np.uint8).reshape(n, 16), wqes]), flags)

    def n_events(self):
        n = sum(len(r) for _, r in self.threads.values())
        n += sum(len(a) for parts in self.bulk.values() for a in parts)
        return n

    def write(self, f, footer):
        """Write this process's chunks to file object f; returns events written.

        Rows are converted column by column (numpy from the tuples' columns), side
        records are packed into SIDE chunks of at most 1 MiB with struct, exactly as
        TraceWriter.side/flush_side lay them out."""
        w = TraceWriter(f, self.uid)
        w.process(self.header)
        for ti in sorted(self.threads):
            info, _ = self.threads[ti]
            w.thread(ti, **info)
        if self.calib:
            w.calibration(np.concatenate(self.calib[:1]))
        w.flush_side()
        parts, count, size = [], 0, 0
        for sid, kind, data, flags in self.side:
            if isinstance(data, np.ndarray):     # a block of equal-sized records (side_bulk)
                nrec, n = data.shape
                pad = -n % 8
                recs = np.zeros(nrec, [("h", _SIDE_HEAD_DTYPE), ("d", np.uint8, (n + pad,))])
                recs["h"]["side_id"] = np.arange(sid, sid + nrec)
                recs["h"]["length"] = n
                recs["h"]["kind"] = kind
                recs["h"]["flags"] = flags
                recs["d"][:, :n] = data
                blob = recs.view(np.uint8).reshape(nrec, -1)
                rsize = 16 + n + pad
                k = 0
                while k < nrec:   # same chunk boundaries as one record at a time: flush once >= 1 MiB
                    take = min(nrec - k, max(1, -(-((1 << 20) - size) // rsize)))
                    parts.append(blob[k:k + take].tobytes())
                    count += take
                    size += take * rsize
                    k += take
                    if size >= (1 << 20):
                        f.write(chunk_bytes(L.CHUNK_SIDE, self.uid, 0, count, b"".join(parts)))
                        parts, count, size = [], 0, 0
                continue
            n = len(data)
            parts.append(_SIDE_HEAD.pack(sid, n, kind, flags))
            parts.append(data)
            pad = -n % 8
            if pad:
                parts.append(b"\0" * pad)
            count += 1
            size += 16 + n + pad
            if size >= (1 << 20):
                f.write(chunk_bytes(L.CHUNK_SIDE, self.uid, 0, count, b"".join(parts)))
                parts, count, size = [], 0, 0
        if count:
            f.write(chunk_bytes(L.CHUNK_SIDE, self.uid, 0, count, b"".join(parts)))
        total = 0
        for ti in sorted(set(self.threads) | set(self.bulk)):
            rows = self.threads.get(ti, (None, []))[1]
            parts = list(self.bulk.get(ti, []))
            if rows:
                parts.append(rows_to_events(rows))
            if len(parts) > 1:
                parts = [np.concatenate(parts)]
            for part in parts:
                w.events(ti, part)
                total += len(part)
        for ti in sorted(self.aggregates):
            d = self.aggregates[ti]
            agg = np.zeros(len(d), L.AGGREGATE_DTYPE)
            for k, ((et, aux, obj, peer), (c, b)) in enumerate(sorted(d.items())):
                agg[k] = (et, aux & 0xFFFF, obj & 0xFFFFFFFF, peer, c, b)
            w.aggregate(agg, thread_index=ti)
        if len(self.calib) > 1:
            w.calibration(np.concatenate(self.calib[1:]))
        footer = dict(footer, events=int(total))
        w.end(footer)
        w.close()
        return total


_EVENT_ROW = np.dtype([(n, L.EVENT_DTYPE.fields[n][0]) for n in ("tsc", "type", "aux", "obj", "arg")])
_SIDE_HEAD = struct.Struct("<QIHH")   # SIDE_HEADER_DTYPE: side_id, length, kind, flags
_SIDE_HEAD_DTYPE = np.dtype([("side_id", "<u8"), ("length", "<u4"), ("kind", "<u2"), ("flags", "<u2")])
_WQE_HEAD = np.dtype([("qpn", "<u4"), ("first", "<u2"), ("nwqebb", "<u2"), ("log_sq", "<u4"), ("flags", "<u4")])


def rows_to_events(rows):
    """(tsc, type, aux, obj, arg) tuples -> EVENT_DTYPE array."""
    return table(rows, _EVENT_ROW)


def table(rows, dtype):
    """List of tuples -> structured array of `dtype`.

    One C-level conversion of the whole list into a packed record array (then cast to
    `dtype`); column by column when the packed conversion refuses a value."""
    dtype = np.dtype(dtype)
    if not rows:
        return np.zeros(0, dtype)
    try:
        return np.array(rows, dtype=_packed(dtype)).astype(dtype, copy=False)
    except (OverflowError, ValueError, TypeError):
        out = np.zeros(len(rows), dtype)
        for name, col in zip(dtype.names, zip(*rows)):
            out[name] = np.array(col, dtype=dtype[name])
        return out


def _packed(dtype):
    """`dtype` without its padding/offsets (np.array of tuples needs the plain field list)."""
    return np.dtype([(n, dtype.fields[n][0]) for n in dtype.names])


def save_npz(path, **arrays):
    """np.savez_compressed, but deterministic (fixed member timestamps) and with fast deflate."""
    import zipfile
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=False)
            zf.writestr(info, buf.getvalue(), compresslevel=1)


class GroundTruth:
    """What really happened, collected append-only on the hot path and resolved with numpy.

    Per posted WQE one tuple (the QP's global id stands for its constant columns:
    rank, node, gpu, qpn, peer, rkey, lkey); the NIC appends the WQE's pipeline times
    by wqe_id; the poller appends ranges (traced, recovered, lost) and per-store
    observation records.  `arrays()` builds the structured arrays of docs/model.md
    by scatter (times), range marking with searchsorted + cumulative sums (status),
    so no row is ever a mutable Python object."""

    def __init__(self):
        self.wqe_rows = []       # (qp gid, index, nwqebb, opcode, opmod, bytes, raddr, laddr, t_post, doorbell_id, tag, phase)
        self.wqe_times = []      # (wqe_id, t_fetch, t_exec, t_remote, t_complete)
        self.doorbell_rows = []  # (qp gid, pi, raw, num_wqes, t_write, t_land)
        self.observed = []       # (doorbell_id, observed_as, recorded) per store read by a poller
        self.observations = []   # (doorbell_id, t_observed, t_forward) per poller observation
        self.traced = []         # (qp gid, first index, nwqebb): covered by a recorded doorbell
        self.status = []         # (qp gid, first index, nwqebb, REC_RECOVERED | REC_LOST)
        self.barriers = []
        self.n_wqes = 0
        self.n_doorbells = 0
        self.meta = {}
        # closed-form runs (gpu.PE.post_quiet_run) hand over numpy blocks instead of tuples:
        # ordered parts of wqe_rows / doorbell_rows (ids = positions), unordered blocks of the rest
        self.wqe_parts = []
        self.doorbell_parts = []
        self.blocks = {"wqe_times": [], "observed": [], "observations": [], "traced": [], "status": []}

    def add_wqes(self, block):
        """Append a structured block (WQE_POST_DTYPE) of posted WQEs; returns the first wqe_id."""
        if self.wqe_rows:
            self.wqe_parts.append(table(self.wqe_rows, WQE_POST_DTYPE))
            self.wqe_rows = []
        self.wqe_parts.append(block)
        first = self.n_wqes
        self.n_wqes += len(block)
        return first

    def add_doorbells(self, block):
        """Append a structured block (DOORBELL_POST_DTYPE) of doorbell stores; returns the first id."""
        if self.doorbell_rows:
            self.doorbell_parts.append(table(self.doorbell_rows, DOORBELL_POST_DTYPE))
            self.doorbell_rows = []
        self.doorbell_parts.append(block)
        first = self.n_doorbells
        self.n_doorbells += len(block)
        return first

    def add_block(self, name, arr):
        """A 2-D array of rows of one of the unordered lists (wqe_times, observed, ...)."""
        self.blocks[name].append(arr)

    def _rows(self, name, width, dtype):
        parts = [np.array(getattr(self, name), dtype=dtype).reshape(-1, width)]
        parts += [np.asarray(b, dtype=dtype).reshape(-1, width) for b in self.blocks[name]]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def barrier(self, rank, level, t_arrive, t_leave):
        self.barriers.append((rank, level, t_arrive, t_leave))

    def arrays(self, qps=()):
        """(wqes, doorbells, barriers) structured arrays; `qps` = the cluster's QPs by gid."""
        nq = max(len(qps), 1)
        const = np.zeros(nq, [("rank", "<i4"), ("node", "<i4"), ("gpu", "<i4"), ("qpn", "<u4"),
                              ("peer_rank", "<i4"), ("peer_node", "<i4"), ("peer_qpn", "<u4"),
                              ("rkey", "<u4"), ("lkey", "<u4")])
        for q in qps:
            pe, peer = q.pe, q.peer
            const[q.gid] = (pe.rank, pe.node, pe.local, q.qpn, peer.pe.rank, peer.pe.node, peer.qpn,
                            peer.pe.rkey, pe.lkey)
        post = np.concatenate(self.wqe_parts + [table(self.wqe_rows, WQE_POST_DTYPE)])
        n = len(post)
        w = np.zeros(n, WQE_TRUTH_DTYPE)
        if n:
            gid = post["gid"]
            w["wqe_id"] = np.arange(n)
            for f in const.dtype.names:
                w[f] = const[f][gid]
            for f in post.dtype.names[1:]:
                w[f] = post[f]
            w["wqe_index16"] = post["wqe_index"] & 0xFFFF
            for f in ("t_fetch", "t_exec", "t_remote", "t_complete"):
                w[f] = np.nan
            tt = self._rows("wqe_times", 5, np.float64)
            if len(tt):
                ids = tt[:, 0].astype(np.int64)
                w["t_fetch"][ids], w["t_exec"][ids], w["t_remote"][ids], w["t_complete"][ids] = tt[:, 1:].T
            # ranges -> rows: rows of one QP are in index order (post order), so a range
            # [first, first+n) is the row slice searchsorted(first) .. searchsorted(first+n)
            key = gid * (1 << 40) + post["wqe_index"]          # sorted within each QP; QPs interleave
            order = np.argsort(key, kind="stable")
            skey = key[order]

            def mark(ranges, width):
                r = np.array(ranges, dtype=np.int64).reshape(-1, width)
                lo = np.searchsorted(skey, r[:, 0] * (1 << 40) + r[:, 1])
                hi = np.searchsorted(skey, r[:, 0] * (1 << 40) + r[:, 1] + r[:, 2])
                cover = np.zeros(n + 1, np.int64)
                np.add.at(cover, lo, 1)
                np.add.at(cover, hi, -1)
                val = None
                if r.shape[1] == 4:
                    val = np.zeros(n + 1, np.int64)
                    np.add.at(val, lo, r[:, 3])
                    np.add.at(val, hi, -r[:, 3])
                    val = np.cumsum(val)[:n]
                return np.cumsum(cover)[:n] > 0, val

            traced = np.zeros(n, np.int8)
            recovered = np.full(n, REC_NOT_TRACED, np.int8)
            tr = self._rows("traced", 3, np.int64)
            if len(tr):
                cov, _ = mark(tr, 3)
                traced[order[cov]] = 1
            st = self._rows("status", 4, np.int64)
            if len(st):
                cov, val = mark(st, 4)
                recovered[order[cov]] = val[cov]
                traced[order[cov]] = 1
            w["traced"], w["recovered"] = traced, recovered
        post = np.concatenate(self.doorbell_parts + [table(self.doorbell_rows, DOORBELL_POST_DTYPE)])
        nd = len(post)
        d = np.zeros(nd, DOORBELL_TRUTH_DTYPE)
        if nd:
            d["doorbell_id"] = np.arange(nd)
            for f in ("rank", "node", "gpu", "qpn"):
                d[f] = const[f][post["gid"]]
            for f in ("pi", "raw", "num_wqes", "t_write", "t_land"):
                d[f] = post[f]
            d["pi16"] = post["pi"] & 0xFFFF
            d["t_observed"] = np.nan
            d["t_forward"] = np.nan
            d["observed_as"] = -1
            ob = self._rows("observed", 3, np.int64)
            if len(ob):
                d["observed_as"][ob[:, 0]] = ob[:, 1]
                d["coalesced"][ob[:, 0]] = ob[:, 0] != ob[:, 1]
                d["recorded"][ob[:, 0]] = ob[:, 2].astype(bool)
            ot = self._rows("observations", 3, np.float64)
            if len(ot):
                ids = ot[:, 0].astype(np.int64)
                d["t_observed"][ids], d["t_forward"][ids] = ot[:, 1], ot[:, 2]
        b = np.array(self.barriers, dtype=BARRIER_TRUTH_DTYPE) if self.barriers else np.zeros(0, BARRIER_TRUTH_DTYPE)
        return w, d, b
