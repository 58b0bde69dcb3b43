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
# The summary's counts over the other per-record tables (the cluster report: over each part's files)
SUMMABLE.update({
    "doorbell_counts": ("SELECT count(*) AS doorbells, coalesce(sum(complete::INTEGER), 0) AS recovered, "
                        "coalesce(sum((wqes > 1)::INTEGER), 0) AS coalesced, coalesce(sum(lost_wqebbs), 0) AS lost_wqebbs "
                        "FROM doorbells", (), ("doorbells", "recovered", "coalesced", "lost_wqebbs")),
    "wqe_count": ("SELECT count(*) AS wqes FROM wqes", (), ("wqes",)),
})
# The latency analyses (analysis.op_latency, the summary's wr_latency): per group counts, sums and extremes of
# the named query op_latency's samples (LATENCY_SAMPLES, ``latency_samples``) and of the work requests'
# measured latencies; the figure's histogram (LATENCY_BINS_PER_DECADE log bins per decade) per group; and, for
# the cluster report, which parts hold each QP's rows (op_latency's intervals follow each QP's posts, so its
# samples are a part's own only while no QP has rows in two parts).  Their quantiles: analysis.quantile.
LATENCY_SAMPLES = "_sigmatrace_latency_samples"
LATENCY_BINS_PER_DECADE = 1000     # 0.23 % wide bins: ~24 ns at 10 µs
LATENCY_KEY = ("kind", "source", "measure")
SUMMABLE.update({
    "latency_groups": (f"SELECT kind, source, measure, count(*) AS count, sum(value_ns) AS sum_ns, "
                       f"min(value_ns) AS min_ns, max(value_ns) AS max_ns FROM {LATENCY_SAMPLES} GROUP BY ALL",
                       LATENCY_KEY, ("count", "sum_ns", "min_ns", "max_ns"), ("sum", "sum", "min", "max")),
    "wr_latency": ("SELECT count(latency_ns) AS count, sum(latency_ns) AS sum_ns, min(latency_ns) AS min_ns, "
                   "max(latency_ns) AS max_ns FROM ops", (), ("count", "sum_ns", "min_ns", "max_ns"),
                   ("sum", "sum", "min", "max")),
    "latency_qps": ("SELECT qp_id, count(*) AS parts FROM (SELECT DISTINCT qp_id FROM ops WHERE qp_id >= 0 UNION "
                    "SELECT DISTINCT qp_id FROM doorbells WHERE qp_id >= 0) GROUP BY ALL", ("qp_id",), ("parts",)),
    "latency_hist": (f"SELECT kind, source, measure, "
                     f"floor(log10(greatest(value_ns, 1)) * {LATENCY_BINS_PER_DECADE})::BIGINT AS b, count(*) AS count "
                     f"FROM {LATENCY_SAMPLES} GROUP BY ALL", LATENCY_KEY + ("b",), ("count",)),
})
LATENCY = ("latency_groups", "wr_latency", "latency_qps")
LATENCY_HIST = "latency_hist"
MERGE = {"sum": lambda a, b: a + b, "min": min, "max": max}


def latency_samples(con, materialize=False):
    """LATENCY_SAMPLES on ``con``: the named query op_latency's rows (kind, source, measure, value_ns), a view
    (each use runs the query again) or, with ``materialize``, a temporary table."""
    what = "TABLE" if materialize else "VIEW"
    con.execute(f"CREATE OR REPLACE TEMP {what} {LATENCY_SAMPLES} AS {_named('op_latency')}")


# Named queries split in two: their first CTE, ``part``, is the only thing they read from ops -- per-key
# counts, sums and extremes with BIGINT columns -- and the rest reads ``part`` (and the small tables).  The
# cluster report runs ``part`` on every part of the ops table, merges the rows (the value columns by the rule
# given here, the others are the key) and runs the rest on the merged rows (``split_rest``): the rows a key
# gets are the same however the ops rows were split, so the query's result is the same as over the whole table.
SPLIT = {
    "qp_bandwidth": {"bytes": "sum", "ops": "sum", "first_ns": "min", "last_ns": "max"},
    "skew_node": {"bytes": "sum"},
    "skew_gpu": {"bytes": "sum"},
    "top_talkers": {"bytes": "sum", "ops": "sum"},
    "top_pairs": {"bytes": "sum", "ops": "sum"},
}


def _split(name):
    """(the ``part`` CTE's body, the text before it, the text after it) of the named query ``name``."""
    sql = _named(name)
    head = "WITH part AS ("
    i = sql.find(head)
    if i < 0:
        raise ValueError(f"named query {name} has no `WITH part AS (` CTE")
    depth, j = 1, i + len(head)
    while depth:
        depth += {"(": 1, ")": -1}.get(sql[j], 0)
        j += 1
    return sql[i + len(head):j - 1], sql[:i + len(head)], sql[j - 1:]


for _q, _vals in SPLIT.items():
    SUMMABLE[f"{_q}.part"] = (None, (), tuple(_vals), tuple(_vals.values()))


def split_rest(con, name, merged):
    """Rows ({column: value}) of the named query ``name`` (one of SPLIT) with its ``part`` CTE replaced by
    ``merged``'s rows of ``name.part``: the query over every part, from the parts' sums."""
    import pyarrow as pa
    cols, got = merged[f"{name}.part"]
    vals = SUMMABLE[f"{name}.part"][2]
    keys = [c for c in cols if c not in vals]
    table = {c: pa.array([k[i] for k in got], pa.int64()) for i, c in enumerate(keys)}
    table.update({c: pa.array([v[i] for v in got.values()], pa.int64()) for i, c in enumerate(vals)})
    rel = f"_sigmatrace_part_{name}"
    con.register(rel, pa.table({c: table[c] for c in cols}))
    _, before, after = _split(name)
    try:
        cur = con.execute(before + f"SELECT * FROM {rel}" + after)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.unregister(rel)


def _sql(name, params):
    sql = SUMMABLE[name][0]
    if sql is None and name.endswith(".part"):
        return _split(name[:-len(".part")])[0]
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


SUMMARY = tuple(n for n in SUMMABLE if n not in BINNED and n not in LATENCY + (LATENCY_HIST,))


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
