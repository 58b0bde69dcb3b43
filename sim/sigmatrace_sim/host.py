"""Host side: the tracer's doorbell hijack poller (with WQE recovery).

One poller thread per hijacked UAR page (reference: paper §V).  It parks on the
page (UMWAIT/MWAITX or a spin with back-off) and, once a GPU store has changed
the page, wakes after `poller_wakeup_ns`, reads the *latest* 8 bytes (stores that
came in meanwhile are coalesced: the producer index is monotonic, so the latest
value covers them), records DB_DOORBELL, and forwards the value to the real UAR.
When it comes back from forwarding and the page changed meanwhile, it looks again
after `poller_check_ns` instead of parking.

WQE recovery (hijack modes "recovery" and "nonblocking"): the poller remembers
the WQEBB range [previous PI, new PI) of every doorbell and pays the submission of
an async device-to-host copy (`recovery_enqueue_ns`).  When `batch_threshold`
WQEBBs have accumulated, the batch is copied and parsed: in "recovery" mode the
poller does it itself before forwarding the threshold-crossing doorbell (that
doorbell is delayed by the copy); in "nonblocking" mode (F24c) a helper thread
does it and no doorbell waits.  The copy reads the SQ ring as it is *at copy
time*: a slot the GPU has already reused (only possible once the NIC completed it
and the ring wrapped) no longer holds the expected wqe_index, and the tracer
records DB_WQE_LOST (OVERWRITTEN) for the rest of that range.

Closed form: one SimPy event per observation.  The GPU tells the page of each
store and when it lands (stores of one page land in issue order, a fixed
mmio_write_ns after issue).  The poller's next look is then known:
    t_obs = t_land + wakeup            if the poller is parked when the store lands
          = busy_until + check         if it was still busy (forwarding, copying)
and at t_obs every store that has landed by then is known (it was issued
mmio_write_ns earlier), so the observation, its coalescing, its recording, its
cost and the forward time are computed in that one event; the NIC is handed the
forwarded value with its arrival time (nic.Nic.doorbell, closed form too).  The
only other events are the recovery copies, which must read the ring at copy time.
"""
from collections import deque

from sigmatrace.format import events as E

from . import nic as nic_mod
from . import wqe as W
from .capture import REC_LOST, REC_RECOVERED, T
from .nic import at

_DB = T["DB_DOORBELL"]
_FWD = T["DB_FORWARD"]
_DBWQE = T["DB_WQE"]
_LOST = T["DB_WQE_LOST"]


