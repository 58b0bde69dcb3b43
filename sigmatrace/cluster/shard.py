"""Worker side of the cluster report: the tasks that run next to one part of the capture.

A *part* is one process file, or one process of a file that holds several (per-process files concatenated:
``format.reader.process_spans``).  Its tasks, in report order (``driver`` runs them on Dask and the global
stages between them):

  ``plan_file``   a file's repeat check, its process ranges and their bounded byte ranges;
  ``decode``      decode one byte range of the part (``decode.decode_file``); the metadata and the small record
                  types go back (``merge_decoded`` joins a part's ranges), the records the correlator joins stay
                  in the part's scratch directory;
  ``local``       the per-process correlator stages with the global context (identities, time base, QP
                  topology): doorbells and WQEs, operations, post -> completion, the NCCL unit statistics, the
                  sends to each other part's QPs, written for ``match``;
  ``match``       send -> receive for the part's receive completions, from every part's sends to it; the
                  matches go back to the sending parts;
  ``pairs``       the causal pairs of the part's matched sends (and ``alternation`` those of QP pairs across
                  parts) and their clock statistics (``correlate.refine``); ``window_stats`` the second pass;
  ``write``       the part's rows of the per-record tables on the final time base (ops, completions, flows and
                  events parts in their final place, doorbells and WQEs for the driver to join), its barrier
                  hit counts per (address, participant), Perfetto counters and candidates;
  ``barrier_arrivals``  the part's participants' arrivals at the barrier addresses the counts found;
  ``window_cut_of``, ``window_rows``, ``perfetto_trace``  the window's cut, every part's rows it draws, the
                  trace written from them;
  ``summary_part`` the summary's sums (``analysis.summable``) over the part's ops files, merged in a tree.

Every task reads and writes only its part's scratch directory (``store``) plus, for the exchange, the files of
the parts it matches with; a task that runs again rewrites the same files.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..correlate import collectives, derived, doorbells, hostlib, ops
from ..correlate.clock import TimeBase
from ..correlate.refine import CausalPairs, alternation_pair, pair_stats, send_pairs
from ..correlate.result import Correlated
from ..decode import EventStore, FileDecode, decode_file, merge_ranges
from ..decode.columns import CHUNK_INDEX_DTYPE
from ..export.window import SCAN_COLUMNS, SCAN_ROWS, ScanPart, Window, earliest, in_window, scan_result, window_cut
from ..format.reader import process_spans, repeated_from
from ..mlx5.verbs import IBV_WC_RECV
from ..tables import parquet as PQ
from . import store

# record types that go to the driver with the metadata (one row per QP, identity, call ...); the others stay
SMALL_TYPES = ("DROPS", "DB_HIJACK_INSTALL", "IBV_CREATE_QP", "MLX5_DEVX_OBJ_CREATE", "IBV_MODIFY_QP", "IBV_CREATE_AH",
               "MLX5_DEVX_OBJ_MODIFY") + hostlib.ID_TYPES + collectives.TYPES
# the records whose QPs become implicit QPs of the topology (``correlate.topology``)
QP_NAMING = ("DB_DOORBELL", "DB_WQE", "IBV_SEND_WR", "IBV_POST_SEND", "IBV_WR_COMPLETE")
SEND_DTYPE = np.dtype([("dqp", "<i8"), ("tsc", "<u8"), ("op", "<i8")])
PEER_DTYPE = np.dtype([("op", "<i8"), ("comp", "<i8"), ("proc", "<i4"), ("tsc", "<u8")])


@dataclass
class Part:
    index: int
    path: str          # as the capture names it (tables, messages)
    abspath: str       # what a worker opens
    start: int
    stop: int | None
    scratch: str
    ranges: tuple = ()  # the byte ranges of [start, stop) decoded one task each (``plan_file``)

    @property
    def dir(self):
        return store.part_dir(self.scratch, self.index)


class ProcView:
    """``procs[i]`` for the global indices of one part's processes."""

    def __init__(self, procs, first):
        self.procs, self.first = procs, first

    def __getitem__(self, i):
        return self.procs[int(i) - self.first]


