"""SQL over correlated traces (F18).

``connect(source)`` returns a DuckDB connection with one view per table:
``source`` is a report directory (``tables/*.parquet`` and part directories)
or a ``Correlated`` object (tables registered from memory); a capture is
reported into a cache directory first by ``sigmatrace.report.ensure_report``.  Named analyses live in
``sql/*.sql`` (``named_queries()``, ``run_named(con, name)``).  PerfettoSQL:
``perfetto_query(report_dir, sql, trace_processor=...)``.  Schema:
docs/schema.md.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..correlate import Correlated
from ..errors import SigmatraceError
from ..tables import arrow_table

SQL_DIR = Path(__file__).parent / "sql"
EVENTS_IN_MEMORY = 20_000_000   # connect(Correlated) loads the events table up to this many rows


def named_queries() -> dict:
    return {p.stem: p.read_text() for p in sorted(SQL_DIR.glob("*.sql"))}


def is_report(p: Path) -> bool:
    return p.is_dir() and (p / "tables").is_dir() and any(_table_sources(p / "tables"))


def _table_sources(tables: Path):
    """(name, DuckDB source expression) per table: ``name.parquet`` files and ``name/`` directories of
    part files (the events table), read as one table in part order."""
    out = {}
    for f in sorted(tables.glob("*.parquet")):
        out[f.stem] = f"read_parquet('{f.as_posix()}')"
    for d in sorted(tables.iterdir()) if tables.is_dir() else []:
        if d.is_dir() and any(d.glob("*.parquet")):
            out[d.name] = f"read_parquet('{(d / '*.parquet').as_posix()}')"
    return sorted(out.items())


def connect(source, con=None):
    import duckdb
    con = con or duckdb.connect()
    if isinstance(source, Correlated):
        for name in source.tables:
            if name == "events" and not source.events_loaded and source.tables[name].n_rows > EVENTS_IN_MEMORY:
                continue   # too large to load: query the written report (tables/events/) instead
            t = arrow_table(source, name)
            con.register(f"_t_{name}", t)
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM _t_{name}')
        return con
    rep = Path(source)
    if not is_report(rep):
        raise SigmatraceError(f"{rep}: not a report directory (no tables/); make one with `sigmatrace report`, "
                              f"or sigmatrace.report.connect() for a capture")
    for name, src in _table_sources(rep / "tables"):
        con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM {src}')
    return con


def run_named(con, name, **variables):
    q = named_queries()
    if name not in q:
        raise KeyError(f"no named query {name!r}; known: {', '.join(sorted(q))}")
    for k, v in variables.items():
        con.execute(f"SET VARIABLE {k} = {int(v) if isinstance(v, (int, float)) else repr(v)}")
    return con.execute(q[name])


def find_trace_processor(explicit=None):
    cand = explicit or os.environ.get("SIGMATRACE_TRACE_PROCESSOR")
    if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
        return str(cand)
    return shutil.which("trace_processor_shell") or shutil.which("trace_processor") if not cand else None


def perfetto_query(report_dir, sql, trace_processor=None, timeout=300):
    """Run PerfettoSQL on ``report_dir/trace.pftrace`` with a trace_processor binary; returns its stdout."""
    tp = find_trace_processor(trace_processor)
    if not tp:
        raise SigmatraceError("no trace_processor binary: pass --trace-processor PATH or set SIGMATRACE_TRACE_PROCESSOR")
    trace = Path(report_dir) / "trace.pftrace"
    if not trace.exists():
        raise SigmatraceError(f"{trace} does not exist (run `sigmatrace report` with the Perfetto export)")
    r = subprocess.run([tp, "--query-string", sql, str(trace)], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SigmatraceError(f"trace_processor failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout
