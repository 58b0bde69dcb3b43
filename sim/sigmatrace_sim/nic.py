"""mlx5 NIC: UAR doorbell register, send queue ring, doorbell record, CQ, execution.

Send queue (reference/mlx5.md §1.1, §3.4): a ring of 2^log_sq_size 64-byte WQEBBs
in GPU memory.  All producer/consumer counters count WQEBBs; the ctrl wqe_index,
the DBR value and the doorbell carry them modulo 2^16; the slot is the counter
masked by depth-1.  A WQE of k WQEBBs that starts in the last slot continues at
slot 0.

The NIC keeps the full producer index it was told.  A doorbell carries only 16
bits: the NIC advances by (pi16 - last_pi16) mod 2^16, so a doorbell that covers
several posts (a coalesced or batched one) makes it fetch every WQE up to that
index.  It reads the WQEs from the ring (so it executes the bytes the GPU really
wrote), executes them in order on the QP, moves the bytes over the fabric,
applies remote effects (atomics, inline writes) at the responder and writes a
CQE with the owner bit for every signalled WQE.

Closed form instead of per-stage events.  Once a doorbell value reaches the NIC
(`doorbell(qp, pi16, t_arrive)`) everything that follows is deterministic: the
fetch is a DMA after the doorbell decode and behind the NIC's pipeline
(busy-until `free_at`), execution is one slot per WQE on that pipeline, the fabric
ports are busy-until timelines (fabric.py), the CQE lands `cqe_write_ns` after the
ACK/response, in order per QP.  So the whole pipeline of every WQE the doorbell
covers is computed in one call and nothing is scheduled for it, except what
somebody waits on:
  * CQEs go into the CQ's `pending` list with the time their DMA completes; a GPU
    polling the CQ sees them in the ring (owner bit) from that time on
    (CompletionQueue.land), and a GPU waiting on the CQ gets one wake-up event;
  * remote effects (atomic results, inline flag writes) go onto the cluster's
    effect timeline with their responder time; they are applied, in time order,
    before anyone reads that memory (Cluster.drain), and a waiter on a word gets
    one wake-up event at the effect time.
Why this is exact: the NIC reads the ring when the doorbell is processed, before
its modelled fetch time; the GPU cannot change those WQEBBs in between, because a
slot is reused only after its WQE's CQE (consumer index) and these WQEs have not
completed.  Port/pipeline slots are reserved in the order doorbells are
processed, as before (the model always reserved future slots at doorbell time).
"""
import struct
from collections import deque

from simpy.events import Event, NORMAL

from . import wqe as W

CQE_REQ = 0x0
CQE_RESP_WR_IMM = 0x1     # responder: RDMA write with immediate consumed a receive WQE
_CQE_FIELDS = struct.Struct(">I8xIH")   # byte_cnt @44, sop_drop_qpn @56, wqe_counter @60
_CQE = struct.Struct(">44xI8xIHBB")   # a whole 64-byte CQE: byte_cnt @44, sop_drop_qpn, wqe_counter, signature, op_own
_CTRL2 = struct.Struct(">II")
_RADDR = struct.Struct(">QI")
_ATOM = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_DSEG_BC = struct.Struct(">I")


def decode_op(op, fm):
    """(opcode, nwqebb, fm_ce_se, bytes, raddr, remote effect) of WQE `op` as the NIC decodes its bytes.

    Same result as decode_bytes() on what wqe.encode_into wrote (checked when Nic.CHECK_BYTES)."""
    kind, opcode, raddr = op[0], op[1], op[4]
    effect = None
    if kind == W.K_INLINE:
        payload = op[8]
        nbytes = len(payload)
        effect = ("set", raddr, int.from_bytes(payload, "little"), 0)
    elif kind == W.K_RDMA:
        nbytes = op[3]
        if opcode == W.SEND:
            raddr = 0
    elif kind == W.K_ATOMIC:
        nbytes = 8
        effect = ("add", raddr, op[6], 0) if opcode == W.ATOMIC_FA else ("cas", raddr, op[6], op[7])
    elif kind == W.K_MFA32:
        nbytes = 4
        effect = ("add", raddr, op[6] & 0xFFFFFFFF, 0)
    else:   # K_MCS64: compare mask 0, i.e. an unconditional set
        nbytes = 8
        effect = ("set", raddr, op[6], 0)
    return opcode, op[2], fm, nbytes, raddr, effect


