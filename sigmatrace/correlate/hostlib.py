"""UCX (UCP_*) and libfabric (OFI_*) operations and their peers (F10 traces -> ops rows).

Peers, from the identities the tracer records (docs/tracer.md):
 * UCX: every UCP_WORKER_CREATE carries the worker's own address prefix (first <= 24 bytes of
   ``ucp_worker_get_address``, hex); UCP_EP_CREATE carries the first 24 bytes of the remote worker
   address it connects to.  An endpoint's peer is the process whose worker address prefix starts the
   endpoint's remote prefix (unique match only).  Endpoints created from a socket address or a
   connection request have no address: their peer stays unknown (-1).
 * libfabric: OFI_AV_INSERT lists the inserted addresses and the fi_addr_t each got (per process);
   OFI_ENDPOINT carries the endpoint's src_addr / dest_addr.  An operation's peer address is its fi_addr
   (EXT x0) looked up in the process's address vectors, or, for a connected endpoint (dest_addr set), that
   dest_addr; the peer process is the one with an endpoint whose src_addr is that address (unique only).
Operations: one op per recorded call (UCP_PUT/GET/ATOMIC/TAG_SEND/STREAM_SEND/AM_SEND, OFI_SEND/TSEND/
WRITE/READ/ATOMIC) with an mlx5-style opcode (put/write -> RDMA_WRITE, get/read -> RDMA_READ,
sends -> SEND, atomics: add/sum -> ATOMIC_FA, others -> ATOMIC_CS), no QP (qp_id = -1).
"""
from __future__ import annotations

import numpy as np

UCX_OPS = {"UCP_PUT": 0x08, "UCP_GET": 0x10, "UCP_ATOMIC": -1, "UCP_TAG_SEND": 0x0A, "UCP_STREAM_SEND": 0x0A,
           "UCP_AM_SEND": 0x0A}
OFI_OPS = {"OFI_SEND": 0x0A, "OFI_TSEND": 0x0A, "OFI_WRITE": 0x08, "OFI_READ": 0x10, "OFI_ATOMIC": -1}
ID_TYPES = ("UCP_WORKER_CREATE", "UCP_EP_CREATE", "OFI_ENDPOINT", "OFI_AV_INSERT")
OP_TYPES = tuple(UCX_OPS) + tuple(OFI_OPS)
UCP_ATOMIC_ADD = 0          # ucp_atomic_op_t UCP_ATOMIC_OP_ADD
FI_SUM = 2                  # enum fi_op FI_SUM
ATOMIC_FA, ATOMIC_CS = 0x12, 0x11


def _hex(v):
    if not isinstance(v, str) or not v:
        return None
    s = v.lower().replace(":", "").replace("0x", "").replace(" ", "")
    return s or None


def _addr(v):
    return str(v).strip().lower() if isinstance(v, str) and v.strip() else None


