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
        """Write this process's chunks to file object f; returns events written."""
        w = TraceWriter(f, self.uid)
        w.process(self.header)
        for ti in sorted(self.threads):
            info, _ = self.threads[ti]
            w.thread(ti, **info)
        if self.calib:
            w.calibration(np.concatenate(self.calib[:1]))
        for sid, kind, data, flags in self.side:
            w.side(kind, data, side_id=sid, flags=flags)
        w.flush_side()
        total = 0
        for ti in sorted(set(self.threads) | set(self.bulk)):
            rows = self.threads.get(ti, (None, []))[1]
            if rows:
                arr = np.array(rows, dtype=np.uint64).reshape(-1, 5) if rows else None
                rec = np.zeros(len(rows), L.EVENT_DTYPE)
                rec["tsc"], rec["type"], rec["aux"], rec["obj"], rec["arg"] = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4]
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


class GroundTruth:
    def __init__(self):
        self.wqes = []
        self.doorbells = []
        self.barriers = []
        self.by_qp_index = {}
        self.meta = {}

    def wqe(self, pe, qp, index, op, t_post, tag):
        """Register a posted WQE; returns the row the NIC fills [t_fetch, t_exec, t_remote, t_complete]."""
        times = [np.nan, np.nan, np.nan, np.nan]
        peer = qp.peer
        row = [len(self.wqes), pe.rank, pe.node, pe.local, qp.qpn, peer.pe.rank, peer.pe.node, peer.qpn,
               index, index & 0xFFFF, op.nwqebb, op.opcode, 0x08 if op.opcode == 0x15 else (0x09 if op.opcode == 0x14 else 0),
               op.nbytes, op.raddr, peer.pe.rkey, op.laddr, pe.lkey, t_post, times,
               len(self.doorbells), REC_NOT_TRACED, 0, tag, getattr(pe, "phase", 0)]
        self.wqes.append(row)
        self.by_qp_index[(qp.gid, index)] = row
        return times

    def doorbell(self, pe, qp, pi, raw, t_write, t_land, nwqes):
        did = len(self.doorbells)
        self.doorbells.append([did, pe.rank, pe.node, pe.local, qp.qpn, pi, pi & 0xFFFF, raw, nwqes,
                               t_write, t_land, np.nan, np.nan, -1, False, False])
        return did

    def set_wqe_status(self, qp, index, status, traced=1):
        row = self.by_qp_index.get((qp.gid, index))
        if row is not None:
            row[21] = status
            row[22] = traced

    def set_traced(self, qp, index):
        row = self.by_qp_index.get((qp.gid, index))
        if row is not None:
            row[22] = 1

    def barrier(self, rank, level, t_arrive, t_leave):
        self.barriers.append((rank, level, t_arrive, t_leave))

    def arrays(self):
        w = np.zeros(len(self.wqes), WQE_TRUTH_DTYPE)
        if self.wqes:
            cols = list(zip(*self.wqes))
            names = WQE_TRUTH_DTYPE.names
            simple = [n for n in names if n not in ("t_fetch", "t_exec", "t_remote", "t_complete")]
            # row layout: 0..18 simple, 19 times list, 20.. rest
            order = names[:19] + ("__times",) + names[23:]
            for k, n in enumerate(order):
                if n == "__times":
                    tt = np.array(cols[k], dtype=np.float64).reshape(-1, 4)
                    w["t_fetch"], w["t_exec"], w["t_remote"], w["t_complete"] = tt.T
                else:
                    w[n] = np.array(cols[k])
        d = np.zeros(len(self.doorbells), DOORBELL_TRUTH_DTYPE)
        if self.doorbells:
            cols = list(zip(*self.doorbells))
            for k, n in enumerate(DOORBELL_TRUTH_DTYPE.names):
                d[n] = np.array(cols[k])
        b = np.array(self.barriers, dtype=BARRIER_TRUTH_DTYPE) if self.barriers else np.zeros(0, BARRIER_TRUTH_DTYPE)
        return w, d, b
