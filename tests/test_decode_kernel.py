"""The C decode kernel (libsigmatrace_decode.so via sigmatrace.decode.kernel) against the numpy path: identical
FileDecode results on the fixtures, on cut / corrupted / byte-range inputs, identical events-table batches,
and the numpy fallback when the kernel is absent or disabled (SIGMATRACE_NO_KERNEL=1)."""
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.decode import columns as decode, kernel as _kernel
from sigmatrace.format import layout as L
from sigmatrace.format.reader import chunk_spans

pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
FIXTURES = sorted(p for p in FIX.glob("*.bin"))
needs_kernel = pytest.mark.skipif(_kernel.get() is None, reason="libsigmatrace_decode.so not built")


def _eq(a, b, where):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, (where, a.dtype, b.dtype)
        assert a.shape == b.shape and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(map(str, a)), sorted(map(str, b)))
        for k in a:
            _eq(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _eq(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


FIELDS = ("uid", "path", "header", "threads", "calibration", "end", "aggregates", "aggregate_thread", "side_json",
          "side_prm", "side_wqe", "side_bad", "tables", "chunks", "n_events", "n_records", "header_dups")


def assert_same(fa, fb):
    for f in ("path", "start", "losses", "warnings", "error", "records"):
        _eq(getattr(fa, f), getattr(fb, f), f)
    assert len(fa.processes) == len(fb.processes)
    for i, (p, q) in enumerate(zip(fa.processes, fb.processes)):
        for f in FIELDS:
            _eq(getattr(p, f), getattr(q, f), f"proc{i}.{f}")


def both(path, start=0, stop=None, batch_records=decode.DEFAULT_BATCH_RECORDS):
    # the kernel path itself (no silent fallback: a kernel/reader disagreement raises _KernelMismatch here)
    a = decode._decode_file_kernel(_kernel.get(), path, start, stop, batch_records)
    return a, decode.decode_file(path, start, stop, batch_records, kernel=False)


@needs_kernel
@pytest.mark.parametrize("fx", FIXTURES, ids=lambda p: p.stem)
def test_fixtures_identical(fx):
    a, b = both(fx)
    assert a.records and not a.losses
    assert_same(a, b)
    a, b = both(fx, batch_records=1000)         # many small batches
    assert_same(a, b)


@needs_kernel
def test_byte_ranges_identical():
    fx = FIX / "allreduce_full.bin"
    for parts in (2, 3, 7):
        for s, e in chunk_spans(fx, parts):
            a, b = both(fx, start=s, stop=e, batch_records=5000)
            assert_same(a, b)
        ra = decode.merge_ranges([decode.decode_file(fx, s, e, kernel=True) for s, e in chunk_spans(fx, parts)])
        rb = decode.merge_ranges([decode.decode_file(fx, s, e, kernel=False) for s, e in chunk_spans(fx, parts)])
        assert_same(ra, rb)


def _chunk_offsets(data):
    offs, off = [], 0
    while off + 32 <= len(data):
        offs.append(off)
        off += 32 + int.from_bytes(data[off + 20:off + 24], "little")
    return offs


def _recrc(data, off):
    plen = int.from_bytes(data[off + 20:off + 24], "little")
    crc = zlib.crc32(bytes(data[off + 32:off + 32 + plen]), zlib.crc32(bytes(data[off:off + 28])))
    data[off + 28:off + 32] = crc.to_bytes(4, "little")


@needs_kernel
def test_corrupted_inputs_identical(tmp_path):
    src = bytearray((FIX / "pingpong.bin").read_bytes())
    offs = _chunk_offsets(src)
    kinds = [int.from_bytes(src[o + 6:o + 8], "little") for o in offs]
    ev = [o for o, k in zip(offs, kinds) if k == L.CHUNK_EVENTS]
    side = [o for o, k in zip(offs, kinds) if k == L.CHUNK_SIDE]
    rng = random.Random(7)
    cases = {}
    for cut in (0, 5, 31, 32, 33, len(src) // 3, len(src) // 2 + 7, len(src) - 1):
        cases[f"cut{cut}"] = src[:cut]
    d = bytearray(src); d[ev[1] + 40] ^= 0xFF; cases["crc_payload"] = d
    d = bytearray(src); d[ev[2]] ^= 1; cases["bad_magic"] = d
    d = bytearray(src); d[ev[2] + 4] = 2; cases["version2"] = d
    d = bytearray(src); d[ev[1] + 20:ev[1] + 24] = (1 << 25).to_bytes(4, "little"); cases["huge_len"] = d
    d = bytearray(src); d[ev[1] + 20:ev[1] + 24] = (int.from_bytes(d[ev[1] + 20:ev[1] + 24], "little") + 8).to_bytes(4, "little"); _recrc(d, ev[1]); cases["len_into_next"] = d
    d = bytearray(src); d[ev[1] + 32 + 8:ev[1] + 32 + 10] = (1).to_bytes(2, "little"); _recrc(d, ev[1]); cases["ext_first"] = d
    d = bytearray(src); d[ev[1] + 24:ev[1] + 28] = (int.from_bytes(d[ev[1] + 24:ev[1] + 28], "little") - 1).to_bytes(4, "little"); _recrc(d, ev[1]); cases["count_mismatch"] = d
    d = bytearray(src); d[ev[3] + 6:ev[3] + 8] = (9).to_bytes(2, "little"); _recrc(d, ev[3]); cases["unknown_kind"] = d
    if side:
        d = bytearray(src); d[side[0] + 32 + 8:side[0] + 32 + 12] = (1 << 20).to_bytes(4, "little"); _recrc(d, side[0]); cases["side_len"] = d
    d = bytearray(src); d[offs[0] + 33] ^= 0x55; _recrc(d, offs[0]); cases["bad_json"] = d
    d = bytearray(src)
    for o in rng.sample(range(len(d)), 40):
        d[o] ^= rng.randrange(1, 256)
    cases["random_flips"] = d
    cases["garbage_head"] = bytearray(b"\0" * 13) + src
    cases["doubled"] = src + src
    # change record types to EXT inside chunks (EXT runs, EXT at chunk end) and re-CRC: join semantics
    d = bytearray(src)
    for o in ev[:6]:
        cnt = int.from_bytes(d[o + 24:o + 28], "little")
        for i in rng.sample(range(1, cnt), min(cnt - 1, 12)):
            d[o + 32 + 24 * i + 8:o + 32 + 24 * i + 10] = (1).to_bytes(2, "little")
        _recrc(d, o)
    cases["ext_runs"] = d
    for name, data in cases.items():
        p = tmp_path / f"{name}.bin"
        p.write_bytes(bytes(data))
        for br in (decode.DEFAULT_BATCH_RECORDS, 300):
            a, b = both(p, batch_records=br)
            assert_same(a, b)
        spans = chunk_spans(p, 3)
        for s, e in spans:
            a, b = both(p, start=s, stop=e, batch_records=700)
            assert_same(a, b)


@needs_kernel
def test_event_batches_identical(monkeypatch):
    fd = decode.finish_warnings(decode.decode_file(FIX / "allreduce_full.bin", kernel=False))
    a = list(decode.iter_event_batches(fd.processes, 5000))
    monkeypatch.setenv("SIGMATRACE_NO_KERNEL", "1")
    b = list(decode.iter_event_batches(fd.processes, 5000))
    assert len(a) == len(b) and len(a) > 1
    for (i, x), (j, y) in zip(a, b):
        assert i == j
        _eq(x, y, f"batch{i}")


@needs_kernel
def test_crc_matches_zlib():
    k = _kernel.get()
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 63, 64, 1000, 65537):
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        for table in (False, True):
            for seed in (0, 0xDEADBEEF):
                assert k.crc32(b, seed, table) == zlib.crc32(b, seed)
            assert k.crc32(b[3:], 0, table) == zlib.crc32(b[3:])   # unaligned start


def test_fallback_when_disabled_or_absent(monkeypatch):
    monkeypatch.setenv("SIGMATRACE_NO_KERNEL", "1")
    assert _kernel.get() is None
    called = []
    orig = decode._decode_file_numpy
    monkeypatch.setattr(decode, "_decode_file_numpy", lambda *a, **k: called.append(1) or orig(*a, **k))
    fd = decode.decode_file(FIX / "put.bin")
    assert called and fd.records and fd.error is None
    with pytest.raises(RuntimeError):
        decode.decode_file(FIX / "put.bin", kernel=True)
    # library absent (a build without a C compiler): a fresh interpreter that finds no library
    monkeypatch.delenv("SIGMATRACE_NO_KERNEL")
    code = ("import sigmatrace._native as n; n.decode_library = lambda: None\n"
            "from sigmatrace.decode import columns as decode, kernel as _kernel\n"
            "assert _kernel.get() is None\n"
            "fd = decode.decode_file(%r); assert fd.records and fd.error is None\n"
            "from sigmatrace.correlate import correlate\n"
            "c = correlate(%r, workers=1); assert c.stats['events']\nprint('ok')" % (str(FIX / "put.bin"),
                                                                                      str(FIX / "put.bin")))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sim")])})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@needs_kernel
def test_match_kth_identical(monkeypatch):
    from sigmatrace.correlate import ops
    rng = np.random.default_rng(3)
    cases = [(np.zeros(0, np.int64), np.zeros(0), np.arange(3), np.arange(3.0))]
    for n, m, keys in ((1, 1, 1), (50, 70, 5), (10_000, 8_000, 300), (5000, 5000, 1), (3000, 4000, 10_000)):
        ka, kb = rng.integers(-keys, keys, n), rng.integers(-keys, keys, m)
        ta, tb = rng.integers(0, 50, n), rng.integers(0, 50, m)     # ties in time: stable order matters
        cases.append((ka, ta, kb, tb))
        cases.append((np.sort(ka), np.arange(n), np.sort(kb), np.arange(m)))
    for ka, ta, kb, tb in cases:
        a = ops.match_kth(ka, ta, kb, tb)
        with monkeypatch.context() as mp:
            mp.setenv("SIGMATRACE_NO_KERNEL", "1")
            b = ops.match_kth(ka, ta, kb, tb)
        assert len(a[0]) == len(b[0]) and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_timebase_scalar_process():
    """TimeBase with one process index (events-table batches) == the per-row path, bit for bit."""
    from types import SimpleNamespace
    from sigmatrace.correlate import clock as C
    rng = np.random.default_rng(0)
    for corr in (False, True):
        clocks = {k: SimpleNamespace(tsc0=int(rng.integers(1 << 40)), ns0=int(rng.integers(1 << 50)),
                                     slope=float(rng.uniform(0.3, 0.5)),
                                     offset_ns=float(rng.normal(0, 1e4)) if corr and k else 0.0,
                                     drift=float(rng.normal(0, 1e-6)) if corr and k else 0.0,
                                     ref_ns=int(rng.integers(1 << 50))) for k in range(3)}
        tb = C.TimeBase(clocks, [0, 1, 2, 2])
        tsc = rng.integers(0, 1 << 62, 10_000).astype(np.uint64)
        for i in range(4):
            for first in (False, True):
                a = tb(np.full(len(tsc), i, np.int64), tsc, first)
                b = tb(np.int64(i), tsc, first)
                assert a.dtype == b.dtype and np.array_equal(a, b)


@needs_kernel
def test_correlate_identical_with_and_without_kernel(monkeypatch):
    """The whole correlation (tables, stats, warnings) is the same on both paths."""
    from sigmatrace.correlate import correlate
    for fx in ("allreduce_full.bin", "pingpong.bin", "bfs.bin"):
        a = correlate(FIX / fx, workers=1)
        with monkeypatch.context() as mp:
            mp.setenv("SIGMATRACE_NO_KERNEL", "1")
            b = correlate(FIX / fx, workers=1)
        assert a.stats == b.stats and a.warnings == b.warnings
        for name in ("ops", "completions", "flows", "qps", "clock"):
            ta, tb = a.tables[name], b.tables[name]
            ra = ta.rows(slice(0, len(ta))) if hasattr(ta, "rows") else dict(ta)
            rb = tb.rows(slice(0, len(tb))) if hasattr(tb, "rows") else dict(tb)
            assert set(ra) == set(rb)
            for c in ra:
                x, y = np.asarray(ra[c]), np.asarray(rb[c])
                if x.dtype == object:
                    assert list(x) == list(y), (fx, name, c)
                else:
                    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (fx, name, c)


def test_worker_results_through_shared_memory(monkeypatch):
    """Pool results come back through a /dev/shm file (correlate.pool._pack / _unpack): same objects, writable arrays,
    the file removed; and a 2-worker correlation through that path equals the 1-worker one."""
    from sigmatrace.correlate import pool as core
    if not os.path.isdir(core.SHM_DIR):
        pytest.skip("no /dev/shm")
    monkeypatch.setattr(core, "_PACK_MIN", 0)
    monkeypatch.setattr(core, "_MAP_MIN", 4096)      # both branches: mapped and copied buffers
    fd = decode.decode_file(FIX / "allreduce_full.bin")
    packed = core._pack(fd)
    assert isinstance(packed, core._Packed) and os.path.exists(packed.path)
    back = core._unpack(packed)
    assert not os.path.exists(packed.path)
    assert_same(back, fd)
    assert all(v.flags.writeable for p in back.processes for t in p.tables.values() for v in t.values())
    monkeypatch.setattr(core, "SPLIT_MIN_BYTES", 0)   # split the fixture into ranges: a pool is used
    from sigmatrace.correlate import correlate
    a = correlate(FIX / "allreduce_full.bin", workers=2)
    b = correlate(FIX / "allreduce_full.bin", workers=1)
    assert a.stats == b.stats
    for name in ("ops", "completions", "flows"):
        ra, rb = a.tables[name].rows(slice(0, len(a.tables[name]))), b.tables[name].rows(slice(0, len(b.tables[name])))
        for c in ra:
            x, y = np.asarray(ra[c]), np.asarray(rb[c])
            assert (list(x) == list(y)) if x.dtype == object else np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
