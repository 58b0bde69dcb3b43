"""``build_report``: correlate a capture and write the report directory (Perfetto trace, summary.json,
Parquet tables, figures).  The layer above the exporters, queries and analyses; the CLI's ``report``
and ``query`` commands call it."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import analysis as A
from ..analysis.summable import rows as summed_rows
from ..analysis.summable import span_ns
from ..correlate import correlate
from ..errors import SigmatraceError
from ..export import write_perfetto
from ..format.reader import capture_files
from ..progress import QUIET, Progress
from ..query import connect
from ..tables import TABLES, write_tables
from .summary import build_summary, write_summary


REPORT_MARKERS = ("summary.json", "tables", "trace.pftrace", "figures")


def is_previous_report(path: Path) -> bool:
    """A directory that holds a sigmatrace report and nothing else (what ``build_report`` may replace)."""
    names = {p.name for p in path.iterdir()}
    return bool(names) and names <= set(REPORT_MARKERS) and "summary.json" in names


def default_output(capture) -> Path:
    """Where a report goes without -o: CAPTURE/report for a directory, NAME.report beside a file NAME.bin
    (so the captures of one folder do not overwrite each other's reports)."""
    cap = Path(capture)
    return cap / "report" if cap.is_dir() else cap.with_name(cap.stem + ".report")


def build_report(capture, out, workers=None, perfetto=True, figures=True, quiet=False, clock_refine="auto",
                 max_perfetto_events=500_000, batch_records=None, cluster=None):
    """Correlate ``capture`` and write the report into ``out``; returns (Correlated, summary, timings).

    ``out`` holds one report: it is written beside it and then put in place whole, replacing an earlier
    report there (never a mix of two reports' files); a directory that holds anything else is refused, and
    a failed report leaves nothing behind.  ``batch_records``: records decoded / written at a time (bounded
    memory; default ``decode.DEFAULT_BATCH_RECORDS``).  The events table is streamed from the capture into
    ``tables/events/part-*.parquet`` by the worker processes (one row group per batch) and never held whole
    in memory; the per-operation tables are written in row ranges.  ``cluster``: correlate and write the
    tables on a Dask cluster (a scheduler address or file, ``local:N``, or a ``distributed.Client``;
    sigmatrace.cluster) -- the same report."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SigmatraceError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not is_previous_report(out):
        raise SigmatraceError(f"{out} holds files that are not a sigmatrace report; give another -o or empty it")
    files = capture_files(capture)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        result = _write_report(files, capture, tmp, workers, perfetto, figures, quiet, clock_refine,
                               max_perfetto_events, batch_records, cluster)
        _put_in_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _put_in_place(tmp: Path, out: Path):
    """``tmp`` becomes ``out``; an earlier report there is moved aside first and then removed."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old")
        shutil.rmtree(old, ignore_errors=True)
        if any(out.iterdir()):
            out.rename(old)
        else:
            out.rmdir()
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_report(files, capture, out, workers, perfetto, figures, quiet, clock_refine, max_perfetto_events,
                  batch_records, cluster=None):
    with Progress(quiet) as prog:
        return _write_report_stages(files, capture, out, workers, perfetto, figures, quiet, clock_refine,
                                    max_perfetto_events, batch_records, prog, cluster)


