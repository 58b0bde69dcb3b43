"""Real UCX 1.13 fully traced on the emulated HCA (issue 14, items 3 and 4; marker sim).

ucx_perftest pairs run under `sigmatrace run --mode full`, each process inside st-emu-ns on one emulated
fabric.  UCT level: -x rc_verbs (ibv_post_send) and -x rc_mlx5 (UCX writes the WQEs and rings bf.reg itself,
F24d; UCX_RC_MLX5_MMIO_MODE bf_post and db) for am_lat, put_lat, put_bw -D zcopy, get -D zcopy, add_lat.  UCP
level (UCX_TLS=rc_mlx5,ud_mlx5, wire-up over UD): tag_lat, tag_bw, ucp_put_bw, stream_bw.

Each run: both exit 0, the client's "Final:" row counts the iterations; the correlated report of every
process equals what its emulated NIC executed (SIGMATRACE_EMU_STATS wqes_by_opcode / bytes_by_opcode: the
exact ground truth, opcode by opcode, WQE for WQE, byte for byte, on the RC QPs -- the NIC counts RC work
there; UD datagrams are counted as ud_sent); where perftest's own accounting is exact (UCT put/get/atomics:
one WQE of -s bytes per iteration, -w 0) the iteration count x size too; every RC operation and every UCP
call matched to its peer; every doorbell complete (all its WQEBBs recovered), losses table empty
(SIGMATRACE_DROP_POLICY=block: ucx_perftest calls ucp_worker_progress millions of times, and full mode
records each call).  rc_mlx5 bf_post: every doorbell the NIC saw came with a whole BlueFlame copy
(bf_copies, not db_only); db: 8-byte doorbells only.  UCP put_bw / tag_bw: every UCP call linked to the
WQEs beneath it (F25, ops.parent_op_id).  Then BlueFlame-half order under real UCX's alternation, and a
peer killed mid-run.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.mlx5.verbs import DATA_OPS

from native_util import (cleanup_fabric, emu_env, emu_ns, emu_ns_problem, free_port, needs_emu, new_fabric, popen,
                         read_emu_stats, reaped, wait_listen)
from sigmatrace import _native
from sigmatrace.correlate import correlate
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
PERFTEST = shutil.which("ucx_perftest")
LIB = _native.tracer_library()
needs = [needs_emu,
         pytest.mark.skipif(LIB is None, reason="needs build/dev/libsigmatrace.so"),
         pytest.mark.skipif(not PERFTEST, reason="ucx_perftest (ucx-utils) not installed"),
         pytest.mark.skipif(emu_ns_problem() is not None, reason=str(emu_ns_problem()))]
IBV_QPT_UD = 4
RDMA_WRITE, RDMA_READ, SEND, ATOMIC_FA = 0x08, 0x10, 0x0A, 0x12


def node_env(fabric, lid, stats, **extra):
    e = emu_env(fabric, lid, UCX_WARN_UNUSED_ENV_VARS="n", SIGMATRACE_EMU_STATS=f"{stats}/emu-stats.%p.json",
                SIGMATRACE_DROP_POLICY="block", **extra)
    e["PYTHONPATH"] = str(ROOT) + (":" + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def traced(out, argv):
    return [sys.executable, "-m", "sigmatrace", "run", "-o", str(out), "--mode", "full", "--", *map(str, argv)]


def run_pair(tmp_path, args, timeout=60, **extra):
    """Traced ucx_perftest server (LID 1) and client (LID 2); returns (client output, trace dir, NIC stats)."""
    out, stats = tmp_path / "trace", tmp_path / "stats"
    stats.mkdir()
    fab = new_fabric("ut")
    try:
        port = free_port()
        argv = [PERFTEST, "-p", str(port), *args]
        srv = popen(emu_ns(traced(out, argv)), node_env(fab, 1, stats, **extra))
        with reaped(srv):
            wait_listen(port, srv, timeout=20)
            try:
                cli = subprocess.run(emu_ns(traced(out, argv + ["127.0.0.1"])), env=node_env(fab, 2, stats, **extra),
                                     capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                pytest.fail(f"client timed out: {e.stdout}\n{e.stderr}")
            so, se = srv.communicate(timeout=timeout)
    finally:
        cleanup_fabric(fab)
    cout = cli.stdout + cli.stderr
    assert cli.returncode == 0 and srv.returncode == 0, f"client {cli.returncode}:\n{cout}\nserver {srv.returncode}:\n{so}{se}"
    return cout, out, read_emu_stats(stats)


def final_iters(out):
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("Final:")]
    assert rows, out
    return int(float(rows[-1][1]))


def check_against_nic(out, truth, *, ucp=False):
    """The correlated report against the NICs' own counters; returns (corr, client process index)."""
    corr = correlate(out, workers=1)
    P, ops, qps, D = (corr.tables[t] for t in ("processes", "ops", "qps", "doorbells"))
    assert sorted(int(p) for p in P["pid"]) == sorted(truth), "one trace and one NIC record per process"
    assert all(bool(c) for c in P["complete"])
    losses = corr.tables["losses"]
    assert len(losses["kind"]) == 0, {k: list(v) for k, v in losses.items()}
    assert bool(np.all(D["complete"])), "every doorbell's WQEs recovered"
    ud = np.asarray(qps["qp_type"]) == IBV_QPT_UD
    q = np.asarray(ops["qp_id"])
    on_rc = (q >= 0) & ~ud[np.maximum(q, 0)]
    src = np.asarray(ops["source_name"])
    for i, pid in enumerate(P["pid"]):
        nic = truth[int(pid)]
        mine = on_rc & (np.asarray(ops["process"]) == i)
        got_n, got_b = Counter(), Counter()
        for c, b in zip(ops["opcode"][mine], ops["bytes"][mine]):
            got_n[int(c)] += 1
            got_b[int(c)] += int(b)
        # NOPs (UCX posts one to start a QP's ring) carry no data: they are no operation of the trace
        want_n = {int(k, 16): v for k, v in nic["wqes_by_opcode"].items() if int(k, 16) in DATA_OPS}
        want_b = {int(k, 16): v for k, v in nic["bytes_by_opcode"].items() if int(k, 16) in DATA_OPS}
        got_b = {k: v for k, v in got_b.items() if v}      # the NIC lists no opcode with 0 bytes
        want_b = {k: v for k, v in want_b.items() if v}
        assert dict(got_n) == want_n and dict(got_b) == want_b, (int(pid), dict(got_n), want_n, dict(got_b), want_b)
        for k in ("db_stale_pi", "db_pi_overrun", "bf_mismatch"):
            assert nic[k] == 0, (k, nic)
        if ucp:     # UD wire-up datagrams: as many WQEs traced on the UD QPs as the NIC sent
            on_ud = (q >= 0) & ud[np.maximum(q, 0)] & (np.asarray(ops["process"]) == i)
            assert int(on_ud.sum()) == nic["ud_sent"], (int(pid), int(on_ud.sum()), nic["ud_sent"])
    assert bool(np.all(np.asarray(ops["matched"])[on_rc])), "every RC operation matched to its peer QP"
    u = src == "ucx"
    assert bool(np.all(np.asarray(ops["matched"])[u])), "every UCP call matched to its peer process"
    cli = next(i for i, p in enumerate(read_capture(out).processes) if "127.0.0.1" in p.header["argv"])
    return corr, cli


