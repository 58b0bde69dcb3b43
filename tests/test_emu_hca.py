"""The emulated mlx5 HCA (native/emu): unmodified rdma-core programs and our
IBGDA-style DevX client run on it, untraced.

Build first:  cmake -S native -B build/dev && cmake --build build/dev -j1
Every test uses its own fabric name (SIGMATRACE_EMU_FABRIC) and ephemeral TCP
ports, so the file can run repeatedly and in parallel with itself.
"""
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from native_util import (MLX5, VERBS, emu_env, finish, free_port, needs_bin, needs_emu, popen, reaped,
                         wait_listen)
from sigmatrace import _native

pytestmark = pytest.mark.sim

IBGDA_CLIENT = _native.find("emu_ibgda_client")
ERR_CLIENT = _native.find("emu_err_client")

def needs_client(p, name):
    return pytest.mark.skipif(p is None, reason=f"{name} not built (native/tests, needs the emulated HCA)")


# ---------------------------------------------------------------------------
# helpers


def client_server(fabric, argv_server, argv_client, timeout=30.0):
    """Run a server/client pair of an unmodified rdma-core program on two emulated nodes."""
    srv = popen(argv_server, emu_env(fabric, 1))
    with reaped(srv):
        return srv, None, wait_and_run(srv, argv_client, fabric, timeout)


def wait_and_run(srv, argv_client, fabric, timeout):
    port = int(argv_client[argv_client.index("-p") + 1])
    wait_listen(port, srv)
    cli = subprocess.run(argv_client, env=emu_env(fabric, 2), capture_output=True, text=True, timeout=timeout)
    rc, out, err = finish(srv, timeout)
    return (rc, out, err), (cli.returncode, cli.stdout, cli.stderr)


# ---------------------------------------------------------------------------
# library surface


@needs_emu
def test_symbol_versions_cover_rdma_core_consumers():
    """Every IBVERBS_*/MLX5_* symbol that the installed programs import exists
    in the emulator with the same version (they are linked with BIND_NOW)."""
    if not shutil.which("objdump"):
        pytest.skip("objdump not installed")

    def defined(lib):
        out = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
        syms = set()
        for ln in out.splitlines():
            parts = ln.split()
            if len(parts) >= 3 and "*UND*" not in ln and parts[-2].startswith(("IBVERBS_", "MLX5_")):
                syms.add((parts[-2], parts[-1]))
        return syms

    have = defined(VERBS) | defined(MLX5)
    consumers = [p for p in ("/usr/bin/ibv_rc_pingpong", "/usr/bin/ibv_devinfo", "/usr/bin/ib_write_bw",
                             "/usr/bin/ib_send_lat", "/lib/x86_64-linux-gnu/librdmacm.so.1",
                             "/lib/x86_64-linux-gnu/libefa.so.1") if Path(p).exists()]
    if not consumers:
        pytest.skip("no rdma-core consumers installed")
    missing = []
    for c in consumers:
        out = subprocess.run(["objdump", "-T", c], capture_output=True, text=True, check=True).stdout
        for ln in out.splitlines():
            if "*UND*" not in ln:
                continue
            parts = ln.split()
            ver, sym = parts[-2], parts[-1]
            ver = ver.strip("()")
            if ver.startswith(("IBVERBS_", "MLX5_")) and (ver, sym) not in have:
                missing.append(f"{c}: {sym}@{ver}")
    assert not missing, "\n".join(missing)


