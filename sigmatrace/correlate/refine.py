"""F24b clock refinement from causal pairs ("a on node A happened before b on node B"), on reducible
statistics so that the pairs never have to be in one place.

For a node pair with traffic both ways, the minimum one-way delays per time window, d_AB and d_BA, give
``err_B - err_A = (d_AB - d_BA) / 2``; the window estimates of every node pair are solved together by least
squares for per-node offset and drift (``clock`` module docstring).  What a pass needs of the pairs is, per
directed node pair (x, y) and window: the number of pairs, the minimum of ``t_b - t_a`` (int64) and the
exact sum of the window times (the time of the end on the lower-numbered node, minus that node's shift), plus
the group's first and last window time.  Minima, counts and exact (integer) sums combine in any order and
grouping, so the statistics of parts of the pairs (``pair_stats`` on each part, ``merge_stats``) are the
statistics of all of them, bit for bit: the local correlator computes them on all pairs at once
(``LocalPairs``), the cluster report per process file and merges them (sigmatrace.cluster).

Two passes: offsets only (one window per node pair; the TSC origins of uncalibrated nodes brought together),
then offset + drift over ``windows`` windows on the pre-aligned times (each node's times shifted by its
first-pass offset).  ``refine`` asks its pair source for each pass's statistics (``source.stats(plan)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_I64_MAX = np.iinfo(np.int64).max
_SUM_CHUNK = 1 << 30        # rows summed at a time: int64 partial sums of 32-bit halves cannot overflow


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


class PairIndex:
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


# ---- reducible statistics ---------------------------------------------------------------------------------
@dataclass
class GroupStats:
    """One directed node pair's pairs in one pass: per window the count, the minimum of t_b - t_a and the
    exact sum of the window times (Python ints); the first and last window time of the group."""
    n: np.ndarray
    min_d: np.ndarray
    sum_t: list
    t_min: int
    t_max: int

    def merge(self, o: "GroupStats") -> "GroupStats":
        return GroupStats(self.n + o.n, np.minimum(self.min_d, o.min_d), [a + b for a, b in zip(self.sum_t, o.sum_t)],
                          min(self.t_min, o.t_min), max(self.t_max, o.t_max))


def _exact_sums(t, w, nwin):
    """Per window, the exact sum of the int64 values ``t`` (``w``: window of each; None = one window)."""
    out = [0] * nwin
    for a in range(0, len(t), _SUM_CHUNK):
        c = t[a:a + _SUM_CHUNK]
        hi, lo = c >> np.int64(32), c & np.int64(0xFFFFFFFF)
        if w is None:
            out[0] += (int(hi.sum()) << 32) + int(lo.sum())
            continue
        wc = w[a:a + _SUM_CHUNK]
        sh, sl = np.zeros(nwin, np.int64), np.zeros(nwin, np.int64)
        np.add.at(sh, wc, hi)
        np.add.at(sl, wc, lo)
        for k in range(nwin):
            out[k] += (int(sh[k]) << 32) + int(sl[k])
    return out


def pair_stats(pairs: CausalPairs, plan=None, index: PairIndex | None = None) -> dict:
    """{(x, y): GroupStats} of the pairs from node x to node y (x != y).  ``plan``: None for the first pass
    (every directed pair, one window, no shift), else {(a, b) with a < b: (shift of a, window edges)} for
    the second (only those node pairs; times shifted by the lower node's first-pass offset)."""
    index = index if index is not None else PairIndex(pairs)
    out = {}
    for (x, y), rows in index.groups.items():
        if x == y:
            continue
        if plan is None:
            shift, edges = 0, None
        else:
            got = plan.get((min(x, y), max(x, y)))
            if got is None:
                continue
            shift, edges = got
        ta, tb = pairs.t_a[rows], pairs.t_b[rows]
        tw = (ta if x < y else tb) - np.int64(shift)      # the end on the lower node, on its shifted clock
        d = tb - ta
        if edges is None:
            n, min_d, w, nwin = np.array([len(d)], np.int64), np.array([d.min()], np.int64), None, 1
        else:
            nwin = len(edges) - 1
            w = np.clip(np.searchsorted(edges, tw, "right") - 1, 0, nwin - 1)
            n = np.bincount(w, minlength=nwin).astype(np.int64)
            min_d = np.full(nwin, _I64_MAX, np.int64)
            np.minimum.at(min_d, w, d)
        out[(x, y)] = GroupStats(n, min_d, _exact_sums(tw, w, nwin), int(tw.min()), int(tw.max()))
    return out


def merge_stats(parts) -> dict:
    """The statistics of several parts of the pairs (``pair_stats`` of each) as one."""
    out = {}
    for p in parts:
        for k, g in p.items():
            out[k] = g if k not in out else out[k].merge(g)
    return out


class LocalPairs:
    """A pair source over pairs held here (the local correlator)."""

    def __init__(self, pairs: CausalPairs):
        self.pairs = pairs
        self.count = len(pairs)
        self.index = PairIndex(pairs)

    def stats(self, plan=None):
        return pair_stats(self.pairs, plan, self.index)


# ---- the solve ------------------------------------------------------------------------------------------
def _both_ways(stats, nodes):
    """Node pairs (a < b, in node order) with pairs in both directions."""
    return [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:] if (a, b) in stats and (b, a) in stats]


