"""NCCL-style ring AllReduce through CPU proxy threads (paper §VI-C, Table I).

nodes x gpus_per_node ranks, `channels` rings (default = gpus_per_node).  Ring
order is rank order; channel c rotates the order inside each node so that the
GPU that sends to the next node is local (c - 1) mod G and the one that receives
is local c: every rank's proxy thread drives one inter-node connection per channel
it sends on and one it receives on.  Intra-node hops go over NVLink (not verbs,
not recorded).  A ring AllReduce of S bytes has 2(R-1) steps; every step moves
S/(R*channels) bytes over every inter-node hop of every channel, in slices of at
most `slice_bytes`.

Per step and inter-node hop, as NCCL's net/IB proxy does:
  receiver proxy: ibv_post_recv (1 WR), ibv_post_send of a 1-WR CTS (RDMA_WRITE
                  inline, 8 B), then polls its CQ until the data arrived
  sender proxy:   ibv_post_send with 2 WRs per slice (RDMA_WRITE data +
                  RDMA_WRITE_WITH_IMM 0 B), then polls its CQ until both complete
Modes decide what is recorded: aggregate = counters per (type, opcode, QP, peer),
no timestamps; simple = IBV_POST_SEND / IBV_POST_RECV with EXT; full = also every
IBV_SEND_WR / IBV_RECV_WR, every ibv_poll_cq call (IBV_POLL_CQ, most of them
empty) and every completion (IBV_WC).

Vectorised generation: the proxies of a ring step are regular, so instead of one
SimPy process per proxy the step times are computed in closed form (latency +
slice/bandwidth, shared NIC bandwidth across the channels of a node, small jitter
from the seed) and each process's event rows are built with numpy, process by
process, straight into the capture file.  Per-event SimPy detail would add
nothing here and would not reach Table I volumes.
"""
import io
import json
import os

import numpy as np

from sigmatrace.format import layout as L, events as E, TraceWriter

from ..cluster import Cluster, truth_paths, _json_default
from .common import timing_from

T = {n: E.value(n) for n in ("IBV_POST_SEND", "IBV_SEND_WR", "IBV_POST_RECV", "IBV_RECV_WR", "IBV_POLL_CQ",
                              "IBV_WC", "IBV_OPEN_DEVICE", "IBV_ALLOC_PD", "IBV_REG_MR", "IBV_CREATE_CQ",
                              "IBV_CREATE_QP", "IBV_MODIFY_QP", "EXT")}
OP_WRITE, OP_WRITE_IMM = 0, 1            # ibv_wr_opcode IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM
WC_RDMA_WRITE, WC_RECV_RDMA_WITH_IMM = 1, 129
SEND_SIGNALED, SEND_INLINE = 2, 8

PARAMS = {
    "size": (int, 1 << 20, "AllReduce bytes per rank (1 MB or 128 MB in Table I)"),
    "iters": (int, 2, "AllReduce iterations"),
    "channels": (int, 0, "rings (0 = gpus_per_node)"),
    "slice_bytes": (int, 512 << 10, "largest RDMA write per step"),
    "engine": (str, "auto", "simpy (CPU proxies as SimPy processes) | vector (closed form) | auto (simpy <= 8 nodes)"),
}


def _rows(n):
    return np.zeros(n, L.EVENT_DTYPE)


def _interleave(prim, ext):
    """Primary records each followed by its EXT record."""
    out = np.empty(len(prim) * 2, L.EVENT_DTYPE)
    out[0::2] = prim
    out[1::2] = ext
    return out


def connections(N, G, C, qpn_base=0x400):
    """Inter-node hops of the rings: channel c, node n sends to node (n+1)%N; sender local
    (c-1)%G, receiver local c%G.  Returns ([(channel, node, src, dst, src qpn, dst qpn)],
    {rank: [(role, connection)]})."""
    conns = []
    for ch in range(C):
        for n in range(N):
            src = n * G + (ch - 1) % G
            dst = ((n + 1) % N) * G + ch % G
            conns.append((ch, n, src, dst, qpn_base + 2 * ch, qpn_base + 2 * ch + 1))
    by_rank = {}
    for cn in conns:
        by_rank.setdefault(cn[2], []).append(("send", cn))
        by_rank.setdefault(cn[3], []).append(("recv", cn))
    return conns, by_rank