class HijackPoller:
    def __init__(self, cluster, pe, qp, rec, thread, helper=None):
        self.c = cluster
        self.env = cluster.env
        self.t = cluster.timing
        self.cfg = cluster.tracer
        self.pe, self.qp, self.rec, self.thread = pe, qp, rec, thread
        self.helper = helper          # (recorder thread, simpy.Store) in nonblocking mode
        self.wakeup = self.cfg.poller_wakeup_ns if self.cfg.poller_wakeup_ns is not None else self.t.poller_wakeup_ns
        self.last_pi = qp.sq.nic_pi   # full producer index already seen
        self.pending = []             # [(first full index, nwqebb)] awaiting the recovery copy
        self.pending_n = 0
        self.observed = 0
        self.stores = deque()         # (t_land, raw, truth id) of stores the poller has not read yet
        self.busy_until = float("-inf")
        self.scheduled = False
        self.thr = max(1, int(self.cfg.batch_threshold))
        self.blocking = self.cfg.hijack == "recovery"
        self.full = self.cfg.mode == "full"
        qp.uar.poller = self

    # -- the page ----------------------------------------------------------------
    def store(self, t_land, raw, db_id):
        """The GPU issued a store to the page; it lands at t_land (in issue order)."""
        self.stores.append((t_land, raw, db_id))
        if not self.scheduled:
            self._schedule(t_land)

    def _schedule(self, t_land):
        self.scheduled = True
        b = self.busy_until
        at(self.env, b + self.t.poller_check_ns if t_land <= b else t_land + self.wakeup, self._observe)

    # -- one look at the page ----------------------------------------------------
    def _observe(self, _ev):
        now = self.env.now
        t, cfg, c = self.t, self.cfg, self.c
        stores = self.stores
        ids = []
        while stores and stores[0][0] <= now:
            _tl, raw, db_id = stores.popleft()
            ids.append(db_id)
        pi16 = (((raw >> 8) & 0xFF) << 8) | ((raw >> 16) & 0xFF)
        delta = (pi16 - self.last_pi) & 0xFFFF
        first = self.last_pi
        self.last_pi += delta
        recording = now >= cfg.record_after_ns
        obs = ids[-1]
        truth = c.truth
        for k in ids:
            truth.observed.append((k, obs, recording))
        self.observed += 1
        cost = t.poller_record_ns
        qp = self.qp
        if recording:
            rec = self.rec
            rec.rows(self.thread).append((rec.tsc(now), _DB, pi16, qp.qpn, raw))
            if delta:
                truth.traced.append((qp.gid, first, delta))
            if cfg.recovery and delta:
                self.pending.append((first, delta))
                self.pending_n += delta
                if self.blocking:
                    cost += t.recovery_enqueue_ns
                if self.pending_n >= self.thr:
                    batch, self.pending, self.pending_n = self.pending, [], 0
                    if self.blocking:
                        # the poller copies and parses before it forwards: the ring is read at copy time
                        state = (now, obs, raw, pi16, recording, batch)
                        at(self.env, now + cost + self._copy_ns(batch), lambda ev: self._after_copy(state))
                        return
                    self.helper[1].put((self, batch))
        self._forward(now, now + cost, obs, raw, pi16, recording)

    def _after_copy(self, state):
        t_obs, obs, raw, pi16, recording, batch = state
        cost = self.parse(batch, self.thread, self.rec)
        self._forward(t_obs, self.env.now + cost, obs, raw, pi16, recording)

    def _forward(self, t_obs, t_ready, obs, raw, pi16, recording):
        """CPU MMIO store of the observed value to the real UAR; the poller is busy until it is done."""
        t_fwd = t_ready + self.t.poller_forward_ns
        self.c.truth.observations.append((obs, t_obs, t_fwd))
        if self.full and recording:
            rec = self.rec
            rec.rows(self.thread).append((rec.tsc(t_fwd), _FWD, pi16, self.qp.qpn, rec.tsc(t_obs)))
        self.qp.nic.doorbell(self.qp, pi16, t_fwd)
        self.busy_until = t_fwd
        self.scheduled = False
        if self.stores:
            self._schedule(self.stores[0][0])

    def _copy_ns(self, batch):
        n = sum(b for _, b in batch)
        return self.t.copy_latency_ns + n * 64 / self.t.copy_bw

    def parse(self, batch, thread, rec, now=None):
        """Read the copied slots, verify each ctrl's wqe_index/QPN, record DB_WQE / DB_WQE_LOST.

        Returns the CPU time the parse took."""
        qp = self.qp
        sq = qp.sq
        ring, mask = sq.ring, sq.mask
        qpn = qp.qpn
        now = self.env.now if now is None else now
        truth = self.c.truth
        rows = rec.rows(thread)
        tsc = rec.tsc(now)
        nwqe = 0
        for first, n in batch:
            i, end = first, first + n
            while i < end:
                off = (i & mask) << 6
                if ((ring[off + 1] << 8) | ring[off + 2]) != (i & 0xFFFF) or \
                        ((ring[off + 4] << 16) | (ring[off + 5] << 8) | ring[off + 6]) != qpn:
                    break
                ds = ring[off + 7] & 0x3F
                nwqe += 1
                i += (ds + 3) >> 2 or 1
            if i > first:
                sid = rec.side_wqe(qpn, first, sq.log_size, sq.read(first, i - first))
                rows.append((tsc, _DBWQE, first & 0xFFFF, qpn, sid))
                truth.status.append((qp.gid, first, i - first, REC_RECOVERED))
            if i < end:
                rec.ev(thread, now, _LOST, i & 0xFFFF, qpn, end - i, ext=(0, 0, E.WQE_LOST_OVERWRITTEN, 0))
                self.c.wqe_lost += end - i
                truth.status.append((qp.gid, i, end - i, REC_LOST))
        return nwqe * self.t.parse_ns_per_wqe

    def flush(self, t_end):
        """At exit the tracer copies and parses what is still pending."""
        if self.pending:
            batch, self.pending, self.pending_n = self.pending, [], 0
            self.parse(batch, self.thread, self.rec, now=t_end)


