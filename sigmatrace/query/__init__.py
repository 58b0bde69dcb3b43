"""SQL over correlated traces (F18).

``connect(source)`` returns a DuckDB connection with one view per table:
``source`` is a report directory (``tables/*.parquet``), a ``Correlated``
object (tables registered from memory), or a capture (reported into a cache
directory first — see ``ensure_report``).  Named analyses live in
``sql/*.sql`` (``named_queries()``, ``run_named(con, name)``).  PerfettoSQL:
``perfetto_query(report_dir, sql, trace_processor=...)``.  Schema:
docs/schema.md.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SQL_DIR = Path(__file__).parent / "sql"
EVENTS_IN_MEMORY = 20_000_000   # connect(Correlated) loads the events table up to this many rows


def named_queries() -> dict:
    return {p.stem: p.read_text() for p in sorted(SQL_DIR.glob("*.sql"))}


def _is_report(p: Path) -> bool:
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


def cache_dir_for(capture) -> Path:
    p = Path(capture).resolve()
    files = sorted(p.rglob("*")) if p.is_dir() else [p]
    h = hashlib.sha1()
    for f in files:
        if f.is_file():
            st = f.stat()
            h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    root = Path(os.environ.get("SIGMATRACE_CACHE", Path.home() / ".cache" / "sigmatrace"))
    return root / f"report-{h.hexdigest()[:16]}"


def ensure_report(source, quiet=True) -> Path:
    """A report directory for ``source`` (itself if it already is one; else a cached report)."""
    p = Path(source)
    if _is_report(p):
        return p
    out = cache_dir_for(p)
    if _is_report(out) and (out / "summary.json").exists():
        return out
    from ..cli.report import build_report
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_report(p, tmp, perfetto=False, figures=False, quiet=quiet)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def connect(source, con=None):
    import duckdb
    con = con or duckdb.connect()
    from ..correlate.core import Correlated
    if isinstance(source, Correlated):
        from ..export.tables import arrow_table
        for name in source.tables:
            if name == "events" and not source.events_loaded and source.tables[name].n_rows > EVENTS_IN_MEMORY:
                continue   # too large to load: query the written report (tables/events/) instead
            t = arrow_table(source, name)
            con.register(f"_t_{name}", t)
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM _t_{name}')
        return con
    rep = ensure_report(source)
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
        from ..errors import SigmatraceError
        raise SigmatraceError("no trace_processor binary: pass --trace-processor PATH or set SIGMATRACE_TRACE_PROCESSOR")
    trace = Path(report_dir) / "trace.pftrace"
    if not trace.exists():
        from ..errors import SigmatraceError
        raise SigmatraceError(f"{trace} does not exist (run `sigmatrace report` with the Perfetto export)")
    r = subprocess.run([tp, "--query-string", sql, str(trace)], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        from ..errors import SigmatraceError
        raise SigmatraceError(f"trace_processor failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout
