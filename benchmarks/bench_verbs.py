"""Tracer overhead on the emulated ibv_rc_pingpong, and the emulator's own baseline.

Each benchmark measures side by side in one run: untraced and traced pingpong
pairs alternate (R rounds, medians), on the same emulated fabric, and the
ratio traced/untraced of the program's own "usec/iter" (a round trip: one
SEND and one RECV completion per side) is reported per mode in extra_info.
The emulator baseline reports its message rate and round-trip latency so
later numbers (real NICs, other modes) have a reference.

    pytest benchmarks/bench_verbs.py --benchmark-only -s
"""
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from sigmatrace import _native

pytestmark = pytest.mark.sim

VERBS = _native.find("libibverbs.so.1")
TRACER = _native.tracer_library()
PINGPONG = "/usr/bin/ibv_rc_pingpong"
ITERS = int(os.environ.get("ST_BENCH_VERBS_ITERS", "20000"))
SIZE = 64
ROUNDS = int(os.environ.get("ST_BENCH_VERBS_ROUNDS", "5"))

if VERBS is None or TRACER is None or not Path(PINGPONG).is_file():
    pytest.skip("needs the emulated HCA, libsigmatrace.so and ibv_rc_pingpong", allow_module_level=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port):
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for ln in Path(f).read_text().splitlines()[1:]:
                p = ln.split()
                if p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == port:
                    return True
        except OSError:
            pass
    return False


def _env(fabric, lid, mode, out):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["LD_LIBRARY_PATH"] = str(VERBS.parent)
    env["SIGMATRACE_EMU_FABRIC"] = fabric
    env["SIGMATRACE_EMU_LID"] = str(lid)
    if mode:
        env["LD_PRELOAD"] = str(TRACER)
        env["SIGMATRACE_MODE"] = mode
        env["SIGMATRACE_OUTPUT_DIR"] = out
        env["SIGMATRACE_PROVIDERS"] = "ibv,mlx5"
    return env


def pingpong(mode=None, iters=ITERS, size=SIZE):
    """One server+client run; returns the client's usec/iter."""
    fabric = "b" + uuid.uuid4().hex[:10]
    out = tempfile.mkdtemp(prefix="stbench-")
    port = str(_free_port())
    argv = [PINGPONG, "-s", str(size), "-n", str(iters), "-p", port]
    try:
        srv = subprocess.Popen(argv, env=_env(fabric, 1, mode, out), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while not _listening(int(port)):
            if srv.poll() is not None or time.monotonic() - t0 > 10:
                srv.kill()
                raise RuntimeError("pingpong server did not start")
            time.sleep(0.01)
        cli = subprocess.run(argv + ["localhost"], env=_env(fabric, 2, mode, out), capture_output=True,
                             text=True, timeout=120)
        srv.communicate(timeout=60)
        m = re.search(r"(\d+) iters in [\d.]+ seconds = ([\d.]+) usec/iter", cli.stdout)
        if cli.returncode or not m:
            raise RuntimeError(f"pingpong failed: {cli.stdout}{cli.stderr}")
        return float(m[2])
    finally:
        shutil.rmtree(out, ignore_errors=True)
        for p in Path("/dev/shm").glob(f"sigmatrace-emu.{fabric}.*"):
            p.unlink(missing_ok=True)


def test_emulator_baseline(benchmark):
    """The emulated HCA's own round-trip latency and message rate (untraced)."""
    samples = []

    def once():
        samples.append(pingpong(None))

    benchmark.pedantic(once, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    us = statistics.median(samples)
    benchmark.extra_info.update(
        iters=ITERS, size=SIZE, rtt_usec=us, one_way_latency_usec=us / 2,
        # each iteration moves one message each way
        msg_rate_per_sec=2e6 / us, samples_usec=samples)
    print(f"\nemulator: {us:.2f} usec/round trip, {2e6 / us:,.0f} msg/s ({ITERS} iters, {SIZE} B)")


@pytest.mark.parametrize("mode", ["aggregate", "simple", "full"])
def test_tracer_overhead(benchmark, mode):
    """Traced vs untraced pingpong, alternating in one run: ratio per mode."""
    base, traced = [], []

    def once():
        base.append(pingpong(None))
        traced.append(pingpong(mode))

    benchmark.pedantic(once, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    b, t = statistics.median(base), statistics.median(traced)
    ratio = t / b
    # per traced call: each iteration is 1 post_send + ~1 post_recv + polls per side
    benchmark.extra_info.update(mode=mode, iters=ITERS, size=SIZE, untraced_usec_per_iter=b,
                                traced_usec_per_iter=t, ratio=ratio, added_usec_per_iter=t - b,
                                untraced_samples=base, traced_samples=traced)
    print(f"\n{mode:9s}: untraced {b:.2f} us/iter, traced {t:.2f} us/iter, ratio {ratio:.3f}")
    assert ratio < 3.0, f"{mode} mode more than triples the pingpong round trip"
