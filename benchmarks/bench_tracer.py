"""Tracer overhead (F23), measured side by side in one run.

* Recording cost per intercepted call and mode: (traced - untraced) ns per
  call of fi_cq_read() on an empty CQ, timed inside native/tests/
  tracer_hammer.c with clock_gettime (best of 5 repetitions; the runs of all
  configurations are interleaved and the minimum per configuration kept).
  The untraced baseline runs with an idle extra thread (-i): the tracer's
  writer thread makes every traced process multi-threaded, which by itself
  makes glibc mutexes (used inside libfabric's CQ read) ~3x slower; that
  penalty is reported separately as `multithread_penalty_ns`.
  Simple mode leaves the CQ table alone (polling is not recorded), so its
  cost is the unwrapped call; full mode records one 24-byte event per call
  (the same path simple mode uses for every operation it records).
  Goals: simple <= 15 ns, aggregate <= 5 ns.
* fi_pingpong (tcp, msg endpoints) latency at 8 B and bandwidth at 1 MiB,
  traced (simple, full) / untraced; ucx_perftest (tcp) likewise.  Untraced,
  simple and full runs are interleaved, REPS times each; ratios are of the
  medians, and every sample is kept in extra_info.
* Bytes per event on disk in simple mode: marginal file growth per recorded
  event between a short and a long fi_pingpong run (fixed headers excluded),
  and whole-file bytes per event of the long run.

    PYTHONPATH=. python -m pytest benchmarks/bench_tracer.py -s -p no:cacheprovider
"""
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from statistics import median

import pytest

from sigmatrace import _native
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
LIB = _native.tracer_library()
CC = shutil.which("gcc") or shutil.which("cc")
FI_PINGPONG = shutil.which("fi_pingpong")
PERFTEST = shutil.which("ucx_perftest")
needs = pytest.mark.skipif(LIB is None or CC is None or FI_PINGPONG is None,
                           reason="needs libsigmatrace.so, a C compiler and libfabric-bin")


REPS = int(os.environ.get("SIGMATRACE_BENCH_REPS", "5"))