def _estimates(fwd: GroupStats, bwd: GroupStats, sa, sb):
    """(t_mid, delta = err_b - err_a) per window where both directions have pairs, and the pair count."""
    ok = (fwd.n > 0) & (bwd.n > 0)
    if not ok.any():
        return None
    minf = (fwd.min_d + np.int64(sa - sb)).astype(np.float64)      # t_b - sb - (t_a - sa) on a's clock
    minb = (bwd.min_d + np.int64(sb - sa)).astype(np.float64)
    cnt = fwd.n + bwd.n
    tm = np.array([(fwd.sum_t[k] + bwd.sum_t[k]) / int(cnt[k]) for k in np.flatnonzero(ok).tolist()], np.float64)
    return tm, (minf[ok] - minb[ok]) / 2.0, int(fwd.n.sum() + bwd.n.sum())


def window_plan(stats, nodes, shift, windows):
    """Second pass: {(a, b): (shift of a, window edges)} for the node pairs seen both ways, from the first
    pass's statistics (window times unshifted there)."""
    plan = {}
    for a, b in _both_ways(stats, nodes):
        f, g = stats[(a, b)], stats[(b, a)]
        sa = int(shift[a])
        lo, hi = min(f.t_min, g.t_min) - sa, max(f.t_max, g.t_max) - sa
        nwin = max(1, min(windows, int(f.n.sum()) // 4, int(g.n.sum()) // 4))
        plan[(a, b)] = (sa, np.linspace(lo, hi + 1, nwin + 1))
    return plan


def _solve(est_by_pair, nodes, ref):
    idx = {n: i for i, n in enumerate(nodes)}
    rows, rhs, meta = [], [], []
    for (a, b), est in est_by_pair.items():
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


def refine(clocks: dict, source, mode: str = "auto", windows: int = 16):
    """Solve per-node offset/drift from causal pairs; updates ``clocks`` in place.

    ``source``: the pairs (``count``, ``stats(plan)``: ``LocalPairs`` or the cluster report's).  Two passes:
    offsets only (one window, so TSC origins that are arbitrary without calibration are brought together),
    then offset + drift over ``windows`` time windows on the pre-aligned times.  Returns a dict describing
    what was done."""
    nodes = sorted(clocks)
    info = {"mode": mode, "applied": False, "pairs": int(source.count), "reference_node": None}
    if mode == "never" or len(nodes) < 2 or source.count == 0:
        info["reason"] = "disabled" if mode == "never" else ("single node" if len(nodes) < 2 else "no matched pairs")
        return info
    ref = next((n for n in nodes if clocks[n].ptp), None)
    if ref is None:
        ref = next((n for n in nodes if clocks[n].pairs), nodes[0])
    info["reference_node"] = int(ref)
    st1 = source.stats(None)
    s1 = _solve({k: _estimates(st1[k], st1[k[::-1]], 0, 0) for k in _both_ways(st1, nodes)}, nodes, ref)
    if s1 is None:
        info["method"] = "bounds"
        return _bounds_only(clocks, st1, nodes, ref, info, mode)
    o1 = {m: (s1["est"][m][0] if m in s1["reach"] else 0.0) for m in nodes}
    # second pass on the pre-aligned times (t - rint(offset of its node)), applied per node-pair group
    shift = {m: int(np.rint(o1[m])) for m in nodes}
    plan = window_plan(st1, nodes, shift, windows)
    st2 = source.stats(plan)
    s2 = _solve({(a, b): _estimates(st2[(a, b)], st2[(b, a)], shift[a], shift[b]) for a, b in plan
                 if (a, b) in st2 and (b, a) in st2}, nodes, ref) or s1
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


def _bounds_only(clocks, stats, nodes, ref, info, mode):
    """Only one direction between some nodes: shift a node so no pair runs backwards."""
    applied = False
    for m in nodes:
        if m == ref:
            continue
        into, outof = stats.get((ref, m)), stats.get((m, ref))
        lo, hi = -np.inf, np.inf  # bounds on err_m
        if into is not None:
            hi = float(into.min_d.min())   # err_m <= min(d) (delay >= 0)
        if outof is not None:
            lo = -float(outof.min_d.min())
        c = clocks[m]
        c.refine_pairs = int((into.n.sum() if into is not None else 0) + (outof.n.sum() if outof is not None else 0))
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


# ---- the pairs ------------------------------------------------------------------------------------------
def send_pairs(node_of, o_proc, o_ns, p_proc, p_ns, c_ok, c_ns):
    """Pairs of matched sends: the post -> the peer's receive completion, and that receive -> the sender's own
    completion (where ``c_ok``).  Rows: the matched sends; times on the first-pass time base."""
    node32 = np.asarray(node_of).astype(np.int32)
    out = [CausalPairs(node32[o_proc], o_ns, node32[p_proc], p_ns)]
    if c_ok.any():
        out.append(CausalPairs(node32[p_proc[c_ok]], p_ns[c_ok], node32[o_proc[c_ok]], c_ns[c_ok]))
    return out


def alternation_candidates(qp_ops, qp_node, remote):
    """The QP pairs (qa, qb = remote of qa) across nodes whose operation counts allow a strict alternation
    (at least 8 each, counts differing by at most one), in the order ``alternation_pairs`` tests them.
    ``qp_ops``: operations per QP; ``qp_node``: the node of each QP's process."""
    qp_ops, remote, qp_node = np.asarray(qp_ops), np.asarray(remote), np.asarray(qp_node)
    has = qp_ops > 0
    qps = [q for q in np.flatnonzero(has).tolist()
           if remote[q] >= 0 and has[remote[q]] and qp_node[remote[q]] != qp_node[q]]
    done, qset, out = set(), set(qps), []
    for qa in qps:
        qb = int(remote[qa])
        if (qb, qa) in done or qb not in qset:
            continue
        done.add((qa, qb))
        na, nb = int(qp_ops[qa]), int(qp_ops[qb])
        if min(na, nb) < 8 or abs(na - nb) > 1:
            continue
        out.append((qa, qb))
    return out


def alternation_pair(ta, tb, rank_a, rank_b, node_a, node_b):
    """Causal pairs of one QP pair's operations (first-pass ns of each side, any order) when they strictly
    alternate (ping-pong: A_k < B_k < A_k+1, or B first), else None.

    Which side starts is unknown without a common clock, so both orders are tested: the order is accepted
    only if the clock offset it implies has a non-empty feasible interval (every delay positive) and the
    other order's is empty; a perfect alternation fits both (shifted by one period): the initiator is then
    taken to be the lower rank (ping-pong convention)."""
    ta, tb = np.sort(ta), np.sort(tb)
    n = min(len(ta), len(tb))

    def feasible(x, y):  # x_k -> y_k -> x_{k+1}: bounds on err_y - err_x
        hi = (y[:n] - x[:n]).min()
        m = min(n, len(x) - 1)
        lo = (y[:m] - x[1:m + 1]).max() if m > 0 else -np.inf
        return lo <= hi
    h1, h2 = feasible(ta, tb), feasible(tb, ta)
    if not (h1 or h2):
        return None
    if h1 and h2:
        h1, h2 = bool(rank_a <= rank_b), bool(rank_b < rank_a)
    x_t, y_t, nx, ny = (ta, tb, node_a, node_b) if h1 else (tb, ta, node_b, node_a)
    m = min(n, len(x_t) - 1)
    return CausalPairs.concat([CausalPairs(np.full(n, nx, np.int32), x_t[:n], np.full(n, ny, np.int32), y_t[:n]),
                               CausalPairs(np.full(m, ny, np.int32), y_t[:m], np.full(m, nx, np.int32),
                                           x_t[1:m + 1])])


def alternation_pairs(o_proc, o_qp, o_tsc, remote, proc_node, ranks, first_ns, qp_process):
    """Causal pairs from request/response alternation on connected QP pairs across nodes (every op here)."""
    if not len(o_qp):
        return CausalPairs()
    o = np.argsort(o_qp, kind="stable")
    sq = o_qp[o]
    nq = len(remote)
    counts = np.bincount(sq[sq >= 0], minlength=nq) if nq else np.zeros(0, np.int64)
    qp_node = np.asarray(proc_node)[np.asarray(qp_process)] if nq else np.zeros(0, np.int64)
    out = []
    starts = np.searchsorted(sq, np.arange(nq + 1))
    for qa, qb in alternation_candidates(counts, qp_node, remote):
        ia, ib = o[starts[qa]:starts[qa + 1]], o[starts[qb]:starts[qb + 1]]
        pa, pb = int(qp_process[qa]), int(qp_process[qb])
        got = alternation_pair(first_ns(o_proc[ia], o_tsc[ia]), first_ns(o_proc[ib], o_tsc[ib]), ranks[pa],
                               ranks[pb], proc_node[pa], proc_node[pb])
        if got is not None:
            out.append(got)
    return CausalPairs.concat(out)
