"""The host-layer events (verbs, DevX, CUDA, UCX, libfabric, NCCL calls) that the Perfetto window may draw, kept
while the events table is streamed (``parquet.write_events``), so the Perfetto export needs no second pass
over the capture."""
from __future__ import annotations

import numpy as np

from ..format.events import IDLE_POLLS, IDLE_POLLS_SHIFT

HOST_LAYERS = (0x01, 0x02, 0x03, 0x05, 0x06, 0x07)
# calls: how many calls the row stands for; end_ns: when the last of them started (a run of idle polls, below)
_HOST_KEYS = ("process", "thread", "ns", "type", "aux", "obj", "arg", "calls", "end_ns")
_HOST_LUT = np.zeros(1 << 16, bool)
for _t in range(1 << 16):
    _HOST_LUT[_t] = (_t >> 8) in HOST_LAYERS
_IDLE_LUT = np.zeros(1 << 16, bool)
_IDLE_LUT[list(IDLE_POLLS)] = True


def _rows(cols, m):
    """The host rows ``m`` of a batch as _HOST_KEYS columns (a batch of the capture has no calls/end_ns)."""
    b = {c: np.asarray(cols[c])[m].astype(np.int64 if c != "arg" else np.uint64)
         for c in _HOST_KEYS if c in cols or c not in ("calls", "end_ns")}
    if "calls" not in b:
        # the last call of a run of idle polls stands for the calls the recorder did not write (its polls)
        polls = np.where(_IDLE_LUT[b["type"] & 0xFFFF] & (b["aux"] == 0),
                         (b["arg"] >> np.uint64(IDLE_POLLS_SHIFT)).astype(np.int64), 0)
        b["calls"] = np.maximum(polls, 1)
        b["end_ns"] = b["ns"].copy()
    return b


