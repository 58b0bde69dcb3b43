"""The report's figures (matplotlib, Agg): communication matrices, bandwidth over time, barriers, latency.

What each one shows, and why it is drawn that way, is in docs/report.md ("Figures").  Every function takes
query results (rows or matrices), builds one figure, and writes it as PNG and SVG; the ``*_plot`` functions
return the figure itself (tests inspect it).
"""
from __future__ import annotations

import math

import numpy as np

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


def fmt_bytes(b):
    """Bytes with the unit picked per value, three significant digits: 512 B, 3.41 KB, 1.70 MB, 12.3 GB."""
    b = float(b)
    for u, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(b) >= s:
            v = b / s
            return f"{v:.3g} {u}" if v < 1000 else f"{v:.0f} {u}"
    return f"{int(b)} B"


def fmt_ns(ns, digits=3):
    """A duration with its unit and ``digits`` significant digits: 850 ns, 14.7 µs, 3.20 ms, 1.50 s."""
    ns = float(ns)
    for u, s in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= s:
            return f"{ns / s:#.{digits}g}".rstrip(".") + f" {u}"
    return f"{ns:.0f} ns"


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
def heatmap(labels, matrix, path_stem, title="Communication matrix (bytes)", unit="auto"):
    """Heatmap as PNG and SVG (like Fig. 10); returns the written paths."""
    plt = pyplot()
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
    fig.tight_layout()
    return save(fig, path_stem, dpi=120)


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
    order = sorted(gbps, key=lambda k: (-series[k].sum(), str(k[0])))
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
def barrier_figure(arrivals, path_stem):
    """Barrier ranges (first..last arrival) with each participant's arrival (Fig. 9 style)."""
    plt = pyplot()
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
    fig.tight_layout()
    return save(fig, path_stem, dpi=110)
