"""Interposition whatever the load order (issue 14, item 1): a traced program behaves exactly as
untraced however it reaches the traced libraries, and the calls are recorded.

The load orders (native/tests/load_order_*.c, compiled here with the system compiler):
libibverbs linked at start; dlopen'ed by the program RTLD_LOCAL / RTLD_GLOBAL and called through
dlsym on the handle or dlsym(RTLD_DEFAULT); NCCL 2.28's ibvsymbols.cc sequence (dlopen by name,
dlvsym at IBVERBS_1.1 / 1.8); a module linked with -libverbs dlopen'ed RTLD_LOCAL / RTLD_GLOBAL
(libibverbs arrives as its dependency, local to that dlopen: what broke UCX); a module that dlopens
libibverbs and dlsyms it; a module dlopen'ed by a module (libucs -> libuct_ib -> libibverbs);
dlsym(RTLD_DEFAULT) probes before and after an RTLD_LOCAL load; unload and load of another copy;
an older symbol version through dlvsym (real rdma-core); a module dlopen'ed RTLD_DEEPBIND (unchanged,
not traced).  The same for the CUDA driver (emulated:
linked, dlopen + dlsym, cuGetProcAddress, a module) and libfabric / UCP reached from a module.
Every traced run prints what the untraced one printed (device list, results, the objects loaded)
and exits the same; the trace holds the work.  Then real UCX on the emulated HCA (ucx_info -d,
ucx_perftest rc_verbs put_bw / am_lat and rc_mlx5 am_lat between two processes, under
`sigmatrace run`) and fi_info.

Processes are bounded by timeouts and reaped; every emulated node gets a fresh fabric.
"""
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from native_util import (EMU_DIR, cleanup_fabric, emu_env, emu_ns, emu_ns_problem, finish, free_port, needs_emu,
                         new_fabric, popen, reaped, wait_listen)
from sigmatrace import _native
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "native" / "tests"
LIB = _native.tracer_library()
CC = shutil.which("gcc") or shutil.which("cc")
EMU_CUDA = EMU_DIR / "cuda" if EMU_DIR else None
ITERS = 20

needs_tracer = pytest.mark.skipif(LIB is None or CC is None, reason="needs build/dev/libsigmatrace.so and a C compiler")
needs_ns = pytest.mark.skipif(emu_ns_problem() is not None, reason=str(emu_ns_problem()))


