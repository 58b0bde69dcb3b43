"""Tables derived from the correlated operations: flows, barriers, losses, aggregates.

Barrier recognition (documented in docs/report.md):
 * a *barrier address* is a remote location (target process, raddr) that
   receives fetch-and-add style atomics (ATOMIC_FA, ATOMIC_MASKED_FA) from at
   least two participants (GPUs, or processes for CPU-initiated traffic), and
   every participant hits it the same number of times — the signature of a
   counter that each member bumps once per barrier (NVSHMEM-style
   barrier_all / sync).  Visited-vertex compare-and-swap traffic (CS) and
   irregular fetch-adds (unequal counts) are not barriers.
 * barrier instance k = the k-th hit of every participant (time order on the
   participant's own QP); with several barrier addresses (dissemination or
   all-to-all signalling) a participant's arrival at instance k is its
   earliest k-th hit across them.  Addresses are grouped by their episode
   count; each group is one barrier *series*.
 * per instance: first/last arrival, spread = last - first, arrival order,
   straggler = last arrival.
"""
from __future__ import annotations

import json

import numpy as np

from .. import schema
from ..format import events as E
from . import hostlib
from .rows import Labels, RowTable, sel_ids
from .util import group_starts, rank_in_group

BARRIER_OPS = (0x12, 0x15)   # ATOMIC_FA, ATOMIC_MASKED_FA


# A flow is the arrow between the two sides of a matched op.  Everything else about it (QPs, processes,
# nodes, bytes, opcode) is the op's: one definition per fact, join ops on op_id (docs/schema.md).
FLOW_COLUMNS = schema.columns("flows")
FLOW_KINDS = ["send-recv", "op-completion", "one-sided"]


def build_flows(out, flow_ids=None):
    """One flow per matched op, computed per row range from the ops table (only the op index is kept).

    Matched: the target is known — the remote QP for verbs / GPU operations, the peer process for UCX and
    libfabric operations (no QP, ``dst_qp_id`` = -1; their peer completions are not recorded, so their
    flows are one-sided: the arrow ends on the target process at the issue time).  ``flow_ids``: the
    global flow id of each (``None``: its row; the cluster report's parts give theirs)."""
    ops = out.tables["ops"]
    m = np.flatnonzero(ops.rows(None, ("matched",))["matched"])
    nf = len(m)
    names = ("ns", "peer_ns", "complete_ns", "peer_completion", "completion", "op_id")

    def flow_rows(sel, want, labels=False):
        mi = m[sel]
        o = ops.rows(mi, names)
        peer, comp = o["peer_ns"], o["complete_ns"]
        code = np.where(peer >= 0, 0, np.where(comp >= 0, 1, 2))
        fid = sel_ids(sel, nf)
        r = dict(flow_id=fid if flow_ids is None else flow_ids[fid], op_id=o["op_id"],
                 kind=Labels(code, FLOW_KINDS) if labels else Labels(code, FLOW_KINDS).objects(), src_ns=o["ns"],
                 dst_ns=np.where(peer >= 0, peer, np.where(comp >= 0, comp, o["ns"])),
                 dst_completion_id=np.where(code == 0, o["peer_completion"],
                                            np.where(code == 1, o["completion"], -1)).astype(np.int64))
        return {k: r[k] for k in want}

    out.tables["flows"] = RowTable(nf, FLOW_COLUMNS, flow_rows, base={"op_id": m})


BARRIER_COLUMNS = ("gpu", "process", "dst_process", "raddr", "ns")


def barrier_candidates(ops_t, ops_codes=BARRIER_OPS):
    """The fetch-and-add operations to a known target: (op rows, their ``BARRIER_COLUMNS`` and ``op_id``)."""
    cand = np.flatnonzero(np.isin(ops_t.base["opcode"], ops_codes)) if hasattr(ops_t, "base") else \
        np.flatnonzero(np.isin(ops_t["opcode"], ops_codes))
    names = BARRIER_COLUMNS + ("op_id",)
    o = ops_t.rows(cand, names) if hasattr(ops_t, "rows") else {k: ops_t[k][cand] for k in names}
    keep0 = o["dst_process"] >= 0
    return cand[keep0], {k: v[keep0] for k, v in o.items()}


