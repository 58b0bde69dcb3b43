"""Analyses (F19, F24e): communication matrices, bandwidth over time, barriers, skew, latency.

Every analysis is a named SQL query (sigmatrace/query/sql/*.sql) run on DuckDB
over the correlated tables; the functions here run them and shape the result
(dense matrices, dicts); ``figures`` draws them (matplotlib, Agg).
"""
from __future__ import annotations

import numpy as np

from ..query import connect, named_queries, run_named
from .figures import bandwidth_figure, barrier_figure, fmt_bytes, fmt_ns, heatmap, latency_figure
from .quantile import grouped_quantiles

LEVELS = ("node", "rank", "gpu", "qp")


def _con(source):
    import duckdb
    if isinstance(source, duckdb.DuckDBPyConnection):
        return source
    return connect(source)


def _rows(con, name, **kw):
    cur = run_named(con, name, **kw)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def comm_matrix(source, level="node", rows=None):
    """(labels, matrix of bytes [src, dst], matrix of ops) at node / rank / gpu level.  ``rows``: the rows of
    the named query matrix_<level> when they were computed elsewhere (the cluster report adds up its parts':
    ``summable``)."""
    con = _con(source)
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}")
    got = rows if rows is not None else _rows(con, f"matrix_{level}")
    if level == "node":
        labels = [r[0] for r in con.execute("SELECT label FROM nodes ORDER BY node").fetchall()]
        ids = list(range(len(labels)))
        rows = [(r["src_node"], r["dst_node"], r["bytes"], r["ops"]) for r in got]
    elif level == "rank":
        ids = [r[0] for r in con.execute("SELECT DISTINCT rank FROM processes WHERE rank >= 0 ORDER BY rank").fetchall()]
        labels = [f"rank{r}" for r in ids]
        rows = [(r["src_rank"], r["dst_rank"], r["bytes"], r["ops"]) for r in got]
    elif level == "gpu":
        gl = con.execute("SELECT gpu, label FROM gpus ORDER BY gpu").fetchall()
        ids = [g for g, _ in gl]
        labels = [l for _, l in gl]
        rows = [(r["src_gpu"], r["dst_gpu"], r["bytes"], r["ops"]) for r in got]
    else:
        ql = con.execute("SELECT qp_id, qpn, rank FROM qps ORDER BY qp_id").fetchall()
        ids = [q for q, _, _ in ql]
        labels = [f"r{r}:{qpn:#x}" for _, qpn, r in ql]
        rows = [(r["qp_id"], r["dst_qp_id"], r["bytes"], r["ops"]) for r in got]
    pos = {v: i for i, v in enumerate(ids)}
    m = np.zeros((len(ids), len(ids)), np.int64)
    c = np.zeros((len(ids), len(ids)), np.int64)
    for s, d, b, n in rows:
        if s in pos and d in pos:
            m[pos[s], pos[d]] += int(b)
            c[pos[s], pos[d]] += int(n)
    return labels, m, c


def skew(source, level="node"):
    """Egress/ingress imbalance (max/min) and heaviest pair vs mean pair (inter-node pairs for nodes)."""
    con = _con(source)
    r = _rows(con, "skew_node" if level == "node" else "skew_gpu")
    return {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in (r[0] if r else {}).items()}


def barrier_report(source):
    con = _con(source)
    return _rows(con, "barriers"), _rows(con, "barrier_arrivals")


def bandwidth_bin_ns(span_ns):
    """The bandwidth figures' bin: 200 bins over the operations' time span, at least 1 µs."""
    return max(1000, int(span_ns // 200) + 1)


def bandwidth(source, level="gpu", bin_ns=1_000_000, binned=None):
    """Rows of the named query bandwidth_<level>.  ``binned``: the operations' bytes already summed per
    (GPU / node, bin of ``bin_ns``) elsewhere (``summable.BINNED``; the cluster report adds up its parts'):
    the query then reads those rows as its ops table (one row per bin, at the bin's start: the same bins,
    the same sums)."""
    con = _con(source)
    if binned is None:
        return _rows(con, f"bandwidth_{level}", bin_ns=int(bin_ns))
    import pyarrow as pa
    t = pa.table({level: np.array([r[level] for r in binned], np.int64),
                  "ns": np.array([r["ns"] for r in binned], np.int64),
                  "bytes": np.array([r["bytes"] for r in binned], np.int64)})
    con.register("_sigmatrace_binned_t", t)
    con.execute("CREATE SCHEMA IF NOT EXISTS _sigmatrace_binned")
    con.execute("CREATE OR REPLACE VIEW _sigmatrace_binned.ops AS SELECT * FROM _sigmatrace_binned_t")
    con.execute("SET search_path = '_sigmatrace_binned,main'")     # ``ops`` is the binned rows, the rest main's
    try:
        return _rows(con, f"bandwidth_{level}", bin_ns=int(bin_ns))
    finally:
        con.execute("RESET search_path")
        con.execute("DROP VIEW _sigmatrace_binned.ops")
        con.unregister("_sigmatrace_binned_t")


def named_sql(name):
    """A named query's text as a subquery (no trailing semicolon)."""
    return named_queries()[name].strip().rstrip(";")


LATENCY_BINS_PER_DECADE = 1000     # 0.23 % wide bins: ~24 ns at 10 µs


def op_latency(source, hist=True):
    """Latency per (operation kind, source, measure) from the named query op_latency (docs/report.md): count,
    mean, p50, p90, p99, max and, with ``hist``, a histogram of LATENCY_BINS_PER_DECADE log bins per decade
    [(lo_ns, hi_ns, count), ...] (the figure's CDF; bounded whatever the number of operations)."""
    con = _con(source)
    q = named_sql("op_latency")
    groups = _q(con, f"SELECT kind, source, measure, count(*) AS count, avg(value_ns) AS mean_ns, "
                     f"min(value_ns) AS min_ns, max(value_ns) AS max_ns "
                     f"FROM ({q}) GROUP BY ALL ORDER BY measure, count DESC, kind, source")
    if groups:   # exact quantiles in bounded memory (analysis.quantile; DuckDB's quantile_cont holds every value)
        pq = grouped_quantiles(con, q, ("kind", "source", "measure"), "value_ns", (0.5, 0.9, 0.99))
        for g in groups:
            p50, p90, p99 = pq[(g["kind"], g["source"], g["measure"])]
            mn, mx = g.pop("min_ns"), g.pop("max_ns")
            g.update(p50_ns=p50, p90_ns=p90, p99_ns=p99, min_ns=mn, max_ns=mx)
    if hist and groups:
        k = LATENCY_BINS_PER_DECADE
        rows = con.execute(f"SELECT kind, source, measure, floor(log10(greatest(value_ns, 1)) * {k})::BIGINT AS b, "
                           f"count(*) FROM ({q}) GROUP BY ALL ORDER BY kind, source, measure, b").fetchall()
        by = {}
        for kind, src, m, b, n in rows:
            by.setdefault((kind, src, m), []).append((10 ** (b / k), 10 ** ((b + 1) / k), int(n)))
        for g in groups:
            g["hist"] = by.get((g["kind"], g["source"], g["measure"]), [])
    return groups


def _q(con, sql):
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]
