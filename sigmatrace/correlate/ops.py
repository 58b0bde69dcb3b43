"""Operations (F16, F24a): every RDMA operation from its most precise record, matched to its peer and to
its completions.

Sources, most precise first, one per QP: recovered WQEs of doorbells (GPU- or CPU-rung, ``doorbell``), verbs
work requests (``verbs_wr``: IBV_SEND_WR in full mode), post calls (``verbs_post``: IBV_POST_SEND /
IBV_WR_COMPLETE in simple mode, no per-WR detail), and UCX / libfabric calls (no QP: the peer process from
endpoint identities, ``hostlib``).  Matching: post -> own completion by (QP, wr_id, k-th occurrence) among
the signaled work requests; receive-consuming op -> the k-th receive completion on the connected QP.
``op_tables`` then computes the ops and completions tables (columns: ``sigmatrace.schema``) per row range.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .. import schema
from ..decode import kernel as _kernel
from ..mlx5.verbs import (CONSUMES_RECV, DATA_OPS, IBV_SEND_SIGNALED, IBV_WC_RECV, IBV_WR_TO_MLX5, OPCODE_VOCAB,
                          READ_OPS)
from . import hostlib
from .doorbells import Doorbells
from .rows import Labels, RowTable, sel_ids
from .topology import Topology
from .util import group_starts, pq_key

SRC_VERBS, SRC_DOORBELL, SRC_POST, SRC_UCX, SRC_OFI = 0, 1, 2, 3, 4
SOURCE_NAMES = {SRC_VERBS: "verbs_wr", SRC_DOORBELL: "doorbell", SRC_POST: "verbs_post", SRC_UCX: "ucx",
                SRC_OFI: "ofi"}
# the parts of the ops table, in row order (each in process order): a global op id is its part's offset plus
# the rows of earlier processes in that part plus its row in its process (the cluster report numbers them so)
PART_NAMES = ("doorbell", "verbs_wr", "post", "wr_complete") + hostlib.OP_TYPES


def assemble(out, st, procs, topo: Topology, dbs: Doorbells, records, peers) -> dict:
    """The ops' narrow base columns (one row per operation), in parts: doorbell WQEs, work requests, post
    calls (IBV_POST_SEND, then IBV_WR_COMPLETE), then each UCX and libfabric operation type (``PART_NAMES``);
    each part in process order.  ``out.stats["op_parts"]``: the rows of each part.  ``records``: a dict
    holding the IBV_SEND_WR, IBV_POST_SEND and IBV_WR_COMPLETE columns; they are taken out of it (freed once
    the ops hold them).  ``peers``: ``hostlib.Peers`` of the whole capture (its per-library counts grow)."""
    tables = out.tables
    swr, ps, wrc = records.pop("IBV_SEND_WR"), records.pop("IBV_POST_SEND"), records.pop("IBV_WR_COMPLETE")
    ops_parts, part_rows = [], {}
    wsel = np.flatnonzero(~dbs.duplicate & np.isin(tables["wqes"]["opcode"], DATA_OPS)) if len(dbs.wqe_qp) else np.zeros(0, np.int64)
    db_qps = set(np.unique(dbs.wqe_qp[wsel]).tolist()) if len(wsel) else set()
    if len(wsel):
        dbi = dbs.wqe_doorbell[wsel]
        has_db = dbi >= 0
        ops_parts.append(dict(
            source=np.full(len(wsel), SRC_DOORBELL, np.int64), process=dbs.wqe_process[wsel],
            thread=np.where(has_db, tables["doorbells"]["thread"][np.maximum(dbi, 0)] if dbs.n else -1, -1),
            qp_id=dbs.wqe_qp[wsel], tsc=np.where(has_db, dbs.tsc[np.maximum(dbi, 0)] if dbs.n else dbs.wqe_tsc[wsel], dbs.wqe_tsc[wsel]),
            opcode=tables["wqes"]["opcode"][wsel], bytes=tables["wqes"]["bytes"][wsel], raddr=tables["wqes"]["raddr"][wsel],
            rkey=tables["wqes"]["rkey"][wsel], wr_id=np.full(len(wsel), -1, np.int64), num_wr=np.ones(len(wsel), np.int64),
            doorbell_id=dbi, wqe_id=wsel, signaled=tables["wqes"]["signaled"][wsel],
            gpu=np.where(has_db, dbs.gpu[np.maximum(dbi, 0)] if dbs.n else -1, dbs.qp_gpu[dbs.wqe_qp[wsel]])))
        if dbs.wqe_dst_qp is not None and len(dbs.wqe_dst_qp) and (dbs.wqe_dst_qp[wsel] >= 0).any():
            # datagrams: their address vector's destination
            _datagram_dest(ops_parts[-1], dbs.wqe_dst_qp[wsel].astype(np.int32), topo)
        part_rows["doorbell"] = len(wsel)
    s_qp = topo.of(swr["process"], swr["qpn"]).astype(np.int32)
    s_keep = ~np.isin(s_qp, list(db_qps)) if len(s_qp) and db_qps else np.ones(len(s_qp), bool)
    wr_qps = set(np.flatnonzero(np.bincount(s_qp[s_keep], minlength=topo.n + 1)).tolist()) if len(s_qp) else set()
    if s_keep.any():
        k = slice(None) if s_keep.all() else np.flatnonzero(s_keep)   # a view when every WR is kept
        nk = len(s_qp[k])
        code = np.array([IBV_WR_TO_MLX5.get(int(c), 0xFF) for c in range(256)], np.int16)[swr["opcode"][k]]
        sq = s_qp[k]
        ops_parts.append(dict(
            source=np.full(nk, SRC_VERBS, np.int8), process=swr["process"][k], thread=swr["thread"][k], qp_id=sq,
            tsc=swr["tsc"][k], opcode=code, bytes=swr["bytes"][k], raddr=swr["raddr"][k], rkey=swr["rkey"][k],
            wr_id=swr["wr_id"][k].view(np.int64), num_wr=np.ones(nk, np.int32),
            doorbell_id=np.full(nk, -1, np.int32), wqe_id=np.full(nk, -1, np.int32),
            signaled=((swr["send_flags"][k] & IBV_SEND_SIGNALED) != 0), gpu=dbs.qp_gpu[sq].astype(np.int32)))
        ud = topo.ud_mask()[sq] if topo.n and nk else np.zeros(nk, bool)
        if ud.any():
            # a datagram's destination is its own: the remote QPN (raddr) on the port of its address handle (rkey)
            u = np.flatnonzero(ud)
            dq = np.full(nk, -1, np.int32)
            dq[u] = topo.datagram_dest(swr["process"][k][u], swr["rkey"][k][u], swr["raddr"][k][u])
            _datagram_dest(ops_parts[-1], dq, topo)
        part_rows["verbs_wr"] = nk
        del sq, code
    del s_keep
    for tb, is_post in ((ps, True), (wrc, False)):
        p_qp = topo.of(tb["process"], tb["qpn"])
        keep = ~np.isin(p_qp, list(db_qps | wr_qps)) if len(p_qp) else np.zeros(0, bool)
        if keep.any():
            k = np.flatnonzero(keep)
            if is_post:
                code = np.array([IBV_WR_TO_MLX5.get(int(c), 0xFF) for c in range(256)], np.int64)[
                    tb["opcode"][k].astype(np.int64) & 0xFF]
                wr_id = tb["wr_id"][k].astype(np.int64)
            else:
                code = np.full(len(k), 0xFF, np.int64)
                wr_id = np.full(len(k), -1, np.int64)
            ops_parts.append(dict(
                source=np.full(len(k), SRC_POST, np.int64), process=tb["process"][k].astype(np.int64),
                thread=tb["thread"][k].astype(np.int64), qp_id=p_qp[k], tsc=tb["tsc"][k], opcode=code,
                bytes=tb["bytes"][k].astype(np.int64), raddr=np.zeros(len(k), np.uint64),
                rkey=np.zeros(len(k), np.int64), wr_id=wr_id, num_wr=tb["num_wr"][k].astype(np.int64),
                doorbell_id=np.full(len(k), -1, np.int64), wqe_id=np.full(len(k), -1, np.int64),
                signaled=np.ones(len(k), bool), gpu=dbs.qp_gpu[p_qp[k]]))
            part_rows["post" if is_post else "wr_complete"] = len(k)
    # UCX / libfabric operations (no QP; the peer process from endpoint identities)
    hl = {n: st.table(n) for n in tuple(hostlib.UCX_OPS) + tuple(hostlib.OFI_OPS)}
    for name, part in zip(hostlib.OP_TYPES, hostlib.op_parts(hl, peers, SRC_UCX, SRC_OFI)):
        if part is not None:
            ops_parts.append(part)
            part_rows[name] = len(part["tsc"])
    del hl
    out.stats["op_parts"] = [int(part_rows.get(n, 0)) for n in PART_NAMES]
    cols = ("source", "process", "thread", "qp_id", "tsc", "opcode", "bytes", "raddr", "rkey", "wr_id", "num_wr",
            "doorbell_id", "wqe_id", "signaled", "gpu", "dst_proc", "dst_qp", "ep")
    # narrow base columns (the output dtypes are restored per row range in RowTable)
    base_dt = dict(source=np.int8, process=np.int32, thread=np.int32, qp_id=np.int32, tsc=np.uint64, opcode=np.int16,
                   bytes=np.int64, raddr=np.uint64, rkey=np.uint32, wr_id=np.int64, num_wr=np.int32,
                   doorbell_id=np.int32, wqe_id=np.int32, signaled=bool, gpu=np.int32, dst_proc=np.int32,
                   dst_qp=np.int32, ep=np.int64)
    for p_ in ops_parts:
        if "dst_proc" not in p_:      # QP-based ops: the peer comes from the QP topology
            p_["dst_proc"] = np.broadcast_to(np.int32(-1), (len(p_["tsc"]),))
        if "dst_qp" not in p_:        # only datagrams (UD work requests) name their destination QP themselves
            p_["dst_qp"] = np.broadcast_to(np.int32(-1), (len(p_["tsc"]),))
        if "ep" not in p_:            # only UCX calls name an endpoint (the UCP -> WQE link, F25)
            p_["ep"] = np.broadcast_to(np.int64(-1), (len(p_["tsc"]),))
    if len(ops_parts) == 1:
        ops = {c: np.asarray(ops_parts[0][c]).astype(base_dt[c], copy=False) for c in cols}
    elif ops_parts:
        ops = {c: np.concatenate([np.asarray(p[c]).astype(base_dt[c], copy=False) for p in ops_parts])
               for c in cols}
    else:
        ops = {c: np.zeros(0, base_dt[c]) for c in cols}
    del ops_parts, swr, ps, wrc, s_qp
    # F25: each WQE op's UCP / libfabric op (hostlib.link_parents); the endpoint ids are not kept
    ops["parent"], link = hostlib.link_parents(ops, {SRC_UCX: False, SRC_OFI: True}, (SRC_DOORBELL, SRC_VERBS),
                                               topo.remote, topo.process)
    out.stats["ucp_wqe_link"], out.stats["ofi_wqe_link"] = link[SRC_UCX], link[SRC_OFI]
    ops["parent"] = ops["parent"].astype(np.int32)
    del ops["ep"]
    return ops


def _datagram_dest(part, dq, topo: Topology):
    """An ops part's datagram destinations: each row's destination QP (-1: none) and that QP's process."""
    part["dst_qp"] = dq
    part["dst_proc"] = np.where(dq >= 0, topo.process[np.maximum(dq, 0)], -1).astype(np.int32)