class Peers:
    """(process, endpoint id) -> peer process for UCX and libfabric endpoints, and libfabric fi_addr maps."""

    def __init__(self, tables, procs):
        self.unmatched = {}     # library -> {reason: operations} (filled by op_parts)
        self.total = {}         # library -> operations
        self.ucx_ep = {}        # (process, ep) -> process
        self.ofi_ep = {}        # (process, ep) -> peer process of a connected endpoint
        self.ofi_fi = {}        # (process, fi_addr) -> process
        # UCX: own worker address prefixes
        own = {}                # prefix length -> {prefix: set(process)}
        w = tables.get("UCP_WORKER_CREATE")
        for p, sid in _pairs(w, "side_id"):
            js = procs[p].side_json.get(sid)
            pref = _hex(js.get("address_prefix")) if isinstance(js, dict) else None
            if pref:
                own.setdefault(len(pref), {}).setdefault(pref, set()).add(p)
        e = tables.get("UCP_EP_CREATE")
        for (p, sid), ep in zip(_pairs(e, "side_id"), _col(e, "ep")):
            js = procs[p].side_json.get(sid)
            rp = _hex(js.get("remote_address_prefix")) if isinstance(js, dict) else None
            if not rp:
                continue
            cand = set()
            for ln, d in own.items():
                cand |= d.get(rp[:ln], set())
            if len(cand) == 1:
                self.ucx_ep[(p, int(ep))] = next(iter(cand))
        # libfabric: endpoint addresses
        by_src = {}
        dest = {}
        srcs = {}
        o = tables.get("OFI_ENDPOINT")
        for (p, sid), ep in zip(_pairs(o, "side_id"), _col(o, "ep")):
            js = procs[p].side_json.get(sid)
            if not isinstance(js, dict):
                continue
            src = _addr(js.get("src_addr"))
            if src:
                by_src.setdefault(src, set()).add(p)
                srcs[(p, int(ep))] = src
            d = _addr(js.get("dest_addr"))
            if d:
                dest[(p, int(ep))] = d
        uniq = {a: next(iter(s)) for a, s in by_src.items() if len(s) == 1}
        for key, d in dest.items():
            if d in uniq:
                self.ofi_ep[key] = uniq[d]
        self._ofi_connected_fallback(dest, srcs)
        a = tables.get("OFI_AV_INSERT")
        seen = {}
        for p, sid in _pairs(a, "side_id"):
            js = procs[p].side_json.get(sid)
            if not isinstance(js, dict):
                continue
            for addr, fi in zip(js.get("addrs") or [], js.get("fi_addrs") or []):
                key = (p, int(fi))
                ad = _addr(addr)
                if key in seen and seen[key] != ad:       # two AVs gave the same fi_addr different addresses
                    seen[key] = None
                else:
                    seen[key] = ad
        for key, ad in seen.items():
            if ad is not None and ad in uniq:
                self.ofi_fi[key] = uniq[ad]
        # what the reasons for an unmatched operation need (why())
        self._ucx_remote = {(p, int(ep)) for (p, sid), ep in zip(_pairs(e, "side_id"), _col(e, "ep"))
                            if isinstance(procs[p].side_json.get(sid), dict)
                            and _hex(procs[p].side_json[sid].get("remote_address_prefix"))}
        self._ofi_dest = set(dest)
        self._ofi_fi_known = {k for k, ad in seen.items() if ad is not None}
        self._ofi_fi_ambiguous = {k for k, ad in seen.items() if ad is None}
        self._ofi_shared_src = {a for a, s in by_src.items() if len(s) > 1}

    def why(self, library, proc, ep, fi_addr=-1):
        """Why an operation of (proc, ep[, fi_addr]) has no peer: one short reason."""
        key = (int(proc), int(ep))
        if library == "ucx":
            if key not in self._ucx_remote:
                return "its endpoint's remote worker address was not recorded"
            return "the remote worker is not in the capture (peer process not traced or its file missing)"
        if key in self._ofi_dest:
            return "its connected endpoint's peer address matches no traced endpoint"
        fk = (int(proc), int(fi_addr))
        if fk in self._ofi_fi_ambiguous:
            return "its fi_addr was given two different addresses by two AVs"
        if fk not in self._ofi_fi_known:
            return "its fi_addr came from no recorded fi_av_insert"
        return "its address names no traced endpoint (peer process not traced, or several share it)"

    def _ofi_connected_fallback(self, dest, srcs):
        """Connected endpoints whose dest_addr matches no recorded src_addr exactly.  A msg endpoint's
        src_addr is the fi_info's (the tracer records it at fi_endpoint, before the connection binds
        it), often with port 0, so its real local port is unknown.  Then the peer is the other
        process's connected endpoint whose src host:port fits this dest_addr (port 0 = any) and whose
        own dest_addr fits this endpoint's src_addr the same way -- accepted only when exactly one
        process has such an endpoint."""
        by_host = {}            # src host -> connected endpoints with a src_addr there
        for other, od in dest.items():
            hp = _hostport(srcs.get(other) or "")
            if hp is not None:
                by_host.setdefault(hp[0], []).append((other, od))
        for key, d in dest.items():
            mine, hp = srcs.get(key), _hostport(d)
            if key in self.ofi_ep or mine is None or hp is None:
                continue
            cand = set()
            for other, od in by_host.get(hp[0], ()):
                if other[0] != key[0] and _fits(d, srcs[other]) and _fits(od, mine):
                    cand.add(other[0])
                    if len(cand) > 1:
                        break
            if len(cand) == 1:
                self.ofi_ep[key] = next(iter(cand))

    def ucx(self, proc, ep):
        return _map(self.ucx_ep, proc, ep)

    def ofi(self, proc, ep, fi_addr):
        """Connected endpoint: its dest_addr's process; else the fi_addr's."""
        res = _map(self.ofi_ep, proc, ep)
        miss = res < 0
        if miss.any():
            res[miss] = _map(self.ofi_fi, proc[miss], fi_addr[miss])
        return res


