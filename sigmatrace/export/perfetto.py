"""Perfetto protobuf export (F17) with the ``perfetto`` package's protos.

(Over 600 lines: one trace builder; the track, event and flow writers share its interning tables.)

Tracks:
 * one process track per traced process (pid, "rank N @ host"), one thread
   track per thread; host calls (verbs, DevX, CUDA, UCX, OFI events) are slices
   on their thread (each lasts until the thread's next event, at most 1 µs —
   the tracer records entry times only); a run of idle polls on a thread
   (ucp_worker_progress / fi_cq_read that found nothing) is one slice
   "<call> (idle)" with annotation ``calls``, so a progress loop does not
   fill the window (tables.host_events);
 * per node a "node" track holding per-GPU tracks, each GPU track holding its
   QP tracks; doorbells are instant events on the GPU track, each operation an
   instant event on its QP track, with debug annotations (opcode, bytes,
   raddr, rkey, peer, producer index, wqes);
 * counter tracks: bandwidth (GB/s) per GPU, per QP and per node;
 * flow arrows from each matched operation to the peer side (the target QP
   track, at the receive completion, the initiator's completion, or the
   issue time for one-sided operations); UCX / libfabric operations (no QP)
   are instants on their issuing thread's track, their arrows end on the
   target process's track;
 * NCCL: per process one track per communicator ("NCCL comm …") under the
   process track; each attribution unit (a collective, or an NCCL group's
   calls / calls in flight together) is a slice from its first call to its
   end (last completion, else last work request; clamped to the next unit's
   start), with flow arrows to its work requests (at most
   ``_COLL_FLOWS`` per unit).
Large captures: at most ``max_events`` instants/slices are written (oldest
first); the cut is reported in the trace (a marker slice) and the summary.
Size (docs/report.md, "Perfetto trace size"): names, categories, annotation
names and small-vocabulary values interned per packet sequence; packets
written in deflate bundles (TracePacket.compressed_packets).
"""
from __future__ import annotations

import contextlib
import re

import numpy as np

from ..format import events as E
from ..progress import QUIET
from ..schema import NULL_SENTINEL
from .window import Window, in_window, perfetto_window

_SEQ = 7


_CHUNK = 50_000             # drawn events per emission chunk (one packet sequence each)
_COLL_FLOWS = 4096          # flow arrows from one collective slice to its work requests (the first ones drawn)
_COLL_FLOW_BASE = 2 << 40   # their ids: base + drawn op index (the ops' own flows: 1 << 40 + index)
_EMIT = None               # what _emit_chunk draws from (set by write_perfetto; forked workers inherit it)


def _fork_ok():
    import multiprocessing as mp
    return "fork" in mp.get_all_start_methods()


# Debug-annotation values drawn from a small vocabulary, interned like the names (a raddr is not: nearly unique).
_INTERN_VALUES = frozenset(("opcode", "peer", "source", "side", "rkey"))
# Packets are written in deflate bundles (TracePacket.compressed_packets, as traced writes them with compression
# on; trace_processor and ui.perfetto.dev expand them): at most this many uncompressed bytes per bundle, so that
# every bundle stays below the 512 KiB a compressed_packets TracePacket may have.  SIGMATRACE_PERFETTO_COMPRESS=0
# writes the packets plain (for readers of the raw protos that do not expand bundles).
_BUNDLE_BYTES = 480_000
_ZLIB_LEVEL = 6


def _compress():
    import os
    return os.environ.get("SIGMATRACE_PERFETTO_COMPRESS", "1") not in ("0", "no", "off", "")


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _deflated(packets):
    """Serialized Trace.packet records -> one Trace.packet record TracePacket{compressed_packets: zlib(them)}."""
    import zlib
    z = zlib.compress(packets, _ZLIB_LEVEL)
    inner = b"\x92\x03" + _varint(len(z)) + z          # TracePacket field 50 (compressed_packets), bytes
    return b"\x0a" + _varint(len(inner)) + inner         # Trace field 1 (packet)


