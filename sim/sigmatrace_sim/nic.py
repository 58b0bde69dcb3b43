"""mlx5 NIC: UAR doorbell register, send queue ring, doorbell record, CQ, execution.

Send queue (reference/mlx5.md §1.1, §3.4): a ring of 2^log_sq_size 64-byte WQEBBs
in GPU memory.  All producer/consumer counters count WQEBBs; the ctrl wqe_index,
the DBR value and the doorbell carry them modulo 2^16; the slot is the counter
masked by depth-1.  A WQE of k WQEBBs that starts in the last slot continues at
slot 0.

The NIC keeps the full producer index it was told.  A doorbell carries only 16
bits: the NIC advances by (pi16 - last_pi16) mod 2^16, so a doorbell that covers
several posts (a coalesced or batched one) makes it fetch every WQE up to that
index.  It fetches WQEs by DMA from the ring *at fetch time* (so it executes the
bytes the GPU really wrote), executes them in order on the QP, moves the bytes
over the fabric, applies remote effects (atomics, inline writes) at the
responder and writes a CQE with the owner bit for every signalled WQE.
"""
import struct

from . import wqe as W

CQE_REQ = 0x0
_CQE_TAIL = struct.Struct(">IHBB")  # sop_drop_qpn, wqe_counter, signature, op_own (bytes 56..63)
_RADDR = struct.Struct(">QI")
_ATOM = struct.Struct(">QQ")
_MFA = struct.Struct(">I")


def at(env, t, fn, *args):
    """Call fn(*args) at absolute simulated time t (one SimPy event)."""
    ev = env.timeout(max(0.0, t - env.now))
    ev.callbacks.append(lambda _e: fn(*args))
    return ev


class SendQueue:
    def __init__(self, depth, start_index=0):
        if depth & (depth - 1) or depth < 2:
            raise ValueError("SQ depth must be a power of two")
        self.depth = depth
        self.mask = depth - 1
        self.log_size = depth.bit_length() - 1
        self.ring = bytearray(depth * W.WQEBB)
        self.resv_head = start_index   # GPU: next WQEBB to reserve (full counter)
        self.prod_idx = start_index    # GPU: highest producer index rung (atomicMax)
        self.nic_pi = start_index      # NIC: producer index it was told
        self.cons_idx = start_index    # GPU: WQEBBs known completed (from the CQ)
        self.dbr = bytearray(8)        # doorbell record: RQ counter @0, SQ counter @4 (BE32)

    def write(self, index, data):
        """GPU stores of a WQE starting at WQEBB `index` (wraps to slot 0)."""
        off = (index & self.mask) * W.WQEBB
        end = off + len(data)
        if end <= len(self.ring):
            self.ring[off:end] = data
        else:
            first = len(self.ring) - off
            self.ring[off:] = data[:first]
            self.ring[: len(data) - first] = data[first:]

    def read(self, index, nwqebb):
        off = (index & self.mask) * W.WQEBB
        end = off + nwqebb * W.WQEBB
        if end <= len(self.ring):
            return bytes(self.ring[off:end])
        return bytes(self.ring[off:]) + bytes(self.ring[: end - len(self.ring)])

    def update_dbr(self, pi):
        struct.pack_into(">I", self.dbr, 4, pi & 0xFFFF)

    def in_flight(self):
        return self.resv_head - self.cons_idx


class CompletionQueue:
    """CQ ring of 64-byte CQEs with the owner bit; fresh entries are 0xff (INVALID)."""

    def __init__(self, env, depth, cqn):
        self.env = env
        self.depth = depth
        self.log_size = depth.bit_length() - 1
        self.cqn = cqn
        self.ring = bytearray(b"\xff" * (depth * 64))
        self.pi = 0     # NIC producer
        self.ci = 0     # GPU consumer
        self._event = env.event()

    def post(self, qpn, wqe_counter, opcode, byte_cnt=0):
        slot = self.pi & (self.depth - 1)
        owner = (self.pi >> self.log_size) & 1
        off = slot * 64
        self.ring[off:off + 64] = bytes(64)
        struct.pack_into(">I", self.ring, off + 44, byte_cnt)
        _CQE_TAIL.pack_into(self.ring, off + 56, (opcode << 24) | qpn, wqe_counter & 0xFFFF, 0,
                            (CQE_REQ << 4) | owner)
        self.pi += 1
        self.notify()

    def notify(self):
        ev, self._event = self._event, self.env.event()
        ev.succeed()

    def poll(self):
        """GPU side: the next valid CQE's wqe_counter, or None (owner-bit test, ref §2.2)."""
        off = (self.ci & (self.depth - 1)) * 64
        op_own = self.ring[off + 63]
        if (op_own >> 4) == 0xF or (op_own & 1) != ((self.ci >> self.log_size) & 1):
            return None
        self.ci += 1
        return struct.unpack_from(">H", self.ring, off + 60)[0]

    def wait(self):
        return self._event


class QueuePair:
    """Requester side of an RC connection as the model needs it."""

    def __init__(self, env, qpn, pe, nic, depth, cqn, start_index=0):
        self.qpn = qpn
        self.pe = pe
        self.nic = nic
        self.sq = SendQueue(depth, start_index)
        self.cq = CompletionQueue(env, depth, cqn)
        self.peer = None          # remote QueuePair
        self.uar = None           # UarPage the GPU writes
        self.outstanding = []     # GPU: [(full index, nwqebb, signalled)] in post order
        self.truth_rows = {}      # full WQE index -> truth row (filled by the NIC)
        self.results = {}         # full WQE index -> value fetched by an atomic
        self.last_cqe_t = 0.0
        self.gid = None           # global id in the cluster


