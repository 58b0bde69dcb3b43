"""`sigmatrace query CAPTURE_OR_REPORT "SQL"`: SQL over the correlated tables (DuckDB).

A capture is reported into a cache directory first (~/.cache/sigmatrace, or
$SIGMATRACE_CACHE).  `--named NAME` runs a shipped analysis (`--list` shows
them).  `--perfetto` runs PerfettoSQL on the report's trace.pftrace through a
trace_processor binary (`--trace-processor PATH` or $SIGMATRACE_TRACE_PROCESSOR).
Schema: docs/schema.md.
"""
from __future__ import annotations

import csv
import json
import sys

from ..errors import SigmatraceError
from .args import nonneg_int


def _print(cur, fmt, limit):
    cols = [d[0] for d in cur.description]
    rows = cur.fetchmany(limit) if limit else cur.fetchall()
    if fmt == "json":
        print(json.dumps([dict(zip(cols, r)) for r in rows], default=str))
    elif fmt == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    else:
        cells = [[("" if v is None else str(v)) for v in r] for r in rows]
        width = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w) for c, w in zip(cols, width)))
        print("  ".join("-" * w for w in width))
        for r in cells:
            print("  ".join(v.ljust(w) for v, w in zip(r, width)))
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def run(args):
    from ..query import connect, named_queries, perfetto_query
    from ..report import ensure_report
    if args.list:
        for name, sql in named_queries().items():
            first = next((l[3:] for l in sql.splitlines() if l.startswith("--")), "")
            print(f"{name:20s} {first}")
        return 0
    if not args.source:
        raise SigmatraceError("give a capture or report directory")
    if not args.sql and not args.named:
        raise SigmatraceError('give an SQL statement or --named NAME (see --list)')
    import duckdb
    try:
        rep = ensure_report(args.source, quiet=True)
        if args.perfetto:
            print(perfetto_query(rep, args.sql, trace_processor=args.trace_processor), end="")
            return 0
        con = connect(rep)
        for kv in args.var or []:
            k, _, v = kv.partition("=")
            con.execute(f"SET VARIABLE {k} = {int(v) if v.lstrip('-').isdigit() else repr(v)}")
        sql = named_queries()[args.named] if args.named else args.sql
        cur = con.execute(sql)
    except KeyError:
        raise SigmatraceError(f"no named query {args.named!r} (see --list)") from None
    except duckdb.Error as e:
        raise SigmatraceError(f"SQL: {str(e).splitlines()[0]}") from None
    if cur.description is None:
        return 0
    _print(cur, args.format, args.limit)
    return 0


def register(subparsers):
    p = subparsers.add_parser("query", help="SQL over a correlated capture (DuckDB; PerfettoSQL with --perfetto)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", help="capture (file or directory) or report directory")
    p.add_argument("sql", nargs="?", help="SQL statement")
    p.add_argument("--named", help="run a shipped analysis query")
    p.add_argument("--list", action="store_true", help="list the shipped analysis queries")
    p.add_argument("--var", action="append", help="NAME=VALUE for getvariable() (e.g. bin_ns=100000)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    p.add_argument("--limit", type=nonneg_int, default=0, help="print at most this many rows; 0: all")
    p.add_argument("--perfetto", action="store_true", help="PerfettoSQL through trace_processor")
    p.add_argument("--trace-processor", help="path of a trace_processor binary")
    p.set_defaults(func=run, absorb_extra=_absorb_sql)
    return p


def _absorb_sql(args, extra):
    """`query SOURCE --format csv "SQL"`: argparse gives the SQL back as an extra argument."""
    if args.sql is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.sql = extra[0]
        return True
    return False
