"""GPU side: symmetric memory and the NVSHMEM/IBGDA-style posting sequence.

A PE is one GPU (one process).  Its kernel is a set of SimPy processes (thread
blocks).  An RDMA operation follows the device-side sequence of reference/mlx5.md
§5.4: reserve WQEBBs on the QP (waiting on the CQ when the ring is full), store the
WQE segments into the SQ ring in GPU memory, store the DBR (BE32 of the new
producer index), then one 8-byte doorbell store {BE32(pi<<8), BE32(qpn<<8)} to
the UAR mapping.  The doorbell is a posted PCIe write: it lands mmio_write_ns later
at the NIC register, or, with the tracer's hijack, in a pinned host page.
"""
from . import wqe as W
from .nic import at

HEAP_BASE = 0x7F0000000000
RKEY_BASE = 0x00A00000
LKEY_BASE = 0x00B00000


def heap_base(rank):
    return HEAP_BASE + (rank << 34)


class Memory:
    """Words of a PE's symmetric heap that someone waits on (flags, counters)."""

    def __init__(self, env):
        self.env = env
        self.words = {}
        self.waiters = {}

    def get(self, addr):
        return self.words.get(addr, 0)

    def apply(self, kind, addr, a, b):
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
        return ev


class Op:
    """One work request as the GPU builds it."""
    __slots__ = ("opcode", "nbytes", "raddr", "laddr", "a", "b", "payload", "sges", "tag", "nwqebb")

    def __init__(self, opcode, nbytes=0, raddr=0, laddr=0, a=0, b=0, payload=None, sges=1, tag=0):
        self.opcode, self.nbytes, self.raddr, self.laddr = opcode, nbytes, raddr, laddr
        self.a, self.b, self.payload, self.sges, self.tag = a, b, payload, sges, tag
        if opcode == W.ATOMIC_MASKED_CS:
            self.nwqebb = 2
        elif payload is not None:
            self.nwqebb = (2 + (4 + len(payload) + 15) // 16 + 3) // 4
        elif opcode in (W.RDMA_WRITE, W.RDMA_READ):
            self.nwqebb = (2 + sges + 3) // 4
        else:
            self.nwqebb = 1
        if payload is not None:
            self.nbytes = len(payload)

    def encode(self, idx, qpn, rkey, lkey, fm):
        op = self.opcode
        if self.payload is not None:
            return W.write_inline(idx, qpn, self.raddr, rkey, self.payload, fm)
        if op in (W.RDMA_WRITE, W.RDMA_READ):
            return W.rdma(op, idx, qpn, self.raddr, rkey, self.nbytes, self.laddr, lkey, fm, self.sges)
        if op in (W.ATOMIC_FA, W.ATOMIC_CS):
            return W.atomic(op, idx, qpn, self.raddr, rkey, self.laddr, lkey, self.a, self.b, fm)
        if op == W.ATOMIC_MASKED_FA:
            return W.masked_fa32(idx, qpn, self.raddr, rkey, self.laddr, lkey, self.a, fm)
        if op == W.ATOMIC_MASKED_CS:
            return W.masked_cs64(idx, qpn, self.raddr, rkey, self.laddr, lkey, self.a, self.b, fm)
        raise ValueError(f"opcode {op:#x} not modelled")


class PE:
    """One GPU with its NVSHMEM-like device API (generators to `yield from`)."""

    def __init__(self, cluster, rank, node, local, nic):
        self.cluster = cluster
        self.env = cluster.env
        self.t = cluster.timing
        self.rank, self.node, self.local = rank, node, local
        self.nic = nic
        self.mem = Memory(self.env)
        self.qps = {}             # peer rank -> QueuePair
        self.base = heap_base(rank)
        self.rkey = RKEY_BASE | rank
        self.lkey = LKEY_BASE | rank
        self.scratch = self.base + (1 << 30)   # local buffer for fetch results / sources

    # -- addresses -------------------------------------------------------
    def remote(self, peer, offset):
        return heap_base(peer) + offset

    # -- the posting sequence ---------------------------------------------
    def post(self, peer, ops, tag=0, signal="last"):
        """Post `ops` on the QP to `peer` and ring one doorbell covering them all."""
        qp = self.qps[peer]
        sq = qp.sq
        t = self.t
        n = 0
        for op in ops:
            n += op.nwqebb
        yield self.env.timeout(t.gpu_issue_ns + n * t.wqe_store_ns + t.dbr_store_ns + t.db_store_ns)
        while sq.resv_head + n - sq.cons_idx > sq.depth:   # ring full: poll the CQ for credits
            yield from self._wait_cons(qp, sq.resv_head + n - sq.depth)
        base = sq.resv_head
        sq.resv_head = base + n
        now = self.env.now
        truth = self.cluster.truth
        peer_pe = qp.peer.pe
        rkey = peer_pe.rkey
        idx = base
        last = len(ops) - 1
        for k, op in enumerate(ops):
            sig = signal == "all" or k == last
            fm = W.CQ_UPDATE if sig else 0
            sq.write(idx, op.encode(idx, qp.qpn, rkey, self.lkey, fm))
            qp.outstanding.append((idx, op.nwqebb, sig))
            qp.truth_rows[idx] = truth.wqe(self, qp, idx, op, now, tag or op.tag)
            idx += op.nwqebb
        # DBR then the 8-byte doorbell (atomicMax(prod_idx) under the post lock)
        sq.prod_idx = idx
        sq.update_dbr(idx)
        raw = W.doorbell_raw(idx, qp.qpn)
        db_id = truth.doorbell(self, qp, idx, raw, now, now + t.mmio_write_ns, len(ops))
        at(self.env, now + t.mmio_write_ns, qp.uar.store, raw, db_id)
        return base

    def _wait_cons(self, qp, target):
        """Poll the CQ (owner-bit test) until the WQEBBs before `target` are completed."""
        sq = qp.sq
        while sq.cons_idx < target:
            w = qp.cq.poll()
            if w is None:
                yield qp.cq.wait()
                yield self.env.timeout(self.t.gpu_poll_ns)
                continue
            out = qp.outstanding
            k = 0
            while k < len(out):
                idx, nw, sig = out[k]
                k += 1
                if (idx & 0xFFFF) == w and sig:
                    sq.cons_idx = idx + nw
                    break
            del out[:k]
            qp.cq.notify()   # other blocks polling this CQ re-check the consumer index

    def quiet(self, peers=None):
        """nvshmem_quiet: wait until every WQE posted so far has completed."""
        qps = self.qps.values() if peers is None else [self.qps[p] for p in peers]
        for qp in qps:
            if qp.sq.cons_idx < qp.sq.resv_head:
                yield from self._wait_cons(qp, qp.sq.resv_head)

    def wait_until(self, addr, value):
        """Spin on a local symmetric word until it is >= value."""
        while self.mem.get(addr) < value:
            yield self.mem.changed(addr)
        yield self.env.timeout(self.t.gpu_poll_ns)

    # -- convenience ops ----------------------------------------------------
    def put(self, peer, offset, nbytes, tag=0, sges=1):
        return Op(W.RDMA_WRITE, nbytes, self.remote(peer, offset), self.scratch, sges=sges, tag=tag)

    def get(self, peer, offset, nbytes, tag=0):
        return Op(W.RDMA_READ, nbytes, self.remote(peer, offset), self.scratch, tag=tag)

    def fetch_add(self, peer, offset, value, tag=0):
        return Op(W.ATOMIC_FA, 8, self.remote(peer, offset), self.scratch, a=value, tag=tag)

    def add32(self, peer, offset, value, tag=0):
        return Op(W.ATOMIC_MASKED_FA, 4, self.remote(peer, offset), self.scratch, a=value, tag=tag)

    def cas(self, peer, offset, swap, compare, tag=0):
        return Op(W.ATOMIC_CS, 8, self.remote(peer, offset), self.scratch, a=swap, b=compare, tag=tag)

    def set64(self, peer, offset, value, tag=0):
        return Op(W.ATOMIC_MASKED_CS, 8, self.remote(peer, offset), self.scratch, a=value, tag=tag)

    def flag(self, peer, offset, value, tag=0):
        """A 4-byte inline RDMA write (signal / flag), as DeepEP does."""
        return Op(W.RDMA_WRITE, 4, self.remote(peer, offset), 0, payload=int(value).to_bytes(4, "little"), tag=tag)
