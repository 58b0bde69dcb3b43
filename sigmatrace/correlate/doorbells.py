"""Doorbells and the WQEs they announced (F8, F9, F24c/d): recovered WQE bytes decoded in bulk, producer
indices unwrapped per QP, each WQE tied to the doorbell that announced it, losses attributed.

Per QP, doorbells in time order carry 16-bit producer indices; the PI delta of each is the number of WQEBBs
it announced (the base before a QP's first doorbell is its first recovered WQE's index).  A recovered WQE
belongs to the last doorbell of its QP at or before its record time, or the next one when the WQE lies past
that doorbell's PI (the record is copied after the doorbell).  A doorbell is complete when the WQEBBs of
its WQEs cover its delta and none were reported lost.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import mlx5
from ..format import layout as L
from ..mlx5.verbs import OPCODE_VOCAB
from .identity import Gpus, Pollers
from .topology import Topology
from .util import group_starts, lookup, pq_key, unwrap16_near

_OPCODE_LABELS = np.array(OPCODE_VOCAB, dtype=object)


def opcode_names(codes):
    """mlx5 opcode names of a column of codes."""
    return _OPCODE_LABELS[np.asarray(codes, np.int64) & 0xFF]


def _datagram_wqes(hd, heads, hrec, w_qp, topo, blob):
    """WQEs of UD QPs (UCX ud_mlx5 wire-up, ud_verbs) carry a datagram address vector after the ctrl
    segment (ref §1.8), which the vectorised decoder (RC compositions) would read as data segments: decode
    those few with parse_wqe(datagram=True) and put their byte counts and validity in hd.  Returns each WQE's
    destination QP (the address vector's port + QPN, ``Topology.datagram_dest_av``), -1 elsewhere."""
    dst = np.full(len(heads), -1, np.int64)
    ud = topo.ud_mask()
    if not ud.any():
        return dst
    mine = ud[np.maximum(w_qp[hrec], 0)] & (w_qp[hrec] >= 0)
    raw = blob.tobytes()
    for j in np.flatnonzero(mine):
        nbb = max(int(hd["num_wqebbs"][j]), 1)
        k = int(heads[j])
        try:
            w = mlx5.parse_wqe(raw[k * 64:(k + nbb) * 64], datagram=True)
        except Exception:            # noqa: BLE001 -- a malformed WQE stays flagged invalid
            hd["valid"][j] = False
            continue
        hd["total_bytes"][j] = w.total_bytes
        hd["raddr"][j] = w.raddr or 0
        hd["rkey"][j] = w.rkey or 0
        hd["valid"][j] = True
        if w.av_dqp_dct is not None:
            dst[j] = topo.datagram_dest_av(w.av_rgid, w.av_rlid, w.av_dqp_dct)
    return dst


@dataclass
class Doorbells:
    """What the operations stage reads of the doorbell stage (the tables themselves are in ``out.tables``)."""
    n: int                   # doorbells
    process: np.ndarray      # per doorbell
    tsc: np.ndarray
    gpu: np.ndarray
    wqe_process: np.ndarray  # per recovered WQE
    wqe_qp: np.ndarray
    wqe_tsc: np.ndarray
    wqe_doorbell: np.ndarray  # the doorbell that announced it, -1 unknown or duplicate
    duplicate: np.ndarray
    qp_gpu: np.ndarray       # GPU of each QP (-1 unknown)
    missing_wqe_side: int = 0  # DB_WQE records whose WQE bytes are not in the capture
    bad_wqes: int = 0        # recovered WQEs that failed validation
    gpu_uses: list = None    # the (process, ordinal) GPUs the QP fallback took as used (``qp_gpus``), in order
    wqe_dst_qp: np.ndarray = None  # per recovered WQE: a datagram's destination QP (its address vector), else -1


def doorbell_warnings(missing_wqe_side, bad_wqes):
    """The doorbell stage's warnings (from its counts, so that parts of a capture add up)."""
    out = []
    if missing_wqe_side:
        out.append(f"{missing_wqe_side} DB_WQE event(s) point at WQE bytes that are not in the capture")
    if bad_wqes:
        out.append(f"{bad_wqes} recovered WQE(s) failed validation (index/QPN/segments); kept, flagged invalid")
    return out


def associate(out, st, procs, topo: Topology, pollers: Pollers, gpus: Gpus, node_of, db, wq, qp_ids=None,
              warn=True) -> Doorbells:
    """The doorbells and wqes tables; ``db``, ``wq``: the DB_DOORBELL and DB_WQE columns.  ``qp_ids``: the QPs
    whose GPU is looked for (default all; the cluster report: the QPs of one part's processes); ``warn``:
    append the warnings to ``out`` (else only counted in the result)."""
    tables = out.tables
    nd = len(db["tsc"])
    d_proc = db["process"].astype(np.int64)
    d_qp = topo.of(d_proc, db["qpn"])
    d_tsc = db["tsc"]
    d_pi = db["producer_index"].astype(np.int64)
    d_gpu_ord = pollers.gpu_of_threads(d_proc, db["thread"])
    # WQE records
    nwr = len(wq["tsc"])
    w_proc = wq["process"].astype(np.int64)
    w_qp = topo.of(w_proc, wq["qpn"])
    rec_bodies = []
    rec_ok = np.zeros(nwr, bool)
    rec_flags = np.zeros(nwr, np.int64)
    rec_first = wq["first_wqe_index"].astype(np.int64)
    rec_lsq = np.full(nwr, -1, np.int64)
    rec_len = np.zeros(nwr, np.int64)
    for k in range(nwr):
        rec = procs[int(w_proc[k])].side_wqe.get(int(wq["side_id"][k]))
        if rec is None:
            continue
        head, body = rec
        rec_ok[k] = True
        rec_flags[k] = head[4]
        rec_first[k] = head[1]
        rec_lsq[k] = head[3]
        rec_len[k] = len(body) // 64
        rec_bodies.append(body)
    missing_wqe_side = int(nwr - rec_ok.sum())
    # per-QP log_sq_size from WQE records where DevX create is missing
    for k in np.flatnonzero(rec_ok & (rec_lsq > 0)):
        r = topo.qp[topo.keys[int(w_qp[k])]]
        if r["log_sq_size"] < 0:
            r["log_sq_size"] = int(rec_lsq[k])
    # bulk decode
    okr = np.flatnonzero(rec_ok)
    slot_rec = np.repeat(okr, rec_len[okr])
    slot_off = np.arange(len(slot_rec)) - np.repeat(np.cumsum(rec_len[okr]) - rec_len[okr], rec_len[okr])
    if len(slot_rec):
        blob = np.frombuffer(b"".join(rec_bodies), np.uint8)
        dec = mlx5.decode_wqebbs(blob)
        starts = np.cumsum(rec_len[okr]) - rec_len[okr]
        if not dec["is_head"][starts].all():
            # a record ends inside a WQE: decode record by record so each starts at a head
            parts = []
            for s, n in zip(starts, rec_len[okr]):
                parts.append(mlx5.decode_wqebbs(blob[s * 64:(s + n) * 64]))
            dec = np.concatenate(parts)
    else:
        dec = np.zeros(0, mlx5.WQEBB_DTYPE)
    heads = np.flatnonzero(dec["is_head"]) if len(dec) else np.zeros(0, np.int64)
    hrec = slot_rec[heads]
    exp_index = (rec_first[hrec] + slot_off[heads]) & 0xFFFF
    hd = dec[heads]
    we_dst = _datagram_wqes(hd, heads, hrec, w_qp, topo, blob) if len(heads) else np.zeros(0, np.int64)
    index_ok = hd["wqe_index"].astype(np.int64) == exp_index
    qpn_ok = hd["qpn"].astype(np.int64) == (wq["qpn"][hrec].astype(np.int64) & 0xFFFFFF)
    wqe_valid = hd["valid"] & index_ok & qpn_ok
    bad = int((~wqe_valid).sum())
    if warn:
        out.warnings.extend(doorbell_warnings(missing_wqe_side, bad))
    w_n = len(heads)
    we_proc = w_proc[hrec]
    we_qp = w_qp[hrec]
    we_tsc = wq["tsc"][hrec]
    we_idx16 = exp_index
    we_nbb = hd["num_wqebbs"].astype(np.int64)
    # doorbell <-> WQE association, per QP, with unwrapped producer indices
    order_d = np.lexsort((np.arange(nd), d_tsc, d_qp)) if nd else np.zeros(0, np.int64)
    sq = d_qp[order_d]
    gs = group_starts(sq)
    pis = d_pi[order_d]
    # base (PI before the first doorbell of a QP): the first recovered WQE index on that QP, else 0
    first_w = {}
    if w_n:
        ow = np.lexsort((we_tsc, we_qp))
        fq = group_starts(we_qp[ow])
        for j in ow[fq]:
            first_w[int(we_qp[j])] = int(we_idx16[j])
    prev = np.empty(nd, np.int64)
    if nd:
        prev[1:] = pis[:-1]
        firsts = np.flatnonzero(gs)
        prev[firsts] = [first_w.get(int(q), 0) for q in sq[firsts]]
    delta = (pis - prev) & 0xFFFF
    # unwrapped counters: base + cumulative delta within each QP group
    grp = np.cumsum(gs) - 1
    csum = np.cumsum(delta)
    grp_first = np.flatnonzero(gs)
    base_cs = (csum - delta)[grp_first]
    unwrapped = prev[grp_first][grp] + csum - base_cs[grp] if nd else np.zeros(0, np.int64)
    d_U = np.empty(nd, np.int64)
    d_prevU = np.empty(nd, np.int64)
    d_delta = np.empty(nd, np.int64)
    d_U[order_d] = unwrapped
    d_prevU[order_d] = unwrapped - delta
    d_delta[order_d] = delta
    # reference doorbell for each WQE: the last doorbell on its QP at or before its record time
    we_db = np.full(w_n, -1, np.int64)
    we_U = np.full(w_n, -1, np.int64)
    if w_n and nd:
        # merge doorbells and wqe records ordered by (qp, tsc, doorbell first)
        allq = np.concatenate([sq, we_qp])
        allt = np.concatenate([d_tsc[order_d], we_tsc])
        kind = np.concatenate([np.zeros(nd, np.int8), np.ones(w_n, np.int8)])
        pos = np.concatenate([np.arange(nd), np.full(w_n, -1)])
        o = np.lexsort((kind, allt, allq))
        last = np.maximum.accumulate(np.where(kind[o] == 0, pos[o], -1))
        lastq = np.where(last >= 0, sq[np.maximum(last, 0)], -2)
        is_w = kind[o] == 1
        widx = o[is_w] - nd
        ref = last[is_w]
        same = lastq[is_w] == allq[o][is_w]
        # no earlier doorbell on the QP: use the first doorbell of that QP
        firstpos = lookup(sq[grp_first], grp_first, we_qp[widx])
        ref = np.where(same, ref, firstpos)
        have = ref >= 0
        refU = np.where(have, unwrapped[np.maximum(ref, 0)], 0)
        wu = unwrap16_near(refU, we_idx16[widx])
        # the record was copied after its doorbell: if the WQE lies past that doorbell's PI use the next
        key = sq.astype(np.int64) * (1 << 40) + unwrapped
        jj = np.searchsorted(key, we_qp[widx].astype(np.int64) * (1 << 40) + wu, side="right")
        jj_c = np.minimum(jj, max(nd - 1, 0))
        hit = have & (jj < nd) & (sq[jj_c] == we_qp[widx]) & (unwrapped[jj_c] - delta[jj_c] <= wu)
        we_db[widx[hit]] = order_d[jj_c[hit]]
        we_U[widx] = np.where(have, wu, -1)
    # duplicates (the same WQE recovered twice): keep the first record of each (qp, unwrapped index)
    dup = np.zeros(w_n, bool)
    if w_n:
        kk = np.where(we_U >= 0, we_qp * (1 << 40) + we_U, -1 - np.arange(w_n))
        o = np.lexsort((we_tsc, kk))
        dd = ~group_starts(kk[o])
        dup[o[dd]] = True
    we_db[dup] = -1
    cover = np.zeros(nd, np.int64)
    nwq = np.zeros(nd, np.int64)
    a = we_db >= 0
    np.add.at(cover, we_db[a], we_nbb[a])
    np.add.at(nwq, we_db[a], 1)
    # lost ranges
    lost = st.table("DB_WQE_LOST")
    l_qp = topo.of(lost["process"], lost["qpn"])
    d_lost = np.zeros(nd, np.int64)
    if len(l_qp) and nd:
        # attribute each loss to the last doorbell on that QP at or before it
        allq = np.concatenate([sq, l_qp])
        allt = np.concatenate([d_tsc[order_d], lost["tsc"]])
        kind = np.concatenate([np.zeros(nd, np.int8), np.ones(len(l_qp), np.int8)])
        pos = np.concatenate([np.arange(nd), np.full(len(l_qp), -1)])
        o = np.lexsort((kind, allt, allq))
        last = np.maximum.accumulate(np.where(kind[o] == 0, pos[o], -1))
        is_l = kind[o] == 1
        li = o[is_l] - nd
        ref = last[is_l]
        ok = (ref >= 0) & (sq[np.maximum(ref, 0)] == l_qp[li])
        np.add.at(d_lost, order_d[ref[ok]], lost["num_wqebb"][li[ok]].astype(np.int64))
    d_gpu = np.full(nd, -1, np.int64)
    if nd:
        dk = pq_key(d_proc, d_gpu_ord + 1)
        uk = np.unique(dk)
        gids = np.array([gpus.id(int(k >> 32), int(k & 0xFFFFFFFF) - 1) if (k & 0xFFFFFFFF) > 0 else -1
                         for k in uk.tolist()], np.int64)
        d_gpu = lookup(uk, gids, dk)
    complete = (cover == d_delta) & (d_lost == 0)
    tables["doorbells"] = dict(doorbell_id=np.arange(nd, dtype=np.int64), process=d_proc, thread=db["thread"].astype(np.int64),
                          node=node_of[d_proc] if nd else np.zeros(0, np.int64), qp_id=d_qp,
                          qpn=db["qpn"].astype(np.int64), producer_index=d_pi, raw=db["raw"],
                          tsc=d_tsc, gpu=d_gpu, delta_wqebbs=d_delta, pi_unwrapped=d_U, wqes=nwq,
                          covered_wqebbs=cover, lost_wqebbs=d_lost, complete=complete)
    # GPU of each QP: most common doorbell GPU, else uar_page -> hijacked page -> gpu
    q_gpu = np.full(topo.n, -1, np.int64)
    if nd:
        ok = (d_gpu >= 0) & (d_qp >= 0)
        if ok.any():
            uk, cc = np.unique(pq_key(d_qp[ok], d_gpu[ok]), return_counts=True)
            qq, gg = uk >> 32, uk & 0xFFFFFFFF
            o = np.lexsort((-cc, qq))
            f = group_starts(qq[o])
            q_gpu[qq[o][f]] = gg[o][f]
    uses = qp_gpus(q_gpu, topo, pollers, gpus, procs, qp_ids)
    # ---- the WQE table ------------------------------------------------------------------------------
    tables["wqes"] = dict(
        wqe_id=np.arange(w_n, dtype=np.int64), process=we_proc, node=node_of[we_proc] if w_n else np.zeros(0, np.int64),
        qp_id=we_qp, qpn=hd["qpn"].astype(np.int64) if w_n else np.zeros(0, np.int64),
        wqe_index=we_idx16, wqe_unwrapped=we_U, num_wqebbs=we_nbb,
        opcode=hd["opcode"].astype(np.int64) if w_n else np.zeros(0, np.int64),
        opcode_name=opcode_names(hd["opcode"]) if w_n else np.zeros(0, object),
        opmod=hd["opmod"].astype(np.int64) if w_n else np.zeros(0, np.int64),
        bytes=hd["total_bytes"].astype(np.int64) if w_n else np.zeros(0, np.int64),
        raddr=hd["raddr"] if w_n else np.zeros(0, np.uint64),
        rkey=hd["rkey"].astype(np.int64) if w_n else np.zeros(0, np.int64),
        laddr=hd["dseg_addr"] if w_n else np.zeros(0, np.uint64),
        signaled=((hd["fm_ce_se"] & 0x0C) >= 0x08) if w_n else np.zeros(0, bool),
        fm_ce_se=hd["fm_ce_se"].astype(np.int64) if w_n else np.zeros(0, np.int64),
        inline=hd["inline"] if w_n else np.zeros(0, bool),
        valid=wqe_valid, duplicate=dup, doorbell_id=we_db, record_tsc=we_tsc,
        verified=((rec_flags[hrec] & L.WQE_F_VERIFIED) != 0) if w_n else np.zeros(0, bool),
    )
    return Doorbells(n=nd, process=d_proc, tsc=d_tsc, gpu=d_gpu, wqe_process=we_proc, wqe_qp=we_qp, wqe_tsc=we_tsc,
                     wqe_doorbell=we_db, duplicate=dup, qp_gpu=q_gpu, missing_wqe_side=missing_wqe_side, bad_wqes=bad,
                     gpu_uses=uses, wqe_dst_qp=we_dst)


def qp_gpus(q_gpu, topo: Topology, pollers: Pollers, gpus: Gpus, procs, qp_ids=None):
    """The GPU of each QP without doorbells (``q_gpu`` -1 there), in place: its UAR page's hijacked page, else
    a DevX QP's process's only GPU.  Returns the (process, ordinal) GPUs taken, in order: ``Gpus.id`` marks
    a GPU used by the first process that takes it, so whoever merges parts replays them in QP order."""
    page_gpu = {(int(p), int(pg)): int(g) for p, pg, g in zip(pollers.records["process"], pollers.page, pollers.gpu)}
    uses = []
    for i in (range(topo.n) if qp_ids is None else qp_ids):
        r = topo.row_at(i)
        if q_gpu[i] < 0 and r["uar_page"] >= 0 and (r["process"], r["uar_page"]) in page_gpu:
            uses.append((r["process"], page_gpu[(r["process"], r["uar_page"])]))
            q_gpu[i] = gpus.id(*uses[-1])
        if q_gpu[i] < 0 and r["kind"] == "devx":
            gl = [g for g in ((procs[r["process"]].header or {}).get("gpus") or []) if isinstance(g, dict)]
            if len(gl) == 1 and gl[0].get("ordinal") is not None:
                uses.append((r["process"], int(gl[0]["ordinal"])))
                q_gpu[i] = gpus.id(*uses[-1])
    return uses

