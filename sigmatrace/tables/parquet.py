"""Parquet tables (pyarrow) of every correlated entity; schema in docs/schema.md.

Columns go to Arrow zero-copy (``pa.array`` on numpy buffers); string columns are dictionary arrays
(small-vocabulary labels are built from integer codes, never from Python strings).  Parquet dictionary
encoding is used only for string columns, statistics only where readers prune on them (time and id
columns), time columns (tsc, ns, *_ns) DELTA_BINARY_PACKED and uncompressed, other high-entropy 64-bit
columns LZ4 like the rest, sequential ids (op_id, completion_id,
flow_id, the op <-> completion links) DELTA_BINARY_PACKED, LZ4 on the rest ($SIGMATRACE_PARQUET_COMPRESSION:
one codec for every column instead).  On the full-mode AllReduce's events that is ~25 ns/row and ~4 B/row,
against ~36 ns / 27.5 B with the 64-bit columns uncompressed and ~53 ns / 74 B with no compression.

* The per-operation tables (ops, completions, flows) are ``RowTable``s: computed and written in row
  ranges (one row group each), so their wide rows never exist whole; each is a directory of part files
  (contiguous row ranges, one per worker at most) written in parallel.
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

from ..decode import iter_event_batches
from .. import schema
from ..errors import SigmatraceError
from ..format import events as E
from .host_events import HostCollector

TABLES = schema.TABLE_NAMES
# the per-record tables: directories of part files (contiguous row ranges, written in parallel)
DIR_TABLES = schema.PART_TABLES
EVENT_COLUMNS = schema.columns("events")
_EV_DT = {c.name: np.dtype(c.type) for c in schema.BY_NAME["events"].columns if c.type != "string"}
# min/max statistics only where readers prune on them (time, process/node, ids)
_STATS = ("process", "node", "ns", "op_id", "completion_id", "flow_id", "qp_id", "doorbell_id", "wqe_id", "src_ns",
          "dst_ns")
# ids that grow with the row number (the table's own id, the op <-> completion links): DELTA_BINARY_PACKED
_SEQUENTIAL = ("op_id", "completion_id", "flow_id", "completion", "peer_completion")
ROW_RANGE = 1 << 18               # rows per range / row group of the per-operation tables
_TYPE_NAMES = None
_VOCABS = {}


def compression():
    """An explicit codec for every column ($SIGMATRACE_PARQUET_COMPRESSION), or None: the per-column default."""
    return os.environ.get("SIGMATRACE_PARQUET_COMPRESSION") or None


def _delta_columns(schema):
    import pyarrow as pa
    return [f.name for f in schema if pa.types.is_integer(f.type) and (f.name in ("tsc", "ns") or f.name in _SEQUENTIAL
                                                                        or f.name.endswith(("_ns", "_tsc")))]


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
    if hasattr(v, "codes") and hasattr(v, "vocab"):     # correlate.rows.Labels
        return pa.DictionaryArray.from_arrays(pa.array(v.codes), _vocab(v.vocab))
    v = np.asarray(v)
    if v.dtype == object:
        return pa.array(v, type=pa.string(), from_pandas=True).dictionary_encode()
    return pa.array(v)


def _type_names():
    global _TYPE_NAMES
    import pyarrow as pa
    if _TYPE_NAMES is None:
        _TYPE_NAMES = pa.array([E.name_of(t) for t in range(E.TYPE_RANGE)], type=pa.string())
    return _TYPE_NAMES


def to_table(cols):
    """{name: array} -> Arrow table whose fields are non-nullable where the column has no nulls (Parquet
    REQUIRED: no definition levels to encode, ~30 % faster writing)."""
    import pyarrow as pa
    arrays = [_col(v) for v in cols.values()]
    fields = [pa.field(k, a.type, nullable=a.null_count > 0) for k, a in zip(cols, arrays)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class SchemaMismatch(SigmatraceError):
    """A table about to be written differs from sigmatrace.schema (a correlator or exporter bug)."""


def _arrow_type(name):
    import pyarrow as pa
    return pa.string() if name == "string" else pa.type_for_alias(name)


def conform(name, table):
    """``table`` in the column order sigmatrace.schema declares for ``name``, its types checked against the
    schema (a string column may be a dictionary array); an empty table is cast to the schema's types.
    Raises ``SchemaMismatch`` on a missing or extra column or another type."""
    import pyarrow as pa
    spec = schema.BY_NAME[name]
    have = set(table.column_names)
    if have != set(spec.names):
        raise SchemaMismatch(f"table {name}: columns {sorted(have ^ set(spec.names))} differ from sigmatrace.schema")
    if tuple(table.column_names) != spec.names:
        table = table.select(list(spec.names))
    bad = []
    for c, f in zip(spec.columns, table.schema):
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        if t != _arrow_type(c.type):
            bad.append((c.name, str(f.type), c.type))
    if bad and table.num_rows == 0:
        fields = [pa.field(c.name, _arrow_type(c.type), nullable=c.nullable) for c in spec.columns]
        return pa.Table.from_arrays([pa.array([], type=f.type) for f in fields], schema=pa.schema(fields))
    if bad:
        raise SchemaMismatch(f"table {name}: column types {bad} differ from sigmatrace.schema")
    for i, c in enumerate(spec.columns):
        if c.nullable:
            table = table.set_column(i, pa.field(c.name, table.schema.field(i).type, nullable=True),
                                     _sentinel_to_null(table.column(i)))
    return table


def _sentinel_to_null(col):
    """A nullable column's unknown values (schema.NULL_SENTINEL in the correlator's numpy columns) as NULL; the
    field is nullable whether or not this range has any, so every part and row group has one schema."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if col.null_count or not len(col):
        return col
    unknown = pc.equal(col, pa.scalar(schema.NULL_SENTINEL, col.type))
    if not pc.any(unknown).as_py():
        return col
    return pc.if_else(unknown, pa.scalar(None, col.type), col)


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
    return conform("events", to_table(out))


