"""What the Perfetto export draws (``Window``): one time window for every kind of event — the ``max_events``
earliest ones across host calls, doorbells and operations, ties at the cut included — and the bandwidth
counters of the whole run.

The window is defined by order statistics and sums only, so it can be computed from parts of a capture: the
cut is the ``max_events``-th smallest time among the host events, doorbells and operation candidates, and
every part's ``max_events`` earliest (ties included) contain everything at or before it; the counters are
sums of integer byte counts per (GPU | node | QP, time bin), exact in float64 in any order.  The local report
builds it here (``perfetto_window``); the cluster report from its parts (sigmatrace.cluster).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tables.host_events import host_events

SCAN_ROWS = 1 << 22        # operations per range in the streaming pass over ops
QP_SERIES_MAX = 1 << 24    # per-QP bins kept in the first pass (else a second pass for the top QPs only)
TOP_QPS = 64               # QPs with a bandwidth counter
SCAN_COLUMNS = ("ns", "bytes", "gpu", "node", "qp_id")


@dataclass
class Window:
    ev_t: dict              # the host events the window may draw (the max_events earliest, ties included)
    n_host: int             # host events in the capture
    doorbells: dict         # the drawn doorbells' columns (ns <= cut), in doorbell order
    n_doorbells: int
    ops: dict               # the drawn operations' columns (every ops column, and ``doorbell_pi``: the
    drawn: np.ndarray       # producer index of each one's doorbell), rows ``drawn`` (op ids, ascending)
    n_ops: int
    scan: dict              # counters: t0, bin_ns, nb, gpu and node (GB/s per bin), top_qps, qp
    cut: int | None
    truncated: bool


def ops_cols(ops_t, sel, names):
    if hasattr(ops_t, "rows"):
        return ops_t.rows(sel, names)
    return {k: np.asarray(ops_t[k])[sel] for k in names}


def scan_grid(time_range, bins):
    """(t0, bin_ns, bins) of the counters over ``time_range``."""
    t0, t1 = int(time_range[0]), int(time_range[1]) + 1
    bin_ns = max(1000, (t1 - t0) // bins + 1)
    return t0, bin_ns, int((t1 - t0) // bin_ns) + 1


def earliest(ns, keep):
    """Rows of the ``keep`` earliest of ``ns``, ties at the last one included (all when there are fewer)."""
    ns = np.asarray(ns)
    if keep <= 0:
        return np.zeros(0, np.int64)
    if len(ns) <= keep:
        return np.arange(len(ns))
    return np.flatnonzero(ns <= np.partition(ns, keep - 1)[keep - 1])


class ScanPart:
    """Egress bytes per (GPU | node | QP, time bin) of some operations, per-QP totals, and the ``keep`` earliest
    operations of each range added (ns, op row) as candidates for the window.  Per-QP series only for the QPs
    [qp_lo, qp_hi) (None: none; the top QPs' series then need a second pass)."""

    def __init__(self, grid, n_gpu, n_node, n_qp, keep, qp_range=(0, 0)):
        self.t0, self.bin_ns, self.nb = grid
        self.n_gpu, self.n_node, self.n_qp, self.keep = n_gpu, n_node, n_qp, keep
        self.gpu = np.zeros(n_gpu * self.nb)
        self.node = np.zeros(n_node * self.nb)
        self.qp_range = qp_range
        self.qp = np.zeros((qp_range[1] - qp_range[0]) * self.nb) if qp_range is not None else None
        self.qtot = np.zeros(n_qp)
        self.cand_ns, self.cand_row = [], []

    def bins(self, ns):
        return np.clip((np.asarray(ns, np.int64) - self.t0) // self.bin_ns, 0, self.nb - 1)

    def add(self, c, rows):
        """Columns ``SCAN_COLUMNS`` of some operations (their op rows ``rows``)."""
        nb = self.nb
        ns = np.asarray(c["ns"], np.int64)
        b = self.bins(ns)
        w = np.asarray(c["bytes"], np.float64)
        _add(np.asarray(c["gpu"]), self.n_gpu, b, w, self.gpu, nb)
        _add(np.asarray(c["node"]), self.n_node, b, w, self.node, nb)
        q = np.asarray(c["qp_id"])
        hasq = (q >= 0) & (q < self.n_qp)          # UCX / libfabric ops have no QP
        self.qtot += np.bincount(q[hasq], weights=w[hasq], minlength=self.n_qp)
        if self.qp is not None:
            lo, hi = self.qp_range
            _add(np.where((q >= lo) & (q < hi), q - lo, -1), hi - lo, b, w, self.qp, nb)
        if self.keep > 0:
            # this range's keep earliest, ties included: every op at or before the window's end (the keep-th
            # earliest of all candidates, never later than any range's keep-th) is among them
            r = earliest(ns, self.keep)
            self.cand_ns.append(ns[r])
            self.cand_row.append(np.asarray(rows)[r])

    def candidates(self):
        return (np.concatenate(self.cand_ns) if self.cand_ns else np.zeros(0, np.int64),
                np.concatenate(self.cand_row) if self.cand_row else np.zeros(0, np.int64))


def _add(key, n, b, w, into, nb):
    ok = (key >= 0) & (key < n)
    into += np.bincount(key[ok].astype(np.int64) * nb + b[ok], weights=w[ok], minlength=n * nb)


def top_qps(qtot):
    return [int(q) for q in np.argsort(-qtot, kind="stable")[:TOP_QPS] if qtot[q] > 0]


def scan_result(grid, gpu, node, top, per_qp):
    """The counters (bytes per bin -> GB/s) as the export draws them."""
    t0, bin_ns, nb = grid
    return dict(t0=t0, bin_ns=bin_ns, nb=nb, gpu=gpu.reshape(-1, nb) / bin_ns, node=node.reshape(-1, nb) / bin_ns,
                top_qps=top, qp=per_qp.reshape(len(top), nb) / bin_ns)


def _scan_ops(ops_t, n_ops, n_gpu, n_node, n_qp, keep, bins, time_range=None):
    """One streaming pass over the operations (ranges of SCAN_ROWS rows, so no column of every op is held):
    the counters and the window's candidates.  The bins span ``time_range`` (the capture's) when known."""
    if time_range is None or time_range[1] < time_range[0]:
        lo = hi = None
        for a in range(0, n_ops, SCAN_ROWS):
            ns = ops_cols(ops_t, slice(a, min(a + SCAN_ROWS, n_ops)), ("ns",))["ns"]
            if len(ns):
                lo = int(ns.min()) if lo is None else min(lo, int(ns.min()))
                hi = int(ns.max()) if hi is None else max(hi, int(ns.max()))
        time_range = (lo or 0, hi or 0)
    grid = scan_grid(time_range, bins)
    nb = grid[2]
    part = ScanPart(grid, n_gpu, n_node, n_qp, keep, (0, n_qp) if n_qp * nb <= QP_SERIES_MAX else None)
    for a in range(0, n_ops, SCAN_ROWS):
        part.add(ops_cols(ops_t, slice(a, min(a + SCAN_ROWS, n_ops)), SCAN_COLUMNS), np.arange(a, min(a + SCAN_ROWS, n_ops)))
    top = top_qps(part.qtot)
    if part.qp is not None:
        per_qp = part.qp.reshape(n_qp, nb)[top]
    else:                                  # many QPs: the top ones' series in a second pass
        slot = np.full(n_qp, -1, np.int64)
        slot[top] = np.arange(len(top))
        per_qp = np.zeros(len(top) * nb)
        for a in range(0, n_ops, SCAN_ROWS):
            c = ops_cols(ops_t, slice(a, min(a + SCAN_ROWS, n_ops)), ("ns", "bytes", "qp_id"))
            q = np.asarray(c["qp_id"])
            k = np.where((q >= 0) & (q < n_qp), slot[np.clip(q, 0, max(n_qp - 1, 0))], -1)
            _add(k, len(top), part.bins(c["ns"]), np.asarray(c["bytes"], np.float64), per_qp, nb)
    return scan_result(grid, part.gpu, part.node, top, per_qp), part.candidates()


def window_cut(max_events, total, ns_parts):
    """(cut, truncated): the window ends at the ``max_events``-th earliest of the candidate times (``ns_parts``:
    every kind's earliest ``max_events``, ties included, or all), when the capture has more (``total``)."""
    if total <= max_events:
        return None, False
    every_ns = np.concatenate([np.asarray(v, np.int64) for v in ns_parts]) if ns_parts else np.zeros(0, np.int64)
    if 0 < max_events <= len(every_ns):
        return int(np.partition(every_ns, max_events - 1)[max_events - 1]), True
    return (int(every_ns.max()) if len(every_ns) and max_events > 0 else None), True


def in_window(ns, cut, truncated, max_events):
    """Rows of ``ns`` inside the drawn window."""
    ns = np.asarray(ns)
    if cut is None:
        return np.arange(len(ns)) if max_events > 0 or not truncated else np.zeros(0, np.int64)
    return np.flatnonzero(ns <= cut)


def perfetto_window(corr, max_events, bins):
    """The ``Window`` of a correlated capture held here (the local report)."""
    T = corr.tables
    D = T["doorbells"]
    G, Q = T["gpus"], T["qps"]
    ops_t = T["ops"]
    n_ops = ops_t.n_rows if hasattr(ops_t, "rows") else len(ops_t["op_id"])
    ev_t, n_host = host_events(corr, max_events)
    tr = corr.stats.get("time_range_ns") if hasattr(corr, "stats") else None
    scan, (cand_ns, cand_row) = _scan_ops(ops_t, n_ops, len(G["gpu"]), len(T["nodes"]["label"]), len(Q["qp_id"]),
                                          max(0, max_events), bins, tuple(tr) if tr else None)
    cut, truncated = window_cut(max_events, n_host + len(D["ns"]) + n_ops, [ev_t["ns"], D["ns"], cand_ns])
    dsel = in_window(D["ns"], cut, truncated, max_events)
    if truncated:
        drawn = np.sort(cand_row[cand_ns <= cut]) if cut is not None else np.zeros(0, np.int64)
    else:
        drawn = np.arange(n_ops)
    ops = ops_cols(ops_t, drawn, ops_t.columns if hasattr(ops_t, "columns") else tuple(ops_t))
    dbi = np.asarray(ops["doorbell_id"], np.int64) if len(drawn) else np.zeros(0, np.int64)
    pi = np.asarray(D["producer_index"], np.int64)
    ops["doorbell_pi"] = np.where(dbi >= 0, pi[np.maximum(dbi, 0)] if len(pi) else -1, -1)
    return Window(ev_t=ev_t, n_host=n_host, doorbells={k: np.asarray(v)[dsel] for k, v in D.items()},
                  n_doorbells=len(D["ns"]), ops=ops, drawn=drawn, n_ops=n_ops, scan=scan, cut=cut, truncated=truncated)