# ---- plan and decode ------------------------------------------------------------------------------------
def plan_file(path, abspath, max_bytes):
    """(warnings, parts) of one capture file: the repeat check of the local decode (``correlate.pool``), one
    part per process when the file holds several in contiguous ranges (else one), and each part's byte ranges
    of at most ``max_bytes`` on chunk boundaries (``format.reader.bounded_spans``), one ``decode`` task each.
    Parts are (start, stop, ranges).  The chunk headers are read a page at a time (``HeaderFile``), never the
    file: a worker plans a file of any size in bounded memory."""
    from ..format.reader import HeaderFile, bounded_spans, repeat_warning
    try:
        hf = HeaderFile(abspath)
    except OSError:
        return [], [(0, None, [(0, None)])]      # the decode reports it as the local decode does
    with hf:
        rep = repeated_from(path, hf)
        warnings, end = [], None
        if rep is not None:
            warnings.append(repeat_warning(path, rep))
            end = rep[0] if rep[3] else None
        spans = process_spans(path, data=hf, stop=end)
        if not spans or len(spans) <= 1:
            spans = [(0, end)]
        last = len(spans) - 1
        # the file's last part ends where the local decode stops (None: at the end of the file)
        return warnings, [(a, end if i == last else b, bounded_spans(hf, a, end if i == last else b, max_bytes))
                          for i, (a, b) in enumerate(spans)]


def decode(part: Part, j, batch_records):
    """Decode byte range ``j`` of one part; keep its processes in scratch; return (error, warnings, losses, per
    process: the metadata with the small record types, its TSC bounds and the QPs its records name) --
    ``merge_decoded`` joins the ranges of a part."""
    a, b = part.ranges[j]
    fd = decode_file(part.abspath, a, b, batch_records, name=part.path)
    store.save(part.dir / f"decode-{j:06d}.pkl", fd.processes)
    meta = []
    for p in fd.processes:
        tabs = p.tables or {}
        keys = {n: np.unique(tabs[n]["qpn"].astype(np.int64)) for n in QP_NAMING if n in tabs and len(tabs[n]["tsc"])}
        ch = p.chunks
        bounds = (int(ch["tsc_min"].min()), int(ch["tsc_max"].max())) if ch is not None and len(ch) else None
        meta.append((replace(p, tables={n: t for n, t in tabs.items() if n in SMALL_TYPES}, chunks=None, side_wqe={}),
                     bounds, keys))
    return fd.error, fd.warnings, fd.losses, meta


def merge_decoded(path, results):
    """The ``decode`` results of one part's ranges (file order) as one: a process split across ranges is
    joined as the local decode joins byte ranges (``decode.merge_ranges``), its TSC bounds and QP names too."""
    if len(results) == 1:
        return results[0]
    err = next((r[0] for r in results if r[0]), None)
    warnings = [w for r in results for w in r[1]]
    losses = [x for r in results for x in r[2]]
    extra = {}
    fds = []
    for r in results:
        procs = []
        for p, b, k in r[3]:
            e = extra.setdefault(p.uid, [None, {}])
            if b is not None:
                e[0] = b if e[0] is None else (min(e[0][0], b[0]), max(e[0][1], b[1]))
            for n, q in k.items():
                e[1][n] = np.unique(np.concatenate([e[1][n], q])) if n in e[1] else q
            procs.append(replace(p, chunks=np.zeros(0, CHUNK_INDEX_DTYPE)))   # merge_ranges joins chunk indexes
        fds.append(FileDecode(path, processes=procs))
    meta = [(replace(p, chunks=None), *extra[p.uid]) for p in merge_ranges(fds).processes]
    return err, warnings, losses, meta


def decoded(part: Part):
    """The part's processes, its ranges' decodes joined (``decode.merge_ranges``)."""
    fds = [FileDecode(part.path, processes=store.load(part.dir / f"decode-{j:06d}.pkl"))
           for j in range(len(part.ranges))]
    return merge_ranges(fds).processes


# ---- per-process correlation --------------------------------------------------------------------------
def _owned_qps(topo, first, n):
    lo, hi = np.searchsorted(topo.process, [first, first + n])
    return int(lo), int(hi)


def _own(ctx, qlo, qhi):
    """The context objects a task changes, as its own copies (a worker passes one deserialized context to all
    its tasks): the topology's rows of its QPs, the GPU registry, the library peers' counts."""
    import copy
    topo = copy.copy(ctx["topo"])
    topo.qp = dict(topo.qp)
    for i in range(qlo, qhi):
        topo.qp[topo.keys[i]] = dict(topo.qp[topo.keys[i]])
    peers = copy.copy(ctx["peers"])
    peers.total, peers.unmatched = {}, {}
    return topo, copy.deepcopy(ctx["gpus"]), peers


