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
from .summable import LATENCY_BINS_PER_DECADE, LATENCY_HIST, LATENCY_KEY, LATENCY_SAMPLES, latency_samples, summable

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


def skew(source, level="node", rows=None):
    """Egress/ingress imbalance (max/min) and heaviest pair vs mean pair (inter-node pairs for nodes);
    ``rows``: the named query's rows when they were computed elsewhere (the cluster report's split query)."""
    r = rows if rows is not None else _rows(_con(source), "skew_node" if level == "node" else "skew_gpu")
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


LATENCY_QS = (0.5, 0.9, 0.99)      # the latency groups' quantiles (the summary's wr_latency: the first and last)


def latency_reduction(source, hist=True):
    """What the latency analyses need, over everything ``source`` sees: ``summable.LATENCY``'s rows (per
    group count, sum, min, max; the work requests' latencies), with ``hist`` the figure's histogram, and the
    quantiles LATENCY_QS of every group (``analysis.quantile``, exact) -- {"sums": {name: rows},
    "quantiles": {group key: [...]}, "wr_quantiles": [...] or None}.  The cluster report builds the same
    from its parts (sigmatrace.cluster.driver)."""
    con = _con(source)
    latency_samples(con)
    sums = {n: summable(con, n) for n in ("latency_groups", "wr_latency") + ((LATENCY_HIST,) if hist else ())}
    stats = latency_stats(sums)
    wr_stats = {(): stats.pop(WR_GROUP)}
    q = grouped_quantiles(con, f"SELECT * FROM {LATENCY_SAMPLES}", LATENCY_KEY, "value_ns", LATENCY_QS, stats=stats)
    wr = grouped_quantiles(con, "SELECT latency_ns FROM ops", (), "latency_ns", LATENCY_QS, stats=wr_stats).get(())
    return {"sums": sums, "quantiles": q, "wr_quantiles": wr}


WR_GROUP = ("wr",)      # the work requests' latencies beside the latency groups (``latency_stats``)


def latency_stats(sums):
    """{group key: (count, min, max)} of the latency groups and, as WR_GROUP, of the work requests'
    latencies, from ``summable.LATENCY``'s rows ({name: rows}): what the quantiles' selection starts from."""
    stats = {tuple(r[c] for c in LATENCY_KEY): (r["count"], r["min_ns"], r["max_ns"]) for r in sums["latency_groups"]}
    wr = sums["wr_latency"][0]
    stats[WR_GROUP] = (wr["count"], wr["min_ns"], wr["max_ns"])
    return stats


def latency_values(con):
    """{group key: its values, sorted (int64)} of LATENCY_SAMPLES, and the work requests' measured
    latencies} (WR_GROUP): a part's values for the cluster report's quantile passes (``quantile.count_buckets``).  The
    groups and their counts come from one GROUP BY and the values as one int64 column in the same order (no
    Python object per value)."""
    order = ", ".join(LATENCY_KEY)
    groups = con.execute(f"SELECT {order}, count(*) FROM {LATENCY_SAMPLES} GROUP BY ALL ORDER BY {order}").fetchall()
    v = _arrow(con, f"SELECT value_ns FROM {LATENCY_SAMPLES} ORDER BY {order}, value_ns").column(0)
    v = v.to_numpy().astype(np.int64, copy=False)
    out, lo = {}, 0
    for *key, n in groups:
        out[tuple(key)] = v[lo:lo + n]
        lo += n
    w = _arrow(con, "SELECT latency_ns FROM ops WHERE latency_ns IS NOT NULL ORDER BY 1").column(0)
    out[WR_GROUP] = w.to_numpy().astype(np.int64, copy=False)
    return out


def _arrow(con, sql):
    """A query's rows as a pyarrow Table (a relation's ``to_arrow_table`` since DuckDB 1.4, ``arrow`` before)."""
    rel = con.sql(sql)
    f = getattr(rel, "to_arrow_table", None) or rel.arrow
    return f()


def _last_none(x):
    return (x is None, x)


def op_latency_groups(red, hist=True):
    """The latency groups from a ``latency_reduction`` (docs/report.md, "Latency figure"): per (operation
    kind, source, measure) count, mean, p50, p90, p99, min, max and, with ``hist``, a histogram of
    LATENCY_BINS_PER_DECADE log bins per decade [(lo_ns, hi_ns, count), ...] (the figure's CDF; bounded
    whatever the number of operations), ordered by measure, count (largest first), kind, source."""
    k = LATENCY_BINS_PER_DECADE
    by = {}
    if hist:
        for r in red["sums"][LATENCY_HIST]:
            by.setdefault(tuple(r[c] for c in LATENCY_KEY), []).append((10 ** (r["b"] / k), 10 ** ((r["b"] + 1) / k),
                                                                      int(r["count"])))
    groups = []
    for r in red["sums"]["latency_groups"]:
        key = tuple(r[c] for c in LATENCY_KEY)
        p50, p90, p99 = red["quantiles"][key]
        g = dict(zip(LATENCY_KEY, key), count=int(r["count"]), mean_ns=r["sum_ns"] / r["count"], p50_ns=p50,
                 p90_ns=p90, p99_ns=p99, min_ns=int(r["min_ns"]), max_ns=int(r["max_ns"]))
        if hist:
            g["hist"] = sorted(by.get(key, []))
        groups.append(g)
    groups.sort(key=lambda g: (_last_none(g["measure"]), -g["count"], _last_none(g["kind"]), _last_none(g["source"])))
    return groups


def wr_latency(red):
    """The summary's wr_latency_ns from a ``latency_reduction``: count, mean, p50, p99, max of the work
    requests' measured post -> completion latencies ({"count": 0} without any)."""
    r = red["sums"]["wr_latency"][0]
    if not r["count"]:
        return {"count": 0}
    p50, _, p99 = red["wr_quantiles"]
    return {"count": int(r["count"]), "mean": r["sum_ns"] / r["count"], "p50": float(p50), "p99": float(p99),
            "max": int(r["max_ns"])}


def op_latency(source, hist=True):
    """The latency groups (``op_latency_groups``) over everything ``source`` sees."""
    return op_latency_groups(latency_reduction(source, hist=hist), hist=hist)
