"""The report's aggregates that are sums over the operations: per key (a node pair, a GPU, an opcode ...) counts
and byte sums of the ``ops`` rows (and of the aggregate-mode counters).  A report whose ops table is in parts
(the cluster report: one task per part, sigmatrace.cluster) gets them by running the same query on every part
(``partial``) and adding the parts up (``merge``, a reduction); the local report runs it on the whole table
(``summable``).  A sum of integers does not depend on how the rows are split, so both give the same rows.

Each entry: the query, the columns that order its rows (its ORDER BY) and its value columns (summed); every
other column is part of the key.  Only integer sums and counts belong here (an average or a minimum would need
its own merge rule; a LIMIT cannot be split at all)."""
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
}


def _sql(name):
    sql = SUMMABLE[name][0]
    return sql if sql is not None else _named(name)


def _fetch(con, name):
    cur = con.execute(_sql(name))
    cols = [d[0] for d in cur.description]
    return cols, cur.fetchall()


def summable(con, name):
    """The rows of ``name`` over everything ``con`` sees (a list of {column: value}, in the query's order)."""
    cols, rows = _fetch(con, name)
    return [dict(zip(cols, r)) for r in rows]


def partial(con, names=tuple(SUMMABLE)):
    """{name: (columns, {key: [values]})} of the rows ``con`` sees (one part of the ops table)."""
    out = {}
    for name in names:
        cols, rows = _fetch(con, name)
        vals = SUMMABLE[name][2]
        vi = [cols.index(v) for v in vals]
        ki = [i for i, c in enumerate(cols) if c not in vals]
        got = {}
        for r in rows:
            k = tuple(r[i] for i in ki)
            acc = got.setdefault(k, [0] * len(vi))
            for j, i in enumerate(vi):
                acc[j] += int(r[i] or 0)
        out[name] = (cols, got)
    return out


def merge(*parts):
    """The sum of several ``partial`` results (any grouping: a tree of merges gives the same)."""
    out = {}
    for p in parts:
        for name, (cols, got) in p.items():
            into = out.setdefault(name, (cols, {}))[1]
            for k, v in got.items():
                acc = into.get(k)
                into[k] = list(v) if acc is None else [a + b for a, b in zip(acc, v)]
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
    if not order and not out:       # a query without GROUP BY has one row, also over no rows
        out = [dict.fromkeys(cols, 0)]
    return sorted(out, key=lambda d: tuple(d[c] for c in order))