def local(part: Part, ctx, kept, first):
    """The per-process stages of the part's kept processes (``kept``: their indices in the part's file order,
    ``first``: the global index of the first).  Returns what the driver merges; the rest stays in scratch."""
    every = decoded(part)
    procs = [every[i] for i in kept]
    del every
    n = len(procs)
    qlo, qhi = _owned_qps(ctx["topo"], first, n)
    topo, gpus, peers = _own(ctx, qlo, qhi)
    out = Correlated()
    st = EventStore(procs, first=first)
    view = ProcView(procs, first)
    rec = {name: st.table(name) for name in ("DB_DOORBELL", "DB_WQE", "IBV_SEND_WR", "IBV_POST_SEND",
                                             "IBV_WR_COMPLETE", "IBV_WC")}
    dbs = doorbells.associate(out, st, view, topo, ctx["pollers"], gpus, ctx["node_of"], rec.pop("DB_DOORBELL"),
                              rec.pop("DB_WQE"), qp_ids=range(qlo, qhi), warn=False)
    op_base = ops.assemble(out, st, view, topo, dbs, rec, peers)
    wc = rec.pop("IBV_WC")
    c_qp = topo.of(wc["process"].astype(np.int32), wc["qpn"]).astype(np.int32)
    is_recv = wc["opcode"] >= IBV_WC_RECV
    c_op = np.full(len(wc["tsc"]), -1, np.int32)
    op_compl = ops.match_posts(op_base, topo, wc, c_qp, is_recv, c_op) if len(wc["tsc"]) and len(op_base["tsc"]) \
        else np.full(len(op_base["tsc"]), -1, np.int32)
    coll = ctx["coll"]
    receiving = collectives.receiving_qps(st.table("IBV_POST_RECV"), topo) if coll is not None else None
    unit_stats = coll.unit_stats(op_base, op_compl, wc["tsc"], receiving) if coll is not None else {}
    # the sends to each part's QPs, grouped by that part (local op order kept inside a group)
    snd, o_dqp = ops.send_keys(op_base, topo)
    sends = np.zeros(len(snd), SEND_DTYPE)
    sends["dqp"], sends["tsc"], sends["op"] = o_dqp[snd], op_base["tsc"][snd], snd
    tgt = ctx["part_of_process"][topo.process[o_dqp[snd]]] if len(snd) else np.zeros(0, np.int64)
    o = np.argsort(tgt, kind="stable")
    sends, tgt = sends[o], tgt[o]
    store.save_array(part.dir / "sends.npy", sends)
    uq, st_, cnt = np.unique(tgt, return_index=True, return_counts=True)
    send_index = {int(t): (int(a), int(a + c)) for t, a, c in zip(uq, st_, cnt)}
    # each op's QP and tsc, by QP (the alternation pairs read one QP's ops)
    q = np.asarray(op_base["qp_id"], np.int64)
    oq = np.argsort(q, kind="stable")
    store.save_arrays(part.dir / "opq.npz", qp=q[oq], tsc=np.asarray(op_base["tsc"])[oq])
    matched = _matched(op_base, topo)
    store.save(part.dir / "local.pkl", dict(
        op_base=op_base, op_compl=op_compl, wc=wc, c_qp=c_qp, is_recv=is_recv, c_op=c_op, dbs=dbs,
        receiving=receiving, doorbells=out.tables["doorbells"], wqes=out.tables["wqes"], recv=ops.recv_keys(wc, c_qp),
        matched=matched, events=[(first + i, part.abspath, p.chunks) for i, p in enumerate(procs)]))
    parts = out.stats["op_parts"]
    bounds = np.concatenate([[0], np.cumsum(parts)])
    lost, incomplete = derived.doorbell_losses(_rebased(out.tables["doorbells"], first), n)
    return dict(
        op_parts=parts, op_matched=[int(matched[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])],
        n_wc=len(wc["tsc"]), n_doorbells=dbs.n, n_wqes=len(dbs.wqe_qp), qp_range=(qlo, qhi),
        log_sq=[topo.row_at(i)["log_sq_size"] for i in range(qlo, qhi)], qp_gpu=dbs.qp_gpu[qlo:qhi],
        gpu_uses=dbs.gpu_uses, missing_wqe_side=dbs.missing_wqe_side, bad_wqes=dbs.bad_wqes,
        unmatched=ops.unmatched_counts(op_base, topo), peers_total=peers.total, peers_unmatched=peers.unmatched,
        ucp_link=out.stats.get("ucp_wqe_link", {}), ofi_link=out.stats.get("ofi_wqe_link", {}),
        unit_stats=unit_stats, send_index=send_index,
        qp_ops=np.bincount(q[q >= 0] - qlo, minlength=qhi - qlo) if qhi > qlo else np.zeros(0, np.int64),
        lost_wqebbs=lost, incomplete=incomplete)


def _rebased(D, first):
    """The doorbells' columns with process indices from 0 (the part's first process)."""
    return dict(D, process=np.asarray(D["process"], np.int64) - first) if len(D["process"]) else D