def _bundle(data, ends, compress):
    """``data`` = serialized Trace.packet records ending at the offsets ``ends``: as they are, or cut at packet
    boundaries into bundles of at most _BUNDLE_BYTES (a larger packet alone), each deflated into one
    compressed_packets record."""
    if not compress or not data:
        return data
    out, start, prev = [], 0, 0
    for e in ends:
        if e - start > _BUNDLE_BYTES and prev > start:
            out.append(_deflated(data[start:prev]))
            start = prev
        prev = e
    if prev > start:
        out.append(_deflated(data[start:prev]))
    return b"".join(out)


class _Packets:
    """TracePackets of one sequence written through perfetto's StreamingTraceProtoBuilder into a buffer.

    Event names, categories, debug-annotation names and the small-vocabulary annotation values are interned
    (Perfetto's incremental state): the first packet clears the sequence's state
    (SEQ_INCREMENTAL_STATE_CLEARED); a string's first use on the sequence carries it in that packet's
    ``interned_data`` with the next iid, every later use only the iid, and every packet that refers to an iid
    says so (SEQ_NEEDS_INCREMENTAL_STATE).  Each sequence interns on its own, in emission order, so a chunk's
    bytes do not depend on which process emits it."""

    _TABLES = ("event_names", "event_categories", "debug_annotation_names", "debug_annotation_string_values")

    def __init__(self, seq):
        import io
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
        self.P = P
        self.buf = io.BytesIO()
        self.b = StreamingTraceProtoBuilder(self.buf)
        self.seq = seq
        self.iids = {t: {} for t in self._TABLES}
        self.ends = []            # offset in buf after each packet (bundles are cut there)
        first = self.packet()
        first.sequence_flags = P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        self.write(first)

    def packet(self):
        p = self.b.create_packet()
        p.trusted_packet_sequence_id = self.seq
        return p

    def write(self, p):
        self.b.write_packet(p)
        self.ends.append(self.buf.tell())

    def take(self, compress):
        """The bytes written so far (plain or in deflate bundles); the buffer starts empty again."""
        data = _bundle(self.buf.getvalue(), self.ends, compress)
        self.buf.seek(0)
        self.buf.truncate()
        self.ends = []
        return data

    def _iid(self, p, table, s):
        ids = self.iids[table]
        iid = ids.get(s)
        if iid is None:
            iid = ids[s] = len(ids) + 1
            e = getattr(p.interned_data, table).add()
            e.iid = iid
            if table == "debug_annotation_string_values":
                e.str = s.encode()
            else:
                e.name = s
        return iid

    def ev(self, ts, uuid, typ, name=None, ann=None, flows=None, term=None, value=None, cat=None):
        p = self.packet()
        p.timestamp = int(ts)
        te = p.track_event
        te.type = typ
        te.track_uuid = uuid
        interned = False
        if cat is not None:
            te.category_iids.append(self._iid(p, "event_categories", cat))
            interned = True
        if name is not None:
            te.name_iid = self._iid(p, "event_names", name)
            interned = True
        if ann:
            interned = True
            for k, v in ann:
                d = te.debug_annotations.add()
                d.name_iid = self._iid(p, "debug_annotation_names", k)
                if isinstance(v, str):
                    if k in _INTERN_VALUES:
                        d.string_value_iid = self._iid(p, "debug_annotation_string_values", v)
                    else:
                        d.string_value = v
                elif isinstance(v, (bool, np.bool_)):
                    d.bool_value = bool(v)
                elif isinstance(v, (int, np.integer)):
                    d.int_value = int(v) if -(1 << 63) <= int(v) < (1 << 63) else 0
                else:
                    d.double_value = float(v)
        if interned:
            p.sequence_flags = self.P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        if flows:
            te.flow_ids.extend(int(x) for x in flows)
        if term:
            te.terminating_flow_ids.extend(int(x) for x in term)
        if value is not None:
            te.double_counter_value = float(value)
        self.write(p)