def _write_report_stages(files, capture, out, workers, perfetto, figures, quiet, clock_refine, max_perfetto_events,
                         batch_records, prog, cluster=None):
    """The report's stages, each shown by ``prog`` with its total: decode (files), correlate (steps), tables,
    perfetto (events drawn), figures.  ``cluster``: correlate and write the tables on Dask; the Perfetto trace
    and the figures are then tasks too, written while this process builds the summary."""
    timings = {}
    with contextlib.ExitStack() as stack:
        t = time.perf_counter()
        client = fin = None
        if cluster is not None:
            client = stack.enter_context(_cluster_client(cluster, quiet))
            corr, fin = _on_cluster(client, files, out, prog, timings, workers=workers, figures=figures,
                                    clock_refine=clock_refine, perfetto=perfetto,
                                    max_perfetto_events=max_perfetto_events, batch_records=batch_records)
            stack.push(lambda exc_type, exc, tb: fin.close(failed=exc_type is not None))
        else:
            kw = {"batch_records": batch_records} if batch_records else {}
            corr = correlate(capture, workers=workers, clock_refine=clock_refine, progress=prog, **kw)
            timings["correlate_s"] = time.perf_counter() - t
            t = time.perf_counter()
            prog("tables", 0, total=sum(1 for n in TABLES if n in corr.tables), unit="table")
            write_tables(corr, out / "tables", progress=lambda name: prog("tables", 1),
                         collect_host=max_perfetto_events if perfetto else None)
            prog.close()
            timings["tables_s"] = time.perf_counter() - t
        con = connect(out)   # the written Parquet tables: the same views `sigmatrace query` sees
        spill = _bounded(con, out) if cluster is not None else None
        if spill is not None:
            stack.callback(shutil.rmtree, spill, True)
            stack.callback(con.close)
        summed = corr.summed      # the cluster report's reduction over its ops parts (None: queried here)
        # the latency groups once, for the summary and the latency figure (an O(operations) radix selection;
        # the cluster report's from its parts)
        t = time.perf_counter()
        latency = corr.latency or A.latency_reduction(con, hist=bool(figures))
        timings["latency_s"] = time.perf_counter() - t
        figure_tasks = None
        if client is not None and figures:    # drawn on the cluster while this process writes the summary
            t = time.perf_counter()
            figure_tasks = _submit_figures(client, out, corr, summed, latency)
            timings["figures_submit_s"] = time.perf_counter() - t
        pstats = None
        if perfetto:
            t = time.perf_counter()
            pstats = fin.perfetto() if fin is not None else write_perfetto(
                corr, out / "trace.pftrace", max_events=max_perfetto_events, progress=prog)
            prog.close()
            timings["perfetto_s"] = time.perf_counter() - t
            if pstats.get("truncated") and pstats.get("window_end_ns") is None:
                corr.warnings.append("Perfetto trace holds no events (--max-perfetto-events 0); the Parquet tables "
                                     "hold everything")
            elif pstats.get("truncated"):
                corr.warnings.append(f"Perfetto trace holds the first {max_perfetto_events:,} events of the run (all "
                                     f"processes, host calls, doorbells and operations up to "
                                     f"{pstats.get('window_end_ns')} ns; --max-perfetto-events); the Parquet "
                                     f"tables hold everything")
        t = time.perf_counter()
        summary = build_summary(corr, con, pstats, summed=summed, latency=latency)
        summary["timings_s"] = timings
        write_summary(summary, out / "summary.json")
        timings["summary_s"] = time.perf_counter() - t
        if figures:
            t = time.perf_counter()
            if figure_tasks is not None:
                err = _wait_figures(client, figure_tasks, prog)
            else:
                err = None
                try:
                    _figures(con, out / "figures", progress=prog, summed=summed, latency=latency)
                except Exception as e:  # figures are a convenience: never lose the report for them
                    err = e
            if err is not None:
                corr.warnings.append(f"figures not drawn: {err}")
            prog.close()
            timings["figures_s"] = time.perf_counter() - t
    return corr, summary, timings


@contextlib.contextmanager
def _cluster_client(cluster, quiet):
    """A Dask client of ``cluster`` (a client, or what ``sigmatrace.cluster.connect`` takes), closed at the
    end if made here."""
    from .. import cluster as C
    client, close = (cluster, None) if hasattr(cluster, "submit") else C.connect(cluster)
    try:
        link = C.dashboard_link(client)
        if link and not quiet:
            print(f"sigmatrace: Dask dashboard {link}", file=sys.stderr, flush=True)
        yield client
    finally:
        if close is not None:
            close()


def _on_cluster(client, files, out, prog, timings, **kw):
    """Correlate and write the tables on Dask (sigmatrace.cluster); (Correlated, cluster.Finishing: the
    Perfetto trace still being written)."""
    from .. import cluster as C
    t = time.perf_counter()
    stages, held, tasks = {}, {}, {}
    try:
        got = C.correlate_and_write(client, files, out, progress=prog, stage_s=stages, held=held, tasks=tasks, **kw)
    finally:
        prog.close()
    timings["correlate_and_tables_s"] = time.perf_counter() - t
    timings["cluster_stages_s"] = stages
    timings["cluster_driver_rows"] = held
    timings["cluster_tasks"] = tasks
    return got


def _submit_figures(client, out, corr, summed, latency):
    """One task per figure (FIGURES) on the cluster, each drawing from its own query connection over the
    written tables (``connect``, as this module has it) and the sums it needs, while this process writes the
    summary; the futures."""
    tr, n = corr.stats.get("time_range_ns"), corr.stats.get("events", 0)
    t0_ns = int(tr[0]) if n and tr else None      # summary.json's start (``_figures`` reads it from there)
    bin_ns = A.bandwidth_bin_ns(span_ns(summed)) if summed is not None else None
    futs = []
    for kind in FIGURES:
        # a figure's own sums are named after it (matrix_node) or its bins (bandwidth_gpu_bins)
        sub = None if summed is None else {k: v for k, v in summed.items() if k in (kind, f"{kind}_bins")}
        futs.append(client.submit(_figure_task, connect, str(out), kind, t0_ns, sub,
                                  latency if kind == "latency" else None, bin_ns, pure=False,
                                  key=f"sigmatrace-figure-{kind}-{os.getpid()}-{time.monotonic_ns()}"))
    return futs


def _wait_figures(client, futs, prog):
    """Wait for the figure tasks (``prog`` counts them); the first figure's error, or None."""
    from distributed import as_completed
    prog("figures", 0, total=FIGURE_KINDS, unit="figure")
    err = None
    for f in as_completed(futs):
        try:
            _, e = f.result()
        except Exception as ex:      # the task itself lost: figures are a convenience
            e = ex
        if err is None and e is not None:
            err = e
        prog("figures", 1)
    return err