def _matched(op_base, topo):
    """Per op: its target is known (remote QP, or a UCX / libfabric peer process) -- a flow."""
    on_qp = np.asarray(op_base["qp_id"], np.int64) >= 0
    return np.where(on_qp, ops.dst_qp_of(op_base, topo) >= 0, np.asarray(op_base["dst_proc"]) >= 0)


def part_gids(idx, local_starts, global_starts):
    """Global op ids of a part's op rows ``idx``: each op part's rows follow its global offset."""
    idx = np.asarray(idx, np.int64)
    j = np.searchsorted(local_starts, idx, side="right") - 1
    return np.asarray(global_starts, np.int64)[j] + idx - np.asarray(local_starts, np.int64)[j]


# ---- send -> receive ------------------------------------------------------------------------------------
def match(part: Part, ctx, sources, comp_base):
    """Match the part's receive completions with every part's sends to its QPs (``sources``: (part, lo, hi,
    its op parts' local starts, their global starts)), in global op order as the local correlator does."""
    got, gids, src_part, src_local = [], [], [], []
    for k, lo, hi, ls, gs in sources:
        s = store.load_slice(Path(part.scratch) / f"part-{k:06d}" / "sends.npy", lo, hi)
        got.append(s)
        gids.append(part_gids(s["op"], ls, gs))
        src_part.append(np.full(len(s), k, np.int64))
    L = store.load(part.dir / "local.pkl")
    wc, c_qp, rcv = L["wc"], L["c_qp"], L["recv"]
    recv_op = np.full(len(wc["tsc"]), -1, np.int64)
    peer = np.zeros(0, PEER_DTYPE)
    index = {}
    if got and len(rcv):
        s = np.concatenate(got)
        g = np.concatenate(gids)
        sp = np.concatenate(src_part)
        o = np.argsort(g, kind="stable")
        s, g, sp = s[o], g[o], sp[o]
        i_s, i_r = ops.match_kth(s["dqp"], s["tsc"], c_qp[rcv].astype(np.int64), wc["tsc"][rcv])
        recv_op[rcv[i_r]] = g[i_s]
        peer = np.zeros(len(i_s), PEER_DTYPE)
        peer["op"], peer["comp"] = s["op"][i_s], comp_base + rcv[i_r]
        peer["proc"], peer["tsc"] = wc["process"][rcv[i_r]], wc["tsc"][rcv[i_r]]
        src = sp[i_s]
        o = np.argsort(src, kind="stable")
        peer, src = peer[o], src[o]
        uq, st_, cnt = np.unique(src, return_index=True, return_counts=True)
        index = {int(t): (int(a), int(a + c)) for t, a, c in zip(uq, st_, cnt)}
    store.save_array(part.dir / "recv_op.npy", recv_op)
    store.save_array(part.dir / "peer.npy", peer)
    return index


# ---- clock refinement -----------------------------------------------------------------------------------
def pairs(part: Part, ctx, targets):
    """The part's matched sends (``targets``: (part, lo, hi) of its rows in each target's matches): each op's
    peer completion, and the causal pairs with their first-pass statistics."""
    L = store.load(part.dir / "local.pkl")
    ob = L["op_base"]
    no = len(ob["tsc"])
    op_peer = np.full(no, -1, np.int64)
    p_proc = np.full(no, -1, np.int32)
    p_tsc = np.zeros(no, np.uint64)
    for k, lo, hi in targets:
        m = store.load_slice(Path(part.scratch) / f"part-{k:06d}" / "peer.npy", lo, hi)
        op_peer[m["op"]], p_proc[m["op"]], p_tsc[m["op"]] = m["comp"], m["proc"], m["tsc"]
    store.save_arrays(part.dir / "peer_local.npz", comp=op_peer, proc=p_proc, tsc=p_tsc)
    first = TimeBase(ctx["clocks"], ctx["node_of"])
    s_i = np.flatnonzero(op_peer >= 0)
    cp = CausalPairs()
    if len(s_i):
        o_proc, o_tsc = ob["process"][s_i], ob["tsc"][s_i]
        cb = np.asarray(L["op_compl"], np.int64)[s_i]
        c_ok = cb >= 0
        cbc = np.where(c_ok, cb, 0)
        wc = L["wc"]
        cp = CausalPairs.concat(send_pairs(
            ctx["node_of"], o_proc, first(o_proc, o_tsc, True), p_proc[s_i], first(p_proc[s_i], p_tsc[s_i], True),
            c_ok, first(wc["process"][cbc], wc["tsc"][cbc], True)))
    return _pair_file(part.dir / "pairs.npz", cp)


