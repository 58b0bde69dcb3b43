"""Compact event store: the records the correlator joins on, per type, as flat narrow numpy columns.

Workers keep only ``decode.CORRELATOR_TYPES`` (with their EXT slots), already split per type into the
columns the correlator reads (``decode.TYPE_COLUMNS``); the full event stream is never held in memory —
the events table is written by streaming the capture again (``decode.iter_event_batches``).
"""
from __future__ import annotations

import numpy as np

from ..format import events as E
from .types import TYPE_COLUMNS


class EventStore:
    def __init__(self, procs, consume=True, first=0):
        """procs: list of ProcDecode in global process order.  ``consume``: each type's per-process columns
        are released once ``table`` has concatenated them (the correlator asks for each type once).
        ``first``: the global index of ``procs[0]`` (the cluster report holds a few processes per part)."""
        n = [p.n_events for p in procs]
        self.offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self._procs = procs
        self._consume = consume
        self._ready = {}
        self.first = int(first)

    def __len__(self):
        return self.n

    def prefetch(self, names, threads):
        """Merge these types' per-process columns in ``threads`` threads at once (numpy's copies release the
        GIL); ``table`` then hands the merged columns out.  For the large types, when several cores are there."""
        names = [n for n in names if n not in self._ready]
        if threads <= 1 or len(names) <= 1:
            return
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=min(threads, len(names))) as ex:
            for n, cols in zip(names, ex.map(self._merge, names)):
                self._ready[n] = cols

    def table(self, name) -> dict:
        """Named columns of one event type (EXT fields joined): tsc, process, thread and the type's columns."""
        got = self._ready.pop(name, None)
        return got if got is not None else self._merge(name)

    def _merge(self, name) -> dict:
        tv = E.value(name)
        cols_spec = TYPE_COLUMNS[tv][1]
        parts, procs = [], []
        for i, p in enumerate(self._procs):
            tabs = p.tables or {}
            t = tabs.pop(name, None) if self._consume else tabs.get(name)
            if t is not None and len(t["tsc"]):
                parts.append(t)
                procs.append(np.full(len(t["tsc"]), self.first + i, np.uint32))
        keys = ["tsc", "thread"] + [c[0] for c in cols_spec]
        dts = dict(tsc=np.uint64, thread=np.uint32, **{c[0]: c[4] for c in cols_spec})
        cols = {}
        for k in keys:
            if len(parts) == 1:
                cols[k] = parts[0][k]
            else:
                cols[k] = np.concatenate([q[k] for q in parts]) if parts else np.zeros(0, dts[k])
            if self._consume:
                for q in parts:
                    q.pop(k, None)
        cols["process"] = (procs[0] if len(procs) == 1 else np.concatenate(procs)) if procs else np.zeros(0, np.uint32)
        return cols
