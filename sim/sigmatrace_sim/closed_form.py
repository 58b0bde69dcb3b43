"""Closed-form runs: a GPU block's chain of post + quiet iterations in one SimPy step.

A persistent kernel that posts one operation, waits for its completion and posts
the next (nvshmem_p/g/atomic_fetch_add + quiet, the Fig. 4 microbenchmarks) is a
strict chain: iteration k+1 starts one GPU poll after iteration k's CQE.  When
nothing else in the simulation can interleave with the chain (no other SimPy event
is scheduled before it ends, nobody waits on the words or CQs it touches, the QP,
its poller and the recovery helper are idle), the per-event model would run the
same arithmetic event after event.  `post_quiet_run` computes it for all
iterations at once with numpy and then spends ONE SimPy timeout to the end.

Where vector computation replaces per-event simulation, and why it is exact:

* Times.  Every time of iteration k is the previous time plus a constant (issue
  cost, PCIe write, poller wake-up, record/enqueue cost, copy + parse when the
  recovery batch fires, forward, NIC decode/fetch, wire serialisation and hops,
  PCIe/atomic latencies, CQE DMA, GPU poll).  The increments are laid out in one
  flat array in exactly the order the per-event code adds them, and np.cumsum
  (numpy's add.accumulate is a sequential left-to-right sum) produces the very
  same float64 values, bit for bit.  Steps an iteration does not take (no copy)
  add 0.0, which leaves a float unchanged.
* Busy-until timelines (poller busy, NIC pipeline free_at, fabric tx/rx sides,
  per-QP CQE order).  The per-event code takes max(fresh time, previous busy-until).
  The run computes the fresh branch and then checks, vectorially, that every max
  would indeed have picked it (fresh >= the previous iteration's busy-until, the
  poller strictly parked).  If any check fails nothing is committed and the caller
  falls back to the per-event loop, so the result is always the per-event result.
* WQE recovery.  Batches fire at the recorded observation where the pending
  WQEBBs reach the threshold (periodic, since every doorbell covers the same
  number of WQEBBs).  The copy reads the ring at copy time: blocking mode copies
  while the GPU waits for this very doorbell (a batch no larger than the ring is
  intact); non-blocking mode runs the helper's FIFO (start = max(put, previous
  done)) and checks that the GPU had not posted into any batch slot again by the
  copy time (otherwise: fall back, and the per-event code records the loss).
* Ring, CQ and memory state.  At the end the SQ ring holds the last `depth` WQEs,
  the CQ ring the last CQEs with their owner bits, counters/DBR/poller/NIC/ports
  their final values, atomics their final word and fetched values: the state the
  per-event run leaves behind.
* Records.  DB_DOORBELL / DB_WQE / DB_FORWARD rows, WQE_BYTES side records (a
  template WQE with the 16-bit index patched per row) and the ground truth are
  numpy columns, merged in the order the per-event code appends them.
tests/test_sim_closed_form.py runs the micro workloads both ways and compares the
ground truth and the capture records.
"""
import numpy as np

from . import wqe as W
from .capture import DOORBELL_POST_DTYPE, REC_RECOVERED, T, WQE_POST_DTYPE
from .gpu import OP_SGES
from sigmatrace.format import layout as L
from .nic import decode_op

_DB, _FWD, _DBWQE = T["DB_DOORBELL"], T["DB_FORWARD"], T["DB_WQE"]
_OPMOD = {W.ATOMIC_MASKED_FA: 0x08, W.ATOMIC_MASKED_CS: 0x09}
ENABLED = True      # tests switch this off to compare with the per-event model


def _events(tsc, etype, aux, obj, arg):
    rec = np.zeros(len(tsc), L.EVENT_DTYPE)
    rec["tsc"], rec["type"], rec["aux"], rec["obj"], rec["arg"] = tsc, etype, aux, obj, arg
    return rec


