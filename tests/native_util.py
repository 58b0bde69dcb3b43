"""Helpers of the tests that run native programs; no tests here.

Where the native build put the emulated HCA (native/emu), per-test emulated
fabrics, environments of emulated nodes, ephemeral TCP ports, and
server/client process pairs with bounded waits and cleanup.  Imported by
tests/test_emu_hca.py, tests/test_emu_ucx.py, tests/test_trace_verbs_support.py
and tests/test_tracer_{ofi,ucx}.py (tests/ is on sys.path under pytest).
"""
import functools
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sigmatrace import _native

VERBS = _native.find("libibverbs.so.1")
MLX5 = _native.find("libmlx5.so.1")
EMU_DIR = VERBS.parent if VERBS else None

needs_emu = pytest.mark.skipif(
    VERBS is None or MLX5 is None or MLX5.parent != EMU_DIR,
    reason="emulated HCA not built: libibverbs.so.1/libmlx5.so.1 not found in build/dev/emu "
    "(run `cmake -S native -B build/dev && cmake --build build/dev -j2`; needs rdma-core headers)",
)


def needs_bin(path):
    return pytest.mark.skipif(not Path(path).is_file(), reason=f"{path} not installed")


def traced_tool(tool, package):
    """(the tracer library, `tool` found on PATH, a skip marker unless both are there)."""
    lib, exe = _native.tracer_library(), shutil.which(tool)
    return lib, exe, pytest.mark.skipif(lib is None or exe is None,
                                        reason=f"needs build/dev/libsigmatrace.so and {tool} ({package})")


# ---------------------------------------------------------------------------
# emulated fabrics and nodes


def new_fabric(prefix="v"):
    """A fresh fabric name (SIGMATRACE_EMU_FABRIC): tests never share emulated state."""
    return prefix + uuid.uuid4().hex[:12]


def cleanup_fabric(name):
    """Remove a fabric's inboxes and the nodes' sysfs trees (native/emu/sysfs.c)."""
    for p in Path("/dev/shm").glob(f"sigmatrace-emu.{name}.*"):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
        except OSError:
            pass


def emu_env(fabric, lid, **extra):
    """Environment of one untraced emulated node (LID `lid` on `fabric`)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(EMU_DIR) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["SIGMATRACE_EMU_FABRIC"] = fabric
    env["SIGMATRACE_EMU_LID"] = str(lid)
    env.pop("LD_PRELOAD", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---------------------------------------------------------------------------
# the device files of an emulated node (native/emu/st-emu-ns)

EMU_NS = EMU_DIR / "st-emu-ns" if EMU_DIR else None


def emu_ns(argv):
    """argv run inside st-emu-ns: a private mount namespace with /dev/infiniband/uverbs0 and
    /sys/class/infiniband/<dev>, which UCX needs before it uses a device (docs/emulator.md)."""
    return [str(EMU_NS), *map(str, argv)]


@functools.lru_cache(maxsize=None)
def emu_ns_problem():
    """None when st-emu-ns works here, else why not (no script, no unshare, no overlayfs, no permission)."""
    if EMU_NS is None or not EMU_NS.is_file():
        return "st-emu-ns not built (build/dev/emu/st-emu-ns)"
    if not shutil.which("unshare"):
        return "unshare (util-linux) not installed"
    try:
        r = subprocess.run(emu_ns(["test", "-c", "/dev/infiniband/uverbs0"]), capture_output=True, text=True,
                           timeout=20, env=dict(os.environ, SIGMATRACE_EMU_FABRIC="probe", SIGMATRACE_EMU_LID="1"))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"st-emu-ns failed: {e}"
    if r.returncode != 0:
        return f"st-emu-ns cannot make a mount namespace here (rc={r.returncode}): {r.stderr.strip()[-300:]}"
    return None


def read_emu_stats(directory):
    """The NIC counters (SIGMATRACE_EMU_STATS=<directory>/emu-stats.%p.json) of every process, by pid."""
    out = {}
    for p in Path(directory).glob("emu-stats.*.json"):
        d = json.loads(p.read_text())
        out[d["pid"]] = d
    return out


# ---------------------------------------------------------------------------
# ports and processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """True once some socket listens on `port` (reads /proc/net/tcp*, does not connect)."""
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(f).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def wait_listen(port, proc, timeout=10.0):
    """Wait until the server `proc` listens on `port`; fail the test if it exits first or never does."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if listening(port):
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"server exited early rc={proc.returncode}\n{out}\n{err}")
        time.sleep(0.02)
    pytest.fail(f"server never listened on {port}")


