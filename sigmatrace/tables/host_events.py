"""The host-layer events (verbs, DevX, CUDA, UCX, libfabric, NCCL calls) that the Perfetto window may draw, kept
while the events table is streamed (``parquet.write_events``), so the Perfetto export needs no second pass
over the capture."""
from __future__ import annotations

import numpy as np

HOST_LAYERS = (0x01, 0x02, 0x03, 0x05, 0x06, 0x07)
_HOST_KEYS = ("process", "thread", "ns", "type", "aux", "obj", "arg")
_HOST_LUT = np.zeros(1 << 16, bool)
for _t in range(1 << 16):
    _HOST_LUT[_t] = (_t >> 8) in HOST_LAYERS


class HostCollector:
    """Host-layer events the Perfetto export may draw, collected from a stream of batches.

    The export draws one time window for every kind of event: the ``max_events`` earliest ones across host
    calls, doorbells and operations (``write_perfetto``).  So at most the ``max_events`` earliest host events
    (by ns, all processes together) can be drawn, and only those are kept: the buffer is cut back to them
    (``np.argpartition``) whenever it holds twice as many, which bounds memory whatever the capture's size.
    """

    def __init__(self, max_events):
        self.budget = max(0, int(max_events))
        self.total = 0
        self.buf = []
        self.nbuf = 0

    def add(self, cols):
        if not len(cols["tsc"]):
            return
        m = _HOST_LUT[np.asarray(cols["type"]).astype(np.int64) & 0xFFFF]
        k = int(np.count_nonzero(m))
        self.total += k
        if not k or not self.budget:
            return
        self.buf.append({c: np.asarray(cols[c])[m].astype(np.int64 if c != "arg" else np.uint64) for c in _HOST_KEYS})
        self.nbuf += k
        if self.nbuf > 2 * self.budget + (1 << 16):
            self._compact()

    def _compact(self):
        if not self.buf:
            return
        b = {c: np.concatenate([x[c] for x in self.buf]) for c in _HOST_KEYS} if len(self.buf) > 1 else self.buf[0]
        if len(b["ns"]) > self.budget:
            # the budget earliest, ties at the last one included (the window's cut keeps ties of every kind),
            # in stream order
            keep = np.flatnonzero(b["ns"] <= np.partition(b["ns"], self.budget - 1)[self.budget - 1])
            b = {c: v[keep] for c, v in b.items()}
        self.buf, self.nbuf = [b], len(b["ns"])

    def _close(self):
        self._compact()

    @property
    def done(self):
        """The kept events (one batch of columns, or none): what a worker hands back for merging."""
        self._compact()
        return list(self.buf)

    def result(self):
        self._compact()
        if self.buf:
            return dict(self.buf[0]), self.total
        return {c: np.zeros(0, np.int64) for c in _HOST_KEYS}, self.total


def host_events(corr, max_events):
    """(columns, total count) of the host-layer events the export may draw."""
    T = corr.tables
    if getattr(corr, "events_loaded", True):
        ev = T["events"]
        m = _HOST_LUT[np.asarray(ev["type"]).astype(np.int64) & 0xFFFF]
        return {c: np.asarray(ev[c])[m] for c in _HOST_KEYS}, int(m.sum())
    got = getattr(corr, "_host", None)
    if got is not None and got[0] == max_events:
        return got[1]
    hc = HostCollector(max_events)
    for cols in corr.iter_events():
        hc.add(cols)
    return hc.result()
