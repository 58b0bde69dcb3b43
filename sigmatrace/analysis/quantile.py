"""Exact quantiles of an integer column in bounded memory, per group, over a DuckDB relation.

DuckDB's ``quantile_cont`` keeps every value of a group in memory and does not spill (under a memory limit it
fails with "Out of Memory"), so a report's latency quantiles would hold 8 bytes per operation in the process
that writes the summary -- the cluster report's driver.  Here the order statistics are found by radix
selection instead: one streaming GROUP BY for each group's count, min and max, then passes that count the
values of each wanted rank's current range in at most ``2**BUCKET_BITS`` buckets (one bucket holds the rank;
its range is the next pass's), until the range is one value (≤ 4 passes for 64-bit values, 2 for nanosecond
latencies below 2**32).  Memory: the buckets of one pass, whatever the number of values.

The quantile between the two order statistics is numpy's ``method='linear'`` (``numpy.quantile``'s default:
virtual index ``q * (n - 1)``, the same lerp), so the values are numpy's on the same data exactly.
"""
from __future__ import annotations

import math

import numpy as np

BUCKET_BITS = 16
_seq = [0]


def _lerp(a: int, b: int, t: float) -> float:
    """numpy's ``_lerp`` for int64 ``a``, ``b`` and a float64 ``t`` (numpy.lib._function_base_impl)."""
    d = np.int64(b) - np.int64(a)
    if t >= 0.5:
        return float(np.int64(b) - d * np.float64(1 - t))
    return float(np.int64(a) + d * np.float64(t))


def _ranks(n, qs):
    out = []
    for q in qs:
        vi = np.float64(q) * np.float64(n - 1)
        prev = math.floor(vi)
        nxt = min(prev + 1, n - 1)
        out.append((int(prev), int(nxt), float(vi - prev)))
    return out


class Selection:
    """The radix selection of the order statistics that ``qs`` need, per group, from the groups' counts, mins
    and maxes: ``targets`` lists the ranks still to find ([group, rank, lo, hi, below]: the rank lies in
    [lo, hi], ``below`` values of the group are smaller than lo); ``buckets()`` gives each its bucket width
    this pass; ``feed`` takes the counts of the values in each target's range per bucket, however they were
    counted (a DuckDB query here, the sum of every part's counts in the cluster report) and narrows the ranges;
    ``result()`` once no target is left."""

    def __init__(self, stats, qs):
        self.plan, self.found, self.targets = {}, {}, []    # found: (group, rank) -> value
        for g, (n, lo, hi) in stats.items():
            if not n:
                continue
            self.plan[g] = (int(n), _ranks(int(n), qs))
            for r in sorted({r for p, x, _ in self.plan[g][1] for r in (p, x)}):
                if lo == hi:
                    self.found[(g, r)] = int(lo)
                else:
                    self.targets.append([g, r, int(lo), int(hi), 0])

    def buckets(self):
        """[(target id, group, lo, hi, shift)]: this pass counts the values v of ``group`` in [lo, hi] per
        bucket (v - lo) >> shift (at most 2**BUCKET_BITS buckets per target)."""
        return [(tid, g, lo, hi, max(0, (hi - lo).bit_length() - BUCKET_BITS))
                for tid, (g, _, lo, hi, _) in enumerate(self.targets)]

    def ranges(self):
        """This pass's distinct (group, lo, hi, shift) of ``buckets()`` (the targets of one group share their
        range until their ranks part): what ``count_buckets`` counts."""
        return sorted({b[1:] for b in self.buckets()}, key=lambda r: (repr(r[0]), r[1:]))

    def feed(self, by):
        """``by``: {target id: (buckets, counts)} of this pass's ``buckets()`` (arrays, in bucket order)."""
        left = []
        for (tid, _, _, _, shift), t in zip(self.buckets(), self.targets):
            g, r, lo, hi, below = t
            b, c = by.get(tid, ((), ()))
            acc = below + np.cumsum(np.asarray(c, np.int64))
            i = int(np.searchsorted(acc, r, "right"))      # the first bucket whose running count passes r
            if i >= len(acc):   # cannot happen: the ranges hold the rank
                raise RuntimeError(f"quantile selection lost rank {r} of group {g}")
            nlo = lo + (int(b[i]) << shift)
            nhi = min(hi, nlo + (1 << shift) - 1)
            if nlo == nhi:
                self.found[(g, r)] = nlo
            else:
                left.append([g, r, nlo, nhi, int(acc[i - 1]) if i else below])
        self.targets = left

    def feed_ranges(self, counts):
        """``feed`` from counts per range ({(group, lo, hi, shift): (buckets, counts)}: ``count_buckets``)."""
        self.feed({b[0]: counts[b[1:]] for b in self.buckets() if b[1:] in counts})

    def result(self):
        """{group: [quantile for each of qs]} (numpy.quantile linear)."""
        return {g: [_lerp(self.found[(g, p)], self.found[(g, x)], t) for p, x, t in rk]
                for g, (n, rk) in self.plan.items()}