def _participant(cand):
    """Per candidate: its participant, the GPU (>= 0) or, for CPU-initiated traffic, -1 - process."""
    gpu = np.asarray(cand["gpu"], np.int64)
    return np.where(gpu >= 0, gpu, -1 - np.asarray(cand["process"], np.int64))


def _addresses(cand):
    return np.stack([np.asarray(cand["dst_process"]).astype(np.int64),
                     np.asarray(cand["raddr"]).astype(np.uint64).view(np.int64)], 1)


def barrier_counts(cand):
    """Hits per (address, participant) of the candidates (``barrier_candidates``' columns): dst_process, raddr
    (int64 view), participant, count -- one row per pair, whatever the number of hits."""
    ap = np.concatenate([_addresses(cand), _participant(cand)[:, None]], 1)
    u, cnt = np.unique(ap, axis=0, return_counts=True) if len(ap) else (np.zeros((0, 3), np.int64),
                                                                        np.zeros(0, np.int64))
    return dict(dst_process=u[:, 0], raddr=u[:, 1], participant=u[:, 2], count=cnt.astype(np.int64))


def barrier_series(counts):
    """The barrier addresses and their series from ``barrier_counts`` rows (of one or several parts; a pair
    in several is summed): dst_process, raddr, series -- addresses in (dst_process, raddr) order.  A barrier
    address has >= 2 participants that hit it equally often; series = rank of (participants, episodes)."""
    ap = np.stack([np.asarray(counts["dst_process"], np.int64), np.asarray(counts["raddr"], np.int64),
                   np.asarray(counts["participant"], np.int64)], 1)
    z = np.zeros(0, np.int64)
    if not len(ap):
        return dict(dst_process=z, raddr=z, series=z)
    uap, inv = np.unique(ap, axis=0, return_inverse=True)
    apcnt = np.bincount(inv.ravel(), weights=counts["count"], minlength=len(uap)).astype(np.int64)
    ua, a_of = np.unique(uap[:, :2], axis=0, return_inverse=True)
    a_of = a_of.ravel()
    na = len(ua)
    nparts = np.bincount(a_of, minlength=na)
    cmin = np.full(na, np.iinfo(np.int64).max)
    cmax = np.zeros(na, np.int64)
    np.minimum.at(cmin, a_of, apcnt)
    np.maximum.at(cmax, a_of, apcnt)
    bar = np.flatnonzero((nparts >= 2) & (cmin == cmax))
    if not len(bar):
        return dict(dst_process=z, raddr=z, series=z)
    # series: addresses grouped by (participant set size, episode count)
    _, sinv = np.unique(np.stack([nparts[bar], cmax[bar]], 1), axis=0, return_inverse=True)
    return dict(dst_process=ua[bar, 0], raddr=ua[bar, 1], series=sinv.ravel().astype(np.int64))


