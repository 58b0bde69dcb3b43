"""The libibverbs provider traced inside unmodified programs on the emulated HCA.

ibv_rc_pingpong (Debian ibverbs-utils) server + client, perftest, and a client
that reaches libibverbs through dlopen + dlsym/dlvsym (as NCCL does): the
decoded traces hold exactly the work requests and completions the programs
performed, the QP topology links both processes both ways, and every
signalled send WR pairs with exactly one completion (F24a: per-WR latency).
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

from sigmatrace.format import events as E

from native_util import assert_idle_runs_coalesced, needs_bin, needs_emu
from test_trace_verbs_support import (RC_PINGPONG, capture, env_for, needs_tracer, per_process,
                                      pingpong_recvs_posted, run_pair)

pytestmark = [pytest.mark.sim, needs_emu, needs_tracer]

IBV_WR_RDMA_WRITE, IBV_WR_SEND = 0, 2
IBV_SEND_SIGNALED = 2
IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RECV = 0, 1, 128
IBV_QPS_RTR = 2
PINGPONG_RECV_WRID, PINGPONG_SEND_WRID = 1, 2
LIDS = (0x11, 0x12)


def printed_addresses(stdout):
    """(local (lid, qpn), remote (lid, qpn)) as ibv_rc_pingpong prints them."""
    loc = re.search(r"local address:\s+LID 0x([0-9a-f]+), QPN 0x([0-9a-f]+)", stdout)
    rem = re.search(r"remote address:\s+LID 0x([0-9a-f]+), QPN 0x([0-9a-f]+)", stdout)
    assert loc and rem, stdout
    return (int(loc[1], 16), int(loc[2], 16)), (int(rem[1], 16), int(rem[2], 16))


def process_by_lid(cap):
    """{emulated LID: process index} from the NIC identity in each process header."""
    out = {}
    for p in cap.processes:
        nics = (p.header or {}).get("nics") or []
        assert len(nics) == 1, nics
        nic = nics[0]
        lid = nic["ports"][0]["lid"]
        assert nic["name"] == "mlx5_0"
        assert nic["node_guid"] == f"{0x0002c90300000000 | lid:016x}"  # the emulator's default GUID
        assert nic["ports"][0]["gids"], nic
        out[lid] = p.index
    return out


def check_topology(cap, stdouts):
    """Each side's local QPN is the other's dest QPN, and its LID the other's dlid."""
    by_lid = process_by_lid(cap)
    assert sorted(by_lid) == sorted(LIDS)
    cq = cap.table("IBV_CREATE_QP")
    mq = cap.table("IBV_MODIFY_QP")
    local = {}
    for out in stdouts:
        (llid, lqpn), (rlid, rqpn) = printed_addresses(out)
        p = by_lid[llid]
        assert list(cq["qpn"][cq["process"] == p]) == [lqpn]
        local[p] = (llid, lqpn)
    for p, (llid, lqpn) in local.items():
        other = [q for q in local if q != p][0]
        olid, oqpn = local[other]
        rtr = (mq["process"] == p) & (mq["state"] == IBV_QPS_RTR)
        assert per_process(mq, p, rtr) == 1
        assert int(mq["qpn"][rtr][0]) == lqpn
        assert int(mq["dest_qpn"][rtr][0]) == oqpn, "dest QPN is the peer's local QPN"
        assert int(mq["dlid"][rtr][0]) == olid, "dlid is the peer's LID"
        js = cap.side_record(p, mq["side_id"][rtr][0]).json()
        assert js["dest_qp_num"] == oqpn and js["dlid"] == olid and js["state"] == IBV_QPS_RTR
        # state machine: INIT, RTR, RTS in that order
        assert list(mq["state"][mq["process"] == p]) == [1, 2, 3]
    return local


def pair_signalled(cap, proc, sig_all=False):
    """F24a with numpy: signalled send WRs and send-side completions of one
    process, per QP in post order (an RC QP completes in order).  Returns the
    per-WR latencies in TSC ticks; asserts one completion per signalled WR
    with the same wr_id."""
    swr, wc = cap.table("IBV_SEND_WR"), cap.table("IBV_WC")
    s = (swr["process"] == proc) & (((swr["send_flags"] & IBV_SEND_SIGNALED) != 0) | bool(sig_all))
    c = (wc["process"] == proc) & (wc["opcode"] < IBV_WC_RECV)
    lat = []
    for qpn in np.union1d(swr["qpn"][s], wc["qpn"][c]):
        ss, cc = s & (swr["qpn"] == qpn), c & (wc["qpn"] == qpn)
        so = np.argsort(swr["tsc"][ss], kind="stable")
        co = np.argsort(wc["tsc"][cc], kind="stable")
        assert np.count_nonzero(ss) == np.count_nonzero(cc), f"QP {qpn:#x}: signalled WRs vs completions"
        np.testing.assert_array_equal(swr["wr_id"][ss][so], wc["wr_id"][cc][co])
        d = wc["tsc"][cc][co].astype(np.int64) - swr["tsc"][ss][so].astype(np.int64)
        assert (d > 0).all(), "a completion before its post"
        lat.append(d)
    return np.concatenate(lat) if lat else np.zeros(0, np.int64)