def recovery_helper(cluster, rec, thread, store):
    """Non-blocking mode: a helper thread copies and parses batches; doorbells never wait."""
    env = cluster.env
    store.busy_until = float("-inf")   # a closed-form run (gpu.PE.post_quiet_run) may have kept it busy
    while True:
        poller, batch = yield store.get()
        if store.busy_until > env.now:
            yield env.timeout(store.busy_until - env.now)
        store.busy_until = float("inf")
        yield env.timeout(poller._copy_ns(batch))
        cost = poller.parse(batch, thread, rec)
        yield env.timeout(cost)
        store.busy_until = env.now


# ---------------------------------------------------------------------------------
# CPU proxy threads (NCCL-style net/IB proxy) posting verbs work requests.
#
# A proxy thread owns one RC QP (and its CQ).  ibv_post_send writes genuine mlx5
# WQEs into the QP's send queue (host memory), stores the DBR (BE32 of the new
# producer counter at DBR+4) and rings the doorbell as rdma-core does: the first
# 8 bytes of the last WQE's ctrl segment, a posted write reaching the NIC
# mmio_write_ns later (nic.Nic.uar_store_ctrl).  The NIC model executes the WQEs;
# completions appear in the CQ ring (owner bit) when their DMA lands.
# ibv_poll_cq is a loop polling every `poll_interval_ns`; the empty polls before
# a completion lands are computed in closed form (they are at fixed instants and
# return 0) and the thread sleeps once until the poll that finds it.
# What is recorded follows the native verbs provider (native/src/providers/ibv/
# ibv_hot.c) per mode:
#   aggregate  counters (IBV_SEND_WR, opcode, qpn, peer), (IBV_RECV_WR, 0, qpn, peer),
#              (IBV_WC, status|opcode<<8, qpn, peer), peer = dest QPN | peer node << 32
#   simple     IBV_POST_SEND / IBV_POST_RECV per call: aux num_wr, arg bytes;
#              EXT x0 first wr_id, x1 first opcode (send), x2 ret
#   full       + IBV_SEND_WR per WR (aux opcode|flags<<8, arg wr_id; EXT raddr,
#              num_sge, rkey, bytes) written before its IBV_POST_SEND, IBV_RECV_WR per
#              WR, IBV_POLL_CQ per poll (aux returned, arg requested; every empty one, as the
#              recorder under SIGMATRACE_IDLE_POLLS=each -- header option idle_polls), IBV_WC per
#              completion (aux status|opcode<<8, arg wr_id; EXT imm, wc_flags, byte_len)
# ---------------------------------------------------------------------------------
IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM = 0, 1
IBV_SEND_SIGNALED, IBV_SEND_INLINE = 2, 8
IBV_WC_RDMA_WRITE, IBV_WC_RECV_RDMA_WITH_IMM = 1, 129
_IBV_TO_MLX5 = {IBV_WR_RDMA_WRITE: 0x08, IBV_WR_RDMA_WRITE_WITH_IMM: 0x09}
_V = {n: T[n] for n in ("IBV_POST_SEND", "IBV_SEND_WR", "IBV_POST_RECV", "IBV_RECV_WR", "IBV_POLL_CQ", "IBV_WC")}


