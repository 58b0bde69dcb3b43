"""Assembly of the model: nodes, clocks, NICs, fabric, GPUs (PEs), QPs, pollers,
and the records of the IBGDA setup path, exactly as the native tracer writes them.
"""
import hashlib
import heapq
import io
import json
import os
from dataclasses import dataclass, field

import numpy as np
import simpy

from sigmatrace.format import events as E
from sigmatrace.mlx5 import prm as P
from sigmatrace.progress import QUIET

from .capture import GroundTruth, ProcessRecorder, T, save_npz
from .clock import make_clocks, JOB_EPOCH_NS
from .fabric import Fabric
from .gpu import PE, heap_base
from .host import HijackPoller, recovery_helper
from .nic import Nic, QueuePair, UarPage, at
from .params import Timing, TracerConfig

SIM_VERSION = "0.1.0"
SETUP_STEP_NS = 2500.0
UAR_NC, UAR_NC_DEDICATED = 0x1, 1 << 31
CUDA_HOST_REGISTER_FLAGS = 0x1 | 0x2 | 0x4   # PORTABLE | DEVICEMAP | IOMEMORY


def truth_paths(output):
    base, _ = os.path.splitext(str(output))
    return base + ".truth.npz", base + ".truth.json"


def process_uid(workload, seed, rank):
    h = hashlib.blake2b(f"sigmatrace-sim:{workload}:{seed}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1) | 1


@dataclass
class SimResult:
    output: str
    truth_npz: str
    truth_json: str
    events: int
    bytes: int
    meta: dict = field(default_factory=dict)


PROGRESS = [QUIET]   # the running command's sigmatrace.progress.Progress (set by workloads.run)


class Cluster:
    """nodes x gpus_per_node PEs; GPU g of a node uses NIC g % nics_per_node."""

    def __init__(self, workload, nodes=1, gpus_per_node=4, nics_per_node=1, qp_depth=1024, seed=0,
                 timing=None, tracer=None, start_index=0, launcher="mpirun", clock_drift_ppm=20.0,
                 ptp_error_ns=150.0):
        self.workload = workload
        self.progress = PROGRESS[0]    # the command's (workloads.run): the simulate and write stages
        self._expected = False
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.env = simpy.Environment()
        self.timing = timing or Timing()
        self.tracer = tracer or TracerConfig()
        self.nodes, self.gpus_per_node, self.nics_per_node = nodes, gpus_per_node, nics_per_node
        self.qp_depth = qp_depth
        self.start_index = start_index
        self.launcher = launcher
        self.world = nodes * gpus_per_node
        self.fabric = Fabric(self.timing)
        self.truth = GroundTruth()
        self.clocks = make_clocks(nodes, np.random.default_rng(self.seed + 7919), clock_drift_ppm, ptp_error_ns)
        self.bytes_moved = 0
        self.wqe_lost = 0
        self.effects = []        # remote-effect timeline: heap of (t_responder, seq, memory, effect, qp, index)
        self._effect_seq = 0
        self.params = {}
        self.nics = []
        for n in range(nodes):
            row = []
            for i in range(nics_per_node):
                name = f"mlx5_{i}"
                guid = 0x0C42A10300000000 | (n << 8) | i
                nic = Nic(self.env, self, n, i, name, guid, self.fabric.port(f"n{n}:{name}"))
                nic.lid = 1 + n * nics_per_node + i
                nic.next_qpn = 0x000200 + 0x1000 * i
                nic.next_cqn = 0x000400 + 0x100 * i
                nic.next_page = 0x20 + 0x40 * i
                nic.next_umem = 0x10 + 0x200 * i
                row.append(nic)
            self.nics.append(row)
        self.pes = []
        self.recorders = []
        for r in range(self.world):
            n, g = divmod(r, gpus_per_node)
            pe = PE(self, r, n, g, self.nics[n][g % nics_per_node])
            pe.phase = 0
            self.pes.append(pe)
            self.recorders.append(ProcessRecorder(process_uid(workload, seed, r), self.clocks[n], None))
        self.qps = []
        self.pollers = []
        self._setup_t = [1000.0] * self.world
        self._helpers = {}
        self.t_start_kernel = 0.0
        self.truth_from_ns = None
        self.truth_arrays = {}   # workload arrays saved beside wqes/doorbells/barriers in the .truth.npz

    # -- identities --------------------------------------------------------
    def nic_info(self, n):
        out = []
        for nic in self.nics[n]:
            g = nic.guid
            gid = "fe80:0000:0000:0000:{:04x}:{:04x}:{:04x}:{:04x}".format(
                (g >> 48) & 0xFFFF, (g >> 32) & 0xFFFF, (g >> 16) & 0xFFFF, g & 0xFFFF)
            out.append({"name": nic.name, "node_guid": f"0x{g:016x}",
                        "ports": [{"port": 1, "lid": nic.lid, "gids": [gid], "link_layer": "InfiniBand"}]})
        return out

    def gpu_info(self, n):
        out = []
        for g in range(self.gpus_per_node):
            h = hashlib.blake2b(f"gpu:{self.seed}:{n}:{g}".encode(), digest_size=16).hexdigest()
            uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
            out.append({"ordinal": g, "uuid": uuid, "pci_bus_id": f"00000000:{0x18 + 0x20 * g:02X}:00.0",
                        "name": "NVIDIA H200"})
        return out

    def header(self, pe, mode=None, providers=None, options=None):
        rec = self.recorders[pe.rank]
        clk = self.clocks[pe.node]
        opts = {"batch_threshold": self.tracer.batch_threshold, "queue_depth": self.qp_depth,
                "hijack": self.tracer.hijack, "wqe_recovery": self.tracer.recovery,
                "nonblocking": self.tracer.hijack == "nonblocking",
                "poller_wakeup_ns": self.tracer.poller_wakeup_ns if self.tracer.poller_wakeup_ns is not None
                else self.timing.poller_wakeup_ns, "buffer_events": 65536,
                # the model writes every empty poll (the recorder's SIGMATRACE_IDLE_POLLS=each form; its
                # default coalesces a run into its first and last call, docs/tracer.md "Idle polls")
                "idle_polls": "each"}
        opts.update(options or {})
        return {
            "format_version": 1, "process_uid": f"{rec.uid:016x}", "tracer": "sim",
            "tracer_version": SIM_VERSION, "host": f"node{pe.node:03d}", "node_id": pe.node,
            "pid": 20000 + 17 * pe.rank, "ppid": 19999, "rank": pe.rank, "local_rank": pe.local,
            "world_size": self.world, "launcher": self.launcher, "mode": mode or self.tracer.mode,
            "providers": providers or ["ibverbs", "mlx5dv", "cuda"], "exe": f"/opt/apps/{self.workload}",
            "argv": [f"/opt/apps/{self.workload}", f"--seed={self.seed}"], "tsc_hz": clk.nominal_hz,
            "start_realtime_ns": int(JOB_EPOCH_NS + clk.ptp_error_ns), "options": opts,
            "nics": self.nic_info(pe.node), "gpus": self.gpu_info(pe.node),
        }

    # -- setup: the IBGDA path (reference/mlx5.md §5.1) --------------------------
    def _tick(self, rank):
        t = self._setup_t[rank]
        self._setup_t[rank] = t + SETUP_STEP_NS
        return t

    def open_processes(self):
        for pe in self.pes:
            rec = self.recorders[pe.rank]
            rec.header = self.header(pe)
            rec.add_thread(1, 20000 + 17 * pe.rank, "main", "app")
            rec.calibration(0.0, 0)
            nic = pe.nic
            sid = rec.side_json({"name": nic.name, "node_guid": f"0x{nic.guid:016x}", "port": 1, "lid": nic.lid})
            rec.ev(1, self._tick(pe.rank), T["IBV_OPEN_DEVICE"], 0, 1, sid)
            rec.ev(1, self._tick(pe.rank), T["IBV_ALLOC_PD"], 0, 1, 1)
            pe.pdn = 0x10 + pe.local
            # the NC UAR NVSHMEM uses for its CQs (not mapped to the GPU)
            pe.cq_uar = nic.next_page
            nic.next_page += 1
            rec.ev(1, self._tick(pe.rank), T["MLX5_DEVX_ALLOC_UAR"], UAR_NC & 0xFFFF, pe.cq_uar,
                   0x7FF000000800 + (pe.cq_uar << 12), ext=(0x7FF000000000 + (pe.cq_uar << 12), 0, UAR_NC, pe.cq_uar << 12))

    def _umem(self, pe, rec, addr, size, gpu=True):
        nic = pe.nic
        uid = nic.next_umem
        nic.next_umem += 1
        rec.ev(1, self._tick(pe.rank), T["MLX5_DEVX_UMEM_REG"], E.UMEM_F_GPU if gpu else 0, uid, addr,
               ext=(size, 0, 0x1, 0))
        return uid

    def create_qp(self, pe):
        """CQ + UAR (hijacked) + WQ/DBR umems + CREATE_QP for one QP of `pe`."""
        rec = self.recorders[pe.rank]
        nic = pe.nic
        depth = self.qp_depth
        log_sq = depth.bit_length() - 1
        gbase = 0x7E0000000000 + (pe.rank << 32) + len(pe.__dict__.setdefault("_qps_made", [])) * (1 << 22)
        pe._qps_made.append(1)
        # send CQ
        cq_umem = self._umem(pe, rec, gbase, depth * 64)
        cq_dbr = self._umem(pe, rec, gbase + 0x200000, 64)
        cqn = nic.next_cqn
        nic.next_cqn += 1
        cq_in = P.build_create_cq_in(cqe_sz=0, cc=1, oi=1, dbr_umem_valid=1, dbr_umem_id=cq_dbr,
                                     log_cq_size=log_sq, uar_page=pe.cq_uar, c_eqn=0, log_page_size=4,
                                     dbr_addr=0, cq_umem_offset=0, cq_umem_id=cq_umem, cq_umem_valid=1)
        sid = rec.side_prm(cq_in, P.build_create_cq_out(cqn))
        rec.ev(1, self._tick(pe.rank), T["MLX5_DEVX_OBJ_CREATE"], 0x400, cqn, sid, ext=(0x1000 + cqn, 0, 0, 0))
        # QP UAR: dedicated, registered with CUDA as I/O memory; the tracer hands back its proxy page
        page = nic.next_page
        nic.next_page += 1
        reg_addr = 0x7FF000000800 + (page << 12)
        rec.ev(1, self._tick(pe.rank), T["MLX5_DEVX_ALLOC_UAR"], 0, page, reg_addr,
               ext=(reg_addr - 0x800, 0, UAR_NC_DEDICATED, page << 12))
        rec.ev(1, self._tick(pe.rank), T["CU_MEM_HOST_REGISTER"], 0, CUDA_HOST_REGISTER_FLAGS, reg_addr,
               ext=(8, 0, 0, 0))
        real_dev = 0x7F8000000000 + (page << 12) + 0x800
        proxy = 0x7FA000000000 + (pe.rank << 24) + (page << 12)
        proxy_dev = 0x7FB000000000 + (pe.rank << 24) + (page << 12)
        hij = self.tracer.hijacked
        rec.ev(1, self._tick(pe.rank), T["CU_MEM_HOST_GET_DEVPTR"], 1 if hij else 0, 0, reg_addr,
               ext=(proxy_dev if hij else real_dev, 0, 0, real_dev))
        # WQ and DBR
        wq_umem = self._umem(pe, rec, gbase + 0x100000, depth * 64)
        dbr_umem = self._umem(pe, rec, gbase + 0x300000, 8)
        qpn = nic.next_qpn
        nic.next_qpn += 1
        qp_in = P.build_create_qp_in(st=0, pm_state=3, pd=pe.pdn, uar_page=page, rq_type=1,
                                     srqn_rmpn_xrqn=0x80 + pe.local, cqn_snd=cqn, cqn_rcv=0x3F0 + pe.local,
                                     log_sq_size=log_sq, log_rq_size=0, dbr_umem_valid=1, dbr_addr=0,
                                     dbr_umem_id=dbr_umem, user_index=len(pe._qps_made) - 1,
                                     wq_umem_id=wq_umem, wq_umem_valid=1, wq_umem_offset=0)
        sid = rec.side_prm(qp_in, P.build_create_qp_out(qpn))
        rec.ev(1, self._tick(pe.rank), T["MLX5_DEVX_OBJ_CREATE"], 0x500, qpn, sid, ext=(0x2000 + qpn, 0, 0, 0))
        qp = QueuePair(self.env, qpn, pe, nic, depth, cqn, self.start_index, poll_ns=self.timing.gpu_poll_ns)
        qp.gid = len(self.qps)
        qp.uar = UarPage(self.env, nic, page, reg_addr)
        qp.uar.proxy = (proxy, proxy_dev)
        nic.qps[qpn] = qp
        self.qps.append(qp)
        return qp

    def connect(self, pairs=None):
        """RC QPs for every ordered pair (a -> b) in `pairs` (default: all pairs), then RST2INIT/INIT2RTR/RTR2RTS."""
        if pairs is None:
            pairs = [(a, b) for a in range(self.world) for b in range(self.world) if a != b]
        pairs = sorted(set((min(a, b), max(a, b)) for a, b in pairs))
        for a, b in pairs:
            pa, pb = self.pes[a], self.pes[b]
            qa, qb = self.create_qp(pa), self.create_qp(pb)
            qa.peer, qb.peer = qb, qa
            pa.qps[b], pb.qps[a] = qa, qb
        for qp in self.qps:
            pe = qp.pe
            rec = self.recorders[pe.rank]
            remote = qp.peer
            for trans, fields in (("RST2INIT", dict(rwe=1, rre=1, rae=1, atomic_mode=3, vhca_port_num=1,
                                                     pkey_index=0, pm_state=3)),
                                  ("INIT2RTR", dict(mtu=5, log_msg_max=30, min_rnr_nak=12, log_rra_max=4,
                                                    rlid=remote.nic.lid, sl=0, tclass=0)),
                                  ("RTR2RTS", dict(log_sra_max=4, retry_count=7, rnr_retry=7, ack_timeout=20,
                                                   next_send_psn=0))):
                buf = P.build_modify_qp_in(trans, qp.qpn, remote.qpn if trans == "INIT2RTR" else None, **fields)
                sid = rec.side_prm(buf, bytes(16))
                op = {"RST2INIT": 0x502, "INIT2RTR": 0x503, "RTR2RTS": 0x504}[trans]
                rec.ev(1, self._tick(pe.rank), T["MLX5_DEVX_OBJ_MODIFY"], op, qp.qpn, sid)

    def install_hijack(self):
        """One poller thread per hijacked UAR page (DB_HIJACK_INSTALL from that thread)."""
        if not self.tracer.hijacked:
            return
        nb = self.tracer.hijack == "nonblocking"
        for pe in self.pes:
            rec = self.recorders[pe.rank]
            ti = 2
            helper = None
            if nb and pe.qps:
                rec.add_thread(ti, 30000 + 17 * pe.rank + ti, "st-recovery", "writer")
                store = simpy.Store(self.env)
                self.env.process(recovery_helper(self, rec, ti, store))
                helper = (ti, store)
                ti += 1
            for peer in sorted(pe.qps):
                qp = pe.qps[peer]
                qp.uar.hijacked = True
                rec.add_thread(ti, 30000 + 17 * pe.rank + ti, f"st-poller-{qp.uar.page_id:x}", "poller")
                proxy, proxy_dev = qp.uar.proxy
                sid = rec.side_json({"reg_addr": qp.uar.reg_addr, "gpu": pe.local, "page_id": qp.uar.page_id,
                                     "proxy_addr": proxy, "device_ptr": proxy_dev})
                rec.ev(ti, self._tick(pe.rank), T["DB_HIJACK_INSTALL"], pe.local, qp.uar.page_id, sid)
                self.pollers.append(HijackPoller(self, pe, qp, rec, ti, helper))
                ti += 1

    def setup(self, pairs=None):
        self.open_processes()
        self.connect(pairs)
        self.install_hijack()
        self.t_start_kernel = max(self._setup_t) + 10000.0
        return self.t_start_kernel

    # -- remote effects (atomics, inline writes) at the responder ------------------
    def push_effect(self, t, mem, effect, qp, index):
        """The NIC's responder will update `mem` at time t (closed form, nic.py).

        Effects on different words commute, effects on one word apply in time order
        (ties: in the order the NIC issued them); they are applied lazily, before any
        read of that memory (Memory.get/apply, the end of a CQ wait) or, when a GPU
        waits on the word, by one wake-up event at time t."""
        self._effect_seq += 1
        heapq.heappush(self.effects, (t, self._effect_seq, mem, effect, qp, index))
        addr = effect[1]
        mem.pending.setdefault(addr, []).append(t)
        if addr in mem.waiters:
            self.wake_at(t)

    def wake_at(self, t):
        at(self.env, t, self._drain_event)

    def _drain_event(self, _ev):
        self.drain(self.env.now)

    def drain(self, now):
        """Apply every remote effect due by `now`, in time order."""
        eff = self.effects
        while eff and eff[0][0] <= now:
            t, _seq, mem, (kind, addr, a, b), qp, index = heapq.heappop(eff)
            times = mem.pending[addr]
            times.remove(t)
            if not times:
                del mem.pending[addr]
            qp.results[index] = mem._apply(kind, addr, a, b)

    # -- running -------------------------------------------------------------
    def launch(self, kernel, *args):
        """Start one GPU block (a generator function) at the kernel start time."""
        def start():
            yield self.env.timeout(max(0.0, self.t_start_kernel - self.env.now))
            yield from kernel(*args)
        return self.env.process(start())

    # -- progress: a workload says what it will do (expect) and counts it (advance); without that, the
    # kernels it launched are counted as they finish --------------------------------------------------
    def expect(self, total, unit):
        self._expected = True
        self.progress("simulate", 0, total=int(total), unit=unit)

    def advance(self, n=1):
        self.progress("simulate", n)

    def run(self, procs):
        if not self._expected:
            self.expect(len(procs), "kernel")
            for p in procs:
                p.callbacks.append(lambda _ev: self.advance())
        done = simpy.AllOf(self.env, procs)
        self.env.run(until=done)
        # let the last completions and forwards drain
        self.env.run(until=self.env.now + 200000.0)
        self.drain(self.env.now)
        return self.env.now

    # -- output -----------------------------------------------------------------
    def finish(self, output, t_end=None, extra_meta=None):
        t_end = self.env.now if t_end is None else t_end
        for p in self.pollers:
            p.flush(t_end)
        for pe in self.pes:
            self.recorders[pe.rank].calibration(t_end + 5000.0, 2)
        return self.write(output, t_end, extra_meta or {})

    def write(self, output, t_end, extra_meta):
        total = 0
        os.makedirs(os.path.dirname(os.path.abspath(output)) or ".", exist_ok=True)
        self.progress("write", 0, total=len(self.recorders) + 1, unit="file")   # process files, then the truth
        with open(output, "wb") as f:     # process files, one after the other (capture.bin)
            for rec in self.recorders:
                total += rec.write(f, {"reason": "exit", "dropped_events": 0, "lost_wqebb": 0})
                self.progress("write", 1)
            nbytes = f.tell()
        npz, js = truth_paths(output)
        w, d, b = self.truth.arrays(self.qps)
        self.doorbells_simulated = len(d)
        if self.truth_from_ns is not None:
            # keep the recorded window (and anything the tracer saw); counts below still cover the whole run
            full_w, full_d = w, d
            w = w[(w["t_post"] >= self.truth_from_ns) | (w["traced"] == 1)]
            d = d[(d["t_write"] >= self.truth_from_ns) | d["recorded"]]
        save_npz(npz, wqes=w, doorbells=d, barriers=b, **self.truth_arrays)
        meta = self.truth_meta(w, d, t_end)
        meta.update(extra_meta)
        with open(js, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True, default=_json_default)
        self.progress("write", 1)
        self.progress.close()
        return SimResult(str(output), npz, js, total, nbytes, meta)

    def truth_meta(self, w, d, t_end):
        traced = w["traced"] == 1
        per_qp, per_gpu, per_node = {}, {}, {}
        mat = np.zeros((self.nodes, self.nodes), np.int64)
        if len(w):
            keys, inv = np.unique(np.stack([w["rank"], w["qpn"]]).T, axis=0, return_inverse=True)
            sums = np.bincount(inv.ravel(), weights=w["bytes"].astype(np.float64), minlength=len(keys))
            per_qp = {f"{int(k[0])}:{int(k[1])}": int(s) for k, s in zip(keys, sums)}
            for r in range(self.world):
                per_gpu[str(r)] = int(w["bytes"][w["rank"] == r].sum())
            np.add.at(mat, (w["node"], w["peer_node"]), w["bytes"].astype(np.int64))
        for n in range(self.nodes):
            per_node[str(n)] = int(mat[n].sum())
        procs = []
        for pe in self.pes:
            rec = self.recorders[pe.rank]
            procs.append({"rank": pe.rank, "node": pe.node, "gpu": pe.local, "process_uid": f"{rec.uid:016x}",
                          "pid": 20000 + 17 * pe.rank, "nic": pe.nic.name, "nic_guid": f"0x{pe.nic.guid:016x}",
                          "qps": [{"qpn": q.qpn, "peer_rank": p, "peer_qpn": q.peer.qpn, "sq_depth": q.sq.depth,
                                   "uar_page": q.uar.page_id, "cqn": q.cq.cqn} for p, q in sorted(pe.qps.items())]})
        return {
            "format": "sigmatrace-sim-truth/1", "workload": self.workload, "seed": self.seed,
            "params": self.params, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
            "nics_per_node": self.nics_per_node, "qp_depth": self.qp_depth, "start_index": self.start_index,
            "tracer": {"mode": self.tracer.mode, "hijack": self.tracer.hijack,
                       "batch_threshold": self.tracer.batch_threshold,
                       "poller_wakeup_ns": self.tracer.poller_wakeup_ns, "record_after_ns": self.tracer.record_after_ns},
            "timing": self.timing.to_dict(), "clocks": [c.to_dict() for c in self.clocks],
            "t_kernel_start_ns": self.t_start_kernel, "t_end_ns": t_end, "processes": procs,
            "bytes": {"per_qp": per_qp, "per_gpu": per_gpu, "per_node_egress": per_node,
                      "node_matrix": mat.tolist(), "total": int(w["bytes"].sum()) if len(w) else 0,
                      "traced_total": int(w["bytes"][traced].sum()) if len(w) else 0},
            "counts": {"wqes": int(len(w)), "wqes_traced": int(traced.sum()),
                       "wqes_recovered": int((w["recovered"] == 1).sum()) if len(w) else 0,
                       "wqes_lost": int((w["recovered"] == 0).sum()) if len(w) else 0,
                       "doorbells_written": int(len(d)),
                       "doorbells_simulated": int(getattr(self, "doorbells_simulated", len(d))), "doorbells_recorded": int((d["recorded"] & ~d["coalesced"]).sum()),
                       "doorbells_coalesced": int(d["coalesced"].sum()),
                       "pi16_wraps": int(((d["pi"] >> 16) > 0).any()) if len(d) else 0,
                       "sq_ring_wraps": int(max((q.sq.resv_head - self.start_index) // q.sq.depth for q in self.qps)) if self.qps else 0},
        }


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))