def decode_bytes(buf, o):
    """(opcode, nwqebb, fm_ce_se, bytes, raddr, remote effect) parsed from the WQE bytes at buf[o:]."""
    a, b = _CTRL2.unpack_from(buf, o)
    ds = b & 0x3F
    nw = (ds + 3) >> 2 or 1
    opcode = a & 0xFF
    fm = buf[o + 11]
    effect = None
    raddr = 0
    if opcode == W.RDMA_WRITE or opcode == W.RDMA_WRITE_IMM or opcode == W.SEND:
        if opcode != W.SEND:
            raddr = _RADDR.unpack_from(buf, o + 16)[0]
        bc = _DSEG_BC.unpack_from(buf, o + 32)[0]
        if bc & W.INLINE_SEG:      # inline payload: a flag / signal word
            nbytes = bc & 0x7FFFFFFF
            if opcode != W.SEND:
                effect = ("set", raddr, int.from_bytes(buf[o + 36:o + 36 + nbytes], "little"), 0)
        else:
            nbytes = bc
            for k in range(3, ds):
                nbytes += _DSEG_BC.unpack_from(buf, o + 16 * k)[0]
    elif opcode == W.RDMA_READ:
        raddr = _RADDR.unpack_from(buf, o + 16)[0]
        nbytes = 0
        for k in range(2, ds):
            nbytes += _DSEG_BC.unpack_from(buf, o + 16 * k)[0]
    else:  # atomics
        raddr = _RADDR.unpack_from(buf, o + 16)[0]
        if opcode == W.ATOMIC_MASKED_FA:
            effect = ("add", raddr, _U32.unpack_from(buf, o + 32)[0], 0)
            nbytes = _DSEG_BC.unpack_from(buf, o + 48)[0]
        elif opcode == W.ATOMIC_MASKED_CS:
            swap, cmp_ = _ATOM.unpack_from(buf, o + 32)
            cmp_mask = _ATOM.unpack_from(buf, o + 48)[1]
            effect = ("set", raddr, swap, 0) if cmp_mask == 0 else ("cas", raddr, swap, cmp_)
            nbytes = _DSEG_BC.unpack_from(buf, o + 64)[0]
        else:
            swap, cmp_ = _ATOM.unpack_from(buf, o + 32)
            effect = ("add", raddr, swap, 0) if opcode == W.ATOMIC_FA else ("cas", raddr, swap, cmp_)
            nbytes = _DSEG_BC.unpack_from(buf, o + 48)[0]
    return opcode, nw, fm, nbytes, raddr, effect


def at(env, t, fn):
    """Call fn(event) at absolute simulated time t: one SimPy event, nothing else."""
    ev = Event(env)
    ev._ok = True
    ev._value = None
    ev.callbacks.append(fn)
    env.schedule(ev, NORMAL, t - env.now if t > env.now else 0.0)
    return ev


def fire_at(env, ev, t):
    """Trigger an untriggered event `ev` so that it is processed at time t."""
    ev._ok = True
    ev._value = None
    env.schedule(ev, NORMAL, t - env.now if t > env.now else 0.0)


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
        # decoded[slot] = (full index, what the NIC decodes from the WQE bytes written there):
        # written together with the bytes, so it is valid exactly as long as the bytes are
        self.decoded = [None] * depth

    def write_op(self, index, op, qpn, rkey, lkey, fm):
        """GPU stores of WQE `op` starting at WQEBB `index` (wraps to slot 0)."""
        off = (index & self.mask) * W.WQEBB
        nw = op[2]
        dec = self.decoded
        dec[index & self.mask] = (index, decode_op(op, fm))
        for k in range(1, nw):
            dec[(index + k) & self.mask] = None    # continuation WQEBBs start no WQE
        if off + nw * W.WQEBB <= len(self.ring):
            W.encode_into(self.ring, off, op, index, qpn, rkey, lkey, fm)
        else:   # a multi-WQEBB WQE in the last slot continues at slot 0
            tmp = bytearray(nw * W.WQEBB)
            W.encode_into(tmp, 0, op, index, qpn, rkey, lkey, fm)
            self.write(index, tmp)

    def write(self, index, data):
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
        _U32.pack_into(self.dbr, 4, pi & 0xFFFF)

    def in_flight(self):
        return self.resv_head - self.cons_idx