def finish(proc, timeout):
    """(rc, stdout, stderr) of `proc`; killed and the test failed if it runs past `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{proc.args} timed out\n{out}\n{err}")
    return proc.returncode, out, err


def popen(argv, env):
    """A background program with text stdout/stderr pipes."""
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class reaped:
    """`with reaped(p, ...) as procs:` kills and reaps, on the way out, every
    process still running; more can be added with procs.append(p)."""

    def __init__(self, *procs):
        self.procs = list(procs)

    def __enter__(self):
        return self.procs

    def __exit__(self, *exc):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
        return False


def serve_and_connect(server_argv, client_argv, env, settle, timeout=25, attempts=3):
    """Server + client of a program that takes its port on the command line
    (fi_pingpong, ucx_perftest): `server_argv(port)` is started, given `settle`
    seconds, then `client_argv(port)` runs to completion.  Retried on a fresh
    port when either side reports "Address already in use".  Returns
    ((server rc, server stdout+stderr), (client rc, client stdout+stderr))."""
    for attempt in range(attempts):
        port = free_port()
        srv = subprocess.Popen(server_argv(port), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        time.sleep(settle)
        cli = subprocess.run(client_argv(port), env=env, capture_output=True, text=True, timeout=timeout)
        try:
            sout, _ = srv.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            srv.kill()
            sout, _ = srv.communicate()
        if "Address already in use" not in sout + cli.stdout + cli.stderr:
            return (srv.returncode, sout), (cli.returncode, cli.stdout + cli.stderr)
    pytest.fail("could not get a free port")


def restart_mps():
    """A CUDA client killed while attached leaves the MPS server refusing new clients ("busy or unavailable",
    CUDA error 807): restart the daemon, if one runs (run_nccl.sh / run_nvshmem.sh start it)."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl or subprocess.run(["pgrep", "-x", "nvidia-cuda-mps"], capture_output=True).returncode != 0:
        return
    subprocess.run([ctl], input="quit\n", text=True, capture_output=True, timeout=30)
    time.sleep(1)
    subprocess.run([ctl, "-d"], capture_output=True, timeout=30)


def assert_idle_runs_coalesced(cap, process_index, poll_types):
    """The recorder's form of idle polls (docs/tracer.md, "Idle polls"), checked in each thread's record
    stream: between two other records of the thread, each key (type, object, requested count) of the empty
    polls of ``poll_types`` appears as its run's first call (polls 0), then at most once more, as its last
    call (polls > 0: the calls since the first).  Returns how many runs had a last call."""
    import numpy as np
    from sigmatrace.format import events as E

    ev = cap.events
    mine = (cap.event_process == process_index) & (ev["type"] != E.EXT)
    runs = 0
    for th in np.unique(cap.event_thread[mine]).tolist():
        sel = np.flatnonzero(mine & (cap.event_thread == th))
        seg = {}
        for ty, aux, obj, arg in zip(*(ev[c][sel].tolist() for c in ("type", "aux", "obj", "arg"))):
            if ty in poll_types and aux == 0:
                seg.setdefault((ty, obj, arg & 0xFFFFFFFF), []).append(arg >> E.IDLE_POLLS_SHIFT)
                continue
            for key, polls in seg.items():
                assert polls == [0] or (len(polls) == 2 and polls[0] == 0 and polls[1] > 0), (th, key, polls)
                runs += len(polls) == 2
            seg = {}
        for key, polls in seg.items():      # the thread's last segment (its end closed the runs)
            assert polls == [0] or (len(polls) == 2 and polls[0] == 0 and polls[1] > 0), (th, key, polls)
            runs += len(polls) == 2
    return runs