def arrow_table(corr, name):
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
        return conform(name, to_table(t.rows(labels=True)))
    return conform(name, to_table(dict(t)))


def _dict_columns(schema):
    import pyarrow as pa
    return [f.name for f in schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]


def _opts(schema):
    """Writer options: time columns and sequential ids DELTA_BINARY_PACKED and uncompressed (tiny and fast),
    LZ4 on the rest (ids, sizes, opcodes, addresses, mostly-zero EXT slots); dictionary only for strings;
    statistics only on time, process/node and id columns.  Only encodings every Parquet reader of the last
    years decodes (BYTE_STREAM_SPLIT would shrink the 64-bit address columns further, but DuckDB < 2.0 and
    many other readers reject it on integers)."""
    stats = [f.name for f in schema if f.name in _STATS or f.name.endswith("_ns")]
    delta = _delta_columns(schema)
    comp = compression()
    if comp is None:
        comp = {f.name: ("none" if f.name in delta else "lz4") for f in schema}
    opts = dict(compression=comp, use_dictionary=_dict_columns(schema) or False, write_statistics=stats or False)
    enc = {c: "DELTA_BINARY_PACKED" for c in delta}
    if enc:
        opts["column_encoding"] = enc
    return opts


def _write(table, path, row_group_size=None):
    import pyarrow.parquet as pq
    pq.write_table(table, path, row_group_size=row_group_size, **_opts(table.schema))


def _write_ranges(name, t, path, step=ROW_RANGE, lo=0, hi=None):
    """Rows [lo, hi) of a RowTable computed and written range by range (one row group per range)."""
    import pyarrow.parquet as pq
    writer = None
    hi = t.n_rows if hi is None else hi
    try:
        for a in range(lo, hi, step):
            tab = conform(name, to_table(t.rows(slice(a, min(a + step, hi)), labels=True)))
            if writer is None:
                writer = pq.ParquetWriter(path, tab.schema, **_opts(tab.schema))
            writer.write_table(tab, row_group_size=max(tab.num_rows, 1))
        if writer is None:
            tab = conform(name, to_table(t.rows(slice(0, 0), labels=True)))
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


def _fresh_dir(path):
    """An empty directory for a table's part files (a single-file table of older versions removed)."""
    path = Path(path)
    if path.is_file():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)
    path.with_name(path.name + ".parquet").unlink(missing_ok=True)
    path.mkdir(parents=True)
    return path