# ---------------------------------------------------------------------------
# UCT level

UCT_TESTS = [  # name, args, iterations, (opcode, bytes) of the one WQE per iteration, sides that post it
    ("am_lat", ["-t", "am_lat", "-s", "8"], 20, (SEND, None), 2),
    ("put_lat", ["-t", "put_lat", "-s", "8"], 20, (RDMA_WRITE, 8), 2),
    ("put_bw", ["-t", "put_bw", "-D", "zcopy", "-s", "4000"], 40, (RDMA_WRITE, 4000), 1),
    ("get_bw", ["-t", "get", "-D", "zcopy", "-s", "4000"], 30, (RDMA_READ, 4000), 1),
    ("add_lat", ["-t", "add_lat", "-s", "8"], 20, (ATOMIC_FA, 8), 2),
]
UCT_CASES = ([("rc_verbs", None, *t) for t in UCT_TESTS] +
             [("rc_mlx5", m, *t) for m in ("bf_post", "db") for t in UCT_TESTS])


@pytest.mark.parametrize("tl,mmio,name,args,iters,wqe,sides", UCT_CASES,
                         ids=[f"{c[0]}-{c[2]}" + (f"-{c[1]}" if c[1] else "") for c in UCT_CASES])
@needs[0]
@needs[1]
@needs[2]
@needs[3]
def test_uct_perftest_traced_equals_the_nic(tmp_path, tl, mmio, name, args, iters, wqe, sides):
    extra = {"UCX_RC_MLX5_MMIO_MODE": mmio, "UCX_IB_MLX5_DEVX": "no"} if mmio else {}
    out, trace, truth = run_pair(tmp_path, ["-d", "mlx5_0:1", "-x", tl, *args, "-n", str(iters), "-w", "0"], **extra)
    assert final_iters(out) == iters
    corr, cli = check_against_nic(trace, truth)
    ops = corr.tables["ops"]
    src = np.asarray(ops["source_name"])
    want_src = "doorbell" if tl == "rc_mlx5" else "verbs_wr"
    # perftest's own accounting: one WQE of the test's opcode (and -s bytes) per iteration, per posting side
    procs = [cli] if sides == 1 else [0, 1]
    for p in procs:
        m = (np.asarray(ops["process"]) == p) & (np.asarray(ops["opcode"]) == wqe[0]) & (src == want_src)
        if wqe[1] is not None:
            m &= np.asarray(ops["bytes"]) == wqe[1]
        assert int(m.sum()) in (iters, iters + 1), (p, int(m.sum()), iters)
    if tl == "rc_mlx5":
        # F24d: UCX rang bf.reg itself; every doorbell the NIC took came as the mode says
        nic_db = sum(s["doorbells"] for s in truth.values())
        bf = sum(s["bf_copies"] for s in truth.values())
        db_only = sum(s["db_only"] for s in truth.values())
        # what the pollers say they forwarded (their DB_HIJACK_REMOVE summaries): whole copies, and 8-byte
        # doorbells -- a db-mode writer's, a probe's that found no copy yet, or a copy torn by a preempted writer
        summ = [r.json() for p in read_capture(trace).processes for r in p.side.values()
                if r.kind == 2 and b"bf_copies_forwarded" in bytes(r.data)]
        fwd = sum(j["bf_copies_forwarded"] for j in summ)
        eight = sum(j["bf_doorbells_8b"] + j["bf_copies_torn"] for j in summ)
        # the emulated NIC samples its registers: a copy it samples after the ctrl word and before the rest
        # landed reads as an 8-byte doorbell (docs/emulator.md; the SQ's identical WQE is executed), so it can
        # count fewer whole copies than were forwarded, never more; a forwarded copy that arrived garbled would
        # be a bf_mismatch (0, checked above)
        assert bf + db_only == nic_db and bf <= fwd and db_only >= eight, (truth, summ)
        if mmio == "bf_post":   # the poller forwarded the BlueFlame copies whole (not their first 8 bytes),
            # but for at most BF_PROBES (3, native/src/hijack/poller.c) probes per QP and the torn copies
            d = corr.tables["doorbells"]
            rung = len(set(zip(d["process"].tolist(), d["qpn"].tolist())))
            probes = sum(j["bf_doorbells_8b"] for j in summ)
            assert nic_db > 0 and bf > 0 and fwd + eight == nic_db and probes <= 3 * rung, (truth, summ, rung)
        else:
            assert bf == fwd == 0 and db_only == nic_db > 0, truth
        assert int((src == "verbs_wr").sum()) == 0, "rc_mlx5 posts no work request through verbs"


