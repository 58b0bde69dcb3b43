"""`sigmatrace report CAPTURE -o OUT`: Perfetto timeline, summary.json, Parquet tables, figures.

CAPTURE is a directory of per-process files or one capture.bin.  Damaged
inputs (cut files, corrupt chunks, missing process files, duplicated ranks)
are reported as one-line warnings and the sound part is reported; only an
input with nothing readable is an error (exit status 2).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import SigmatraceError
from .args import nonneg_int, positive_int


def _fmt_bytes(b):
    b = float(b)
    for u in ("B", "KB", "MB", "GB", "TB"):
        if abs(b) < 1000 or u == "TB":
            return f"{b:.1f} {u}" if u != "B" else f"{int(b)} B"
        b /= 1000


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
    from ..report.build import build_report, default_output   # here: `sigmatrace --help` loads no numpy
    cap = Path(args.capture)
    if not cap.exists():
        raise SigmatraceError(f"{cap}: no such capture file or directory")
    out = Path(args.output) if args.output else default_output(cap)
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
    p.add_argument("-o", "--output", help="report directory (default: CAPTURE/report for a directory, "
                   "NAME.report beside a capture file NAME.bin); an earlier report there is replaced whole")
    p.add_argument("-j", "--workers", type=positive_int, default=None, help="decode processes (default: all cores)")
    p.add_argument("--clock-refine", choices=("auto", "always", "never"), default="auto",
                   help="cross-node clock refinement from matched operations (F24b)")
    p.add_argument("--max-perfetto-events", type=nonneg_int, default=500_000,
                   help="events drawn in the Perfetto trace (the earliest; the tables hold all); 0: none")
    p.add_argument("--batch-records", type=positive_int, default=None,
                   help="records decoded and written at a time per worker (bounds memory; default 262144)")
    p.add_argument("--no-perfetto", action="store_true", help="write no Perfetto trace")
    p.add_argument("--no-figures", action="store_true", help="draw no figures")
    p.add_argument("--json", action="store_true", help="print a one-line JSON digest instead of the text summary")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and no summary on the terminal")
    p.set_defaults(func=run)
    return p
