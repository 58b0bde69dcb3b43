"""The emulated librdmacm.so.1 (native/emu/rdmacm): rdma_cm between emulated
nodes, and libfabric's verbs provider on it, untraced.

Node LID L owns 127.0.<L/256>.<L%256>: the server side runs as LID 1
(127.0.0.1), the client side as LID 2.  native/tests/emu_cm_client drives the
CM paths (connect/accept and reject with private data both ways, a port
nobody listens on, an address no node owns, a peer killed in the handshake or
once connected, disconnect, the UD/SIDR handshake); fi_info and fi_pingpong
(libfabric-bin) run the verbs provider (msg, and rdm over ofi_rxm).  Every
test has its own fabric; every wait is bounded and processes are always
killed.  Build first: cmake -S native -B build/dev && cmake --build build/dev -j2
"""
import functools
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from native_util import EMU_DIR, cleanup_fabric, emu_env, finish, free_port, needs_emu, popen, reaped
from sigmatrace import _native

pytestmark = pytest.mark.sim

RDMACM = _native.find("librdmacm.so.1")
CM_CLIENT = _native.find("emu_cm_client")
FI_INFO = shutil.which("fi_info")
FI_PINGPONG = shutil.which("fi_pingpong")

needs_cm = pytest.mark.skipif(
    RDMACM is None or EMU_DIR is None or RDMACM.parent != EMU_DIR or CM_CLIENT is None,
    reason="emulated librdmacm.so.1 / emu_cm_client not built (needs <rdma/rdma_cma.h>; "
    "cmake -S native -B build/dev && cmake --build build/dev -j2)",
)
needs_fi = pytest.mark.skipif(FI_INFO is None or FI_PINGPONG is None,
                              reason="fi_info/fi_pingpong not installed (libfabric-bin)")

ETIMEDOUT, ECONNREFUSED, EINVAL = 110, 111, 22
REJ_TIMEOUT, REJ_INVALID_SERVICE_ID, REJ_CONSUMER_DEFINED = 1, 8, 28


# ---------------------------------------------------------------------------
# helpers


class Lines:
    """Collects a process's stdout lines in a thread; wait() for one with a bound."""

    def __init__(self, proc):
        self.proc, self.lines, self.cv = proc, [], threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for ln in self.proc.stdout:
            with self.cv:
                self.lines.append(ln.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)
            self.cv.notify_all()

    def wait(self, prefix, timeout=15.0):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for ln in self.lines:
                    if ln is not None and ln.startswith(prefix):
                        return ln
                if None in self.lines:
                    pytest.fail(f"{self.proc.args} exited before '{prefix}':\n" + "\n".join(self.text()))
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no '{prefix}' within {timeout}s:\n" + "\n".join(self.text()))
                self.cv.wait(left)

    def text(self):
        return [ln for ln in self.lines if ln is not None]

    def finish(self, timeout=20.0):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"{self.proc.args} timed out:\n" + "\n".join(self.text()))
        deadline = time.monotonic() + 5
        with self.cv:
            while None not in self.lines and time.monotonic() < deadline:
                self.cv.wait(0.1)
        return self.proc.returncode, self.text()


def fields(line):
    """'KEY a=1 b=x' -> {'a': '1', 'b': 'x'}"""
    return dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)


def line(lines, prefix):
    hits = [ln for ln in lines if ln.startswith(prefix)]
    assert hits, f"no '{prefix}' in:\n" + "\n".join(lines)
    return hits[0]