UD_CASES = [(tl, glob) for tl in ("ud_verbs", "ud_mlx5") for glob in (False, True)]


@pytest.mark.parametrize("tl,glob", UD_CASES, ids=[f"{t}-{'grh' if g else 'lid'}" for t, g in UD_CASES])
@needs[0]
@needs[1]
@needs[2]
@needs[3]
def test_uct_ud_datagrams_matched_to_their_destination(tmp_path, tl, glob):
    """A UD QP has no connected peer: each datagram names its destination port (LID, or with a GRH its GID)
    and QPN -- ud_verbs through its work request's address handle (IBV_CREATE_AH) and remote QPN, ud_mlx5 in
    the address vector of the WQE it writes itself (ref §1.8).  Every datagram is matched to the other side's
    UD QP, and per process the traced datagrams sent and addressed to it equal what its emulated NIC sent and
    received."""
    iters = 20
    extra = {"UCX_IB_IS_GLOBAL": "y"} if glob else {}
    if tl == "ud_mlx5":
        extra["UCX_IB_MLX5_DEVX"] = "no"
    out, trace, truth = run_pair(tmp_path, ["-d", "mlx5_0:1", "-x", tl, "-t", "am_lat", "-s", "8", "-n",
                                            str(iters), "-w", "0"], **extra)
    assert final_iters(out) == iters
    corr = correlate(trace, workers=1)
    P, ops, qps = corr.tables["processes"], corr.tables["ops"], corr.tables["qps"]
    ud = np.asarray(qps["qp_type"]) == IBV_QPT_UD
    q = np.asarray(ops["qp_id"])
    lib = "verbs_wr" if tl == "ud_verbs" else "doorbell"
    on_ud = (q >= 0) & ud[np.maximum(q, 0)] & (np.asarray(ops["source_name"]) == lib)
    assert int(on_ud.sum()) >= 2 * iters
    assert bool(np.all(np.asarray(ops["matched"])[on_ud])), corr.stats["unmatched"]
    assert corr.stats["unmatched"][lib]["unmatched"] == 0, corr.stats["unmatched"]
    proc, dst = np.asarray(ops["process"]), np.asarray(ops["dst_process"])
    dq = np.asarray(ops["dst_qp_id"])
    assert bool(np.all(dst[on_ud] == 1 - proc[on_ud])), "each datagram goes to the other side"
    assert bool(np.all(ud[dq[on_ud]])), "to a UD QP"
    for i, pid in enumerate(P["pid"]):
        nic = truth[int(pid)]
        sent, got = int((on_ud & (proc == i)).sum()), int((on_ud & (dst == i)).sum())
        assert (sent, got) == (nic["ud_sent"], nic["ud_received"] + nic["ud_dropped"]), (int(pid), sent, got, nic)
    if glob and tl == "ud_verbs":    # routed by GID: the address handles carry it
        cap = read_capture(trace)
        t = cap.table("IBV_CREATE_AH")
        assert len(t["tsc"]) and all(cap.side_record(int(p), int(s)).json()["is_global"]
                                     for p, s in zip(t["process"], t["side_id"]))