_FIGURE_LOCK = threading.Lock()     # pyplot is not thread-safe: one figure at a time per worker process


def _figure_task(connect_fn, report_dir, kind, t0_ns, summed, latency, bin_ns):
    """A cluster task: ``draw_figure`` of ``kind`` from a query connection over ``report_dir``'s tables;
    (files written, None) or ([], the error as text)."""
    out = Path(report_dir)
    try:
        con = connect_fn(out)
        try:
            with _FIGURE_LOCK:
                return draw_figure(kind, con, out / "figures", t0_ns, summed, latency, bin_ns), None
        finally:
            con.close()
    except Exception as e:
        return [], str(e)


DRIVER_MEMORY = "4GB"


def _bounded(con, out):
    """The cluster report's summary and figures within a memory limit (SIGMATRACE_DRIVER_MEMORY, default
    DRIVER_MEMORY): DuckDB's aggregations, joins and sorts over the written tables spill to a directory beside
    the report instead of growing with the capture (docs/cluster.md)."""
    spill = out.parent / f".{out.name}.spill"
    con.execute(f"SET memory_limit = '{os.environ.get('SIGMATRACE_DRIVER_MEMORY', DRIVER_MEMORY)}'")
    con.execute(f"SET temp_directory = '{spill}'")
    return spill


# every figure of the report, one at a time (``draw_figure``): node, rank, GPU matrices; GPU, node bandwidth;
# barriers; latency
FIGURES = ("matrix_node", "matrix_rank", "matrix_gpu", "bandwidth_gpu", "bandwidth_node", "barriers", "latency")
FIGURE_KINDS = len(FIGURES)


def _figures(con, fig_dir, t0_ns=None, progress=QUIET, summed=None, latency=None):
    """Every figure of the report (docs/report.md, "Figures"); times relative to ``t0_ns``, the capture's start
    (summary.json's time_range_ns next to ``fig_dir`` when not given), like the terminal summary.  ``progress``
    counts the FIGURE_KINDS (drawn or, without data, skipped).  ``summed``: as ``build_summary``'s (the
    matrices); ``latency``: an ``analysis.latency_reduction`` with its histograms, if already computed."""
    progress("figures", 0, total=FIGURE_KINDS, unit="figure")
    if t0_ns is None:
        import json
        try:
            tr = json.loads((fig_dir.parent / "summary.json").read_text()).get("time_range_ns")
            t0_ns = int(tr[0]) if tr else None
        except (OSError, ValueError):
            t0_ns = None
    written, bin_ns = [], None
    for kind in FIGURES:
        if kind.startswith("bandwidth") and bin_ns is None:
            bin_ns = _bandwidth_bin_ns(con, summed)
        written += draw_figure(kind, con, fig_dir, t0_ns, summed, latency, bin_ns)
        progress("figures", 1)
    return written


def _bandwidth_bin_ns(con, summed):
    span = (con.execute("SELECT max(ns) - min(ns) FROM ops").fetchone()[0] or 0) if summed is None else span_ns(summed)
    return A.bandwidth_bin_ns(span)


def draw_figure(kind, con, fig_dir, t0_ns=None, summed=None, latency=None, bin_ns=None):
    """One of FIGURES into ``fig_dir`` (nothing without data); the files written.  As ``_figures``; ``bin_ns``:
    the bandwidth figures' bin (default: from the ops' time span)."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    what, level = kind.split("_") if "_" in kind else (kind, None)
    if what == "matrix":
        labels, m, _ = A.comm_matrix(con, level, rows=None if summed is None else summed_rows(summed,
                                                                                              f"matrix_{level}"))
        if len(labels) and m.any():
            return A.heatmap(labels, m, str(fig_dir / f"matrix_{level}"),
                             title=f"{dict(node='Node', rank='Rank', gpu='GPU')[level]}-level traffic "
                                   f"(bytes initiator → target)")
        return []
    if what == "bandwidth":
        bin_ns = _bandwidth_bin_ns(con, summed) if bin_ns is None else bin_ns
        binned = f"bandwidth_{level}_bins"
        rows = A.bandwidth(con, level, bin_ns, binned=summed_rows(summed, binned) if summed and binned in summed
                           else None)
        if rows:
            name = dict(gpu="GPU", node="node")[level]
            return A.bandwidth_figure(rows, level, "label", str(fig_dir / f"bandwidth_{level}"),
                                      f"Egress bandwidth per {name}", bin_ns=bin_ns, t0_ns=t0_ns, what=name)
        return []
    if what == "barriers":
        bars, arrivals = A.barrier_report(con)
        return A.barrier_figure(arrivals, str(fig_dir / "barriers"), barriers=bars, t0_ns=t0_ns) if arrivals else []
    lat = A.op_latency(con) if latency is None else A.op_latency_groups(latency)
    return A.latency_figure(lat, str(fig_dir / "latency")) if lat else []
