"""Compact event store: the records the correlator joins on, per type, as flat numpy columns.

Workers keep only ``decode.CORRELATOR_TYPES`` (with their EXT slots); the
full event stream is never held in memory — the events table is written by
streaming the capture again (``decode.iter_event_batches``).
"""
from __future__ import annotations

import numpy as np

from ..format import events as E
from .decode import empty_typed

_SLOTS = ("aux", "obj", "arg", "x0", "x1", "x2", "x3")


class EventStore:
    def __init__(self, procs):
        """procs: list of ProcDecode in global process order (their ``typed`` records are not copied)."""
        n = [p.n_events for p in procs]
        self.offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self._parts = [(i, p.typed) for i, p in enumerate(procs) if p.typed is not None and len(p.typed)]
        self._by_type = None

    def __len__(self):
        return self.n

    def _index(self):
        if self._by_type is None:
            self._by_type = []
            for i, rec in self._parts:
                t = (rec[:, 1] & np.uint64(0xFFFF)).astype(np.uint16)
                order = np.argsort(t, kind="stable")
                types, starts = np.unique(t[order], return_index=True)
                ends = np.append(starts[1:], len(order))
                self._by_type.append({int(ty): order[s:e] for ty, s, e in zip(types, starts, ends)})
        return self._by_type

    def table(self, name) -> dict:
        """Named columns of one event type (EXT fields joined), like Capture.table."""
        et = E.BY_NAME[name]
        tv = E.value(name)
        recs, procs = [], []
        for (i, rec), by in zip(self._parts, self._index()):
            rows = by.get(tv)
            if rows is not None and len(rows):
                recs.append(rec.take(rows, axis=0))
                procs.append(np.full(len(rows), i, np.uint32))
        r = np.concatenate(recs) if len(recs) > 1 else (recs[0] if recs else empty_typed())
        process = np.concatenate(procs) if procs else np.zeros(0, np.uint32)
        u = np.uint64
        w1, x1 = r[:, 1], r[:, 4]
        slot = dict(aux=((w1 >> u(16)) & u(0xFFFF)).astype(np.uint16), obj=(w1 >> u(32)).astype(np.uint32),
                    arg=r[:, 2].copy(), x0=r[:, 3].copy(), x1=((x1 >> u(16)) & u(0xFFFF)).astype(np.uint16),
                    x2=(x1 >> u(32)).astype(np.uint32), x3=r[:, 5].copy())
        idx = self.offsets[process.astype(np.int64)] + r[:, 7].astype(np.int64) if len(r) else np.zeros(0, np.int64)
        cols = {"idx": idx, "tsc": r[:, 0].copy(), "process": process, "thread": r[:, 6].astype(np.uint32)}
        for col, sl, lo, width in et.columns():
            vals = slot[sl]
            if width is not None:
                vals = (vals >> np.asarray(lo, vals.dtype)) & np.asarray((1 << width) - 1, vals.dtype)
            cols[col] = vals
        return cols