def _pair_file(path, cp):
    store.save_arrays(path, node_a=np.asarray(cp.node_a), t_a=np.asarray(cp.t_a), node_b=np.asarray(cp.node_b),
                      t_b=np.asarray(cp.t_b))
    return len(cp), pair_stats(cp)


def alternation(scratch, index, ctx, cands):
    """Causal pairs of strictly alternating QP pairs across parts (``cands``: (qa, part of qa, qb, part of
    qb) as ``refine.alternation_candidates`` found them) and their first-pass statistics."""
    topo, first = ctx["topo"], TimeBase(ctx["clocks"], ctx["node_of"])
    loaded, out = {}, []

    def times(q, k):
        if k not in loaded:
            loaded[k] = store.load_arrays(Path(scratch) / f"part-{k:06d}" / "opq.npz")
        d = loaded[k]
        a, b = np.searchsorted(d["qp"], [q, q + 1])
        p = int(topo.process[q])
        return first(np.full(b - a, p, np.int64), d["tsc"][a:b], True), p

    node_of, ranks = ctx["node_of"], ctx["ranks"]
    for qa, ka, qb, kb in cands:
        (ta, pa), (tb, pb) = times(qa, ka), times(qb, kb)
        got = alternation_pair(ta, tb, ranks[pa], ranks[pb], node_of[pa], node_of[pb])
        if got is not None:
            out.append(got)
    return _pair_file(store.part_dir(scratch, index) / "pairs.npz", CausalPairs.concat(out))


def window_stats(pair_dir, plan):
    """Second-pass statistics of the pairs one ``pairs`` / ``alternation`` task wrote."""
    d = store.load_arrays(Path(pair_dir) / "pairs.npz")
    return pair_stats(CausalPairs(d["node_a"], d["t_a"], d["node_b"], d["t_b"]), plan)


# ---- the tables -----------------------------------------------------------------------------------------
def _tables(part: Part, ctx, g):
    """The part's RowTables (ops, completions) over its base columns, with global ids (``g``: this part's
    bases), and the doorbells / wqes columns on the final time base."""
    L = store.load(part.dir / "local.pkl")
    P = store.load_arrays(part.dir / "peer_local.npz")
    recv_op = np.load(part.dir / "recv_op.npy")
    to_ns = TimeBase(ctx["clocks"], ctx["node_of"])
    topo = ctx["topo"]
    ob, wc, dbs = L["op_base"], L["wc"], L["dbs"]
    ob["completion"], ob["peer_completion"] = L["op_compl"], P["comp"]
    coll = ctx["coll"]
    if coll is not None:
        ob["collective_id"], ob["collective_unit"] = coll.label_ops(ob, L["receiving"])
    else:
        collectives.empty_attribution(ob)
    c_op = np.where(L["is_recv"], recv_op, L["c_op"])
    comp = dict(process=wc["process"].astype(np.int32), thread=wc["thread"], qp_id=L["c_qp"], qpn=wc["qpn"],
                wr_id=wc["wr_id"], status=wc["status"], wc_opcode=wc["opcode"], byte_len=wc["byte_len"],
                is_recv=L["is_recv"], tsc=wc["tsc"], op_id=c_op)
    gid = part_gids(np.arange(len(ob["tsc"])), g["op_local"], g["op_global"])
    ids = ops.RowIds(op=gid, completion=g["completion"], doorbell=g["doorbell"], wqe=g["wqe"], peer=(P["proc"], P["tsc"]))
    ops_t, comp_t = ops.op_tables(ob, comp, ctx["node_of"], ctx["ranks"], topo.qpn, topo.process, ctx["qp_gpu"],
                                  topo.remote, to_ns, ids)
    D, W = L["doorbells"], L["wqes"]
    D["ns"] = to_ns(dbs.process, dbs.tsc)
    W["record_ns"] = to_ns(dbs.wqe_process, dbs.wqe_tsc)
    D["doorbell_id"] = D["doorbell_id"] + g["doorbell"]
    W["wqe_id"] = W["wqe_id"] + g["wqe"]
    W["doorbell_id"] = np.where(W["doorbell_id"] >= 0, W["doorbell_id"] + g["doorbell"], -1)
    return L, ops_t, comp_t, gid, D, W, to_ns