def _range_parts(n_rows, workers):
    """Contiguous row ranges (multiples of ROW_RANGE) for ~workers part files; one part when small."""
    ranges = -(-n_rows // ROW_RANGE)
    if not ranges:
        return [(0, 0)]
    k = max(1, min(int(workers), ranges))
    cut = [min(i * ranges // k * ROW_RANGE, n_rows) for i in range(k + 1)]
    return list(zip(cut[:-1], cut[1:]))


def _event_tasks(corr, path, collect_host, workers):
    path = _fresh_dir(path)
    br = corr.batch_records
    parts = _plan_parts(corr.procs, workers, br) or [[]]
    return [(str(path / f"part-{k:05d}.parquet"), items, corr._to_ns, corr.proc_node, br, collect_host)
            for k, items in enumerate(parts)]


def _event_results(corr, results, collect_host):
    n = sum(r[0] for r in results)
    if collect_host is not None:
        hc = HostCollector(collect_host)
        total = 0
        for _, done, tot in results:
            total += tot
            for d in done:
                d = dict(d)
                d["tsc"] = d["ns"]
                hc.add(d)
        cols, _ = hc.result()
        # a run of idle polls cut where a process's events were split into parts came as two rows
        corr._host = (collect_host, (cols, total - hc.joined))
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
    """Every table under ``out_dir``: the per-record tables (DIR_TABLES) as directories of part files, the
    others as ``NAME.parquet``.  With several workers, forked processes write the events parts and the row-range
    parts of the per-operation tables (largest first, reading this process's memory copy-on-write) while this
    process writes the small tables."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, int(workers or getattr(corr, "workers", 1) or 1))
    written = {}
    ex = None
    parallel = workers > 1 and _fork_ok()
    ev_tasks = []
    jobs = []         # (table, kind, task, size)
    try:
        for name in names:
            if name not in corr.tables or name not in DIR_TABLES:
                continue
            p = out_dir / name
            written[name] = str(p)
            if name == "events":
                ev_tasks = _event_tasks(corr, p, collect_host, workers)
                jobs += [(name, "events", t, sum(int(c["count"].sum()) for _, _, c in t[1])) for t in ev_tasks]
            else:
                t = corr.tables[name]
                _fresh_dir(p)
                width = len(t.columns) / 14    # cost per row relative to an events row
                jobs += [(name, "rows", (name, str(p / f"part-{k:05d}.parquet"), lo, hi), int((hi - lo) * width))
                         for k, (lo, hi) in enumerate(_range_parts(t.n_rows, workers))]
        global _FORKED
        _FORKED = corr       # what _write_rows reads (in forked workers: the parent's memory, copy-on-write)
        jobs.sort(key=lambda j: -j[3])      # largest first
        if parallel and len(jobs) > 1:
            import multiprocessing as mp
            ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"))
            futs = [(job, ex.submit(_run_job, job[1], job[2])) for job in jobs]
        else:
            futs = [(job, _Done(_run_job(job[1], job[2]))) for job in jobs]
        for name in names:
            if name not in corr.tables or name in DIR_TABLES:
                continue
            p = out_dir / f"{name}.parquet"
            t = corr.tables[name]
            if hasattr(t, "iter_ranges"):
                _write_ranges(name, t, p)
            else:
                _write(arrow_table(corr, name), p)
            written[name] = str(p)
            if progress:
                progress(name)
        ev_res = {id(t): None for t in ev_tasks}
        for job, fut in futs:
            r = fut.result()
            if job[1] == "events":
                ev_res[id(job[2])] = r
        if ev_tasks:
            _event_results(corr, [ev_res[id(t)] for t in ev_tasks], collect_host)   # part order
        if progress:
            for name in names:
                if name in DIR_TABLES and name in written:
                    progress(name)
    finally:
        if ex is not None:
            ex.shutdown(cancel_futures=True)    # after an error: parts not started yet are not written
        _FORKED = None
    return {k: written[k] for k in names if k in written}


JOIN_BATCH_ROWS = 1 << 20


def join_parts(parts, dest, batch_rows=None):
    """One table file ``dest`` from part files of the same table in row order, ``batch_rows`` rows at a time
    (so no more than one batch is in memory, whatever a part's size): the cluster report's single-file
    tables.  Empty parts are skipped (their string columns are not dictionary-typed); all empty: the first is
    the table.  Returns the most rows held at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    batch_rows = batch_rows or JOIN_BATCH_ROWS
    full = [p for p in parts if pq.ParquetFile(p).metadata.num_rows]
    if not full:
        shutil.copyfile(parts[0], dest)
        return 0
    writer, most = None, 0
    try:
        for p in full:
            f = pq.ParquetFile(p)
            for b in f.iter_batches(batch_size=batch_rows):
                t = pa.Table.from_batches([b])
                most = max(most, t.num_rows)
                if writer is None:
                    writer = pq.ParquetWriter(dest, t.schema, **_opts(t.schema))
                writer.write_table(t, row_group_size=max(t.num_rows, 1))
    finally:
        if writer is not None:
            writer.close()
    return most


def _run_job(kind, task):
    """One part file: an events part (returns its row count and host events) or rows [lo, hi) of a
    per-operation table."""
    return _write_part(task) if kind == "events" else _write_rows(*task)


class _Done:
    """A result computed in this process, with a future's ``result()``."""
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


_FORKED = None


def _fork_ok():
    import multiprocessing as mp
    return "fork" in mp.get_all_start_methods()


def _write_rows(name, path, lo, hi):
    """Rows [lo, hi) of one per-operation table of the Correlated being written (``_FORKED``; in a forked
    worker: the parent's) as one part file."""
    _write_ranges(name, _FORKED.tables[name], path, lo=lo, hi=hi)
    return path
