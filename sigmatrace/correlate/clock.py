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

from dataclasses import dataclass

import numpy as np

from ..format import layout as L
from .refine import CausalPairs, LocalPairs, alternation_pairs, refine, send_pairs


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


def matched_pairs(ops, m, node_of, ranks, remote, to_ns, qp_process):
    """Causal pairs (step 2's input) from matched operations: send -> the peer's receive completion, that
    receive -> the sender's completion, and request/response alternation on connected QP pairs.
    ``m``: ``ops.Matches``; times on the calibration time base (``to_ns(..., True)``)."""
    pairs = []
    o_proc, o_qp, o_tsc = ops["process"], ops["qp_id"], ops["tsc"]
    c_proc, c_tsc = m.wc_process, m.wc_tsc
    op_peer, op_compl = m.op_peer, m.op_completion
    if len(o_tsc):
        s_i = np.flatnonzero(op_peer >= 0)
        if len(s_i):
            r_i, cb = op_peer[s_i], op_compl[s_i]
            c_ok = cb >= 0
            cbc = np.where(c_ok, cb, 0)
            pairs += send_pairs(node_of, o_proc[s_i], to_ns(o_proc[s_i], o_tsc[s_i], True), c_proc[r_i],
                                to_ns(c_proc[r_i], c_tsc[r_i], True), c_ok,
                                to_ns(c_proc[cbc], c_tsc[cbc], True) if len(cbc) else np.zeros(0, np.int64))
            del r_i, cb, cbc
        del s_i
        pairs.append(alternation_pairs(o_proc, o_qp, o_tsc, remote, node_of, ranks,
                                       lambda pi, ts: to_ns(pi, ts, True), qp_process))
    return pairs


def refine_nodes(out, clocks, labels, pairs, mode, windows):
    """Step 2 on the pairs (consumed); a warning per corrected node."""
    cp = CausalPairs.concat(pairs, consume=True)
    del pairs[:]
    out.clock_info = refine(clocks, LocalPairs(cp), mode, windows=windows)
    del cp
    refined_warnings(out, clocks, labels)


def refined_warnings(out, clocks, labels):
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