class UarPage:
    """The 8-byte doorbell register as the GPU sees it.

    Without the tracer (baseline) it is the NIC's BAR register: a store reaches
    the NIC.  With the hijack installed it is a pinned host page: a store only
    changes memory, and the poller thread must see it and forward it.
    """

    def __init__(self, env, nic, page_id, reg_addr):
        self.env = env
        self.nic = nic
        self.page_id = page_id
        self.reg_addr = reg_addr
        self.hijacked = False
        self.value = 0
        self.seq = 0              # number of stores that reached the page
        self.unseen = []          # truth ids of stores the poller has not observed yet
        self._event = env.event()

    def store(self, raw, db_id):
        if not self.hijacked:
            self.nic.uar_store(raw, db_id)
            return
        self.value = raw
        self.seq += 1
        self.unseen.append(db_id)
        if not self._event.triggered:
            self._event.succeed()

    def changed(self):
        if self._event.triggered:
            self._event = self.env.event()
        return self._event


class Nic:
    def __init__(self, env, cluster, node, index, name, guid, port):
        self.env = env
        self.cluster = cluster
        self.t = cluster.timing
        self.fabric = cluster.fabric
        self.node = node
        self.index = index
        self.name = name
        self.guid = guid
        self.port = port
        self.qps = {}
        self.free_at = 0.0
        self.doorbells = 0
        self.stale_doorbells = 0

    def uar_store(self, raw, db_id=None):
        """An 8-byte doorbell write reaches the UAR register (from the GPU or the poller)."""
        pi16, qpn = W.parse_doorbell_raw(raw)
        qp = self.qps[qpn]
        sq = qp.sq
        delta = (pi16 - sq.nic_pi) & 0xFFFF
        self.doorbells += 1
        if delta == 0 or delta > sq.depth:
            self.stale_doorbells += 1   # older or repeated value: the NIC keeps the highest
            return
        start, new = sq.nic_pi, sq.nic_pi + delta
        sq.nic_pi = new
        t = self.t
        now = self.env.now
        t_fetch = max(now + t.nic_db_ns, self.free_at) + t.nic_fetch_ns + delta * t.nic_fetch_ns_per_wqebb
        i = start
        while i < new:
            head = sq.read(i, 1)
            ds = head[7] & 0x3F
            nw = max(1, (ds + 3) // 4)
            data = head if nw == 1 else sq.read(i, nw)
            t_fetch = self._execute(qp, i, data, t_fetch)
            i += nw

    def _execute(self, qp, index, data, t_ready):
        t = self.t
        opcode, opmod, idx16, qpn, ds = W.peek(data)
        signalled = data[11] & W.CQ_UPDATE
        start = max(t_ready, self.free_at)
        self.free_at = start + t.nic_exec_ns
        fab = self.fabric
        peer = qp.peer
        src, dst = self.port, peer.nic.port
        nbytes = W.payload_bytes(data)
        raddr, rkey = _RADDR.unpack_from(data, 16) if opcode != W.SEND else (0, 0)
        effect = None
        if opcode in (W.RDMA_WRITE, W.RDMA_WRITE_IMM, W.SEND):
            t_arr = fab.send(src, dst, nbytes, start)
            t_remote = t_arr + t.nic_pcie_write_ns
            t_done = fab.send(dst, src, 0, t_arr)           # ACK
            if data[32] & 0x80 and opcode != W.SEND:         # inline payload: a flag / signal word
                n = nbytes
                val = int.from_bytes(data[36:36 + n], "little")
                effect = ("set", raddr, val, 0)
        elif opcode == W.RDMA_READ:
            t_req = fab.send(src, dst, 16, start)
            t_remote = t_req + t.nic_pcie_read_ns
            t_done = fab.send(dst, src, nbytes, t_remote) + t.nic_pcie_write_ns
        else:  # atomics
            t_req = fab.send(src, dst, 28, start)
            t_remote = t_req + t.nic_atomic_ns
            t_done = fab.send(dst, src, nbytes, t_remote) + t.nic_pcie_write_ns
            if opcode == W.ATOMIC_MASKED_FA:
                effect = ("add", raddr, _MFA.unpack_from(data, 32)[0], 0)
            elif opcode == W.ATOMIC_FA:
                effect = ("add", raddr, _ATOM.unpack_from(data, 32)[0], 0)
            elif opcode == W.ATOMIC_CS:
                swap, cmp_ = _ATOM.unpack_from(data, 32)
                effect = ("cas", raddr, swap, cmp_)
            elif opcode == W.ATOMIC_MASKED_CS:
                swap, cmp_ = _ATOM.unpack_from(data, 32)
                swap_mask, cmp_mask = _ATOM.unpack_from(data, 48)
                effect = ("set", raddr, swap, 0) if cmp_mask == 0 else ("cas", raddr, swap, cmp_)
        t_cqe = max(t_done + t.cqe_write_ns, qp.last_cqe_t)
        qp.last_cqe_t = t_cqe
        row = qp.truth_rows.pop(index, None)
        if row is not None:
            row[0] = t_ready    # fetched
            row[1] = start      # executed
            row[2] = t_remote   # remote memory updated / read
            row[3] = t_cqe      # completion written
        if effect is not None:
            at(self.env, t_remote, self._remote_effect, qp, index, peer.pe, effect)
        if signalled:
            at(self.env, t_cqe, qp.cq.post, qp.qpn, index, opcode, nbytes)
        self.cluster.bytes_moved += nbytes
        return t_ready

    @staticmethod
    def _remote_effect(qp, index, remote_pe, effect):
        kind, addr, a, b = effect
        old = remote_pe.mem.apply(kind, addr, a, b)
        qp.results[index] = old
