"""cffi (ABI mode) binding of the reader-side decode kernel ``libsigmatrace_decode.so`` (native/src/decode).

What numpy does badly here is the per-record work: CRC-32 of every chunk, joining EXT records and
scattering each correlator record into its per-type columns (~15 whole-array passes per batch).  The
kernel does it in C with the Python side doing O(chunks) work (``decode._decode_file_kernel``):

* ``scan``  — chunk header checks + CRC-32 (zlib polynomial) + reader.py's structural payload checks, and
  per EVENTS chunk its primary count and TSC bounds; stops at the first chunk the reader would not yield,
  which is then handed to ``format.reader.iter_chunks`` (losses, recover mode: the reader's own rules);
* ``fill``  — per-type count, then the scatter into ``decode.TYPE_COLUMNS`` buffers allocated here;
* ``split`` — whole chunks of records -> the events table's ten primary columns (``decode.split_ext``).

``get()`` returns None when the library is missing (a build without a C compiler) or when
``SIGMATRACE_NO_KERNEL=1``: callers then use the numpy path, which gives identical results
(tests/test_decode_kernel.py).
"""
from __future__ import annotations

import os

import numpy as np

from .. import _native
from .types import TYPE_COLUMNS

_CDEF = """
typedef struct {
    int64_t offset; uint64_t uid; uint64_t tsc_min; uint64_t tsc_max;
    uint32_t plen; uint32_t count; uint32_t thread; uint32_t events;
    uint16_t kind; uint16_t pad0; uint32_t pad1;
} st_dk_chunk;
typedef struct { uint8_t slot; uint8_t lo; uint8_t width; uint8_t size; } st_dk_col;
uint32_t st_dk_crc32(uint32_t crc, const uint8_t *p, int64_t n);
uint32_t st_dk_crc32_table(uint32_t crc, const uint8_t *p, int64_t n);
int64_t st_dk_scan(const uint8_t *buf, int64_t n, int64_t off, int64_t lim, st_dk_chunk *out, int64_t cap,
                   int64_t max_records, int64_t *next_off, int32_t *status, const uint8_t *lut, int32_t ntypes,
                   uint32_t *type_counts);
int st_dk_count(const uint8_t *buf, int64_t n, const int64_t *offs, const uint32_t *cnts, int64_t nch,
                const uint8_t *lut, int64_t *counts);
int st_dk_fill(const uint8_t *buf, int64_t n, const int64_t *offs, const uint32_t *cnts, const uint32_t *threads,
               int64_t nch, const uint8_t *lut, const st_dk_col *cols, const int32_t *ncols, int32_t maxc,
               void *const *ptrs, int64_t *pos, const int64_t *caps);
int64_t st_dk_split(const uint8_t *rec, int64_t nrec, const uint32_t *cnts, const uint32_t *threads, int64_t nch,
                    int64_t cap, uint32_t *thread, uint64_t *tsc, uint16_t *type, uint16_t *aux, uint32_t *obj,
                    uint64_t *arg, uint64_t *x0, uint16_t *x1, uint32_t *x2, uint64_t *x3);
int64_t st_dk_match_sorted(const int64_t *ka, int64_t na, const int64_t *kb, int64_t nb, int64_t *ia, int64_t *ib);
"""

# mirrors st_dk_chunk (56 bytes)
CHUNK_DTYPE = np.dtype([("offset", "<i8"), ("uid", "<u8"), ("tsc_min", "<u8"), ("tsc_max", "<u8"),
                        ("plen", "<u4"), ("count", "<u4"), ("thread", "<u4"), ("events", "<u4"),
                        ("kind", "<u2"), ("pad0", "<u2"), ("pad1", "<u4")])
assert CHUNK_DTYPE.itemsize == 56
_COL_DTYPE = np.dtype([("slot", "u1"), ("lo", "u1"), ("width", "u1"), ("size", "u1")])
_SLOT_INDEX = dict(aux=0, obj=1, arg=2, x0=3, x1=4, x2=5, x3=6)
SCAN_CAP = 8192          # chunk entries per scan call