def barrier_arrivals(cand, series, op_ids=None):
    """The arrivals of the candidates (columns, rows in op id order; ``op_ids``: theirs, default
    ``cand["op_id"]``) at the barriers of ``series`` (``barrier_series``): (keys (series, instance k,
    participant) sorted, earliest ns, op id of the earliest hit).  A participant's arrival at instance k is its
    earliest k-th hit across the series' addresses; every hit of a participant must be among the candidates
    (the cluster report: a participant's operations are all in one part)."""
    sel = np.asarray(cand["op_id"] if op_ids is None else op_ids, np.int64)
    empty = (np.zeros((0, 3), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not len(sel) or not len(series["series"]):
        return empty
    sa = np.stack([np.asarray(series["dst_process"], np.int64), np.asarray(series["raddr"], np.int64)], 1)
    _, inv = np.unique(np.concatenate([sa, _addresses(cand)]), axis=0, return_inverse=True)
    inv = inv.ravel()
    idx_of = np.full(int(inv.max()) + 1, -1, np.int64)
    idx_of[inv[:len(sa)]] = np.arange(len(sa))
    ainv = idx_of[inv[len(sa):]]
    keep = ainv >= 0
    if not keep.any():
        return empty
    ns = np.asarray(cand["ns"], np.int64)[keep]
    sel, part, ainv = sel[keep], _participant(cand)[keep], ainv[keep]
    sinv = np.asarray(series["series"], np.int64)[ainv]
    # k-th hit of each participant at each address
    gk = ainv.astype(np.int64) * (1 << 32) + (part + (1 << 20))
    k = rank_in_group(gk, ns.astype(np.float64))
    # arrival(series, k, participant) = earliest over the series' addresses
    key = np.stack([sinv, k, part], 1)
    uk, kinv = np.unique(key, axis=0, return_inverse=True)
    kinv = kinv.ravel()
    arr_ns = np.full(len(uk), np.iinfo(np.int64).max)
    np.minimum.at(arr_ns, kinv, ns)
    arr_op = np.full(len(uk), -1, np.int64)
    # op id of the earliest hit
    o = np.lexsort((ns, kinv))
    f = group_starts(kinv[o])
    arr_op[kinv[o][f]] = sel[o][f]
    return uk, arr_ns, arr_op


def _empty_barriers(T):
    T["barriers"] = dict(barrier=np.zeros(0, np.int64), series=np.zeros(0, np.int64), instance=np.zeros(0, np.int64),
                         participants=np.zeros(0, np.int64), first_ns=np.zeros(0, np.int64),
                         last_ns=np.zeros(0, np.int64), spread_ns=np.zeros(0, np.int64),
                         first_participant=np.zeros(0, np.int64), straggler=np.zeros(0, np.int64),
                         straggler_rank=np.zeros(0, np.int64), straggler_gpu=np.zeros(0, np.int64),
                         straggler_label=np.zeros(0, object), arrival_order=np.zeros(0, object))
    T["barrier_arrivals"] = dict(barrier=np.zeros(0, np.int64), participant=np.zeros(0, np.int64),
                                 gpu=np.zeros(0, np.int64), process=np.zeros(0, np.int64),
                                 rank=np.zeros(0, np.int64), node=np.zeros(0, np.int64), label=np.zeros(0, object),
                                 ns=np.zeros(0, np.int64), position=np.zeros(0, np.int64),
                                 wait_ns=np.zeros(0, np.int64), op_id=np.zeros(0, np.int64))


def build_barriers(out, cand=None):
    """The barriers and barrier_arrivals tables.  ``cand``: the candidate operations' columns
    (``barrier_candidates``' second result, rows in op id order) when the ops table is not here.  In three
    steps that the cluster report runs apart (per part, then merged): ``barrier_counts``, ``barrier_series``,
    ``barrier_arrivals``; then ``barrier_tables``."""
    if cand is None:
        _, cand = barrier_candidates(out.tables["ops"])
    _empty_barriers(out.tables)
    if not len(cand["op_id"]):
        return
    series = barrier_series(barrier_counts(cand))
    uk, arr_ns, arr_op = barrier_arrivals(cand, series)
    if len(uk):
        barrier_tables(out, uk, arr_ns, arr_op)


def barrier_tables(out, uk, arr_ns, arr_op):
    """The barriers and barrier_arrivals tables from the arrivals (``barrier_arrivals``: keys sorted)."""
    T = out.tables
    _empty_barriers(T)
    if not len(uk):
        return
    # barrier id per (series, k)
    bk = uk[:, :2]
    ub, binv = np.unique(bk, axis=0, return_inverse=True)
    binv = binv.ravel()
    nb = len(ub)
    first = np.full(nb, np.iinfo(np.int64).max)
    last = np.full(nb, np.iinfo(np.int64).min)
    np.minimum.at(first, binv, arr_ns)
    np.maximum.at(last, binv, arr_ns)
    npart = np.bincount(binv, minlength=nb)
    # arrival order
    o = np.lexsort((uk[:, 2], arr_ns, binv))
    pos = rank_in_group(binv, arr_ns.astype(np.float64) + uk[:, 2] * 1e-6)
    wait = last[binv] - arr_ns
    # participant labels
    g = T["gpus"]
    labels = {}
    for gi, lab in zip(g["gpu"], g["label"]):
        labels[int(gi)] = str(lab)
    procs = T["processes"]
    p_idx = np.where(uk[:, 2] >= 0, -1, -1 - uk[:, 2])
    gpu_of = np.where(uk[:, 2] >= 0, uk[:, 2], -1)
    g_proc = dict(zip(g["gpu"].tolist(), g["process"].tolist()))
    proc_of = np.array([g_proc.get(int(x), -1) if x >= 0 else int(p) for x, p in zip(gpu_of, p_idx)], np.int64)
    lab = np.array([labels.get(int(x), f"gpu{x}") if x >= 0 else f"rank{procs['rank'][p]}" if procs["rank"][p] >= 0
                    else f"process{p}" for x, p in zip(gpu_of, proc_of)], dtype=object)
    rank_of = np.where(proc_of >= 0, procs["rank"][np.maximum(proc_of, 0)], -1)
    node_of = np.where(proc_of >= 0, procs["node"][np.maximum(proc_of, 0)], -1)
    T["barrier_arrivals"] = dict(barrier=binv.astype(np.int64), participant=uk[:, 2], gpu=gpu_of, process=proc_of,
                                 rank=rank_of, node=node_of, label=lab, ns=arr_ns, position=pos, wait_ns=wait,
                                 op_id=arr_op)
    last_i = np.full(nb, -1, np.int64)
    first_i = np.full(nb, -1, np.int64)
    oo = np.lexsort((uk[:, 2], arr_ns, binv))
    fs = group_starts(binv[oo])
    ls = np.append(fs[1:], True)
    first_i[binv[oo][fs]] = oo[fs]
    last_i[binv[oo][ls]] = oo[ls]
    orders = [[] for _ in range(nb)]
    for j in oo:
        orders[binv[j]].append(str(lab[j]))
    T["barriers"] = dict(
        barrier=np.arange(nb, dtype=np.int64), series=ub[:, 0].astype(np.int64), instance=ub[:, 1].astype(np.int64),
        participants=npart.astype(np.int64), first_ns=first, last_ns=last, spread_ns=last - first,
        first_participant=uk[first_i, 2], straggler=uk[last_i, 2], straggler_rank=rank_of[last_i],
        straggler_gpu=gpu_of[last_i], straggler_label=lab[last_i],
        arrival_order=np.array([json.dumps(x) for x in orders], dtype=object))


def doorbell_losses(D, nproc):
    """Per process: WQEBBs lost, doorbells not fully recovered (the doorbells table's columns ``D``)."""
    if not len(D["process"]):
        return np.zeros(nproc, np.int64), np.zeros(nproc, np.int64)
    return (np.bincount(D["process"], weights=D["lost_wqebbs"], minlength=nproc).astype(np.int64),
            np.bincount(D["process"], weights=~D["complete"], minlength=nproc).astype(np.int64))


def build_losses(out, procs, per_process=None):
    """The losses table; ``per_process``: ``doorbell_losses`` when the doorbells table is not here."""
    rows = []
    for path, off, nb, why in out.losses:
        rows.append(("file", -1, path, int(nb), 0, f"offset {off}: {why}"))
    P = out.tables["processes"]
    for i, p in enumerate(procs):
        if P["dropped_events"][i]:
            rows.append(("dropped_events", i, p.path, 0, int(P["dropped_events"][i]), "events the tracer dropped"))
        if p.end is None:
            rows.append(("incomplete_process", i, p.path, 0, 0, "no END chunk (killed, or file cut)"))
        if p.header is None:
            rows.append(("missing_header", i, p.path, 0, 0, "no PROCESS header chunk"))
        if p.side_bad:
            rows.append(("bad_side_records", i, p.path, 0, int(p.side_bad), "side records that could not be parsed"))
    lost_total, incomplete = per_process if per_process is not None else \
        doorbell_losses(out.tables["doorbells"], len(procs))
    for i in np.flatnonzero(lost_total):
        rows.append(("wqe_lost", int(i), procs[i].path, 0, int(lost_total[i]), "WQEBBs the poller could not recover"))
    for i in np.flatnonzero(incomplete):
        rows.append(("doorbell_unrecovered", int(i), procs[i].path, 0, int(incomplete[i]),
                     "doorbells whose producer-index range is not fully covered by recovered WQEs"))
    out.tables["losses"] = dict(kind=np.array([r[0] for r in rows], dtype=object), process=np.array([r[1] for r in rows], np.int64),
                                path=np.array([r[2] for r in rows], dtype=object), bytes=np.array([r[3] for r in rows], np.int64),
                                count=np.array([r[4] for r in rows], np.int64), detail=np.array([r[5] for r in rows], dtype=object))


def build_aggregates(out, procs, qp_of, remote, q_proc, q_gpu, proc_node, ranks):
    """AGGREGATE-mode counters; QP-keyed ones (obj = qpn) get their peer from the topology."""
    parts = [(i, p.aggregates, p.aggregate_thread) for i, p in enumerate(procs) if len(p.aggregates)]
    if not parts:
        z = np.zeros(0, np.int64)
        out.tables["aggregates"] = dict(process=z, thread=z, type=z, type_name=np.zeros(0, object), aux=z, obj=z, peer=z,
                                        count=z, bytes=z, qp_id=z, dst_process=z, dst_node=z, dst_rank=z, dst_gpu=z,
                                        node=z, rank=z, gpu=z, is_op=np.zeros(0, bool))
        return
    proc = np.concatenate([np.full(len(a), i, np.int64) for i, a, _ in parts])
    a = np.concatenate([a for _, a, _ in parts])
    thr = np.concatenate([t for _, _, t in parts]).astype(np.int64)
    names = np.array([E.name_of(t) for t in range(E.TYPE_RANGE)], dtype=object)
    tp = a["type"].astype(np.int64)
    qp_keyed = np.isin(tp, [E.value(n) for n in ("IBV_POST_SEND", "IBV_SEND_WR", "IBV_WR_COMPLETE", "DB_DOORBELL",
                                                  "DB_WQE", "IBV_POST_RECV")])
    qid = np.where(qp_keyed, qp_of(proc, a["obj"]), -1)
    rq = np.where(qid >= 0, remote[np.maximum(qid, 0)], -1) if len(remote) else np.full(len(qid), -1)
    ok = rq >= 0
    dproc = np.where(ok, q_proc[np.maximum(rq, 0)], -1) if len(q_proc) else np.full(len(qid), -1)
    # UCX / libfabric counters: obj = endpoint, peer = destination fi_addr (unconnected libfabric endpoints)
    peers = getattr(out, "_peers", None)
    ucx_t = np.isin(tp, [E.value(n) for n in hostlib.UCX_OPS])
    ofi_t = np.isin(tp, [E.value(n) for n in hostlib.OFI_OPS])
    if peers is not None and ucx_t.any():
        dproc = np.where(ucx_t, peers.ucx(proc, a["obj"].astype(np.int64)), dproc)
    if peers is not None and ofi_t.any():
        dproc = np.where(ofi_t, peers.ofi(proc, a["obj"].astype(np.int64), a["peer"].view(np.int64)), dproc)
    ok = dproc >= 0
    # operation counters that enter the matrices: work requests, else post calls of QPs without work-request
    # counters (the same precedence as the ops table), and the UCX / libfabric operations
    swr_t = tp == E.value("IBV_SEND_WR")
    post_t = tp == E.value("IBV_POST_SEND")
    wr_keys = set(zip(proc[swr_t].tolist(), a["obj"][swr_t].tolist()))
    post_ok = np.array([(p, o) not in wr_keys for p, o in zip(proc.tolist(), a["obj"].tolist())], bool) \
        if post_t.any() else np.zeros(len(tp), bool)
    is_op = swr_t | (post_t & post_ok) | ucx_t | ofi_t
    out.tables["aggregates"] = dict(
        process=proc, thread=thr, type=tp, type_name=names[np.minimum(tp, len(names) - 1)], aux=a["aux"].astype(np.int64),
        obj=a["obj"].astype(np.int64), peer=a["peer"].view(np.int64), count=a["count"].view(np.int64),
        bytes=a["bytes"].view(np.int64), qp_id=qid, node=proc_node[proc], rank=ranks[proc],
        gpu=np.where(qid >= 0, q_gpu[np.maximum(qid, 0)], -1) if len(q_gpu) else np.full(len(qid), -1),
        dst_process=dproc, dst_node=np.where(ok, proc_node[np.maximum(dproc, 0)], -1),
        dst_rank=np.where(ok, ranks[np.maximum(dproc, 0)], -1),
        dst_gpu=np.where(ok & (rq >= 0), q_gpu[np.maximum(rq, 0)], -1) if len(q_gpu) else np.full(len(qid), -1),
        is_op=is_op)
