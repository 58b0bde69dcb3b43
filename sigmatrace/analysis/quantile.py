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


def grouped_quantiles(con, source, keys, value, qs):
    """{group: [quantile of ``value`` for each of ``qs``]} over the rows of ``source`` (SQL of a relation)
    where ``value`` (an integer column) is not NULL, per distinct tuple of the ``keys`` columns (``()``: one
    group, key ``()``).  Exact (numpy.quantile linear); bounded memory (module docstring)."""
    keys = list(keys)
    kcols = ", ".join(f'"{k}"' for k in keys)
    sel = f"{kcols}, " if keys else ""
    grp = f"GROUP BY {kcols}" if keys else ""
    stats = con.execute(f'SELECT {sel}count("{value}"), min("{value}"), max("{value}") FROM ({source}) '
                        f'WHERE "{value}" IS NOT NULL {grp}').fetchall()
    found, targets = {}, []          # (group, rank) -> value; targets: [group, rank, lo, hi, below]
    plan = {}
    for row in stats:
        g, (n, lo, hi) = tuple(row[:len(keys)]), row[len(keys):]
        if not n:
            continue
        plan[g] = (int(n), _ranks(int(n), qs))
        for r in sorted({r for p, x, _ in plan[g][1] for r in (p, x)}):
            if lo == hi:
                found[(g, r)] = int(lo)
            else:
                targets.append([g, r, int(lo), int(hi), 0])
    name = None
    try:
        while targets:
            if name is None:
                _seq[0] += 1
                name = f"_sigmatrace_quantile_targets_{_seq[0]}"
            shift = [max(0, (hi - lo).bit_length() - BUCKET_BITS) for _, _, lo, hi, _ in targets]
            cols = {f"k{i}": [t[0][i] for t in targets] for i in range(len(keys))}
            import pyarrow as pa
            tab = pa.table(dict(cols, tid=np.arange(len(targets), dtype=np.int64),
                                lo=np.array([t[2] for t in targets], np.int64),
                                hi=np.array([t[3] for t in targets], np.int64), shift=np.array(shift, np.int64)))
            con.register(name, tab)
            on = " AND ".join([f's."{k}" IS NOT DISTINCT FROM t.k{i}' for i, k in enumerate(keys)] +
                              [f's."{value}" BETWEEN t.lo AND t.hi'])
            got = con.execute(f'SELECT t.tid, (s."{value}"::HUGEINT - t.lo) >> t.shift AS b, count(*) '
                              f'FROM ({source}) s JOIN {name} t ON {on} GROUP BY ALL ORDER BY 1, 2').fetchall()
            con.unregister(name)
            by = {}
            for tid, b, c in got:
                by.setdefault(int(tid), []).append((int(b), int(c)))
            left = []
            for tid, t in enumerate(targets):
                g, r, lo, hi, below = t
                acc = below
                for b, c in by.get(tid, ()):
                    if acc + c > r:
                        nlo = lo + (b << shift[tid])
                        nhi = min(hi, nlo + (1 << shift[tid]) - 1)
                        if nlo == nhi:
                            found[(g, r)] = nlo
                        else:
                            left.append([g, r, nlo, nhi, acc])
                        break
                    acc += c
                else:   # cannot happen: the ranges hold the rank
                    raise RuntimeError(f"quantile selection lost rank {r} of group {g}")
            targets = left
    finally:
        if name is not None:
            try:
                con.unregister(name)
            except Exception:   # noqa: BLE001 -- already unregistered
                pass
    return {g: [_lerp(found[(g, p)], found[(g, x)], t) for p, x, t in rk] for g, (n, rk) in plan.items()}