_state = {}


class Kernel:
    def __init__(self, ffi, lib, type_columns):
        self.ffi, self.lib = ffi, lib
        # per correlator type k: lut[type value] = k + 1, column specs, output dtypes (decode.TYPE_COLUMNS)
        self.types = sorted(type_columns)               # numpy path emits types in ascending value
        self.names = [type_columns[t][0] for t in self.types]
        self.colspecs = [type_columns[t][1] for t in self.types]
        k = len(self.types)
        assert k < 255
        self.maxc = max(1, max(len(c) for c in self.colspecs))
        self.lut = np.zeros(1 << 16, np.uint8)
        self.cols = np.zeros(k * self.maxc, _COL_DTYPE)
        self.ncols = np.zeros(k, np.int32)
        for i, (tv, spec) in enumerate(zip(self.types, self.colspecs)):
            self.lut[tv] = i + 1
            self.ncols[i] = len(spec)
            for j, (col, sl, lo, width, dt) in enumerate(spec):
                self.cols[i * self.maxc + j] = (_SLOT_INDEX[sl], lo, width or 0, np.dtype(dt).itemsize)
        fb = ffi.from_buffer
        self._lut_p = fb("uint8_t[]", self.lut)
        self._cols_p = ffi.cast("const st_dk_col *", fb(self.cols))
        self._ncols_p = fb("int32_t[]", self.ncols)
        self._scan_out = np.zeros(SCAN_CAP, CHUNK_DTYPE)
        self._scan_p = ffi.cast("st_dk_chunk *", fb(self._scan_out))
        self._tc = np.zeros((SCAN_CAP, k), np.uint32)
        self._tc_p = fb("uint32_t[]", self._tc)
        self._i64 = ffi.new("int64_t[1]")
        self._i32 = ffi.new("int32_t[1]")

    def buffer(self, buf):
        """cffi view of a bytes / mmap buffer (use as a context manager: releases the export)."""
        return self.ffi.from_buffer("uint8_t[]", buf)

    def crc32(self, data, crc=0, table=False):
        f = self.lib.st_dk_crc32_table if table else self.lib.st_dk_crc32
        with self.ffi.from_buffer("uint8_t[]", data) as p:
            return int(f(crc, p, len(data)))

    def scan(self, bp, n, off, lim, max_records):
        """Validated chunks from ``off`` -> (CHUNK_DTYPE array, per-chunk kept-type counts (chunks x types),
        next offset, status 0/1/2); the arrays are copies."""
        self._tc.fill(0)
        k = self.lib.st_dk_scan(bp, n, off, lim, self._scan_p, SCAN_CAP, max_records, self._i64, self._i32,
                                self._lut_p, len(self.types), self._tc_p)
        return self._scan_out[:k].copy(), self._tc[:k].copy(), int(self._i64[0]), int(self._i32[0])

    def fill(self, bp, n, offs, cnts, thrs, counts=None):
        """Kept records of EVENTS chunks (header offsets, counts, threads) -> {type name: {column: array}}.
        ``counts``: records per kept type (from ``scan``); counted here when not given."""
        ffi, fb = self.ffi, self.ffi.from_buffer
        offs = np.ascontiguousarray(offs, np.int64)
        cnts = np.ascontiguousarray(cnts, np.uint32)
        thrs = np.ascontiguousarray(thrs, np.uint32)
        k = len(self.types)
        po, pc, pt = fb("int64_t[]", offs), fb("uint32_t[]", cnts), fb("uint32_t[]", thrs)
        if counts is None:
            counts = np.zeros(k, np.int64)
            if self.lib.st_dk_count(bp, n, po, pc, len(offs), self._lut_p, fb("int64_t[]", counts)) != 0:
                raise RuntimeError("decode kernel: chunk outside the buffer")
        counts = np.ascontiguousarray(counts, np.int64)
        present = np.flatnonzero(counts).tolist()
        if not present:
            return {}
        stride = self.maxc + 2
        ptrs = ffi.new("void *[]", k * stride)
        out = {}
        for i in present:
            m = int(counts[i])
            d = {"tsc": np.empty(m, np.uint64), "thread": np.empty(m, np.uint32)}
            for col, _, _, _, dt in self.colspecs[i]:
                d[col] = np.empty(m, dt)
            for j, a in enumerate(d.values()):
                ptrs[i * stride + j] = ffi.cast("void *", a.ctypes.data)
            out[self.names[i]] = d
        pos = np.zeros(k, np.int64)
        rc = self.lib.st_dk_fill(bp, n, po, pc, pt, len(offs), self._lut_p, self._cols_p, self._ncols_p,
                                 self.maxc, ptrs, fb("int64_t[]", pos), fb("int64_t[]", counts))
        if rc != 0 or not np.array_equal(pos, counts):
            raise RuntimeError(f"decode kernel: fill failed ({rc})")
        return out

    def split(self, ev, cnts, thrs, rows):
        """Records of whole chunks (a contiguous 24-byte record array) -> the ten primary columns, or None
        when the chunk counts do not match the records (the caller then uses the numpy path)."""
        fb = self.ffi.from_buffer
        cnts = np.ascontiguousarray(cnts, np.uint32)
        thrs = np.ascontiguousarray(thrs, np.uint32)
        d = dict(thread=np.empty(rows, np.uint32), tsc=np.empty(rows, np.uint64), type=np.empty(rows, np.uint16),
                 aux=np.empty(rows, np.uint16), obj=np.empty(rows, np.uint32), arg=np.empty(rows, np.uint64),
                 x0=np.empty(rows, np.uint64), x1=np.empty(rows, np.uint16), x2=np.empty(rows, np.uint32),
                 x3=np.empty(rows, np.uint64))
        ct = ("uint32_t[]", "uint64_t[]", "uint16_t[]", "uint16_t[]", "uint32_t[]", "uint64_t[]", "uint64_t[]",
              "uint16_t[]", "uint32_t[]", "uint64_t[]")
        outs = [fb(t, a) for t, a in zip(ct, d.values())]
        with fb("uint8_t[]", ev) as rp:
            m = self.lib.st_dk_split(rp, len(ev), fb("uint32_t[]", cnts), fb("uint32_t[]", thrs), len(cnts), rows,
                                     *outs)
        return d if m == rows else None


    def match_sorted(self, ska, skb):
        """k-th occurrence pairs of two sorted int64 key arrays -> (positions in a, positions in b)."""
        fb = self.ffi.from_buffer
        ska = np.ascontiguousarray(ska, np.int64)
        skb = np.ascontiguousarray(skb, np.int64)
        m = min(len(ska), len(skb))
        ia, ib = np.empty(m, np.int64), np.empty(m, np.int64)
        k = self.lib.st_dk_match_sorted(fb("int64_t[]", ska), len(ska), fb("int64_t[]", skb), len(skb),
                                        fb("int64_t[]", ia), fb("int64_t[]", ib))
        if k < 0:
            raise RuntimeError("decode kernel: match_sorted on unsorted keys")
        return ia[:k], ib[:k]


def library_path():
    return _native.decode_library()


def get():
    """The loaded kernel, or None (library absent, cffi absent, or SIGMATRACE_NO_KERNEL=1)."""
    if os.environ.get("SIGMATRACE_NO_KERNEL", "") not in ("", "0"):
        return None
    if "k" in _state:
        return _state["k"]
    k = None
    try:
        path = library_path()
        if path is not None:
            import cffi
            ffi = cffi.FFI()
            ffi.cdef(_CDEF)
            k = Kernel(ffi, ffi.dlopen(str(path)), TYPE_COLUMNS)
    except (ImportError, OSError):
        k = None
    _state["k"] = k
    return k
