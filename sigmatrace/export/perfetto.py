"""Perfetto protobuf export (F17) with the ``perfetto`` package's protos.

Tracks:
 * one process track per traced process (pid, "rank N @ host"), one thread
   track per thread; host calls (verbs, DevX, CUDA, UCX, OFI events) are slices
   on their thread (each lasts until the thread's next event, at most 1 µs —
   the tracer records entry times only);
 * per node a "node" track holding per-GPU tracks, each GPU track holding its
   QP tracks; doorbells are instant events on the GPU track, each operation an
   instant event on its QP track, with debug annotations (opcode, bytes,
   raddr, rkey, peer, producer index, wqes);
 * counter tracks: bandwidth (GB/s) per GPU, per QP and per node;
 * flow arrows from each matched operation to the peer side (the target QP
   track, at the receive completion, the initiator's completion, or the
   issue time for one-sided operations).
Large captures: at most ``max_events`` instants/slices are written (oldest
first); the cut is reported in the trace (a marker slice) and the summary.
"""
from __future__ import annotations

import numpy as np

from ..format import events as E

HOST_LAYERS = (0x01, 0x02, 0x03, 0x05, 0x06)
_SEQ = 7


_HOST_KEYS = ("process", "thread", "ns", "type", "aux", "obj", "arg")
_HOST_LUT = np.zeros(1 << 16, bool)
for _t in range(1 << 16):
    _HOST_LUT[_t] = (_t >> 8) in HOST_LAYERS


class HostCollector:
    """Host-layer events the Perfetto export draws, collected from a stream of per-process batches.

    The export draws the first ``max_events`` host events in (process, thread, ns) order (and needs
    the next event of the same thread for a slice's duration), so per process at most the remaining
    budget + 1 events are kept (compacted by a stable sort as batches arrive): bounded memory.
    """

    def __init__(self, max_events):
        self.budget = int(max_events)
        self.total = 0
        self.cur = None
        self.buf = []
        self.nbuf = 0
        self.done = []

    def add(self, cols):
        m = _HOST_LUT[cols["type"]]
        k = int(np.count_nonzero(m))
        if not len(cols["tsc"]):
            return
        i = int(cols["process"][0])
        if i != self.cur:
            self._close()
            self.cur = i
        self.total += k
        if not k or self.budget <= 0:
            return
        self.buf.append({c: np.asarray(cols[c])[m].astype(np.int64 if c != "arg" else np.uint64) for c in _HOST_KEYS})
        self.nbuf += k
        if self.nbuf > 2 * (self.budget + 1) + (1 << 16):
            self._compact()

    def _compact(self):
        if not self.buf:
            return
        b = {c: np.concatenate([x[c] for x in self.buf]) for c in _HOST_KEYS}
        o = np.lexsort((b["ns"], b["thread"]))[: self.budget + 1]
        b = {c: v[o] for c, v in b.items()}
        self.buf, self.nbuf = [b], len(o)

    def _close(self):
        if self.buf:
            self._compact()
            b = self.buf[0]
            self.done.append(b)
            self.budget -= min(self.budget, len(b["ns"]) - (1 if len(b["ns"]) > self.budget else 0))
        self.buf, self.nbuf = [], 0

    def result(self):
        self._close()
        if self.done:
            cols = {c: np.concatenate([d[c] for d in self.done]) for c in _HOST_KEYS}
        else:
            cols = {c: np.zeros(0, np.int64) for c in _HOST_KEYS}
        return cols, self.total


def host_events(corr, max_events):
    """(columns, total count) of the host-layer events the export may draw."""
    T = corr.tables
    if getattr(corr, "events_loaded", True):
        ev = T["events"]
        m = _HOST_LUT[np.asarray(ev["type"]).astype(np.int64) & 0xFFFF]
        return {c: np.asarray(ev[c])[m] for c in _HOST_KEYS}, int(m.sum())
    got = getattr(corr, "_host", None)
    if got is not None and got[0] == max_events:
        return got[1]
    hc = HostCollector(max_events)
    for cols in corr.iter_events():
        hc.add(cols)
    return hc.result()


