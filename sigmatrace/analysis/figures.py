"""The report's figures (matplotlib, Agg): communication matrices, bandwidth over time, barriers, latency.

What each one shows, and why it is drawn that way, is in docs/report.md ("Figures").  Every function takes
query results (rows or matrices), builds one figure, and writes it as PNG and SVG; the ``*_plot`` functions
return the figure itself (tests inspect it).
"""
from __future__ import annotations


import numpy as np

from ..units import fmt_bytes, fmt_ns

MAX_LINES = 10          # distinct series drawn as lines; beyond: the top ones and an "others" band
TOP_LINES = 8           # ... that many by total bytes
TEXT_CELLS = 16         # matrices up to this side get a value in every cell
MAX_TICKS = 40          # labelled ticks per axis at most (every k-th label beyond)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path_stem, dpi):
    """Write the figure as <path_stem>.png and .svg, close it; returns the paths."""
    out = []
    for ext in ("png", "svg"):
        p = f"{path_stem}.{ext}"
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
        out.append(p)
    pyplot().close(fig)
    return out


def rate_unit(max_bytes_per_ns):
    """(divisor of bytes/ns, unit) so that the largest rate reads in GB/s, MB/s or KB/s (10^3 steps)."""
    for div, u in ((1.0, "GB/s"), (1e-3, "MB/s"), (1e-6, "KB/s")):
        if max_bytes_per_ns >= div:
            return div, u
    return 1e-9, "B/s"