class CompletionQueue:
    """CQ ring of 64-byte CQEs with the owner bit; fresh entries are 0xff (INVALID).

    The NIC announces each CQE with the time its DMA completes (`add`); the entry
    appears in the ring at that time (`land`, called by every poll), so the GPU's
    owner-bit test sees exactly what it would see with one event per CQE."""

    def __init__(self, env, depth, cqn, poll_ns=0.0):
        self.env = env
        self.depth = depth
        self.log_size = depth.bit_length() - 1
        self.cqn = cqn
        self.poll_ns = poll_ns
        self.ring = bytearray(b"\xff" * (depth * 64))
        self.pi = 0     # NIC producer (CQEs written into the ring)
        self.ci = 0     # GPU consumer
        self.pending = deque()   # (t_dma_done, qpn, wqe_counter, opcode, byte_cnt), in time order
        self._ev = None

    def add(self, t, qpn, wqe_counter, opcode, byte_cnt, cqe_opcode=CQE_REQ):
        if self.pending and t < self.pending[-1][0]:   # keep landing order (responder CQEs of several QPs)
            k = len(self.pending)
            while k and self.pending[k - 1][0] > t:
                k -= 1
            self.pending.insert(k, (t, qpn, wqe_counter, opcode, byte_cnt, cqe_opcode))
        else:
            self.pending.append((t, qpn, wqe_counter, opcode, byte_cnt, cqe_opcode))
        ev = self._ev
        if ev is not None and not ev.triggered:   # a GPU waits and no wake-up is scheduled yet
            fire_at(self.env, ev, t + self.poll_ns)

    def land(self, now):
        p = self.pending
        while p and p[0][0] <= now:
            _t, qpn, counter, opcode, nbytes, cqe_op = p.popleft()
            slot = self.pi & (self.depth - 1)
            owner = (self.pi >> self.log_size) & 1
            _CQE.pack_into(self.ring, slot * 64, nbytes, (opcode << 24) | qpn, counter & 0xFFFF, 0,
                           (cqe_op << 4) | owner)
            self.pi += 1

    def _entry_at_ci(self):
        """The byte offset of the entry at the consumer index if software owns it (owner-bit test, ref
        §2.2), else None."""
        off = (self.ci & (self.depth - 1)) * 64
        op_own = self.ring[off + 63]
        if (op_own >> 4) == 0xF or (op_own & 1) != ((self.ci >> self.log_size) & 1):
            return None
        return off

    def _take(self, now):
        """The next valid CQE's offset, consumed (what has landed by ``now`` first), or None."""
        if self.pending:
            self.land(self.env.now if now is None else now)
        off = self._entry_at_ci()
        if off is not None:
            self.ci += 1
        return off

    def poll(self, now=None):
        """GPU side: the next valid CQE's wqe_counter, or None."""
        off = self._take(now)
        return None if off is None else (self.ring[off + 60] << 8) | self.ring[off + 61]

    def has_entry(self):
        """Owner-bit test of the entry at the consumer index, without consuming it."""
        return self._entry_at_ci() is not None

    def poll_entry(self, now=None):
        """CPU side (verbs): (cqe opcode, qpn, wqe_counter, byte_cnt) of the next valid CQE, or None."""
        off = self._take(now)
        if off is None:
            return None
        byte_cnt, sop_qpn, counter = _CQE_FIELDS.unpack_from(self.ring, off + 44)
        return self.ring[off + 63] >> 4, sop_qpn & 0xFFFFFF, counter, byte_cnt

    def wait(self):
        """An event processed one GPU poll round trip after the next CQE lands.

        Shared by every block polling this CQ (they all re-poll then)."""
        ev = self._ev
        if ev is None or ev.callbacks is None:
            ev = self._ev = Event(self.env)
            if self.pending:
                fire_at(self.env, ev, self.pending[0][0] + self.poll_ns)
        return ev


