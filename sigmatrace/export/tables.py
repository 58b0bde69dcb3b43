"""Parquet tables (pyarrow) of every correlated entity; schema in docs/schema.md.

Columns go to Arrow zero-copy (``pa.array`` on numpy buffers); string columns
are dictionary-encoded.  Parquet dictionary encoding is used only for those
string columns (numeric columns are written plain + LZ4: the dictionary
attempt on high-cardinality integers costs more than it saves).  The events
table is never built whole: it is streamed from the capture in row groups of
``Correlated.batch_records`` (``Correlated.iter_events``) unless it is already
in memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..format import events as E

TABLES = ("processes", "threads", "nodes", "nics", "gpus", "qps", "events", "doorbells", "wqes", "ops", "flows",
          "completions", "barriers", "barrier_arrivals", "clock", "losses", "aggregates")
EVENT_COLUMNS = ("process", "thread", "tsc", "ns", "type", "aux", "obj", "arg", "type_name", "x0", "x1", "x2", "x3",
                 "node")
_EV_DT = dict(process=np.int64, thread=np.int64, tsc=np.uint64, ns=np.int64, type=np.int64, aux=np.int64,
              obj=np.int64, arg=np.uint64, x0=np.uint64, x1=np.uint16, x2=np.uint32, x3=np.uint64, node=np.int64)
_TYPE_NAMES = None


def _col(v):
    import pyarrow as pa
    if isinstance(v, (pa.Array, pa.ChunkedArray)):
        return v
    v = np.asarray(v)
    if v.dtype == object:
        return pa.array(v, type=pa.string(), from_pandas=True).dictionary_encode()
    return pa.array(v)


def _type_names():
    global _TYPE_NAMES
    import pyarrow as pa
    if _TYPE_NAMES is None:
        _TYPE_NAMES = pa.array([E.name_of(t) for t in range(0x700)], type=pa.string())
    return _TYPE_NAMES


def events_arrow(cols):
    """One batch of event columns (numpy) -> Arrow table in the events schema."""
    import pyarrow as pa
    out = {}
    for k in EVENT_COLUMNS:
        if k == "type_name":
            out[k] = pa.DictionaryArray.from_arrays(
                pa.array(np.minimum(cols["type"], 0x6FF).astype(np.int32)), _type_names())
        else:
            out[k] = pa.array(np.asarray(cols[k]).astype(_EV_DT[k], copy=False))
    return pa.table(out)


def arrow_table(corr, name):
    import pyarrow as pa
    if name == "events":
        ev = corr.tables["events"]
        cols = dict(ev)          # loads the events when they are not in memory yet
        ext = getattr(corr, "_events_ext", None)
        n = len(cols["type"])
        if ext is None:
            ext = dict(x0=np.zeros(n, np.uint64), x1=np.zeros(n, np.uint16), x2=np.zeros(n, np.uint32),
                       x3=np.zeros(n, np.uint64))
        cols.update(ext)
        cols["node"] = corr.tables["processes"]["node"][cols["process"]] if n else np.zeros(0, np.int64)
        return events_arrow(cols)
    cols = dict(corr.tables[name])
    return pa.table({k: _col(v) for k, v in cols.items()})


def _dict_columns(table):
    import pyarrow as pa
    return [f.name for f in table.schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]


def _write(table, path, row_group_size=None):
    import pyarrow.parquet as pq
    pq.write_table(table, path, compression="lz4", use_dictionary=_dict_columns(table) or False,
                   row_group_size=row_group_size)


def write_events(corr, path, collect_host=None):
    """Stream the events table into ``path`` (one row group per batch); optionally collect host events.

    ``collect_host``: max_events of the Perfetto export — the host-layer events it will draw are kept
    (``HostCollector``) so that the Perfetto export needs no second pass.  Returns the row count.
    """
    import pyarrow.parquet as pq
    from .perfetto import HostCollector
    hc = HostCollector(collect_host) if collect_host is not None else None
    writer = None
    n = 0
    try:
        for cols in corr.iter_events():
            t = events_arrow(cols)
            if writer is None:
                writer = pq.ParquetWriter(path, t.schema, compression="lz4", use_dictionary=["type_name"])
            writer.write_table(t, row_group_size=max(len(cols["tsc"]), 1))
            n += len(cols["tsc"])
            if hc is not None:
                hc.add(cols)
        if writer is None:
            z = {k: np.zeros(0, v) for k, v in _EV_DT.items()}
            _write(events_arrow(z), path)
    finally:
        if writer is not None:
            writer.close()
    if hc is not None:
        corr._host = (collect_host, hc.result())
    return n


def write_tables(corr, out_dir, names=TABLES, progress=None, collect_host=None):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in names:
        if name not in corr.tables:
            continue
        p = out_dir / f"{name}.parquet"
        if name == "events" and not getattr(corr, "events_loaded", True):
            write_events(corr, p, collect_host=collect_host)
        else:
            t = arrow_table(corr, name)
            _write(t, p, row_group_size=corr.batch_records if name == "events" else None)
        written[name] = str(p)
        if progress:
            progress(name)
    return written
