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
from ..units import fmt_bytes as _fmt_bytes, fmt_ns as _fmt_ns
from .args import nonneg_int, positive_int


def _n(k, word, plural=None):
    """'1 process', '2 processes', '0 barriers'."""
    k = int(k)
    return f"{k:,} {word if k == 1 else (plural or word + 's')}"


def _ranks(ranks):
    """'ranks 0–15', 'rank 3', 'ranks 0–3, 8' (consecutive runs collapsed)."""
    if not ranks:
        return ""
    runs, a = [], ranks[0]
    for x, y in zip(ranks, ranks[1:] + [None]):
        if y != x + 1:
            runs.append(f"{a}–{x}" if x > a else f"{a}")
            a = y
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


_CLOCK_SOURCE = {"realtime": "CLOCK_REALTIME calibration", "tai": "CLOCK_TAI calibration",
                 "tsc_hz": "the header's tsc_hz, no calibration (arbitrary origin)", "none": "no time base"}


def _wall(ns):
    import datetime
    t = datetime.datetime.fromtimestamp(int(ns) // 1_000_000_000, datetime.timezone.utc)
    return f"{t:%Y-%m-%d %H:%M:%S}.{int(ns) % 1_000_000_000:09d} UTC"


def _skew_line(sk, what, whats, node_labels=None):
    """One line per level: egress/ingress imbalance, how many pairs carry traffic and the heaviest pair against
    the other senders' heaviest pairs (an even ring is 1.00x there, however sparse: the mean over every pair,
    idle ones included, would call it N-1 times the mean)."""
    if not sk or sk.get("egress_imbalance") is None:
        return None
    src = sk.get("heaviest_src_label", sk.get("heaviest_src"))
    dst = sk.get("heaviest_dst_label", sk.get("heaviest_dst"))
    act, pairs = sk.get("active_pairs"), sk.get("pairs")
    lo, hi = sk.get("min_destinations"), sk.get("max_destinations")
    fan = ""
    if lo is not None and act is not None and pairs and act < pairs:
        fan = (f", each {what} sends to {lo} other{'s' if lo != 1 else ''}" if lo == hi else
               f", {lo}–{hi} destinations per {what}")
    pat = f"; {act:,} of {_n(pairs, what + ' pair')} active{fan}" if act is not None and pairs else ""
    rel = []
    if sk.get("heaviest_pair_vs_active_mean") is not None and act and act > 1:
        rel.append(f"{sk['heaviest_pair_vs_active_mean']:.2f}× the mean active pair")
    if sk.get("heaviest_pair_vs_mean") is not None and act is not None and pairs and act < pairs:
        rel.append(f"{sk['heaviest_pair_vs_mean']:.2f}× the mean over all pairs")
    top = sk.get("heaviest_pair_vs_top_pairs")
    head = f"{top:.2f}× the other {whats}' heaviest pairs" if top is not None else ""
    return (f"  skew ({whats}): egress max/min {sk['egress_imbalance']:.2f}×, ingress "
            f"{(sk.get('ingress_imbalance') or 0):.2f}×{pat}; heaviest pair {src} → {dst} "
            f"{_fmt_bytes(sk.get('heaviest_bytes') or 0)}" + (f" = {head}" if head else "")
            + (f" ({', '.join(rel)})" if rel else ""))


def _clock_lines(clock):
    """One line for every node together (sources, calibration pairs, worst fit residual) and one for the
    matched-operation refinement; the per-node values are in summary.json."""
    nodes = clock.get("nodes") or []
    ref = clock.get("refinement") or {}
    if not nodes:
        return []
    by = {}
    for n in nodes:
        by.setdefault(n["source"], []).append(n)
    parts = []
    for k, (src, lst) in enumerate(sorted(by.items(), key=lambda kv: -len(kv[1]))):
        cal = sorted({int(n["calibration_pairs"]) for n in lst})
        fit = [n["fit_residual_ns"] for n in lst if n.get("fit_residual_ns") is not None and n["calibration_pairs"]]
        ptp = sum(1 for n in lst if n.get("ptp"))
        names = "" if k == 0 else (" (" + ", ".join(n["label"] for n in lst[:4]) + (" …" if len(lst) > 4 else "")
                                   + ")")      # the exceptions named, not the majority
        detail = []
        if cal and cal != [0]:
            detail.append(f"{cal[0]}" + (f"–{cal[-1]}" if len(cal) > 1 else "") + " calibration pairs"
                          + (" each" if len(lst) > 1 else ""))
        if fit:
            detail.append(f"fit residual ≤ {max(fit):.0f} ns")
        if ptp:
            detail.append("PTP" if ptp == len(lst) else f"{ptp} with PTP")
        parts.append(f"{_n(len(lst), 'node')}{names} on {_CLOCK_SOURCE.get(src, src)}"
                     + (f" ({', '.join(detail)})" if detail else ""))
    out = ["  clock: " + "; ".join(parts)]
    refined = [n for n in nodes if n.get("refined")]
    if refined:
        off = [n["offset_ns"] / 1e3 for n in refined]
        res = [n["residual_ns"] for n in refined if n.get("residual_ns") is not None]
        out.append(f"  clock refinement ({ref.get('method', 'matched-ops')}): applied to {_n(len(refined), 'node')}, "
                   f"offsets {min(off):+.3f} .. {max(off):+.3f} µs"
                   + (f", residual ≤ {max(res):.0f} ns" if res else "")
                   + f", from {ref.get('pairs', 0):,} matched pairs")
    elif ref:
        why = ref.get("reason") or ("the calibration agrees with the matched operations"
                                    if ref.get("method") == "matched-ops" and not ref.get("calibration_disagrees")
                                    else "the estimate is not tight enough to overrule the calibration")
        out.append(f"  clock refinement: not applied ({why}; --clock-refine {ref.get('mode', 'auto')})")
    return out


_ATTRIBUTION = {"window": "alone", "group": "in an NCCL group", "in-flight": "in flight together",
                "no-qps": "on a communicator without known QPs", "no-communicator": "of an unknown communicator"}


def _collective_lines(c):
    """NCCL: one line for the calls and how their work requests were attributed, one per kind and size (at most
    six): calls, bytes on the wire per call, call → end, the rank most often slowest."""
    if not c:
        return []
    if not c.get("calls") and c.get("aggregate"):
        return ["  NCCL collectives (aggregate mode, counters only): " + "; ".join(
            f"{r['op']} {_n(r['calls'], 'call')} {_fmt_bytes(r['bytes'])}" for r in c["aggregate"][:6])]
    att = c.get("attribution") or {}
    how = ", ".join(f"{att[k]:,} {v}" for k, v in _ATTRIBUTION.items() if att.get(k))
    out = [f"  NCCL collectives: {_n(c['calls'], 'call')} ({c['executed']:,} executed) on "
           f"{_n(c['communicators'], 'communicator')}; work requests attributed to {how or 'none'}"
           + (f" ({c.get('ops_attributed', 0):,} operations on {_n(c.get('qps', 0), 'QP')})" if how else "")]
    rows = sorted(c.get("by_kind") or [], key=lambda r: -(r["wire_bytes"] or 0))
    for r in rows[:6]:
        per = r.get("wire_bytes_per_call")
        line = f"    {r['op']} {_fmt_bytes(r['bytes'])} × {r['calls']:,}"
        if per is not None:
            line += f": {_fmt_bytes(per)} on the wire per call"
        if r.get("p50_ns") is not None:
            line += f", call → end p50 {_fmt_ns(r['p50_ns'])} (max {_fmt_ns(r['max_ns'])})"
        if r.get("slowest_rank") is not None:
            line += f", slowest rank {r['slowest_rank']} ({r['slowest_times']} of {r['instances']})"
        if r.get("shared"):
            line += f"; {r['shared']:,} in shared units"
        out.append(line)
    if len(rows) > 6:
        out.append(f"    … {len(rows) - 6} more kinds/sizes in summary.json")
    return out


def print_summary(s, out, file=None):
    file = file or sys.stdout
    p = lambda *a: print(*a, file=file)
    tr = s.get("time_range_ns")
    t0 = tr[0] if tr else None
    rel = (lambda ns: f"+{(ns - t0) / 1e6:.3f} ms") if t0 is not None else (lambda ns: f"{ns} ns")
    p(f"sigmatrace report → {out}")
    ranks = s.get("ranks") or []
    wall = all(n["source"] in ("realtime", "tai") for n in s["clock"]["nodes"]) and s["clock"]["nodes"]
    p(f"  {_n(s['processes'], 'process', 'processes')}" + (f" ({_ranks(ranks)})" if ranks else "")
      + f" on {_n(len(s['nodes']), 'node')}, {_n(s['events'], 'event')}"
      + (f" over {_fmt_ns(tr[1] - tr[0], 4)}" + (f", from {_wall(t0)}" if wall else "") if tr else "")
      + (" (times below: since this start)" if tr else ""))
    for e in s.get("untraced_libraries") or []:
        p(f"  untraced: {e['notice']}")
    d = s["doorbells"]
    p(f"  {_n(s['operations'], 'operation')} ({s['operations_matched']:,} matched to their peer), "
      f"{_fmt_bytes(s['bytes_total'])}; " + (f"{_n(d['total'], 'doorbell')} ({d['recovered']:,} with all WQEs "
                                             f"recovered, {d['coalesced']:,} coalesced)" if d["total"] else "no doorbells"))
    pairs = s.get("top_pairs") or []
    if pairs:
        p("  top talkers (each pair of processes once, both directions):")
        def who(rank, pid, node):      # a rank, else the process (a program without ranks: fi_pingpong)
            return f"rank {rank} ({node})" if rank is not None and rank >= 0 else f"pid {pid} ({node})"
        for r in pairs[:5]:
            a = who(r["rank_a"], r["pid_a"], r["node_a"])
            if r["process_b"] < 0:
                p(f"    {a} → untraced peers (not in the capture or not resolved): {_fmt_bytes(r['bytes'])} "
                  f"in {_n(r['ops'], 'op')}")
                continue
            b = who(r["rank_b"], r["pid_b"], r["node_b"])
            if r["a_to_b_bytes"] and r["b_to_a_bytes"]:
                p(f"    {a} ↔ {b}: {_fmt_bytes(r['bytes'])} ({_fmt_bytes(r['a_to_b_bytes'])} →, "
                  f"{_fmt_bytes(r['b_to_a_bytes'])} ←) in {_n(r['ops'], 'op')}")
            else:               # one direction only: that arrow
                x, y = (a, b) if r["a_to_b_bytes"] or not r["b_to_a_bytes"] else (b, a)
                p(f"    {x} → {y}: {_fmt_bytes(r['bytes'])} in {_n(r['ops'], 'op')}")
    for level, what, whats in (("node", "node", "nodes"), ("gpu", "GPU", "GPUs")):
        line = _skew_line(s["skew"].get(level), what, whats)
        if line:
            p(line)
    B = s["barriers"]
    if B["count"]:
        w = B["worst"][0]
        m = B.get("most_often_last")
        if m and m["times_last"] > 1:
            who = (f"most often last: {', '.join(m['labels'][:3])}{' …' if len(m['labels']) > 3 else ''} "
                   f"({m['times_last']} of {B['count']}{' each' if not m['unique'] else ''})")
        else:
            who = "no participant is last more than once"
        p(f"  barriers: {_n(B['count'], 'instance')}; {who}; worst spread {_fmt_ns(w['spread_ns'])} "
          f"(#{w['barrier']} at {rel(w['first_ns'])}, last {w['straggler_label']})")
    for line in _collective_lines(s.get("collectives")):
        p(line)
    lat = s.get("latency") or []
    if lat:
        what = {"completion": "post → completion", "interval": "issue interval"}
        p("  op timing: " + "; ".join(
            f"{g['kind']} ({g['source']}) {what.get(g['measure'], g['measure'])} p50 {_fmt_ns(g['p50_ns'], 4)}, "
            f"p99 {_fmt_ns(g['p99_ns'], 4)} (n={g['count']:,})" for g in lat[:3])
          + (f"; {len(lat) - 3} more in summary.json" if len(lat) > 3 else ""))
    L = s["losses"]
    inc = len(L["incomplete_processes"])
    if not (L["dropped_events"] or L["lost_bytes"] or L["wqe_lost_wqebbs"] or inc):
        p("  drops/losses: none (no dropped events, no bytes lost from files, no WQEBB lost, every process complete)")
    else:
        p(f"  drops/losses: {_n(L['dropped_events'], 'dropped event')}, {_n(L['lost_bytes'], 'byte')} lost from "
          f"files, {_n(L['wqe_lost_wqebbs'], 'WQEBB')} unrecovered, {_n(inc, 'incomplete process', 'incomplete processes')}")
    for e in L.get("ended_early", [])[:20]:
        who = f"pid {e['pid']}" + (f" (rank {e['rank']})" if e["rank"] >= 0 else "")
        when = "no event recorded" if e["last_event_ns"] is None else f"last event at {rel(e['last_event_ns'])}"
        p(f"  ended early: {who} {e['path']}: no END record (killed, or its file cut); {when}")
    for line in _clock_lines(s["clock"]):
        p(line)
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
                                              batch_records=args.batch_records, cluster=args.cluster)
    except TraceFormatError as e:
        raise SigmatraceError(str(e)) from None
    except (OSError, MemoryError) as e:
        raise SigmatraceError(f"{type(e).__name__}: {e}") from None
    if args.json:
        print(json.dumps({k: summary[k] for k in ("processes", "events", "operations", "bytes_total", "losses",
                                                  "untraced_libraries")}))
    elif not args.quiet:
        print_summary(summary, out)
    if args.json or args.quiet:    # never silent: a library the capture does not cover is said on stderr
        for e in summary["untraced_libraries"]:
            print(f"sigmatrace report: {e['notice']}", file=sys.stderr)
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
    p.add_argument("--cluster", metavar="ADDRESS", default=None,
                   help="correlate on a Dask cluster (pip install 'sigmatrace[cluster]'; docs/cluster.md): a "
                        "scheduler address (tcp://host:8786), a scheduler file, or local:N (N worker processes "
                        "here); capture and output on a filesystem every worker sees; the same report")
    p.add_argument("--no-perfetto", action="store_true", help="write no Perfetto trace")
    p.add_argument("--no-figures", action="store_true", help="draw no figures")
    p.add_argument("--json", action="store_true", help="print a one-line JSON digest instead of the text summary")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and no summary on the terminal")
    p.set_defaults(func=run)
    return p
