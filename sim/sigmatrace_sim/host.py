"""Host side: the tracer's doorbell hijack poller (with WQE recovery).

One poller thread per hijacked UAR page (reference: paper §V).  It parks on the
page (UMWAIT/MWAITX or a spin with back-off) and, once a GPU store has changed
the page, wakes after `poller_wakeup_ns`, reads the *latest* 8 bytes (stores that
came in meanwhile are coalesced: the producer index is monotonic, so the latest
value covers them), records DB_DOORBELL, and forwards the value to the real UAR.

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
"""
from sigmatrace.format import layout as L, events as E

from . import wqe as W
from .capture import REC_LOST, REC_RECOVERED, T
from .nic import at


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
        self.pending = []             # [(first full index, nwqebb)]
        self.pending_n = 0
        self.observed = 0
        self.process = self.env.process(self.run())

    def run(self):
        env, t, cfg = self.env, self.t, self.cfg
        page, qp = self.qp.uar, self.qp
        truth = self.c.truth
        seen_seq = 0
        thr = max(1, int(cfg.batch_threshold))
        rec, th = self.rec, self.thread
        db_type = T["DB_DOORBELL"]
        full = cfg.mode == "full"
        while True:
            if page.seq == seen_seq:
                yield page.changed()
                yield env.timeout(self.wakeup)
            else:
                yield env.timeout(t.poller_check_ns)
            raw = page.value
            seen_seq = page.seq
            ids, page.unseen = page.unseen, []
            now = env.now
            pi16, qpn = W.parse_doorbell_raw(raw)
            delta = (pi16 - self.last_pi) & 0xFFFF
            first = self.last_pi
            self.last_pi += delta
            recording = now >= cfg.record_after_ns
            obs = ids[-1]
            dbs = truth.doorbells
            for k in ids:
                row = dbs[k]
                row[13] = obs
                row[14] = k != obs
                row[15] = recording
            dbs[obs][11] = now
            self.observed += 1
            cost = t.poller_record_ns
            if recording:
                rec.ev(th, now, db_type, pi16, qpn, raw)
                for i in range(first, first + delta):
                    truth.set_traced(qp, i)
                if cfg.recovery and delta:
                    self.pending.append((first, delta))
                    self.pending_n += delta
                    if cfg.hijack == "recovery":
                        cost += t.recovery_enqueue_ns
                    if self.pending_n >= thr:
                        batch, self.pending, self.pending_n = self.pending, [], 0
                        if cfg.hijack == "recovery":
                            yield env.timeout(cost + self._copy_ns(batch))
                            cost = self.parse(batch, th, rec)
                        else:
                            self.helper[1].put((self, batch))
            yield env.timeout(cost)
            t_fwd = env.now + t.poller_forward_ns
            dbs[obs][12] = t_fwd
            if full and recording:
                rec.ev(th, t_fwd, T["DB_FORWARD"], pi16, qpn, rec.clock.tsc(now))
            at(env, t_fwd, qp.nic.uar_store, raw)
            yield env.timeout(t.poller_forward_ns)

    def _copy_ns(self, batch):
        n = sum(b for _, b in batch)
        return self.t.copy_latency_ns + n * 64 / self.t.copy_bw

    def parse(self, batch, thread, rec, now=None):
        """Read the copied slots, verify each ctrl's wqe_index/QPN, record DB_WQE / DB_WQE_LOST.

        Returns the CPU time the parse took."""
        qp = self.qp
        sq = qp.sq
        now = self.env.now if now is None else now
        truth = self.c.truth
        nwqe = 0
        for first, n in batch:
            i, end = first, first + n
            run_start, run = i, []
            while i < end:
                head = sq.read(i, 1)
                opcode, opmod, idx16, qpn, ds = W.peek(head)
                if idx16 != (i & 0xFFFF) or qpn != qp.qpn:
                    break
                nw = max(1, (ds + 3) // 4)
                run.append(head if nw == 1 else sq.read(i, nw))
                truth.set_wqe_status(qp, i, REC_RECOVERED)
                nwqe += 1
                i += nw
            if run:
                sid = rec.side_wqe(qp.qpn, run_start, sq.log_size, b"".join(run))
                rec.ev(thread, now, T["DB_WQE"], run_start & 0xFFFF, qp.qpn, sid)
            if i < end:
                rec.ev(thread, now, T["DB_WQE_LOST"], i & 0xFFFF, qp.qpn, end - i,
                       ext=(0, 0, E.WQE_LOST_OVERWRITTEN, 0))
                self.c.wqe_lost += end - i
                for row_index in range(i, end):
                    truth.set_wqe_status(qp, row_index, REC_LOST)
        return nwqe * self.t.parse_ns_per_wqe

    def flush(self, t_end):
        """At exit the tracer copies and parses what is still pending."""
        if self.pending:
            batch, self.pending, self.pending_n = self.pending, [], 0
            self.parse(batch, self.thread, self.rec, now=t_end)


def recovery_helper(cluster, rec, thread, store):
    """Non-blocking mode: a helper thread copies and parses batches; doorbells never wait."""
    env = cluster.env
    while True:
        poller, batch = yield store.get()
        yield env.timeout(poller._copy_ns(batch))
        cost = poller.parse(batch, thread, rec)
        yield env.timeout(cost)