class SendWR:
    """struct ibv_send_wr as the proxy fills it (one SGE, or inline data)."""
    __slots__ = ("wr_id", "opcode", "flags", "raddr", "rkey", "laddr", "lkey", "length", "inline")

    def __init__(self, wr_id, opcode, flags, raddr, rkey, laddr, lkey, length, inline=None):
        self.wr_id, self.opcode, self.flags = wr_id, opcode, flags
        self.raddr, self.rkey, self.laddr, self.lkey, self.length, self.inline = raddr, rkey, laddr, lkey, length, inline


class CpuProxy:
    """One NCCL proxy thread with its QP and CQ, recording verbs calls like the native tracer."""

    def __init__(self, cluster, pe, qp, rec, thread, cq_id, peer_key, poll_interval_ns=1000.0, requested=16):
        self.c, self.env, self.t = cluster, cluster.env, cluster.timing
        self.mode = cluster.tracer.mode
        self.pe, self.qp, self.rec, self.thread = pe, qp, rec, thread
        self.cq_id, self.peer_key = cq_id, peer_key
        self.iv, self.requested = poll_interval_ns, requested
        self.send_out = deque()   # (wqe index, wr_id, signalled, opcode, length) in post order
        self.recv_out = deque()   # wr_ids of posted receive WRs
        self.clock_busy = 0.0

    # -- recording -------------------------------------------------------------
    def _agg(self, etype, aux, obj, nbytes):
        self.rec.aggregate(self.thread, etype, aux, obj, self.peer_key, 1, nbytes)

    # -- ibv_post_send ---------------------------------------------------------
    def post_send(self, wrs):
        """Write the WQEs, DBR, then the 8-byte doorbell; record; costs cpu_post_ns."""
        env, t, qp = self.env, self.t, self.qp
        sq = qp.sq
        t0 = env.now
        n = 0
        for wr in wrs:
            n += 1
        while sq.resv_head + n - sq.cons_idx > sq.depth:   # send queue full: ENOMEM in verbs; NCCL waits
            yield from self.poll_until(lambda: sq.resv_head + n - sq.cons_idx <= sq.depth)
            t0 = env.now
        idx = sq.resv_head
        last = idx
        for wr in wrs:
            if wr.inline is not None:
                op = (W.K_INLINE, W.RDMA_WRITE, 1, len(wr.inline), wr.raddr, 0, 0, 0, wr.inline, 1, 0)
            else:
                op = (W.K_RDMA, _IBV_TO_MLX5[wr.opcode], 1, wr.length, wr.raddr, wr.laddr, 0, 0, None, 1, 0)
            sig = bool(wr.flags & IBV_SEND_SIGNALED)
            sq.write_op(idx, op, qp.qpn, wr.rkey, wr.lkey, W.CQ_UPDATE if sig else 0)
            self.send_out.append((idx, wr.wr_id, sig, wr.opcode, wr.length))
            last = idx
            idx += op[2]
        sq.resv_head = sq.prod_idx = idx
        sq.update_dbr(idx)
        off = (last & sq.mask) * W.WQEBB
        raw = int.from_bytes(sq.ring[off:off + 8], "little")
        qp.nic.uar_store_ctrl(qp, raw, t0 + t.cpu_post_ns + t.mmio_write_ns)
        # the tracer's records (time of the call, written after it returned)
        rec, th = self.rec, self.thread
        if self.mode == "aggregate":
            for wr in wrs:
                self._agg(_V["IBV_SEND_WR"], wr.opcode, qp.qpn, wr.length)
        else:
            total = 0
            for wr in wrs:
                total += wr.length
                if self.mode == "full":
                    rec.ev(th, t0, _V["IBV_SEND_WR"], wr.opcode | (wr.flags << 8), qp.qpn, wr.wr_id,
                           ext=(wr.raddr, 1, wr.rkey, wr.length))
            rec.ev(th, t0, _V["IBV_POST_SEND"], len(wrs), qp.qpn, total, ext=(wrs[0].wr_id, wrs[0].opcode, 0, 0))
        yield env.timeout(t.cpu_post_ns + (0 if self.mode == "aggregate" else t.cpu_record_ns))

    # -- ibv_post_recv -----------------------------------------------------------
    def post_recv(self, wr_id, addr, lkey, length=0):
        env, t, qp = self.env, self.t, self.qp
        t0 = env.now
        self.recv_out.append(wr_id)
        rec, th = self.rec, self.thread
        if self.mode == "aggregate":
            self._agg(_V["IBV_RECV_WR"], 0, qp.qpn, length)
        else:
            if self.mode == "full":
                rec.ev(th, t0, _V["IBV_RECV_WR"], 1, qp.qpn, wr_id, ext=(addr, 0, lkey, length))
            rec.ev(th, t0, _V["IBV_POST_RECV"], 1, qp.qpn, length, ext=(wr_id, 0, 0, 0))
        yield env.timeout(t.cpu_post_ns)

    # -- ibv_poll_cq loop ----------------------------------------------------------
    def _completions(self, now):
        """One ibv_poll_cq(cq, requested): work completions from the CQ ring, in order."""
        cq = self.qp.cq
        out = []
        while len(out) < self.requested:
            e = cq.poll_entry(now)
            if e is None:
                break
            cqe_op, qpn, counter, byte_cnt = e
            if cqe_op == nic_mod.CQE_RESP_WR_IMM:
                out.append((self.recv_out.popleft(), IBV_WC_RECV_RDMA_WITH_IMM, byte_cnt, 1, qpn))
                continue
            while self.send_out:   # a signalled CQE completes every WR up to it
                idx, wr_id, sig, opcode, length = self.send_out.popleft()
                if sig and (idx & 0xFFFF) == counter:
                    self.qp.sq.cons_idx = idx + 1
                    out.append((wr_id, IBV_WC_RDMA_WRITE, length, 0, qpn))
                    break
        return out

    def poll_until(self, done):
        """Poll the CQ every poll_interval_ns until done() holds; returns the completions seen."""
        env, cq = self.env, self.qp.cq
        iv = self.iv
        t0 = env.now
        k = 0
        got = []
        rec, th, full = self.rec, self.thread, self.mode == "full"
        while not done():
            if not cq.pending and not cq.has_entry():
                yield cq.wait()          # processed when the next CQE lands (CPU CQ: no extra delay)
            t_c = max(env.now, cq.pending[0][0]) if cq.pending else env.now
            kk = max(k, -(-(t_c - t0) // iv))
            if full:   # the empty polls before the completion landed (closed form)
                for j in range(k, int(kk)):
                    rec.ev(th, t0 + j * iv, _V["IBV_POLL_CQ"], 0, self.cq_id, self.requested)
            t_poll = t0 + kk * iv
            if t_poll > env.now:
                yield env.timeout(t_poll - env.now)
            wcs = self._completions(env.now)
            k = int(kk) + 1
            if full:
                rec.ev(th, env.now, _V["IBV_POLL_CQ"], len(wcs), self.cq_id, self.requested)
            for j, (wr_id, wc_op, blen, imm, qpn) in enumerate(wcs):
                if self.mode == "aggregate":
                    self._agg(_V["IBV_WC"], wc_op << 8, qpn, blen)
                elif full:
                    rec.ev(th, env.now + 5.0 + 10.0 * j, _V["IBV_WC"], wc_op << 8, qpn, wr_id,
                           ext=(0, 0, blen, 0))
            got.extend(wcs)
            yield env.timeout(self.t.cpu_poll_ns)
        return got
