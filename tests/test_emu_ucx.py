"""Real UCX 1.13 (ucx-utils) on the emulated mlx5 HCA, untraced.

Every UCX process is an emulated node (tests/native_util.py emu_env) run
inside st-emu-ns, the private mount namespace that gives it
/dev/infiniband/uverbs0 and /sys/class/infiniband/mlx5_0 (native/emu/st-emu-ns,
docs/emulator.md): UCX uses a device only when it can open its uverbs node,
and offers its mlx5 transports only for a ConnectX PCI id, which it reads
from the emulator's sysfs tree.  Pairs are a ucx_perftest server (LID 1) and
client (LID 2) on a fresh fabric; every run is bounded and its processes are
killed on the way out.  The NIC's counters (SIGMATRACE_EMU_STATS) show which
doorbells UCX used and that none was refused or mismatched.

Small iteration counts: on 2 cores UCX's rc_mlx5/ud_mlx5 spin on memory and
the NIC threads get the CPU only between them (ms per round trip).
Build first:  cmake -S native -B build/dev && cmake --build build/dev -j2
"""
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from native_util import (EMU_DIR, emu_env, emu_ns, emu_ns_problem, finish, free_port, needs_emu, popen,
                         read_emu_stats, reaped, wait_listen)
from sigmatrace import _native

pytestmark = pytest.mark.sim

PERFTEST = shutil.which("ucx_perftest")
UCX_INFO = shutil.which("ucx_info")
DV_CLIENT = _native.find("emu_dv_client")


def _ucx_problem():
    if not PERFTEST or not UCX_INFO:
        return "UCX not installed: ucx_perftest/ucx_info (Debian ucx-utils) not on PATH"
    out = subprocess.run([UCX_INFO, "-v"], capture_output=True, text=True, timeout=20).stdout
    if "Version 1." not in out:
        return f"ucx_info -v gave no UCX 1.x version: {out.strip()[:200]}"
    libdir = Path(subprocess.run(["sh", "-c", "ldd $(command -v ucx_perftest) | awk '/libucs/ {print $3}'"],
                                 capture_output=True, text=True, timeout=20).stdout.strip() or "/nonexistent").parent
    if not any((libdir / "ucx").glob("libuct_ib.so*")):
        return f"UCX has no IB transports here ({libdir}/ucx/libuct_ib.so missing: install libucx0 with verbs)"
    return None


UCX_PROBLEM = _ucx_problem()
needs_ucx = pytest.mark.skipif(UCX_PROBLEM is not None, reason=str(UCX_PROBLEM))


def needs_ns(f):
    return pytest.mark.skipif(emu_ns_problem() is not None, reason=str(emu_ns_problem()))(f)


needs_client = pytest.mark.skipif(DV_CLIENT is None, reason="emu_dv_client not built (native/tests)")

ERRORS = ("db_stale_pi", "db_pi_overrun", "bf_mismatch")


def node_env(fabric, lid, stats, **extra):
    return emu_env(fabric, lid, UCX_WARN_UNUSED_ENV_VARS="n", SIGMATRACE_EMU_STATS=f"{stats}/emu-stats.%p.json",
                   **extra)


def perftest(fabric, tmp_path, args, timeout=40, **extra):
    """ucx_perftest server and client (args for both; the client adds the host); returns
    (client output, server output, NIC counters of both by pid)."""
    port = free_port()
    argv = [PERFTEST, "-p", str(port), *args]
    srv = popen(emu_ns(argv), node_env(fabric, 1, tmp_path, **extra))
    with reaped(srv):
        wait_listen(port, srv, timeout=15)
        try:
            cli = subprocess.run(emu_ns(argv + ["127.0.0.1"]), env=node_env(fabric, 2, tmp_path, **extra),
                                 capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"client timed out after {timeout} s: {e.stdout}\n{e.stderr}")
        rc_s, out_s, err_s = finish(srv, timeout)
    cout = cli.stdout + cli.stderr
    assert cli.returncode == 0, f"client rc={cli.returncode}\n{cout}\nserver:\n{out_s}{err_s}"
    assert rc_s == 0, f"server rc={rc_s}\n{out_s}{err_s}\nclient:\n{cout}"
    for side, text in (("client", cout), ("server", out_s + err_s)):
        bad = [ln for ln in text.splitlines() if " ERROR " in ln or " WARN " in ln or "sigmatrace-emu:" in ln]
        assert not bad, f"{side} reported:\n" + "\n".join(bad)
    return cout, out_s + err_s, read_emu_stats(tmp_path)