@needs_emu
@needs_bin("/usr/bin/ibv_devinfo")
def test_devinfo_reports_configured_node(fabric):
    env = emu_env(fabric, 0x1234, SIGMATRACE_EMU_DEV_NAME="mlx5_7", SIGMATRACE_EMU_NODE_GUID="0x1122334455667788")
    r = subprocess.run(["ibv_devinfo", "-v"], env=env, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert "hca_id:\tmlx5_7" in r.stdout
    assert "1122:3344:5566:7788" in r.stdout
    assert re.search(r"port_lid:\s+4660", r.stdout)
    assert "PORT_ACTIVE" in r.stdout and "InfiniBand" in r.stdout
    assert re.search(r"GID\[\s*0\]:\s+fe80:0000:0000:0000:1122:3344:5566:7788", r.stdout), r.stdout


# ---------------------------------------------------------------------------
# ibv_rc_pingpong (unmodified Debian ibverbs-utils)

PINGPONG_CASES = [
    ["-s", "1", "-n", "500"],
    ["-s", "16", "-n", "1000", "-c"],          # inline sends (<= max_inline), data validated
    ["-s", "4096", "-n", "1000", "-c"],
    ["-s", "200000", "-n", "50", "-c"],        # multi-packet messages
    ["-s", "1024", "-n", "300", "-e"],         # completion channel / events
    ["-s", "4096", "-n", "300", "--new_send", "-c"],  # ibv_wr_* API
    ["-s", "70000", "-n", "100", "-e", "--new_send", "-c"],
]


@needs_emu
@needs_bin("/usr/bin/ibv_rc_pingpong")
@pytest.mark.parametrize("args", PINGPONG_CASES, ids=[" ".join(a) for a in PINGPONG_CASES])
def test_rc_pingpong(fabric, args):
    port = str(free_port())
    base = ["ibv_rc_pingpong", "-p", port] + args
    srv, _, ((src, sout, serr), (crc, cout, cerr)) = client_server(fabric, base, base + ["127.0.0.1"])
    assert crc == 0, f"client failed\n{cout}\n{cerr}"
    assert src == 0, f"server failed\n{sout}\n{serr}"
    n = args[args.index("-n") + 1]
    for out in (sout, cout):
        assert re.search(rf"{n} iters in [\d.]+ seconds", out), out
    # the two sides saw each other's LID/QPN
    srv_local = re.search(r"local address:\s+LID (0x[0-9a-f]+), QPN (0x[0-9a-f]+)", sout).groups()
    cli_remote = re.search(r"remote address:\s+LID (0x[0-9a-f]+), QPN (0x[0-9a-f]+)", cout).groups()
    assert srv_local == cli_remote


@needs_emu
@pytest.mark.parametrize("prog", ["ibv_srq_pingpong", "ibv_uc_pingpong"])
def test_other_pingpongs(fabric, prog):
    """SRQ (16 QPs sharing one SRQ) and UC variants.  (ibv_ud_pingpong and
    ibv_xsrq_pingpong need UD / XRC, which the emulator does not provide.)"""
    if not shutil.which(prog):
        pytest.skip(f"{prog} not installed")
    port = str(free_port())
    base = [prog, "-p", port, "-n", "200"]
    srv, _, ((src, sout, serr), (crc, cout, cerr)) = client_server(fabric, base, base + ["127.0.0.1"])
    assert crc == 0 and src == 0, f"{cout}\n{cerr}\n{sout}\n{serr}"
    assert re.search(r"200 iters in [\d.]+ seconds", cout), cout


# ---------------------------------------------------------------------------
# perftest

PERFTEST = ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw",
            "ib_write_lat", "ib_read_lat", "ib_send_lat", "ib_atomic_lat"]


PERFTEST_CASES = [[p] for p in PERFTEST] + [
    ["ib_send_bw", "-e"],                    # completion events
    ["ib_write_bw", "-q", "4"],              # several QPs
    ["ib_send_bw", "--use_old_post_send"],   # ibv_post_send instead of ibv_wr_*
    ["ib_write_bw", "-s", "1000000"],        # multi-packet messages
]


@needs_emu
@pytest.mark.parametrize("args", PERFTEST_CASES, ids=[" ".join(a) for a in PERFTEST_CASES])
def test_perftest(fabric, args):
    prog = args[0]
    if not shutil.which(prog):
        pytest.skip(f"{prog} (perftest) not installed")
    port = str(free_port())
    base = args + ["-p", port, "-n", "200"]
    srv, _, ((src, sout, serr), (crc, cout, cerr)) = client_server(fabric, base, base + ["127.0.0.1"], timeout=40)
    assert crc == 0, f"client failed\n{cout}\n{cerr}"
    assert src == 0, f"server failed\n{sout}\n{serr}"
    assert re.search(r"^\s*#bytes", cout, re.M), cout
    row = re.search(r"^\s*(\d+)\s+(200|800)\s+([\d.]+)", cout, re.M)
    assert row, cout


# ---------------------------------------------------------------------------
# IBGDA-style DevX client


def parse_dbs(out):
    return [tuple(int(x, 0) for x in m.groups())
            for m in re.finditer(r"^DB qpn=(0x[0-9a-f]+) pi=(\d+) nwqe=(\d+) first_idx=(\d+)$", out, re.M)]


def check_ibgda_output(out, depth):
    assert "RESULT OK" in out, out
    dbs = parse_dbs(out)
    assert dbs, out
    # coalesced doorbells: one doorbell announces several WQEs
    assert max(d[2] for d in dbs) > 1
    # the producer index announced by consecutive doorbells only moves forward
    for prev, cur in zip(dbs, dbs[1:]):
        assert cur[3] == prev[1], (prev, cur)
    m = re.search(r"INITIATOR .* doorbells=(\d+) wraps=(\d+) fails=0", out)
    assert m and int(m.group(1)) == len(dbs)
    assert int(m.group(2)) >= 2, "send queue should wrap around several times"
    total_bb = sum((d[1] - d[3]) % 65536 for d in dbs)
    assert total_bb >= 2 * depth


