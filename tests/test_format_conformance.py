"""Contract 1: the C definition of trace format v1 and the native writer agree
with the Python definition and reader.

(a) A C program compiled against native/include prints sizeof/offsetof of
    every struct in layout.C_STRUCTS, every constant in layout.C_CONSTANTS and
    layout.C_STRINGS (the PROCESS header's untraced-library key and reasons) and
    every (name, value) of the ST_EVENT_LIST X-macro; they must equal Python's.
(b) native/tests/format_writer.c, linked with the recorder core sources,
    records a known sequence from several threads (EXT records, side records
    of every kind, aggregate counters; calibrations come from the core) and
    the Python reader must return exactly those records, per thread, in order.
"""
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.format import events as E
from sigmatrace.format import layout as L
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "native" / "include"
SRC = ROOT / "native" / "src"
CC = shutil.which("gcc") or shutil.which("cc")

needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (gcc/cc) on PATH")


# The same checks for the aarch64 build of the recorder (Grace Hopper is a primary IBGDA platform): compiled
# with Debian's cross compiler and run under qemu-user (both installed by .ci/install).
CROSS_CC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
CROSS_SYSROOT = "/usr/aarch64-linux-gnu"
TARGETS = {
    "native": (CC, []),
    "aarch64": (CROSS_CC, [QEMU, "-L", CROSS_SYSROOT]),
}


def _target(name):
    cc, runner = TARGETS[name]
    if cc is None or (runner and (runner[0] is None or not Path(CROSS_SYSROOT).is_dir())):
        pytest.skip(f"{name}: needs {'aarch64-linux-gnu-gcc, qemu-aarch64 and ' + CROSS_SYSROOT if runner else 'a C compiler'}")
    return cc, runner


def _compile(tmp_path, name, sources, extra=(), cc=None):
    exe = tmp_path / name
    cmd = [cc or CC, "-O2", "-g", "-std=gnu11", "-D_GNU_SOURCE", f"-I{INCLUDE}", f"-I{SRC}", "-o", str(exe),
           *map(str, sources), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"compile failed:\n{' '.join(cmd)}\n{r.stderr}"
    return exe


# the NCCL event constants of events.h (enum st_nccl_*) and their events.py names without the ST_ prefix
NCCL_CONSTANTS = tuple("ST_" + n for n in dir(E) if n.startswith("NCCL_") and isinstance(getattr(E, n), int))


@needs_cc
def test_c_layout_matches_python(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "sigmatrace/format.h"',
             '#include "sigmatrace/events.h"', "int main(void) {"]
    for struct, dtype in L.C_STRUCTS.items():
        lines.append(f'printf("S {struct} %zu\\n", sizeof(struct {struct}));')
        for field in dtype.names:
            lines.append(f'printf("F {struct} {field} %zu %zu\\n", offsetof(struct {struct}, {field}), '
                         f'sizeof(((struct {struct} *)0)->{field}));')
    for const in L.C_CONSTANTS:
        lines.append(f'printf("C {const} %llu\\n", (unsigned long long)({const}));')
    lines.append('#define PR(name, value) printf("E %s %llu\\n", #name, (unsigned long long)ST_EV_##name);')
    lines.append("ST_EVENT_LIST(PR)")
    for const in ("ST_UMEM_F_GPU", "ST_UMEM_F_DMABUF", "ST_WQE_LOST_OVERWRITTEN", "ST_WQE_LOST_CORRUPT",
                  "ST_WQE_LOST_COPY_FAILED", "ST_WQE_LOST_RING_FULL", "ST_WQE_LOST_TRACE_DROPPED", "ST_IDLE_POLLS_SHIFT",
                  "ST_IDLE_POLLS_MAX") + NCCL_CONSTANTS:
        lines.append(f'printf("C {const} %llu\\n", (unsigned long long)({const}));')
    for const in L.C_STRINGS:
        lines.append(f'printf("T {const} %s\\n", {const});')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = _compile(tmp_path, "layout", [src])
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True).stdout

    sizes, fields, consts, events, strings = {}, {}, {}, {}, {}
    for line in out.splitlines():
        tag, *rest = line.split()
        if tag == "S":
            sizes[rest[0]] = int(rest[1])
        elif tag == "F":
            fields[(rest[0], rest[1])] = (int(rest[2]), int(rest[3]))
        elif tag == "C":
            consts[rest[0]] = int(rest[1])
        elif tag == "E":
            events[rest[0]] = int(rest[1])
        elif tag == "T":
            strings[rest[0]] = rest[1]

    for struct, dtype in L.C_STRUCTS.items():
        assert sizes[struct] == dtype.itemsize, struct
        for field in dtype.names:
            off = dtype.fields[field][1]
            size = dtype.fields[field][0].itemsize
            assert fields[(struct, field)] == (off, size), f"{struct}.{field}"
    for const, value in L.C_CONSTANTS.items():
        assert consts[const] == value, const
    assert strings == L.C_STRINGS
    assert consts["ST_UMEM_F_GPU"] == E.UMEM_F_GPU and consts["ST_UMEM_F_DMABUF"] == E.UMEM_F_DMABUF
    assert consts["ST_WQE_LOST_RING_FULL"] == E.WQE_LOST_RING_FULL
    assert consts["ST_WQE_LOST_OVERWRITTEN"] == E.WQE_LOST_OVERWRITTEN
    assert consts["ST_WQE_LOST_CORRUPT"] == E.WQE_LOST_CORRUPT
    assert consts["ST_WQE_LOST_COPY_FAILED"] == E.WQE_LOST_COPY_FAILED
    assert consts["ST_WQE_LOST_TRACE_DROPPED"] == E.WQE_LOST_TRACE_DROPPED
    assert (consts["ST_IDLE_POLLS_SHIFT"], consts["ST_IDLE_POLLS_MAX"]) == (E.IDLE_POLLS_SHIFT, E.IDLE_POLLS_MAX)
    for name in ("UCP_WORKER_PROGRESS", "OFI_CQ_READ"):   # the polls field is where the shift puts it
        assert ("polls", "arg", E.IDLE_POLLS_SHIFT, 32) in E.BY_NAME[name].columns(), name
    for const in NCCL_CONSTANTS:      # ST_NCCL_COLL_SEND <-> events.NCCL_COLL_SEND
        assert consts[const] == getattr(E, const[3:]), const
    py_events = {e.name: e.value for e in E.EVENTS}
    assert events == py_events


