"""The native tracer inside unmodified fi_pingpong (libfabric-bin), F11/F3.

Server and client both run with libsigmatrace.so preloaded over loopback on
an ephemeral port; the decoded traces must contain the sends and receives
the run performed (fi_pingpong: -I iterations of -S bytes each way, plus one
4-byte synchronisation message per side), aggregate totals must equal the
bytes moved, and the programs' exit codes and result lines must be those of
an untraced run.
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from native_util import assert_idle_runs_coalesced, traced_tool, free_port, serve_and_connect
from sigmatrace import _native
from sigmatrace.format import events as E
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

LIB, FI_PINGPONG, needs = traced_tool("fi_pingpong", "libfabric-bin")
ITERS, SIZE = 40, 1000


def pingpong(tmp_path, prov, ep, mode=None, providers=None, iters=ITERS, size=SIZE, traced=True, extra_env=None):
    """Run server + client; returns (out_dir, (server rc, out), (client rc, out))."""
    out = tmp_path / f"trace-{prov}-{ep}-{mode}-{providers}-{traced}"
    env = dict(os.environ)
    if traced:
        env.update(LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out))
        if mode:
            env["SIGMATRACE_MODE"] = mode
        if providers is not None:
            env["SIGMATRACE_PROVIDERS"] = providers
    env.update(extra_env or {})
    common = ["-p", prov, "-e", ep, "-I", str(iters), "-S", str(size)]
    srv, cli = serve_and_connect(lambda port: [FI_PINGPONG, *common, "-B", str(port)],
                                 lambda port: [FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"], env, settle=0.3)
    return out, srv, cli


def pingpong_passed(tmp_path, prov, ep, **kw):
    """pingpong whose server and client both exit 0: the trace directory."""
    out, (rc_s, out_s), (rc_c, out_c) = pingpong(tmp_path, prov, ep, **kw)
    assert rc_s == rc_c == 0, out_s + out_c
    return out


def result_fields(text):
    """The data line of fi_pingpong's result table: bytes, #sent, #ack, total."""
    lines = [l.split() for l in text.splitlines() if l and l.split()[0].isdigit()]
    assert lines, text
    return [l[:4] for l in lines]


def per_process(cap):
    procs = []
    for i, p in enumerate(cap.processes):
        t_send, t_recv = cap.table("OFI_SEND"), cap.table("OFI_RECV")
        s = t_send["process"] == i
        r = t_recv["process"] == i
        procs.append(dict(proc=p, send_bytes=t_send["bytes"][s], recv_bytes=t_recv["bytes"][r],
                          counts=cap.events["type"][cap.event_process == i]))
    return procs


@needs
@pytest.mark.parametrize("prov,ep", [("tcp", "msg"), ("sockets", "rdm"), ("udp", "dgram")])
def test_pingpong_simple_mode(tmp_path, prov, ep):
    base_dir, (brc_s, bout_s), (brc_c, bout_c) = pingpong(tmp_path, prov, ep, traced=False)
    out, (rc_s, out_s), (rc_c, out_c) = pingpong(tmp_path, prov, ep)
    assert (rc_s, rc_c) == (brc_s, brc_c) == (0, 0), out_s + out_c
    # the result table is the same as without the tracer (times aside)
    assert result_fields(out_c) == result_fields(bout_c)
    assert result_fields(out_s) == result_fields(bout_s)
    assert not base_dir.exists()

    files = sorted(out.iterdir())
    assert len(files) == 2 and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    cap = read_capture(out)
    assert cap.losses == [] and len(cap.processes) == 2
    for p in per_process(cap):
        proc = p["proc"]
        assert proc.complete and proc.end["dropped_events"] == 0
        assert proc.header["mode"] == "simple" and "ofi" in proc.header["providers"]
        sb = p["send_bytes"]
        # ITERS data messages of SIZE bytes + one 4-byte sync message
        assert np.count_nonzero(sb == SIZE) == ITERS, sb
        assert len(sb) == ITERS + 1 and sorted(set(sb.tolist())) == [4, SIZE]
        # every message received needs a posted receive of the buffer size
        assert ITERS + 1 <= len(p["recv_bytes"]) <= ITERS + 3
        assert np.all(p["recv_bytes"] >= SIZE)
        # simple mode: no polling records
        names = {E.name_of(t) for t in np.unique(p["counts"])}
        assert "OFI_CQ_READ" not in names and "OFI_COMPLETION" not in names
        assert {"OFI_FABRIC", "OFI_DOMAIN", "OFI_ENDPOINT", "OFI_CQ_OPEN"} <= names
        ep_rec = cap.table("OFI_ENDPOINT")
        sid = int(ep_rec["side_id"][ep_rec["process"] == proc.index][0])
        info = proc.side[sid].json()
        assert info["provider"].split(";")[0] in (prov, "ofi_rxd", "ofi_rxm") or prov in info["provider"]
        assert info["ep_type"] == ep
        if ep != "msg":
            assert "OFI_AV_INSERT" in names  # peer identity of unconnected endpoints