def count_buckets(sorted_values, ranges):
    """A pass's counts over one part's values: ``sorted_values`` {group: its values, sorted (int64)},
    ``ranges`` ``Selection.ranges()``; {range: (buckets uint64, counts int64)}, the buckets that hold values,
    in order.  Exact with any int64 values; at most 2**BUCKET_BITS buckets per range, whatever the values."""
    out = {}
    for rng in ranges:
        g, lo, hi, shift = rng
        v = sorted_values.get(g)
        if v is None or not len(v):
            continue
        a, b = np.searchsorted(v, lo, "left"), np.searchsorted(v, hi, "right")
        if a == b:
            continue
        # v - lo in [0, hi - lo] < 2**64: exact in uint64 arithmetic whatever the signs
        d = v[a:b].view(np.uint64) - np.uint64(lo % (1 << 64))
        ub, uc = np.unique(d >> np.uint64(shift), return_counts=True)
        out[rng] = (ub, uc.astype(np.int64))
    return out


def merge_counts(*parts):
    """The sum of several ``count_buckets`` results (any grouping), each range's buckets in order."""
    acc = {}
    for p in parts:
        for rng, bc in p.items():
            acc.setdefault(rng, []).append(bc)
    out = {}
    for rng, got in acc.items():
        if len(got) == 1:
            out[rng] = got[0]
            continue
        ub, inv = np.unique(np.concatenate([b for b, _ in got]), return_inverse=True)
        n = np.zeros(len(ub), np.int64)
        np.add.at(n, inv, np.concatenate([c for _, c in got]))
        out[rng] = (ub, n)
    return out


def grouped_quantiles(con, source, keys, value, qs, stats=None):
    """{group: [quantile of ``value`` for each of ``qs``]} over the rows of ``source`` (SQL of a relation)
    where ``value`` (an integer column) is not NULL, per distinct tuple of the ``keys`` columns (``()``: one
    group, key ``()``).  Exact (numpy.quantile linear); bounded memory (module docstring).  ``stats``: the
    groups' {key: (count, min, max)} when already known (else one GROUP BY here finds them)."""
    keys = list(keys)
    if stats is None:
        kcols = ", ".join(f'"{k}"' for k in keys)
        sel = f"{kcols}, " if keys else ""
        grp = f"GROUP BY {kcols}" if keys else ""
        rows = con.execute(f'SELECT {sel}count("{value}"), min("{value}"), max("{value}") FROM ({source}) '
                           f'WHERE "{value}" IS NOT NULL {grp}').fetchall()
        stats = {tuple(row[:len(keys)]): row[len(keys):] for row in rows}
    S = Selection(stats, qs)
    _seq[0] += 1
    name = f"_sigmatrace_quantile_targets_{_seq[0]}"
    import pyarrow as pa
    while S.targets:
        bk = S.buckets()
        cols = {f"k{i}": [g[i] for _, g, _, _, _ in bk] for i in range(len(keys))}
        tab = pa.table(dict(cols, tid=np.array([b[0] for b in bk], np.int64),
                            lo=np.array([b[2] for b in bk], np.int64),
                            hi=np.array([b[3] for b in bk], np.int64), shift=np.array([b[4] for b in bk], np.int64)))
        con.register(name, tab)
        try:
            on = " AND ".join([f's."{k}" IS NOT DISTINCT FROM t.k{i}' for i, k in enumerate(keys)] +
                              [f's."{value}" BETWEEN t.lo AND t.hi'])
            got = con.execute(f'SELECT t.tid, (s."{value}"::HUGEINT - t.lo) >> t.shift AS b, count(*) '
                              f'FROM ({source}) s JOIN {name} t ON {on} GROUP BY ALL ORDER BY 1, 2').fetchall()
        finally:
            con.unregister(name)
        by = {}
        for tid, b, c in got:
            by.setdefault(int(tid), ([], []))
            by[int(tid)][0].append(int(b))
            by[int(tid)][1].append(int(c))
        S.feed(by)
    return S.result()