# ---------------------------------------------------------------------------
# ibv_rc_pingpong

@needs_bin(RC_PINGPONG)
@pytest.mark.parametrize("size,iters,rx_depth", [(1, 10, 500), (64, 300, 500), (4096, 600, 100)])
def test_rc_pingpong_full(fabric, tmp_path, size, iters, rx_depth):
    argv = [RC_PINGPONG, "-s", str(size), "-n", str(iters), "-r", str(rx_depth)]
    srv, cli = run_pair(argv, fabric, tmp_path, "full")
    cap = capture(tmp_path)
    assert len(cap.processes) == 2
    check_topology(cap, [srv, cli])
    swr, ps, rwr, pr = (cap.table(n) for n in ("IBV_SEND_WR", "IBV_POST_SEND", "IBV_RECV_WR", "IBV_POST_RECV"))
    wc, poll = cap.table("IBV_WC"), cap.table("IBV_POLL_CQ")
    posted = pingpong_recvs_posted(iters, rx_depth)
    for p in (0, 1):
        # every ibv_post_send carried one SEND of `size` bytes, wr_id PINGPONG_SEND_WRID, signalled
        assert per_process(ps, p) == iters and per_process(swr, p) == iters
        m = swr["process"] == p
        assert (swr["opcode"][m] == IBV_WR_SEND).all() and (swr["bytes"][m] == size).all()
        assert (swr["wr_id"][m] == PINGPONG_SEND_WRID).all() and (swr["num_sge"][m] == 1).all()
        assert (swr["send_flags"][m] & IBV_SEND_SIGNALED).all()
        m = ps["process"] == p
        assert (ps["num_wr"][m] == 1).all() and (ps["ret"][m] == 0).all() and (ps["bytes"][m] == size).all()
        # receives: rx_depth up front plus the refills, one WR per call
        assert per_process(pr, p) == posted and per_process(rwr, p) == posted
        assert (rwr["bytes"][rwr["process"] == p] == size).all()
        # completions: iters sends and iters receives, all successful
        m = wc["process"] == p
        assert (wc["status"][m] == 0).all()
        assert per_process(wc, p, wc["opcode"] == IBV_WC_SEND) == iters
        rc = m & (wc["opcode"] == IBV_WC_RECV)
        assert np.count_nonzero(rc) == iters and (wc["byte_len"][rc] == size).all()
        assert (wc["wr_id"][rc] == PINGPONG_RECV_WRID).all()
        # the polls returned exactly those completions; the empty ones between are recorded as runs
        assert int(poll["returned"][poll["process"] == p].sum()) == 2 * iters
        # (rc_pingpong busy-polls while the emulated NIC works: some runs are longer than one poll)
        assert assert_idle_runs_coalesced(cap, p, {E.value("IBV_POLL_CQ")}) > 0
        lat = pair_signalled(cap, p)
        assert len(lat) == iters


@needs_bin(RC_PINGPONG)
def test_rc_pingpong_simple_mode(fabric, tmp_path):
    iters, size, rx = 700, 2048, 100
    run_pair([RC_PINGPONG, "-s", str(size), "-n", str(iters), "-r", str(rx)], fabric, tmp_path, "simple")
    cap = capture(tmp_path)
    counts = cap.count_by_type()
    for name in ("IBV_SEND_WR", "IBV_RECV_WR", "IBV_POLL_CQ", "IBV_WC"):
        assert name not in counts, f"simple mode recorded {name}"
    ps, pr = cap.table("IBV_POST_SEND"), cap.table("IBV_POST_RECV")
    for p in (0, 1):
        assert per_process(ps, p) == iters and per_process(pr, p) == pingpong_recvs_posted(iters, rx)
        m = ps["process"] == p
        assert (ps["wr_id"][m] == PINGPONG_SEND_WRID).all() and (ps["opcode"][m] == IBV_WR_SEND).all()
        assert int(ps["bytes"][m].sum()) == iters * size