def setup_records(c, pe, threads, size, side_json):
    """Setup calls of one rank as (t, type, aux, obj, arg, ext): device, PD, MR, and per proxy
    thread its CQ, QP and the INIT/RTR/RTS transitions (RTR names the remote QPN and LID)."""
    r = pe.rank
    setup = []
    sid = side_json({"name": pe.nic.name, "node_guid": f"0x{pe.nic.guid:016x}", "port": 1, "lid": pe.nic.lid})
    ts = 1000.0
    setup.append((ts, T["IBV_OPEN_DEVICE"], 0, 1, sid, None))
    setup.append((ts + 500, T["IBV_ALLOC_PD"], 0, 1, 1, None))
    setup.append((ts + 1000, T["IBV_REG_MR"], 0, 0x1000 + r, 0x7F0000000000 + (r << 32),
                  (size * 2, 0x7, 0x2000 + r, 1)))
    ts += 2000
    for k, (role, cn) in sorted(threads.items()):
        ch, sn, src, dst, sq, dq = cn
        mine, other = (sq, dq) if role == "send" else (dq, sq)
        other_rank = dst if role == "send" else src
        other_nic = c.pes[other_rank].nic
        # as the native provider writes it (native/src/providers/ibv/ibv.c): the device names the NIC
        qsid = side_json({"qpn": mine, "qp_type": 2, "ctx": 1, "device": pe.nic.name, "pd": 1,
                          "send_cq": 0x100 + k, "recv_cq": 0x100 + k, "srq": 0,
                          "max_send_wr": 512, "max_recv_wr": 512, "channel": ch})
        setup.append((ts, T["IBV_CREATE_CQ"], 0, 0x100 + k, 1024, None))
        setup.append((ts + 300, T["IBV_CREATE_QP"], 2, mine, qsid, None))
        for st, (stt, dl, dq_) in enumerate(((1, 0, 0), (2, other_nic.lid, other), (3, 0, 0))):
            msid = side_json({"qp_state": ["INIT", "RTR", "RTS"][st], "dest_qp_num": dq_, "dlid": dl})
            setup.append((ts + 600 + 300 * st, T["IBV_MODIFY_QP"], stt, mine, msid,
                          (0x1 | 0x20 | 0x100 if st == 1 else 0x1, dl, dq_, 0)))
        ts += 2000
    return setup


SIMPY_MAX_NODES = 8


def _cluster(nodes, gpus_per_node, nics_per_node, channels, seed, timing, mode):
    """The cluster both engines run on: CPU proxies, no doorbell hijack (NCCL-style).
    Returns (cluster, timing, GPUs per node, nodes, ranks, channels, NICs per node)."""
    G, N = gpus_per_node, nodes
    nics = nics_per_node or G
    tm = timing_from(timing)
    c = Cluster("allreduce", nodes=N, gpus_per_node=G, nics_per_node=nics, seed=seed, timing=tm, launcher="srun")
    c.tracer.mode = mode
    c.tracer.hijack = "baseline"
    return c, tm, G, N, N * G, channels or G, nics


