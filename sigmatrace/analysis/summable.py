"""The report's aggregates that are sums over the operations: per key (a node pair, a GPU, an opcode ...) counts
and byte sums of the ``ops`` rows (and of the aggregate-mode counters).  A report whose ops table is in parts
(the cluster report: one task per part, sigmatrace.cluster) gets them by running the same query on every part
(``partial``) and adding the parts up (``merge``, a reduction); the local report runs it on the whole table
(``summable``).  A sum of integers does not depend on how the rows are split, so both give the same rows.

Each entry: the query, the columns that order its rows (its ORDER BY), its value columns and how each is
merged ("sum", default; "min" / "max", NULL where a part has no rows); every other column is part of the
key.  Only integer counts, sums and extremes belong here (an average would need its own merge rule; a LIMIT
cannot be split at all).  ``BINNED``: the operations' bytes per (GPU or node, time bin) for the bandwidth
figures, whose named queries then run on those rows as on the operations (``analysis.bandwidth``)."""
from __future__ import annotations

from ..query import named_queries


def _named(name):
    return named_queries()[name].strip().rstrip(";")


SUMMABLE = {
    "totals": ("SELECT count(*) AS ops, coalesce(sum(matched::INTEGER), 0) AS matched, "
               "coalesce(sum(bytes), 0) AS bytes, count(*) FILTER (WHERE collective_unit >= 0) AS attributed "
               "FROM ops", (), ("ops", "matched", "bytes", "attributed")),
    "by_opcode": ("SELECT opcode & 255 AS opcode, count(*) AS ops FROM ops GROUP BY 1 ORDER BY 1", ("opcode",),
                  ("ops",)),
    "matrix_node": (None, ("src_node", "dst_node"), ("bytes", "ops")),
    "matrix_rank": (None, ("src_rank", "dst_rank"), ("bytes", "ops")),
    "matrix_gpu": (None, ("src_gpu", "dst_gpu"), ("bytes", "ops")),
    "gpu_volume": (None, ("gpu",), ("egress_bytes", "ingress_bytes", "ops_out", "ops_in")),
    "ns_range": ("SELECT min(ns) AS min_ns, max(ns) AS max_ns FROM ops", (), ("min_ns", "max_ns"), ("min", "max")),
}
# the rows bandwidth_<level>.sql reads (its bins: ns // bin_ns), summed per bin; the bin's start stands for ns
BINNED = {f"bandwidth_{k}_bins": (f"SELECT {k}, ns // {{bin_ns}} * {{bin_ns}} AS ns, sum(bytes) AS bytes FROM ops "
                                  f"WHERE {k} >= 0 GROUP BY ALL", (k, "ns"), ("bytes",)) for k in ("gpu", "node")}
SUMMABLE.update(BINNED)
MERGE = {"sum": lambda a, b: a + b, "min": min, "max": max}


def _sql(name, params):
    sql = SUMMABLE[name][0]
    return sql.format(**params) if sql is not None else _named(name)


def _merges(name):
    e = SUMMABLE[name]
    return e[3] if len(e) > 3 else ("sum",) * len(e[2])


def _fetch(con, name, params=None):
    cur = con.execute(_sql(name, params or {}))
    cols = [d[0] for d in cur.description]
    return cols, cur.fetchall()


def summable(con, name):
    """The rows of ``name`` over everything ``con`` sees (a list of {column: value}, in the query's order)."""
    cols, rows = _fetch(con, name)
    return [dict(zip(cols, r)) for r in rows]


SUMMARY = tuple(n for n in SUMMABLE if n not in BINNED)


def partial(con, names=SUMMARY, **params):
    """{name: (columns, {key: [values]})} of the rows ``con`` sees (one part of the ops table); ``params``:
    the queries' parameters (``bin_ns``)."""
    out = {}
    for name in names:
        cols, rows = _fetch(con, name, params)
        vals = SUMMABLE[name][2]
        vi = [cols.index(v) for v in vals]
        ki = [i for i, c in enumerate(cols) if c not in vals]
        got = {}
        for r in rows:
            got[tuple(r[i] for i in ki)] = [None if r[i] is None else int(r[i]) for i in vi]   # keys unique
        out[name] = (cols, got)
    return out


def _merge_values(name, acc, v):
    return [b if a is None else a if b is None else MERGE[m](a, b) for m, a, b in zip(_merges(name), acc, v)]


def merge(*parts):
    """The sum of several ``partial`` results (any grouping: a tree of merges gives the same)."""
    out = {}
    for p in parts:
        for name, (cols, got) in p.items():
            into = out.setdefault(name, (cols, {}))[1]
            for k, v in got.items():
                acc = into.get(k)
                into[k] = list(v) if acc is None else _merge_values(name, acc, v)
    return out


def rows(merged, name):
    """``merged``'s rows of ``name`` as ``summable`` gives them (same columns, same order)."""
    cols, got = merged[name]
    vals, order = SUMMABLE[name][2], SUMMABLE[name][1]
    keys = [c for c in cols if c not in vals]
    out = []
    for k, v in got.items():
        d = dict(zip(keys, k))
        d.update(zip(vals, v))
        out.append({c: d[c] for c in cols})
    return sorted(out, key=lambda d: tuple(d[c] for c in order))


def span_ns(merged):
    """max(ns) - min(ns) of the operations (0 without any), as the figures' ``SELECT max(ns) - min(ns)``."""
    r = rows(merged, "ns_range")[0]
    return 0 if r["max_ns"] is None else r["max_ns"] - r["min_ns"]
