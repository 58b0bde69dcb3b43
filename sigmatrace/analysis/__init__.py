"""Analyses (F19, F24e): communication matrices, bandwidth over time, barriers, skew.

Every analysis is a named SQL query (sigmatrace/query/sql/*.sql) run on DuckDB
over the correlated tables; the functions here run them and shape the result
(dense matrices, dicts) and draw the figures (matplotlib, Agg).
"""
from __future__ import annotations

import numpy as np

from ..query import connect, run_named

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


def comm_matrix(source, level="node"):
    """(labels, matrix of bytes [src, dst], matrix of ops) at node / rank / gpu level."""
    con = _con(source)
    if level == "node":
        labels = [r[0] for r in con.execute("SELECT label FROM nodes ORDER BY node").fetchall()]
        ids = list(range(len(labels)))
        rows = [(r["src_node"], r["dst_node"], r["bytes"], r["ops"]) for r in _rows(con, "matrix_node")]
    elif level == "rank":
        ids = [r[0] for r in con.execute("SELECT DISTINCT rank FROM processes WHERE rank >= 0 ORDER BY rank").fetchall()]
        labels = [f"rank{r}" for r in ids]
        rows = [(r["src_rank"], r["dst_rank"], r["bytes"], r["ops"]) for r in _rows(con, "matrix_rank")]
    elif level == "gpu":
        got = con.execute("SELECT gpu, label FROM gpus ORDER BY gpu").fetchall()
        ids = [g for g, _ in got]
        labels = [l for _, l in got]
        rows = [(r["src_gpu"], r["dst_gpu"], r["bytes"], r["ops"]) for r in _rows(con, "matrix_gpu")]
    elif level == "qp":
        got = con.execute("SELECT qp_id, qpn, rank FROM qps ORDER BY qp_id").fetchall()
        ids = [q for q, _, _ in got]
        labels = [f"r{r}:{qpn:#x}" for _, qpn, r in got]
        rows = [(r["qp_id"], r["dst_qp_id"], r["bytes"], r["ops"]) for r in _rows(con, "matrix_qp")]
    else:
        raise ValueError(f"level must be one of {LEVELS}")
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


def bandwidth(source, level="gpu", bin_ns=1_000_000):
    con = _con(source)
    return _rows(con, f"bandwidth_{level}", bin_ns=int(bin_ns))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path_stem, dpi):
    """Write the figure as <path_stem>.png and .svg, close it; returns the paths."""
    fig.tight_layout()
    out = []
    for ext in ("png", "svg"):
        p = f"{path_stem}.{ext}"
        fig.savefig(p, dpi=dpi)
        out.append(p)
    _pyplot().close(fig)
    return out


def heatmap(labels, matrix, path_stem, title="Communication matrix (bytes)", unit="auto"):
    """Heatmap as PNG and SVG (like Fig. 10); returns the written paths."""
    plt = _pyplot()
    m = np.asarray(matrix, np.float64)
    scale, suffix = 1.0, "B"
    mx = m.max() if m.size else 0
    for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if mx >= s:
            scale, suffix = s, u
            break
    n = len(labels)
    # the figure grows with the matrix up to ~40 rows, then stays at a readable poster size: one pixel block
    # per cell (nearest), every k-th tick labelled (a 128x128 rank matrix drawn at 0.6 in per cell was a
    # 9,000-pixel image that took seconds to rasterise)
    side = min(0.6 * n + 2, 26.0)
    fig, ax = plt.subplots(figsize=(max(4, side), max(3.5, min(0.55 * n + 1.5, 24.0))))
    im = ax.imshow(m / scale, cmap="viridis", origin="lower", interpolation="nearest")
    step = max(1, -(-n // 40))
    ticks = list(range(0, n, step))
    fs = 8 if step == 1 and n <= 40 else 6
    ax.set_xticks(ticks, [labels[i] for i in ticks], rotation=45 if n <= 40 else 90, ha="right" if n <= 40 else "center",
                  fontsize=fs)
    ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=fs)
    ax.set_xlabel("Destination")
    ax.set_ylabel("Source")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=f"Traffic ({suffix})")
    if n <= 16:
        for i in range(n):
            for j in range(n):
                if m[i, j]:
                    ax.text(j, i, f"{m[i, j] / scale:.1f}{suffix}", ha="center", va="center", fontsize=7, color="w")
    return _save(fig, path_stem, dpi=120)


def bandwidth_figure(rows, key, label_key, path_stem, title):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    series = {}
    for r in rows:
        series.setdefault((r[key], r[label_key]), []).append((r["t_ns"], r["gbps"]))
    t0 = min((t for s in series.values() for t, _ in s), default=0)
    for (k, lab), pts in sorted(series.items(), key=lambda x: str(x[0][0])):
        pts.sort()
        ax.step([(t - t0) / 1e6 for t, _ in pts], [v for _, v in pts], where="post", label=str(lab))
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("GB/s")
    ax.set_title(title)
    if len(series) <= 16:
        ax.legend(fontsize=7)
    return _save(fig, path_stem, dpi=110)


def barrier_figure(arrivals, path_stem):
    """Barrier ranges (first..last arrival) with each participant's arrival (Fig. 9 style)."""
    plt = _pyplot()
    if not arrivals:
        return []
    fig, ax = plt.subplots(figsize=(8, 3.5))
    by = {}
    for a in arrivals:
        by.setdefault(a["barrier"], []).append(a)
    t0 = min(a["ns"] for a in arrivals)
    labels = sorted({a["label"] for a in arrivals})
    ypos = {l: i for i, l in enumerate(labels)}
    for bid, lst in by.items():
        lo = min(a["ns"] for a in lst)
        hi = max(a["ns"] for a in lst)
        ax.axvspan((lo - t0) / 1e6, (hi - t0) / 1e6, alpha=0.15, color="tab:red")
        for a in lst:
            ax.plot((a["ns"] - t0) / 1e6, ypos[a["label"]], "o", ms=3, color=f"C{a['position'] % 10}")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("time (ms)")
    ax.set_title("Barrier arrivals (shaded: first..last arrival)")
    return _save(fig, path_stem, dpi=110)
