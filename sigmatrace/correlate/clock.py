"""One nanosecond time base for every event of a capture (contract 2, F16, F24b).

Step 1, per node: every process of a node reads the same TSC, so all their
calibration pairs (TSC midpoint of tsc_before/tsc_after, CLOCK_TAI when every
pair has it valid, else CLOCK_REALTIME) are fitted together by least squares:
``ns = ns0 + slope * (tsc - tsc0)``.  One pair gives the offset, the header's
``tsc_hz`` the slope; no pair at all leaves the node "uncalibrated" (slope
from tsc_hz, offset 0 — its TSC origin is arbitrary).

Step 2, across nodes (F24b): matched operations give causal pairs "event a on
node A happened before event b on node B" (a send post and the peer's
receive completion; that receive and the sender's completion, ...).  For a
node pair with traffic in both directions, the minimum one-way delays per
time window, d_AB and d_BA, give the clock error difference
``err_B - err_A = (d_AB - d_BA) / 2`` (equal minimum latency both ways, as
NTP assumes).  Window estimates from all node pairs are solved together by
least squares for a per-node offset and drift against a reference node (the
first node whose calibration is PTP-disciplined, else the first calibrated
node).  The residual (RMS of the window estimates around the fitted lines)
is reported per node.  With only one direction, the pairs bound the
correction; a correction is applied then only to restore causality.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..format import layout as L


@dataclass
class NodeClock:
    node: int
    tsc0: int = 0
    ns0: int = 0
    slope: float = 1.0          # ns per tick
    source: str = "none"        # tai | realtime | tsc_hz | none
    pairs: int = 0
    fit_residual_ns: float = 0.0
    ptp: bool = False
    # F24b correction (ns): t = t_cal + offset + drift * (t_cal - ref_ns)
    offset_ns: float = 0.0
    drift: float = 0.0
    ref_ns: float = 0.0
    refined: bool = False
    refine_pairs: int = 0
    refine_residual_ns: float = float("nan")
    refine_method: str = ""

    def to_ns_first(self, tsc: np.ndarray) -> np.ndarray:
        """Calibration-only mapping (float64 ns relative to ns0, then absolute int64)."""
        d = tsc.astype(np.int64) - np.int64(self.tsc0) if len(tsc) else np.zeros(0, np.int64)
        # int64 difference keeps full precision; float only for the (small) product
        return np.int64(self.ns0) + np.rint(d.astype(np.float64) * self.slope).astype(np.int64)

    def to_ns(self, tsc: np.ndarray) -> np.ndarray:
        t = self.to_ns_first(tsc)
        if self.offset_ns or self.drift:
            rel = (t - np.int64(self.ref_ns)).astype(np.float64)
            t = t + np.rint(self.offset_ns + self.drift * rel).astype(np.int64)
        return t


def fit_node(node: int, calibs: list, tsc_hz_values: list) -> NodeClock:
    """Least-squares TSC -> ns fit over all calibration pairs of one node."""
    nc = NodeClock(node)
    hz = next((float(h) for h in tsc_hz_values if h), 0.0)
    cal = np.concatenate(calibs) if calibs else np.zeros(0, L.CALIBRATION_DTYPE)
    cal = cal[(cal["tsc_before"] > 0) & (cal["tsc_after"] >= cal["tsc_before"])]
    if len(cal):
        # CLOCK_REALTIME (UTC, what users read) when every pair has it; CLOCK_TAI otherwise
        use_tai = bool(not np.all(cal["realtime_ns"] > 0) and np.all(cal["flags"] & L.CALIB_F_TAI_VALID)
                       and np.all(cal["tai_ns"] > 0))
        ns = cal["tai_ns"] if use_tai else cal["realtime_ns"]
        ok = ns > 0
        use_tai = use_tai
        cal, ns = cal[ok], ns[ok]
    if len(cal) == 0:
        nc.slope = 1e9 / hz if hz else 1.0
        nc.source = "tsc_hz" if hz else "none"
        return nc
    nc.ptp = bool(np.all(cal["flags"] & L.CALIB_F_PTP))
    nc.source = "tai" if use_tai else "realtime"
    nc.pairs = len(cal)
    mid = cal["tsc_before"] + (cal["tsc_after"] - cal["tsc_before"]) // 2
    nc.tsc0 = int(mid.min())
    nc.ns0 = int(ns[np.argmin(mid)])
    x = (mid.astype(np.int64) - nc.tsc0).astype(np.float64)
    y = (ns.astype(np.int64) - nc.ns0).astype(np.float64)
    if len(cal) >= 2 and np.ptp(x) > 0:
        xm, ym = x.mean(), y.mean()
        slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
        icpt = ym - slope * xm
        nc.slope = slope
        nc.ns0 = nc.ns0 + int(round(icpt))
        nc.fit_residual_ns = float(np.sqrt(np.mean((y - (icpt + slope * x)) ** 2)))
    else:
        nc.slope = 1e9 / hz if hz else 1.0
    return nc


@dataclass
class CausalPairs:
    """a happened before b: node and first-pass ns of both ends."""
    node_a: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    t_a: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    node_b: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    t_b: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @staticmethod
    def concat(items, consume=False):
        """One CausalPairs of all ``items``; ``consume``: each item's columns are released as soon as they are
        copied (peak = the result + one column, not twice the pairs)."""
        items = [i for i in items if len(i)]
        if not items:
            return CausalPairs()
        cols = []
        for f in ("node_a", "t_a", "node_b", "t_b"):
            cols.append(np.concatenate([getattr(i, f) for i in items]) if len(items) > 1 else getattr(items[0], f))
            if consume:
                for i in items:
                    setattr(i, f, None)
        return CausalPairs(*cols)

    def __len__(self):
        return 0 if self.t_a is None else len(self.t_a)


class _PairIndex:
    """Causal pairs grouped by directed node pair (one stable sort of a narrow key), so each node pair reads
    only its own rows; built once and shared by both refinement passes."""

    def __init__(self, pairs: CausalPairs):
        self.pairs = pairs
        self.groups = {}
        if not len(pairs):
            return
        na = np.asarray(pairs.node_a)
        nb = np.asarray(pairs.node_b)
        span = int(max(na.max(), nb.max())) + 1
        if span * span < (1 << 31):
            key = na.astype(np.int32) * np.int32(span) + nb.astype(np.int32)
        else:
            key = na.astype(np.int64) * span + nb.astype(np.int64)
        o = np.argsort(key, kind="stable")
        cnt = np.bincount(key, minlength=span * span) if span * span <= 4 * len(key) + 1024 else None
        if cnt is not None:
            ends = np.cumsum(cnt)
            for k in np.flatnonzero(cnt).tolist():
                self.groups[(k // span, k % span)] = o[ends[k] - cnt[k]:ends[k]]
        else:
            ks = key[o]
            cut = np.flatnonzero(ks[1:] != ks[:-1]) + 1
            st = np.concatenate([[0], cut])
            en = np.concatenate([cut, [len(ks)]])
            for a, b in zip(st.tolist(), en.tolist()):
                k = int(ks[a])
                self.groups[(k // span, k % span)] = o[a:b]

    def rows(self, a, b):
        return self.groups.get((a, b))


def _window_estimates(pairs: CausalPairs, a: int, b: int, nwin: int, index: _PairIndex | None = None,
                      shift=None):
    """(t_mid, delta=err_b-err_a) per window where both directions have pairs.  ``shift``: per-node ns
    subtracted from the times first (the first pass's offsets; constant per node, so per group)."""
    if index is None:
        index = _PairIndex(pairs)
    fwd = index.rows(a, b)
    bwd = index.rows(b, a)
    if fwd is None or bwd is None:
        return None
    sa, sb = (int(shift[a]), int(shift[b])) if shift is not None else (0, 0)
    tf = pairs.t_a[fwd] - np.int64(sa)  # times on node a's clock (both directions)
    df = (pairs.t_b[fwd] - np.int64(sb) - tf).astype(np.float64)
    tb = pairs.t_b[bwd] - np.int64(sa)
    db = (tb - (pairs.t_a[bwd] - np.int64(sb))).astype(np.float64)  # = t_on_a - t_on_b
    lo, hi = min(tf.min(), tb.min()), max(tf.max(), tb.max())
    nwin = max(1, min(nwin, len(df) // 4, len(db) // 4))
    edges = np.linspace(lo, hi + 1, nwin + 1)
    wf = np.clip(np.searchsorted(edges, tf, "right") - 1, 0, nwin - 1)
    wb = np.clip(np.searchsorted(edges, tb, "right") - 1, 0, nwin - 1)
    minf = np.full(nwin, np.inf)
    minb = np.full(nwin, np.inf)
    np.minimum.at(minf, wf, df)
    np.minimum.at(minb, wb, db)
    sumt = np.bincount(wf, tf.astype(np.float64), nwin) + np.bincount(wb, tb.astype(np.float64), nwin)
    cnt = (np.bincount(wf, minlength=nwin) + np.bincount(wb, minlength=nwin)).astype(np.float64)
    ok = np.isfinite(minf) & np.isfinite(minb)
    if not ok.any():
        return None
    return sumt[ok] / cnt[ok], (minf[ok] - minb[ok]) / 2.0, int(len(fwd) + len(bwd))


def _solve(pairs: CausalPairs, nodes, ref, windows, index=None, shift=None):
    idx = {n: i for i, n in enumerate(nodes)}
    rows, rhs, meta = [], [], []
    if index is None:
        index = _PairIndex(pairs)
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            if index.rows(a, b) is None or index.rows(b, a) is None:
                continue
            est = _window_estimates(pairs, a, b, windows, index, shift)
            if est is None:
                continue
            tm, delta, npairs = est
            rows.extend((a, b, float(t)) for t in tm)
            rhs.extend(float(d) for d in delta)
            meta.append((a, b, npairs))
    if not rows:
        return None
    t_ref = float(np.mean([r[2] for r in rows]))
    n = len(nodes)
    nvar = 2 * n
    scale = 1e9  # drift unknowns are per second of time
    A = np.zeros((len(rows), nvar))
    y = np.asarray(rhs)
    for k, (a, b, t) in enumerate(rows):
        A[k, 2 * idx[b]] += 1
        A[k, 2 * idx[b] + 1] += (t - t_ref) / scale
        A[k, 2 * idx[a]] -= 1
        A[k, 2 * idx[a] + 1] -= (t - t_ref) / scale
    pin = np.zeros((2, nvar))
    pin[0, 2 * idx[ref]] = 1e6
    pin[1, 2 * idx[ref] + 1] = 1e6
    ridge = np.zeros((nvar, nvar))
    for m in nodes:
        ridge[2 * idx[m] + 1, 2 * idx[m] + 1] = 1e-3  # weak prior: no drift (matters only with 1 window)
    sol, *_ = np.linalg.lstsq(np.vstack([A, pin, ridge]), np.concatenate([y, np.zeros(2 + nvar)]), rcond=None)
    resid = y - A @ sol
    per_node = {m: [] for m in nodes}
    for k, (a, b, t) in enumerate(rows):
        per_node[a].append(resid[k])
        per_node[b].append(resid[k])
    reach = {ref}
    changed = True
    while changed:
        changed = False
        for a, b, _ in meta:
            if (a in reach) != (b in reach):
                reach.update((a, b))
                changed = True
    est = {m: (float(sol[2 * idx[m]]), float(sol[2 * idx[m] + 1]) / scale) for m in nodes}
    return dict(est=est, t_ref=t_ref, per_node=per_node, meta=meta, reach=reach, windows=len(rows))


def refine(clocks: dict, pairs: CausalPairs, mode: str = "auto", windows: int = 16):
    """Solve per-node offset/drift from causal pairs; updates ``clocks`` in place.

    Two passes: offsets only (one window, so TSC origins that are arbitrary
    without calibration are brought together), then offset + drift over
    ``windows`` time windows on the pre-aligned times.  Returns a dict
    describing what was done.
    """
    nodes = sorted(clocks)
    info = {"mode": mode, "applied": False, "pairs": int(len(pairs)), "reference_node": None}
    if mode == "never" or len(nodes) < 2 or len(pairs) == 0:
        info["reason"] = "disabled" if mode == "never" else ("single node" if len(nodes) < 2 else "no matched pairs")
        return info
    ref = next((n for n in nodes if clocks[n].ptp), None)
    if ref is None:
        ref = next((n for n in nodes if clocks[n].pairs), nodes[0])
    info["reference_node"] = int(ref)
    index = _PairIndex(pairs)
    s1 = _solve(pairs, nodes, ref, 1, index)
    if s1 is None:
        info["method"] = "bounds"
        return _bounds_only(clocks, pairs, nodes, ref, info, mode)
    o1 = {m: (s1["est"][m][0] if m in s1["reach"] else 0.0) for m in nodes}
    # second pass on the pre-aligned times (t - rint(offset of its node)), applied per node-pair group
    shift = {m: int(np.rint(o1[m])) for m in nodes}
    s2 = _solve(pairs, nodes, ref, windows, index, shift) or s1
    est2 = s2["est"] if s2 is not s1 else {m: (0.0, 0.0) for m in nodes}
    reach = s1["reach"]
    res = {m: (float(np.sqrt(np.mean(np.square(s2["per_node"][m])))) if s2["per_node"][m] else float("nan"))
           for m in nodes}
    missing = any(clocks[m].pairs == 0 for m in nodes)
    nonptp = any(not clocks[m].ptp for m in nodes)
    disagrees = any(abs(o1[m] + est2[m][0]) > 1000.0 + 3 * (0 if np.isnan(res[m]) else res[m])
                    for m in nodes if m in reach)
    # auto: calibration missing -> apply; calibration present -> apply only when the matched-operation
    # estimate is tight (residual < 2 µs) and disagrees with it by more than 5x that residual (and 2 µs)
    tight = all((not np.isnan(res[m])) and res[m] < 2000.0 and len(s2["per_node"][m]) >= 3
                for m in nodes if m in reach)
    strong = any(abs(o1[m] + est2[m][0]) > max(2000.0, 5 * (0 if np.isnan(res[m]) else res[m]))
                 for m in nodes if m in reach)
    apply = mode == "always" or (mode == "auto" and (missing or (tight and strong and (nonptp or disagrees))))
    info.update(method="matched-ops", windows=s2["windows"], calibration_missing=missing,
                calibration_disagrees=bool(disagrees),
                node_pairs=[[int(a), int(b), int(c)] for a, b, c in s1["meta"]])
    for m in nodes:
        c = clocks[m]
        c.refine_residual_ns = res[m]
        c.refine_pairs = int(sum(p for a, b, p in s1["meta"] if m in (a, b)))
        if apply and m in reach and m != ref:
            o2, d2 = est2[m]
            # estimates are errors (measured - true) in the first-pass frame: subtract them
            c.offset_ns = -(o1[m] + o2)
            c.drift = -d2
            c.ref_ns = s2["t_ref"] + o1[m]
            c.refined = True
            c.refine_method = "matched-ops"
    info["applied"] = bool(apply)
    info["unreached_nodes"] = [int(m) for m in nodes if m not in reach]
    return info


def _bounds_only(clocks, pairs, nodes, ref, info, mode):
    """Only one direction between some nodes: shift a node so no pair runs backwards."""
    applied = False
    for m in nodes:
        if m == ref:
            continue
        into = (pairs.node_b == m) & (pairs.node_a == ref)
        outof = (pairs.node_a == m) & (pairs.node_b == ref)
        lo, hi = -np.inf, np.inf  # bounds on err_m
        if into.any():
            hi = float((pairs.t_b[into] - pairs.t_a[into]).min())   # err_m <= min(d) (delay >= 0)
        if outof.any():
            lo = -float((pairs.t_b[outof] - pairs.t_a[outof]).min())
        c = clocks[m]
        c.refine_pairs = int(into.sum() + outof.sum())
        shift = 0.0
        if hi < 0:
            shift = hi
        elif lo > 0:
            shift = lo
        if np.isfinite(lo) and np.isfinite(hi):
            shift = (lo + hi) / 2 if (mode == "always" or clocks[m].pairs == 0) else shift
        elif clocks[m].pairs == 0 and np.isfinite(hi):
            shift = hi
        elif clocks[m].pairs == 0 and np.isfinite(lo):
            shift = lo
        if shift:
            c.offset_ns = -shift
            c.refined = True
            c.refine_method = "bounds"
            applied = True
    info["applied"] = applied
    return info


class TimeBase:
    """TSC -> ns for records of many processes at once (vectorised over nodes; reads the clocks' current
    parameters at each call, so refinement applied later is seen).  Exactly ``NodeClock.to_ns`` per row.
    Picklable: the events-table writers in worker processes use it."""

    def __init__(self, clocks: dict, proc_node):
        self.clocks = clocks
        self.proc_node = np.asarray(proc_node, np.int64)

    def _params(self):
        n = max(self.clocks) + 1 if self.clocks else 1
        tsc0 = np.zeros(n, np.int64)
        ns0 = np.zeros(n, np.int64)
        slope = np.ones(n, np.float64)
        off = np.zeros(n, np.float64)
        drift = np.zeros(n, np.float64)
        ref = np.zeros(n, np.int64)
        corr = np.zeros(n, bool)
        for k, c in self.clocks.items():
            tsc0[k], ns0[k], slope[k] = np.int64(c.tsc0), np.int64(c.ns0), c.slope
            off[k], drift[k], ref[k] = c.offset_ns, c.drift, np.int64(c.ref_ns)
            corr[k] = bool(c.offset_ns or c.drift)
        return tsc0, ns0, slope, off, drift, ref, corr

    def __call__(self, proc_idx, tsc, first=False):
        proc_idx = np.asarray(proc_idx)
        if not len(tsc):
            return np.zeros(0, np.int64)
        tsc0, ns0, slope, off, drift, ref, corr = self._params()
        node = self.proc_node[proc_idx.astype(np.int64)]
        if node.ndim == 0:   # one process (the events-table batches): the same arithmetic on scalars, no gathers
            k = int(node)
            t = np.asarray(tsc).astype(np.int64)
            t -= tsc0[k]
            t = ns0[k] + np.rint(t.astype(np.float64) * slope[k]).astype(np.int64)
            if first or not corr[k]:
                return t
            return t + np.rint(off[k] + drift[k] * (t - ref[k]).astype(np.float64)).astype(np.int64)
        d = np.asarray(tsc).astype(np.int64) - tsc0[node]
        t = ns0[node] + np.rint(d.astype(np.float64) * slope[node]).astype(np.int64)
        if first or not corr.any():
            return t
        m = corr[node]
        if m.all():
            return t + np.rint(off[node] + drift[node] * (t - ref[node]).astype(np.float64)).astype(np.int64)
        nm = node[m]
        t[m] += np.rint(off[nm] + drift[nm] * (t[m] - ref[nm]).astype(np.float64)).astype(np.int64)
        return t


# ---- the correlator's clock stages -----------------------------------------------------------------------
def fit_nodes(out, procs, nodes):
    """Step 1 for every node (its processes' calibration pairs together); a warning per uncalibrated node."""
    clocks = {}
    for n in range(nodes.count):
        members = np.flatnonzero(nodes.node_of == n)
        clocks[n] = fit_node(n, [procs[i].calibration for i in members],
                             [(procs[i].header or {}).get("tsc_hz") for i in members])
        if clocks[n].pairs == 0:
            out.warnings.append(f"node {nodes.labels[n]}: no calibration pairs; its time base comes from matched "
                                f"operations only (F24b)")
    return clocks


def matched_pairs(ops, m, node_of, ranks, remote, to_ns):
    """Causal pairs (step 2's input) from matched operations: send -> the peer's receive completion, that
    receive -> the sender's completion, and request/response alternation on connected QP pairs.
    ``m``: ``ops.Matches``; times on the calibration time base (``to_ns(..., True)``)."""
    pairs = []
    o_proc, o_qp, o_tsc = ops["process"], ops["qp_id"], ops["tsc"]
    c_proc, c_tsc = m.wc_process, m.wc_tsc
    op_peer, op_compl = m.op_peer, m.op_completion
    node32 = node_of.astype(np.int32)      # narrow node ids (one pair per matched op)
    if len(o_tsc):
        s_i = np.flatnonzero(op_peer >= 0)
        if len(s_i):
            r_i = op_peer[s_i]
            pairs.append(CausalPairs(node32[o_proc[s_i]], to_ns(o_proc[s_i], o_tsc[s_i], True),
                                     node32[c_proc[r_i]], to_ns(c_proc[r_i], c_tsc[r_i], True)))
            del r_i
            both = s_i[op_compl[s_i] >= 0]
            if len(both):
                pb, cb = op_peer[both], op_compl[both]
                pairs.append(CausalPairs(node32[c_proc[pb]], to_ns(c_proc[pb], c_tsc[pb], True),
                                         node32[o_proc[both]], to_ns(c_proc[cb], c_tsc[cb], True)))
                del pb, cb, both
        del s_i
        pairs.append(alternation_pairs(o_proc, o_qp, o_tsc, m.op_remote_qp, remote, node_of, ranks,
                                       lambda pi, ts: to_ns(pi, ts, True)))
    return pairs


def refine_nodes(out, clocks, labels, pairs, mode, windows):
    """Step 2 on the pairs (consumed); a warning per corrected node."""
    cp = CausalPairs.concat(pairs, consume=True)
    del pairs[:]
    out.clock_info = refine(clocks, cp, mode, windows=windows)
    del cp
    for n, c in clocks.items():
        if c.refined:
            out.warnings.append(f"node {labels[n]}: clock corrected by {c.offset_ns / 1e3:+.3f} µs, drift "
                                f"{c.drift * 1e6:+.3f} ppm from {c.refine_pairs} matched operation pairs "
                                f"({c.refine_method}; residual {c.refine_residual_ns:.0f} ns)")


def clock_table(clocks, labels):
    nodes = sorted(clocks)
    return dict(
        node=np.array(nodes, np.int64), label=np.array([labels[n] for n in nodes], dtype=object),
        source=np.array([clocks[n].source for n in nodes], dtype=object),
        calibration_pairs=np.array([clocks[n].pairs for n in nodes], np.int64),
        ptp=np.array([clocks[n].ptp for n in nodes]),
        ns_per_tick=np.array([clocks[n].slope for n in nodes]),
        fit_residual_ns=np.array([clocks[n].fit_residual_ns for n in nodes]),
        offset_ns=np.array([clocks[n].offset_ns for n in nodes]),
        drift_ppm=np.array([clocks[n].drift * 1e6 for n in nodes]),
        refined=np.array([clocks[n].refined for n in nodes]),
        refine_pairs=np.array([clocks[n].refine_pairs for n in nodes], np.int64),
        residual_ns=np.array([clocks[n].refine_residual_ns for n in nodes]),
        method=np.array([clocks[n].refine_method or "calibration" for n in nodes], dtype=object))


def alternation_pairs(o_proc, o_qp, o_tsc, o_dqp, remote, proc_node, ranks, first_ns):
    """Causal pairs from request/response alternation on a connected QP pair across nodes.

    When A's k-th operation on qa -> B and B's k-th on qb -> A strictly alternate
    (ping-pong: A_k < B_k < A_k+1, or B first), each hop is causal.  Which side
    starts is unknown without a common clock, so both orders are tested: the
    order is accepted only if the clock offset it implies has a non-empty
    feasible interval (every delay positive) and the other order's is empty.
    Streams that do not alternate (bursts, one-way traffic) are left alone.
    """
    out = []
    if not len(o_qp):
        return CausalPairs()
    # ops grouped by QP (one stable sort); a QP's node is its process's
    o = np.argsort(o_qp, kind="stable")
    sq = o_qp[o]
    uq, st = np.unique(sq, return_index=True)
    en = np.append(st[1:], len(sq))
    grp = {int(q): o[a:b] for q, a, b in zip(uq.tolist(), st.tolist(), en.tolist())}
    qnode = {q: int(proc_node[o_proc[ix[0]]]) for q, ix in grp.items()}
    qps = [q for q in grp if q >= 0 and remote[q] >= 0 and int(remote[q]) in qnode and qnode[int(remote[q])] != qnode[q]]
    done = set()
    qset = set(qps)
    for qa in qps:
        qb = int(remote[qa])
        if qb < 0 or (qb, qa) in done or qb not in qset:
            continue
        done.add((qa, qb))
        ia = grp[qa]
        ib = grp[qb]
        if min(len(ia), len(ib)) < 8 or abs(len(ia) - len(ib)) > 1:
            continue
        ta = first_ns(o_proc[ia], o_tsc[ia])
        tb = first_ns(o_proc[ib], o_tsc[ib])
        ia, ta = ia[np.argsort(ta, kind="stable")], np.sort(ta)
        ib, tb = ib[np.argsort(tb, kind="stable")], np.sort(tb)
        n = min(len(ta), len(tb))

        def feasible(x, y):  # x_k -> y_k -> x_{k+1}: bounds on err_y - err_x
            hi = (y[:n] - x[:n]).min()
            m = min(n, len(x) - 1)
            lo = (y[:m] - x[1:m + 1]).max() if m > 0 else -np.inf
            return lo <= hi
        h1, h2 = feasible(ta, tb), feasible(tb, ta)
        if not (h1 or h2):
            continue
        if h1 and h2:
            # a perfect alternation fits both orders (shifted by one period): the initiator is taken
            # to be the lower rank (ping-pong convention); with clocks the bounds decide
            ra, rb = ranks[o_proc[ia[0]]], ranks[o_proc[ib[0]]]
            h1, h2 = bool(ra <= rb), bool(rb < ra)
        x_t, y_t, xi, yi = (ta, tb, ia, ib) if h1 else (tb, ta, ib, ia)
        na, nb = proc_node[o_proc[xi[0]]], proc_node[o_proc[yi[0]]]
        m = min(n, len(x_t) - 1)
        out.append(CausalPairs(np.full(n, na, np.int32), x_t[:n], np.full(n, nb, np.int32), y_t[:n]))
        out.append(CausalPairs(np.full(m, nb, np.int32), y_t[:m], np.full(m, na, np.int32), x_t[1:m + 1]))
    return CausalPairs.concat(out)