def final(out, iters):
    """The client's "Final:" row: (iterations, latency typical/avg/overall us, bw avg/overall MB/s, rate avg/overall)."""
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("Final:")]
    assert rows, f"no Final: row\n{out}"
    v = [float(x) for x in rows[-1][1:]]
    assert int(v[0]) == iters, v
    # the overall latency is total time / iterations (the "average" column can read inf for a
    # last report interval without iterations)
    assert math.isfinite(v[3]) and v[3] > 0 and v[1] > 0, f"latency {v[1:4]}"
    return v


def assert_clean(stats, nodes=2):
    assert len(stats) == nodes, f"expected the counters of {nodes} processes, got {list(stats)}"
    for pid, s in stats.items():
        bad = {k: s[k] for k in ERRORS if s[k]}
        assert not bad, f"pid {pid}: NIC errors {bad}\n{s}"


def total(stats, key):
    return sum(s[key] for s in stats.values())


# ---------------------------------------------------------------------------
# the device as UCX sees it


@needs_emu
@needs_ucx
@needs_ns
def test_ucx_info_lists_mlx5_transports(fabric, tmp_path):
    """ucx_info -d: memory domain mlx5_0 with rc_verbs, rc_mlx5, ud_verbs and ud_mlx5 on
    mlx5_0:1 (the mlx5 ones only because the sysfs tree says ConnectX-6), with the PCI function
    as its system device; no warning (the async fd no longer reads EOF)."""
    r = subprocess.run(emu_ns([UCX_INFO, "-d"]), env=node_env(fabric, 3, tmp_path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "# Memory domain: mlx5_0" in out, out
    md = out.split("# Memory domain: mlx5_0", 1)[1].split("# Memory domain:", 1)[0]
    tls = re.findall(r"#\s+Transport: (\S+)\s*\n#\s+Device: (\S+)", md)
    for tl in ("rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5"):
        assert (tl, "mlx5_0:1") in tls, f"{tl} missing: {tls}"
    assert "System device: mlx5_0" in md
    assert " WARN " not in out and " ERROR " not in md, out
    if not Path("/dev/infiniband").exists():
        # the same program outside the namespace finds no device: UCX's /dev/infiniband check
        r2 = subprocess.run([UCX_INFO, "-d"], env=node_env(fabric, 4, tmp_path), capture_output=True, text=True,
                            timeout=60)
        assert r2.returncode == 0 and "Memory domain: mlx5_0" not in r2.stdout


# ---------------------------------------------------------------------------
# UCT level: endpoints connected directly (no wire-up)

UCT_TESTS = [  # (name, args, iterations): -s sizes within each operation's limits (ucx_info -d)
    ("am_lat", ["-t", "am_lat", "-s", "8"], 40),
    ("put_lat", ["-t", "put_lat", "-s", "8"], 40),
    ("put_bw", ["-t", "put_bw", "-D", "zcopy", "-s", "4000"], 100),
    ("get_bw", ["-t", "get", "-D", "zcopy", "-s", "4000"], 60),
    ("add_lat", ["-t", "add_lat", "-s", "8"], 40),
]
UCT_CASES = ([("rc_verbs", None, *t) for t in UCT_TESTS] +
             [("rc_mlx5", mode, *t) for mode in ("bf_post", "db") for t in UCT_TESTS])


@needs_emu
@needs_ucx
@needs_ns
@pytest.mark.parametrize("tl,mmio,name,args,iters", UCT_CASES,
                         ids=[f"{c[0]}-{c[2]}" + (f"-{c[1]}" if c[1] else "") for c in UCT_CASES])
def test_uct_perftest(fabric, tmp_path, tl, mmio, name, args, iters):
    extra = {"UCX_RC_MLX5_MMIO_MODE": mmio} if mmio else {}
    out, _, stats = perftest(fabric, tmp_path, ["-d", "mlx5_0:1", "-x", tl, *args, "-n", str(iters), "-w", "3"],
                             **extra)
    v = final(out, iters)
    if "bw" in name:
        assert v[5] > 0, f"bandwidth {v[4:6]}"
    assert_clean(stats)
    if tl == "rc_mlx5":
        # UCX wrote every WQE and rang every doorbell itself: what the NIC saw tells the mode
        # (the NIC samples registers: doorbells rung faster than it looks are seen as one)
        assert total(stats, "doorbells") > 0, stats
        if mmio == "bf_post":  # 64-byte copies of the WQEs, checked against the SQ and executed
            assert total(stats, "bf_copies") > 0 and total(stats, "bf_copies") >= total(stats, "db_only"), stats
        else:  # 8-byte doorbells only
            assert total(stats, "bf_copies") == 0 and total(stats, "db_only") > 0, stats


@needs_emu
@needs_ucx
@needs_ns
@pytest.mark.parametrize("tl,glob", [("ud_verbs", False), ("ud_mlx5", False), ("ud_mlx5", True)],
                         ids=["ud_verbs", "ud_mlx5", "ud_mlx5-grh"])
def test_uct_ud_am_lat(fabric, tmp_path, tl, glob):
    """UD datagrams with address handles: LID routing, or GRH/GID routing (UCX_IB_IS_GLOBAL=y);
    each side received what the other sent, nothing dropped."""
    extra = {"UCX_IB_IS_GLOBAL": "y"} if glob else {}
    iters = 40
    out, _, stats = perftest(fabric, tmp_path, ["-d", "mlx5_0:1", "-x", tl, "-t", "am_lat", "-s", "8", "-n",
                                                str(iters), "-w", "3"], **extra)
    final(out, iters)
    assert_clean(stats)
    assert total(stats, "ud_sent") >= 2 * iters and total(stats, "ud_received") >= 2 * iters, stats
    assert total(stats, "ud_dropped") == 0, stats


@needs_emu
@pytest.mark.skipif(not Path("/usr/bin/ibv_ud_pingpong").is_file(), reason="/usr/bin/ibv_ud_pingpong not installed")
@pytest.mark.parametrize("extra", [[], ["-g", "0"]], ids=["lid", "gid"])
def test_ibv_ud_pingpong(fabric, tmp_path, extra):
    """What ud_verbs rests on, with plain verbs (ibverbs-utils): UD QPs, address handles by LID or
    by GID (GRH), receives that start with the 40-byte GRH."""
    port = free_port()
    argv = ["/usr/bin/ibv_ud_pingpong", "-p", str(port), "-s", "1024", "-n", "200", *extra]
    srv = popen(argv, node_env(fabric, 1, tmp_path))
    with reaped(srv):
        wait_listen(port, srv)
        cli = subprocess.run(argv + ["127.0.0.1"], env=node_env(fabric, 2, tmp_path), capture_output=True, text=True,
                             timeout=30)
        rc, out, err = finish(srv, 30)
    assert cli.returncode == 0 and rc == 0, cli.stdout + cli.stderr + out + err
    assert "200 iters in" in cli.stdout and "200 iters in" in out
    if extra:
        assert "GID fe80::" in cli.stdout
    stats = read_emu_stats(tmp_path)
    assert_clean(stats)
    assert total(stats, "ud_received") >= 400 and total(stats, "ud_dropped") == 0, stats


# ---------------------------------------------------------------------------
# UCP level: the rc_mlx5 lanes are wired up over ud_mlx5

UCP_TESTS = [
    ("tag_lat", ["-t", "tag_lat", "-s", "8"], 30),
    ("tag_bw", ["-t", "tag_bw", "-s", "4000"], 60),
    ("tag_bw_rndv", ["-t", "tag_bw", "-s", "300000"], 10),  # rendezvous: RDMA READ of the sender's buffer
    ("ucp_put_bw", ["-t", "ucp_put_bw", "-s", "4000"], 60),
    ("stream_bw", ["-t", "stream_bw", "-s", "4000"], 30),
]


@needs_emu
@needs_ucx
@needs_ns
@pytest.mark.parametrize("name,args,iters", UCP_TESTS, ids=[t[0] for t in UCP_TESTS])
def test_ucp_perftest(fabric, tmp_path, name, args, iters):
    out, _, stats = perftest(fabric, tmp_path, [*args, "-n", str(iters), "-w", "3"], UCX_TLS="rc_mlx5,ud_mlx5")
    v = final(out, iters)
    if "bw" in name:
        assert v[5] > 0, f"bandwidth {v[4:6]}"
    assert_clean(stats)
    # wire-up went over UD (the auxiliary transport), the data over rc_mlx5 BlueFlame doorbells
    assert total(stats, "ud_sent") > 0 and total(stats, "ud_received") > 0, stats
    assert total(stats, "bf_copies") > 0, stats


# ---------------------------------------------------------------------------
# the emulator's own checks of that surface (native/tests/emu_dv_client.c)


def dv_client(fabric, tmp_path, mode, **extra):
    env = emu_env(fabric, 9, SIGMATRACE_EMU_STATS=f"{tmp_path}/emu-stats.%p.json", SIGMATRACE_EMU_DEBUG="errors",
                  **extra)
    r = subprocess.run([str(DV_CLIENT), mode], env=env, capture_output=True, text=True, timeout=30)
    return r, read_emu_stats(tmp_path)


def dv_client_ok(fabric, tmp_path, mode, ok):
    """dv_client that must pass (exit 0, its line `ok`): the result and the one process's NIC counters."""
    r, stats = dv_client(fabric, tmp_path, mode)
    assert r.returncode == 0 and ok in r.stdout, r.stdout + r.stderr
    (s,) = stats.values()
    return r, s


@needs_emu
@needs_client
def test_stale_and_overrunning_doorbells_are_counted(fabric, tmp_path):
    r, s = dv_client_ok(fabric, tmp_path, "--stale", "OK stale")
    assert s["db_stale_pi"] == 1 and s["db_pi_overrun"] == 1, s
    assert s["doorbells"] == 5 and s["bf_mismatch"] == 0, s
    errs = [ln for ln in r.stderr.splitlines() if "doorbell ERROR" in ln]
    assert len(errs) == 2 and "behind 2" in errs[0] and "more than the ring" in errs[1], r.stderr


@needs_emu
@needs_client
def test_blueflame_copy_that_differs_from_the_sq_is_flagged(fabric, tmp_path):
    r, stats = dv_client(fabric, tmp_path, "--bf")
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0 and "OK bf executed=copy" in r.stdout, r.stdout + r.stderr
    (s,) = stats.values()
    assert (s["bf_copies"], s["bf_mismatch"], s["db_only"]) == (1, 1, 1), s
    assert s["db_stale_pi"] == s["db_pi_overrun"] == 0, s
    assert "BlueFlame ERROR" in r.stderr and "wqe 1" in r.stderr, r.stderr


@needs_emu
@needs_client
def test_blueflame_off_reports_bf_size_zero(fabric, tmp_path):
    r, _ = dv_client(fabric, tmp_path, "--bf", SIGMATRACE_EMU_BF="0")
    assert r.returncode == 77 and "bf.size 0" in r.stdout, r.stdout + r.stderr


@needs_emu
@needs_client
def test_async_events_block_and_report_last_wqe_reached(fabric, tmp_path):
    r, s = dv_client_ok(fabric, tmp_path, "--async", "OK async")
    # the second QP's event was raised, and not delivered: the QP was destroyed before it was read
    assert s["async_events"] == 3 and s["async_events_dropped"] == 1, s


@needs_emu
@needs_client
def test_mlx5dv_cqs_and_arm_doorbells(fabric, tmp_path):
    r, s = dv_client_ok(fabric, tmp_path, "--cq", "OK cq")
    assert s["cq_arms"] == 4, s  # two per CQ size
