"""Small vectorised helpers (numpy only)."""
from __future__ import annotations

import numpy as np


def group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Boolean mask: True where a new group starts in an already sorted key array."""
    n = len(sorted_keys)
    m = np.ones(n, bool)
    if n > 1:
        m[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return m


def rank_in_group(keys: np.ndarray, order_by: np.ndarray) -> np.ndarray:
    """0-based occurrence number of each row inside its key group, ordered by ``order_by``."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int64)
    o = np.lexsort((np.arange(n), order_by, keys))
    k = keys[o]
    start = group_starts(k)
    pos = np.arange(n)
    first = np.maximum.accumulate(np.where(start, pos, 0))
    r = np.empty(n, np.int64)
    r[o] = pos - first
    return r


def lookup(table_keys: np.ndarray, table_vals: np.ndarray, keys: np.ndarray, missing=-1):
    """Vectorised dict lookup: value for each key (``missing`` where absent)."""
    out = np.full(len(keys), missing, dtype=np.asarray(table_vals).dtype if len(table_vals) else np.int64)
    if len(table_keys) == 0 or len(keys) == 0:
        return out
    o = np.argsort(table_keys, kind="stable")
    sk = table_keys[o]
    pos = np.searchsorted(sk, keys)
    pos_c = np.minimum(pos, len(sk) - 1)
    hit = sk[pos_c] == keys
    out[hit] = np.asarray(table_vals)[o][pos_c[hit]]
    return out


def pq_key(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Combine two non-negative ints (a < 2^31, b < 2^32) into one int64 key."""
    return (np.asarray(a, np.int64) << np.int64(32)) | np.asarray(b, np.int64)


def unwrap16_near(ref: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Largest value <= ref-1 that is congruent to w modulo 2^16 (ref unwrapped, w 16-bit)."""
    ref = np.asarray(ref, np.int64)
    w = np.asarray(w, np.int64)
    return ref - 1 - ((ref - 1 - w) & 0xFFFF)
