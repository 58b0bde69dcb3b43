"""`sigmatrace replay capture.bin`: check a capture's doorbell stream against the
model's send-queue / producer-index semantics, answer what-if questions, then
decode it (correlator when present, else the capture summary)."""
import importlib
import json
import sys

from .args import nonneg_float, positive_int, queue_depth


def register(subparsers):
    p = subparsers.add_parser(
        "replay", help="re-run a capture's doorbells through the model (invariants, what-if)",
        description="Feeds a recorded or synthetic capture through the SimPy model's SQ and producer-index "
                    "semantics: reports non-monotonic producer indices, WQE index discontinuities and WQEs "
                    "that would be overwritten before their recovery copy; with --batch-threshold, "
                    "--queue-depth or --poller-wakeup-ns it re-simulates the poller and says what would have "
                    "been lost or delayed. Then decodes the capture.")
    p.add_argument("capture", help="capture file or directory of per-process files")
    p.add_argument("--batch-threshold", type=positive_int, default=None,
                   help="what-if: WQEBBs per recovery batch (default: as recorded)")
    p.add_argument("--queue-depth", type=queue_depth, default=None,
                   help="what-if: SQ depth in WQEBBs, a power of two (default: each QP's recorded depth)")
    p.add_argument("--poller-wakeup-ns", type=nonneg_float, default=None,
                   help="what-if: poller wake-up latency in ns (default: as recorded)")
    p.add_argument("--copy-latency-ns", type=nonneg_float, default=None,
                   help="what-if: latency of the recovery copy in ns (default: the model's)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--strict", action="store_true", help="exit 1 when violations or predicted losses are found")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (shown on a terminal only: replay, decode and correlate, with totals)")
    p.set_defaults(func=run)


def run(args):
    from sigmatrace_sim.replay import analyse, format_report

    from ..errors import SigmatraceError, TraceFormatError
    from ..progress import Progress
    with Progress(args.quiet) as progress:
        try:
            cap, rep = analyse(args.capture, batch_threshold=args.batch_threshold, queue_depth=args.queue_depth,
                               poller_wakeup_ns=args.poller_wakeup_ns, copy_latency_ns=args.copy_latency_ns,
                               progress=progress)
        except TraceFormatError as e:      # the report's rule: only a capture with nothing readable is an error
            raise SigmatraceError(str(e)) from None
        summary = None
        try:
            corr = importlib.import_module("sigmatrace.correlate")
        except ModuleNotFoundError:
            corr = None
        if corr is not None and hasattr(corr, "correlate"):
            try:
                result = corr.correlate(args.capture, progress=progress)
                summary = _correlated_summary(result, cap)
            except Exception as e:  # the correlator is optional here; report and fall back
                progress.close()
                print(f"sigmatrace replay: correlator failed ({e}); printing the capture summary", file=sys.stderr)
    if summary is None:
        summary = cap.summary()
    if args.json:
        json.dump({"replay": rep, "summary": summary}, sys.stdout, indent=1, default=str)
        print()
    else:
        print(format_report(rep))
        print("decoded summary:")
        print(json.dumps(summary, indent=1, default=str))
    if args.strict and not rep["clean"]:
        return 1     # violations, predicted losses, or nothing checked
    return 0


def _correlated_summary(result, cap):
    """A compact view of the correlator's output: table sizes, clock alignment, warnings."""
    if hasattr(result, "summary"):
        return result.summary()
    tables = {}
    for name, cols in getattr(result, "tables", {}).items():
        n = 0
        for v in cols.values():
            n = len(v)
            break
        tables[name] = n
    out = {"capture": cap.summary(), "correlated_tables": tables}
    for attr in ("clock_info", "stats", "warnings"):
        if hasattr(result, attr):
            out[attr] = getattr(result, attr)
    return out
