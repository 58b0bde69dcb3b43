"""GPU side: symmetric memory and the NVSHMEM/IBGDA-style posting sequence.

A PE is one GPU (one process).  Its kernel is a set of SimPy processes (thread
blocks).  An RDMA operation follows the device-side sequence of reference/mlx5.md
§5.4: reserve WQEBBs on the QP (waiting on the CQ when the ring is full), store the
WQE segments into the SQ ring in GPU memory, store the DBR (BE32 of the new
producer index), then one 8-byte doorbell store {BE32(pi<<8), BE32(qpn<<8)} to
the UAR mapping.  The doorbell is a posted PCIe write: it lands mmio_write_ns later
at the NIC register, or, with the tracer's hijack, in a pinned host page.

Per post, a block spends one SimPy timeout (the issue/store latencies) and then
does the reserve/write/DBR/doorbell step at one instant: the landing of the
posted write is not an event, the page/NIC is told the landing time
(nic.UarPage.store).  A block waits (SimPy events) only where the hardware
waits: for ring space or completions (CQ) and on symmetric-memory words.

Operations are plain tuples (cheap to build), fields OP_*:
  (kind, opcode, nwqebb, nbytes, raddr, laddr, a, b, payload, sges, tag)
kind selects the WQE template (wqe.K_*); a/b are add/swap and compare values.
"""
from . import wqe as W

HEAP_BASE = 0x7F0000000000
RKEY_BASE = 0x00A00000
LKEY_BASE = 0x00B00000


def heap_base(rank):
    return HEAP_BASE + (rank << 34)


OP_KIND, OP_OPCODE, OP_NWQEBB, OP_NBYTES, OP_RADDR, OP_LADDR, OP_A, OP_B, OP_PAYLOAD, OP_SGES, OP_TAG = range(11)
_OPMOD = {W.ATOMIC_MASKED_FA: 0x08, W.ATOMIC_MASKED_CS: 0x09}


class Memory:
    """Words of a PE's symmetric heap that someone reads or waits on (flags, counters).

    Remote effects (NIC atomics, inline writes) sit on the cluster's effect
    timeline until their responder time; every read or local update first
    applies the effects that are due (Cluster.drain), so memory is always what
    it would be with one event per effect."""

    def __init__(self, env, cluster=None):
        self.env = env
        self.cluster = cluster
        self.words = {}
        self.waiters = {}
        self.pending = {}    # addr -> [responder times of effects not yet applied]

    def get(self, addr):
        c = self.cluster
        if c is not None and c.effects and c.effects[0][0] <= self.env.now:
            c.drain(self.env.now)
        return self.words.get(addr, 0)

    def apply(self, kind, addr, a, b):
        """A local (device-side) update, after the remote effects that are due."""
        c = self.cluster
        if c is not None and c.effects and c.effects[0][0] <= self.env.now:
            c.drain(self.env.now)
        return self._apply(kind, addr, a, b)

    def _apply(self, kind, addr, a, b):
        old = self.words.get(addr, 0)
        if kind == "add":
            self.words[addr] = old + a
        elif kind == "set":
            self.words[addr] = a
        elif kind == "cas":
            if old == b:
                self.words[addr] = a
        ev = self.waiters.pop(addr, None)
        if ev is not None:
            ev.succeed()
        return old

    def changed(self, addr):
        ev = self.waiters.get(addr)
        if ev is None:
            ev = self.waiters[addr] = self.env.event()
            times = self.pending.get(addr)
            if times:   # an effect on this word is already on its way: wake up when it lands
                self.cluster.wake_at(min(times))
        return ev