# ---------------------------------------------------------------------------
# UCP level (wire-up over UD)

UCP_TESTS = [
    ("tag_lat", ["-t", "tag_lat", "-s", "8"], 20),
    ("tag_bw", ["-t", "tag_bw", "-s", "4000"], 30),
    ("ucp_put_bw", ["-t", "ucp_put_bw", "-s", "4000"], 30),
    ("stream_bw", ["-t", "stream_bw", "-s", "4000"], 20),
]


@pytest.mark.parametrize("name,args,iters", UCP_TESTS, ids=[t[0] for t in UCP_TESTS])
@needs[0]
@needs[1]
@needs[2]
@needs[3]
def test_ucp_perftest_traced_equals_the_nic(tmp_path, name, args, iters):
    out, trace, truth = run_pair(tmp_path, [*args, "-n", str(iters), "-w", "0"], UCX_TLS="rc_mlx5,ud_mlx5",
                                 UCX_IB_MLX5_DEVX="no")
    assert final_iters(out) == iters
    corr, cli = check_against_nic(trace, truth, ucp=True)
    assert sum(s["ud_sent"] for s in truth.values()) > 0, "wire-up went over UD"
    ops = corr.tables["ops"]
    src, par, oid = np.asarray(ops["source_name"]), np.asarray(ops["parent_op_id"]), np.asarray(ops["op_id"])
    u = np.flatnonzero(src == "ucx")
    assert len(u) >= iters
    if name in ("ucp_put_bw", "tag_bw"):
        # F25: every UCP call linked to >= 1 WQE beneath it, bytes consistent
        over = set()
        for i in u:
            kids = np.flatnonzero(par == oid[i])
            assert len(kids), f"UCP op {oid[i]} ({ops['opcode_name'][i]}, {ops['bytes'][i]} B) has no WQE"
            assert all(int(ops["process"][k]) == int(ops["process"][i]) for k in kids)
            assert all(int(ops["ns"][k]) >= int(ops["ns"][i]) for k in kids), "a WQE rung before its call"
            kb = int(np.asarray(ops["bytes"])[kids].sum())
            if name == "ucp_put_bw":
                assert kb == int(ops["bytes"][i]), (kb, int(ops["bytes"][i]))
            else:       # eager: the SEND carries the user's bytes plus the UCT AM / UCP tag headers
                over.add(kb - int(ops["bytes"][i]))
        if name == "tag_bw":
            assert len(over) == 1 and 0 < next(iter(over)) <= 64, over
        assert corr.stats["ucp_wqe_link"]["linked"] == len(u), corr.stats["ucp_wqe_link"]
        # ... and drawn so in Perfetto: one flow from each UCP call's instant to each of its WQEs' instants
        from perfetto_util import read_trace
        from sigmatrace.export.perfetto import write_perfetto
        write_perfetto(corr, tmp_path / "ucp.pftrace")
        evs = [p.track_event for p in read_trace(tmp_path / "ucp.pftrace").packet if p.HasField("track_event")]
        child = lambda f: (2 << 40) <= f < (3 << 40)          # noqa: E731 (the F25 flow ids, export/perfetto.py)
        starts = sorted(f for e in evs for f in e.flow_ids if child(f))
        ends = sorted(f for e in evs for f in e.terminating_flow_ids if child(f))
        assert starts == ends == sorted((2 << 40) + int(k) for k in np.flatnonzero(par >= 0)), \
            (len(starts), len(ends), int((par >= 0).sum()))


