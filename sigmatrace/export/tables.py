"""Parquet tables (pyarrow) of every correlated entity; schema in docs/schema.md.

Columns go to Arrow zero-copy (``pa.array`` on numpy buffers); string columns are dictionary arrays
(small-vocabulary labels are built from integer codes, never from Python strings).  Parquet dictionary
encoding is used only for string columns, statistics only where readers prune on them (time and id
columns), time columns (tsc, ns, *_ns) DELTA_BINARY_PACKED and uncompressed, other high-entropy 64-bit
columns (arg, raddr, wr_id, x0, x3) uncompressed, LZ4 on the rest ($SIGMATRACE_PARQUET_COMPRESSION: one
codec for every column instead).  On the events table that is ~33 ns/row and ~13.5 B/row, against ~48 ns
with LZ4 everywhere (same size) and ~53 ns / 74 B with no compression.

* The per-operation tables (ops, completions, flows) are ``RowTable``s: computed and written in row
  ranges (one row group each), so their wide rows never exist whole.
* The events table is a directory ``events/`` of part files ``part-NNNNN.parquet`` (global row order =
  part order, then row order), written by worker processes in parallel, each streaming its share of the
  capture's EVENTS chunks with the final time base (``write_events``).
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from ..format import events as E

TABLES = ("processes", "threads", "nodes", "nics", "gpus", "qps", "events", "doorbells", "wqes", "ops", "flows",
          "completions", "barriers", "barrier_arrivals", "clock", "losses", "aggregates")
DIR_TABLES = ("events",)          # written as a directory of part files
EVENT_COLUMNS = ("process", "thread", "tsc", "ns", "type", "aux", "obj", "arg", "type_name", "x0", "x1", "x2", "x3",
                 "node")
_EV_DT = dict(process=np.int32, thread=np.int32, tsc=np.uint64, ns=np.int64, type=np.uint16, aux=np.uint16,
              obj=np.uint32, arg=np.uint64, x0=np.uint64, x1=np.uint16, x2=np.uint32, x3=np.uint64, node=np.int32)
_STATS = ("process", "node", "tsc", "ns", "type", "op_id", "completion_id", "flow_id", "qp_id", "doorbell_id",
          "wqe_id", "src_ns", "dst_ns", "src_node", "dst_node")
ROW_RANGE = 1 << 18               # rows per range / row group of the per-operation tables
_TYPE_NAMES = None
_VOCABS = {}


_RAW = ("arg", "raddr", "laddr", "wr_id", "x0", "x3")   # high-entropy 64-bit columns: LZ4 gains little there


def compression():
    """An explicit codec for every column ($SIGMATRACE_PARQUET_COMPRESSION), or None: the per-column default."""
    return os.environ.get("SIGMATRACE_PARQUET_COMPRESSION") or None


def _delta_columns(schema):
    import pyarrow as pa
    return [f.name for f in schema if pa.types.is_integer(f.type) and (f.name in ("tsc", "ns") or
                                                                        f.name.endswith(("_ns", "_tsc")))]


def _vocab(v):
    import pyarrow as pa
    k = id(v)
    got = _VOCABS.get(k)
    if got is None or got[0] is not v:
        got = _VOCABS[k] = (v, pa.array(list(v), type=pa.string()))
    return got[1]


def _col(v):
    import pyarrow as pa
    if isinstance(v, (pa.Array, pa.ChunkedArray)):
        return v
    if hasattr(v, "codes") and hasattr(v, "vocab"):     # correlate.core.Labels
        return pa.DictionaryArray.from_arrays(pa.array(v.codes), _vocab(v.vocab))
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


def to_table(cols):
    """{name: array} -> Arrow table whose fields are non-nullable where the column has no nulls (Parquet
    REQUIRED: no definition levels to encode, ~30 % faster writing)."""
    import pyarrow as pa
    arrays = [_col(v) for v in cols.values()]
    fields = [pa.field(k, a.type, nullable=a.null_count > 0) for k, a in zip(cols, arrays)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def events_arrow(cols):
    """One batch of event columns (numpy) -> Arrow table in the events schema."""
    import pyarrow as pa
    out = {}
    for k in EVENT_COLUMNS:
        if k == "type_name":
            out[k] = pa.DictionaryArray.from_arrays(
                pa.array(np.minimum(cols["type"], 0x6FF).astype(np.int32)), _type_names())
        else:
            out[k] = pa.array(np.ascontiguousarray(cols[k], dtype=_EV_DT[k]))
    return to_table(out)


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
    t = corr.tables[name]
    if hasattr(t, "rows"):
        return to_table(t.rows(labels=True))
    return to_table(dict(t))


def _dict_columns(schema):
    import pyarrow as pa
    return [f.name for f in schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]


def _opts(schema):
    """Writer options: time columns DELTA_BINARY_PACKED (tiny and fast for clocks), uncompressed like the
    other high-entropy 64-bit columns; LZ4 on the rest (ids, sizes, opcodes, mostly-zero EXT slots);
    dictionary only for strings; statistics only on time and id columns."""
    stats = [f.name for f in schema if f.name in _STATS or f.name.endswith("_ns")]
    delta = _delta_columns(schema)
    comp = compression()
    if comp is None:
        comp = {f.name: ("none" if f.name in delta or f.name in _RAW else "lz4") for f in schema}
    opts = dict(compression=comp, use_dictionary=_dict_columns(schema) or False, write_statistics=stats or False)
    if delta:
        opts["column_encoding"] = {c: "DELTA_BINARY_PACKED" for c in delta}
    return opts


def _write(table, path, row_group_size=None):
    import pyarrow.parquet as pq
    pq.write_table(table, path, row_group_size=row_group_size, **_opts(table.schema))


def _write_ranges(t, path, step=ROW_RANGE):
    """A RowTable computed and written range by range (one row group per range)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    writer = None
    try:
        for cols in t.iter_ranges(step):
            tab = to_table(cols)
            if writer is None:
                writer = pq.ParquetWriter(path, tab.schema, **_opts(tab.schema))
            writer.write_table(tab, row_group_size=max(tab.num_rows, 1))
        if writer is None:
            tab = to_table(t.rows(slice(0, 0), labels=True))
            _write(tab, path)
    finally:
        if writer is not None:
            writer.close()


