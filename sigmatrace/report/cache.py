"""Reports of captures kept in a cache directory, so that ``sigmatrace query CAPTURE`` and
``sigmatrace.report.connect(CAPTURE)`` report a capture once and query it many times."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from .. import query
from ..correlate import Correlated
from ..query import is_report
from .build import build_report


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
    if is_report(p):
        return p
    out = cache_dir_for(p)
    if is_report(out) and (out / "summary.json").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_report(p, tmp, perfetto=False, figures=False, quiet=quiet)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def connect(source, con=None):
    """``query.connect`` for any source: a report directory, a ``Correlated``, or a capture (reported into
    the cache first)."""
    if isinstance(source, Correlated) or is_report(Path(source)):
        return query.connect(source, con)
    return query.connect(ensure_report(source), con)