def write(part: Part, ctx, g, files):
    """Write the part's rows of the per-record tables (``files``: the part files it writes, per table) and
    return its barrier hit counts, counters and Perfetto candidates; the doorbells / wqes parts go to scratch
    (``driver`` joins them into the single-file tables)."""
    L, ops_t, comp_t, gid, D, W, to_ns = _tables(part, ctx, g)
    for name, t in (("doorbells", D), ("wqes", W)):
        with store.writing(part.dir / f"{name}.parquet") as tmp:
            PQ._write(PQ.conform(name, PQ.to_table(dict(t))), tmp)
    for path, lo, hi in files.get("ops", ()):
        with store.writing(path) as tmp:
            PQ._write_ranges("ops", ops_t, tmp, lo=lo, hi=hi)
    for path, lo, hi in files.get("completions", ()):
        with store.writing(path) as tmp:
            PQ._write_ranges("completions", comp_t, tmp, lo=lo, hi=hi)
    if files.get("flows"):
        m = np.flatnonzero(L["matched"])
        tmp = Correlated()
        tmp.tables["ops"] = ops_t
        derived.build_flows(tmp, part_gids(np.arange(len(m)), g["flow_local"], g["flow_global"]))
        for path, lo, hi in files["flows"]:
            with store.writing(path) as part_tmp:
                PQ._write_ranges("flows", tmp.tables["flows"], part_tmp, lo=int(np.searchsorted(m, lo)),
                                 hi=int(np.searchsorted(m, hi)))
    keep = ctx["max_events"] if ctx["perfetto"] else None
    n_events, host, n_host = 0, [], 0
    for path in files.get("events", ()):
        with store.writing(path) as tmp:
            n_events, host, n_host = PQ._write_part((tmp, L["events"], to_ns, ctx["node_of"], ctx["batch_records"],
                                                     keep))
    _, bar = derived.barrier_candidates(ops_t)
    store.save_arrays(part.dir / "barriers.npz", **bar)
    res = dict(events=n_events, barrier_counts=derived.barrier_counts(bar))
    topk = None
    if ctx["perfetto"]:
        qlo, qhi = g["qp_range"]
        sp = ScanPart(ctx["grid"], ctx["n_gpu"], ctx["n_node"], ctx["n_qp"], max(0, keep), (qlo, qhi))
        n = ops_t.n_rows
        for a in range(0, n, SCAN_ROWS):
            b = min(a + SCAN_ROWS, n)
            sp.add(ops_t.rows(slice(a, b), SCAN_COLUMNS), gid[a:b])
        cand_ns, cand_row = sp.candidates()
        e = earliest(cand_ns, keep)
        host_cols = {c: np.concatenate([h[c] for h in host]) for c in host[0]} if host else None
        dw = earliest(D["ns"], keep)
        store.save(part.dir / "window.pkl", dict(cand_ns=cand_ns[e], cand_gid=cand_row[e], host=host_cols,
                                                 doorbells={k: np.asarray(v)[dw] for k, v in D.items()},
                                                 series=sp.qp.reshape(qhi - qlo, sp.nb)))
        rows = lambda v: (np.flatnonzero(v.reshape(-1, sp.nb).any(1)), v.reshape(-1, sp.nb))
        gi, gv = rows(sp.gpu)
        ni, nv = rows(sp.node)
        res.update(n_host=n_host, gpu=(gi, gv[gi]), node=(ni, nv[ni]), qtot=sp.qtot[qlo:qhi])
        topk = (np.sort(host_cols["ns"]) if host_cols else np.zeros(0, np.int64),
                np.sort(np.asarray(D["ns"])[dw]), np.sort(cand_ns[e]))
    return res, topk


def barrier_arrivals(part: Part, series):
    """The part's arrivals at the barriers of ``series`` (``derived.barrier_series`` of every part's counts):
    every hit of a participant is in its part, so its k-th hits and earliest arrivals are found here."""
    return derived.barrier_arrivals(store.load_arrays(part.dir / "barriers.npz"), series)


def barrier_candidates(part: Part):
    """The part's barrier candidates (when a participant's hits are in several parts)."""
    return store.load_arrays(part.dir / "barriers.npz")


def merge_earliest(keep, *parts):
    """The ``keep`` earliest of every kind over several parts' earliest (ties included), sorted."""
    out = []
    for kind in zip(*parts):
        v = np.concatenate(kind) if kind else np.zeros(0, np.int64)
        out.append(np.sort(v[earliest(v, keep)]))
    return tuple(out)


def window_cut_of(earliest_of_kinds, keep, n_events, n_host):
    """(cut, truncated, host_cut) of the Perfetto window from the merged earliest of every kind (the root of
    ``merge_earliest``'s tree): the ``keep``-th earliest time over them all (``export.window.window_cut``) and
    the host kind's own ``keep``-th (None when the capture has no more host events than that)."""
    host_k, db_k, op_k = earliest_of_kinds
    cut, truncated = window_cut(keep, n_events, [host_k, db_k, op_k])
    host_cut = int(host_k[keep - 1]) if keep > 0 and n_host > keep else None
    return cut, truncated, host_cut