def dst_qp_of(op_base, topo: Topology):
    """Per op on a QP: its destination QP -- the QP's remote, or a datagram's own (``dst_qp``) -- else -1."""
    q = np.asarray(op_base["qp_id"]).astype(np.int64)
    rem = np.where(q >= 0, topo.remote[np.maximum(q, 0)] if topo.n else -1, -1)
    if "dst_qp" in op_base:                   # datagrams name their destination QP themselves
        dq = np.asarray(op_base["dst_qp"])
        rem = np.where(dq >= 0, dq, rem)
    return rem


def unmatched_counts(op_base, topo: Topology):
    """Operations on QPs and those without a peer, per source, with why: {source: (total, {reason: n})}.  The
    counts of parts of the operations add up (``merge_unmatched``)."""
    res = {}
    q = np.asarray(op_base["qp_id"]).astype(np.int64)
    src = np.asarray(op_base["source"]).astype(np.int64)
    on_qp = q >= 0
    if on_qp.any():
        lost = on_qp & (dst_qp_of(op_base, topo) < 0)
        for s_ in np.unique(src[on_qp]).tolist():
            total = int((on_qp & (src == s_)).sum())
            qs, counts = np.unique(q[lost & (src == s_)], return_counts=True)
            reasons = {}
            for qq, c in zip(qs.tolist(), counts.tolist()):
                r = topo.row_at(qq)
                if r.get("kind") == "verbs" and r.get("qp_type") == 4:     # IBV_QPT_UD: no connected peer
                    why = ("UD datagram whose destination (the port of its address handle or address vector + "
                           "the remote QPN) is no traced QP: the peer is not traced, or the address handle's "
                           "creation was not recorded (simple mode records no work requests)")
                else:
                    why = ("the remote QP is not in the capture (peer process not traced or its file missing)"
                           if r["remote_qpn"] is not None and r["remote_qpn"] >= 0 else
                           "its QP's connection (modify to RTR / DevX INIT2RTR) was not recorded")
                reasons[why] = reasons.get(why, 0) + int(c)
            res[SOURCE_NAMES[int(s_)]] = (total, reasons)
    return res


