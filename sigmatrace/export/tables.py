"""Parquet tables (pyarrow) of every correlated entity; schema in docs/schema.md."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..format import events as E

TABLES = ("processes", "threads", "nodes", "nics", "gpus", "qps", "events", "doorbells", "wqes", "ops", "flows",
          "completions", "barriers", "barrier_arrivals", "clock", "losses", "aggregates")


def _col(v):
    import pyarrow as pa
    v = np.asarray(v)
    if isinstance(v, pa.Array):
        return v
    if v.dtype == object:
        return pa.array(v, type=pa.string(), from_pandas=True).dictionary_encode()
    return pa.array(v)


def arrow_table(corr, name):
    import pyarrow as pa
    cols = dict(corr.tables[name])
    if name == "events":
        names = pa.array([E.name_of(t) for t in range(0x700)], type=pa.string())
        cols["type_name"] = pa.DictionaryArray.from_arrays(
            pa.array(np.minimum(cols["type"], 0x6FF).astype(np.int32)), names)
        st = getattr(corr, "_store", None)
        if st is not None and len(st.ext_pos):
            cols.update(st.ext_full())
        else:
            n = len(cols["type"])
            cols.update(x0=np.zeros(n, np.uint64), x1=np.zeros(n, np.uint16), x2=np.zeros(n, np.uint32),
                        x3=np.zeros(n, np.uint64))
        cols["node"] = corr.tables["processes"]["node"][cols["process"]] if len(cols["process"]) else cols["process"]
    return pa.table({k: _col(v) for k, v in cols.items()})


def write_tables(corr, out_dir, names=TABLES, progress=None):
    import pyarrow.parquet as pq
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in names:
        if name not in corr.tables:
            continue
        t = arrow_table(corr, name)
        p = out_dir / f"{name}.parquet"
        pq.write_table(t, p, compression="lz4")
        written[name] = str(p)
        if progress:
            progress(name)
    return written