def window_rows(part: Part, ctx, g, cut_of, top_qps):
    """The part's rows that the Perfetto trace draws: host events at or before the host cut (the host kind's
    own earliest; None: every kept one), doorbells and operations inside the window, the top QPs' counters.
    ``cut_of``: ``window_cut_of``'s.  Everything drawn is among the part's earliest of each kind that
    ``write`` kept."""
    cut, truncated, host_cut = cut_of
    w = store.load(part.dir / "window.pkl")
    K = ctx["max_events"]
    host = w["host"]
    if host is not None and host_cut is not None:
        keep = host["ns"] <= host_cut
        host = {k: v[keep] for k, v in host.items()}
    qlo, _ = g["qp_range"]
    series = {q: w["series"][q - qlo] for q in top_qps}
    D = w["doorbells"]
    dsel = in_window(D["ns"], cut, truncated, K)
    D = {k: v[dsel] for k, v in D.items()}
    drawn = np.sort(w["cand_gid"][in_window(w["cand_ns"], cut, truncated, K)])
    if not len(drawn):
        return host, D, None, drawn, series
    L, ops_t, _, gid, _, _, _ = _tables(part, ctx, g)
    local_rows = np.searchsorted(gid, drawn)        # a part's op ids increase with its rows
    cols = ops_t.rows(local_rows, ops_t.columns)
    dbi = np.asarray(L["op_base"]["doorbell_id"], np.int64)[local_rows]
    pi = np.asarray(L["doorbells"]["producer_index"], np.int64)
    cols["doorbell_pi"] = np.where(dbi >= 0, pi[np.maximum(dbi, 0)] if len(pi) else -1, -1)
    return host, D, cols, drawn, series


def perfetto_trace(path, meta, cut_of, *rows):
    """Write the Perfetto trace to ``path`` (``export.perfetto.write_perfetto``) from every part's
    ``window_rows`` (in part order) and ``meta``: the small tables it names tracks from (processes, nodes,
    threads, GPUs, QPs), the event counts, the counters summed per bin and the top QPs.  Returns the trace's
    statistics, the rows drawn and the seconds it took.  A task of its own, so that the trace is written while
    the driver reduces the summary (docs/cluster.md, "Stages")."""
    import time
    from types import SimpleNamespace

    from ..export.perfetto import write_perfetto
    from ..tables.host_events import HostCollector
    t = time.perf_counter()
    cut, truncated, _ = cut_of
    hc = HostCollector(None)      # in part order: joins a run of idle polls cut where a process was split
    for h, *_ in rows:
        if h is not None and len(h["ns"]):
            hc.add(h)
    ev_t = hc.result()[0]
    dbs = [d for _, d, *_ in rows]
    D = {c: np.concatenate([d[c] for d in dbs]) for c in dbs[0]}
    drawn_parts = [(c, d) for _, _, c, d, _ in rows if c is not None]
    if drawn_parts:
        cols = {c: np.concatenate([p[c] for p, _ in drawn_parts]) for c in drawn_parts[0][0]}
        drawn = np.concatenate([d for _, d in drawn_parts])
        o = np.argsort(drawn, kind="stable")
        cols, drawn = {c: v[o] for c, v in cols.items()}, drawn[o]
    else:
        drawn = np.zeros(0, np.int64)
        cols = {c: np.zeros(0, np.int64) for c in ops.OPS_COLUMNS + ("doorbell_pi",)}
    series = {}
    for *_, s in rows:
        series.update(s)
    top, nb = meta["top_qps"], meta["grid"][2]
    per_qp = np.array([series[q] for q in top]).reshape(len(top), nb) if top else np.zeros((0, nb))
    win = Window(ev_t=ev_t, n_host=meta["n_host"] - hc.joined, doorbells=D, n_doorbells=meta["n_doorbells"],
                 ops=cols, drawn=drawn, n_ops=meta["n_ops"],
                 scan=scan_result(meta["grid"], meta["gpu"], meta["node"], top, per_qp.reshape(-1)), cut=cut,
                 truncated=truncated)
    with store.writing(path) as tmp:
        stats = write_perfetto(SimpleNamespace(tables=meta["tables"], workers=1), tmp, max_events=meta["max_events"],
                               window=win, emit_map=emit_on_cluster)
    return dict(stats=stats, rows=len(ev_t["ns"]) + len(D["ns"]) + len(drawn), seconds=time.perf_counter() - t)