@needs_emu
@needs_client(IBGDA_CLIENT, "emu_ibgda_client")
@pytest.mark.parametrize("cc", [False, True], ids=["cq-ring", "collapsed-cq"])
def test_ibgda_client_pair(fabric, cc):
    argv = [str(IBGDA_CLIENT), "--pair", "--depth", "64", "--ops", "300", "--batch", "5"] + (["--cc"] if cc else [])
    r = subprocess.run(argv, env=emu_env(fabric, 7), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    check_ibgda_output(r.stdout, 64)
    assert "TARGET verified writes=300 counter=64 fails=0" in r.stdout


@needs_emu
@needs_client(IBGDA_CLIENT, "emu_ibgda_client")
@pytest.mark.parametrize("cc", [False, True], ids=["cq-ring", "collapsed-cq"])
def test_ibgda_client_two_processes(fabric, tmp_path, cc):
    common = ["--dir", str(tmp_path), "--depth", "32", "--ops", "400", "--batch", "7"] + (["--cc"] if cc else [])
    target = popen([str(IBGDA_CLIENT), "--rank", "1"] + common, emu_env(fabric, 21))
    with reaped(target):
        init = subprocess.run([str(IBGDA_CLIENT), "--rank", "0"] + common, env=emu_env(fabric, 22),
                              capture_output=True, text=True, timeout=30)
        trc, tout, terr = finish(target, 30)
    assert init.returncode == 0, init.stdout + init.stderr
    assert trc == 0, tout + terr
    check_ibgda_output(init.stdout, 32)
    assert "TARGET verified writes=400 counter=64 fails=0" in tout
    # QPNs crossed correctly: each side's remote QPN is the other's local QPN
    a = re.search(r"CONNECT local lid=(\d+) qpn=(0x[0-9a-f]+) remote lid=(\d+) qpn=(0x[0-9a-f]+)", init.stdout).groups()
    b = re.search(r"CONNECT local lid=(\d+) qpn=(0x[0-9a-f]+) remote lid=(\d+) qpn=(0x[0-9a-f]+)", tout).groups()
    assert a[0:2] == b[2:4] and b[0:2] == a[2:4]


# ---------------------------------------------------------------------------
# error completions and robustness


@needs_emu
@needs_client(ERR_CLIENT, "emu_err_client")
def test_completion_contents_and_error_completions(fabric):
    r = subprocess.run([str(ERR_CLIENT), "--checks"], env=emu_env(fabric, 9), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for line in ("CHECK good_path done",
                 "CHECK bad rkey WRITE -> remote access error",
                 "CHECK out-of-range WRITE -> remote access error",
                 "CHECK bad rkey READ -> remote access error",
                 "CHECK READ without remote access -> remote access error",
                 "CHECK bad rkey FETCH_ADD -> remote access error",
                 "CHECK bad lkey -> local protection error",
                 "CHECK oversized send -> remote invalid request error / local length error",
                 "CHECK destroy_qp with completions unpolled -> its CQEs leave the shared CQ",
                 "CHECK RESET with completions unpolled -> its CQEs leave the shared CQ",
                 "RESULT OK"):
        assert line in r.stdout, r.stdout


@needs_emu
@needs_client(ERR_CLIENT, "emu_err_client")
def test_peer_killed_gives_error_completions(fabric, tmp_path):
    victim = popen([str(ERR_CLIENT), "--victim", str(tmp_path)], emu_env(fabric, 31))
    surv = popen([str(ERR_CLIENT), "--survivor", str(tmp_path)], emu_env(fabric, 32))
    with reaped(victim, surv):
        t0 = time.monotonic()
        while not (tmp_path / "victim.ready").exists() or not (tmp_path / "survivor.ready").exists():
            assert time.monotonic() - t0 < 10, "peers never connected"
            assert victim.poll() is None and surv.poll() is None
            time.sleep(0.02)
        time.sleep(0.3)  # traffic in flight both ways
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
        rc, out, err = finish(surv, 15)
    assert rc == 0, out + err
    m = re.search(r"SURVIVOR ops=(\d+) errors=(\d+) first_error=(.+) recv_flushed=8 after=([\d.]+)s", out)
    assert m, out
    assert int(m.group(1)) > 0 and int(m.group(2)) >= 8
    assert m.group(3) in ("transport retry counter exceeded", "Work Request Flushed Error")


@needs_emu
@needs_bin("/usr/bin/ibv_rc_pingpong")
def test_rc_pingpong_peer_killed_mid_run(fabric):
    port = str(free_port())
    base = ["ibv_rc_pingpong", "-p", port, "-s", "64", "-n", "100000000"]
    srv = popen(base, emu_env(fabric, 1))
    with reaped(srv) as procs:
        wait_listen(int(port), srv)
        cli = popen(base + ["127.0.0.1"], emu_env(fabric, 2))
        procs.append(cli)
        time.sleep(1.0)
        assert cli.poll() is None and srv.poll() is None, "pingpong ended before the kill"
        cli.send_signal(signal.SIGKILL)
        cli.wait(5)
        t0 = time.monotonic()
        rc, out, err = finish(srv, 15)
        elapsed = time.monotonic() - t0
    assert rc != 0
    assert re.search(r"Failed status (transport retry counter exceeded|Work Request Flushed Error)", err + out), err
    assert elapsed < 10