def run(output, nodes=4, gpus_per_node=4, nics_per_node=None, size=1 << 20, iters=2, channels=0, mode="simple",
        slice_bytes=512 << 10, seed=13, timing=None, poll_interval_ns=1000.0, engine="auto", **kw):
    """engine: "simpy" (CPU proxy threads as SimPy processes, host.CpuProxy), "vector" (closed
    form, any scale), "auto" (simpy up to SIMPY_MAX_NODES nodes, vector above)."""
    if engine == "auto":
        engine = "simpy" if nodes <= SIMPY_MAX_NODES else "vector"
    if engine == "simpy":
        return run_simpy(output, nodes=nodes, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node, size=size,
                         iters=iters, channels=channels, mode=mode, slice_bytes=slice_bytes, seed=seed, timing=timing,
                         poll_interval_ns=poll_interval_ns, **kw)
    if engine != "vector":
        raise ValueError(f"engine must be auto, simpy or vector, not {engine!r}")
    c, tm, G, N, R, C, nics_per_node = _cluster(nodes, gpus_per_node, nics_per_node, channels, seed, timing, mode)
    rng = np.random.default_rng(seed)
    steps = 2 * (R - 1)
    chunk = max(1, size // (R * C))
    nslices = max(1, -(-chunk // slice_bytes))
    slice_sz = -(-chunk // nslices)
    # step time of one inter-node hop: the node's NIC bandwidth is shared by the channels crossing it
    bw = tm.link_bw * nics_per_node / C
    hop = 2 * tm.link_latency_ns + tm.switch_latency_ns
    t_step = 4000.0 + 2 * hop + chunk / bw + nslices * 2 * tm.cpu_post_ns
    n_steps = steps * iters
    t0 = 200000.0
    jitter = rng.normal(0.0, 0.03 * t_step, size=(N, C, n_steps)).clip(-0.2 * t_step, 0.2 * t_step)
    step_t = t0 + np.arange(n_steps) * t_step
    conns, by_rank = connections(N, G, C)
    out = open(output, "wb")
    total_events = 0
    truth_pairs = np.zeros((R, R), np.int64)
    counts = {}
    c.progress("ranks", 0, total=R, unit="rank")     # closed form: each rank's records computed and written
    for r in range(R):
        pe = c.pes[r]
        n = pe.node
        clk = c.clocks[n]
        rec = c.recorders[r]
        header = c.header(pe, mode=mode, providers=["ibverbs"], options={"hijack": "off", "wqe_recovery": False,
                                                                        "proxy_poll_interval_ns": poll_interval_ns})
        w = TraceWriter(out, rec.uid)
        w.process(header)
        w.thread(1, tid=20000 + 17 * r, name="main", role="app")
        threads = {}
        for k, (role, cn) in enumerate(by_rank.get(r, [])):
            threads[k + 2] = (role, cn)
            w.thread(k + 2, tid=30000 + 17 * r + k, name=f"nccl-proxy-ch{cn[0]}-{role}", role="proxy")
        w.calibration(clk.calibration(0.0, L.CALIB_START))
        setup = setup_records(c, pe, threads, size, w.side_json)
        rows = []
        for (t, ty, aux, obj, arg, ext) in setup:
            rows.append((clk.tsc(t), ty, aux, obj, arg))
            if ext is not None:
                rows.append((ext[0], T["EXT"], ext[1], ext[2], ext[3]))
        srec = np.array(rows, dtype=np.uint64)
        arr = _rows(len(rows))
        for k, f in enumerate(("tsc", "type", "aux", "obj", "arg")):
            arr[f] = srec[:, k]
        w.events(1, arr)
        ev_count = int(np.count_nonzero(arr["type"] != T["EXT"]))
        agg = {}
        for k, (role, cn) in sorted(threads.items()):
            ch, sn, src, dst, sq, dq = cn
            # step times of this hop (sender node's jitter), per slice
            ts_step = step_t + jitter[sn, ch]
            t_slice = (ts_step[:, None] + np.arange(nslices)[None, :] * (slice_sz / bw)).ravel()
            n_post = len(t_slice)
            t_done = t_slice + hop + slice_sz / bw + 1500.0
            if role == "send":
                qpn, peer_rank = sq, dst
                nbytes = np.full(n_post, slice_sz, np.uint64)
                truth_pairs[src, dst] += int(nbytes.sum())
                counts["IBV_POST_SEND"] = counts.get("IBV_POST_SEND", 0) + n_post
                if mode == "aggregate":   # per WR / completion counters, as ibv_hot.c counts them
                    peer = (int(c.pes[dst].node) << 32) | dq
                    agg[(k, T["IBV_SEND_WR"], OP_WRITE, qpn, peer)] = (n_post, int(nbytes.sum()))
                    agg[(k, T["IBV_SEND_WR"], OP_WRITE_IMM, qpn, peer)] = (n_post, 0)
                    agg[(k, T["IBV_WC"], WC_RDMA_WRITE << 8, qpn, peer)] = (2 * n_post, int(nbytes.sum()))
                    continue
                parts, times = [], []
                p = _rows(n_post)
                p["tsc"] = clk.tsc_array(t_slice)
                p["type"], p["aux"], p["obj"], p["arg"] = T["IBV_POST_SEND"], 2, qpn, nbytes
                e = _rows(n_post)
                e["tsc"] = np.arange(n_post, dtype=np.uint64) * 2 + (r << 40)     # x0 = first wr_id
                e["type"], e["aux"], e["obj"] = T["EXT"], OP_WRITE, 0
                parts.append(_interleave(p, e))
                times.append(np.repeat(t_slice, 2))
                if mode == "full":
                    for j, (op, b) in enumerate(((OP_WRITE, slice_sz), (OP_WRITE_IMM, 0))):
                        tw = t_slice + 40.0 * (j + 1)
                        p = _rows(n_post)
                        p["tsc"] = clk.tsc_array(tw)
                        p["type"], p["aux"], p["obj"] = T["IBV_SEND_WR"], op | (SEND_SIGNALED << 8), qpn
                        p["arg"] = np.arange(n_post, dtype=np.uint64) * 2 + j + (r << 40)
                        e = _rows(n_post)
                        e["tsc"] = 0x7F0000000000 + (dst << 32) + (np.arange(n_post, dtype=np.uint64) % 64) * slice_sz
                        e["type"], e["aux"], e["obj"], e["arg"] = T["EXT"], 1, 0x2000 + dst, b
                        parts.append(_interleave(p, e))
                        times.append(np.repeat(tw, 2))
            else:
                qpn, peer_rank = dq, src
                counts["IBV_POST_RECV"] = counts.get("IBV_POST_RECV", 0) + n_post
                if mode == "aggregate":
                    peer = (int(c.pes[src].node) << 32) | sq
                    agg[(k, T["IBV_RECV_WR"], 0, qpn, peer)] = (n_post, 0)
                    agg[(k, T["IBV_SEND_WR"], OP_WRITE, qpn, peer)] = (n_post, 8 * n_post)
                    agg[(k, T["IBV_WC"], WC_RECV_RDMA_WITH_IMM << 8, qpn, peer)] = (n_post, 0)
                    continue
                parts, times = [], []
                tr = t_slice - 2000.0
                for ty, aux, b in ((T["IBV_POST_RECV"], 1, 0), (T["IBV_POST_SEND"], 1, 8)):
                    tt = tr + (0.0 if ty == T["IBV_POST_RECV"] else 300.0)
                    p = _rows(n_post)
                    p["tsc"] = clk.tsc_array(tt)
                    p["type"], p["aux"], p["obj"], p["arg"] = ty, aux, qpn, b
                    e = _rows(n_post)
                    e["tsc"] = np.arange(n_post, dtype=np.uint64) + (r << 40) + (1 << 39)
                    e["type"], e["aux"] = T["EXT"], OP_WRITE if ty == T["IBV_POST_SEND"] else 0
                    parts.append(_interleave(p, e))
                    times.append(np.repeat(tt, 2))
                if mode == "full":
                    for ty in (T["IBV_RECV_WR"], T["IBV_SEND_WR"]):
                        tt = tr + (40.0 if ty == T["IBV_RECV_WR"] else 340.0)
                        p = _rows(n_post)
                        p["tsc"] = clk.tsc_array(tt)
                        p["type"], p["obj"] = ty, qpn
                        p["aux"] = 1 if ty == T["IBV_RECV_WR"] else OP_WRITE | (SEND_INLINE << 8)
                        p["arg"] = np.arange(n_post, dtype=np.uint64) + (r << 40) + (1 << 39)
                        e = _rows(n_post)
                        e["type"] = T["EXT"]
                        if ty == T["IBV_RECV_WR"]:
                            e["tsc"], e["obj"], e["arg"] = 0x7F0000000000 + (r << 32), 0x1000 + r, 0
                        else:
                            e["tsc"], e["aux"], e["obj"], e["arg"] = 0x7E0000000000 + (src << 32), 1, 0x3000 + src, 8
                        parts.append(_interleave(p, e))
                        times.append(np.repeat(tt, 2))
            if mode == "full":
                # the proxy polls its CQ every poll_interval_ns from the post until the completion
                npoll = np.maximum(1, ((t_done - t_slice) // poll_interval_ns).astype(np.int64))
                tot = int(npoll.sum())
                first = np.repeat(t_slice, npoll)
                within = np.arange(tot) - np.repeat(np.cumsum(npoll) - npoll, npoll)
                tp = first + 200.0 + within * poll_interval_ns
                last = within == np.repeat(npoll - 1, npoll)
                p = _rows(tot)
                p["tsc"] = clk.tsc_array(tp)
                p["type"], p["obj"], p["arg"] = T["IBV_POLL_CQ"], 0x100 + k, 16
                p["aux"] = np.where(last, 2 if role == "send" else 1, 0)
                parts.append(p)
                times.append(tp)
                nwc = 2 if role == "send" else 1
                twc = np.repeat(tp[last], nwc) + np.tile(np.arange(nwc) * 10.0 + 5.0, n_post)
                p = _rows(n_post * nwc)
                p["tsc"] = clk.tsc_array(twc)
                p["type"], p["obj"] = T["IBV_WC"], qpn
                p["aux"] = ((WC_RDMA_WRITE if role == "send" else WC_RECV_RDMA_WITH_IMM) << 8)
                p["arg"] = np.arange(n_post * nwc, dtype=np.uint64) + (r << 40)
                e = _rows(n_post * nwc)
                e["type"] = T["EXT"]
                e["obj"] = np.tile(np.array([slice_sz, 0] if role == "send" else [0], np.uint32), n_post)
                parts.append(_interleave(p, e))
                times.append(np.repeat(twc, 2))
                counts["IBV_POLL_CQ"] = counts.get("IBV_POLL_CQ", 0) + tot
                counts["IBV_WC"] = counts.get("IBV_WC", 0) + n_post * nwc
            allrows = np.concatenate(parts)
            alltimes = np.concatenate(times)
            # keep each EXT right after its primary: sort groups by the primary's time
            is_ext = allrows["type"] == T["EXT"]
            grp = np.cumsum(~is_ext) - 1
            order = np.lexsort((np.arange(len(allrows)), alltimes[~is_ext][grp]))
            allrows = allrows[order]
            w.events(k, allrows)
            ev_count += int(np.count_nonzero(allrows["type"] != T["EXT"]))
        if agg:
            a = np.zeros(len(agg), L.AGGREGATE_DTYPE)
            for j, ((k, ty, aux, obj, peer), (cnt, b)) in enumerate(sorted(agg.items())):
                a[j] = (ty, aux, obj, peer, cnt, b)
            for k in sorted({key[0] for key in agg}):
                sel = np.array([key[0] == k for key in sorted(agg)])
                w.aggregate(a[sel], thread_index=k)
                ev_count += int(sel.sum())
        t_end = float(step_t[-1] + t_step * 2) if n_steps else t0
        w.calibration(clk.calibration(t_end, L.CALIB_END))
        w.end({"reason": "exit", "events": int(ev_count), "dropped_events": 0})
        total_events += ev_count
        c.progress("ranks", 1)
    out.close()
    node_mat = truth_pairs.reshape(N, G, N, G).sum(axis=(1, 3))
    meta = {"format": "sigmatrace-sim-truth/1", "workload": "allreduce", "seed": seed, "mode": mode,
            "params": dict(nodes=N, gpus_per_node=G, size=size, iters=iters, channels=C, slice_bytes=slice_bytes,
                           chunk_bytes=chunk, slices_per_step=nslices, steps_per_iter=steps),
            "clocks": [cl.to_dict() for cl in c.clocks], "timing": tm.to_dict(), "t_step_ns": t_step,
            "connections": [{"channel": cn[0], "src_rank": cn[2], "dst_rank": cn[3], "src_qpn": cn[4],
                             "dst_qpn": cn[5]} for cn in conns],
            "bytes": {"rank_matrix_nonzero": {f"{i}->{j}": int(truth_pairs[i, j])
                                              for i, j in zip(*np.nonzero(truth_pairs))},
                      "node_matrix": node_mat.tolist(), "total": int(truth_pairs.sum())},
            "counts": dict(counts, events=int(total_events)), "engine": "vector"}
    npz, js = truth_paths(output)
    np.savez_compressed(npz, rank_bytes=truth_pairs)
    with open(js, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True, default=_json_default)
    from ..cluster import SimResult
    return SimResult(str(output), npz, js, int(total_events), os.path.getsize(output), meta)


# ---------------------------------------------------------------------------------
# SimPy engine: every proxy thread is a host.CpuProxy process posting genuine mlx5
# WQEs through the NIC model and polling its CQ.
# ---------------------------------------------------------------------------------
FIFO_OFF = 0x0000_3000        # per channel: the sender's CTS word (the receiver's RDMA write, inline 8 B)
RECV_OFF = 0x1000_0000        # receive buffers
NVLINK_HOP_NS = 1500.0        # intra-node forwarding of a chunk between the ring's GPUs, per hop


class _Progress:
    """Steps a receiver proxy has completed (what the node's sender on that ring waits for)."""

    def __init__(self, env):
        self.env, self.value, self.ev = env, 0, env.event()

    def bump(self):
        self.value += 1
        ev, self.ev = self.ev, self.env.event()
        ev.succeed()


def run_simpy(output, nodes=4, gpus_per_node=4, nics_per_node=None, size=1 << 20, iters=2, channels=0,
              mode="simple", slice_bytes=512 << 10, seed=13, timing=None, poll_interval_ns=1000.0, **_):
    from .. import host as H
    from ..nic import QueuePair
    from ..gpu import heap_base
    c, tm, G, N, R, C, nics_per_node = _cluster(nodes, gpus_per_node, nics_per_node, channels, seed, timing, mode)
    env = c.env
    steps = 2 * (R - 1)
    chunk = max(1, size // (R * C))
    nslices = max(1, -(-chunk // slice_bytes))
    slice_sz = -(-chunk // nslices)
    n_steps = steps * iters
    conns, by_rank = connections(N, G, C)
    truth_pairs = np.zeros((R, R), np.int64)
    # processes, threads, setup records
    thread_of = {}
    for r in range(R):
        pe = c.pes[r]
        rec = c.recorders[r]
        rec.header = c.header(pe, mode=mode, providers=["ibverbs"],
                              options={"hijack": "off", "wqe_recovery": False, "proxy_poll_interval_ns": poll_interval_ns})
        rec.add_thread(1, 20000 + 17 * r, "main", "app")
        threads = {}
        for k, (role, cn) in enumerate(by_rank.get(r, [])):
            threads[k + 2] = (role, cn)
            thread_of[(role, cn)] = k + 2
            rec.add_thread(k + 2, 30000 + 17 * r + k, f"nccl-proxy-ch{cn[0]}-{role}", "proxy")
        rec.calibration(0.0, L.CALIB_START)
        for (t, ty, aux, obj, arg, ext) in setup_records(c, pe, threads, size, rec.side_json):
            rec.ev(1, t, ty, aux, obj, arg, ext=ext)
    # QPs (RC, connected) and their proxies
    procs = []
    c.expect(len(conns) * n_steps * nslices, "slice")
    progress = {(ch, n): _Progress(env) for ch in range(C) for n in range(N)}
    t_start = 200000.0
    for cn in conns:
        ch, n, src, dst, sqpn, dqpn = cn
        spe, dpe = c.pes[src], c.pes[dst]
        ks, kd = thread_of[("send", cn)], thread_of[("recv", cn)]
        qs = QueuePair(env, sqpn, spe, spe.nic, 1024, 0x100 + ks, poll_ns=0.0)
        qd = QueuePair(env, dqpn, dpe, dpe.nic, 1024, 0x100 + kd, poll_ns=0.0)
        for q, nic in ((qs, spe.nic), (qd, dpe.nic)):
            if q.qpn in nic.qps:
                raise ValueError("QPN collision on a shared NIC (use channels == gpus_per_node)")
            nic.qps[q.qpn] = q
        qs.peer, qd.peer = qd, qs
        send = H.CpuProxy(c, spe, qs, c.recorders[src], ks, 0x100 + ks, (dpe.node << 32) | dqpn, poll_interval_ns)
        recv = H.CpuProxy(c, dpe, qd, c.recorders[dst], kd, 0x100 + kd, (spe.node << 32) | sqpn, poll_interval_ns)
        fifo = spe.base + FIFO_OFF + 64 * ch
        # the node's receiver on this ring (what this sender forwards after step 0)
        upstream = progress[(ch, n)]
        done_here = progress[(ch, (n + 1) % N)]

        def sender(px=send, src=src, dst=dst, fifo=fifo, upstream=upstream, spe=spe, dpe=dpe):
            yield env.timeout(t_start)
            seq = 0
            for s in range(n_steps):
                if s:   # forward what arrived on this ring at step s-1 (through the node's NVLink hops)
                    while upstream.value < s:
                        yield upstream.ev
                    yield env.timeout(NVLINK_HOP_NS * max(1, G - 1))
                for j in range(nslices):
                    seq += 1
                    while spe.mem.get(fifo) < seq:     # clear-to-send from the receiver
                        yield spe.mem.changed(fifo)
                    base = (src << 40) + 2 * (seq - 1)
                    raddr = heap_base(dst) + RECV_OFF + ((seq - 1) % 64) * slice_sz
                    wrs = [H.SendWR(base, H.IBV_WR_RDMA_WRITE, H.IBV_SEND_SIGNALED, raddr, dpe.rkey,
                                    spe.scratch, spe.lkey, slice_sz),
                           H.SendWR(base + 1, H.IBV_WR_RDMA_WRITE_WITH_IMM, H.IBV_SEND_SIGNALED, raddr, dpe.rkey,
                                    spe.scratch, spe.lkey, 0)]
                    truth_pairs[src, dst] += slice_sz
                    yield from px.post_send(wrs)
                    sent = px.qp.sq.resv_head
                    yield from px.poll_until(lambda q=px.qp, e=sent: q.sq.cons_idx >= e)
                    c.advance()

        def receiver(px=recv, src=src, dst=dst, fifo=fifo, done_here=done_here, spe=spe, dpe=dpe):
            yield env.timeout(t_start - 2000.0)
            seq = 0
            for s in range(n_steps):
                for j in range(nslices):
                    seq += 1
                    wr_id = (dst << 40) + (1 << 39) + seq - 1
                    yield from px.post_recv(wr_id, heap_base(dst) + RECV_OFF, dpe.lkey, 0)
                    cts = H.SendWR(wr_id, H.IBV_WR_RDMA_WRITE, H.IBV_SEND_INLINE, fifo, spe.rkey, 0, 0, 8,
                                   inline=int(seq).to_bytes(8, "little"))
                    yield from px.post_send([cts])
                    yield from px.poll_until(lambda p=px, w=wr_id: not p.recv_out or p.recv_out[0] > w)
                done_here.bump()

        procs.append(env.process(sender()))
        procs.append(env.process(receiver()))
    env.run(until=simpy_all(env, procs))
    t_end = env.now
    c.drain(t_end)
    total_events = 0
    c.progress("write", 0, total=R, unit="file")
    with open(output, "wb") as f:
        for r in range(R):
            rec = c.recorders[r]
            rec.calibration(t_end + 5000.0, L.CALIB_END)
            total_events += rec.write(f, {"reason": "exit", "dropped_events": 0})
            c.progress("write", 1)
    counts = {}
    node_mat = truth_pairs.reshape(N, G, N, G).sum(axis=(1, 3))
    meta = {"format": "sigmatrace-sim-truth/1", "workload": "allreduce", "seed": seed, "mode": mode,
            "engine": "simpy",
            "params": dict(nodes=N, gpus_per_node=G, size=size, iters=iters, channels=C, slice_bytes=slice_bytes,
                           chunk_bytes=chunk, slices_per_step=nslices, steps_per_iter=steps),
            "clocks": [cl.to_dict() for cl in c.clocks], "timing": tm.to_dict(), "t_end_ns": t_end,
            "connections": [{"channel": cn[0], "src_rank": cn[2], "dst_rank": cn[3], "src_qpn": cn[4],
                             "dst_qpn": cn[5]} for cn in conns],
            "bytes": {"rank_matrix_nonzero": {f"{i}->{j}": int(truth_pairs[i, j])
                                              for i, j in zip(*np.nonzero(truth_pairs))},
                      "node_matrix": node_mat.tolist(), "total": int(truth_pairs.sum())},
            "counts": dict(counts, events=int(total_events), nic_bytes_moved=int(c.bytes_moved))}
    npz, js = truth_paths(output)
    np.savez_compressed(npz, rank_bytes=truth_pairs)
    with open(js, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True, default=_json_default)
    from ..cluster import SimResult
    return SimResult(str(output), npz, js, int(total_events), os.path.getsize(output), meta)


def simpy_all(env, procs):
    import simpy
    return simpy.AllOf(env, procs)