TRACE_PRIORITY = 10   # Dask priority of the trace's tasks (driver._perfetto, emit_on_cluster): before the figures'


def perfetto_chunk(part, k):
    """A task: chunk ``k`` of the trace from its ``chunk_state`` (``export.perfetto.emit_chunk``)."""
    from ..export.perfetto import emit_chunk
    state, job = part
    return emit_chunk(state, k, job)


def emit_on_cluster(state, jobs):
    """``write_perfetto``'s ``emit_map`` inside the trace task: the chunks of drawn events (the bulk of the
    trace's time) as tasks of their own over the cluster's workers, each given only what it reads
    (``chunk_state``, scattered across the workers), the trace task seceded meanwhile (``worker_client``), their
    bytes yielded in chunk order.  A chunk whose task is lost (its worker, or the one holding its data, died)
    is emitted here instead: the same bytes either way.  Outside a Dask worker, every chunk is emitted here."""
    from ..export.perfetto import chunk_state, emit_chunk
    try:
        from distributed import get_worker, worker_client
        me = get_worker()
    except (ImportError, ValueError):
        me = None
    if me is None:
        for k, job in enumerate(jobs):
            yield emit_chunk(state, k, job)
        return
    import uuid
    # a retried trace task (its worker died) submits under new keys: never the lost run's tasks again
    base = str(me.get_current_task() or "sigmatrace-trace").replace("sigmatrace-trace", "sigmatrace-chunk", 1)
    base = f"{base}-{uuid.uuid4().hex[:8]}"
    here = 0
    with worker_client() as client:
        try:
            parts = client.scatter([chunk_state(state, job) for job in jobs], hash=False)
            futs = [client.submit(perfetto_chunk, part, k, key=f"{base}-{k}", pure=False, retries=0,
                                  priority=TRACE_PRIORITY)
                    for k, part in enumerate(parts)]
        except Exception:          # noqa: BLE001 -- no scatter/submit: every chunk is emitted here
            futs = []
        for k, job in enumerate(jobs):
            got = None
            if k < len(futs):
                try:
                    got = futs[k].result()
                except Exception:  # noqa: BLE001 -- a lost chunk task (KilledWorker, cancelled): emitted here
                    got = None
            here += got is None
            yield got if got is not None else emit_chunk(state, k, job)
        client.cancel(futs)
    me.log_event("sigmatrace-perfetto-chunks", {"chunks": len(jobs), "emitted_here": here})


# ---- the summary's sums ---------------------------------------------------------------------------------
PER_RECORD = ("ops", "doorbells", "wqes", "aggregates")


def _part_views(report_dir, tables):
    """A query connection over the written report where each per-record table named in ``tables`` is the
    given files ({name: [paths]}; ``None``: the report's own table) and the others have no rows."""
    from ..query import connect
    con = connect(report_dir)
    for name in PER_RECORD:
        files = tables.get(name, ())
        if files is None:
            continue
        if files:
            src = ", ".join(f"'{Path(p).as_posix()}'" for p in files)
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM read_parquet([{src}])')
        else:   # materialized empty first (a view cannot select from itself)
            con.execute(f'CREATE TEMP TABLE "_empty_{name}" AS SELECT * FROM "{name}" LIMIT 0')
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM "_empty_{name}"')
    return con


def summary_part(report_dir, tables, names=None, params=None, values_out=None):
    """``analysis.summable``'s sums (``names``, default its SUMMARY) over some part files of the written
    per-record tables (``_part_views``: a group of parts' ops, doorbells and wqes files; or, for exactly one
    task, the aggregate-mode counters, which the matrices fold in, and nothing else).  ``params``: the
    queries' parameters (the bandwidth bins).  With the latency sums among ``names`` the op_latency samples
    are materialized once; ``values_out``: where their values go, sorted per group, for the quantile passes
    (``quantile_part``)."""
    from ..analysis import latency_values
    from ..analysis.summable import LATENCY, LATENCY_HIST, SUMMARY, latency_samples, partial
    names = SUMMARY if names is None else tuple(names)
    con = _part_views(report_dir, tables)
    try:
        if set(names) & set(LATENCY + (LATENCY_HIST,)) or values_out:
            latency_samples(con, materialize=True)
        got = partial(con, names, **(params or {}))
        if values_out:
            store.save(values_out, latency_values(con))
        return got
    finally:
        con.close()


def quantile_part(values_path, ranges):
    """One pass of the latency quantiles' selection over a part's sorted values (``analysis.quantile``)."""
    from ..analysis.quantile import count_buckets
    return count_buckets(store.load(values_path), ranges)