@needs_bin(RC_PINGPONG)
def test_rc_pingpong_aggregate_mode(fabric, tmp_path):
    iters, size = 400, 512
    srv, cli = run_pair([RC_PINGPONG, "-s", str(size), "-n", str(iters)], fabric, tmp_path, "aggregate")
    cap = capture(tmp_path)
    counts = cap.count_by_type()
    for name in ("IBV_POST_SEND", "IBV_SEND_WR", "IBV_POST_RECV", "IBV_WC"):
        assert name not in counts, f"aggregate mode recorded {name} events"
    local = check_topology(cap, [srv, cli])  # lifecycle events stay
    for p in cap.processes:
        a = p.aggregates
        assert a is not None and len(a), "no aggregate records"
        other = [q for q in local if q != p.index][0]
        olid, oqpn = local[other]
        peer = (olid << 32) | oqpn
        s = a[a["type"] == E.value("IBV_SEND_WR")]
        assert int(s["count"].sum()) == iters and int(s["bytes"].sum()) == iters * size
        assert set(s["peer"].tolist()) == {peer} and set(s["aux"].tolist()) == {IBV_WR_SEND}
        w = a[a["type"] == E.value("IBV_WC")]
        assert int(w["count"].sum()) == 2 * iters
        r = a[a["type"] == E.value("IBV_RECV_WR")]
        assert int(r["count"].sum()) == pingpong_recvs_posted(iters, 500)


@needs_bin(RC_PINGPONG)
def test_rc_pingpong_new_send_api(fabric, tmp_path):
    """--new_send: ibv_wr_start / ibv_wr_send / ibv_wr_set_sge / ibv_wr_complete
    through the patched ibv_qp_ex function pointers."""
    iters, size = 200, 100
    srv, cli = run_pair([RC_PINGPONG, "-N", "-s", str(size), "-n", str(iters)], fabric, tmp_path, "full")
    cap = capture(tmp_path)
    check_topology(cap, [srv, cli])
    assert "IBV_POST_SEND" not in cap.count_by_type()
    wc, swr = cap.table("IBV_WR_COMPLETE"), cap.table("IBV_SEND_WR")
    for p in (0, 1):
        m = wc["process"] == p
        assert np.count_nonzero(m) == iters
        assert (wc["num_wr"][m] == 1).all() and (wc["bytes"][m] == size).all()
        m = swr["process"] == p
        assert np.count_nonzero(m) == iters and (swr["opcode"][m] == IBV_WR_SEND).all()
        assert (swr["bytes"][m] == size).all() and (swr["wr_id"][m] == PINGPONG_SEND_WRID).all()
        assert len(pair_signalled(cap, p)) == iters


@needs_bin(RC_PINGPONG)
def test_rc_pingpong_completion_events(fabric, tmp_path):
    """-e: ibv_req_notify_cq (inline, ops table) and ibv_get_cq_event (symbol)."""
    iters = 100
    run_pair([RC_PINGPONG, "-e", "-s", "32", "-n", str(iters)], fabric, tmp_path, "full")
    cap = capture(tmp_path)
    rn, ge, wc = cap.table("IBV_REQ_NOTIFY_CQ"), cap.table("IBV_GET_CQ_EVENT"), cap.table("IBV_WC")
    for p in (0, 1):
        nev = per_process(ge, p)
        assert nev >= 1
        assert per_process(rn, p) == nev + 1  # one arm before the loop, one per event
        assert per_process(wc, p) == 2 * iters


# ---------------------------------------------------------------------------
# perftest

PERFTEST = [
    # (program, args, per-process expectations)
    ("ib_send_lat", ["-s", "64", "-n", "300"]),
    ("ib_write_bw", ["-s", "4096", "-n", "300"]),
]


@pytest.mark.parametrize("prog,args", PERFTEST, ids=[p for p, _ in PERFTEST])
def test_perftest_traced(fabric, tmp_path, prog, args):
    path = shutil.which(prog)
    if path is None:
        pytest.skip(f"{prog} (perftest) not installed")
    n = int(args[args.index("-n") + 1])
    size = int(args[args.index("-s") + 1])
    argv = [path, "-d", "mlx5_0"] + args
    run_pair(argv, fabric, None)          # untraced first: the program itself works
    run_pair(argv, fabric, tmp_path, "full")
    cap = capture(tmp_path)
    assert len(cap.processes) == 2
    swr, wc, mq = cap.table("IBV_SEND_WR"), cap.table("IBV_WC"), cap.table("IBV_MODIFY_QP")
    # topology: both ends name each other
    rtr = mq["state"] == IBV_QPS_RTR
    cq = cap.table("IBV_CREATE_QP")
    qpn = {int(p): int(q) for p, q in zip(cq["process"], cq["qpn"])}
    for p, d in zip(mq["process"][rtr], mq["dest_qpn"][rtr]):
        assert int(d) == qpn[1 - int(p)]
    if prog == "ib_send_lat":
        for p in (0, 1):
            m = swr["process"] == p
            assert np.count_nonzero(m) == n and (swr["opcode"][m] == IBV_WR_SEND).all()
            assert (swr["bytes"][m] == size).all()
            assert per_process(wc, p, wc["opcode"] == IBV_WC_RECV) == n
            assert len(pair_signalled(cap, p)) == per_process(swr, p, (swr["send_flags"] & IBV_SEND_SIGNALED) != 0)
    else:
        writer = [p for p in (0, 1) if per_process(swr, p)]
        assert len(writer) == 1, "one side writes"
        w = writer[0]
        m = swr["process"] == w
        assert np.count_nonzero(m) == n and (swr["opcode"][m] == IBV_WR_RDMA_WRITE).all()
        assert (swr["bytes"][m] == size).all() and (swr["raddr"][m] != 0).all() and (swr["rkey"][m] != 0).all()
        # selective signalling (cq_mod): completions only for the signalled WRs
        nsig = per_process(swr, w, (swr["send_flags"] & IBV_SEND_SIGNALED) != 0)
        assert 1 <= nsig <= n
        assert per_process(wc, w, wc["opcode"] == IBV_WC_RDMA_WRITE) == nsig
        assert len(pair_signalled(cap, w)) == nsig