# ---------------------------------------------------------------------------
# BlueFlame halves in order, with UCX's own alternation

@needs[0]
@needs[1]
@needs[2]
@needs[3]
def test_bf_halves_in_order_with_real_ucx(tmp_path):
    """rc_mlx5 flips bf.reg between 0x800 and 0x900 (both halves) on every post; at put_bw's rate the poller
    often finds both rung between two scans, the newer first.  Each QP's recorded doorbells (the order they
    were forwarded in) must then advance the producer index monotonically by at most the ring: a value
    forwarded out of order would show as a ~65k step back (and the NIC would run a stale index).  Both
    halves are used (UCX's doorbells carry their register in the proxy: MLX5_DV_INIT_QP bf_reg/bf_proxy)."""
    iters = 400
    out, trace, truth = run_pair(tmp_path, ["-d", "mlx5_0:1", "-x", "rc_mlx5", "-t", "put_bw", "-D", "zcopy", "-s",
                                            "64", "-n", str(iters), "-w", "0"], UCX_RC_MLX5_MMIO_MODE="bf_post",
                                 UCX_IB_MLX5_DEVX="no")
    corr, cli = check_against_nic(trace, truth)
    D = corr.tables["doorbells"]
    qp, pi, ts = (np.asarray(D[c]) for c in ("qp_id", "producer_index", "tsc"))
    ring = {int(r): 1 << max(int(l), 0) for r, l in zip(corr.tables["qps"]["qp_id"], corr.tables["qps"]["log_sq_size"])}
    for q in np.unique(qp):
        sel = np.flatnonzero(qp == q)
        seq = pi[sel[np.argsort(ts[sel], kind="stable")]].astype(np.int64)
        steps = (np.diff(seq) & 0xFFFF)
        assert np.all((steps > 0) & (steps <= (ring.get(int(q)) if ring.get(int(q), 1) > 1 else 1 << 15))), (int(q), seq[:50])
    # the poller summary: whole copies forwarded, and how many overtaken values it held back
    summ = [js for p in corr.procs for js in p.side_json.values()
            if isinstance(js, dict) and "bf_copies_forwarded" in js]
    assert summ and sum(s["bf_copies_forwarded"] for s in summ) > 0, summ
    nic = truth[int(corr.tables["processes"]["pid"][cli])]
    assert nic["wqes_by_opcode"].get("0x08", 0) >= iters and nic["db_stale_pi"] == 0