def _emit_chunk(arg, S=None):
    """One chunk of drawn events (host slices, doorbells or operations [lo, hi)) as serialized packets of
    sequence _SEQ + 1 + k; returns (bytes, stats).  ``S``: what it draws from (default: _EMIT)."""
    k, (kind, lo, hi) = arg
    S = _EMIT if S is None else S
    out = _Packets(_SEQ + 1 + k)
    P = out.P
    st = dict(slices=0, instants=0, flows=0)
    if kind == "host":
        ev_t, dur, names = S["ev_t"], S["dur"], S["names"]
        for i in S["hs"][lo:hi].tolist():
            u = S["thread_uuid"].get((int(ev_t["process"][i]), int(ev_t["thread"][i])))
            if u is None:
                u = S["proc_uuid"][int(ev_t["process"][i])][0]
            nm = names[min(int(ev_t["type"][i]), len(names) - 1)]
            ann = [("obj", int(ev_t["obj"][i])), ("aux", int(ev_t["aux"][i])), ("arg", int(ev_t["arg"][i]))]
            calls = int(ev_t["calls"][i])
            if calls > 1:             # idle polls in a row (tables.host_events): one slice, how many in it
                nm = nm + " (idle)"
                ann.append(("calls", calls))
            out.ev(ev_t["ns"][i], u, P.TrackEvent.TYPE_SLICE_BEGIN, nm, cat="host", ann=ann)
            out.ev(ev_t["ns"][i] + dur[i], u, P.TrackEvent.TYPE_SLICE_END)
            st["slices"] += 1
    elif kind == "doorbells":
        D = S["D"]
        for i in S["dbs"][lo:hi].tolist():
            g = int(D["gpu"][i])
            u = S["gpu_uuid"].get(g) or S["qp_uuid"].get(int(D["qp_id"][i])) or S["proc_uuid"][int(D["process"][i])][0]
            out.ev(D["ns"][i], u, P.TrackEvent.TYPE_INSTANT, "doorbell", cat="doorbell",
                   ann=[("qpn", int(D["qpn"][i])), ("producer_index", int(D["producer_index"][i])),
                        ("wqes", int(D["wqes"][i])), ("wqebbs", int(D["delta_wqebbs"][i])),
                        ("recovered", bool(D["complete"][i]))])
            st["instants"] += 1
    else:
        ops, labels, qp_uuid, drawn = S["ops"], S["labels"], S["qp_uuid"], S["drawn"]
        coll_flow = S.get("coll_flow")
        thread_uuid, proc_uuid = S["thread_uuid"], S["proc_uuid"]
        flow_base = 1 << 40
        child_base = 2 << 40          # F25: a UCP call -> each WQE it produced (flow id: base + the WQE op's id)
        kids, drawn_set = S["kids"], S["drawn_set"]
        for i in range(lo, hi):
            q = int(ops["qp_id"][i])
            if q >= 0:
                u = qp_uuid.get(q)
            else:      # UCX / libfabric: no QP; on the issuing thread's track (its call is the slice there)
                pr = int(ops["process"][i])
                u = thread_uuid.get((pr, int(ops["thread"][i]))) or proc_uuid[pr][0]
            if u is None:
                continue
            dq = int(ops["dst_qp_id"][i])
            dp = int(ops["dst_process"][i])
            matched = bool(ops["matched"][i])
            if dq >= 0:
                peer = f"rank {ops['dst_rank'][i]} {labels[ops['dst_node'][i]]} QP {ops['dst_qpn'][i]:#x}"
                dst_u = qp_uuid.get(dq)
            elif matched and dp >= 0:
                peer = f"rank {ops['dst_rank'][i]} {labels[ops['dst_node'][i]]}"
                dst_u = proc_uuid[dp][0]          # the target process (its receiving thread is not known)
            else:
                peer, dst_u = "unknown", None
            fid = flow_base + int(drawn[i])
            ann = [("opcode", str(ops["opcode_name"][i])), ("bytes", int(ops["bytes"][i])),
                   ("raddr", f"{int(ops['raddr'][i]):#x}"), ("rkey", f"{int(ops['rkey'][i]):#x}"), ("peer", peer),
                   ("source", str(ops["source_name"][i]))]
            if ops["doorbell_id"][i] >= 0:
                ann.append(("producer_index", int(ops["doorbell_pi"][i])))
            if ops["latency_ns"][i] != NULL_SENTINEL:     # known: the op's own completion was recorded
                ann.append(("latency_ns", int(ops["latency_ns"][i])))
            oid = int(drawn[i])
            fl = ([fid] if matched else []) + [child_base + c for c in kids.get(oid, ())]
            par = int(ops["parent_op_id"][i]) if "parent_op_id" in ops else -1
            if par >= 0:
                ann.append(("parent_op_id", par))
            cf = int(coll_flow[i]) if coll_flow is not None else 0
            if cf:
                ann.append(("collective_unit", int(ops["collective_unit"][i])))
                st["flows"] += 1
            term = ([child_base + oid] if par >= 0 and par in drawn_set else []) + ([cf] if cf else [])
            out.ev(ops["ns"][i], u, P.TrackEvent.TYPE_INSTANT, str(ops["opcode_name"][i]), cat="op", ann=ann,
                   flows=fl or None, term=term or None)
            st["flows"] += len(fl) - (1 if matched else 0)
            st["instants"] += 1
            if matched and dst_u is not None:
                t_dst = ops["peer_ns"][i] if ops["peer_ns"][i] >= 0 else (
                    ops["complete_ns"][i] if ops["complete_ns"][i] >= 0 else ops["ns"][i])
                out.ev(t_dst, dst_u, P.TrackEvent.TYPE_INSTANT, cat="op", name=
                       f"{ops['opcode_name'][i]} from rank {ops['rank'][i]}",
                       ann=[("bytes", int(ops["bytes"][i])), ("side", "target")], term=[fid])
                st["instants"] += 1
                st["flows"] += 1
    return out.take(_compress()), st


