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
        self.bulk = {}        # thread -> list of EVENT_DTYPE arrays (vectorised generators)

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
        self.bulk.setdefault(thread, []).append(arr)

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
            if rows:
                rec = rows_to_events(rows)
                w.events(ti, rec)
                total += len(rec)
            for part in self.bulk.get(ti, []):
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


_SIDE_HEAD = struct.Struct("<QIHH")   # SIDE_HEADER_DTYPE: side_id, length, kind, flags


def rows_to_events(rows):
    """(tsc, type, aux, obj, arg) tuples -> EVENT_DTYPE array, one column at a time."""
    rec = np.zeros(len(rows), L.EVENT_DTYPE)
    for name, col in zip(("tsc", "type", "aux", "obj", "arg"), zip(*rows)):
        rec[name] = np.array(col, dtype=rec.dtype[name])
    return rec


def table(rows, dtype):
    """List of tuples -> structured array of `dtype`, one column at a time (fast for big lists)."""
    dtype = np.dtype(dtype)
    out = np.zeros(len(rows), dtype)
    if rows:
        for name, col in zip(dtype.names, zip(*rows)):
            out[name] = np.array(col, dtype=dtype[name])
    return out


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
        n = len(self.wqe_rows)
        w = np.zeros(n, WQE_TRUTH_DTYPE)
        if n:
            post = table(self.wqe_rows, [
                ("gid", "<i8"), ("wqe_index", "<i8"), ("num_wqebb", "<u2"), ("opcode", "<u1"), ("opmod", "<u1"),
                ("bytes", "<u8"), ("raddr", "<u8"), ("laddr", "<u8"), ("t_post", "<f8"), ("doorbell_id", "<i8"),
                ("tag", "<i4"), ("phase", "<i4")])
            gid = post["gid"]
            w["wqe_id"] = np.arange(n)
            for f in const.dtype.names:
                w[f] = const[f][gid]
            for f in post.dtype.names[1:]:
                w[f] = post[f]
            w["wqe_index16"] = post["wqe_index"] & 0xFFFF
            for f in ("t_fetch", "t_exec", "t_remote", "t_complete"):
                w[f] = np.nan
            if self.wqe_times:
                tt = np.array(self.wqe_times, dtype=np.float64).reshape(-1, 5)
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
            if self.traced:
                cov, _ = mark(self.traced, 3)
                traced[order[cov]] = 1
            if self.status:
                cov, val = mark(self.status, 4)
                recovered[order[cov]] = val[cov]
                traced[order[cov]] = 1
            w["traced"], w["recovered"] = traced, recovered
        nd = len(self.doorbell_rows)
        d = np.zeros(nd, DOORBELL_TRUTH_DTYPE)
        if nd:
            post = table(self.doorbell_rows, [("gid", "<i8"), ("pi", "<i8"), ("raw", "<u8"),
                                                       ("num_wqes", "<i4"), ("t_write", "<f8"), ("t_land", "<f8")])
            d["doorbell_id"] = np.arange(nd)
            for f in ("rank", "node", "gpu", "qpn"):
                d[f] = const[f][post["gid"]]
            for f in ("pi", "raw", "num_wqes", "t_write", "t_land"):
                d[f] = post[f]
            d["pi16"] = post["pi"] & 0xFFFF
            d["t_observed"] = np.nan
            d["t_forward"] = np.nan
            d["observed_as"] = -1
            if self.observed:
                ob = np.array(self.observed, dtype=np.int64)
                d["observed_as"][ob[:, 0]] = ob[:, 1]
                d["coalesced"][ob[:, 0]] = ob[:, 0] != ob[:, 1]
                d["recorded"][ob[:, 0]] = ob[:, 2].astype(bool)
            if self.observations:
                ot = np.array(self.observations, dtype=np.float64)
                ids = ot[:, 0].astype(np.int64)
                d["t_observed"][ids], d["t_forward"][ids] = ot[:, 1], ot[:, 2]
        b = np.array(self.barriers, dtype=BARRIER_TRUTH_DTYPE) if self.barriers else np.zeros(0, BARRIER_TRUTH_DTYPE)
        return w, d, b