# ---------------------------------------------------------------------------
# bad input: the peer dies

def _descendants(pid):
    out = []
    for f in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            kids = [int(c) for c in Path(f).read_text().split()]
        except OSError:
            continue
        for c in kids:
            out += [c, *_descendants(c)]
    return out


def _killed_peer_run(tmp_path, tag, wrap):
    stats = tmp_path / f"stats-{tag}"
    stats.mkdir()
    fab = new_fabric("uk")
    try:
        port = free_port()
        argv = [PERFTEST, "-p", str(port), "-d", "mlx5_0:1", "-x", "rc_mlx5", "-t", "put_bw", "-D", "zcopy", "-s",
                "4000", "-n", "100000000", "-w", "0"]
        srv = popen(emu_ns(wrap(argv)), node_env(fab, 1, stats))
        with reaped(srv) as procs:
            wait_listen(port, srv, timeout=20)
            cli = popen(emu_ns(wrap(argv + ["127.0.0.1"])), node_env(fab, 2, stats))
            procs.append(cli)
            time.sleep(1.5)
            assert cli.poll() is None, cli.communicate()
            victim = [p for p in [srv.pid, *_descendants(srv.pid)]
                      if Path(f"/proc/{p}/comm").read_text().strip() == "ucx_perftest"]
            assert victim, "no server ucx_perftest found"
            os.kill(victim[0], signal.SIGKILL)
            try:
                o, e = cli.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{tag}: the client hangs after its peer was killed")
        return cli.returncode, o + e
    finally:
        cleanup_fabric(fab)


@needs[0]
@needs[1]
@needs[2]
@needs[3]
def test_peer_killed_ends_as_untraced(tmp_path):
    """put_bw (the client always has writes outstanding) with the server's ucx_perftest SIGKILLed mid-run: the
    client fails untraced (transport error, UCX aborts); traced it ends the same way (same exit class: a
    signal or the same non-zero code), within the same bound, and its trace decodes."""
    rc_u, out_u = _killed_peer_run(tmp_path, "untraced", lambda a: a)
    trace = tmp_path / "trace"
    rc_t, out_t = _killed_peer_run(tmp_path, "traced", lambda a: traced(trace, a))

    def cls(rc):
        return "signal" if rc < 0 or rc > 128 else ("ok" if rc == 0 else "error")
    assert rc_u != 0, out_u
    assert cls(rc_t) == cls(rc_u), (rc_u, rc_t, out_t[-2000:])
    assert re.search(r"Transport retry count exceeded|Connection|error", out_t, re.I) or cls(rc_t) == "signal"
    cap = read_capture(trace)       # the survivor's and the victim's files decode (the victim's cut short)
    assert len(cap.processes) == 2