def _ratio(samples, mode):
    """Median of the traced runs over the median of the untraced ones."""
    return round(median(samples[mode]) / median(samples[None]), 4)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hammer(tmp_path_factory):
    exe = tmp_path_factory.mktemp("bench") / "tracer_hammer"
    r = subprocess.run([CC, "-O2", "-o", str(exe), str(ROOT / "native" / "tests" / "tracer_hammer.c"), "-lfabric",
                        "-lpthread"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(exe)


def _ns_per_call(hammer, tmp, mode, idle=True, calls=2_000_000):
    env = dict(os.environ)
    if mode:
        env.update(LD_PRELOAD=str(LIB), SIGMATRACE_MODE=mode, SIGMATRACE_OUTPUT_DIR=str(tmp / f"t-{mode}"))
    cmd = [hammer, "-p", "udp", "-a", "time", "-n", str(calls)] + (["-i"] if idle else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    return float(re.search(r"ns_per_call ([\d.]+)", out).group(1))


@needs
def test_recording_cost_per_call(benchmark, hammer, tmp_path):
    configs = {"untraced_1thread": (None, False), "untraced": (None, True), "simple": ("simple", True),
               "aggregate": ("aggregate", True), "full": ("full", True)}
    best = {k: float("inf") for k in configs}
    for _ in range(5):
        for name, (mode, idle) in configs.items():
            best[name] = min(best[name], _ns_per_call(hammer, tmp_path, mode, idle))
    benchmark.pedantic(_ns_per_call, args=(hammer, tmp_path, "full", True, 500_000), rounds=1, iterations=1)
    info = {
        "untraced_ns_per_call": round(best["untraced"], 2),
        "simple_ns": round(best["simple"] - best["untraced"], 2),
        "aggregate_ns": round(best["aggregate"] - best["untraced"], 2),
        "full_ns_per_event": round(best["full"] - best["untraced"], 2),
        "multithread_penalty_ns": round(best["untraced"] - best["untraced_1thread"], 2),
    }
    benchmark.extra_info.update(info)
    print("\nrecording cost per fi_cq_read call (traced - untraced):", info)
    assert info["full_ns_per_event"] < 200  # sanity; goals are reported, not enforced on shared CI cores


def _pingpong(size, iters, mode=None, out=None):
    env = dict(os.environ)
    if mode:
        env.update(LD_PRELOAD=str(LIB), SIGMATRACE_MODE=mode, SIGMATRACE_OUTPUT_DIR=str(out))
    port = free_port()
    common = ["-p", "tcp", "-e", "msg", "-I", str(iters), "-S", str(size)]
    srv = subprocess.Popen([FI_PINGPONG, *common, "-B", str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    cli = subprocess.run([FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"], env=env, capture_output=True,
                         text=True, timeout=60)
    srv.wait(timeout=60)
    line = [l.split() for l in cli.stdout.splitlines() if l.split() and l.split()[0][:1].isdigit()][-1]
    return float(line[5]), float(line[6])  # MB/sec, usec/xfer


@needs
def test_pingpong_overhead(benchmark, tmp_path):
    lat = {None: [], "simple": [], "full": []}
    bw = {None: [], "simple": [], "full": []}
    for rep in range(REPS):
        for mode in lat:
            lat[mode].append(_pingpong(8, 5000, mode, tmp_path / f"l{rep}{mode}")[1])
            bw[mode].append(_pingpong(1 << 20, 2000, mode, tmp_path / f"b{rep}{mode}")[0])
    benchmark.pedantic(_pingpong, args=(8, 1000, "simple", tmp_path / "bench"), rounds=1, iterations=1)
    info = {
        "lat8_untraced_us": median(lat[None]),
        "lat8_ratio_simple": _ratio(lat, "simple"),
        "lat8_ratio_full": _ratio(lat, "full"),
        "bw1m_untraced_MBps": median(bw[None]),
        "bw1m_ratio_simple": _ratio(bw, "simple"),
        "bw1m_ratio_full": _ratio(bw, "full"),
        "samples_lat8_us": {str(k): v for k, v in lat.items()},
        "samples_bw1m_MBps": {str(k): v for k, v in bw.items()},
    }
    benchmark.extra_info.update(info)
    print("\nfi_pingpong tcp traced/untraced:", info)


def _perftest(test, size, iters, mode=None, out=None):
    env = dict(os.environ, UCX_TLS="tcp")
    if mode:
        env.update(LD_PRELOAD=str(LIB), SIGMATRACE_MODE=mode, SIGMATRACE_OUTPUT_DIR=str(out))
    port = free_port()
    srv = subprocess.Popen([PERFTEST, "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    cli = subprocess.run([PERFTEST, "-p", str(port), "-t", test, "-n", str(iters), "-s", str(size), "-w", "100",
                          "127.0.0.1"], env=env, capture_output=True, text=True, timeout=60)
    srv.wait(timeout=60)
    f = [l.split() for l in cli.stdout.splitlines() if l.startswith("Final:")][0]
    return float(f[3]), float(f[5])  # average latency usec, average MB/s


@pytest.mark.skipif(PERFTEST is None or LIB is None, reason="needs ucx_perftest and libsigmatrace.so")
def test_ucx_perftest_overhead(benchmark, tmp_path):
    lat = {None: [], "simple": [], "full": []}
    bw = {None: [], "simple": [], "full": []}
    for rep in range(REPS):
        for mode in lat:
            lat[mode].append(_perftest("tag_lat", 8, 5000, mode, tmp_path / f"l{rep}{mode}")[0])
            bw[mode].append(_perftest("tag_bw", 1 << 20, 2000, mode, tmp_path / f"b{rep}{mode}")[1])
    benchmark.pedantic(_perftest, args=("tag_lat", 8, 1000, "simple", tmp_path / "bench"), rounds=1, iterations=1)
    info = {
        "tag_lat8_untraced_us": median(lat[None]),
        "tag_lat8_ratio_simple": _ratio(lat, "simple"),
        "tag_lat8_ratio_full": _ratio(lat, "full"),
        "tag_bw1m_untraced_MBps": median(bw[None]),
        "tag_bw1m_ratio_simple": _ratio(bw, "simple"),
        "tag_bw1m_ratio_full": _ratio(bw, "full"),
        "samples_lat8_us": {str(k): v for k, v in lat.items()},
        "samples_bw1m_MBps": {str(k): v for k, v in bw.items()},
    }
    benchmark.extra_info.update(info)
    print("\nucx_perftest tcp traced/untraced:", info)


@needs
def test_bytes_per_event_simple(benchmark, tmp_path):
    def run(iters):
        out = tmp_path / f"bpe{iters}"
        _pingpong(8, iters, "simple", out)
        cap = read_capture(out)
        events = sum(int(p.end["events"]) for p in cap.processes)
        size = sum(f.stat().st_size for f in out.iterdir())
        return events, size

    e1, s1 = run(500)
    e2, s2 = benchmark.pedantic(run, args=(20000,), rounds=1, iterations=1)
    info = {"bytes_per_event_marginal": round((s2 - s1) / (e2 - e1), 2),
            "bytes_per_event_whole_file": round(s2 / e2, 2), "events": e2}
    benchmark.extra_info.update(info)
    print("\nsimple mode bytes per event on disk:", info)
    assert info["bytes_per_event_marginal"] < 30