@needs_cc
def test_native_crc32_matches_zlib(tmp_path):
    """The chunk CRC of the native writer (carry-less multiply folding where the CPU has PCLMULQDQ, tables
    otherwise) equals zlib's for every length and alignment around the folding steps (16, 64 bytes)."""
    import re
    import zlib
    exe = _compile(tmp_path, "crc32_check", [ROOT / "native" / "tests" / "crc32_check.c", SRC / "core" / "crc32.c"],
                   ["-lpthread"])
    cases = [(off, n) for off in (0, 1, 3, 8, 15) for n in list(range(0, 200)) + [255, 256, 1000, 4096, 65536, 65563]]
    buf = bytes(((i * 2654435761) >> 13) & 0xFF for i in range(1 << 17))
    for seed in (0, 0xDEADBEEF):
        args = [str(x) for c in cases for x in c]
        out = subprocess.run([str(exe), str(seed), *args], capture_output=True, text=True, check=True).stdout
        lines = out.splitlines()
        if re.search(r"\bpclmulqdq\b", Path("/proc/cpuinfo").read_text()) and os.uname().machine == "x86_64":
            assert lines[0] == "accelerated 1"  # the fast path is the one checked here
        for (off, n), line in zip(cases, lines[1:], strict=True):
            assert int(line.split()[2]) == zlib.crc32(buf[off:off + n], seed), (off, n, seed)


def _build_writer(tmp_path, cc=None, consumer=False):
    sources = [ROOT / "native" / "tests" / "format_writer.c"]
    sources += sorted((SRC / "core").glob("*.c"))
    sources += sorted((SRC / "interpose").glob("*.c"))
    if consumer:  # the consumer process's writer: its executable beside the program (where the core looks)
        _compile(tmp_path, "sigmatrace-consumer",
                 [SRC / "consumer" / "consumer.c", *(SRC / "core" / f for f in ("crc32.c", "clock.c", "json.c", "io.c"))],
                 cc=cc)
    return _compile(tmp_path, "format_writer", sources, ["-lpthread", "-ldl"], cc=cc)


def _parse_expected(text):
    ev = defaultdict(list)  # tid -> [(type, aux, obj, arg, ext or None)]
    side, agg, tids = {}, {}, []
    for line in text.splitlines():
        tag, *f = line.split()
        if tag == "T":
            tids.append(int(f[1]))
        elif tag == "E":
            ev[int(f[0])].append([int(f[1]), int(f[2]), int(f[3]), int(f[4]), None])
        elif tag == "X":
            ev[int(f[0])][-1][4] = tuple(int(x) for x in f[1:])
        elif tag == "S":
            side[int(f[0])] = (int(f[1]), bytes.fromhex(f[2]) if len(f) > 2 else b"")
        elif tag == "A":
            tid, *key = (int(x) for x in f)
            agg[(tid, *key[:4])] = tuple(key[4:])
    return tids, ev, side, agg


