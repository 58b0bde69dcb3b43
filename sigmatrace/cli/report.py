"""`sigmatrace report CAPTURE -o OUT`: Perfetto timeline, summary.json, Parquet tables, figures.

CAPTURE is a directory of per-process files or one capture.bin.  Damaged
inputs (cut files, corrupt chunks, missing process files, duplicated ranks)
are reported as one-line warnings and the sound part is reported; only an
input with nothing readable is an error (exit status 2).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import SigmatraceError


class _Progress:
    """tqdm bars on a terminal, nothing otherwise (or when quiet)."""

    def __init__(self, quiet, total_files):
        self.quiet = quiet or not sys.stderr.isatty()
        self.bar = None
        self.total = total_files
        self.stage = None

    def __call__(self, stage, n=0):
        if self.quiet:
            return
        from tqdm import tqdm
        if stage != self.stage:
            if self.bar is not None:
                self.bar.close()
            self.stage = stage
            self.bar = tqdm(total=self.total if stage == "decode" else None, desc=stage, unit="file" if stage == "decode" else "",
                            leave=False, file=sys.stderr)
        if n:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _fmt_bytes(b):
    b = float(b)
    for u in ("B", "KB", "MB", "GB", "TB"):
        if abs(b) < 1000 or u == "TB":
            return f"{b:.1f} {u}" if u != "B" else f"{int(b)} B"
        b /= 1000


def build_report(capture, out, workers=None, perfetto=True, figures=True, quiet=False, clock_refine="auto",
                 max_perfetto_events=500_000, batch_records=None):
    """Correlate ``capture`` and write the report into ``out``; returns (Correlated, summary, timings).

    ``batch_records``: records decoded / written at a time (bounded memory; default
    ``correlate.decode.DEFAULT_BATCH_RECORDS``).  The events table is streamed from the capture into
    ``tables/events/part-*.parquet`` by the worker processes (one row group per batch) and never held whole
    in memory; the per-operation tables are written in row ranges."""
    from ..correlate import correlate
    from ..correlate.core import Correlated  # noqa: F401
    from ..format.reader import capture_files
    from ..export import build_summary, write_perfetto, write_summary, write_tables
    from ..query import connect

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = capture_files(capture)
    prog = _Progress(quiet, len(files))
    timings = {}
    t = time.perf_counter()
    try:
        kw = {"batch_records": batch_records} if batch_records else {}
        corr = correlate(capture, workers=workers, clock_refine=clock_refine, progress=prog, **kw)
    finally:
        prog.close()
    timings["correlate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    write_tables(corr, out / "tables", progress=(lambda n: prog("tables", 1)) if not prog.quiet else None,
                 collect_host=max_perfetto_events if perfetto else None)
    prog.close()
    timings["tables_s"] = time.perf_counter() - t
    pstats = None
    if perfetto:
        t = time.perf_counter()
        prog("perfetto", 0)
        pstats = write_perfetto(corr, out / "trace.pftrace", max_events=max_perfetto_events)
        prog.close()
        timings["perfetto_s"] = time.perf_counter() - t
        if pstats.get("truncated") and pstats.get("window_end_ns") is None:
            corr.warnings.append("Perfetto trace holds no events (--max-perfetto-events 0); the Parquet tables hold "
                                 "everything")
        elif pstats.get("truncated"):
            corr.warnings.append(f"Perfetto trace holds the first {max_perfetto_events:,} events of the run (all "
                                 f"processes, host calls, doorbells and operations up to "
                                 f"{pstats.get('window_end_ns')} ns; --max-perfetto-events); the Parquet tables "
                                 f"hold everything")
    t = time.perf_counter()
    con = connect(out)   # the written Parquet tables: the same views `sigmatrace query` sees
    summary = build_summary(corr, con, pstats)
    summary["timings_s"] = timings
    write_summary(summary, out / "summary.json")
    timings["summary_s"] = time.perf_counter() - t
    if figures:
        t = time.perf_counter()
        try:
            _figures(con, out / "figures")
        except Exception as e:  # figures are a convenience: never lose the report for them
            corr.warnings.append(f"figures not drawn: {e}")
        timings["figures_s"] = time.perf_counter() - t
    return corr, summary, timings


def _figures(con, fig_dir):
    from .. import analysis as A
    fig_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for level in ("node", "rank", "gpu"):
        labels, m, _ = A.comm_matrix(con, level)
        if len(labels) and m.any():
            written += A.heatmap(labels, m, str(fig_dir / f"matrix_{level}"), title=f"{level.upper()}-level traffic")
    span = con.execute("SELECT max(ns) - min(ns) FROM ops").fetchone()[0] or 0
    bin_ns = max(1000, int(span // 200) + 1)
    for level, key, lab in (("gpu", "gpu", "label"), ("node", "node", "label")):
        rows = A.bandwidth(con, level, bin_ns)
        if rows:
            written += A.bandwidth_figure(rows, key, lab, str(fig_dir / f"bandwidth_{level}"),
                                          f"Egress bandwidth per {level} (bin {bin_ns / 1e3:.0f} µs)")
    _, arrivals = A.barrier_report(con)
    if arrivals:
        written += A.barrier_figure(arrivals, str(fig_dir / "barriers"))
    return written


def print_summary(s, out, file=None):
    file = file or sys.stdout
    p = lambda *a: print(*a, file=file)
    tr = s.get("time_range_ns")
    p(f"sigmatrace report → {out}")
    p(f"  {s['processes']} processes on {len(s['nodes'])} nodes, {s['events']:,} events"
      + (f", {s['duration_s'] * 1e3:.3f} ms ({tr[0]} .. {tr[1]} ns)" if tr else ""))
    p(f"  {s['operations']:,} operations ({s['operations_matched']:,} matched to their peer), "
      f"{_fmt_bytes(s['bytes_total'])}; doorbells {s['doorbells']['total']:,} "
      f"({s['doorbells']['recovered']:,} with all WQEs recovered, {s['doorbells']['coalesced']:,} coalesced)")
    if s["top_talkers"]:
        p("  top talkers:")
        for r in s["top_talkers"][:5]:
            p(f"    rank {r['src_rank']} ({r['src_node']}) → rank {r['dst_rank']} ({r['dst_node']}): "
              f"{_fmt_bytes(r['bytes'])} in {r['ops']:,} ops")
    sk = s["skew"]["node"]
    if sk and sk.get("egress_imbalance") is not None:
        p(f"  skew (nodes): egress max/min {sk['egress_imbalance']:.2f}×, ingress {sk['ingress_imbalance'] or 0:.2f}×, "
          f"heaviest pair {s['nodes'][sk['heaviest_src']]}→{s['nodes'][sk['heaviest_dst']]} "
          f"{sk['heaviest_pair_vs_mean']:.2f}× the mean pair")
    if s["barriers"]["count"]:
        w = s["barriers"]["worst"][0]
        p(f"  barriers: {s['barriers']['count']}; worst spread {w['spread_ns'] / 1e3:.1f} µs, straggler {w['straggler_label']}")
    L = s["losses"]
    p(f"  drops/losses: {L['dropped_events']:,} dropped events, {L['lost_bytes']:,} bytes lost from files, "
      f"{L['wqe_lost_wqebbs']:,} WQEBBs unrecovered, {len(L['incomplete_processes'])} incomplete process(es)")
    for n in s["clock"]["nodes"]:
        res = n.get("residual_ns")
        # The matched-op residual only describes the clock when the refinement
        # was applied; otherwise the calibration pairs set the time base and the
        # matched-op estimate (loose one-sided bounds) is kept in summary.json.
        p(f"  clock {n['label']}: {n['source']} ({n['calibration_pairs']} pairs"
          + (f", fit residual {n['fit_residual_ns']:.0f} ns" if n.get("fit_residual_ns") is not None else "") + ")"
          + (f", refined from {n['refine_pairs']} matched ops {n['offset_ns'] / 1e3:+.3f} µs "
             f"{n['drift_ppm']:+.2f} ppm, residual {res:.0f} ns" if n["refined"] and res is not None else ""))
    for w in s["warnings"][:20]:
        p(f"  warning: {w}")
    if len(s["warnings"]) > 20:
        p(f"  … {len(s['warnings']) - 20} more warnings in summary.json")


def run(args):
    from ..errors import TraceFormatError
    cap = Path(args.capture)
    if not cap.exists():
        raise SigmatraceError(f"{cap}: no such capture file or directory")
    out = Path(args.output) if args.output else (cap if cap.is_dir() else cap.parent) / "report"
    try:
        corr, summary, timings = build_report(cap, out, workers=args.workers, perfetto=not args.no_perfetto,
                                              figures=not args.no_figures, quiet=args.quiet,
                                              clock_refine=args.clock_refine,
                                              max_perfetto_events=args.max_perfetto_events,
                                              batch_records=args.batch_records)
    except TraceFormatError as e:
        raise SigmatraceError(str(e)) from None
    except (OSError, MemoryError) as e:
        raise SigmatraceError(f"{type(e).__name__}: {e}") from None
    if args.json:
        print(json.dumps({k: summary[k] for k in ("processes", "events", "operations", "bytes_total", "losses")}))
    elif not args.quiet:
        print_summary(summary, out)
    return 0


def register(subparsers):
    p = subparsers.add_parser("report", help="correlate a capture: Perfetto trace, summary.json, Parquet tables, figures",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("capture", help="directory of per-process files, or one capture.bin")
    p.add_argument("-o", "--output", help="report directory (default: CAPTURE/report or next to the file)")
    p.add_argument("-j", "--workers", type=int, default=None, help="decode processes (default: all cores)")
    p.add_argument("--clock-refine", choices=("auto", "always", "never"), default="auto",
                   help="cross-node clock refinement from matched operations (F24b)")
    p.add_argument("--max-perfetto-events", type=int, default=500_000)
    p.add_argument("--batch-records", type=int, default=None,
                   help="records decoded and written at a time per worker (bounds memory; default 262144)")
    p.add_argument("--no-perfetto", action="store_true")
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--json", action="store_true", help="print a one-line JSON digest instead of the text summary")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=run)
    return p