# ---------------------------------------------------------------------------
# dlopen + dlsym/dlvsym (the NCCL way) vs directly linked

SRC = __import__("pathlib").Path(__file__).resolve().parents[1] / "native" / "tests" / "trace_dlopen_verbs.c"


def build_client(tmp_path, direct):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / ("direct" if direct else "dlopen")
    cmd = [cc, "-O1", "-Wall", "-o", str(exe), str(SRC)] + (["-DST_DIRECT", "-libverbs"] if direct else ["-ldl"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode and direct and "ibverbs" in r.stderr:
        pytest.skip("cannot link -libverbs: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    return exe


def run_client(exe, fabric, out, iters, size):
    r = subprocess.run([str(exe), str(iters), str(size)], env=env_for(fabric, 0x21, out, "full"),
                       capture_output=True, text=True, timeout=25)
    assert r.returncode == 0 and "RESULT OK" in r.stdout, r.stdout + r.stderr
    assert "BADWR ret=22 bad_is_second=1" in r.stdout, r.stdout
    return capture(out)


def test_dlopen_dlsym_client_traced_like_linked(fabric, tmp_path):
    iters, size = 40, 256
    caps = {}
    for direct in (False, True):
        exe = build_client(tmp_path, direct)
        out = tmp_path / ("out_direct" if direct else "out_dlopen")
        caps[direct] = run_client(exe, fabric, out, iters, size)
    counts = {k: {n: c for n, c in cap.count_by_type().items() if n != "IBV_POLL_CQ"} for k, cap in caps.items()}
    assert counts[False] == counts[True], "dlopen'ed libibverbs traced differently from a linked one"
    cap = caps[False]
    c = counts[False]
    assert c["IBV_OPEN_DEVICE"] == 1 and c["IBV_CREATE_QP"] == 2 and c["IBV_MODIFY_QP"] == 6
    assert c["IBV_DESTROY_QP"] == 2 and c["IBV_CLOSE_DEVICE"] == 1 and c["IBV_REG_MR"] == 1
    ps, swr = cap.table("IBV_POST_SEND"), cap.table("IBV_SEND_WR")
    # iters chains of 2 WRs, then the chain whose second WR is refused: 1 accepted, ret EINVAL
    assert len(ps["tsc"]) == iters + 1
    assert (ps["num_wr"][:iters] == 2).all() and (ps["ret"][:iters] == 0).all()
    assert int(ps["num_wr"][-1]) == 1 and int(ps["ret"][-1]) == 22
    assert len(swr["tsc"]) == 2 * iters + 1 and int(swr["wr_id"][-1]) == 9001
    w = swr["opcode"] == IBV_WR_RDMA_WRITE
    assert np.count_nonzero(w) == iters + 1 and (swr["raddr"][w] != 0).all()
    # topology inside one process: A -> B and B -> A
    mq = cap.table("IBV_MODIFY_QP")
    rtr = mq["state"] == IBV_QPS_RTR
    pairs = {int(a): int(b) for a, b in zip(mq["qpn"][rtr], mq["dest_qpn"][rtr])}
    assert len(pairs) == 2 and all(pairs[pairs[q]] == q for q in pairs)
    # F24a: distinct wr_ids here, so the pairing is a real check
    lat = pair_signalled(cap, 0)
    assert len(lat) == iters
    sends = swr["opcode"] == IBV_WR_SEND
    np.testing.assert_array_equal(np.sort(swr["wr_id"][sends]), np.arange(iters))