@needs
def test_pingpong_aggregate_totals(tmp_path):
    out = pingpong_passed(tmp_path, "sockets", "msg", mode="aggregate")
    cap = read_capture(out)
    for p in cap.processes:
        assert p.header["mode"] == "aggregate"
        agg = p.aggregates
        send = agg[agg["type"] == E.value("OFI_SEND")]
        assert int(send["bytes"].sum()) == ITERS * SIZE + 4  # bytes moved by this side
        assert int(send["count"].sum()) == ITERS + 1
        recv = agg[agg["type"] == E.value("OFI_RECV")]
        assert int(recv["count"].sum()) >= ITERS + 1
        # completions were counted: one per send and per receive that completed
        comp = agg[agg["type"] == E.value("OFI_COMPLETION")]
        assert int(comp["count"].sum()) >= 2 * (ITERS + 1) - 1
        # no operation events, only lifecycle ones
        types = {E.name_of(t) for t in np.unique(cap.events["type"][cap.event_process == p.index])}
        assert not types & {"OFI_SEND", "OFI_RECV", "OFI_CQ_READ"}
    # the file is tiny compared with simple mode
    assert sum(f.stat().st_size for f in out.iterdir()) < 40000


@needs
def test_pingpong_full_mode_completions(tmp_path):
    cap = read_capture(pingpong_passed(tmp_path, "tcp", "msg", mode="full"))
    for p in cap.processes:
        i = p.index
        assert p.end["dropped_events"] == 0
        send = cap.table("OFI_SEND")
        mine = send["process"] == i
        assert np.count_nonzero(send["bytes"][mine] == SIZE) == ITERS
        # full mode: EXT with the context of every post; completions carry it back
        ctx_posted = set(send["context"][mine].tolist()) | set(cap.table("OFI_RECV")["context"][
            cap.table("OFI_RECV")["process"] == i].tolist())
        comp = cap.table("OFI_COMPLETION")
        done = comp["context"][comp["process"] == i]
        assert len(done) >= 2 * ITERS
        assert set(done.tolist()) <= ctx_posted | {0}
        reads = cap.table("OFI_CQ_READ")
        # every completion came out of a recorded read that returned it
        assert int(reads["returned"][reads["process"] == i].sum()) == len(done)
        assert assert_idle_runs_coalesced(cap, i, {E.value("OFI_CQ_READ")}) > 0   # the loop polled in vain at times



@needs
def test_disabled_provider_records_nothing_but_says_so(tmp_path):
    out = pingpong_passed(tmp_path, "tcp", "msg", providers="ucx,ibv")
    # no libfabric record; the file exists only to say that libfabric was loaded untraced (issue 17)
    cap = read_capture(out)
    assert len(cap.processes) == 2 and not np.any((cap.events["type"] >> 8) == E.LAYER_OFI)
    for p in cap.processes:
        assert {"library": "libfabric.so.1", "provider": "ofi", "reason": "disabled"}.items() <= \
            next(x for x in p.untraced_libraries if x["library"] == "libfabric.so.1").items()