class PE:
    """One GPU with its NVSHMEM-like device API (generators to `yield from`)."""

    def __init__(self, cluster, rank, node, local, nic):
        self.cluster = cluster
        self.env = cluster.env
        self.t = cluster.timing
        self.rank, self.node, self.local = rank, node, local
        self.nic = nic
        self.mem = Memory(self.env, cluster)
        self.qps = {}             # peer rank -> QueuePair
        self.base = heap_base(rank)
        self.rkey = RKEY_BASE | rank
        self.lkey = LKEY_BASE | rank
        self.scratch = self.base + (1 << 30)   # local buffer for fetch results / sources
        self.phase = 0

    # -- addresses -------------------------------------------------------
    def remote(self, peer, offset):
        return heap_base(peer) + offset

    # -- the posting sequence ---------------------------------------------
    def post(self, peer, ops, tag=0, signal="last"):
        """Post `ops` on the QP to `peer` and ring one doorbell covering them all."""
        qp = self.qps[peer]
        sq = qp.sq
        t = self.t
        env = self.env
        n = 0
        for op in ops:
            n += op[2]
        yield env.timeout(t.gpu_issue_ns + n * t.wqe_store_ns + t.dbr_store_ns + t.db_store_ns)
        while sq.resv_head + n - sq.cons_idx > sq.depth:   # ring full: poll the CQ for credits
            yield from self._wait_cons(qp, sq.resv_head + n - sq.depth)
        base = sq.resv_head
        sq.resv_head = base + n
        now = env.now
        truth = self.cluster.truth
        rkey = qp.peer.pe.rkey
        lkey = self.lkey
        qpn = qp.qpn
        gid = qp.gid
        phase = self.phase
        db_id = truth.n_doorbells
        wid = truth.n_wqes
        rows = truth.wqe_rows
        outstanding = qp.outstanding
        truth_rows = qp.truth_rows
        idx = base
        last = len(ops) - 1
        every = signal == "all"
        for k, op in enumerate(ops):
            sig = every or k == last
            sq.write_op(idx, op, qpn, rkey, lkey, W.CQ_UPDATE if sig else 0)
            nw = op[2]
            outstanding.append((idx, nw, sig))
            truth_rows[idx] = wid
            opcode = op[1]
            rows.append((gid, idx, nw, opcode, _OPMOD.get(opcode, 0), op[3], op[4], op[5], now, db_id,
                         tag or op[10], phase))
            wid += 1
            idx += nw
        truth.n_wqes = wid
        # DBR then the 8-byte doorbell (atomicMax(prod_idx) under the post lock)
        sq.prod_idx = idx
        sq.update_dbr(idx)
        raw = qp.raw_qpn | ((idx >> 8) & 0xFF) << 8 | (idx & 0xFF) << 16   # == wqe.doorbell_raw(idx, qpn)
        t_land = now + t.mmio_write_ns
        truth.doorbell_rows.append((gid, idx, raw, len(ops), now, t_land))
        truth.n_doorbells = db_id + 1
        qp.uar.store(raw, db_id, t_land)
        return base

    def _wait_cons(self, qp, target):
        """Poll the CQ (owner-bit test) until the WQEBBs before `target` are completed.

        An empty poll waits for the CQ's wake-up (next CQE landing + one poll round
        trip; nic.CompletionQueue.wait) instead of spinning event by event."""
        sq = qp.sq
        cq = qp.cq
        out = qp.outstanding
        while sq.cons_idx < target:
            w = cq.poll()
            if w is None:
                yield cq.wait()
                continue
            while out:
                idx, nw, sig = out.popleft()
                if sig and (idx & 0xFFFF) == w:
                    sq.cons_idx = idx + nw
                    break
        c = self.cluster
        if c.effects and c.effects[0][0] <= self.env.now:
            c.drain(self.env.now)    # fetched values (atomics) are in qp.results from here on

    def quiet(self, peers=None):
        """nvshmem_quiet: wait until every WQE posted so far has completed."""
        qps = self.qps.values() if peers is None else [self.qps[p] for p in peers]
        for qp in qps:
            if qp.sq.cons_idx < qp.sq.resv_head:
                yield from self._wait_cons(qp, qp.sq.resv_head)

    def wait_until(self, addr, value):
        """Spin on a local symmetric word until it is >= value."""
        mem = self.mem
        while mem.get(addr) < value:
            yield mem.changed(addr)
        yield self.env.timeout(self.t.gpu_poll_ns)

    # -- convenience ops (operation tuples, fields OP_*) ------------------------
    def put(self, peer, offset, nbytes, tag=0, sges=1):
        return (W.K_RDMA, W.RDMA_WRITE, (5 + sges) // 4, nbytes, heap_base(peer) + offset, self.scratch, 0, 0,
                None, sges, tag)

    def get(self, peer, offset, nbytes, tag=0):
        return (W.K_RDMA, W.RDMA_READ, 1, nbytes, heap_base(peer) + offset, self.scratch, 0, 0, None, 1, tag)

    def fetch_add(self, peer, offset, value, tag=0):
        return (W.K_ATOMIC, W.ATOMIC_FA, 1, 8, heap_base(peer) + offset, self.scratch, value, 0, None, 1, tag)

    def add32(self, peer, offset, value, tag=0):
        return (W.K_MFA32, W.ATOMIC_MASKED_FA, 1, 4, heap_base(peer) + offset, self.scratch, value, 0, None, 1, tag)

    def cas(self, peer, offset, swap, compare, tag=0):
        return (W.K_ATOMIC, W.ATOMIC_CS, 1, 8, heap_base(peer) + offset, self.scratch, swap, compare, None, 1, tag)

    def set64(self, peer, offset, value, tag=0):
        return (W.K_MCS64, W.ATOMIC_MASKED_CS, 2, 8, heap_base(peer) + offset, self.scratch, value, 0, None, 1, tag)

    def flag(self, peer, offset, value, tag=0):
        """A 4-byte inline RDMA write (signal / flag), as DeepEP does."""
        payload = int(value).to_bytes(4, "little")
        return (W.K_INLINE, W.RDMA_WRITE, (2 + (4 + len(payload) + 15) // 16 + 3) // 4, len(payload),
                heap_base(peer) + offset, 0, 0, 0, payload, 1, tag)
