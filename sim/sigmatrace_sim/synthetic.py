"""Small synthetic captures with known ground truth (tests and benchmarks).

``write_synthetic(dir, ...)`` writes N nodes x P processes (one GPU each) as
per-process files with ``TraceWriter`` and the mlx5 encoders:
 * GPU QPs created through DevX (CREATE_QP / INIT2RTR PRM buffers, with the
   peer's LID), a hijacked doorbell page per GPU, doorbells that each cover
   1-3 WQEs (coalescing), recovered WQE bytes, one QP whose producer index
   wraps past 0xFFFF;
 * barriers as fetch-and-add atomics to every peer's barrier counter;
 * a CPU verbs QP pair between node pairs with a send/recv ping-pong and
   completions (IBV_SEND_WR, IBV_WC) — the matched pairs F24b uses;
 * per-node clocks: TSC with its own rate error and origin, CLOCK_REALTIME
   with a PTP residual; calibration pairs optional.
Returns the ground truth as a dict.  This is a test fixture generator, not
the SimPy model (sim/), whose captures the tests use when they exist.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sigmatrace.format import TraceWriter
from sigmatrace.format import events as E
from sigmatrace.format import layout as L

EPOCH = 1_780_000_000_000_000_000
BAR_ADDR = 0x7F00_0000_0000


class _Clock:
    def __init__(self, rng, hz, drift_ppm, ptp_ns):
        self.hz = hz
        self.rate = hz * (1 + drift_ppm * 1e-6) / 1e9
        self.tsc0 = int(rng.integers(10**12, 10**14))
        self.ptp = ptp_ns

    def tsc(self, t):
        return (np.uint64(self.tsc0) + (np.asarray(t, np.float64) * self.rate).astype(np.uint64)).astype(np.uint64)


def write_synthetic(out_dir, nodes=2, procs_per_node=2, doorbells_per_qp=40, levels=4, pingpongs=50,
                    calibration=True, seed=1, drift_ppm=30.0, ptp_ns=100.0, single_file=False,
                    wrap_qp=True, chunk_records=2730):
    from sigmatrace import mlx5 as M
    rng = np.random.default_rng(seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nranks = nodes * procs_per_node
    clocks = [_Clock(rng, float(rng.choice([2.0e9, 2.4e9])), float(rng.uniform(-drift_ppm, drift_ppm)),
                     float(rng.normal(0, ptp_ns)) if calibration else 0.0) for _ in range(nodes)]
    node_of = [r // procs_per_node for r in range(nranks)]
    lid = [100 + r for r in range(nranks)]
    guid = [0x0002C90300000000 + r for r in range(nranks)]
    gid = [f"fe80:0000:0000:0000:0002:c903:0000:{r:04x}" for r in range(nranks)]
    ev = {r: {0: [], 1: []} for r in range(nranks)}   # rank -> thread -> list of (t, type, aux, obj, arg, ext)
    side = {r: [] for r in range(nranks)}
    sid_ctr = {r: 1 for r in range(nranks)}

    def add_side(r, kind, data):
        s = sid_ctr[r]
        sid_ctr[r] += 1
        side[r].append((s, kind, data))
        return s

    def add(r, th, t, name, aux=0, obj=0, arg=0, ext=None):
        ev[r][th].append((float(t), E.value(name), int(aux) & 0xFFFF, int(obj) & 0xFFFFFFFF, int(arg) & ((1 << 64) - 1), ext))

    truth_ops, truth_db, truth_bar = [], [], []
    # ---- setup: GPU QPs (DevX) for every ordered pair of ranks -----------------------------------
    gq = {}
    for a in range(nranks):
        add(a, 1, 1000, "DB_HIJACK_INSTALL", aux=a % procs_per_node, obj=10 + a,
            arg=add_side(a, L.SIDE_JSON, json.dumps({"gpu": a % procs_per_node, "page_id": 10 + a,
                                                      "reg_addr": 0x7000 + a}).encode()))
        for b in range(nranks):
            if a != b:
                gq[(a, b)] = 0x1000 + a * 64 + b
    for (a, b), qpn in gq.items():
        cin = M.build_create_qp_in(log_sq_size=6, uar_page=10 + a, st=0)
        cout = M.build_create_qp_out(qpn)
        add(a, 0, 2000 + qpn, "MLX5_DEVX_OBJ_CREATE", aux=0x500, obj=qpn,
            arg=add_side(a, L.SIDE_PRM_COMMAND, _prm(cin, cout)))
        minp = M.build_modify_qp_in("INIT2RTR", qpn, remote_qpn=gq[(b, a)], rlid=lid[b])
        add(a, 0, 5000 + qpn, "MLX5_DEVX_OBJ_MODIFY", aux=0x503, obj=qpn,
            arg=add_side(a, L.SIDE_PRM_COMMAND, _prm(minp, b"")))
    # ---- CPU verbs QPs: one pair per pair of nodes (first process of each) ----------------------
    vq = {}
    for na in range(nodes):
        for nb in range(nodes):
            if na != nb:
                a, b = na * procs_per_node, nb * procs_per_node
                vq[(a, b)] = 0x9000 + a * 64 + b
    for (a, b), qpn in vq.items():
        add(a, 0, 9000 + qpn, "IBV_CREATE_QP", aux=2, obj=qpn,
            arg=add_side(a, L.SIDE_JSON, json.dumps({"device": f"mlx5_{a}", "sq_sig_all": 0}).encode()))
        add(a, 0, 12000 + qpn, "IBV_MODIFY_QP", aux=2, obj=qpn,
            arg=add_side(a, L.SIDE_JSON, json.dumps({"dgid": gid[b]}).encode()),
            ext=(0, lid[b], vq[(b, a)], 0))
    # ---- GPU traffic: levels of writes then a barrier ------------------------------------------------
    pi = {q: (65500 if (wrap_qp and q == gq[(0, 1)]) else 0) for q in gq.values()}
    t_level = 1_000_000.0
    wid = 0
    for lev in range(levels):
        arrivals = {}
        for a in range(nranks):
            t = t_level + rng.uniform(0, 2000)
            # rank-dependent work: rank (lev % nranks) is slow this level
            nd = doorbells_per_qp // levels
            for b in range(nranks):
                if a == b:
                    continue
                q = gq[(a, b)]
                for d in range(nd):
                    nw = int(rng.integers(1, 4))
                    blob = b""
                    first = pi[q]
                    for w in range(nw):
                        nbytes = int(rng.choice([8, 64, 4096, 65536]))
                        raddr = 0x5000_0000 + int(rng.integers(0, 1 << 20)) * 64
                        blob += M.build_wqe(0x08, pi[q] & 0xFFFF, q, raddr=raddr, rkey=0x77,
                                            sgl=[(nbytes, 0x55, 0x1000_0000)])
                        truth_ops.append(dict(src=a, dst=b, qpn=q, bytes=nbytes, opcode=0x08, t=None, wqe=wid))
                        wid += 1
                        pi[q] += 1
                    t += rng.uniform(200, 900)
                    for o in truth_ops[-nw:]:
                        o["t"] = t
                    add(a, 1, t, "DB_DOORBELL", aux=pi[q] & 0xFFFF, obj=q, arg=M.doorbell_value(pi[q] & 0xFFFF, q))
                    truth_db.append(dict(rank=a, qpn=q, pi=pi[q] & 0xFFFF, t=t, nwqes=nw))
                    s = add_side(a, L.SIDE_WQE_BYTES, _wqe_rec(q, first, 6, blob))
                    add(a, 1, t + 150, "DB_WQE", aux=first & 0xFFFF, obj=q, arg=s)
            slow = 40_000.0 if a == lev % nranks else 0.0
            t_arr = t + 5000 + slow + rng.uniform(0, 3000)
            arrivals[a] = t_arr
            for b in range(nranks):
                if a == b:
                    continue
                q = gq[(a, b)]
                tt = t_arr + (b * 37.0)
                blob = M.build_wqe(0x12, pi[q] & 0xFFFF, q, raddr=BAR_ADDR, rkey=0x77, swap_add=1,
                                   sgl=[(8, 0x55, 0x2000_0000)])
                first = pi[q]
                pi[q] += 1
                truth_ops.append(dict(src=a, dst=b, qpn=q, bytes=8, opcode=0x12, t=tt, wqe=wid))
                wid += 1
                add(a, 1, tt, "DB_DOORBELL", aux=pi[q] & 0xFFFF, obj=q, arg=M.doorbell_value(pi[q] & 0xFFFF, q))
                truth_db.append(dict(rank=a, qpn=q, pi=pi[q] & 0xFFFF, t=tt, nwqes=1))
                s = add_side(a, L.SIDE_WQE_BYTES, _wqe_rec(q, first, 6, blob))
                add(a, 1, tt + 150, "DB_WQE", aux=first & 0xFFFF, obj=q, arg=s)
        order = sorted(arrivals, key=arrivals.get)
        truth_bar.append(dict(level=lev, arrivals=arrivals, straggler=order[-1], first=order[0],
                              spread=arrivals[order[-1]] - arrivals[order[0]]))
        t_level = max(arrivals.values()) + 200_000.0
    # ---- verbs ping-pong (send/recv with completions) ------------------------------------------------
    lat = 1800.0
    t = t_level + 10_000
    wr = 1
    for (a, b), qpn in sorted(vq.items()):
        if a > b:
            continue
        qb = vq[(b, a)]
        for k in range(pingpongs):
            nbytes = 256
            for (x, y, qx, qy) in ((a, b, qpn, qb), (b, a, qb, qpn)):
                add(x, 0, t, "IBV_SEND_WR", aux=2 | (2 << 8), obj=qx, arg=wr, ext=(0, 1, 0, nbytes))
                truth_ops.append(dict(src=x, dst=y, qpn=qx, bytes=nbytes, opcode=0x0A, t=t, wqe=-1))
                jitter = rng.exponential(300.0)
                tr = t + lat + jitter
                add(y, 0, tr, "IBV_WC", aux=0 | (128 << 8), obj=qy, arg=5000 + wr, ext=(0, 0, nbytes, 0))
                add(x, 0, tr + lat + rng.exponential(300.0), "IBV_WC", aux=0 | (0 << 8), obj=qx, arg=wr, ext=(0, 0, 0, 0))
                wr += 1
                t = tr + 500
            t += 20_000
    t_end = t + 100_000
    # ---- write ---------------------------------------------------------------------------------------
    files = []
    fh = open(out_dir / "capture.bin", "wb") if single_file else None
    for r in range(nranks):
        n = node_of[r]
        c = clocks[n]
        uid = 0xABC000 + r
        path = out_dir / f"node{n}.{1000 + r}.{r}.{uid:x}.trace"
        # chunk_records: EVENTS records per chunk (the tracer's buffer flushes); small: many chunks per thread
        w = TraceWriter(fh if single_file else str(path), uid, chunk_records=chunk_records)
        w.process({"format_version": 1, "tracer": "synthetic", "host": f"node{n}", "node_id": f"node{n}", "pid": 1000 + r,
                   "rank": r, "world_size": nranks, "mode": "full", "tsc_hz": c.hz,
                   "nics": [{"name": f"mlx5_{r}", "node_guid": f"{guid[r]:016x}",
                             "ports": [{"port": 1, "lid": lid[r], "gids": [gid[r]], "link_layer": "InfiniBand"}]}],
                   "gpus": [{"ordinal": r % procs_per_node, "uuid": f"GPU-{n}-{r % procs_per_node}", "pci_bus_id": f"0000:{r:02x}:00.0"}]})
        w.thread(0, tid=1000 + r, name="main", role="app")
        w.thread(1, tid=2000 + r, name="db-poller", role="poller")
        if calibration:
            pts = [0.0, t_end / 2, t_end]
            cal = np.zeros(len(pts), L.CALIBRATION_DTYPE)
            for k, tt in enumerate(pts):
                cal[k]["tsc_before"] = c.tsc(tt)
                cal[k]["tsc_after"] = c.tsc(tt + 20)
                rt = int(EPOCH + tt + 10 + c.ptp)
                cal[k]["realtime_ns"] = rt
                cal[k]["tai_ns"] = rt + 37_000_000_000
                cal[k]["point"] = (0, 1, 2)[k]
                cal[k]["flags"] = L.CALIB_F_TAI_VALID | L.CALIB_F_PTP | L.CALIB_F_INVARIANT_TSC
            w.calibration(cal)
        for s, kind, data in side[r]:
            w.side(kind, data, side_id=s)
        w.flush_side()
        for th in (0, 1):
            rows = sorted(ev[r][th], key=lambda x: x[0])
            n_ext = sum(1 for x in rows if x[5] is not None)
            rec = np.zeros(len(rows) + n_ext, L.EVENT_DTYPE)
            ts = c.tsc(np.array([x[0] for x in rows])) if rows else np.zeros(0, np.uint64)
            k = 0
            for (tt, ty, aux, obj, arg, ext), tv in zip(rows, ts):
                rec[k] = (tv, ty, aux, obj, arg)
                k += 1
                if ext is not None:
                    x0, x1, x2, x3 = ext
                    rec[k] = (x0, E.EXT, x1, x2, x3)
                    k += 1
            w.events(th, rec)
        w.end({"reason": "exit", "dropped_events": 0})
        w.close()
        files.append(str(path))
    if fh:
        fh.close()
    truth = dict(ops=truth_ops, doorbells=truth_db, barriers=truth_bar, node_of=node_of, epoch=EPOCH,
                 clocks=[dict(hz=c.hz, rate=c.rate, tsc0=c.tsc0, ptp=c.ptp) for c in clocks], gpu_qpn=gq, verbs_qpn=vq)
    return (out_dir / "capture.bin") if single_file else out_dir, truth


def _prm(in_buf, out_buf):
    import struct
    return struct.pack("<II", len(in_buf), len(out_buf)) + bytes(in_buf) + bytes(out_buf)


def _wqe_rec(qpn, first, log_sq, blob):
    import struct
    return struct.pack("<IHHII", qpn, first & 0xFFFF, len(blob) // 64, log_sq, L.WQE_F_VERIFIED) + blob