@needs
def test_sigmatrace_run_two_ranks_share_a_directory(tmp_path):
    """`sigmatrace run` around both sides, rank variables as mpirun sets them."""
    out = tmp_path / "ranks"
    port = free_port()
    common = ["-p", "tcp", "-e", "msg", "-I", "10", "-S", "64"]
    runner = [sys.executable, "-m", "sigmatrace", "run", "-o", str(out), "--mode", "simple", "--providers", "ofi", "--"]
    env = dict(os.environ, PYTHONPATH=str(_native.SOURCE_ROOT))
    env.pop("LD_PRELOAD", None)
    srv = subprocess.Popen(runner + [FI_PINGPONG, *common, "-B", str(port)],
                           env=dict(env, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    cli = subprocess.run(runner + [FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"],
                         env=dict(env, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2"),
                         capture_output=True, text=True, timeout=30)
    srv.communicate(timeout=30)
    assert srv.returncode == 0 and cli.returncode == 0, cli.stderr
    names = sorted(f.name for f in out.iterdir())
    assert len(names) == 2 and ".r0." in names[0] + names[1] and ".r1." in names[0] + names[1]
    cap = read_capture(out)
    assert sorted(p.rank for p in cap.processes) == [0, 1]
    assert all(p.header["world_size"] == 2 and p.header["launcher"] == "mpirun" for p in cap.processes)
    assert all(p.header["providers"] == ["ofi"] for p in cap.processes)


@needs
@pytest.mark.parametrize("ep", ["rdm", "msg"])
def test_every_operation_matched_to_its_peer(tmp_path, ep):
    """fi_pingpong over tcp, both sides traced: every libfabric operation has its peer process.  An rdm
    endpoint's fi_info src_addr has port 0; the tracer records the address it is bound to once enabled
    (a second OFI_ENDPOINT record, "bound": true), which is what the peer's AV holds."""
    from sigmatrace.correlate import correlate
    out = pingpong_passed(tmp_path, "tcp", ep, mode="full")
    corr = correlate(out, workers=1)
    ops = corr.tables["ops"]
    assert len(ops["op_id"]) >= 2 * ITERS
    assert bool(ops["matched"].all()), corr.stats["unmatched"]
    assert corr.stats["unmatched"]["libfabric"]["unmatched"] == 0
    P = corr.tables["processes"]
    assert set(ops["dst_process"].tolist()) == set(P["process"].tolist())


@needs
def test_unmatched_operations_are_explained(tmp_path):
    """Only the client traced: its operations cannot be matched, and the report says how many and why."""
    from sigmatrace.correlate import correlate
    out = tmp_path / "trace"
    common = ["-p", "tcp", "-e", "rdm", "-I", str(ITERS), "-S", str(SIZE)]
    env_cli = dict(os.environ, LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out), SIGMATRACE_MODE="full")
    env_srv = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    port = free_port()
    srv = subprocess.Popen([FI_PINGPONG, *common, "-B", str(port)], env=env_srv, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.3)
        cli = subprocess.run([FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"], env=env_cli,
                             capture_output=True, text=True, timeout=30)
        srv.communicate(timeout=30)
    finally:
        srv.kill()
    assert cli.returncode == 0, cli.stdout + cli.stderr
    corr = correlate(out, workers=1)
    u = corr.stats["unmatched"]["libfabric"]
    assert u["unmatched"] == u["operations"] > 0
    assert all("no traced endpoint" in r for r in u["reasons"]), u
    assert any(f"{u['unmatched']} of {u['operations']} libfabric operations are not matched" in w
               for w in corr.warnings), corr.warnings