def merge_unmatched(parts):
    """``unmatched_counts`` of parts of the operations -> of all of them."""
    out = {}
    for p in parts:
        for name, (total, reasons) in p.items():
            t, r = out.get(name, (0, {}))
            for why, n in reasons.items():
                r[why] = r.get(why, 0) + n
            out[name] = (t + total, r)
    return out


_LIBRARY_ORDER = [SOURCE_NAMES[s] for s in sorted(SOURCE_NAMES)] + ["ucx", "libfabric"]


def explain_unmatched(out, counts, peers):
    """How many operations have no peer, per library, and why (``out.stats["unmatched"]`` and one warning
    per library, QP sources first in source order, then UCX and libfabric; reasons by count, then name):
    never a silent ``rank -1``.  ``counts``: ``unmatched_counts`` of every operation."""
    res = {}
    for name, (total, reasons) in counts.items():
        res[name] = dict(operations=int(total), unmatched=int(sum(reasons.values())), reasons=reasons)
    if peers is not None:
        for lib, total in peers.total.items():
            reasons = peers.unmatched.get(lib, {})
            res[lib] = dict(operations=int(total), unmatched=int(sum(reasons.values())), reasons=reasons)
    res = {k: dict(v, reasons=dict(sorted(v["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))))
           for k, v in sorted(res.items(), key=lambda kv: _LIBRARY_ORDER.index(kv[0]))}
    out.stats["unmatched"] = res
    for lib, d in res.items():
        if d["unmatched"]:
            why = "; ".join(f"{n:,} {r}" for r, n in d["reasons"].items())
            out.warnings.append(f"{d['unmatched']:,} of {d['operations']:,} {lib} operation"
                                f"{'s are' if d['operations'] != 1 else ' is'} not matched to a peer: {why}")
    return res


@dataclass
class Matches:
    """Matching results: per op its own completion and the peer's receive completion; per completion its op."""
    op_completion: np.ndarray
    op_peer: np.ndarray
    wc_process: np.ndarray
    wc_qp: np.ndarray
    wc_tsc: np.ndarray
    wc_op: np.ndarray
    is_recv: np.ndarray
    op_remote_qp: np.ndarray


def send_keys(ops, topo: Topology):
    """The receive-consuming operations with a connected remote QP: (rows, remote QP of each)."""
    o_qp = ops["qp_id"]
    no = len(o_qp)
    o_dqp = np.where(o_qp >= 0, topo.remote[np.maximum(o_qp, 0)], -1) if no and topo.n else np.full(no, -1, np.int64)
    snd = np.flatnonzero(np.isin(ops["opcode"], CONSUMES_RECV) & (o_dqp >= 0))
    return snd, o_dqp


def recv_keys(wc, c_qp):
    """The receive completions on known QPs: rows."""
    return np.flatnonzero((wc["opcode"] >= IBV_WC_RECV) & (c_qp >= 0))


def match(out, ops, topo: Topology, wc) -> Matches:
    """post -> completion and send -> receive over the completions ``wc`` (IBV_WC columns)."""
    no = len(ops["tsc"])
    o_tsc = ops["tsc"]
    snd, o_dqp = send_keys(ops, topo)
    nwc = len(wc["tsc"])
    c_proc = wc["process"].astype(np.int32)
    c_qp = topo.of(c_proc, wc["qpn"]).astype(np.int32)
    c_tsc = wc["tsc"]
    is_recv = wc["opcode"] >= IBV_WC_RECV
    # The two joins are independent (they fill disjoint completions of c_op): with several workers the
    # send <-> receive join runs in a thread next to post -> completion, and each join sorts its two sides in
    # two threads (numpy's sorts, searchsorted and ufuncs and the C merge release the GIL).
    pool = ThreadPoolExecutor(max_workers=3) if out.workers > 1 and nwc and no else None
    op_peer = np.full(no, -1, np.int32)
    c_op = np.full(nwc, -1, np.int32)          # op ids / completion ids fit int32 (< 2^31 rows)
    op_compl = None

    def send_receive():
        # send <-> receive matching on the connected QP: k-th recv-consuming op <-> k-th recv completion
        rcv = recv_keys(wc, c_qp)
        if len(snd) and len(rcv):
            i_s, i_r = match_kth(o_dqp[snd], o_tsc[snd], c_qp[rcv].astype(np.int64), c_tsc[rcv], pool)
            op_peer[snd[i_s]] = rcv[i_r]
            c_op[rcv[i_r]] = snd[i_s]

    if nwc and no:
        if pool is not None:
            with pool:
                f = pool.submit(send_receive)
                op_compl = match_posts(ops, topo, wc, c_qp, is_recv, c_op, pool)
                f.result()
        else:
            op_compl = match_posts(ops, topo, wc, c_qp, is_recv, c_op)
            send_receive()
    if op_compl is None:
        op_compl = np.full(no, -1, np.int32)
    return Matches(op_completion=op_compl, op_peer=op_peer, wc_process=c_proc, wc_qp=c_qp, wc_tsc=c_tsc, wc_op=c_op,
                   is_recv=is_recv, op_remote_qp=o_dqp)


def match_posts(ops, topo: Topology, wc, c_qp, is_recv, c_op, pool=None):
    """post -> completion: (qp, wr_id, k-th occurrence) among the signaled WRs of the QP (every operation and
    completion of a QP is its process's).  Returns each op's completion row (-1: none) and fills ``c_op`` (the
    op row of each send-side completion)."""
    no = len(ops["tsc"])
    o_qp, o_tsc = ops["qp_id"], ops["tsc"]
    op_compl = np.full(no, -1, np.int32)
    cand = (ops["wr_id"] >= 0) & (ops["source"] != SRC_DOORBELL)
    any_sig = np.zeros(topo.n + 1, bool)
    if cand.any():
        any_sig[o_qp[cand & ops["signaled"]]] = True
    sig_all = np.append(topo.sig_all_mask(), False)
    ou = np.flatnonzero(cand & (ops["signaled"] | ~any_sig[o_qp] | sig_all[o_qp]))
    del cand
    cs = np.flatnonzero(~is_recv)
    if len(ou) and len(cs):
        gk_o = pq_key(o_qp[ou].astype(np.int64) + 1, ops["wr_id"][ou] & 0xFFFFFFFF)
        gk_c = pq_key(c_qp[cs].astype(np.int64) + 1, wc["wr_id"][cs].astype(np.int64) & 0xFFFFFFFF)
        io, ic = match_kth(gk_o, o_tsc[ou], gk_c, wc["tsc"][cs], pool)
        op_compl[ou[io]] = cs[ic]
        c_op[cs[ic]] = ou[io]
    return op_compl


OPS_COLUMNS = schema.columns("ops")
COMPLETION_COLUMNS = schema.columns("completions")
_OUT_DT = dict(source=np.int64, process=np.int64, thread=np.int64, qp_id=np.int64, tsc=np.uint64, opcode=np.int64,
               bytes=np.int64, raddr=np.uint64, rkey=np.int64, wr_id=np.int64, num_wr=np.int64,
               doorbell_id=np.int64, wqe_id=np.int64, signaled=bool, gpu=np.int64, qpn=np.int64,
               status=np.int64, wc_opcode=np.int64, byte_len=np.int64, is_recv=bool, op_id=np.int64,
               collective_id=np.int64, collective_unit=np.int64)
SOURCE_VOCAB = [SOURCE_NAMES[s] for s in range(len(SOURCE_NAMES))]


@dataclass
class RowIds:
    """Global ids of one part's rows (the cluster report correlates a capture in parts, one per process file;
    the local correlator's rows are the global ones).  ``op``: the global op id of each row of the part's
    ops; ``peer``: (process, tsc) of each op's peer completion (on another part: its rows are not here);
    completions, doorbells and WQEs: the global id of the part's first row."""
    op: np.ndarray = None
    completion: int = 0
    doorbell: int = 0
    wqe: int = 0
    peer: tuple = None

    def ops(self, local, where=None):
        """Global op ids of the op rows ``local`` (-1 stays -1); ``where``: only these entries are rows (the
        others are returned as they are)."""
        out = np.asarray(local).astype(np.int64)
        if self.op is None:
            return out
        ok = out >= 0 if where is None else (out >= 0) & where
        out = out.copy()
        out[ok] = self.op[out[ok]]
        return out


def _shifted(v, base):
    v = np.asarray(v).astype(np.int64)
    return v if not base else np.where(v >= 0, v + base, v)


def op_tables(ops, wcb, proc_node, ranks, q_qpn, q_proc, q_gpu, remote, to_ns, ids: RowIds | None = None):
    """(ops, completions) as RowTables over narrow base columns; every output column per row range.

    ``ops["completion"]`` and the non-receive completions' ``op_id`` are rows of this part; ``peer_completion``
    and the receive completions' ``op_id`` are global ids; ``ids`` maps the rest (default: one part)."""
    ids = ids or RowIds()
    no = len(ops["tsc"])
    nwc = len(wcb["tsc"])
    o_compl, o_peer = ops["completion"], ops["peer_completion"]
    c_proc, c_tsc, c_op = wcb["process"], wcb["tsc"], wcb["op_id"]

    def peer_ns_at(sel):        # ns of each op's peer completion, -1 where none
        if ids.peer is None:
            return c_ns_at(o_peer[sel])
        pp, pt = ids.peer[0][sel], ids.peer[1][sel]
        ok = pp >= 0
        res = np.full(len(pp), -1, np.int64)
        if ok.any():
            res[ok] = to_ns(pp[ok], pt[ok])
        return res

    def c_ns_at(idx):           # ns of completions idx (>= 0), -1 elsewhere
        ok = idx >= 0
        res = np.full(len(idx), -1, np.int64)
        if ok.any() and nwc:
            j = idx[ok]
            res[ok] = to_ns(c_proc[j], c_tsc[j])
        return res

    # per-QP destination columns (QP count, not op count), each with a sentinel "no QP" entry at index nqp
    nqp = len(remote)
    ok_q = remote >= 0
    dqc_q = np.maximum(remote, 0)
    dp_q = np.where(ok_q, q_proc[dqc_q], -1) if nqp else np.zeros(0, np.int64)
    ext = lambda v, fill=-1: np.append(np.asarray(v), fill)
    per_q = dict(dst_qp_id=ext(remote), dst_process=ext(dp_q), matched=ext(ok_q, False),
                 dst_qpn=ext(np.where(ok_q, q_qpn[dqc_q], -1) if nqp else []),
                 dst_node=ext(np.where(ok_q, proc_node[np.maximum(dp_q, 0)], -1) if nqp else []),
                 dst_rank=ext(np.where(ok_q, ranks[np.maximum(dp_q, 0)], -1) if nqp else []),
                 dst_gpu=ext(np.where(ok_q, q_gpu[dqc_q], -1) if nqp else []))
    per_q = {k: v.astype(bool if k == "matched" else np.int64) for k, v in per_q.items()}
    q_qpn_x = ext(q_qpn).astype(np.int64)

    def ops_rows(sel, names, labels=False):
        want = set(names)
        r = {}
        for c in ("source", "process", "thread", "qp_id", "tsc", "opcode", "bytes", "raddr", "rkey", "wr_id",
                  "num_wr", "signaled", "gpu", "collective_id", "collective_unit"):
            if c in want:
                r[c] = ops[c][sel].astype(_OUT_DT[c], copy=False)
        if "doorbell_id" in want:
            r["doorbell_id"] = _shifted(ops["doorbell_id"][sel], ids.doorbell)
        if "wqe_id" in want:
            r["wqe_id"] = _shifted(ops["wqe_id"][sel], ids.wqe)
        p = ops["process"][sel].astype(np.int64)
        n = len(p)
        if "op_id" in want:
            r["op_id"] = ids.ops(sel_ids(sel, no))
        if "node" in want:
            r["node"] = proc_node[p]
        if "rank" in want:
            r["rank"] = ranks[p]
        q = ops["qp_id"][sel]
        noq = q < 0                                  # UCX / libfabric ops: no QP, peer process in dst_proc
        anyq = bool(noq.any()) if n else False
        if anyq:
            q = np.where(noq, nqp, q)                 # the sentinel entry (-1 / False) after the last QP
        if "qpn" in want:
            r["qpn"] = q_qpn_x[q] if n else np.zeros(0, np.int64)
        if want & {"dst_qp_id", "dst_qpn", "dst_process", "dst_node", "dst_rank", "dst_gpu", "matched"}:
            for c in ("dst_qp_id", "dst_qpn", "dst_process", "dst_node", "dst_rank", "dst_gpu", "matched"):
                if c in want:
                    r[c] = per_q[c][q] if n else np.zeros(0, bool if c == "matched" else np.int64)
            if anyq:
                dp = ops["dst_proc"][sel].astype(np.int64)
                ok = noq & (dp >= 0)
                dpc = np.maximum(dp, 0)
                for c, v in (("dst_process", dp), ("dst_node", proc_node[dpc]), ("dst_rank", ranks[dpc])):
                    if c in want:
                        r[c] = np.where(noq, np.where(ok, v, -1), r[c])
                if "matched" in want:
                    r["matched"] = np.where(noq, ok, r["matched"])
            dq = ops["dst_qp"][sel].astype(np.int64) if "dst_qp" in ops else None
            dg = (dq >= 0) & ~noq if dq is not None and n else None
            if dg is not None and dg.any():           # datagrams: the destination QP of each work request
                dqc = np.maximum(dq, 0)
                dpp = q_proc[dqc]
                for c, v in (("dst_qp_id", dq), ("dst_qpn", q_qpn[dqc]), ("dst_process", dpp),
                             ("dst_node", proc_node[dpp]), ("dst_rank", ranks[dpp]), ("dst_gpu", q_gpu[dqc]),
                             ("matched", True)):
                    if c in want:
                        r[c] = np.where(dg, v, r[c])
        code = ops["opcode"][sel]
        if "opcode_name" in want:
            lab = Labels(code.astype(np.int64) & 0xFF, OPCODE_VOCAB)
            r["opcode_name"] = lab if labels else lab.objects()
        if "source_name" in want:
            lab = Labels(ops["source"][sel], SOURCE_VOCAB)
            r["source_name"] = lab if labels else lab.objects()
        if "is_read" in want:
            r["is_read"] = np.isin(code, READ_OPS)
        if want & {"ns", "complete_ns", "latency_ns", "peer_ns"}:
            ns = to_ns(p, ops["tsc"][sel])
            oc = o_compl[sel]
            cns = c_ns_at(oc)
            r["ns"] = ns
            r["complete_ns"] = cns
            r["latency_ns"] = np.where(oc >= 0, cns - ns, -1)
            r["peer_ns"] = peer_ns_at(sel)
        if "peer_completion" in want:
            r["peer_completion"] = o_peer[sel].astype(np.int64)
        if "parent_op_id" in want:
            r["parent_op_id"] = ids.ops(ops["parent"][sel])
        if "completion" in want:
            r["completion"] = _shifted(o_compl[sel], ids.completion)
        return {k: r[k] for k in names}

    def comp_rows(sel, names, labels=False):
        want = set(names)
        r = {}
        p = c_proc[sel].astype(np.int64)
        n = len(p)
        if "completion_id" in want:
            r["completion_id"] = sel_ids(sel, nwc) + ids.completion
        r["process"] = p
        if "node" in want:
            r["node"] = proc_node[p] if n else np.zeros(0, np.int64)
        for c in ("thread", "qp_id", "qpn", "wr_id", "status", "wc_opcode", "byte_len", "is_recv", "tsc"):
            if c in want:
                r[c] = wcb[c][sel].astype(_OUT_DT.get(c, np.int64) if c != "tsc" else np.uint64, copy=False)
        if "op_id" in want:
            co = wcb["op_id"][sel].astype(np.int64)
            r["op_id"] = ids.ops(co, ~wcb["is_recv"][sel])
        if want & {"ns", "latency_ns"}:
            ns = to_ns(p, c_tsc[sel])
            r["ns"] = ns
            co = c_op[sel]
            m = (co >= 0) & ~wcb["is_recv"][sel]
            lat = np.full(n, -1, np.int64)
            if m.any():
                j = co[m]
                lat[m] = ns[m] - to_ns(ops["process"][j], ops["tsc"][j])
            r["latency_ns"] = lat
        return {k: r[k] for k in names}

    return (RowTable(no, OPS_COLUMNS, ops_rows, base=ops), RowTable(nwc, COMPLETION_COLUMNS, comp_rows, base=wcb))


def _sort_by_key_time(k, t):
    """np.lexsort((t, k)) — cheaper when rows are already in time order inside each key group (records come
    in file order, so usually they are): one stable sort by key, checked, lexsort only if needed."""
    o = np.argsort(k, kind="stable")
    sk = k[o]
    st = np.asarray(t)[o]
    if len(o) < 2 or not np.any((st[1:] < st[:-1]) & (sk[1:] == sk[:-1])):
        return o
    return np.lexsort((t, k))


def match_kth(ka, ta, kb, tb, pool=None):
    """Pair the k-th row (time order) of each key group on side a with the k-th of the same key on side b.

    Returns (index in a, index in b).  Two stable sorts and a searchsorted: no structured-row set ops.
    ``pool``: a thread pool that sorts side b while this thread sorts side a."""
    ka = np.asarray(ka, np.int64)
    kb = np.asarray(kb, np.int64)
    if not len(ka) or not len(kb):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    fb = pool.submit(_sort_by_key_time, kb, tb) if pool is not None else None
    oa = _sort_by_key_time(ka, ta)
    ska = ka[oa]
    kern = _kernel.get()
    if kern is not None:    # one linear merge of the two sorted sides (C): same pairs, same order
        ob = fb.result() if fb is not None else _sort_by_key_time(kb, tb)
        ia, ib = kern.match_sorted(ska, kb[ob])
        return oa[ia], ob[ib]
    n = len(ska)
    starts = np.flatnonzero(group_starts(ska))
    ra = np.arange(n, dtype=np.int64)
    ra -= np.repeat(starts, np.diff(np.append(starts, n)))      # rank of each row inside its key group
    del starts
    ob = fb.result() if fb is not None else _sort_by_key_time(kb, tb)
    skb = kb[ob]
    j = np.searchsorted(skb, ska, "left")
    j += ra
    del ra
    ok = j < np.searchsorted(skb, ska, "right")
    del ska, skb
    return oa[ok], ob[j[ok]]