def _collectives(T, ops, cut, main, track, new_uuid, proc_uuid, stats):
    """The NCCL communicator tracks and one slice per attribution unit (drawn when it starts inside the
    window), with a flow to each of its drawn work requests (the first _COLL_FLOWS); returns per drawn op the
    flow id that ends on it (0: none), or None without collectives."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    C, K = T.get("collectives"), T.get("communicators")
    if C is None or K is None or not len(K["comm"]):
        return None
    comm_uuid = {}
    for c, p_, r, nr, key in zip(K["comm"], K["process"], K["rank"], K["nranks"], K["key"]):
        u = new_uuid()
        comm_uuid[int(c)] = u
        short = re.sub(r"^([0-9a-f]{8})[0-9a-f]{8}", r"\1", str(key))     # the unique-id hash cut to 8 digits
        track(u, name=f"NCCL comm {short} (rank {int(r)} of {int(nr)})", parent=proc_uuid[int(p_)][0])
    unit = np.asarray(C["unit"])
    sel = np.flatnonzero(unit >= 0)
    coll_flow = None
    nd = len(ops["ns"]) if "ns" in ops else 0
    flows_of = {}
    if nd and "collective_unit" in ops:
        cu = np.asarray(ops["collective_unit"], np.int64)
        d = np.flatnonzero(cu >= 0)
        if len(d):
            o = d[np.lexsort((np.asarray(ops["ns"])[d], cu[d]))]
            k = cu[o]
            start = np.ones(len(o), bool)
            start[1:] = k[1:] != k[:-1]
            pos = np.arange(len(o))
            nth = pos - np.maximum.accumulate(np.where(start, pos, 0))
            keep = o[nth < _COLL_FLOWS]
            coll_flow = np.zeros(nd, np.int64)
            coll_flow[keep] = _COLL_FLOW_BASE + keep
            for i in keep.tolist():
                flows_of.setdefault(int(cu[i]), []).append(int(coll_flow[i]))
    if not len(sel):
        return coll_flow
    # one slice per unit: [first call, end], the members' names; per communicator track in time order
    units = {}
    for i in sel.tolist():
        units.setdefault(int(unit[i]), []).append(i)
    rows = []
    for u, mem in units.items():
        start = min(int(C["call_ns"][i]) for i in mem)
        ends = [int(C["end_ns"][i]) for i in mem if C["end_ns"][i] >= 0]
        calls_end = max(int(C["call_ns"][i]) + int(C["call_duration_ns"][i]) for i in mem)
        end = max([calls_end] + ends)
        rows.append((int(C["comm"][mem[0]]), start, end, u, mem))
    rows.sort()
    for j, (comm, start, end, u, mem) in enumerate(rows):
        if cut is not None and start > cut:
            continue
        nxt = rows[j + 1][1] if j + 1 < len(rows) and rows[j + 1][0] == comm else None
        end = max(start + 1, min(end, nxt) if nxt is not None else end)
        i0 = mem[0]
        ops_ = [str(C["op"][i]) for i in mem]
        att = str(C["attribution"][i0])
        name = ops_[0] if len(mem) == 1 else (("group: " if att == "group" else "in flight: ")
                                                + "+".join(ops_[:4]) + (" …" if len(ops_) > 4 else ""))
        ann = [("bytes", int(C["bytes"][i0]) if len(mem) == 1 else int(sum(int(C["bytes"][i]) for i in mem))),
               ("count", int(C["count"][i0])), ("datatype", str(C["datatype"][i0])), ("seq", int(C["seq"][i0])),
               ("calls", len(mem)), ("wrs", int(C["wrs"][i0])), ("wire_bytes", int(C["wire_bytes"][i0])),
               ("attribution", att), ("unit", u), ("instance", int(C["instance"][i0])),
               ("collective_id", int(C["collective_id"][i0]))]
        if C["root"][i0] >= 0:
            ann.append(("root_or_peer", int(C["root"][i0])))
        fl = flows_of.get(u)
        main.ev(start, comm_uuid[comm], P.TrackEvent.TYPE_SLICE_BEGIN, name, cat="nccl", ann=ann, flows=fl)
        main.ev(end, comm_uuid[comm], P.TrackEvent.TYPE_SLICE_END)
        stats["slices"] += 1
    return coll_flow


# the tables of ``corr`` that ``write_perfetto`` reads besides its window (tracks, collectives)
TRACK_TABLES = ("processes", "nodes", "threads", "gpus", "qps", "collectives", "communicators")


def chunk_state(state, job):
    """What chunk ``job`` (kind, lo, hi) reads of ``state``, alone: (its state, the job in it), so that a chunk
    can be emitted where the whole state is not (the cluster report's chunk tasks); ``emit_chunk`` of the two
    gives the bytes it gives of the whole state."""
    kind, lo, hi = job
    n = hi - lo
    common = {k: state[k] for k in ("thread_uuid", "proc_uuid", "gpu_uuid", "qp_uuid", "labels", "names")}
    if kind == "host":
        rows = state["hs"][lo:hi]
        sub = dict(common, ev_t={c: v[rows] for c, v in state["ev_t"].items()}, dur=state["dur"][rows],
                   hs=np.arange(n))
    elif kind == "doorbells":
        rows = state["dbs"][lo:hi]
        sub = dict(common, D={c: v[rows] for c, v in state["D"].items()}, dbs=np.arange(n))
    else:
        ops = {c: v[lo:hi] for c, v in state["ops"].items()}
        drawn = state["drawn"][lo:hi]
        mine = set(np.asarray(drawn).tolist())
        parents = set(np.asarray(ops["parent_op_id"]).tolist()) if "parent_op_id" in ops else set()
        cf = state.get("coll_flow")
        sub = dict(common, ops=ops, drawn=drawn, coll_flow=None if cf is None else cf[lo:hi],
                   kids={o: c for o, c in state["kids"].items() if o in mine},
                   drawn_set=parents & state["drawn_set"])
    return sub, (kind, 0, n)


def emit_chunk(state, k, job):
    """Chunk ``k`` (``job``: kind, lo, hi) of a trace drawn from ``state`` (what ``write_perfetto`` hands an
    ``emit_map``): (bytes, stats), the same bytes whichever process emits it."""
    return _emit_chunk((k, job), state)


def write_perfetto(corr, path, max_events=500_000, bins=400, progress=QUIET, window: "Window | None" = None,
                   emit_map=None, chunk=None):
    """The Perfetto trace of ``corr`` into ``path``; returns its statistics.  ``window``: what it draws
    (``export.window``; default: computed from ``corr``'s tables here).  ``emit_map(state, jobs)``: where the
    chunks of drawn events are emitted (the cluster report's tasks: cluster.shard.perfetto_trace), an iterable
    of ``emit_chunk(state, k, jobs[k])``'s results in chunk order; default: forked workers when
    ``corr.workers`` > 1, else this process.  ``chunk``: drawn events per chunk (default _CHUNK; the file
    depends on it, never on where the chunks are emitted)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

    T = corr.tables
    stats = dict(tracks=0, instants=0, slices=0, counters=0, flows=0, truncated=False)
    f = open(path, "wb")
    main = _Packets(_SEQ)       # tracks, counters and the truncation marker; the drawn events come in chunks
    ev = main.ev
    uuid_ctr = [1000]

    def new_uuid():
        uuid_ctr[0] += 1
        return uuid_ctr[0]

    compress = _compress()

    def flush():
        f.write(main.take(compress))

    def track(uuid, name=None, parent=None, process=None, thread=None, counter=False, unit=None):
        p = main.packet()
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
        main.write(p)
        stats["tracks"] += 1

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
    # One time window for everything drawn: the max_events earliest events across host calls, doorbells and
    # operations (ties at the cut included), so that the timeline is the whole system's first part of the run,
    # not the first processes' or the first category's events; the tables hold every event.
    win = window if window is not None else perfetto_window(corr, max_events, bins)
    ev_t, n_ops, scan, cut = win.ev_t, win.n_ops, win.scan, win.cut
    stats["truncated"] = win.truncated
    if win.truncated:
        stats["window_end_ns"] = cut

    # The drawn events are emitted in chunks of _CHUNK (host slices, doorbells, operations), each chunk on its
    # own packet sequence into its own buffer, by forked workers when the report has several: the chunks are
    # cut the same way whatever the worker count and appended in chunk order, so the file does not depend on it.
    hs = np.zeros(0, np.int64)
    dur = names = None
    if len(ev_t["ns"]):
        o = np.lexsort((ev_t["ns"], ev_t["thread"], ev_t["process"]))
        ev_t = {k: v[o] for k, v in ev_t.items()}
        key = ev_t["process"] * (1 << 20) + ev_t["thread"]
        nxt = np.append(ev_t["ns"][1:], 0)
        same = np.append(key[1:] == key[:-1], False)
        end = ev_t["end_ns"]          # a run of idle polls: from its first call to its last one's end
        dur = np.where(same, np.minimum(nxt - end, 1000), 1000)
        dur = np.maximum(dur, 1) + (end - ev_t["ns"])
        # the runs of idle polls of one segment span it (tables.host_events): one duration, so they nest
        span = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (ev_t["ns"][1:] != ev_t["ns"][:-1]) |
                                    (end[1:] != end[:-1])])
        dur = np.repeat(np.maximum.reduceat(dur, span), np.diff(np.r_[span, len(dur)]))
        hs = in_window(ev_t["ns"], cut, win.truncated, max_events)
        names = np.array([E.name_of(t) for t in range(E.TYPE_RANGE)], dtype=object)
    D = win.doorbells
    dbs = np.arange(len(D["ns"]))
    # operations on QP tracks, flows to the peer QP
    drawn, ops = win.drawn, win.ops
    coll_flow = _collectives(T, ops, cut, main, track, new_uuid, proc_uuid, stats)
    chunk = int(chunk or _CHUNK)
    jobs = [(kind, lo, min(lo + chunk, n)) for kind, n in (("host", len(hs)), ("doorbells", len(dbs)),
                                                           ("ops", len(drawn))) for lo in range(0, n, chunk)]
    # F25: UCP / libfabric call -> its WQEs (both drawn): the call's instant starts a flow to each
    kids, drawn_set = {}, set()
    if "parent_op_id" in ops and len(drawn):
        drawn_set = set(np.asarray(drawn).tolist())
        par = np.asarray(ops["parent_op_id"], np.int64)
        for c, p_ in zip(np.asarray(drawn)[par >= 0].tolist(), par[par >= 0].tolist()):
            if p_ in drawn_set:
                kids.setdefault(p_, []).append(c)
    flush()
    progress("perfetto", 0, total=sum(hi - lo for _, lo, hi in jobs), unit="event")
    global _EMIT
    _EMIT = dict(kids=kids, drawn_set=drawn_set, ev_t=ev_t, dur=dur, names=names, hs=hs, D=D, dbs=dbs, ops=ops,
                 drawn=drawn, labels=labels, coll_flow=coll_flow,
                 thread_uuid=thread_uuid, proc_uuid=proc_uuid, gpu_uuid=gpu_uuid, qp_uuid=qp_uuid)
    try:
        workers = int(getattr(corr, "workers", 1) or 1)
        with contextlib.ExitStack() as stack:      # the chunks in chunk order, from wherever they are emitted
            if emit_map is not None and len(jobs) > 1:
                done = emit_map(_EMIT, jobs)
            elif workers > 1 and len(jobs) > 1 and _fork_ok():
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor
                ex = stack.enter_context(ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                                                             mp_context=mp.get_context("fork")))
                done = ex.map(_emit_chunk, list(enumerate(jobs)))
            else:
                done = map(_emit_chunk, enumerate(jobs))
            for (data, st_), j in zip(done, jobs):
                f.write(data)
                for k_, v_ in st_.items():
                    stats[k_] += v_
                progress("perfetto", j[2] - j[1])
    finally:
        _EMIT = None
    # bandwidth counters (from the scan: bytes per key and time bin)
    if n_ops:
        ts = scan["t0"] + np.arange(scan["nb"] + 1) * scan["bin_ns"]

        def counters(name, parent, series):
            u = new_uuid()
            track(u, name=name, parent=parent, counter=True, unit="GB/s")
            for t, v in zip(ts, np.append(series, 0.0)):
                ev(t, u, P.TrackEvent.TYPE_COUNTER, value=v)
                stats["counters"] += 1

        for g, uu in gpu_uuid.items():
            if scan["gpu"][g].any():
                counters(f"GPU {G['label'][g]} egress GB/s", uu, scan["gpu"][g])
        for n, uu in node_uuid.items():
            if scan["node"][n].any():
                counters(f"node {labels[n]} egress GB/s", uu, scan["node"][n])
        for k, q in enumerate(scan["top_qps"]):
            counters(f"QP {int(Q['qpn'][q]):#x} GB/s", qp_uuid[q], scan["qp"][k])
    if stats["truncated"]:
        u = new_uuid()
        track(u, name="sigmatrace")
        ev(cut if cut is not None else 0, u, P.TrackEvent.TYPE_INSTANT,
           f"timeline ends here: the first {max_events:,} events are drawn (--max-perfetto-events); "
           f"the tables hold all of them")
    flush()
    f.close()
    return stats
