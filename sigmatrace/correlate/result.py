"""What the correlator returns: ``Correlated`` (every table as columns, clocks, warnings, losses) and the
lazily loaded events table."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..decode import DEFAULT_BATCH_RECORDS, iter_event_batches


@dataclass
class Correlated:
    tables: dict = field(default_factory=dict)      # name -> dict of numpy columns
    clock: dict = field(default_factory=dict)       # node -> NodeClock
    clock_info: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    files: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    node_labels: list = field(default_factory=list)
    batch_records: int = DEFAULT_BATCH_RECORDS
    workers: int = 1                                # worker processes (decode, events-table parts)
    procs: list = field(default_factory=list)       # ProcDecode (metadata + chunk index) per process
    proc_node: np.ndarray = None
    _to_ns: object = None
    _events_ext: dict = None
    _host: object = None                            # (max_events, columns) collected while streaming
    summed: dict = None                             # the cluster report's sums over its ops parts (analysis.summable)
    latency: dict = None                            # and its analysis.latency_reduction, from the parts

    def __getitem__(self, name):
        return self.tables[name]

    @property
    def events_loaded(self) -> bool:
        ev = self.tables.get("events")
        return not isinstance(ev, LazyTable) or ev.loaded

    def iter_events(self, batch_records=None):
        """Final event columns batch by batch (process order, file order inside a process); bounded memory.

        Yields dicts: process, thread, tsc, ns, type, aux, obj, arg, x0..x3, node (numpy arrays)."""
        br = batch_records or self.batch_records
        for i, cols in iter_event_batches(self.procs, br):
            n = len(cols["tsc"])
            cols["process"] = np.full(n, i, np.int64)
            cols["ns"] = self._to_ns(np.int64(i), cols["tsc"])
            cols["node"] = np.full(n, int(self.proc_node[i]), np.int64)
            yield cols

    def _load_events(self):
        parts = list(self.iter_events())
        keys = ("process", "thread", "tsc", "ns", "type", "aux", "obj", "arg", "x0", "x1", "x2", "x3")
        dt = dict(process=np.int64, thread=np.int64, tsc=np.uint64, ns=np.int64, type=np.int64, aux=np.int64,
                  obj=np.int64, arg=np.uint64, x0=np.uint64, x1=np.uint16, x2=np.uint32, x3=np.uint64)
        cols = {k: (np.concatenate([p[k] for p in parts]).astype(dt[k], copy=False) if parts else np.zeros(0, dt[k]))
                for k in keys}
        self._events_ext = {k: cols.pop(k) for k in ("x0", "x1", "x2", "x3")}
        return cols

    def arrow(self, name):
        import pyarrow as pa
        return pa.table({k: _to_arrow_col(v) for k, v in self.tables[name].items()})


class LazyTable(Mapping):
    """A table's columns computed on first access (the events table: streamed from the capture)."""

    def __init__(self, loader, n_rows):
        self._loader = loader
        self._cols = None
        self.n_rows = int(n_rows)

    @property
    def loaded(self):
        return self._cols is not None

    def _get(self):
        if self._cols is None:
            self._cols = self._loader()
        return self._cols

    def __getitem__(self, k):
        return self._get()[k]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())

    def __setitem__(self, k, v):
        self._get()[k] = v


def _to_arrow_col(v):
    import pyarrow as pa
    v = np.asarray(v)
    if v.dtype == object:
        return pa.array(list(v), type=pa.string()).dictionary_encode()
    return pa.array(v)