def post_quiet_run(pe, peer, op, count, phase0, tag=0):
    """Plan `count` iterations of post(peer, [op]) + quiet() starting now.

    Returns None when the chain cannot be computed in closed form (the caller then
    runs the per-event loop), else (end time, latencies, commit) where commit()
    writes every record and state change; the caller commits and then waits until
    the end time."""
    if not ENABLED or count <= 0:
        return None
    c = pe.cluster
    env, t, cfg = c.env, c.timing, c.tracer
    qp = pe.qps[peer]
    sq, cq, nic = qp.sq, qp.cq, qp.nic
    kind, opcode, nw, nbytes = op[0], op[1], op[2], op[3]
    now = env.now
    # -- what the closed form covers -------------------------------------------------
    if nw != 1 or op[OP_SGES] != 1:
        return None
    if not ((kind == W.K_RDMA and opcode in (W.RDMA_WRITE, W.RDMA_READ)) or
            (kind == W.K_ATOMIC and opcode == W.ATOMIC_FA)):
        return None
    if not (sq.cons_idx == sq.resv_head == sq.prod_idx == sq.nic_pi) or qp.outstanding or qp.truth_rows:
        return None
    if cq.pending or cq.ci != cq.pi or c.effects:
        return None
    src, dst = nic.port, qp.peer.nic.port
    if src is dst:
        return None
    poller = qp.uar.poller
    hijacked = poller is not None
    helper = None
    if hijacked:
        if poller.stores or poller.scheduled or poller.pending:
            return None
        if cfg.recovery and not poller.blocking:
            helper = poller.helper[1]
            if helper.items or getattr(helper, "busy_until", 0.0) > now or not hasattr(helper, "busy_until"):
                return None
    remote_mem = qp.peer.pe.mem
    if opcode == W.ATOMIC_FA and (op[4] in remote_mem.waiters or op[4] in remote_mem.pending):
        return None

    # -- increments of one iteration, in the order the per-event code adds them ------------
    N = count
    issue = t.gpu_issue_ns + nw * t.wqe_store_ns + t.dbr_store_ns + t.db_store_ns
    hop = 2 * t.link_latency_ns + t.switch_latency_ns
    ser = lambda b: (b + t.header_bytes) / t.link_bw
    cols = ["issue", "land"]
    inc = [issue, t.mmio_write_ns]
    if hijacked:
        cost = t.poller_record_ns
        if poller.blocking:
            cost += t.recovery_enqueue_ns
        cols += ["obs", "cost", "copy", "parse", "fwd"]
        inc += [poller.wakeup, cost, 0.0, 0.0, t.poller_forward_ns]
    cols += ["t0", "fetch_lat", "fetch"]
    inc += [t.nic_db_ns, t.nic_fetch_ns, 1 * t.nic_fetch_ns_per_wqebb]
    if opcode == W.RDMA_WRITE:
        fwd_bytes, rev_bytes = nbytes, 0
        cols += ["out_hop", "out", "rev_hop", "done"]
        inc += [hop, ser(nbytes), hop, ser(0)]
    else:
        fwd_bytes, rev_bytes = (16, nbytes) if opcode == W.RDMA_READ else (28, nbytes)
        cols += ["out_hop", "out", "remote", "rev_hop", "rev", "done"]
        inc += [hop, ser(fwd_bytes), t.nic_pcie_read_ns if opcode == W.RDMA_READ else t.nic_atomic_ns,
                hop, ser(rev_bytes), t.nic_pcie_write_ns]
    cols += ["cqe", "next"]
    inc += [t.cqe_write_ns, t.gpu_poll_ns]
    K = len(cols)
    col = {name: j for j, name in enumerate(cols)}

    # -- recovery batches: which observations fire a copy ---------------------------------
    fire = np.zeros(0, np.int64)
    copy_ns = parse_ns = 0.0
    m = 0
    if hijacked and cfg.recovery:
        m = -(-poller.thr // nw)                     # recorded doorbells per batch (pending starts at 0)
        fire = np.arange(m - 1, N, m)
        copy_ns = poller._copy_ns([(0, m * nw)])
        parse_ns = m * t.parse_ns_per_wqe
        if m * nw > sq.depth:
            return None                               # a batch larger than the ring: the per-event code decides
    flat = np.tile(np.array(inc, np.float64), N)
    flat = flat.reshape(N, K)
    if poller is not None and poller.blocking and len(fire):
        flat[fire, col["copy"]] = copy_ns
        flat[fire, col["parse"]] = parse_ns
    flat = np.concatenate([[now], flat.ravel()])
    acc = np.cumsum(flat)[1:].reshape(N, K)        # acc[k, j] = time after step j of iteration k
    T0 = np.concatenate([[now], acc[:-1, col["next"]]])
    t_post, t_land = acc[:, col["issue"]], acc[:, col["land"]]
    t_fetch = acc[:, col["fetch"]]
    t_cqe = acc[:, col["cqe"]]
    t_next = acc[:, col["next"]]
    if hijacked:
        t_obs, t_fwd = acc[:, col["obs"]], acc[:, col["fwd"]]
        t_copy = acc[:, col["copy"]]
    else:
        t_obs = t_fwd = t_land
    t0n = acc[:, col["t0"]]
    out_start = t_fetch
    t_out = acc[:, col["out"]]
    if opcode == W.RDMA_WRITE:
        t_remote = t_out + t.nic_pcie_write_ns
        rev_start = t_out
        t_rev = acc[:, col["done"]]
    else:
        t_remote = acc[:, col["remote"]]
        rev_start = t_remote
        t_rev = acc[:, col["rev"]]

    # -- the busy-until maxima must all have taken the fresh branch -------------------------
    def prev(x, first):
        return np.concatenate([[first], x[:-1]])

    ser_out, ser_rev = ser(fwd_bytes), ser(rev_bytes)
    ok = True
    if hijacked:
        ok &= bool((t_land > prev(t_fwd, poller.busy_until)).all())
        ok &= bool((t_obs >= cfg.record_after_ns).all())
    free_end = t_fetch + t.nic_exec_ns
    ok &= bool((t0n >= prev(free_end, nic.free_at)).all())
    ok &= bool((t_fetch >= prev(free_end, nic.free_at)).all())
    ok &= bool((out_start >= prev(out_start + ser_out, src.tx_free)).all())
    ok &= bool((t_out >= prev(t_out, dst.rx_free) + ser_out).all())
    ok &= bool((rev_start >= prev(rev_start + ser_rev, dst.tx_free)).all())
    ok &= bool((t_rev >= prev(t_rev, src.rx_free) + ser_rev).all())
    t_done = t_rev if opcode == W.RDMA_WRITE else t_rev + t.nic_pcie_write_ns
    ok &= bool((t_done + t.cqe_write_ns >= prev(t_cqe, qp.last_cqe_t)).all())
    if not ok:
        return None
    t_end = float(t_next[-1])
    if any(item[0] < t_end for item in env._queue):
        return None                                   # something else happens meanwhile: per-event model

    base = sq.resv_head
    idx = base + np.arange(N, dtype=np.int64)        # first WQEBB of each WQE
    pi = idx + nw                                     # producer index rung after each post

    # non-blocking recovery: the helper's FIFO, and whether a copy could see a reused slot
    helper_rows = None
    if helper is not None and len(fire):
        t_put = t_obs[fire]
        done = helper.busy_until
        starts, copies = [], []
        for tp in t_put.tolist():
            s0 = tp if tp > done else done
            cp = s0 + copy_ns
            done = cp + parse_ns
            starts.append(s0)
            copies.append(cp)
        copies = np.array(copies)
        posted = np.searchsorted(t_post, copies, side="right")      # posts issued by the copy time
        head = base + posted * nw
        first_of_batch = base + (fire - (m - 1)) * nw
        if (head > first_of_batch + sq.depth).any():
            return None
        helper_rows = (copies, done)

    def commit():
        _commit(pe, qp, op, tag, phase0, N, base, idx, pi, t_post, t_land, t_obs, t_fwd, t_fetch, t_remote,
                t_cqe, t_next, t_copy if hijacked else None, fire, m, helper_rows, free_end,
                out_start + ser_out, t_out, rev_start + ser_rev, t_rev, fwd_bytes, rev_bytes)

    return t_end, (t_next - T0), commit


def _commit(pe, qp, op, tag, phase0, N, base, idx, pi, t_post, t_land, t_obs, t_fwd, t_fetch, t_remote, t_cqe,
            t_next, t_copy, fire, m, helper_rows, free_end, tx_out, rx_out, tx_rev, rx_rev, fwd_bytes, rev_bytes):
    c = pe.cluster
    t, cfg, truth = c.timing, c.tracer, c.truth
    sq, cq, nic = qp.sq, qp.cq, qp.nic
    kind, opcode, nw, nbytes, raddr, laddr = op[0], op[1], op[2], op[3], op[4], op[5]
    rkey = qp.peer.pe.rkey
    # -- WQE bytes: one template, the 16-bit wqe_index patched per row ----------------------
    tmpl = bytearray(nw * W.WQEBB)
    W.encode_into(tmpl, 0, op, 0, qp.qpn, rkey, pe.lkey, W.CQ_UPDATE)
    wqes = np.tile(np.frombuffer(bytes(tmpl), np.uint8), (N, 1))
    wqes[:, 1] = (idx >> 8) & 0xFF
    wqes[:, 2] = idx & 0xFF
    ring = np.frombuffer(sq.ring, np.uint8).reshape(sq.depth, W.WQEBB)
    last = slice(max(0, N - sq.depth), N)
    ring[idx[last] & sq.mask] = wqes[last]
    dec = decode_op(op, W.CQ_UPDATE)
    for i in idx[last].tolist():
        sq.decoded[i & sq.mask] = (i, dec)
    sq.resv_head = sq.prod_idx = sq.nic_pi = sq.cons_idx = int(pi[-1])
    sq.update_dbr(sq.prod_idx)
    # -- CQ: one CQE per WQE, written into the ring (owner bit) and consumed ------------------
    cpi = cq.pi + np.arange(N, dtype=np.int64)
    lastc = slice(max(0, N - cq.depth), N)
    cqes = np.zeros((N, 64), np.uint8)[lastc]
    cqes[:, 44:48] = np.array([nbytes], ">u4").view(np.uint8)
    cqes[:, 56:60] = np.array([(opcode << 24) | qp.qpn], ">u4").view(np.uint8)
    cqes[:, 60] = (idx[lastc] >> 8) & 0xFF
    cqes[:, 61] = idx[lastc] & 0xFF
    cqes[:, 63] = (cpi[lastc] >> cq.log_size) & 1
    np.frombuffer(cq.ring, np.uint8).reshape(cq.depth, 64)[cpi[lastc] & (cq.depth - 1)] = cqes
    cq.pi += N
    cq.ci += N
    qp.last_cqe_t = float(t_cqe[-1])
    # -- NIC, fabric ports, remote memory ------------------------------------------------------
    nic.doorbells += N
    nic.free_at = float(free_end[-1])
    src, dst = nic.port, qp.peer.nic.port
    src.tx_free, dst.rx_free = float(tx_out[-1]), float(rx_out[-1])
    dst.tx_free, src.rx_free = float(tx_rev[-1]), float(rx_rev[-1])
    hb = t.header_bytes
    src.tx_bytes += N * (fwd_bytes + hb)
    dst.rx_bytes += N * (fwd_bytes + hb)
    dst.tx_bytes += N * (rev_bytes + hb)
    src.rx_bytes += N * (rev_bytes + hb)
    c.bytes_moved += N * nbytes
    if opcode == W.ATOMIC_FA:
        mem = qp.peer.pe.mem
        old = mem.words.get(raddr, 0)
        add = op[6]
        qp.results.update(zip(idx.tolist(), range(old, old + N * add, add) if add else [old] * N))
        mem.words[raddr] = old + N * add
    pe.phase = phase0 + N - 1
    # -- ground truth ---------------------------------------------------------------------------
    wid0, db0 = truth.n_wqes, truth.n_doorbells
    w = np.zeros(N, WQE_POST_DTYPE)
    w["gid"], w["wqe_index"], w["num_wqebb"], w["opcode"], w["opmod"] = qp.gid, idx, nw, opcode, _OPMOD.get(opcode, 0)
    w["bytes"], w["raddr"], w["laddr"], w["t_post"] = nbytes, raddr, laddr, t_post
    w["doorbell_id"] = db0 + np.arange(N)
    w["tag"], w["phase"] = tag or op[10], phase0 + np.arange(N)
    truth.add_wqes(w)
    raw = (np.uint64(qp.raw_qpn) | ((pi >> 8) & 0xFF).astype(np.uint64) << np.uint64(8)
           | (pi & 0xFF).astype(np.uint64) << np.uint64(16))
    d = np.zeros(N, DOORBELL_POST_DTYPE)
    d["gid"], d["pi"], d["raw"], d["num_wqes"], d["t_write"], d["t_land"] = qp.gid, pi, raw, 1, t_post, t_land
    truth.add_doorbells(d)
    wids = wid0 + np.arange(N)
    truth.add_block("wqe_times", np.column_stack([wids, t_fetch, t_fetch, t_remote, t_cqe]))
    poller = qp.uar.poller
    if poller is None:
        return
    dbs = db0 + np.arange(N)
    truth.add_block("observed", np.column_stack([dbs, dbs, np.ones(N, np.int64)]))
    truth.add_block("observations", np.column_stack([dbs, t_obs, t_fwd]))
    truth.add_block("traced", np.array([[qp.gid, base, N * nw]]))
    poller.last_pi += N * nw
    poller.observed += N
    poller.busy_until = float(t_fwd[-1])
    rec = poller.rec
    tsc = lambda x: (rec._tsc0 + np.asarray(x) * rec._tpn).astype(np.int64)
    pi16 = pi & 0xFFFF
    keys = [np.arange(N) * 4]
    parts = [_events(tsc(t_obs), _DB, pi16, qp.qpn, raw)]
    if cfg.recovery:
        nb = len(fire)
        done_upto = int(fire[-1]) + 1 if nb else 0
        poller.pending = [(int(i), nw) for i in idx[done_upto:]]
        poller.pending_n = (N - done_upto) * nw
        if nb:
            rec_idx = idx[:done_upto]
            sid0 = rec.side_wqe_bulk(qp.qpn, rec_idx, sq.log_size, wqes[:done_upto])
            batch_of = np.arange(done_upto) // m
            if poller.blocking:
                t_parse = t_copy[fire][batch_of]
                thread = poller.thread
            else:
                copies, done = helper_rows
                t_parse = copies[batch_of]
                thread = poller.helper[0]
                poller.helper[1].busy_until = done
            rows = _events(tsc(t_parse), _DBWQE, rec_idx & 0xFFFF, qp.qpn, sid0 + np.arange(done_upto))
            if poller.blocking:
                keys.append(fire[batch_of] * 4 + 1)
                parts.append(rows)
            else:
                rec.add_bulk(thread, rows)
            truth.add_block("status", np.column_stack([np.full(nb, qp.gid), base + (fire - (m - 1)) * nw,
                                                       np.full(nb, m * nw), np.full(nb, REC_RECOVERED)]))
    if cfg.mode == "full":
        keys.append(np.arange(N) * 4 + 2)
        parts.append(_events(tsc(t_fwd), _FWD, pi16, qp.qpn, tsc(t_obs)))
    allrows = np.concatenate(parts)
    order = np.argsort(np.concatenate(keys), kind="stable")
    rec.add_bulk(poller.thread, allrows[order])