def _ticks(n):
    """Every k-th index so that at most MAX_TICKS are labelled."""
    step = max(1, -(-n // MAX_TICKS))
    return list(range(0, n, step))


def _legend_outside(ax, **kw):
    """The legend right of the axes, never over the data."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7, frameon=False,
                     **kw)


# ---------------------------------------------------------------------------------------------------------
# communication matrices
def heatmap_plot(labels, matrix, title="Communication matrix (bytes)"):
    """Bytes from the source (row) to the destination (column).  The colour scale starts at zero (so a uniform
    matrix looks uniform), cells without traffic are grey, values are printed per cell with their own unit up
    to TEXT_CELLS x TEXT_CELLS; larger matrices get no cell text and every k-th tick label."""
    plt = pyplot()
    m = np.asarray(matrix, np.float64)
    n = len(labels)
    mx = float(m.max()) if m.size else 0.0
    scale, unit = 1.0, "B"
    for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if mx >= s:
            scale, unit = s, u
            break
    # grows with the matrix up to a poster size (one pixel block per cell beyond: a 128 x 128 matrix at 0.6 in per
    # cell was a 9,000-pixel image that took seconds to rasterise)
    side = min(0.6 * n + 2.5, 16.0)
    fig, ax = plt.subplots(figsize=(max(4.5, side), max(3.5, min(0.55 * n + 1.5, 14.5))))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#d9d9d9")
    shown = np.ma.masked_where(m <= 0, m / scale)
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=max(mx / scale, 1e-12), origin="upper",
                   interpolation="nearest", aspect="equal")
    ticks = _ticks(n)
    big = n > MAX_TICKS
    fs = 8 if n <= 24 else 7
    ax.set_xticks(ticks, [labels[i] for i in ticks], rotation=90 if big else 45, ha="center" if big else "right",
                  fontsize=fs)
    ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=fs)
    ax.set_xlabel("destination (target)")
    ax.set_ylabel("source (initiator)")
    nz = m[m > 0]
    sub = (f"{len(nz)} of {n * n} cells with traffic (grey: none); max {fmt_bytes(mx)}, min {fmt_bytes(nz.min())}"
           if len(nz) else "no traffic")
    ax.set_title(f"{title}\n{sub}", fontsize=10)
    fig.colorbar(im, ax=ax, label=f"bytes ({unit}), scale from 0", shrink=0.8)
    if n <= TEXT_CELLS:
        rgba = im.to_rgba(shown)
        for i in range(n):
            for j in range(n):
                if m[i, j] > 0:
                    r, g, b, _ = rgba[i, j]
                    dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.55
                    ax.text(j, i, fmt_bytes(m[i, j]).replace(" ", "\n") if n > 8 else fmt_bytes(m[i, j]),
                            ha="center", va="center", fontsize=6 if n > 8 else 7, color="w" if dark else "k")
    return fig


def heatmap(labels, matrix, path_stem, title="Communication matrix (bytes)", unit="auto"):
    """Heatmap as PNG and SVG (like Fig. 10); returns the written paths."""
    return save(heatmap_plot(labels, matrix, title), path_stem, dpi=120)


# ---------------------------------------------------------------------------------------------------------
# bandwidth over time
def bandwidth_series(rows, key, label_key, bin_ns):
    """Dense per-series arrays on one bin grid: (t_ns of each bin start, {(key, label): bytes per bin}).  Bins a
    series has no row for are 0 (the named queries already fill them; rows from elsewhere may not)."""
    ks = sorted({int(r["t_ns"]) for r in rows})
    if not ks:
        return np.zeros(0, np.int64), {}
    t0, t1 = ks[0], ks[-1]
    nb = (t1 - t0) // bin_ns + 1
    t = t0 + np.arange(nb, dtype=np.int64) * bin_ns
    out = {}
    for r in rows:
        a = out.setdefault((r[key], r[label_key]), np.zeros(nb))
        a[(int(r["t_ns"]) - t0) // bin_ns] += float(r["bytes"])
    return t, out


def bandwidth_plot(rows, key, label_key, title, bin_ns, t0_ns=None, what="GPU"):
    """Egress bandwidth per series over time: bytes posted per bin / bin width, in GB/s (10^9 bytes per second;
    MB/s or KB/s when the peak is below 1 GB/s), as steps that fall to 0 in idle bins.  Up to MAX_LINES series are lines of distinct colours; beyond, the
    TOP_LINES heaviest are lines and the others one mean line with their min..max band.  The legend is outside
    the axes."""
    plt = pyplot()
    t, series = bandwidth_series(rows, key, label_key, bin_ns)
    fig, ax = plt.subplots(figsize=(10, 3.8))
    if not series:
        return fig
    origin = t0_ns if t0_ns is not None else int(t[0])
    edges = (np.append(t, t[-1] + bin_ns) - origin) / 1e6          # ms, bin edges
    gbps = {k: v / bin_ns for k, v in series.items()}              # bytes per ns = GB/s
    order = sorted(gbps, key=lambda k: (-series[k].sum(), k[0]))       # ties: by id
    many = len(order) > MAX_LINES
    top = order[:TOP_LINES] if many else order
    div, unit = rate_unit(max(v.max() for v in gbps.values()))
    colours = plt.get_cmap("tab10").colors
    for c, k in enumerate(top):
        ax.stairs(gbps[k] / div, edges, color=colours[c % 10], lw=1.2,
                  label=f"{k[1]} ({fmt_bytes(series[k].sum())})")
    if many:
        rest = np.array([gbps[k] for k in order[TOP_LINES:]]) / div
        ax.stairs(rest.max(0), edges, baseline=rest.min(0), fill=True, color="0.6", alpha=0.35, lw=0,
                  label=f"others: {len(rest)} {what}s, min..max")
        ax.stairs(rest.mean(0), edges, color="0.3", lw=1.0, ls="--",
                  label=f"others: mean per {what} ({fmt_bytes(rest.sum() * div * bin_ns)} in all)")
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time since the start of the capture (ms)" if t0_ns is not None else "time (ms)")
    ax.set_ylabel(f"{unit} posted")
    ax.set_title(f"{title}\nbytes of the operations posted in each {fmt_ns(bin_ns)} bin / bin width; 0 where idle",
                 fontsize=10)
    ax.grid(alpha=0.25)
    _legend_outside(ax, title=f"{what} (bytes)" if not many else f"top {TOP_LINES} of {len(order)} {what}s")
    return fig


def bandwidth_figure(rows, key, label_key, path_stem, title, bin_ns=None, t0_ns=None, what="GPU"):
    if bin_ns is None:        # rows of the named queries: bytes per bin and bin start; the width from the grid
        ts = sorted({int(r["t_ns"]) for r in rows})
        bin_ns = int(np.diff(ts).min()) if len(ts) > 1 else 1_000_000
    return save(bandwidth_plot(rows, key, label_key, title, bin_ns, t0_ns, what), path_stem, dpi=110)


# ---------------------------------------------------------------------------------------------------------
# barriers
def barrier_plot(barriers, arrivals, t0_ns=None):
    """Two panels.  Top: each barrier instance as a bar from its first to its last arrival on the run's time
    axis (one row per instance, the straggler named at its end).  Bottom: how late each participant arrives
    at each instance (time after the instance's first arrival; a matrix, so 128 GPUs stay readable), the last
    arrival of each instance outlined in red."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    bars = sorted(barriers, key=lambda b: (b["first_ns"], b["barrier"]))
    col = {b["barrier"]: j for j, b in enumerate(bars)}
    parts = sorted({(a["label"], a["rank"]) for a in arrivals}, key=lambda p: (p[1], p[0]))
    row = {p[0]: i for i, p in enumerate(parts)}
    nb, npart = len(bars), len(parts)
    origin = t0_ns if t0_ns is not None else min(b["first_ns"] for b in bars)
    h_top = min(0.6 + 0.22 * nb, 6.0)
    h_bot = min(1.2 + 0.07 * npart, 10.0)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, h_top + h_bot + 1.4), layout="constrained",
                                 gridspec_kw=dict(height_ratios=[h_top, h_bot]))
    spread = np.array([b["spread_ns"] for b in bars], np.float64)
    cm = plt.get_cmap("plasma")
    norm = spread.max() if len(spread) and spread.max() > 0 else 1.0
    for j, b in enumerate(bars):
        x0 = (b["first_ns"] - origin) / 1e6
        ax.barh(j, max(b["spread_ns"] / 1e6, 1e-9), left=x0, height=0.7, color=cm(0.15 + 0.7 * b["spread_ns"] / norm))
        if nb <= 40:
            ax.text((b["last_ns"] - origin) / 1e6, j, f"  {fmt_ns(b['spread_ns'])}, last: {b['straggler_label']}",
                    va="center", fontsize=6)
    ax.set_yticks(_ticks(nb), [f"#{bars[j]['barrier']}" for j in _ticks(nb)], fontsize=6)
    ax.invert_yaxis()
    ax.set_ylabel("barrier")
    ax.set_xlabel("time since the start of the capture (ms)" if t0_ns is not None else "time (ms)")
    ax.set_title(f"{nb} barrier instance{'s' if nb != 1 else ''}: first .. last arrival (bar), spread and the "
                 f"last arrival (straggler)", fontsize=10)
    ax.margins(x=0.25 if nb <= 40 else 0.02)
    ax.grid(axis="x", alpha=0.25)
    lat = np.full((npart, nb), np.nan)
    last = np.zeros((npart, nb), bool)
    first = {b["barrier"]: b["first_ns"] for b in bars}
    lastpos = {b["barrier"]: b["participants"] - 1 for b in bars}
    for a in arrivals:
        i, j = row[a["label"]], col[a["barrier"]]
        lat[i, j] = (a["ns"] - first[a["barrier"]]) / 1e3
        last[i, j] = a["position"] == lastpos[a["barrier"]]
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
    im = bx.imshow(np.ma.masked_invalid(lat), cmap=cmap, vmin=0, aspect="auto", interpolation="nearest")
    li, lj = np.nonzero(last)
    bx.scatter(lj, li, s=max(16.0, min(40.0, 2000.0 / max(npart, 1))), facecolors="none", edgecolors="red",
               linewidths=1.3)
    times_last = np.bincount(li, minlength=npart)
    worst = int(np.argmax(times_last)) if len(li) else None
    yt = _ticks(npart)
    bx.set_yticks(yt, [parts[i][0] for i in yt], fontsize=6)
    xt = _ticks(nb)
    bx.set_xticks(xt, [f"#{bars[j]['barrier']}" for j in xt], fontsize=6, rotation=90 if nb > 20 else 0)
    bx.set_xlabel("barrier (in order of first arrival)")
    bx.set_ylabel("participant")
    if worst is None:
        most = ""
    elif times_last[worst] > 1:
        tied = [parts[i][0] for i in np.flatnonzero(times_last == times_last[worst])]
        most = (f"\nmost often last: {', '.join(tied[:3])}{' …' if len(tied) > 3 else ''} "
                f"({times_last[worst]} of {nb} instances{' each' if len(tied) > 1 else ''})")
    else:
        most = f"\nno participant is last more than once ({nb} instance{'s' if nb != 1 else ''})"
    bx.set_title(f"arrival after the instance's first arrival (µs); grey: not a participant{most}", fontsize=10)
    fig.colorbar(im, ax=bx, label="µs after the first arrival", shrink=0.9)
    fig.legend(handles=[Line2D([], [], ls="", marker="o", mfc="none", mec="red", mew=1.3,
                               label="last arrival of the instance (straggler)")],
               loc="outside lower center", fontsize=8, frameon=False)
    return fig


def barrier_figure(arrivals, path_stem, barriers=None, t0_ns=None):
    """Barrier instances and each participant's arrival (Fig. 9 style); returns the written paths."""
    if not arrivals:
        return []
    if barriers is None:      # rebuild the instances from the arrivals alone
        by = {}
        for a in arrivals:
            by.setdefault(a["barrier"], []).append(a)
        barriers = []
        for bid, lst in by.items():
            lo, hi = min(a["ns"] for a in lst), max(a["ns"] for a in lst)
            lastp = max(lst, key=lambda a: (a["position"], a["ns"]))
            barriers.append(dict(barrier=bid, first_ns=lo, last_ns=hi, spread_ns=hi - lo, participants=len(lst),
                                 straggler_label=lastp["label"]))
    return save(barrier_plot(barriers, arrivals, t0_ns), path_stem, dpi=110)


# ---------------------------------------------------------------------------------------------------------
# latency
def latency_plot(groups):
    """Distribution per operation kind: ``groups`` = [{kind, source, measure, count, p50_ns, p99_ns, max_ns,
    hist: [(lo_ns, hi_ns, count), ...]}, ...].  One empirical CDF per (kind, source) and measure, x log-scaled
    when the values span more than a decade; measured post→completion latencies and issue intervals in
    separate panels (they are different quantities)."""
    plt = pyplot()
    measures = [m for m in ("completion", "interval") if any(g["measure"] == m for g in groups)]
    fig, axes = plt.subplots(1, len(measures), figsize=(6.2 * len(measures) + 1.5, 3.8), squeeze=False)
    colours = plt.get_cmap("tab10").colors
    what = {"completion": ("post → own completion (measured per work request)", "latency"),
            "interval": ("issue interval: time since the previous operation on the same QP\n(or host thread); in a "
                         "blocking loop = the iteration time", "interval")}
    for ax, m in zip(axes[0], measures):
        gs = [g for g in groups if g["measure"] == m]
        lo = min(h[0] for g in gs for h in g["hist"])
        hi = max(h[1] for g in gs for h in g["hist"])
        styles = ("-", "--", "-.", ":")
        for c, g in enumerate(gs[:MAX_LINES]):
            h = np.array(g["hist"], np.float64)
            x = np.concatenate([[h[0, 0]], h[:, 1]]) / 1e3
            y = np.concatenate([[0.0], np.cumsum(h[:, 2]) / h[:, 2].sum()])
            ax.step(x, y, where="post", color=colours[c % 10], ls=styles[c % 4], lw=1.6 if c else 2.2,
                    label=f"{g['kind']} ({g['source']}): n={g['count']:,}\n  p50 {fmt_ns(g['p50_ns'], 4)}, "
                          f"p99 {fmt_ns(g['p99_ns'], 4)}, max {fmt_ns(g['max_ns'], 4)}")
        if hi > 10 * max(lo, 1):
            ax.set_xscale("log")
        else:             # a narrow distribution (a micro-benchmark): a window of +-10 % around it, not one bin
            pad = max(0.1 * hi, hi - lo) / 1e3
            ax.set_xlim(max(0.0, lo / 1e3 - pad), hi / 1e3 + pad)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{what[m][1]} (µs)")
        ax.set_ylabel("fraction of operations ≤ x" if m == "completion" else "fraction of posts ≤ x")
        ax.set_title(what[m][0], fontsize=9)
        ax.grid(alpha=0.25)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7, frameon=False,
                  ncol=min(2, len(gs[:MAX_LINES])))
    fig.suptitle("Operation latency per kind (source)", fontsize=10)
    fig.tight_layout()
    return fig


def latency_figure(groups, path_stem):
    if not groups:
        return []
    return save(latency_plot(groups), path_stem, dpi=110)