class QueuePair:
    """Requester side of an RC connection as the model needs it."""

    def __init__(self, env, qpn, pe, nic, depth, cqn, start_index=0, poll_ns=0.0):
        self.qpn = qpn
        self.pe = pe
        self.nic = nic
        self.sq = SendQueue(depth, start_index)
        self.cq = CompletionQueue(env, depth, cqn, poll_ns)
        self.peer = None          # remote QueuePair
        self.uar = None           # UarPage the GPU writes
        self.outstanding = deque()  # GPU: (full index, nwqebb, signalled) in post order
        self.truth_rows = {}      # full WQE index -> truth wqe_id (consumed by the NIC)
        self.results = {}         # full WQE index -> value fetched by an atomic
        self.last_cqe_t = 0.0
        self.gid = None           # global id in the cluster
        self.raw_qpn = W.doorbell_raw(0, qpn)
        self.recv_cq = None       # CQ of the receive queue (verbs QPs; default: the send CQ)
        self.recv_head = 0        # receive WQEs consumed by the responder   # the doorbell's QPN bytes (bytes 4..6 of the LE view)


class UarPage:
    """The 8-byte doorbell register as the GPU sees it.

    Without the tracer (baseline) it is the NIC's BAR register: the posted write
    reaches the NIC `mmio_write_ns` after the store.  With the hijack installed it
    is a pinned host page watched by a poller thread (host.HijackPoller), which
    is told of the store and of the time it lands in the page."""

    def __init__(self, env, nic, page_id, reg_addr):
        self.env = env
        self.nic = nic
        self.page_id = page_id
        self.reg_addr = reg_addr
        self.hijacked = False
        self.poller = None
        self.value = 0
        self.seq = 0              # number of stores issued to the page

    def store(self, raw, db_id, t_land):
        self.seq += 1
        self.value = raw
        if self.poller is not None:
            self.poller.store(t_land, raw, db_id)
        else:
            # posted PCIe write: lands at the NIC in issue order, mmio_write_ns later
            self.nic.uar_store(raw, t_land)


