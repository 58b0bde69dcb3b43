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
    # tracer_hammer and tracer_dlsym stress the rings with a cheap recorded call, fi_cq_read on an empty CQ:
    # every one a record here (by default a run of them is recorded as its first and last call)
    env = dict(os.environ, LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out), SIGMATRACE_IDLE_POLLS="each")
    env.update({k: str(v) for k, v in kw.items()})
    return env


def cq_reads(cap, process_index=None):
    """fi_cq_read calls recorded (a coalesced run of empty ones counted by its polls)."""
    return cap.calls("OFI_CQ_READ", process_index)


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
                     SIGMATRACE_DROP_POLICY="maybe", SIGMATRACE_CHUNKS="-3", SIGMATRACE_FLUSH_MS="0",
                     SIGMATRACE_IDLE_POLLS="sometimes")
    r = subprocess.run([bins["tracer_hammer"], "-n", "1000"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "calls 1000" in r.stdout
    lines = r.stderr.strip().splitlines()
    for var in ("SIGMATRACE_MODE", "SIGMATRACE_BUFFER_KB", "SIGMATRACE_PROVIDERS", "SIGMATRACE_DROP_POLICY",
                "SIGMATRACE_CHUNKS", "SIGMATRACE_FLUSH_MS", "SIGMATRACE_IDLE_POLLS"):
        assert sum(var in l for l in lines) == 1, r.stderr
    assert all(l.startswith("sigmatrace: ") for l in lines)
    (p,) = read_capture(out).processes
    opts = p.header["options"]
    assert p.header["mode"] == "simple" and opts["buffer_kb"] == 64 and opts["chunks"] == 64
    assert opts["drop_policy"] == "drop" and opts["flush_ms"] == 100 and opts["idle_polls"] == "coalesce"
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


@needs
@pytest.mark.parametrize("writer", ["process", "thread"])
def test_idle_polls_coalesced(tmp_path, bins, writer):
    """Full mode, SIGMATRACE_IDLE_POLLS at its default (coalesce): each thread's 20,000 empty reads are one
    run, recorded as its first call and its last one, which counts the 19,999 after the first and carries the
    last call's own time; `each` writes all 20,000.  Both stand for the same calls."""
    threads, calls = 3, 20_000
    got = {}
    for polls in ("coalesce", "each"):
        out = tmp_path / polls
        r = subprocess.run([bins["tracer_hammer"], "-t", str(threads), "-n", str(calls)],
                           env=traced_env(out, SIGMATRACE_MODE="full", SIGMATRACE_IDLE_POLLS=polls,
                                          SIGMATRACE_WRITER=writer), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"calls {threads * calls}" in r.stdout, r.stdout + r.stderr
        cap = read_capture(out)
        (p,) = cap.processes
        assert p.complete and p.end["dropped_events"] == 0 and not p.end["open_idle_polls"], p.end
        assert cap.calls("OFI_CQ_READ") == threads * calls
        assert p.header["options"]["idle_polls"] == polls
        got[polls] = t = cap.table("OFI_CQ_READ")
        assert (t["returned"] == 0).all() and (t["requested"] == 4).all()
    t = got["coalesce"]
    assert len(t["tsc"]) == 2 * threads
    for th in np.unique(t["thread"]).tolist():
        first, last = np.flatnonzero(t["thread"] == th)
        assert (t["polls"][first], t["polls"][last]) == (0, calls - 1)
        assert t["tsc"][first] < t["tsc"][last]
    e = got["each"]
    assert len(e["tsc"]) == threads * calls and not e["polls"].any()


@needs
def test_idle_run_open_at_exit_is_counted(tmp_path, bins):
    """SIGTERM ends the process while the hammer threads still poll: their open runs cannot be written by
    them; the END record counts each one's calls after its first (open_idle_polls), the first is in the
    trace."""
    out = tmp_path / "t"
    p = subprocess.Popen([bins["tracer_hammer"], "-t", "2", "-n", "2000000000", "-k", "20000", "-a", "sleep"],
                         env=traced_env(out, SIGMATRACE_MODE="full", SIGMATRACE_IDLE_POLLS="coalesce"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.complete, p.end
    t = cap.table("OFI_CQ_READ")
    open_runs = {int(k): int(v) for k, v in p.end["open_idle_polls"].items()}
    assert len(open_runs) == 2 and min(open_runs.values()) >= 1, p.end
    for th in open_runs:            # the run's first call is recorded, its end never came
        assert np.count_nonzero(t["thread"] == th) == 1 and t["polls"][t["thread"] == th][0] == 0


@needs
@pytest.mark.parametrize("writer", [None, "process", "thread"])
def test_run_writer_option(tmp_path, bins, writer):
    """`sigmatrace run --writer` chooses who writes the files (default: the consumer process); the header's
    options say which one did, and the trace is the same: complete, every call."""
    out = tmp_path / "t"
    r = _run_cli(["-o", str(out), "--mode", "full", *(["--writer", writer] if writer else []), "--",
                  bins["tracer_hammer"], "-t", "2", "-n", "10000"])
    assert r.returncode == 0, r.stderr
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.complete and p.header["options"]["writer"] == (writer or "process")
    # every call: each thread's 10,000 empty reads are one run, recorded as its first and last call
    assert cq_reads(cap) == 20000 and cap.count_by_type()["OFI_CQ_READ"] == 4


SIGEXIT = _native.find("tracer_sigexit")


@pytest.mark.skipif(LIB is None or SIGEXIT is None, reason="needs libsigmatrace.so and tracer_sigexit (emulated HCA)")
@pytest.mark.parametrize("loop,threads", [("side", 1), ("side", 3), ("header", 1)])
def test_exit_from_signal_handler_never_hangs(tmp_path, loop, threads):
    """Issue 12 finding 3: a SIGALRM handler calls _exit while the interrupted thread holds one of the
    tracer's locks (the side lock while a 120 KiB PRM record is copied, or the identity lock while the NIC
    list is published).  The _exit path takes nothing it cannot have: bounded tries, no joins, so it never
    hangs, and the trace it leaves is readable and ends with END (records that were still in the shared
    side buffer, behind a lock the interrupted thread holds, are counted lost)."""
    from native_util import cleanup_fabric, emu_env, new_fabric

    for it in range(12):
        fab = new_fabric()
        out = tmp_path / f"t{it}"
        env = emu_env(fab, 0x21, LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out), SIGMATRACE_MODE="full")
        after = 3000 + 2500 * it
        try:
            r = subprocess.run([SIGEXIT, "--loop", loop, "--after-us", str(after), "--threads", str(threads)], env=env,
                               capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"iteration {it}: the _exit in the signal handler hung (timer {after} us)")
        finally:
            cleanup_fabric(fab)
        assert r.returncode == 7 and "ARMED" in r.stdout, (r.returncode, r.stdout, r.stderr)
        (p,) = read_capture(out).processes
        assert p.header is not None and p.complete and p.end["reason"] == "exit", it


_FORK_EXEC = """
import ctypes, os, sys
lib = ctypes.CDLL(sys.argv[1])
if sys.argv[2] == "mark":
    lib.sigmatrace_mark(b"parent")
pid = os.fork()
if pid == 0:
    if sys.argv[2] == "mark":
        lib.sigmatrace_mark(b"child before exec")
    os.execv("/bin/true", ["true"])
os.waitpid(pid, 0)
"""


@pytest.mark.skipif(LIB is None, reason="needs build/dev/libsigmatrace.so")
@pytest.mark.parametrize("eager,mark", [("1", "none"), ("0", "mark"), ("1", "mark")])
def test_fork_exec_leaves_only_complete_files(tmp_path, eager, mark):
    """Issue 12 finding 10: a forked child that execs (a shell, subprocess) skips atexit, so a trace it had open
    never got END -- with SIGMATRACE_EAGER=1 every such child opened one at fork.  Now a fork child of an eager
    process opens its file on its first event (or at exit), not at fork, and exec ends an open trace with END
    (reason "exec").  Every file written is complete; the exec'd /bin/true writes its own (eager)."""
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-c", _FORK_EXEC, str(LIB), mark],
                       env=traced_env(out, SIGMATRACE_EAGER=eager), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    files = sorted(out.glob("*.trace"))
    procs = []
    for f in files:  # every file: one process, header and END (an empty file is a trace without either)
        ps = read_capture(f).processes
        assert len(ps) == 1 and ps[0].header is not None and ps[0].complete, (f.name, f.stat().st_size)
        procs.append(ps[0])
    reasons = sorted(p.end["reason"] for p in procs)
    if mark == "mark":  # the child recorded before its exec: its trace ends there
        assert reasons.count("exec") == 1, reasons
    n_true = sum(1 for p in procs if p.header["exe"].endswith("/true"))
    assert n_true == (1 if eager == "1" else 0)
    assert len(procs) == 1 + (mark == "mark") + (eager == "1"), [p.header["exe"] for p in procs]


HAVE_UCX_H = Path("/usr/include/ucp/api/ucp.h").exists()


@pytest.fixture(scope="module")
def review(tmp_path_factory):
    """native/tests/review_client.c and the stand-ins of review_stubs.c (one shared object per library)."""
    if CC is None or LIB is None or not HAVE_OFI or not HAVE_UCX_H:
        pytest.skip("needs a C compiler, libsigmatrace.so and the libfabric and UCX headers")
    d = tmp_path_factory.mktemp("review")
    src = ROOT / "native" / "tests"
    (d / "cuda").mkdir()
    builds = [[CC, "-O1", "-o", str(d / "review_client"), str(src / "review_client.c"), "-ldl"],
              [CC, "-shared", "-fPIC", "-DSTUB_UCX", "-o", str(d / "libucpstub.so"), str(src / "review_stubs.c")],
              [CC, "-shared", "-fPIC", "-DSTUB_OFI", "-o", str(d / "libofistub.so"), str(src / "review_stubs.c")],
              [CC, "-shared", "-fPIC", "-DSTUB_CUDA", "-Wl,-soname,libcuda.so.1", "-o", str(d / "cuda" / "libcuda.so.1"),
               str(src / "review_stubs.c")]]
    for cmd in builds:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    return d


def _review(review, tmp_path, *args):
    out = tmp_path / "t"
    env = traced_env(out, SIGMATRACE_MODE="full", LD_LIBRARY_PATH=str(review / "cuda"))
    r = subprocess.run([str(review / "review_client"), *args], env=env, capture_output=True, text=True, timeout=60)
    return r, out


def test_ucp_ep_create_reads_no_more_address_than_there_is(review, tmp_path):
    """Review (a): UCP_EP_CREATE recorded remote_address_prefix as 24 bytes of params->address whatever its
    length (UCX does not give it); an 8-byte address that ends at a PROT_NONE page crashed the program.  The
    prefix holds at most 24 bytes and never more than the memory mapped there."""
    r, out = _review(review, tmp_path, "ucx", str(review / "libucpstub.so"))
    assert r.returncode == 0 and "OK ucx" in r.stdout, (r.returncode, r.stdout, r.stderr)
    cap = read_capture(out)
    t = cap.table("UCP_EP_CREATE")
    js = [cap.side_record(0, int(s)).json() for s in t["side_id"]]
    assert [j["remote_address_prefix"] for j in js] == ["a0a1a2a3a4a5a6a7", bytes(range(24)).hex()]


def test_fi_fabric_names_never_break_the_json(review, tmp_path):
    """Review (b): fi_fabric's record put application-supplied names into a 512-byte JSON buffer without
    checking for overflow: a long fabric name left a side record that is not JSON.  Names are cut (marked
    truncated) and the record is always valid JSON."""
    r, out = _review(review, tmp_path, "ofi", str(review / "libofistub.so"))
    assert r.returncode == 0 and "OK ofi" in r.stdout, (r.returncode, r.stdout, r.stderr)
    cap = read_capture(out)
    t = cap.table("OFI_FABRIC")
    j = cap.side_record(0, int(t["side_id"][0])).json()
    assert j["truncated"] is True and j["name"].startswith('nnnnn"nn') and j["provider"].startswith("ppp")


def test_cuda_pointer_attributes_recorded_full_width(review, tmp_path):
    """Review (c): CU_POINTER_GET_ATTRIBUTE recorded 4 bytes of the 8-byte attributes cuda.h added after the
    first ones (MEMPOOL_HANDLE, MAPPING_SIZE, MAPPING_BASE_ADDR, MEMORY_BLOCK_ID) and of P2P_TOKENS' token, and
    no value at all for cuPointerGetAttributes.  The stub answers every attribute with a 64-bit pattern
    written at its documented width."""
    # the stub driver loaded globally, as a program that uses the driver API has it: dlsym(RTLD_DEFAULT) then
    # hands out the tracer's wrapper (for a library not loaded globally it answers NULL, as untraced)
    r, out = _review(review, tmp_path, "cuda", str(review / "cuda" / "libcuda.so.1"))
    assert r.returncode == 0 and "OK cuda" in r.stdout, (r.returncode, r.stdout, r.stderr)
    t = read_capture(out).table("CU_POINTER_GET_ATTRIBUTE")
    got = [(int(a), int(v)) for a, v in zip(t["attribute"], t["value"])]
    eight = {1, 3, 4, 5, 7, 11, 12, 17, 18, 19, 20}
    want = [(a, 0x1122334455667788 if a in eight else 0x55667788) for a in range(1, 22)]
    want += [(a, 0x1122334455667788) for a in (17, 18, 19, 20)]
    assert got == want




def _threads_of_sleeping_hammer(bins, env):
    """The number of threads of a single-threaded tracer_hammer (-t 0: main thread only) once it has set
    up its fabric (recorded: the trace is active) and sleeps."""
    proc = subprocess.Popen([bins["tracer_hammer"], "-t", "0", "-a", "sleep", "-k", "0"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        return len(os.listdir(f"/proc/{proc.pid}/task"))
    finally:
        proc.kill()
        proc.wait()


@needs
@pytest.mark.parametrize("mode", ["simple", "full"])
def test_single_threaded_program_stays_single_threaded(tmp_path, bins, mode):
    """Host-only tracing adds no thread by default: a thread makes glibc leave its single-threaded fast paths
    for good (mutexes, stdio), which changes the program's cost before anything is recorded.  The default
    writer is the consumer process."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("SIGMATRACE_WRITER", None)
    assert _threads_of_sleeping_hammer(bins, env) == 1  # the untraced program is single-threaded
    out = tmp_path / "t"
    env = traced_env(out, SIGMATRACE_MODE=mode)
    env.pop("SIGMATRACE_WRITER", None)
    assert _threads_of_sleeping_hammer(bins, env) == 1
    time.sleep(0.3)  # the killed program's consumer writes what it left
    (p,) = read_capture(out).processes  # and it was traced
    assert p.header["options"]["writer"] == "process"


@needs
def test_writer_thread_mode_is_kept(tmp_path, bins):
    """SIGMATRACE_WRITER=thread keeps the in-process writer thread (the process has one more thread) and
    writes the same trace: no loss at default buffers, END."""
    out = tmp_path / "t"
    assert _threads_of_sleeping_hammer(bins, traced_env(out, SIGMATRACE_WRITER="thread")) == 2
    out2 = tmp_path / "t2"
    r = subprocess.run([bins["tracer_hammer"], "-t", "2", "-n", "20000"],
                       env=traced_env(out2, SIGMATRACE_MODE="full", SIGMATRACE_WRITER="thread"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (p,) = read_capture(out2).processes
    assert p.complete and p.end["dropped_events"] == 0 and cq_reads(read_capture(out2)) == 40000


# ---- the consumer-process writer (SIGMATRACE_WRITER=process, issue 20 part 1) -------------------------------

PROCESS = {"SIGMATRACE_WRITER": "process"}  # the default, said explicitly (a run that sets it stays a test of it)


def _consumers_of(pid):
    """The pids of the sigmatrace-consumer processes that write the trace of `pid` (argv: ... PIDFD PID)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"sigmatrace-consumer") and len(argv) >= 5 and argv[4] == str(pid).encode():
            found.append(int(d.name))
    return found


@needs
@pytest.mark.parametrize("mode", ["simple", "full"])
def test_single_threaded_program_stays_single_threaded_with_the_consumer_process(tmp_path, bins, mode):
    """With the consumer process as writer, host-only tracing adds no thread to the traced process (its
    /proc/<pid>/task has one entry), and the trace is written, header first, without END (killed)."""
    out = tmp_path / "t"
    assert _threads_of_sleeping_hammer(bins, traced_env(out, SIGMATRACE_MODE=mode, **PROCESS)) == 1
    time.sleep(0.3)  # the killed program's consumer writes what it left
    (p,) = read_capture(out).processes
    assert p.header is not None and p.header["options"]["mode"] == mode and not p.complete


@needs
def test_consumer_process_sigkill_keeps_everything_committed(tmp_path, bins):
    """SIGKILL with no periodic flush due (FLUSH_MS = 10 min): the rings are shared memory, so the consumer
    writes everything the program committed -- its threads' calls and the main thread's partly filled chunk
    (OFI_FABRIC, OFI_DOMAIN), which the writer thread would have lost."""
    out = tmp_path / "t"
    calls = 30000
    proc = subprocess.Popen([bins["tracer_hammer"], "-t", "2", "-n", str(calls), "-a", "sleep", "-k", str(calls)],
                            env=traced_env(out, SIGMATRACE_MODE="full", SIGMATRACE_FLUSH_MS=600000, **PROCESS),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    consumers = _consumers_of(proc.pid)
    assert len(consumers) == 1
    time.sleep(0.5)  # thread 1 finishes too
    proc.kill()
    proc.wait(timeout=10)
    for _ in range(100):  # the consumer sees the death (pidfd) and ends
        if not _consumers_of(proc.pid):
            break
        time.sleep(0.05)
    assert not _consumers_of(proc.pid)
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.header is not None and not p.complete
    by = cap.count_by_type()
    assert cq_reads(cap) == 2 * calls
    assert by["OFI_FABRIC"] == 1 and by["OFI_DOMAIN"] == 1 and by["OFI_CQ_OPEN"] == 2


@needs
def test_consumer_process_shares_the_programs_session_not_its_process_group(tmp_path, bins):
    """The consumer is in the program's session (a new session is a new scheduler autogroup, where the consumer
    was measured starved for seconds beside the program's busy threads and its pollers' side lanes overflowed)
    but in a process group of its own (a terminal's ^C and `kill -- -PGID` of the program's group reach the
    program, which asks for its END; they never kill the consumer first)."""
    out = tmp_path / "t"
    proc = subprocess.Popen([bins["tracer_hammer"], "-D", "-t", "1", "-n", "10", "-a", "sleep", "-k", "10"],
                            env=traced_env(out, SIGMATRACE_MODE="full", **PROCESS), stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        (consumer,) = _consumers_of(proc.pid)
        assert os.getsid(consumer) == os.getsid(proc.pid) == proc.pid
        assert os.getpgid(consumer) == consumer != os.getpgid(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)  # the program's group: the program, not its consumer
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
    for _ in range(100):
        if not _consumers_of(proc.pid):
            break
        time.sleep(0.05)
    (p,) = read_capture(out).processes
    assert p.complete and p.end["signal"] == signal.SIGTERM and cq_reads(read_capture(out)) == 10


@needs
def test_killed_consumer_never_blocks_the_program_and_drops_are_counted(tmp_path, bins):
    """The consumer is SIGKILLed while two threads record into small rings: the program runs on and exits with
    its own status, its rings fill and every event that found no room is counted; at the end the tracer starts
    a new consumer, which writes what the rings still hold and END, so recorded + dropped = issued."""
    out = tmp_path / "t"
    threads, calls = 2, 400_000
    proc = subprocess.Popen([bins["tracer_hammer"], "-t", str(threads), "-n", str(calls)],
                            env=traced_env(out, SIGMATRACE_MODE="full", SIGMATRACE_BUFFER_KB=4, SIGMATRACE_CHUNKS=4,
                                           SIGMATRACE_DROP_POLICY="block", **PROCESS),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    consumers = []
    for _ in range(400):
        consumers = _consumers_of(proc.pid)
        if consumers or proc.poll() is not None:
            break
        time.sleep(0.005)
    assert len(consumers) == 1, "the consumer was not found while the program ran"
    os.kill(consumers[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert f"calls {threads * calls}" in stdout
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.complete and p.end["reason"] == "exit"
    dropped = p.end["dropped_events"]
    by = cap.count_by_type()
    issued = threads * calls + threads + 2  # cq reads, one CQ_OPEN per thread, FABRIC + DOMAIN
    recorded = by.get("OFI_CQ_READ", 0) + by["OFI_CQ_OPEN"] + by["OFI_FABRIC"] + by["OFI_DOMAIN"]
    assert dropped > 0 and recorded + dropped == issued


_SIGCHLD_PROBE = """
import ctypes, os, signal, sys, time
got = []
signal.signal(signal.SIGCHLD, lambda *a: got.append(1))
lib = ctypes.CDLL(sys.argv[1])
lib.sigmatrace_mark(b"start")  # the first event: the trace and its consumer start here
time.sleep(0.2)
try:
    os.waitpid(-1, os.WNOHANG)
    children = "yes"
except ChildProcessError:
    children = "none"
print("sigchld", len(got), "children", children, "active", lib.sigmatrace_active())
"""


@pytest.mark.skipif(LIB is None, reason="needs libsigmatrace.so")
def test_consumer_process_is_never_the_programs_child(tmp_path):
    """The consumer is started without a trace in the program's signals: no SIGCHLD (also not when the short-lived
    intermediate exits), and wait(-1) finds no child of the program's own."""
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-c", _SIGCHLD_PROBE, str(LIB)], env=traced_env(out, **PROCESS),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "sigchld 0 children none active 1" in r.stdout, r.stdout
    (p,) = read_capture(out).processes
    assert p.complete and "start" in [cap_text for cap_text in _marks(out)]


def _marks(out):
    cap = read_capture(out)
    t = cap.table("MARK")
    return [cap.side_record(0, int(s)).text() for s in t["side_id"]]