# the consumer process is started with a raw execve, which qemu-user does not follow: aarch64 runs the thread
@pytest.mark.parametrize("target,writer", [("native", "process"), ("native", "thread"), ("aarch64", "thread")])
@pytest.mark.parametrize("buffer_kb", ["4", "64"])
def test_native_writer_round_trip(tmp_path, buffer_kb, target, writer):
    cc, runner = _target(target)
    exe = _build_writer(tmp_path, cc, consumer=writer == "process")
    out_dir = tmp_path / "trace"
    env = dict(os.environ, SIGMATRACE_OUTPUT_DIR=str(out_dir), SIGMATRACE_MODE="aggregate",
               SIGMATRACE_DROP_POLICY="block", SIGMATRACE_BUFFER_KB=buffer_kb, SIGMATRACE_CHUNKS="4",
               SIGMATRACE_WRITER=writer)
    nthreads, nevents = 4, 6000
    r = subprocess.run([*runner, str(exe), str(nthreads), str(nevents)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    tids, expected, side, agg = _parse_expected(r.stdout)
    assert len(tids) == nthreads

    files = list(out_dir.iterdir())
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    cap = read_capture(out_dir)
    assert cap.losses == [] and cap.warnings == []
    (proc,) = cap.processes
    assert proc.complete and proc.end["reason"] == "exit"
    assert proc.end["dropped_events"] == 0
    assert proc.header["format_version"] == 1 and proc.header["tracer"] == "native"
    assert int(proc.header["process_uid"], 16) == proc.uid
    assert proc.header["pid"] > 0 and proc.header["mode"] == "aggregate"
    assert proc.header["tsc_hz"] > 1e6

    # calibration pairs: START and END at least, bracketing and ordered
    cal = proc.calibration
    assert list(cal["point"][[0, -1]]) == [L.CALIB_START, L.CALIB_END]
    assert np.all(cal["tsc_before"] <= cal["tsc_after"])
    assert np.all(np.diff(cal["monotonic_raw_ns"].astype(np.int64)) >= 0)

    # events: per thread, in order, exactly what was recorded
    by_tid = {info["tid"]: idx for idx, info in proc.threads.items()}
    assert set(by_tid) == set(tids)
    ev = cap.events
    for tid in tids:
        mine = ev[cap.event_thread == by_tid[tid]]
        types = mine["type"]
        assert types[0] == E.value("THREAD_START") and mine["obj"][0] == tid
        assert types[-1] == E.value("THREAD_END")
        body = mine[1:-1]
        got, i = [], 0
        while i < len(body):
            rec = body[i]
            ext = None
            if i + 1 < len(body) and body[i + 1]["type"] == E.EXT:
                x = body[i + 1]
                ext = (int(x["tsc"]), int(x["aux"]), int(x["obj"]), int(x["arg"]))
                i += 1
            got.append([int(rec["type"]), int(rec["aux"]), int(rec["obj"]), int(rec["arg"]), ext])
            i += 1
        assert got == expected[tid]
        prim = body[body["type"] != E.EXT]["tsc"].astype(np.int64)
        assert np.all(np.diff(prim) >= 0), "timestamps go backwards within a thread"

    # side records of every kind, byte for byte
    assert {k: (v.kind, v.data) for k, v in proc.side.items()} == side
    kinds = {v.kind for v in proc.side.values()}
    assert kinds == {L.SIDE_STRING, L.SIDE_JSON, L.SIDE_PRM_COMMAND, L.SIDE_WQE_BYTES, L.SIDE_BLOB}
    prm = next(v for v in proc.side.values() if v.kind == L.SIDE_PRM_COMMAND)
    pin, pout = prm.prm()
    assert pin == bytes((i * 3) & 0xFF for i in range(40)) and pout == bytes(255 - i for i in range(24))
    head, body = next(v for v in proc.side.values() if v.kind == L.SIDE_WQE_BYTES).wqe()
    assert head["qpn"] == 0x1234 and head["first_wqe_index"] == 0xFFFE and head["num_wqebb"] == 2
    assert len(body) == 128

    # aggregates: records with the same key add up
    totals = defaultdict(lambda: [0, 0])
    for rec, tindex in zip(proc.aggregates, proc.aggregate_thread):
        tid = proc.threads[int(tindex)]["tid"]
        k = (tid, int(rec["type"]), int(rec["aux"]), int(rec["obj"]), int(rec["peer"]))
        totals[k][0] += int(rec["count"])
        totals[k][1] += int(rec["bytes"])
    assert {k: tuple(v) for k, v in totals.items()} == agg