def start_server(fabric, port, *args, lid=1):
    p = subprocess.Popen([str(CM_CLIENT), "server", "--port", str(port), *args], env=emu_env(fabric, lid),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Lines(p)
    out.wait("LISTENING")
    return p, out


def run_client(fabric, *args, lid=2, timeout=30):
    r = subprocess.run([str(CM_CLIENT), "client", *args], env=emu_env(fabric, lid), capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout.splitlines(), r.stderr


def client_server_pass(fabric, server_args, client_args):
    """A server on a free port with server_args, one client with client_args (and --port): both exit 0.
    Their output lines (client, server)."""
    port = free_port()
    srv, sout = start_server(fabric, port, *server_args)
    with reaped(srv):
        rc, out, err = run_client(fabric, "--port", str(port), *client_args)
        src, sl = sout.finish()
    assert rc == 0 and src == 0, "\n".join(out + sl) + err
    return out, sl


# ---------------------------------------------------------------------------
# library surface


@needs_emu
@needs_cm
def test_symbol_versions_cover_rdmacm_consumers():
    """Our librdmacm exports what rdma-core 44's does, and every RDMACM_* symbol
    the installed consumers import (they are linked with BIND_NOW)."""
    if not shutil.which("objdump"):
        pytest.skip("objdump not installed")

    def table(lib, undefined):
        out = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
        syms = set()
        for ln in out.splitlines():
            parts = ln.split()
            if len(parts) >= 3 and ("*UND*" in ln) == undefined and parts[-2].strip("()").startswith("RDMACM_"):
                syms.add((parts[-2].strip("()"), parts[-1]))
        return syms

    ours = table(RDMACM, False)
    assert ("RDMACM_1.0", "rdma_create_id") in ours and ("RDMACM_1.2", "rdma_establish") in ours
    real = Path("/lib/x86_64-linux-gnu/librdmacm.so.1")
    if real.exists():
        assert table(real, False) == ours
    consumers = [p for p in ("/lib/x86_64-linux-gnu/libfabric.so.1", "/usr/bin/ib_send_bw", "/usr/bin/ib_write_lat",
                             "/usr/lib/x86_64-linux-gnu/ucx/libuct_rdmacm.so.0",
                             "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so.1") if Path(p).exists()]
    if not consumers:
        pytest.skip("no librdmacm consumers installed")
    missing = [f"{c}: {s}@{v}" for c in consumers for (v, s) in table(c, True) if (v, s) not in ours]
    assert not missing, "\n".join(missing)


@needs_emu
@needs_cm
def test_in_process_checks(fabric):
    """API semantics in one process: getaddrinfo, bind errors (EADDRNOTAVAIL,
    EADDRINUSE), ephemeral ports, channel fd readable/EAGAIN, rdma_migrate_id,
    rdma_init_qp_attr, calls in the wrong state (EINVAL), the 56-byte REQ
    private data limit, a loopback connection (private data, swapped depths,
    QPs in RTS, a SEND), a sync connect to no listener (ECONNREFUSED), AF_IB
    addresses (the GID, 92 bytes of REQ private data) with the QP-less
    handshake (CONNECT_RESPONSE, rdma_establish), and the synchronous endpoint
    API (rdma_create_ep, rdma_get_request, rdma_destroy_ep)."""
    r = subprocess.run([str(CM_CLIENT), "checks"], env=emu_env(fabric, 3), capture_output=True, text=True, timeout=60)
    out = r.stdout.splitlines()
    assert r.returncode == 0 and out[-1] == "RESULT OK", r.stdout + r.stderr
    for key in ("API_STATE_ERRORS ok", "CHANNEL_SEMANTICS ok", "PDATA_LIMIT ok max=56", "LOOPBACK_CONNECTION ok",
                "DISCONNECT ok", "SYNC_NO_LISTENER ok", "AF_IB ok", "ENDPOINTS ok"):
        assert key in out
    assert fields(line(out, "DEVICES")) == {"n": "1", "name": "mlx5_0"}


# ---------------------------------------------------------------------------
# the handshake between two processes


@needs_emu
@needs_cm
@pytest.mark.parametrize("sync", [False, True], ids=["event-channel", "sync-ids"])
def test_connect_accept_private_data_both_ways(fabric, sync):
    port = free_port()
    srv, sout = start_server(fabric, port)
    with reaped(srv):
        rc, out, err = run_client(fabric, "--addr", "127.0.0.1", "--port", str(port), "--disconnect",
                                  *(["--sync"] if sync else []))
        src, sl = sout.finish()
    assert rc == 0 and out[-1] == "RESULT OK", "\n".join(out) + err
    assert src == 0 and sl[-1] == "RESULT OK", "\n".join(sl)
    a = fields(line(out, "ADDR_RESOLVED"))
    assert a["src"] == "127.0.0.2" and a["verbs"] == "1" and a["dev"] == "mlx5_0"
    assert fields(line(out, "ROUTE_RESOLVED")) == {"num_paths": "1", "dlid": "1"}
    # the REQ's private data reaches the server at the IB CM's size (56 = 92 - cma header), zero padded
    req = fields(line(sl, "REQ"))
    assert req["pdata"] == "hello-from-client" and req["pdata_len"] == "56" and req["pdata_tail_zero"] == "1"
    assert req["peer"] == "127.0.0.2" and req["peer_port"] == a["src_port"] and req["local_port"] == str(port)
    assert req["responder_resources"] == req["initiator_depth"] == "16"   # RDMA_MAX_* -> the device's 16
    # the REP's private data comes back (196 bytes); the client's QP is in RTS towards the server's QPN
    est = fields(line(out, "ESTABLISHED"))
    assert est["pdata"] == "welcome-from-server" and est["pdata_len"] == "196" and est["pdata_tail_zero"] == "1"
    assert est["qp_state"] == "3" and est["dest_qpn"] == est["qp_num"]
    assert fields(line(sl, "ESTABLISHED")) == {"side": "server", "pdata_len": "0"}
    assert "EXCHANGE ok sent=ping received=pong" in out and "EXCHANGE ok sent=pong received=ping" in sl
    # the client's rdma_disconnect: DREQ -> both DISCONNECTED
    assert fields(line(out, "DISCONNECTED"))["status"] == "0"
    assert fields(line(sl, "DISCONNECTED"))["status"] == "0"


@needs_emu
@needs_cm
@pytest.mark.parametrize("sync", [False, True], ids=["event-channel", "sync-ids"])
def test_reject_with_private_data(fabric, sync):
    out, sl = client_server_pass(fabric, ["--reject"], ["--sync"] if sync else [])
    assert "REJECT_SENT" in sl
    rej = fields(line(out, "REJECTED"))
    assert rej["status"] == str(REJ_CONSUMER_DEFINED) and rej["pdata"] == "go-away" and rej["pdata_len"] == "148"
    if sync:
        assert fields(line(out, "SYNC_ERRNO"))["errno"] == str(ECONNREFUSED)   # ucma_complete's mapping


@needs_emu
@needs_cm
def test_connect_to_a_port_nobody_listens_on(fabric):
    """REJECTED with IB CM reason 8 (invalid service ID), from another node and from our own."""
    port = free_port()
    srv, sout = start_server(fabric, port)
    with reaped(srv):
        rc, out, err = run_client(fabric, "--addr", "127.0.0.1", "--port", str(port + 1))
        rc2, out2, err2 = run_client(fabric, "--addr", "127.0.0.2", "--port", str(port))   # our own node
    for r, o in ((rc, out), (rc2, out2)):
        assert r == 0, "\n".join(o)
        assert fields(line(o, "REJECTED"))["status"] == str(REJ_INVALID_SERVICE_ID)


@needs_emu
@needs_cm
def test_address_no_node_owns(fabric):
    """No emulated node answers for the address: ADDR_ERROR with -ETIMEDOUT after
    the resolve timeout (the ARP request is never answered); a sync id gets
    errno ETIMEDOUT; the id is not on a device."""
    t0 = time.monotonic()
    rc, out, err = run_client(fabric, "--addr", "127.0.0.77", "--port", "7000", "--timeout-ms", "300")
    dt = time.monotonic() - t0
    assert rc == 0, "\n".join(out) + err
    assert fields(line(out, "ADDR_ERROR")) == {"status": str(-ETIMEDOUT), "verbs": "0"}
    assert 0.3 <= dt < 10
    rc, out, err = run_client(fabric, "--addr", "10.255.255.1", "--port", "7000", "--timeout-ms", "300", "--sync")
    assert rc == 0 and fields(line(out, "ADDR_ERROR")) == {"sync": "1", "errno": str(ETIMEDOUT)}, "\n".join(out)


@needs_emu
@needs_cm
def test_server_killed_holding_the_request(fabric):
    """The passive process dies with the request undecided: its kernel CM would
    reject it (consumer defined), so the client gets REJECTED, promptly."""
    port = free_port()
    srv, sout = start_server(fabric, port, "--hold")
    with reaped(srv) as procs:
        cli = popen([str(CM_CLIENT), "client", "--port", str(port)], emu_env(fabric, 2))
        procs.append(cli)
        sout.wait("HOLDING")
        t0 = time.monotonic()
        srv.send_signal(signal.SIGKILL)
        rc, out, err = finish(cli, 20)
        dt = time.monotonic() - t0
    lines = out.splitlines()
    assert rc == 0, out + err
    rej = fields(line(lines, "REJECTED"))
    assert rej["status"] == str(REJ_CONSUMER_DEFINED) and rej["pdata_len"] == "148"
    assert dt < 5


@needs_emu
@needs_cm
def test_server_killed_once_established(fabric):
    """The peer dies on an established connection: DISCONNECTED (its kernel CM's
    DREQ), and the QP's next SEND fails (transport retry exceeded), no hang."""
    port = free_port()
    srv, sout = start_server(fabric, port, "--hold-established")
    with reaped(srv) as procs:
        cli = popen([str(CM_CLIENT), "client", "--port", str(port), "--wait-disconnect"], emu_env(fabric, 2))
        procs.append(cli)
        sout.wait("HOLDING")
        srv.send_signal(signal.SIGKILL)
        rc, out, err = finish(cli, 25)
    lines = out.splitlines()
    assert rc == 0 and lines[-1] == "RESULT OK", out + err
    assert fields(line(lines, "DISCONNECTED")) == {"side": "client", "status": "0"}
    assert line(lines, "LATE_SEND") == "LATE_SEND status=transport retry counter exceeded"


@needs_emu
@needs_cm
def test_client_killed_before_accept(fabric):
    """The active process dies before the server answers: the server's request
    id gets REJECTED (IB CM reason 1, timeout: what the dying side's CM sends)
    and accepting it afterwards fails with EINVAL."""
    port = free_port()
    srv, sout = start_server(fabric, port, "--defer-accept-ms", "8000")
    with reaped(srv) as procs:
        cli = popen([str(CM_CLIENT), "client", "--port", str(port)], emu_env(fabric, 2))
        procs.append(cli)
        sout.wait("REQ")
        cli.send_signal(signal.SIGKILL)
        cli.communicate()
        src, sl = sout.finish()
    assert src == 0, "\n".join(sl)
    assert fields(line(sl, "CHILD_REJECTED")) == {"status": str(REJ_TIMEOUT), "pdata_len": "148"}
    assert fields(line(sl, "ACCEPT_AFTER_REJECT")) == {"rc": "-1", "errno": str(EINVAL)}


@needs_emu
@needs_cm
def test_ud_sidr_handshake(fabric):
    """RDMA_PS_UDP ids: SIDR REQ/REP carry QPN, qkey and private data (180 and
    136 bytes); no QP is needed for the handshake itself."""
    out, sl = client_server_pass(fabric, ["--ud"], ["--ud"])
    req = fields(line(sl, "REQ"))
    assert req["pdata"] == "hello-from-client" and req["pdata_len"] == "180"
    assert req["qp_num"] == "0x1234" and req["qkey"] == "0x1234567" and req["peer"] == "127.0.0.2"
    est = fields(line(out, "ESTABLISHED"))
    assert est["pdata"] == "welcome-from-server" and est["pdata_len"] == "136"
    assert est["qp_num"] == "0x5678" and est["qkey"] == "0x1234567" and est["dlid"] == "1"


@functools.lru_cache(maxsize=None)
def emu_has_ud():
    """The emulated HCA creates UD QPs (emu_cm_client ud-probe)."""
    name = "udprobe" + uuid.uuid4().hex[:8]
    try:
        probe = subprocess.run([str(CM_CLIENT), "ud-probe"], env=emu_env(name, 9), capture_output=True, text=True,
                               timeout=30)
    finally:
        cleanup_fabric(name)
    return "UD_PROBE ok" in probe.stdout


@needs_emu
@needs_cm
def test_ud_qps_through_sidr(fabric):
    """UD QPs on RDMA_PS_UDP ids: rdma_create_qp takes them to RTS with the CM's
    qkey; the SIDR reply's ah_attr/qp_num/qkey address one datagram."""
    if not emu_has_ud():
        pytest.skip("the emulated HCA has no UD QPs (ibv_create_qp(IBV_QPT_UD) fails)")
    out, sl = client_server_pass(fabric, ["--ud-qp"], ["--ud-qp"])
    client_qp = fields(line(out, "UD_SEND"))["qp_num"]
    est = fields(line(out, "ESTABLISHED"))
    assert est["qp_num"] == fields(line(sl, "ACCEPTED"))["qp_num"] and est["qkey"] == "0x1234567"
    assert fields(line(sl, "REQ"))["qp_num"] == client_qp
    assert fields(line(sl, "UD_RECV")) == {"payload": "ud-ping", "src_qp": client_qp, "slid": "2"}


# ---------------------------------------------------------------------------
# real programs: perftest in rdma_cm mode, libfabric's verbs provider


def pair(fabric, server_argv, client_argv, timeout=40, attempts=3, server_env=None, client_env=None):
    """Server (LID 1) + client (LID 2) of a program that takes its TCP port on the
    command line; retried on a fresh port when the port was taken."""
    for _ in range(attempts):
        port = free_port()
        srv = subprocess.Popen(server_argv(port), env=server_env or emu_env(fabric, 1), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        with reaped(srv):
            time.sleep(0.5)
            try:
                cli = subprocess.run(client_argv(port), env=client_env or emu_env(fabric, 2), capture_output=True,
                                     text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{client_argv(port)} timed out")
            src, sout, _ = finish(srv, timeout)
        cout = cli.stdout + cli.stderr
        if "Address already in use" not in sout + cout:
            return (src, sout), (cli.returncode, cout)
    pytest.fail("could not get a free port")


PERFTEST = [("ib_send_bw", "RC", ["-s", "4096"]), ("ib_read_lat", "RC", []), ("ib_send_bw", "UD", ["-s", "1024"])]


@needs_emu
@needs_cm
@pytest.mark.parametrize("prog,conn,extra", PERFTEST, ids=[f"{p}-{c}" for p, c, _ in PERFTEST])
def test_perftest_rdma_cm_mode(fabric, prog, conn, extra):
    """perftest's -R: connection setup (and, for UD, the address handle) through rdma_cm."""
    if shutil.which(prog) is None:
        pytest.skip(f"{prog} (perftest) not installed")
    if conn == "UD" and not emu_has_ud():
        pytest.skip("the emulated HCA has no UD QPs (ibv_create_qp(IBV_QPT_UD) fails)")
    args = ["-R", "-c", conn, "-n", "50", *extra]
    (src, sout), (crc, cout) = pair(fabric, lambda p: [prog, *args, "-p", str(p)],
                                    lambda p: [prog, *args, "-p", str(p), "127.0.0.1"])
    assert src == 0 and crc == 0, sout + cout
    assert "rdma_cm QPs\t : ON" in cout and "remote address: LID 0x01" in cout
    rows = [ln.split() for ln in cout.splitlines() if ln.split()[1:2] == ["50"] and ln.split()[0].isdigit()]
    assert rows, cout


def fi_env(fabric, lid, **extra):
    return emu_env(fabric, lid, **{"FI_LOG_LEVEL": "warn", **extra})


@needs_emu
@needs_cm
@needs_fi
def test_fi_info_lists_the_emulated_device(fabric):
    r = subprocess.run([FI_INFO, "-p", "verbs", "-t", "FI_EP_MSG"], env=fi_env(fabric, 1), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "provider: verbs" in r.stdout and "domain: mlx5_0" in r.stdout and "FI_EP_MSG" in r.stdout
    assert "fabric: IB-0xfe80000000000000" in r.stdout and "FI_PROTO_RDMA_CM_IB_RC" in r.stdout
    r = subprocess.run([FI_INFO, "-p", "verbs", "-t", "FI_EP_MSG", "-v"], env=fi_env(fabric, 1), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and "prov_name: verbs" in r.stdout, r.stdout + r.stderr
    assert "src_addr: fi_sockaddr_in://127.0.0.1:0" in r.stdout   # "localhost" binds on LID 1's address
    # another node's "localhost" is its own loopback address (Open MPI's MTL asks for no node at all)
    r2 = subprocess.run([FI_INFO, "-p", "verbs", "-t", "FI_EP_MSG", "-v"], env=fi_env(fabric, 2),
                        capture_output=True, text=True, timeout=30)
    assert r2.returncode == 0 and "src_addr: fi_sockaddr_in://127.0.0.2:0" in r2.stdout, r2.stdout + r2.stderr
    r = subprocess.run([FI_INFO, "-p", "verbs;ofi_rxm", "-t", "FI_EP_RDM"], env=fi_env(fabric, 1),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "provider: verbs;ofi_rxm" in r.stdout, r.stdout + r.stderr


@needs_emu
@needs_cm
@needs_fi
def test_fi_info_host_address_bound_to_the_device(fabric):
    """SIGMATRACE_EMU_IP_ADDRS gives a node one of the host's addresses: the verbs
    provider then finds it as the device's IPoIB address; without it the
    address is on no RDMA device."""
    host = [a for a in _host_ipv4() if not a.startswith("127.")]
    if not host:
        pytest.skip("the host has no non-loopback IPv4 address")
    addr = host[0]
    r = subprocess.run([FI_INFO, "-p", "verbs", "-t", "FI_EP_MSG", "-s", addr, "-v"],
                       env=fi_env(fabric, 1, SIGMATRACE_EMU_IP_ADDRS=addr, FI_LOG_LEVEL="info"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and f"src_addr: fi_sockaddr_in://{addr}:0" in r.stdout, r.stdout + r.stderr[-2000:]
    assert f"\t{addr}" in r.stderr   # verbs_devs_print: "#1 mlx5_0 - IPoIB addresses:" then the address
    r = subprocess.run([FI_INFO, "-p", "verbs", "-t", "FI_EP_MSG", "-s", addr], env=fi_env(fabric, 1),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0


def _host_ipv4():
    import socket
    import fcntl
    import struct
    out = []
    for name in os.listdir("/sys/class/net"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                req = struct.pack("256s", name.encode()[:15])
                out.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]))   # SIOCGIFADDR
        except OSError:
            continue
    return out


def pingpong_rows(text):
    """fi_pingpong's result rows: bytes, #sent, #ack, total, ..."""
    return [ln.split() for ln in text.splitlines() if ln.split() and ln.split()[0][0].isdigit()]


PINGPONG = [("verbs", "msg", 1000, 50), ("verbs", "msg", 1 << 20, 10),
            ("verbs;ofi_rxm", "rdm", 1000, 50), ("verbs;ofi_rxm", "rdm", 100000, 10)]


@needs_emu
@needs_cm
@needs_fi
@pytest.mark.parametrize("prov,ep,size,iters", PINGPONG, ids=[f"{p}-{e}-{s}" for p, e, s, _ in PINGPONG])
def test_fi_pingpong_verbs(fabric, prov, ep, size, iters):
    """Untraced fi_pingpong over the verbs provider between LID 1 and LID 2: the
    connection is set up by our rdma_cm (rxm puts its connect data in the
    private data), the data moves through the emulated HCA."""
    common = ["-p", prov, "-e", ep, "-I", str(iters), "-S", str(size)]
    (src, sout), (crc, cout) = pair(fabric, lambda p: [FI_PINGPONG, *common, "-B", str(p)],
                                    lambda p: [FI_PINGPONG, *common, "-P", str(p), "127.0.0.1"],
                                    server_env=fi_env(fabric, 1), client_env=fi_env(fabric, 2))
    assert (src, crc) == (0, 0), sout + cout
    for text in (sout, cout):
        rows = pingpong_rows(text)
        assert len(rows) == 1, text
        human = {1000: "1000", 1 << 20: "1m", 100000: "97k"}[size]
        assert rows[0][:3] == [human, str(iters), f"={iters}"], text


@needs_emu
@needs_cm
@needs_fi
def test_fi_pingpong_rxd(fabric):
    """verbs;ofi_rxd runs over verbs DGRAM endpoints (UD QPs and address
    handles, no rdma_cm connections); skipped with the reason on an emulated
    HCA without them.  Both sides close their endpoint with completions still
    in the CQ now and then; libfabric's verbs provider polls that CQ after
    ibv_destroy_qp (vrb_ep_close -> vrb_cleanup_cq) and takes each wr_id as
    its context pointer, so the emulator must have removed the destroyed QP's
    CQEs as rdma-core's mlx5 does (a SIGSEGV at wr_id 0 before; the direct
    check is emu_err_client's cq_clean, test_emu_hca.py)."""
    r = subprocess.run([FI_INFO, "-p", "verbs", "-t", "FI_EP_DGRAM"], env=fi_env(fabric, 1), capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0 or "FI_EP_DGRAM" not in r.stdout:
        pytest.skip("verbs FI_EP_DGRAM (what ofi_rxd needs) is not offered: the emulated HCA has no UD QPs/AH "
                    "(ibv_create_qp(IBV_QPT_UD) and ibv_create_ah fail with EOPNOTSUPP; "
                    "libfabric's vrb_get_qp_cap drops the DGRAM domain)")
    common = ["-p", "verbs;ofi_rxd", "-e", "rdm", "-I", "20", "-S", "1000"]
    (src, sout), (crc, cout) = pair(fabric, lambda p: [FI_PINGPONG, *common, "-B", str(p)],
                                    lambda p: [FI_PINGPONG, *common, "-P", str(p), "127.0.0.1"],
                                    server_env=fi_env(fabric, 1), client_env=fi_env(fabric, 2))
    assert (src, crc) == (0, 0), sout + cout
    assert pingpong_rows(cout)[0][:3] == ["1000", "20", "=20"], cout


@needs_emu
@needs_cm
@needs_fi
def test_fi_pingpong_over_a_host_address(fabric):
    """The server node owns one of the host's addresses (SIGMATRACE_EMU_IP_ADDRS);
    the client reaches it by that address (its own source: 127.0.0.2)."""
    host = [a for a in _host_ipv4() if not a.startswith("127.")]
    if not host:
        pytest.skip("the host has no non-loopback IPv4 address")
    common = ["-p", "verbs", "-e", "msg", "-I", "20", "-S", "1000"]
    (src, sout), (crc, cout) = pair(fabric, lambda p: [FI_PINGPONG, *common, "-B", str(p)],
                                    lambda p: [FI_PINGPONG, *common, "-P", str(p), host[0]],
                                    server_env=fi_env(fabric, 1, SIGMATRACE_EMU_IP_ADDRS=host[0]),
                                    client_env=fi_env(fabric, 2))
    assert (src, crc) == (0, 0), sout + cout
    assert pingpong_rows(cout)[0][:3] == ["1000", "20", "=20"], cout


# ---------------------------------------------------------------------------
# traced: the libfabric operations and the verbs work requests beneath them, matched to the peer

TRACED_PINGPONG = [("verbs", "msg"), ("verbs;ofi_rxm", "rdm"), ("verbs;ofi_rxd", "rdm")]
LIB = _native.tracer_library()


@needs_emu
@needs_cm
@needs_fi
@pytest.mark.skipif(LIB is None, reason="needs libsigmatrace.so")
@pytest.mark.parametrize("prov,ep", TRACED_PINGPONG, ids=[f"{p}-{e}" for p, e in TRACED_PINGPONG])
def test_fi_pingpong_verbs_traced(fabric, tmp_path, prov, ep):
    """fi_pingpong over the verbs provider, both sides traced in full mode: it ends as untraced (exit 0, its
    result row); each side's libfabric sends of the test's size are the iterations (+ the warm-up fi_pingpong
    makes), every libfabric operation and every verbs work request matched to the other side -- rxm over RC
    QPs connected by rdma_cm, rxd over UD QPs whose datagrams name their destination by address handle."""
    from sigmatrace.correlate import correlate
    size, iters = 1000, 20
    out = tmp_path / "trace"
    traced = dict(LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out), SIGMATRACE_MODE="full")
    common = ["-p", prov, "-e", ep, "-I", str(iters), "-S", str(size)]
    (src, sout), (crc, cout) = pair(fabric, lambda p: [FI_PINGPONG, *common, "-B", str(p)],
                                    lambda p: [FI_PINGPONG, *common, "-P", str(p), "127.0.0.1"],
                                    server_env=fi_env(fabric, 1, **traced), client_env=fi_env(fabric, 2, **traced))
    assert (src, crc) == (0, 0), sout + cout
    assert pingpong_rows(cout)[0][:3] == ["1000", str(iters), f"={iters}"], cout
    corr = correlate(out, workers=1)
    ops, P = corr.tables["ops"], corr.tables["processes"]
    assert len(P["pid"]) == 2
    u = corr.stats["unmatched"]
    assert u["libfabric"]["operations"] > 0 and u["libfabric"]["unmatched"] == 0, u
    assert u["verbs_wr"]["operations"] > 0 and u["verbs_wr"]["unmatched"] == 0, u
    assert bool(np.all(ops["matched"])), u
    proc, dst, src_name = np.asarray(ops["process"]), np.asarray(ops["dst_process"]), np.asarray(ops["source_name"])
    assert bool(np.all(dst == 1 - proc)), "every operation goes to the other side"
    for i in (0, 1):
        sends = (proc == i) & (src_name == "ofi") & (np.asarray(ops["bytes"]) == size)
        assert int(sends.sum()) == iters, (i, int(sends.sum()))        # fi_pingpong's -I, exactly
        sync = (proc == i) & (src_name == "ofi") & (np.asarray(ops["bytes"]) == 4)
        assert int(sync.sum()) == 1                                         # its one 4-byte sync message
        wr = (proc == i) & (src_name == "verbs_wr") & (np.asarray(ops["opcode_name"]) == "SEND")
        wr_bytes = Counter(np.asarray(ops["bytes"])[wr].tolist())
        if prov == "verbs":        # the msg endpoint: one work request per libfabric send, the same bytes
            assert wr_bytes[size] == iters and wr_bytes[4] == 1, wr_bytes
        elif prov.endswith("rxm"):  # rxm's eager protocol: its header (64 bytes here) in front of the data
            assert wr_bytes[size + 64] == iters, wr_bytes
        else:                       # rxd over UD: a 16-byte header; a datagram may be sent again
            assert wr_bytes[size + 16] >= iters, wr_bytes
    # F25: each libfabric send -> the verbs work request it posted (ops.parent_op_id, docs/report.md); rxd's
    # datagrams are not linked (its own packets share the UD QP: no sound rule)
    parent, op_id = np.asarray(ops["parent_op_id"]), np.asarray(ops["op_id"])
    nb, opname = np.asarray(ops["bytes"]), np.asarray(ops["opcode_name"])
    link = corr.stats["ofi_wqe_link"]
    if prov.endswith("rxd"):
        assert (parent == -1).all(), link
        return
    header = 0 if prov == "verbs" else 64
    calls = np.flatnonzero((src_name == "ofi") & np.isin(nb, [size, 4]))
    assert link["linked"] >= len(calls), link
    for k in calls:
        kids = np.flatnonzero(parent == op_id[k])
        assert len(kids) == 1 and src_name[kids[0]] == "verbs_wr" and opname[kids[0]] == "SEND" \
            and nb[kids[0]] == nb[k] + header and proc[kids[0]] == proc[k], (k, kids, nb[kids])