def _cc(out, src, *args):
    r = subprocess.run([CC, "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-o", str(out), str(src), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{out.name}: {r.stderr}"
    return out


@pytest.fixture(scope="module")
def verbs_bins(tmp_path_factory):
    if not Path("/usr/include/infiniband/verbs.h").exists():
        pytest.skip("rdma-core headers not installed")
    d = tmp_path_factory.mktemp("load-order")
    client, module = SRC / "load_order_client.c", SRC / "load_order_module.c"
    _cc(d / "client", client, "-ldl")
    _cc(d / "client_linked", client, "-DLO_LINKED", "-libverbs", "-ldl")
    _cc(d / "liblo_linked.so", module, "-fPIC", "-shared", "-DLO_LINKED", "-libverbs")
    _cc(d / "liblo_loader.so", module, "-fPIC", "-shared", "-ldl")
    if EMU_DIR is not None:  # two copies of the emulated libibverbs for the reload mode
        for sub in ("a", "b"):
            (d / sub).mkdir()
            shutil.copy2(EMU_DIR / "libibverbs.so.1", d / sub / "libibverbs.so.1")
    return d


def traced(env, out, mode="full", providers=None):
    env = dict(env, LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out), SIGMATRACE_MODE=mode)
    if providers is not None:
        env["SIGMATRACE_PROVIDERS"] = providers
    return env


def run(argv, env, timeout=60):
    r = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def node(tmp_path, lid=5, **extra):
    """A fresh emulated node; its fabric is removed at the end of the test."""
    fab = new_fabric("lo")
    _fabrics.append(fab)
    return emu_env(fab, lid, **extra)


_fabrics = []


@pytest.fixture(autouse=True)
def _cleanup_fabrics(tmp_path, monkeypatch):
    # crash handlers of some libfabric/psm providers drop backtrace files in the cwd
    monkeypatch.chdir(tmp_path)
    yield
    while _fabrics:
        cleanup_fabric(_fabrics.pop())


def both(argv, tmp_path, env_of, mode="full", providers=None, timeout=60):
    """(untraced (rc, stdout, stderr), traced (rc, stdout, stderr), trace dir): the same program on
    two fresh emulated nodes."""
    out = tmp_path / f"trace-{len(list(tmp_path.glob('trace-*')))}"
    base = run(argv, env_of(), timeout)
    tr = run(argv, traced(env_of(), out, mode, providers), timeout)
    return base, tr, out


# ---------------------------------------------------------------------------
# libibverbs, every way a program reaches it

VERBS_MODES = ["linked", "dlsym-local", "dlsym-global", "default-global", "nccl", "module-local", "module-global",
               "module-dlsym", "module-chain", "probe", "reload"]
UNTRACED_MODES = ["module-deepbind"]  # runs unchanged, but past the tracer (docs/interposition.md)


def verbs_argv(bins, mode, iters=ITERS):
    exe = bins / ("client_linked" if mode == "linked" else "client")
    return [exe, mode, iters, bins]


def check_verbs_trace(out, rounds, iters=ITERS):
    cap = read_capture(out)
    (p,) = cap.processes
    assert p.complete and p.end["dropped_events"] == 0
    by = cap.count_by_type()
    want = {"IBV_OPEN_DEVICE": rounds, "IBV_ALLOC_PD": rounds, "IBV_REG_MR": rounds, "IBV_CREATE_CQ": rounds,
            "IBV_CREATE_QP": 2 * rounds, "IBV_MODIFY_QP": 6 * rounds, "IBV_POST_RECV": iters * rounds,
            "IBV_POST_SEND": iters * rounds, "IBV_SEND_WR": 2 * iters * rounds, "IBV_WC": 2 * iters * rounds,
            "IBV_DESTROY_QP": 2 * rounds, "IBV_DEREG_MR": rounds, "IBV_CLOSE_DEVICE": rounds}
    assert {k: by.get(k, 0) for k in want} == want
    swr = cap.table("IBV_SEND_WR")
    assert np.count_nonzero(swr["opcode"] == 0) == iters * rounds  # RDMA WRITE, one per chain
    # the NIC identity came from libibverbs' query functions, found where the library is
    nics = p.header.get("nics") or []
    assert [n["name"] for n in nics] == ["mlx5_0"] and nics[0]["ports"][0]["gids"], nics
    return cap


@needs_emu
@needs_tracer
@pytest.mark.parametrize("mode", VERBS_MODES)
def test_verbs_load_order_traced_like_untraced(tmp_path, verbs_bins, mode):
    base, tr, out = both(verbs_argv(verbs_bins, mode), tmp_path, lambda: node(tmp_path))
    assert base[0] == 0 and "RESULT OK" in base[1], base
    assert (tr[0], tr[1]) == (base[0], base[1]), f"traced differs from untraced\n{tr[1]}{tr[2]}"
    assert "DEVICES n=1 mlx5_0" in tr[1]
    if mode == "probe":  # dlsym(RTLD_DEFAULT) finds nothing before libibverbs, nor after an RTLD_LOCAL load
        assert "PROBE before=none after_local=none" in tr[1]
    if mode == "reload":
        assert "RELOAD a_unloaded=1" in tr[1]
    check_verbs_trace(out, rounds=2 if mode == "reload" else 1)


@needs_emu
@needs_tracer
@pytest.mark.parametrize("mode", UNTRACED_MODES)
def test_verbs_load_order_not_traced_but_unchanged(tmp_path, verbs_bins, mode):
    """RTLD_DEEPBIND: the module binds to its own libibverbs before the global scope, so no call reaches
    a shim.  Not traced (known limit), but the program must run exactly as untraced."""
    base, tr, out = both(verbs_argv(verbs_bins, mode), tmp_path, lambda: node(tmp_path))
    assert base[0] == 0 and "RESULT OK" in base[1], base
    assert (tr[0], tr[1]) == (base[0], base[1]), tr
    assert not out.exists() or read_capture(out).count_by_type().get("IBV_OPEN_DEVICE", 0) == 0


@needs_emu
@needs_tracer
@pytest.mark.parametrize("mode", ["module-local", "module-chain", "nccl"])
@pytest.mark.parametrize("providers", ["none", "ucx,ofi"])
def test_verbs_load_order_with_providers_off(tmp_path, verbs_bins, mode, providers):
    """The reported failure happened with --providers none too: the shims still forward."""
    base, tr, out = both(verbs_argv(verbs_bins, mode), tmp_path, lambda: node(tmp_path), providers=providers)
    assert base[0] == 0 and (tr[0], tr[1]) == (base[0], base[1]), tr
    if out.exists():
        assert read_capture(out).count_by_type().get("IBV_OPEN_DEVICE", 0) == 0


@needs_tracer
def test_dlvsym_of_an_older_version_stays_untraced(tmp_path, verbs_bins):
    """rdma-core keeps IBVERBS_1.0 compat entry points: dlvsym(..., "IBVERBS_1.0") gets the compat
    function itself (never stored as the shim's real one), the default version the shim."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)  # the system libibverbs: the emulator has no 1.0 versions
    argv = [verbs_bins / "client", "vcompat", 0, verbs_bins]
    base = run(argv, env)
    if "v1_0=none" in base[1] or base[0] != 0:
        pytest.skip(f"this libibverbs has no IBVERBS_1.0 ibv_get_device_list: {base}")
    tr = run(argv, traced(env, tmp_path / "t"))
    assert tr[0] == 0, tr
    b = re.search(r"VCOMPAT v1_0=(\S+) n=(\S+) default=(\S+) n=(\S+)", base[1]).groups()
    t = re.search(r"VCOMPAT v1_0=(\S+) n=(\S+) default=(\S+) n=(\S+)", tr[1]).groups()
    assert b[0] == b[2] == t[0] == "libibverbs.so.1"  # the compat pointer, untouched
    assert t[2] == "libsigmatrace.so"                  # the default one, traced
    assert (t[1], t[3]) == (b[1], b[3])                # and both still answer as untraced


# ---------------------------------------------------------------------------
# the CUDA driver (emulated), every way a program reaches it


@pytest.fixture(scope="module")
def cuda_bins(tmp_path_factory):
    # the soname, not the unversioned development link: an installed package has only libcuda.so.1 (the CI's
    # clean clone skipped these tests for lack of libcuda.so)
    if EMU_CUDA is None or not (EMU_CUDA / "libcuda.so.1").exists():
        pytest.skip(f"emulated CUDA driver not built ({EMU_CUDA}/libcuda.so.1)")
    d = tmp_path_factory.mktemp("load-order-cuda")
    src = SRC / "load_order_cuda.c"
    _cc(d / "cuda_client", src, "-ldl")
    _cc(d / "cuda_linked", src, "-DLO_LINKED", f"-L{EMU_CUDA}", "-l:libcuda.so.1", "-ldl")
    _cc(d / "liblo_cuda.so", src, "-fPIC", "-shared", "-DLO_MODULE", "-DLO_LINKED", f"-L{EMU_CUDA}",
        "-l:libcuda.so.1")
    return d


@needs_emu
@needs_tracer
@pytest.mark.parametrize("mode", ["linked", "dlsym-local", "gpa", "module-local"])
def test_cuda_load_order_traced_like_untraced(tmp_path, cuda_bins, mode):
    exe = cuda_bins / ("cuda_linked" if mode == "linked" else "cuda_client")

    def env():
        e = node(tmp_path)
        e["LD_LIBRARY_PATH"] = f"{EMU_CUDA}:{e['LD_LIBRARY_PATH']}"
        return e

    base, tr, out = both([exe, mode, cuda_bins], tmp_path, env)
    assert base[0] == 0 and "RESULT OK" in base[1], base
    assert (tr[0], tr[1]) == (base[0], base[1]), tr
    by = read_capture(out).count_by_type()
    want = {"CU_MEM_HOST_REGISTER": 1, "CU_MEM_HOST_GET_DEVPTR": 1, "CU_POINTER_GET_ATTRIBUTE": 1,
            "CU_MEM_HOST_UNREGISTER": 1}
    assert {k: by.get(k, 0) for k in want} == want, by
    if mode == "gpa":
        assert by["CU_GET_PROC_ADDRESS"] == 7


# ---------------------------------------------------------------------------
# libfabric and UCP from a module dlopen'ed RTLD_LOCAL

HAVE_OFI_UCP = Path("/usr/include/rdma/fabric.h").exists() and Path("/usr/include/ucp/api/ucp.h").exists()


@pytest.fixture(scope="module")
def libs_bins(tmp_path_factory):
    if not HAVE_OFI_UCP:
        pytest.skip("libfabric or UCX headers not installed")
    d = tmp_path_factory.mktemp("load-order-libs")
    src = SRC / "load_order_libs.c"
    _cc(d / "libs_client", src, "-ldl")
    _cc(d / "liblo_libs.so", src, "-fPIC", "-shared", "-DLO_MODULE", "-lfabric", "-lucp", "-lucs")
    return d


@needs_tracer
@pytest.mark.parametrize("what", ["ofi", "ucp"])
def test_fabric_and_ucp_from_a_local_module(tmp_path, libs_bins, what):
    env = dict(os.environ, UCX_TLS="self", UCX_WARN_UNUSED_ENV_VARS="n")
    env.pop("LD_PRELOAD", None)
    base, tr, out = both([libs_bins / "libs_client", what, libs_bins], tmp_path, lambda: env)
    assert base[0] == 0 and "RESULT OK" in base[1], base
    assert (tr[0], tr[1]) == (base[0], base[1]), tr
    by = read_capture(out).count_by_type()
    if what == "ofi":
        # the 100 empty reads: one run, recorded as its first and last call
        assert (by.get("OFI_FABRIC"), by.get("OFI_DOMAIN"), by.get("OFI_CQ_READ")) == (1, 1, 2), by
        assert read_capture(out).calls("OFI_CQ_READ") == 100
    else:
        want = {"UCP_WORKER_CREATE": 1, "UCP_EP_CREATE": 1, "UCP_TAG_SEND": 1, "UCP_TAG_RECV": 1}
        assert {k: by.get(k, 0) for k in want} == want, by
        cap = read_capture(out)
        (p,) = cap.processes
        t = cap.table("UCP_WORKER_CREATE")
        # ucp_worker_get_address (not wrapped, found like the shims) filled the worker's address
        assert p.side[int(t["side_id"][0])].json()["address_len"] > 0


# ---------------------------------------------------------------------------
# real UCX on the emulated HCA (st-emu-ns gives it /dev/infiniband and sysfs), under `sigmatrace run`

PERFTEST = shutil.which("ucx_perftest")
UCX_INFO = shutil.which("ucx_info")
FI_INFO = shutil.which("fi_info")
needs_ucx = pytest.mark.skipif(not PERFTEST or not UCX_INFO, reason="ucx_perftest/ucx_info (ucx-utils) not installed")


def sigmatrace_run(out, argv, mode="full", providers=None):
    cmd = [sys.executable, "-m", "sigmatrace", "run", "-o", str(out), "--mode", mode]
    if providers is not None:
        cmd += ["--providers", providers]
    return cmd + ["--", *map(str, argv)]


def ucx_env(fabric, lid):
    e = emu_env(fabric, lid, UCX_WARN_UNUSED_ENV_VARS="n")
    e["PYTHONPATH"] = str(ROOT) + (":" + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


@needs_emu
@needs_tracer
@needs_ucx
@needs_ns
@pytest.mark.parametrize("providers", [None, "none"])
def test_ucx_info_lists_the_same_devices_traced(fabric, tmp_path, providers):
    base = run(emu_ns([UCX_INFO, "-d"]), ucx_env(fabric, 3))
    tr = run(emu_ns(sigmatrace_run(tmp_path / "t", [UCX_INFO, "-d"], providers=providers)), ucx_env(fabric, 3))
    assert base[0] == 0 and "# Memory domain: mlx5_0" in base[1], base
    assert tr[0] == base[0], tr[1] + tr[2]
    # the posix/sysv memory domains report the free space of /dev/shm, which any other process changes
    free = re.compile(r"(allocate: <= )\d+K")
    base, tr = (base[0], free.sub(r"\1NK", base[1])), (tr[0], free.sub(r"\1NK", tr[1]), tr[2])
    # the lines that differ, not the whole listing (it is long, and a difference is one or two lines)
    assert tr[1] == base[1], "".join(difflib.unified_diff(base[1].splitlines(True), tr[1].splitlines(True),
                                                          "untraced", "traced")) + tr[2]
    tls = re.findall(r"#\s+Transport: (\S+)\s*\n#\s+Device: (mlx5_0:1)", tr[1])
    assert ("rc_verbs", "mlx5_0:1") in tls, tls
    if providers is None:  # it opened the device: recorded, NIC identity in the header
        cap = read_capture(tmp_path / "t")
        assert cap.count_by_type().get("IBV_OPEN_DEVICE", 0) >= 1
        assert any(n["name"] == "mlx5_0" for p in cap.processes for n in p.header.get("nics") or [])


def shape(text):
    """ucx_perftest's report with the numbers blanked (the same table, the same rows)."""
    lines = [ln for ln in text.splitlines() if ln.startswith(("|", "+", "Final:"))]
    return [re.sub(r"\s+", " ", re.sub(r"\b\d+(\.\d+)?\b|\binf\b|\bnan\b", "N", ln)).strip() for ln in lines]


def perftest_pair(fabric, args, wrap, timeout=60):
    """ucx_perftest server (LID 1) and client (LID 2) in st-emu-ns; wrap(argv, side) wraps each
    command line (tracing).  Returns (client rc, client output, server rc, server output)."""
    port = free_port()
    argv = [PERFTEST, "-p", str(port), *args]
    srv = popen(emu_ns(wrap(argv, "srv")), ucx_env(fabric, 1))
    with reaped(srv):
        wait_listen(port, srv, timeout=20)
        try:
            cli = subprocess.run(emu_ns(wrap(argv + ["127.0.0.1"], "cli")), env=ucx_env(fabric, 2),
                                 capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"client timed out: {e.stdout}\n{e.stderr}")
        rc_s, out_s, err_s = finish(srv, timeout)
    return cli.returncode, cli.stdout + cli.stderr, rc_s, out_s + err_s


@needs_emu
@needs_tracer
@needs_ucx
@needs_ns
@pytest.mark.parametrize("tl,test,extra,iters", [("rc_verbs", "put_bw", ["-D", "zcopy", "-s", "4000"], 1000),
                                                 ("rc_verbs", "am_lat", [], 300), ("rc_mlx5", "am_lat", [], 100)])
def test_ucx_perftest_traced(tmp_path, tl, test, extra, iters):
    """The reported failure: ucx_perftest -x rc_verbs -d mlx5_0:1 under `sigmatrace run` said "No such
    device" (UCX's libuct_ib.so loads libibverbs and libmlx5 RTLD_LOCAL).  Traced now exits 0 with the
    untraced report's shape and the trace holds the work: the verbs work requests (rc_verbs), the
    mlx5 QPs and their doorbells' WQEs (rc_mlx5: mlx5dv from the same dlopen chain)."""
    args = ["-x", tl, "-d", "mlx5_0:1", "-t", test, *extra, "-n", str(iters), "-w", "0"]
    fab_u, fab_t = new_fabric("lu"), new_fabric("lt")
    try:
        rc_c, out_c, rc_s, out_s = perftest_pair(fab_u, args, lambda argv, side: argv)
        assert rc_c == rc_s == 0, out_c + out_s
        out = tmp_path / "t"
        trc_c, tout_c, trc_s, tout_s = perftest_pair(fab_t, args, lambda argv, side: sigmatrace_run(out, argv))
    finally:
        cleanup_fabric(fab_u)
        cleanup_fabric(fab_t)
    assert trc_c == trc_s == 0, tout_c + tout_s
    assert "No such device" not in tout_c + tout_s
    assert shape(tout_c) == shape(out_c) and any(ln.startswith("Final: ") for ln in shape(tout_c)), tout_c
    cap = read_capture(out)
    assert len(cap.processes) == 2 and all(p.complete for p in cap.processes)
    by = cap.count_by_type()
    for p in cap.processes:
        assert [n["name"] for n in p.header.get("nics") or []][:1] == ["mlx5_0"]
    assert by.get("IBV_CREATE_QP", 0) >= 2, by
    if tl == "rc_mlx5":  # both sides' QPs seen through mlx5dv, every WQE of their doorbells decoded
        assert by.get("MLX5_DV_INIT_QP", 0) >= 2 and by.get("DB_WQE", 0) >= 2 * iters, by
        return
    assert by.get("IBV_POST_SEND", 0) >= iters, by
    swr = cap.table("IBV_SEND_WR")
    cli = next(p for p in cap.processes if "127.0.0.1" in p.header["argv"])
    srv = next(p for p in cap.processes if p is not cli)
    mine = swr["process"] == cli.index
    if test == "put_bw":  # one RDMA WRITE of 4000 bytes per iteration (+ perftest's closing one)
        w = mine & (swr["opcode"] == 0) & (swr["bytes"] == 4000)
        assert np.count_nonzero(w) in (iters, iters + 1)
    else:  # ping-pong of active messages: both sides send every iteration
        for p in (cli, srv):
            assert np.count_nonzero((swr["process"] == p.index) & (swr["opcode"] == 2)) == iters


@needs_emu
@needs_tracer
@pytest.mark.skipif(not FI_INFO, reason="fi_info (libfabric-bin) not installed")
def test_fi_info_traced_like_untraced(fabric, tmp_path):
    wrap = emu_ns if emu_ns_problem() is None else (lambda argv: argv)
    base = run(wrap([FI_INFO]), emu_env(fabric, 3))
    tr = run(wrap([FI_INFO]), traced(emu_env(fabric, 3), tmp_path / "t", mode="simple"))
    assert base[0] == 0 and "provider:" in base[1], base
    assert (tr[0], tr[1]) == (base[0], base[1]), tr[1] + tr[2]