class HostCollector:
    """Host-layer events the Perfetto export may draw, collected from a stream of batches.

    Idle polls (``format.events.IDLE_POLLS`` with aux 0: ucp_worker_progress or fi_cq_read that found
    nothing): a run of them on one thread, with nothing else of that thread between, becomes one row
    (``calls``: how many, ``end_ns``: the last one's start).  The recorder already writes such a run as its
    first and last call, the last one counting the calls between (``polls``, events.IDLE_POLLS_SHIFT).  UCX's progress loop makes millions of them
    between two operations; drawn one by one they fill the window before the first operation.  A run that
    reaches the end of a batch is held (one row per thread) and goes on in the next batch, so the rows do
    not depend on how the stream is cut; re-adding collapsed rows (parts merged) joins runs cut at parts.

    The export draws one time window for every kind of event: the ``max_events`` earliest ones across host
    calls, doorbells and operations (``write_perfetto``).  So at most the ``max_events`` earliest host rows
    (by ns, all processes together) can be drawn, and only those are kept: the buffer is cut back to them
    (``np.argpartition``) whenever it holds twice as many, which bounds memory whatever the capture's size.
    ``max_events`` None keeps every row.
    """

    def __init__(self, max_events):
        self.budget = None if max_events is None else max(0, int(max_events))
        self.total = 0          # rows (after joining runs)
        self.rows_in = 0        # rows added (calls of the capture, or rows of parts being merged)
        self.buf = []
        self.nbuf = 0
        self.held = {}          # thread key -> the run that reached the end of the last batch (one row)
        # once the buffer was cut back: the latest ns it kept.  A later row after it can never be among the
        # budget earliest (the buffer already holds that many at or before it), so it is not buffered
        self.cut = None

    def add(self, cols):
        ns = cols["ns"] if "ns" in cols else cols["tsc"]
        if not len(ns):
            return
        m = _HOST_LUT[np.asarray(cols["type"]).astype(np.int64) & 0xFFFF]
        if not m.any():
            return
        self.rows_in += int(np.count_nonzero(m))
        b = self._join(_rows(cols, m))
        k = len(b["ns"])
        self.total += k
        if not k or self.budget == 0:
            return
        if self.cut is not None:
            early = b["ns"] <= self.cut
            if not early.all():
                b = {c: v[early] for c, v in b.items()}
                k = len(b["ns"])
                if not k:
                    return
        self.buf.append(b)
        self.nbuf += k
        if self.budget is not None and self.nbuf > 2 * self.budget + (1 << 16):
            self._compact()

    def _join(self, b):
        """Runs of idle polls joined (with the held ones); rows in stream order, a thread's open runs held.

        A segment is a thread's rows between two of its other rows; the idle rows of one key (type, object,
        requested count) in one segment become one row, and every such row of a segment spans the segment
        (from its first call to its last), so the runs of polls nested in one progress call (a
        ucp_worker_progress run over ibv_poll_cq runs) draw as slices that nest."""
        key = b["process"] * (1 << 32) + b["thread"]
        if self.held:
            present = set(np.unique(key).tolist()) & self.held.keys()
            if present:     # a held segment goes first on its thread (counted when it comes out)
                held = [self.held.pop(q) for q in sorted(present)]
                b = {c: np.concatenate([np.concatenate([h[c] for h in held]), b[c]]) for c in _HOST_KEYS}
                key = b["process"] * (1 << 32) + b["thread"]
        o = np.argsort(key, kind="stable")      # a thread's rows together, held rows first, in stream order
        k = key[o]
        idle = (_IDLE_LUT[b["type"] & 0xFFFF] & (b["aux"] == 0))[o]
        same = k[1:] == k[:-1]
        if not (idle[1:] & idle[:-1] & same).any():
            return self._join_singles(b, o, k, idle, same)
        return self._join_runs(b, o, k, idle)

    def _join_runs(self, b, o, k, idle):
        """``_join``'s general path (``o``: the thread order of ``b``, ``k`` its keys, ``idle`` in it)."""
        n = len(o)
        b = {c: v[o] for c, v in b.items()}
        first = np.r_[True, k[1:] != k[:-1]]
        seg = np.cumsum(first | ~idle | ~np.r_[False, idle[:-1]])
        row = np.arange(n)
        # group key: (segment, type, object, requested) for idle rows, the row itself for the others
        g = (seg, np.where(idle, b["type"], -1), np.where(idle, b["obj"], row),
             np.where(idle, (b["arg"] & np.uint64(0xFFFFFFFF)).astype(np.int64), 0))
        srt = np.lexsort((row,) + g[::-1])
        change = np.zeros(n, bool)
        if n:
            change[0] = True
            for a in g:
                sa = a[srt]
                change[1:] |= sa[1:] != sa[:-1]
        heads = np.flatnonzero(change)
        hr = srt[heads]                         # each group's first row (the lowest in stream order)
        out = {c: b[c][hr] for c in _HOST_KEYS}
        out["calls"] = np.add.reduceat(b["calls"][srt], heads) if n else out["calls"]
        out["ns"] = np.minimum.reduceat(b["ns"][srt], heads) if n else out["ns"]
        out["end_ns"] = np.maximum.reduceat(b["end_ns"][srt], heads) if n else out["end_ns"]
        gseg, gidle = seg[hr], idle[hr]
        if n:                                   # the idle rows of a segment span it
            ss = np.flatnonzero(np.r_[True, gseg[1:] != gseg[:-1]])
            cnt = np.diff(np.r_[ss, len(gseg)])
            lo = np.repeat(np.minimum.reduceat(out["ns"], ss), cnt)
            hi = np.repeat(np.maximum.reduceat(out["end_ns"], ss), cnt)
            out["ns"] = np.where(gidle, lo, out["ns"])
            out["end_ns"] = np.where(gidle, hi, out["end_ns"])
        # a thread whose last row is idle: its last segment is held for the next batch
        last = np.r_[k[1:] != k[:-1], True] if n else np.zeros(0, bool)
        open_seg = set(seg[last & idle].tolist())
        hold = np.isin(gseg, list(open_seg)) if open_seg else np.zeros(len(hr), bool)
        if hold.any():
            gk = k[hr]
            for q in np.unique(gk[hold]).tolist():
                m = hold & (gk == q)
                self.held[int(q)] = {c: out[c][m] for c in _HOST_KEYS}
        keep = ~hold
        r = np.argsort(o[hr][keep], kind="stable")      # back in stream order
        return {c: v[keep][r] for c, v in out.items()}

    def _join_singles(self, b, o, k, idle, same):
        """``_join`` of a batch where no two idle rows follow each other on a thread (``o``: the thread order,
        ``k`` its keys, ``idle`` and ``same`` in it): every segment is one row, so every row stays as it is;
        a thread's last row, if idle, is held.  What the general path gives, without its sorts."""
        last = np.r_[~same, True] & idle
        if not last.any():
            return b
        for pos in np.flatnonzero(last).tolist():
            i = int(o[pos])
            self.held[int(k[pos])] = {c: b[c][i:i + 1] for c in _HOST_KEYS}
        keep = np.ones(len(o), bool)
        keep[o[last]] = False
        return {c: v[keep] for c, v in b.items()}

    @property
    def joined(self):
        """Rows added that went into another row: merging parts' rows, the runs cut at part boundaries."""
        self._close()
        return self.rows_in - self.total

    def _release(self):
        """The held runs into the buffer (the stream has ended)."""
        if self.held:
            held = list(self.held.values())
            self.held = {}
            b = {c: np.concatenate([h[c] for h in held]) for c in _HOST_KEYS}
            self.total += len(b["ns"])
            if self.budget != 0:
                self.buf.append(b)
                self.nbuf += len(b["ns"])

    def _compact(self):
        if not self.buf:
            return
        b = {c: np.concatenate([x[c] for x in self.buf]) for c in _HOST_KEYS} if len(self.buf) > 1 else self.buf[0]
        if self.budget is not None and len(b["ns"]) > self.budget:
            # the budget earliest, ties at the last one included (the window's cut keeps ties of every kind),
            # in stream order
            cut = np.partition(b["ns"], self.budget - 1)[self.budget - 1]
            keep = np.flatnonzero(b["ns"] <= cut)
            b = {c: v[keep] for c, v in b.items()}
            self.cut = int(cut) if self.cut is None else min(self.cut, int(cut))
        self.buf, self.nbuf = [b], len(b["ns"])

    def _close(self):
        self._release()
        self._compact()

    @property
    def done(self):
        """The kept rows (one batch of columns, or none): what a worker hands back for merging."""
        self._close()
        return list(self.buf)

    def result(self):
        self._close()
        if self.buf:
            return dict(self.buf[0]), self.total
        return {c: np.zeros(0, np.int64 if c != "arg" else np.uint64) for c in _HOST_KEYS}, self.total


def host_events(corr, max_events):
    """(columns, total count) of the host-layer rows the export may draw (runs of idle polls joined)."""
    T = corr.tables
    if getattr(corr, "events_loaded", True):
        hc = HostCollector(None)
        hc.add(T["events"])
        return hc.result()
    got = getattr(corr, "_host", None)
    if got is not None and got[0] == max_events:
        return got[1]
    hc = HostCollector(max_events)
    for cols in corr.iter_events():
        hc.add(cols)
    return hc.result()
