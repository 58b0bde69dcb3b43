"""Per-operation tables computed in row ranges (bounded memory).

The correlator keeps only narrow *base* columns of the large per-operation tables (ops, completions,
flows): ids, keys and the join results.  ``RowTable.rows(sel)`` computes every output column (dtype as
documented in docs/schema.md) for a row range or index array; the Parquet writer streams the table in
ranges (one row group each), so the wide rows never exist whole.  ``table[col]`` gives a full column
(cached below ``CACHE_ROWS`` rows: tests and small captures use the tables like dicts of arrays).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

CACHE_ROWS = 4_000_000


class Labels:
    """A string column as small-int codes into a fixed vocabulary (written as an Arrow dictionary array)."""

    def __init__(self, codes, vocab):
        self.codes = np.asarray(codes, np.int32)
        self.vocab = vocab

    def __len__(self):
        return len(self.codes)

    def objects(self):
        return np.array(self.vocab, dtype=object)[self.codes] if len(self.codes) else np.zeros(0, object)


class RowTable(Mapping):
    def __init__(self, n_rows, columns, compute, base=None):
        """``columns``: output column names in order; ``compute(sel, names) -> {name: array}`` for a slice or
        an index array; ``base``: the narrow columns it reads (kept for vectorised access)."""
        self.n_rows = int(n_rows)
        self.columns = tuple(columns)
        self._compute = compute
        self.base = base or {}
        self._cache = {}

    def rows(self, sel=None, names=None, labels=False):
        """Output columns for rows ``sel`` (slice or index array; all rows when None).  ``labels``: string
        columns as ``Labels`` (codes + vocabulary) instead of object arrays."""
        if sel is None:
            sel = slice(0, self.n_rows)
        return self._compute(sel, tuple(names) if names is not None else self.columns, labels=labels)

    def __getitem__(self, k):
        if k not in self.columns:
            raise KeyError(k)
        v = self._cache.get(k)
        if v is None:
            v = self.rows(None, (k,))[k]
            if self.n_rows <= CACHE_ROWS:
                self._cache[k] = v
        return v

    def __iter__(self):
        return iter(self.columns)

    def __len__(self):
        return len(self.columns)

    def iter_ranges(self, step, labels=True):
        step = max(1, int(step))
        for lo in range(0, self.n_rows, step):
            yield self.rows(slice(lo, min(lo + step, self.n_rows)), labels=labels)


def take(a, sel):
    """a[sel] for a slice (view) or an index array."""
    return a[sel]


def sel_len(sel, n):
    if isinstance(sel, slice):
        return len(range(*sel.indices(n)))
    return len(sel)


def sel_ids(sel, n):
    if isinstance(sel, slice):
        return np.arange(*sel.indices(n), dtype=np.int64)
    return np.asarray(sel, np.int64)
