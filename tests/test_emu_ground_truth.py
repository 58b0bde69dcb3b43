"""The trace against the emulated NIC's own record of what it executed (marker sim).

The emulated HCA counts every send-queue WQE it puts on the wire, per mlx5 opcode and with its payload bytes,
and every receive WQE an incoming message consumed (SIGMATRACE_EMU_STATS, native/emu/nic.c).  That record
is independent of the tracer: the correlated operations of each traced process must equal it opcode for
opcode, WQE for WQE and byte for byte — the check the NCCL issue asks of real NCCL on the GPU machine, made
here on perftest and rdma-core's examples.
"""
import shutil
import subprocess
from collections import Counter

import pytest

from native_util import free_port, popen, read_emu_stats, reaped, wait_listen
from sigmatrace.correlate import correlate
from test_trace_verbs_support import env_for, needs_tracer

pytestmark = [pytest.mark.sim, needs_tracer]

PROGRAMS = [
    ("ibv_rc_pingpong", ["-s", "512", "-n", "200"]),
    ("ib_write_bw", ["-d", "mlx5_0", "-s", "4096", "-n", "300"]),
    ("ib_read_bw", ["-d", "mlx5_0", "-s", "2048", "-n", "200"]),
    ("ib_send_bw", ["-d", "mlx5_0", "-s", "1024", "-n", "200"]),
    ("ib_atomic_bw", ["-d", "mlx5_0", "-n", "200"]),
]


def run_pair(argv, fabric, out, stats, mode):
    port = str(free_port())
    argv = list(argv) + ["-p", port]
    env = lambda lid: env_for(fabric, lid, out, mode, SIGMATRACE_EMU_STATS=f"{stats}/emu-stats.%p.json")
    srv = popen(argv, env(0x21))
    with reaped(srv):
        wait_listen(int(port), srv)
        cli = subprocess.run(argv + ["localhost"], env=env(0x22), capture_output=True, text=True, timeout=60)
        so, se = srv.communicate(timeout=60)
    assert cli.returncode == 0 and srv.returncode == 0, (cli.stdout + cli.stderr + so + se)[-3000:]


@pytest.mark.parametrize("mode", ["full", "simple"])
@pytest.mark.parametrize("prog,args", PROGRAMS, ids=[p for p, _ in PROGRAMS])
def test_trace_equals_what_the_nic_executed(fabric, tmp_path, prog, args, mode):
    path = shutil.which(prog)
    if path is None:
        pytest.skip(f"{prog} not installed")
    out, stats = tmp_path / "trace", tmp_path / "stats"
    out.mkdir()
    stats.mkdir()
    run_pair([path, *args], fabric, out, stats, mode)
    truth = read_emu_stats(stats)
    corr = correlate(out, workers=1)
    P = corr.tables["processes"]
    assert sorted(int(p) for p in P["pid"]) == sorted(truth), "one trace and one NIC record per process"
    ops = corr.tables["ops"]
    o_proc, o_code, o_bytes, o_nwr = (ops[c] for c in ("process", "opcode", "bytes", "num_wr"))
    for i, pid in enumerate(P["pid"]):
        nic = truth[int(pid)]
        want_n = {int(k, 16): v for k, v in nic["wqes_by_opcode"].items()}
        want_b = {int(k, 16): v for k, v in nic["bytes_by_opcode"].items()}
        mine = o_proc == i
        if mode == "full":       # one operation per work request, its mlx5 opcode from the verbs opcode
            got_n = Counter(int(c) for c in o_code[mine])
            got_b = Counter()
            for c, b in zip(o_code[mine], o_bytes[mine]):
                got_b[int(c)] += int(b)
            assert dict(got_n) == want_n, (prog, int(pid), dict(got_n), want_n)
            assert dict(got_b) == want_b, (prog, int(pid), dict(got_b), want_b)
        else:                    # simple mode: post calls, each with its number of WRs and bytes
            assert int(o_nwr[mine].sum()) == sum(want_n.values()), (prog, int(pid))
            assert int(o_bytes[mine].sum()) == sum(want_b.values()), (prog, int(pid))
        if mode == "full":
            comp = corr.tables["completions"]
            recvs = int(((comp["process"] == i) & comp["is_recv"]).sum())
            assert recvs == nic["recvs_consumed"], (prog, int(pid), recvs, nic["recvs_consumed"])