# ---------------------------------------------------------------------------------------------
class _Src:
    """What a part writer needs of one process: its file and (a slice of) its chunk index."""
    __slots__ = ("path", "chunks")

    def __init__(self, path, chunks):
        self.path, self.chunks = path, chunks


def _plan_parts(procs, n_parts, batch_records):
    """Split the chunk index into ~n_parts contiguous pieces (global order), cutting processes if needed."""
    total = sum(int(p.chunks["count"].sum()) for p in procs if p.chunks is not None and len(p.chunks))
    target = max(int(batch_records), -(-total // max(1, n_parts)))
    parts, cur, size = [], [], 0
    for i, p in enumerate(procs):
        ch = p.chunks
        if ch is None or not len(ch):
            continue
        j = 0
        cum = np.cumsum(ch["count"])
        while j < len(ch):
            room = target - size
            base = int(cum[j - 1]) if j else 0
            k = int(np.searchsorted(cum, base + room, side="right"))
            k = min(max(k, j + 1), len(ch))
            cur.append((i, p.path, ch[j:k]))
            size += int(cum[k - 1]) - base
            j = k
            if size >= target:
                parts.append(cur)
                cur, size = [], 0
    if cur:
        parts.append(cur)
    return parts


def _write_part(task):
    """Worker: stream one part's chunks into a Parquet file; returns (rows, host-event buffers, host total)."""
    import pyarrow.parquet as pq
    from ..correlate.decode import iter_event_batches
    from .perfetto import HostCollector
    path, items, to_ns, proc_node, batch_records, collect_host = task
    hc = HostCollector(collect_host) if collect_host is not None else None
    writer = None
    n = 0
    try:
        srcs = [_Src(p, ch) for _, p, ch in items]
        for k, cols in iter_event_batches(srcs, batch_records):
            i = items[k][0]
            m = len(cols["tsc"])
            cols["process"] = np.full(m, i, np.int32)
            cols["ns"] = to_ns(np.int64(i), cols["tsc"])    # one process per batch: scalar clock parameters
            cols["node"] = np.full(m, int(proc_node[i]), np.int32)
            t = events_arrow(cols)
            if writer is None:
                writer = pq.ParquetWriter(path, t.schema, **_opts(t.schema))
            writer.write_table(t, row_group_size=max(m, 1))
            n += m
            if hc is not None:
                hc.add(cols)
        if writer is None:
            _write(events_arrow({k: np.zeros(0, v) for k, v in _EV_DT.items()}), path)
    finally:
        if writer is not None:
            writer.close()
    if hc is None:
        return n, None, 0
    hc._close()
    return n, hc.done, hc.total


def _event_tasks(corr, path, collect_host, workers):
    path = Path(path)
    if path.is_file():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    br = corr.batch_records
    parts = _plan_parts(corr.procs, workers, br) or [[]]
    return [(str(path / f"part-{k:05d}.parquet"), items, corr._to_ns, corr.proc_node, br, collect_host)
            for k, items in enumerate(parts)]


def _event_results(corr, results, collect_host):
    n = sum(r[0] for r in results)
    if collect_host is not None:
        from .perfetto import HostCollector
        hc = HostCollector(collect_host)
        total = 0
        for _, done, tot in results:
            total += tot
            for d in done:
                d = dict(d)
                d["tsc"] = d["ns"]
                hc.add(d)
        cols, _ = hc.result()
        corr._host = (collect_host, (cols, total))
    return n


def write_events(corr, path, collect_host=None, workers=None):
    """Write the events table as ``path/part-NNNNN.parquet`` (one row group per batch), in parallel.

    ``collect_host``: max_events of the Perfetto export — the host-layer events it will draw are kept
    (``HostCollector``) so that the Perfetto export needs no second pass.  Returns the row count."""
    workers = max(1, int(workers or getattr(corr, "workers", 1) or 1))
    tasks = _event_tasks(corr, path, collect_host, workers)
    if workers > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as ex:
            results = list(ex.map(_write_part, tasks))
    else:
        results = [_write_part(t) for t in tasks]
    return _event_results(corr, results, collect_host)


def write_tables(corr, out_dir, names=TABLES, progress=None, collect_host=None, workers=None):
    """Every table under ``out_dir``.  With several workers the events parts are written by a process pool
    while this process writes the other tables (the per-operation ones in row ranges)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, int(workers or getattr(corr, "workers", 1) or 1))
    written = {}
    ex = None
    big = [n for n in names if n in corr.tables and n != "events" and hasattr(corr.tables[n], "iter_ranges")
           and corr.tables[n].n_rows >= ROW_RANGE]
    parallel = workers > 1 and _fork_ok()
    ev_tasks = []
    try:
        if "events" in names and "events" in corr.tables:
            p = out_dir / "events"
            (out_dir / "events.parquet").unlink(missing_ok=True)     # a single-file table of older versions
            ev_tasks = _event_tasks(corr, p, collect_host, workers)
            written["events"] = str(p)
        pending = {}
        if parallel and (len(ev_tasks) > 1 or big):
            # forked workers write the event parts and the large per-operation tables (which they read from
            # this process's memory, copy-on-write), largest first; this process writes the small tables
            global _FORKED
            _FORKED = corr
            import multiprocessing as mp
            ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"))
            jobs = [("events", t, sum(int(c["count"].sum()) for _, _, c in t[1])) for t in ev_tasks]
            jobs += [(n, str(out_dir / f"{n}.parquet"), corr.tables[n].n_rows * len(corr.tables[n].columns) // 14)
                     for n in big]
            for kind, task, _ in sorted(jobs, key=lambda j: -j[2]):
                if kind == "events":
                    pending.setdefault("events", []).append(ex.submit(_write_part, task))
                else:
                    pending[kind] = ex.submit(_write_forked, kind, task)
            _FORKED = None
        elif ev_tasks:
            _event_results(corr, [_write_part(t) for t in ev_tasks], collect_host)
            if progress:
                progress("events")
        for name in names:
            if name not in corr.tables or name == "events" or name in pending:
                continue
            p = out_dir / f"{name}.parquet"
            t = corr.tables[name]
            if hasattr(t, "iter_ranges"):
                _write_ranges(t, p)
            else:
                _write(arrow_table(corr, name), p)
            written[name] = str(p)
            if progress:
                progress(name)
        for name, fut in pending.items():
            if name == "events":
                # parts in submission order = part order
                res = [f.result() for f in fut]
                order = sorted(range(len(ev_tasks)), key=lambda k: -sum(int(c["count"].sum()) for _, _, c in ev_tasks[k][1]))
                by_part = [None] * len(ev_tasks)
                for k, r in zip(order, res):
                    by_part[k] = r
                _event_results(corr, by_part, collect_host)
            else:
                fut.result()
                written[name] = str(out_dir / f"{name}.parquet")
            if progress:
                progress(name)
    finally:
        if ex is not None:
            ex.shutdown()
    return {k: written[k] for k in names if k in written}


_FORKED = None


def _fork_ok():
    import multiprocessing as mp
    return "fork" in mp.get_all_start_methods()


def _write_forked(name, path):
    """Worker (forked after the correlation): write one per-operation table of the parent's Correlated."""
    corr = _FORKED
    _write_ranges(corr.tables[name], path)
    return path
