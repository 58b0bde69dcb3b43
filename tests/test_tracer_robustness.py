"""Recorder core robustness (F4): drops, signals, fork, dlsym injection,
programs that use no traced library, bad configuration, `sigmatrace run`.

The C clients (native/tests/tracer_hammer.c, tracer_dlsym.c) are compiled
here with the system compiler; tracer_hammer hammers fi_cq_read() on an
empty CQ, which full mode records once per call.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sigmatrace import _native
from sigmatrace.format import events as E
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
LIB = _native.tracer_library()
CC = shutil.which("gcc") or shutil.which("cc")
HAVE_OFI = Path("/usr/include/rdma/fabric.h").exists()
needs = pytest.mark.skipif(LIB is None or CC is None or not HAVE_OFI,
                           reason="needs build/dev/libsigmatrace.so, a C compiler and libfabric headers")


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    d = tmp_path_factory.mktemp("tracer-bins")
    out = {}
    for name, libs in (("tracer_hammer", ["-lfabric", "-lpthread"]), ("tracer_dlsym", ["-ldl"])):
        exe = d / name
        r = subprocess.run([CC, "-O2", "-o", str(exe), str(ROOT / "native" / "tests" / f"{name}.c"), *libs],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out[name] = str(exe)
    return out


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    # crash handlers of some libfabric providers (psm2) drop backtrace files in the cwd
    monkeypatch.chdir(tmp_path)


def traced_env(out, **kw):
    env = dict(os.environ, LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out))
    env.update({k: str(v) for k, v in kw.items()})
    return env


def cq_reads(cap, process_index=None):
    t = cap.table("OFI_CQ_READ")
    if process_index is None:
        return len(t["cq"])
    return int(np.count_nonzero(t["process"] == process_index))


@needs
def test_no_loss_at_default_buffer_size(tmp_path, bins):
    out = tmp_path / "t"
    threads, calls = 4, 150_000
    r = subprocess.run([bins["tracer_hammer"], "-t", str(threads), "-n", str(calls)],
                       env=traced_env(out, SIGMATRACE_MODE="full"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.end["dropped_events"] == 0
    assert cq_reads(cap) == threads * calls
    # every thread's calls are in its own thread records
    t = cap.table("OFI_CQ_READ")
    counts = sorted(np.unique(t["thread"], return_counts=True)[1].tolist())
    assert counts == [calls] * threads


@needs
def test_tiny_buffer_reports_exact_drop_count(tmp_path, bins):
    out = tmp_path / "t"
    threads, calls = 3, 50_000
    r = subprocess.run([bins["tracer_hammer"], "-t", str(threads), "-n", str(calls)],
                       env=traced_env(out, SIGMATRACE_MODE="full", SIGMATRACE_BUFFER_KB=1, SIGMATRACE_CHUNKS=2),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cap = read_capture(out)
    (p,) = cap.processes
    dropped = p.end["dropped_events"]
    assert dropped > 0
    by = cap.count_by_type()
    issued = threads * calls + threads + 2  # cq reads, one CQ_OPEN per thread, FABRIC + DOMAIN
    recorded = by.get("OFI_CQ_READ", 0) + by["OFI_CQ_OPEN"] + by["OFI_FABRIC"] + by["OFI_DOMAIN"]
    assert recorded + dropped == issued
    # DROPS records sit where recording resumed (if it did); never more than the total
    assert cap.table("DROPS")["dropped"].sum() <= dropped
    assert sum(p.end["thread_drops"].values()) <= dropped


@needs
def test_sigkill_leaves_readable_trace(tmp_path, bins):
    out = tmp_path / "t"
    proc = subprocess.Popen([bins["tracer_hammer"], "-t", "2", "-n", "100000000", "-a", "sleep", "-k", "20000"],
                            env=traced_env(out, SIGMATRACE_MODE="full", SIGMATRACE_FLUSH_MS=50),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # several periodic flushes
    proc.kill()
    proc.wait(timeout=10)
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.header is not None and not p.complete  # no END chunk, but everything flushed is there
    assert cq_reads(cap) >= 20000
    assert len(p.calibration) >= 1


@needs
@pytest.mark.parametrize("action,sig", [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT)])
def test_fatal_signal_flushes_and_reraises(tmp_path, bins, action, sig):
    """Default disposition: write everything + END, then die of the same signal."""
    out = tmp_path / "t"
    r = subprocess.run([bins["tracer_hammer"], "-D", "-t", "1", "-n", "100000000", "-a", action, "-k", "30000"],
                       env=traced_env(out, SIGMATRACE_MODE="full"), capture_output=True, text=True, timeout=60)
    assert r.returncode == -sig  # the original disposition killed it
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.complete and p.end["reason"] == "signal" and p.end["signal"] == sig
    assert cq_reads(cap) >= 30000
    assert p.calibration["point"][-1] == 2  # END calibration


@needs
def test_fatal_signal_with_library_handler_is_chained(tmp_path, bins):
    """A library's own crash handler (libfabric's psm2 installs one) still runs,
    the program ends exactly as it would untraced, and the trace is readable."""
    cmd = [bins["tracer_hammer"], "-t", "1", "-n", "100000000", "-a", "segv", "-k", "30000"]
    base = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    out = tmp_path / "t"
    r = subprocess.run(cmd, env=traced_env(out, SIGMATRACE_MODE="full"), capture_output=True, text=True, timeout=60)
    assert r.returncode == base.returncode
    (p,) = read_capture(out).processes
    assert p.header is not None and cq_reads(read_capture(out)) >= 30000


@needs
def test_sigterm_flushes_and_exit_status_is_kept(tmp_path, bins):
    out = tmp_path / "t"
    proc = subprocess.Popen([bins["tracer_hammer"], "-D", "-n", "100000000", "-a", "sleep", "-k", "1000"],
                            env=traced_env(out, SIGMATRACE_MODE="full"), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    (p,) = read_capture(out).processes
    assert p.end["reason"] == "signal" and p.end["signal"] == signal.SIGTERM


@needs
def test_fork_child_gets_its_own_file(tmp_path, bins):
    out = tmp_path / "t"
    calls = 5000
    r = subprocess.run([bins["tracer_hammer"], "-t", "1", "-n", str(calls), "-a", "fork"],
                       env=traced_env(out, SIGMATRACE_MODE="full"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"child calls {calls}" in r.stdout
    files = sorted(out.iterdir())
    assert len(files) == 2
    cap = read_capture(out)
    pids = {p.header["pid"] for p in cap.processes}
    assert len(pids) == 2 and len({p.uid for p in cap.processes}) == 2
    child = next(p for p in cap.processes if p.header["ppid"] in pids)
    parent = next(p for p in cap.processes if p is not child)
    assert cq_reads(cap, child.index) == calls and cq_reads(cap, parent.index) == calls
    fork = cap.table("FORK")
    assert fork["child_pid"][fork["process"] == parent.index].tolist() == [child.header["pid"]]
    assert child.complete and parent.complete


@needs
def test_dlsym_injection(tmp_path, bins):
    out = tmp_path / "t"
    r = subprocess.run([bins["tracer_dlsym"]], env=traced_env(out, SIGMATRACE_MODE="full"), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and "reads 1000" in r.stdout, r.stderr
    cap = read_capture(out)
    by = cap.count_by_type()
    assert by["OFI_FABRIC"] == 1 and by["OFI_CQ_READ"] == 1000


@pytest.mark.skipif(LIB is None, reason="needs build/dev/libsigmatrace.so")
@pytest.mark.parametrize("cmd", [["/bin/true"], [sys.executable, "-c", "import sys; print('hi'); sys.exit(5)"],
                                 ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]])
def test_program_without_traced_libraries_runs_unchanged(tmp_path, cmd):
    base = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    out = tmp_path / "t"
    traced = subprocess.run(cmd, env=traced_env(out), capture_output=True, text=True, timeout=30)
    assert (traced.returncode, traced.stdout, traced.stderr) == (base.returncode, base.stdout, base.stderr)
    assert not out.exists()  # recording starts on first use: nothing used, nothing written


@needs
def test_bad_configuration_warns_and_uses_defaults(tmp_path, bins):
    out = tmp_path / "t"
    env = traced_env(out, SIGMATRACE_MODE="bogus", SIGMATRACE_BUFFER_KB="lots", SIGMATRACE_PROVIDERS="nope",
                     SIGMATRACE_DROP_POLICY="maybe", SIGMATRACE_CHUNKS="-3", SIGMATRACE_FLUSH_MS="0")
    r = subprocess.run([bins["tracer_hammer"], "-n", "1000"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "calls 1000" in r.stdout
    lines = r.stderr.strip().splitlines()
    for var in ("SIGMATRACE_MODE", "SIGMATRACE_BUFFER_KB", "SIGMATRACE_PROVIDERS", "SIGMATRACE_DROP_POLICY",
                "SIGMATRACE_CHUNKS", "SIGMATRACE_FLUSH_MS"):
        assert sum(var in l for l in lines) == 1, r.stderr
    assert all(l.startswith("sigmatrace: ") for l in lines)
    (p,) = read_capture(out).processes
    opts = p.header["options"]
    assert p.header["mode"] == "simple" and opts["buffer_kb"] == 64 and opts["chunks"] == 64
    assert opts["drop_policy"] == "drop" and opts["flush_ms"] == 100
    assert p.header["providers"] == ["ibv", "mlx5", "cuda", "ucx", "ofi", "nccl"]


def _run_cli(args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("LD_PRELOAD", None)
    return subprocess.run([sys.executable, "-m", "sigmatrace", "run", *args], env=env, capture_output=True, text=True,
                          timeout=60, **kw)


@pytest.mark.skipif(LIB is None, reason="needs build/dev/libsigmatrace.so")
def test_run_propagates_exit_status_and_signals(tmp_path):
    out = tmp_path / "t"
    r = _run_cli(["-o", str(out), "--", "/bin/sh", "-c", "echo $LD_PRELOAD; echo $SIGMATRACE_MODE; exit 7"])
    assert r.returncode == 7 and str(LIB) in r.stdout
    r = _run_cli(["-o", str(out), "--mode", "full", "--", "/bin/sh", "-c", "echo $SIGMATRACE_MODE; kill -TERM $$"])
    assert r.returncode == -signal.SIGTERM and r.stdout.strip() == "full"


@pytest.mark.skipif(LIB is None, reason="needs build/dev/libsigmatrace.so")
@pytest.mark.parametrize("args,msg", [(["--providers", "foo", "--", "true"], "unknown provider 'foo'"),
                                      (["--", "/no/such/program"], "command not found"),
                                      ([], "no command given")])
def test_run_errors_are_one_line(tmp_path, args, msg):
    r = _run_cli(["-o", str(tmp_path / "t")] + args)
    assert r.returncode in (2, 127)
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_run_without_library_is_a_clear_error(monkeypatch, tmp_path):
    from sigmatrace.cli import run as run_mod

    monkeypatch.setattr(run_mod._native, "tracer_library", lambda: None)
    args = run_mod.argparse.Namespace(output=str(tmp_path), mode=None, providers=None, buffer_kb=None, eager=False)
    with pytest.raises(run_mod.RunError, match="libsigmatrace.so was not found"):
        run_mod.build_env(args)


@needs
def test_run_end_to_end_with_hammer(tmp_path, bins):
    out = tmp_path / "t"
    r = _run_cli(["-o", str(out), "--mode", "aggregate", "--providers", "ofi", "--", bins["tracer_hammer"], "-t", "2",
                  "-n", "10000"])
    assert r.returncode == 0, r.stderr
    (p,) = read_capture(out).processes
    agg = p.aggregates[p.aggregates["type"] == E.value("OFI_CQ_READ")]
    assert int(agg["count"].sum()) == 20000 and p.header["launcher"] == "sigmatrace-run"