def _bw_series(ns, nbytes, bin_ns, t0, nbins):
    b = np.clip(((ns - t0) // bin_ns).astype(np.int64), 0, nbins - 1)
    s = np.bincount(b, weights=nbytes.astype(np.float64), minlength=nbins)
    return s / bin_ns  # bytes per ns = GB/s


def write_perfetto(corr, path, max_events=500_000, bins=400):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

    T = corr.tables
    stats = dict(tracks=0, instants=0, slices=0, counters=0, flows=0, truncated=False)
    f = open(path, "wb")
    b = StreamingTraceProtoBuilder(f)
    uuid_ctr = [1000]

    def new_uuid():
        uuid_ctr[0] += 1
        return uuid_ctr[0]

    def pkt():
        p = b.create_packet()
        p.trusted_packet_sequence_id = _SEQ
        return p

    first = pkt()
    first.sequence_flags = P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    b.write_packet(first)

    def track(uuid, name=None, parent=None, process=None, thread=None, counter=False, unit=None):
        p = pkt()
        td = p.track_descriptor
        td.uuid = uuid
        if name:
            td.name = name
        if parent:
            td.parent_uuid = parent
        if process is not None:
            td.process.pid, td.process.process_name = process
        if thread is not None:
            td.thread.pid, td.thread.tid, td.thread.thread_name = thread
        if counter:
            td.counter.SetInParent()
            if unit:
                td.counter.unit_name = unit
        b.write_packet(p)
        stats["tracks"] += 1

    def ev(ts, uuid, typ, name=None, ann=None, flows=None, term=None, value=None):
        p = pkt()
        p.timestamp = int(ts)
        te = p.track_event
        te.type = typ
        te.track_uuid = uuid
        if name is not None:
            te.name = name
        if ann:
            for k, v in ann:
                d = te.debug_annotations.add()
                d.name = k
                if isinstance(v, str):
                    d.string_value = v
                elif isinstance(v, (bool, np.bool_)):
                    d.bool_value = bool(v)
                elif isinstance(v, (int, np.integer)):
                    d.int_value = int(v) if -(1 << 63) <= int(v) < (1 << 63) else 0
                else:
                    d.double_value = float(v)
        if flows:
            te.flow_ids.extend(int(x) for x in flows)
        if term:
            te.terminating_flow_ids.extend(int(x) for x in term)
        if value is not None:
            te.double_counter_value = float(value)
        b.write_packet(p)

    Pt = T["processes"]
    labels = list(T["nodes"]["label"])
    proc_uuid, thread_uuid = {}, {}
    for i in range(len(Pt["process"])):
        pid = int(Pt["pid"][i]) if Pt["pid"][i] > 0 else 900000 + i
        u = new_uuid()
        proc_uuid[i] = (u, pid)
        r = int(Pt["rank"][i])
        track(u, process=(pid, f"{'rank ' + str(r) if r >= 0 else 'process ' + str(i)} @ {Pt['node_label'][i]}"))
    Th = T["threads"]
    for p_, t_, tid, name in zip(Th["process"], Th["thread"], Th["tid"], Th["name"]):
        u = new_uuid()
        pu, pid = proc_uuid[int(p_)]
        thread_uuid[(int(p_), int(t_))] = u
        track(u, thread=(pid, int(tid) if tid > 0 else pid * 100 + int(t_), str(name) or f"thread {t_}"))
    # node / gpu / qp tracks
    node_uuid = {}
    for n, lab in enumerate(labels):
        node_uuid[n] = new_uuid()
        track(node_uuid[n], name=f"node {lab}")
    G = T["gpus"]
    gpu_uuid = {}
    for g, n, lab in zip(G["gpu"], G["node"], G["label"]):
        gpu_uuid[int(g)] = new_uuid()
        track(gpu_uuid[int(g)], name=f"GPU {lab}", parent=node_uuid[int(n)])
    Q = T["qps"]
    qp_uuid = {}
    for i in range(len(Q["qp_id"])):
        g = int(Q["gpu"][i])
        parent = gpu_uuid.get(g) or node_uuid[int(Q["node"][i])]
        peer = f" → rank {Q['remote_rank'][i]} QP {Q['remote_qpn'][i]:#x}" if Q["remote_qp_id"][i] >= 0 else ""
        qp_uuid[i] = new_uuid()
        track(qp_uuid[i], name=f"QP {int(Q['qpn'][i]):#x} (rank {Q['rank'][i]}){peer}", parent=parent)
    budget = [max_events]

    def take(n):
        k = min(n, budget[0])
        budget[0] -= k
        if k < n:
            stats["truncated"] = True
        return k

    # host calls: slices on thread tracks
    ev_t, n_host = host_events(corr, max_events)
    if len(ev_t["ns"]):
        o = np.lexsort((ev_t["ns"], ev_t["thread"], ev_t["process"]))
        ev_t = {k: v[o] for k, v in ev_t.items()}
        key = ev_t["process"] * (1 << 20) + ev_t["thread"]
        nxt = np.append(ev_t["ns"][1:], 0)
        same = np.append(key[1:] == key[:-1], False)
        dur = np.where(same, np.minimum(nxt - ev_t["ns"], 1000), 1000)
        dur = np.maximum(dur, 1)
        hs = np.arange(min(take(n_host), len(ev_t["ns"])))
        names = np.array([E.name_of(t) for t in range(0x700)], dtype=object)
        for j, i in enumerate(hs):
            u = thread_uuid.get((int(ev_t["process"][i]), int(ev_t["thread"][i])))
            if u is None:
                u = proc_uuid[int(ev_t["process"][i])][0]
            nm = names[min(int(ev_t["type"][i]), len(names) - 1)]
            ev(ev_t["ns"][i], u, P.TrackEvent.TYPE_SLICE_BEGIN, nm,
               ann=[("obj", int(ev_t["obj"][i])), ("aux", int(ev_t["aux"][i])), ("arg", int(ev_t["arg"][i]))])
            ev(ev_t["ns"][i] + dur[j], u, P.TrackEvent.TYPE_SLICE_END)
            stats["slices"] += 1
    # doorbells on GPU tracks
    D = T["doorbells"]
    nd = take(len(D["doorbell_id"]))
    for i in range(nd):
        g = int(D["gpu"][i])
        u = gpu_uuid.get(g) or qp_uuid.get(int(D["qp_id"][i])) or proc_uuid[int(D["process"][i])][0]
        ev(D["ns"][i], u, P.TrackEvent.TYPE_INSTANT, "doorbell",
           ann=[("qpn", int(D["qpn"][i])), ("producer_index", int(D["producer_index"][i])),
                ("wqes", int(D["wqes"][i])), ("wqebbs", int(D["delta_wqebbs"][i])),
                ("recovered", bool(D["complete"][i]))])
        stats["instants"] += 1
    # operations on QP tracks, flows to the peer QP
    ops_t = T["ops"]
    n_ops = ops_t.n_rows if hasattr(ops_t, "rows") else len(ops_t["op_id"])
    no = take(n_ops)
    # the drawn ops (first rows) in full; the counters need five columns of every op
    ops = ops_t.rows(slice(0, no)) if hasattr(ops_t, "rows") else ops_t
    full = ops_t.rows(None, ("ns", "bytes", "gpu", "node", "qp_id")) if hasattr(ops_t, "rows") else ops_t
    flow_base = 1 << 40
    for i in range(no):
        u = qp_uuid.get(int(ops["qp_id"][i]))
        if u is None:
            continue
        dq = int(ops["dst_qp_id"][i])
        peer = (f"rank {ops['dst_rank'][i]} {labels[ops['dst_node'][i]]} QP {ops['dst_qpn'][i]:#x}"
                if dq >= 0 else "unknown")
        fid = flow_base + i
        ann = [("opcode", str(ops["opcode_name"][i])), ("bytes", int(ops["bytes"][i])),
               ("raddr", f"{int(ops['raddr'][i]):#x}"), ("rkey", f"{int(ops['rkey'][i]):#x}"), ("peer", peer),
               ("source", str(ops["source_name"][i]))]
        if ops["doorbell_id"][i] >= 0:
            ann.append(("producer_index", int(D["producer_index"][ops["doorbell_id"][i]])))
        if ops["latency_ns"][i] >= 0:
            ann.append(("latency_ns", int(ops["latency_ns"][i])))
        ev(ops["ns"][i], u, P.TrackEvent.TYPE_INSTANT, str(ops["opcode_name"][i]), ann=ann,
           flows=[fid] if dq >= 0 else None)
        stats["instants"] += 1
        if dq >= 0 and dq in qp_uuid:
            t_dst = ops["peer_ns"][i] if ops["peer_ns"][i] >= 0 else (
                ops["complete_ns"][i] if ops["complete_ns"][i] >= 0 else ops["ns"][i])
            ev(t_dst, qp_uuid[dq], P.TrackEvent.TYPE_INSTANT, f"{ops['opcode_name'][i]} from rank {ops['rank'][i]}",
               ann=[("bytes", int(ops["bytes"][i])), ("side", "target")], term=[fid])
            stats["instants"] += 1
            stats["flows"] += 1
    # bandwidth counters
    if len(full["ns"]):
        t0, t1 = int(full["ns"].min()), int(full["ns"].max()) + 1
        bin_ns = max(1000, (t1 - t0) // bins + 1)
        nb = int((t1 - t0) // bin_ns) + 1
        ts = t0 + np.arange(nb + 1) * bin_ns

        def counters(name, parent, mask):
            u = new_uuid()
            track(u, name=name, parent=parent, counter=True, unit="GB/s")
            s = _bw_series(full["ns"][mask], full["bytes"][mask], bin_ns, t0, nb)
            s = np.append(s, 0.0)
            for t, v in zip(ts, s):
                ev(t, u, P.TrackEvent.TYPE_COUNTER, value=v)
                stats["counters"] += 1

        for g, uu in gpu_uuid.items():
            m = full["gpu"] == g
            if m.any():
                counters(f"GPU {G['label'][g]} egress GB/s", uu, m)
        for n, uu in node_uuid.items():
            m = full["node"] == n
            if m.any():
                counters(f"node {labels[n]} egress GB/s", uu, m)
        hasq = full["qp_id"] >= 0    # UCX / libfabric ops have no QP
        qtot = np.bincount(full["qp_id"][hasq], weights=full["bytes"][hasq], minlength=len(Q["qp_id"])) \
            if len(Q["qp_id"]) else []
        for q in np.argsort(-np.asarray(qtot))[:64]:
            if qtot[q] > 0:
                counters(f"QP {int(Q['qpn'][q]):#x} GB/s", qp_uuid[int(q)], full["qp_id"] == q)
    if stats["truncated"]:
        u = new_uuid()
        track(u, name="sigmatrace")
        ev(int(full["ns"].min()) if len(full["ns"]) else 0, u, P.TrackEvent.TYPE_INSTANT,
           f"trace truncated at {max_events} events (see summary.json)")
    f.close()
    return stats