def _hostport(a):
    """'host:port' / '[v6]:port' -> (host, port); None when the address has no numeric port."""
    host, sep, port = a.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def _fits(dest, src):
    """A dest_addr that a (possibly unbound, port 0) src_addr can be: same host, same port or port 0."""
    d, s = _hostport(dest), _hostport(src)
    if d is None or s is None:
        return False
    return d[0] == s[0] and (s[1] == 0 or s[1] == d[1])


def _col(t, name):
    return t[name] if t is not None and name in t else np.zeros(0, np.int64)


def _pairs(t, sid_col):
    if t is None or not len(t["tsc"]):
        return []
    return list(zip(t["process"].astype(np.int64).tolist(), t[sid_col].astype(np.int64).tolist()))


def _map(d, a, b):
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    out = np.full(len(a), -1, np.int64)
    if not d or not len(a):
        return out
    keys = np.array([(k[0] << 40) ^ (k[1] & ((1 << 40) - 1)) for k in d], np.int64)
    vals = np.array(list(d.values()), np.int64)
    o = np.argsort(keys)
    keys, vals = keys[o], vals[o]
    q = (a << 40) ^ (b & ((1 << 40) - 1))
    pos = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
    hit = keys[pos] == q
    out[hit] = vals[pos[hit]]
    return out


def op_parts(tables, peers, src_ucx, src_ofi):
    """Ops rows (base columns + dst_proc) for the UCX and libfabric operation records: one part per type of
    ``OP_TYPES`` (None for a type without records)."""
    parts = []
    for names, src in ((UCX_OPS, src_ucx), (OFI_OPS, src_ofi)):
        for name, code in names.items():
            t = tables.get(name)
            if t is None or not len(t["tsc"]):
                parts.append(None)
                continue
            n = len(t["tsc"])
            proc = t["process"].astype(np.int64)
            ep = t["ep"].astype(np.int64)
            if code == -1:
                op = t["op"].astype(np.int64)
                codes = np.where(op == (UCP_ATOMIC_ADD if src == src_ucx else FI_SUM), ATOMIC_FA, ATOMIC_CS)
            else:
                codes = np.full(n, code, np.int64)
            if src == src_ucx:
                raddr = t["raddr"] if "raddr" in t else np.zeros(n, np.uint64)
                dst = peers.ucx(proc, ep)
                fi = np.full(n, -1, np.int64)
            else:
                raddr = t["raddr"] if "raddr" in t else np.zeros(n, np.uint64)
                fi = t["dest"].astype(np.int64)
                dst = peers.ofi(proc, ep, fi)
            lib = "ucx" if src == src_ucx else "libfabric"
            peers.total[lib] = peers.total.get(lib, 0) + n
            miss = np.flatnonzero(dst < 0)
            if len(miss):          # why, once per (process, endpoint, fi_addr): the report says it
                keys, counts = np.unique(np.stack([proc[miss], ep[miss], fi[miss]], 1), axis=0, return_counts=True)
                reasons = peers.unmatched.setdefault(lib, {})
                for (p_, e_, f_), c in zip(keys.tolist(), counts.tolist()):
                    r = peers.why(lib, p_, e_, f_)
                    reasons[r] = reasons.get(r, 0) + int(c)
            parts.append(dict(
                source=np.full(n, src, np.int8), process=proc, thread=t["thread"], qp_id=np.full(n, -1, np.int32),
                tsc=t["tsc"], opcode=codes, bytes=t["bytes"].view(np.int64) if t["bytes"].dtype == np.uint64
                else t["bytes"].astype(np.int64), raddr=np.asarray(raddr, np.uint64), rkey=np.zeros(n, np.uint32),
                wr_id=np.full(n, -1, np.int64), num_wr=np.ones(n, np.int32), doorbell_id=np.full(n, -1, np.int32),
                wqe_id=np.full(n, -1, np.int32), signaled=np.zeros(n, bool), gpu=np.full(n, -1, np.int32),
                dst_proc=dst, ep=ep))
    return parts