class Nic:
    CHECK_BYTES = False     # tests: decode every WQE from the ring bytes too and compare

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

    def uar_store(self, raw, t_arrive):
        """An 8-byte doorbell value reaches the UAR register at t_arrive (from the GPU or the poller)."""
        pi16 = (((raw >> 8) & 0xFF) << 8) | ((raw >> 16) & 0xFF)
        qpn = (((raw >> 32) & 0xFF) << 16) | (((raw >> 40) & 0xFF) << 8) | ((raw >> 48) & 0xFF)
        self.doorbell(self.qps[qpn], pi16, t_arrive)

    def uar_store_ctrl(self, qp, raw, t_arrive):
        """rdma-core convention (CPU verbs, mlx5_post_send): the 8 bytes are the first 8 bytes of
        the last WQE's ctrl segment (its opcode/wqe_index/QPN/DS), and the producer counter is the
        doorbell record's SQ word (DBR+4, BE32), which the library stores before the doorbell."""
        qpn = (((raw >> 32) & 0xFF) << 16) | (((raw >> 40) & 0xFF) << 8) | ((raw >> 48) & 0xFF)
        assert qpn == qp.qpn
        self.doorbell(qp, _U32.unpack_from(qp.sq.dbr, 4)[0] & 0xFFFF, t_arrive)

    def doorbell(self, qp, pi16, t_arrive):
        sq = qp.sq
        delta = (pi16 - sq.nic_pi) & 0xFFFF
        self.doorbells += 1
        if delta == 0 or delta > sq.depth:
            self.stale_doorbells += 1   # older or repeated value: the NIC keeps the highest
            return
        start, new = sq.nic_pi, sq.nic_pi + delta
        sq.nic_pi = new
        t = self.t
        free = self.free_at
        t0 = t_arrive + t.nic_db_ns
        t_fetch = (t0 if t0 > free else free) + t.nic_fetch_ns + delta * t.nic_fetch_ns_per_wqebb
        # per-WQE execution in closed form (see the module docstring)
        c = self.cluster
        peer = qp.peer
        src, dst = self.port, peer.nic.port
        remote_mem = peer.pe.mem
        ring, mask, ringlen = sq.ring, sq.mask, len(sq.ring)
        truth_rows, times = qp.truth_rows, c.truth.wqe_times
        exec_ns, cqe_ns = t.nic_exec_ns, t.cqe_write_ns
        last_cqe = qp.last_cqe_t
        moved = 0
        decoded = sq.decoded
        check = self.CHECK_BYTES
        send = self.fabric.send
        i = start
        while i < new:
            # what the NIC finds in the ring: the decoded WQE when the slot still holds the one the
            # GPU wrote for index i (it must: a slot is reused only after its CQE), else the bytes
            slot = decoded[i & mask]
            if slot is not None and slot[0] == i and not check:
                opcode, nw, fm, nbytes, raddr, effect = slot[1]
            else:
                off = (i & mask) << 6
                nw = ((ring[off + 7] & 0x3F) + 3) >> 2 or 1
                if off + (nw << 6) > ringlen:   # WQE wraps: read it contiguously
                    found = decode_bytes(sq.read(i, nw), 0)
                else:
                    found = decode_bytes(ring, off)
                if check and slot is not None and slot[0] == i:
                    assert slot[1] == found, (slot[1], found)
                opcode, nw, fm, nbytes, raddr, effect = found
            s = t_fetch if t_fetch > self.free_at else self.free_at
            self.free_at = s + exec_ns
            # over the fabric: the request (with its data for writes and sends) out, ACK/response back
            if opcode == W.RDMA_READ:
                out_b = 16
            elif opcode >= W.ATOMIC_CS:
                out_b = 28
            else:
                out_b = nbytes
            t_arr = send(src, dst, out_b, s)
            if opcode == W.RDMA_READ:
                t_remote = t_arr + t.nic_pcie_read_ns
                back = nbytes
            elif opcode >= W.ATOMIC_CS:
                t_remote = t_arr + t.nic_atomic_ns
                back = nbytes
            else:
                t_remote = t_arr + t.nic_pcie_write_ns
                back = 0
            t_done = send(dst, src, back, t_arr if back == 0 and opcode < W.RDMA_READ else t_remote)
            if opcode >= W.RDMA_READ:
                t_done = t_done + t.nic_pcie_write_ns
            t_cqe = t_done + cqe_ns
            if t_cqe < last_cqe:
                t_cqe = last_cqe
            last_cqe = t_cqe
            wid = truth_rows.pop(i, None)
            if wid is not None:
                times.append((wid, t_fetch, s, t_remote, t_cqe))
            if effect is not None:
                c.push_effect(t_remote, remote_mem, effect, qp, i)
            if opcode == W.RDMA_WRITE_IMM or opcode == W.SEND:
                # the responder consumes a receive WQE and writes a responder CQE on the peer's CQ
                rcq = peer.recv_cq or peer.cq
                rcq.add(t_remote + cqe_ns, peer.qpn, peer.recv_head, opcode, nbytes, CQE_RESP_WR_IMM)
                peer.recv_head += 1
            if fm & W.CQ_UPDATE:
                qp.cq.add(t_cqe, qp.qpn, i, opcode, nbytes)
            moved += nbytes
            i += nw
        qp.last_cqe_t = last_cqe
        c.bytes_moved += moved
