"""Merged event store: every process's primary records as flat numpy columns."""
from __future__ import annotations

import numpy as np

from ..format import events as E

_SLOT_SRC = {"aux": "aux", "obj": "obj", "arg": "arg", "x0": "x0", "x1": "x1", "x2": "x2", "x3": "x3"}


class EventStore:
    def __init__(self, procs):
        """procs: list of ProcDecode in global process order."""
        n = [p.n_events for p in procs]
        self.offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        total = int(self.offsets[-1])

        def cat(attr, dtype):
            parts = [getattr(p, attr) for p in procs if p.n_events]
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        self.process = np.repeat(np.arange(len(procs), dtype=np.uint32), np.asarray(n, np.int64))
        self.thread = cat("thread", np.uint32)
        self.tsc = cat("tsc", np.uint64)
        self.type = cat("type", np.uint16)
        self.aux = cat("aux", np.uint16)
        self.obj = cat("obj", np.uint32)
        self.arg = cat("arg", np.uint64)
        ep = [p.ext_pos + self.offsets[i] for i, p in enumerate(procs)]
        self.ext_pos = np.concatenate(ep) if ep else np.zeros(0, np.int64)
        self.x0 = np.concatenate([p.ext_x0 for p in procs]) if procs else np.zeros(0, np.uint64)
        self.x1 = np.concatenate([p.ext_x1 for p in procs]) if procs else np.zeros(0, np.uint16)
        self.x2 = np.concatenate([p.ext_x2 for p in procs]) if procs else np.zeros(0, np.uint32)
        self.x3 = np.concatenate([p.ext_x3 for p in procs]) if procs else np.zeros(0, np.uint64)
        self.n = total
        self._by_type = None

    def __len__(self):
        return self.n

    def indices(self, name) -> np.ndarray:
        if self._by_type is None:
            order = np.argsort(self.type, kind="stable")
            types, starts = np.unique(self.type[order], return_index=True)
            ends = np.append(starts[1:], len(order))
            self._by_type = {int(t): order[s:e] for t, s, e in zip(types, starts, ends)}
        return self._by_type.get(E.value(name), np.zeros(0, np.int64))

    def ext_full(self):
        """Dense x0..x3 columns (zero where a record has no EXT)."""
        out = {}
        for f, dt in (("x0", np.uint64), ("x1", np.uint16), ("x2", np.uint32), ("x3", np.uint64)):
            a = np.zeros(self.n, dt)
            a[self.ext_pos] = getattr(self, f)
            out[f] = a
        return out

    def table(self, name) -> dict:
        """Named columns of one event type (EXT fields joined), like Capture.table."""
        et = E.BY_NAME[name]
        idx = self.indices(name)
        cols = {"idx": idx, "tsc": self.tsc[idx], "process": self.process[idx], "thread": self.thread[idx]}
        if et.has_ext and len(idx):
            pos = np.searchsorted(self.ext_pos, idx)
            pos_c = np.minimum(pos, max(len(self.ext_pos) - 1, 0))
            has = (len(self.ext_pos) > 0) & (self.ext_pos[pos_c] == idx) if len(self.ext_pos) else np.zeros(len(idx), bool)
        for col, slot, lo, width in et.columns():
            src = getattr(self, _SLOT_SRC[slot])
            if slot.startswith("x"):
                if len(idx) and len(self.ext_pos):
                    vals = np.where(has, src[pos_c], 0).astype(src.dtype)
                else:
                    vals = np.zeros(len(idx), src.dtype)
            else:
                vals = src[idx]
            if width is not None:
                vals = (vals >> np.asarray(lo, vals.dtype)) & np.asarray((1 << width) - 1, vals.dtype)
            cols[col] = vals
        return cols