# ---- F25: a UCP / libfabric operation -> the WQEs beneath it -----------------------------------------------
# The classes of WQE each kind of UCP call produces (mlx5 opcodes, ref §1.2).
_WRITE_W, _READ_W, _SEND_W, _ATOMIC_W = (0x08, 0x09), (0x10,), (0x0A, 0x0B, 0x01), (0x11, 0x12, 0x14, 0x15)
_CLASS_OF_UCP = {0x08: _WRITE_W, 0x10: _READ_W, 0x0A: _SEND_W, ATOMIC_FA: _ATOMIC_W, ATOMIC_CS: _ATOMIC_W}
SEND_HEADER_MAX = 256       # eager protocol headers a SEND may carry beyond the user's bytes (UCT AM + UCP tag,
                            # ofi_rxm's 64 bytes)


def link_parents(ops, host_sources, wqe_sources, qp_remote, qp_process):
    """parent op id (-1: none) of every op: a WQE op (doorbell / verbs_wr) gets the library call (UCP, libfabric)
    that produced it.

    The rule (docs/report.md, "Library operations and their WQEs"): an endpoint's QPs are the connected QPs of its
    process whose remote QP lies in the endpoint's peer process (only when that process has one endpoint of one
    library to that peer: otherwise the relation is ambiguous and nothing is linked).  Per endpoint and class of
    work (puts / writes -> RDMA_WRITE(_IMM), gets / reads -> RDMA_READ, atomics -> atomic WQEs, sends ->
    SEND(_IMM/_INV)), the calls in call order take the WQEs of their class on those QPs in posting order
    (doorbell time, then QP and WQE order), skipping WQEs rung before the call began -- for libfabric only those
    posted by the calling thread (its providers post a call's work requests inside the call; ofi_rxm's own
    control messages are posted by whichever thread progresses the endpoint):
      * put / get: consecutive WQEs whose bytes add up to exactly the call's bytes (else the call stays unlinked
        and its candidates stay free);
      * atomic: one WQE;
      * send: one SEND carrying at least the call's bytes and at most SEND_HEADER_MAX more (eager: UCT AM + UCP
        headers, ofi_rxm's 64-byte header); else consecutive SENDs of equal size (fragments) whose sum covers the
        bytes within the headers of each; else one smaller SEND (a rendezvous RTS; the data then moves by the
        peer's RDMA READ, in the peer process, not linked).
    ``host_sources``: {source code: same-thread rule (bool)}.  Returns (parent int64 array, {source: stats})."""
    n = len(ops["tsc"])
    parent = np.full(n, -1, np.int64)
    src = np.asarray(ops["source"])
    stats = {s_: dict(ops=int((src == s_).sum()), linked=0, ambiguous_endpoints=0, no_qp=0) for s_ in host_sources}
    u = np.flatnonzero(np.isin(src, list(host_sources)))
    if not len(u):
        return parent, stats
    proc = np.asarray(ops["process"], np.int64)
    thread = np.asarray(ops["thread"], np.int64)
    ep = np.asarray(ops["ep"], np.int64)
    dst = np.asarray(ops["dst_proc"], np.int64)
    tsc = np.asarray(ops["tsc"]).astype(np.uint64)
    code = np.asarray(ops["opcode"], np.int64)
    nbytes = np.asarray(ops["bytes"], np.int64)
    qp = np.asarray(ops["qp_id"], np.int64)
    w = np.flatnonzero(np.isin(src, list(wqe_sources)) & (qp >= 0))
    qp_remote = np.asarray(qp_remote, np.int64)
    qp_process = np.asarray(qp_process, np.int64)
    # QP -> (its process, the remote QP's process)
    w_rproc = np.where(qp_remote[qp[w]] >= 0, qp_process[np.maximum(qp_remote[qp[w]], 0)], -1) if len(w) else w
    # endpoints (library, endpoint) per (process, peer process)
    eps = {}
    for s_, p_, e_, d_ in zip(src[u].tolist(), proc[u].tolist(), ep[u].tolist(), dst[u].tolist()):
        eps.setdefault((p_, d_), set()).add((s_, e_))
    # WQE candidates per (process, peer process, class), in posting order
    cand = {}
    if len(w):
        order = np.lexsort((np.asarray(ops["wqe_id"], np.int64)[w], qp[w], tsc[w]))
        w = w[order]
        w_rproc = w_rproc[order]
        for cls in (_WRITE_W, _READ_W, _SEND_W, _ATOMIC_W):
            m = np.isin(code[w], cls) & (w_rproc >= 0)
            ww, rp = w[m], w_rproc[m]
            for key in set(zip(proc[ww].tolist(), rp.tolist())):
                sel = ww[(proc[ww] == key[0]) & (rp == key[1])]
                cand[(key[0], key[1], cls)] = sel
    taken = np.zeros(n, bool)
    uo = u[np.lexsort((u, tsc[u]))]
    ptr, by_thread = {}, {}
    for i in uo.tolist():
        st = stats[int(src[i])]
        key_pe = (int(proc[i]), int(dst[i]))
        if key_pe[1] < 0:
            st["no_qp"] += 1
            continue
        if len(eps.get(key_pe, ())) != 1:
            st["ambiguous_endpoints"] += 1
            continue
        cls = _CLASS_OF_UCP.get(int(code[i]))
        c = cand.get((key_pe[0], key_pe[1], cls)) if cls else None
        same_thread = host_sources[int(src[i])]
        pk = (key_pe, cls, int(thread[i]) if same_thread else None)
        if c is not None and same_thread:      # the calling thread's work requests only (split once per thread)
            if pk not in by_thread:
                by_thread[pk] = c[thread[c] == thread[i]]
            c = by_thread[pk]
        if c is None or not len(c):
            st["no_qp"] += 1
            continue
        j = ptr.get(pk, 0)
        while j < len(c) and (taken[c[j]] or tsc[c[j]] < tsc[i]):
            j += 1
        if j >= len(c):
            continue
        b = int(nbytes[i])
        got = _take(c, j, nbytes, b, cls)
        if got:
            parent[c[j:j + got]] = i
            taken[c[j:j + got]] = True
            ptr[pk] = j + got
            st["linked"] += 1
    return parent, stats


def _take(c, j, nbytes, b, cls):
    """How many WQEs from c[j] the call of b bytes produced (0: none fits)."""
    wb = nbytes[c[j:]]
    if cls in (_WRITE_W, _READ_W):
        cs = np.cumsum(wb)
        k = int(np.searchsorted(cs, b))
        return k + 1 if k < len(cs) and cs[k] == b else 0
    if cls == _ATOMIC_W:
        return 1
    first = int(wb[0])
    if b <= first <= b + SEND_HEADER_MAX:
        return 1                      # eager, one SEND
    if first < b:
        cs = 0
        for k in range(len(wb)):
            if k and int(wb[k]) > first:
                break
            cs += int(wb[k])
            if cs >= b:
                return k + 1 if cs - b <= SEND_HEADER_MAX * (k + 1) else 1
        return 1                      # a rendezvous RTS (or a lone fragment)
    return 0
