"""Native captures end to end: traced programs -> `sigmatrace report` / `replay` (marker sim).

The correlator, exporters and replay are tested elsewhere on the model's captures and on synthetic
ones, and the native tracer by decoding its raw events; here real native captures go through the
whole pipeline (ARCHITECTURE.md contract 5: the decoder cannot tell them apart):

1. unmodified `ibv_rc_pingpong` server + client on the emulated HCA as two nodes, full mode;
2. the emulated IBGDA hijack client (emulated CUDA driver): doorbells <-> WQEs, per-QP bytes against
   the client's ground-truth log, then `sigmatrace replay` (clean, and a what-if that must overflow);
3. the two-process DevX client `emu_ibgda_client`: topology from CREATE_QP / INIT2RTR;
4. `fi_pingpong` (tcp, msg endpoints): libfabric operations with their peers resolved.

Expected values come from the programs' parameters and their own ground-truth output.
"""
import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from native_util import needs_emu, serve_and_connect, wait_listen, free_port, popen, reaped
from sigmatrace import _native
from test_hijack_emu import _paths as hijack_paths
from test_trace_verbs_support import IBGDA_CLIENT, RC_PINGPONG, env_for, needs_mlx5_provider, needs_tracer

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------
# helpers


def cli(*args, timeout=60):
    """`python -m sigmatrace ARGS` on the checkout; exit status 0 and no traceback required."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "sim")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, "-m", "sigmatrace", *map(str, args)], env=env, cwd=str(ROOT),
                       capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def report(capdir, out):
    r = cli("report", capdir, "-o", out, "-j", "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "trace.pftrace").is_file() and (out / "summary.json").is_file()
    return r


def correlated(capdir):
    from sigmatrace.correlate import correlate
    return correlate(str(capdir), workers=1)


def col(corr, table, name):
    return np.asarray(corr.tables[table][name])


def no_losses(corr):
    lo = corr.tables["losses"]
    kinds = [str(k) for k in np.asarray(lo["kind"])] if len(np.asarray(lo["kind"])) else []
    assert kinds == [], {k: list(np.asarray(v)) for k, v in lo.items()}


def check_perfetto(corr, out, nprocs):
    """Structural checks of OUT/trace.pftrace (the style of tests/test_export_perfetto.py)."""
    P = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    from perfetto_util import read_trace
    tr = read_trace(out / "trace.pftrace")       # interned names resolved
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    assert sum(1 for t in tracks.values() if t.HasField("process")) == nprocs
    assert any(t.HasField("thread") for t in tracks.values())
    names = [t.name for t in tracks.values() if not t.HasField("counter")]
    assert sum(1 for n in names if n.startswith("QP ")) >= len(col(corr, "qps", "qp_id"))
    evs = [p.track_event for p in tr.packet if p.HasField("track_event")]
    assert evs and all(e.track_uuid in tracks for e in evs)
    out_ids = {f for e in evs for f in e.flow_ids}
    in_ids = {f for e in evs for f in e.terminating_flow_ids}
    assert out_ids == in_ids
    # an arrow from every matched operation: on its QP track, or for UCX/libfabric calls (no QP) on the issuing
    # thread's track to the target process's (docs/report.md)
    assert len(out_ids) == int(col(corr, "ops", "matched").astype(bool).sum())
    assert sum(1 for e in evs if e.type == P.TrackEvent.TYPE_INSTANT and e.flow_ids) == len(out_ids)
    begins = sum(1 for e in evs if e.type == P.TrackEvent.TYPE_SLICE_BEGIN)
    assert begins == sum(1 for e in evs if e.type == P.TrackEvent.TYPE_SLICE_END)
    return evs


def check_query(out, expected_ops):
    r = cli("query", out, "select count(*) from ops")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(rf"\b{expected_ops}\b", r.stdout), r.stdout


# ---------------------------------------------------------------------------
# 1. ibv_rc_pingpong on two emulated nodes

PP_ITERS, PP_SIZE = 200, 4096
NODES = ({"lid": 0x21, "guid": "0x0002c9030000a001", "gid": "fe80::a:1", "node": "e2e-node-a"},
         {"lid": 0x22, "guid": "0x0002c9030000b002", "gid": "fe80::b:2", "node": "e2e-node-b"})


@pytest.fixture(scope="module")
def pingpong_run(tmp_path_factory):
    if not Path(RC_PINGPONG).is_file():
        pytest.skip(f"{RC_PINGPONG} not installed (ibverbs-utils)")
    from native_util import cleanup_fabric, new_fabric
    tmp = tmp_path_factory.mktemp("e2e_pp")
    cap = tmp / "trace"
    fab = new_fabric()
    envs = [env_for(fab, n["lid"], cap, "full", SIGMATRACE_EMU_NODE_GUID=n["guid"], SIGMATRACE_EMU_GID=n["gid"],
                    SIGMATRACE_NODE_ID=n["node"]) for n in NODES]
    port = free_port()
    argv = [RC_PINGPONG, "-s", str(PP_SIZE), "-n", str(PP_ITERS), "-g", "0", "-p", str(port)]
    try:
        srv = popen(argv, envs[0])
        with reaped(srv):
            wait_listen(port, srv)
            c = subprocess.run(argv + ["localhost"], env=envs[1], capture_output=True, text=True, timeout=25)
            so, se = srv.communicate(timeout=25)
    finally:
        cleanup_fabric(fab)
    assert c.returncode == 0 and srv.returncode == 0, c.stdout + c.stderr + so + se
    out = tmp / "out"
    rep = report(cap, out)
    return cap, out, rep, correlated(cap)


@needs_emu
@needs_tracer
def test_pingpong_report_cli_and_topology(pingpong_run):
    cap, out, rep, corr = pingpong_run
    assert "2 processes on 2 nodes" in rep.stdout, rep.stdout
    no_losses(corr)
    pr = corr.tables["processes"]
    assert len(col(corr, "processes", "process")) == 2 and bool(np.all(np.asarray(pr["complete"])))
    labels = sorted(str(x) for x in np.asarray(corr.tables["nodes"]["label"]))
    assert labels == sorted(n["node"] for n in NODES)
    # QP topology links the two processes both ways, by the GIDs of the process headers
    q = corr.tables["qps"]
    proc, rproc, rqp, qpid = (np.asarray(q[k]) for k in ("process", "remote_process", "remote_qp_id", "qp_id"))
    assert sorted(proc.tolist()) == [0, 1]
    assert sorted(zip(proc.tolist(), rproc.tolist())) == [(0, 1), (1, 0)]
    for i in range(len(qpid)):
        j = int(np.flatnonzero(qpid == rqp[i])[0])
        assert rqp[j] == qpid[i], "each QP's remote QP points back"
    assert set(str(x) for x in np.asarray(q["resolved_by"])) == {"gid"}
    # the summary.json is valid JSON with the operations counted
    s = json.loads((out / "summary.json").read_text())
    assert s, "summary.json is empty"


@needs_emu
@needs_tracer
def test_pingpong_sends_matched_latency_and_bytes(pingpong_run):
    cap, out, rep, corr = pingpong_run
    ops = corr.tables["ops"]
    opname = np.array([str(x) for x in np.asarray(ops["opcode_name"])])
    send = opname == "SEND"
    assert send.all() and len(opname) == 2 * PP_ITERS, collections.Counter(opname.tolist())
    # every SEND is matched to its peer's RECV completion (100 %)
    matched = np.asarray(ops["matched"]).astype(bool)
    assert matched.all()
    pc = np.asarray(ops["peer_completion"])
    comp = corr.tables["completions"]
    c_proc, c_recv = np.asarray(comp["process"]), np.asarray(comp["is_recv"]).astype(bool)
    c_len = np.asarray(comp["byte_len"])
    assert (pc >= 0).all()
    assert (c_proc[pc] == np.asarray(ops["dst_process"])).all() and (c_proc[pc] != np.asarray(ops["process"])).all()
    assert c_recv[pc].all() and (c_len[pc] == PP_SIZE).all()
    assert len(set(pc.tolist())) == len(pc), "one receive completion per send"
    # per-WR latency for every signalled send (F24a), from the completions table too
    sig = np.asarray(ops["signaled"]).astype(bool)
    assert sig.all(), "rc_pingpong signals every send"
    lat, own = np.asarray(ops["latency_ns"]), np.asarray(ops["completion"])
    assert (own >= 0).all() and (lat > 0).all()
    assert (~c_recv[own]).all() and (np.asarray(comp["op_id"])[own] == np.arange(len(own))).all()
    assert (np.asarray(comp["latency_ns"])[own] == lat).all()
    # bytes per direction = iterations x size
    src, dst, nb = np.asarray(ops["process"]), np.asarray(ops["dst_process"]), np.asarray(ops["bytes"])
    for a, b in ((0, 1), (1, 0)):
        assert int(nb[(src == a) & (dst == b)].sum()) == PP_ITERS * PP_SIZE
    # the receiver sees its receive completion after the sender posted (one time base)
    assert (np.asarray(ops["peer_ns"]) >= np.asarray(ops["ns"])).mean() > 0.95


@needs_emu
@needs_tracer
def test_pingpong_perfetto_and_query(pingpong_run):
    cap, out, rep, corr = pingpong_run
    check_perfetto(corr, out, nprocs=2)
    check_query(out, 2 * PP_ITERS)


# ---------------------------------------------------------------------------
# 2. the emulated IBGDA hijack client, then replay


@pytest.fixture(scope="module")
def hijack_run(tmp_path_factory):
    lib, client, emu, emucu = hijack_paths()
    if lib is None:
        pytest.skip("native build lacks libsigmatrace.so, emu/libibverbs.so.1, emu/cuda/libcuda.so.1 or "
                    "tests/hijack_client (cmake -S native -B build/dev && cmake --build build/dev -j2)")
    tmp = tmp_path_factory.mktemp("e2e_hijack")
    cap = tmp / "trace"
    cap.mkdir()
    gt = tmp / "gt.txt"
    env = dict(os.environ, LD_LIBRARY_PATH=f"{emu}:{emucu}", SIGMATRACE_OUTPUT_DIR=str(cap), LD_PRELOAD=str(lib),
               SIGMATRACE_HIJACK_MODE="sync", SIGMATRACE_MODE="full", SIGMATRACE_EMU_FABRIC=f"e2e{os.getpid()}")
    from native_util import cleanup_fabric
    try:
        p = subprocess.run([str(client), "--mode", "func", "--log", str(gt)], env=env, capture_output=True,
                           text=True, timeout=25)
    finally:
        cleanup_fabric(env["SIGMATRACE_EMU_FABRIC"])
    assert p.returncode == 0 and "RESULT OK" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("hijacked=1") == 2, p.stdout
    dbs, wqes = collections.defaultdict(int), collections.defaultdict(list)
    for ln in gt.read_text().splitlines():
        f = ln.split()
        if f[0] == "D":
            dbs[int(f[1])] += 1
        elif f[0] == "W":
            qpn, idx, opc, ds, raddr, rkey, ln_, add = map(int, f[1:])
            wqes[qpn].append(dict(opcode=opc, len=ln_))
    out = tmp / "out"
    report(cap, out)
    return cap, out, correlated(cap), dbs, wqes


def test_hijack_doorbells_wqes_and_bytes(hijack_run):
    cap, out, corr, dbs_gt, wqes_gt = hijack_run
    no_losses(corr)
    db = corr.tables["doorbells"]
    qpn = np.asarray(db["qpn"])
    # quiet after every doorbell: nothing coalesces, every doorbell the client rang is recorded
    assert dict(collections.Counter(qpn.tolist())) == dict(dbs_gt)
    # sync mode: every WQE_BYTES record is VERIFIED, so every doorbell gets all its WQEs
    w = corr.tables["wqes"]
    assert np.asarray(w["verified"]).astype(bool).all() and np.asarray(w["valid"]).astype(bool).all()
    assert bool(np.asarray(db["complete"]).astype(bool).all())
    assert (np.asarray(db["lost_wqebbs"]) == 0).all()
    assert (np.asarray(db["covered_wqebbs"]) == np.asarray(db["delta_wqebbs"])).all()
    assert int(np.asarray(db["wqes"]).sum()) == sum(len(v) for v in wqes_gt.values())
    did = np.asarray(w["doorbell_id"])
    assert (did >= 0).all(), "every recovered WQE belongs to a doorbell"
    # operations: one per WQE, per-QP bytes and opcodes equal the ground-truth log
    ops = corr.tables["ops"]
    oq, nb, oc = np.asarray(ops["qpn"]), np.asarray(ops["bytes"]), np.asarray(ops["opcode"])
    for q, ws in wqes_gt.items():
        sel = oq == q
        assert int(nb[sel].sum()) == sum(x["len"] for x in ws), f"qpn {q}"
        assert collections.Counter(oc[sel].tolist()) == collections.Counter(x["opcode"] for x in ws)
    assert (np.asarray(ops["doorbell_id"]) >= 0).all()
    # the two QPs are each other's peers (loopback pair in one process)
    q = corr.tables["qps"]
    assert sorted(np.asarray(q["remote_qpn"]).tolist()) == sorted(np.asarray(q["qpn"]).tolist())
    assert (np.asarray(ops["dst_qp_id"]) >= 0).all()
    evs = check_perfetto(corr, out, nprocs=1)
    assert sum(1 for e in evs if e.name == "doorbell") == len(qpn)
    check_query(out, sum(len(v) for v in wqes_gt.values()))


def _replay(cap, *args):
    r = cli("replay", cap, "--json", *args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "correlator failed" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def test_hijack_replay_clean_and_what_if(hijack_run):
    cap, out, corr, dbs_gt, wqes_gt = hijack_run
    d = _replay(cap)
    rep = d["replay"]
    assert rep["violations"] == [] and rep["clean"] is True, rep
    assert rep["doorbells"] == sum(dbs_gt.values()) and rep["qps"] == len(wqes_gt)
    assert rep["recorded"]["recorded_lost_wqebb"] == 0 and rep["what_if"]["predicted_lost_wqebb"] == 0
    assert "correlated_tables" in d["summary"] or "tables" in json.dumps(d["summary"])
    # what-if: recovery batches of B WQEBBs on a queue of depth D < B.  When a batch is copied the
    # producer is at least at the batch's end, so at least B - D WQEBBs of each full batch were
    # overwritten: a lower bound from the parameters and the ground truth alone.
    depth, thr = 4, 64
    d2 = _replay(cap, "--queue-depth", depth, "--batch-threshold", thr)
    wi = d2["replay"]["what_if"]
    bound = sum((len(ws) // thr) * (thr - depth) for ws in wqes_gt.values())
    total = sum(len(ws) for ws in wqes_gt.values())
    assert bound > 0 and bound <= wi["predicted_lost_wqebb"] <= total, wi
    assert d2["replay"]["clean"] is False and d2["replay"]["violations"] == []
    # --strict turns predicted losses into exit status 1
    r = cli("replay", cap, "--queue-depth", depth, "--batch-threshold", thr, "--strict")
    assert r.returncode == 1 and "predicted lost WQEBBs" in r.stdout


# ---------------------------------------------------------------------------
# 3. the two-process DevX client


@pytest.fixture(scope="module")
def devx_run(tmp_path_factory):
    if IBGDA_CLIENT is None:
        pytest.skip("emu_ibgda_client not built (native/tests; cmake --build build/dev)")
    from native_util import cleanup_fabric, new_fabric
    tmp = tmp_path_factory.mktemp("e2e_devx")
    rdv, cap = tmp / "rdv", tmp / "trace"
    rdv.mkdir()
    fab = new_fabric()
    common = ["--dir", str(rdv), "--depth", "32", "--ops", "150", "--batch", "7"]
    try:
        target = popen([str(IBGDA_CLIENT), "--rank", "1"] + common, env_for(fab, 0x41, cap, "full"))
        with reaped(target):
            init = subprocess.run([str(IBGDA_CLIENT), "--rank", "0"] + common, env=env_for(fab, 0x42, cap, "full"),
                                  capture_output=True, text=True, timeout=25)
            tout, terr = target.communicate(timeout=25)
    finally:
        cleanup_fabric(fab)
    assert init.returncode == 0 and "RESULT OK" in init.stdout, init.stdout[-2000:] + init.stderr
    assert target.returncode == 0 and "RESULT OK" in tout, tout[-2000:] + terr
    out = tmp / "out"
    report(cap, out)
    return cap, out, correlated(cap), init.stdout, tout


@needs_emu
@needs_tracer
@needs_mlx5_provider
def test_devx_two_processes_topology(devx_run):
    cap, out, corr, init_out, target_out = devx_run
    no_losses(corr)
    con = re.compile(r"CONNECT local lid=(\d+) qpn=(0x[0-9a-f]+) remote lid=(\d+) qpn=(0x[0-9a-f]+)")
    links = [tuple(int(x, 0) for x in con.search(s).groups()) for s in (init_out, target_out)]
    pr = corr.tables["processes"]
    lid_of = {}
    for p, nics in zip(np.asarray(pr["process"]).tolist(), np.asarray(pr["nics"]).tolist()):
        lid_of[json.loads(nics)[0]["ports"][0]["lid"]] = p
    q = corr.tables["qps"]
    rows = {(int(p), int(n)): i for i, (p, n) in enumerate(zip(np.asarray(q["process"]), np.asarray(q["qpn"])))}
    assert len(rows) == 2
    for llid, lqpn, rlid, rqpn in links:
        i = rows[(lid_of[llid], lqpn)]
        assert str(np.asarray(q["kind"])[i]) == "devx"
        assert int(np.asarray(q["remote_qpn"])[i]) == rqpn and int(np.asarray(q["rlid"])[i]) == rlid
        assert int(np.asarray(q["remote_process"])[i]) == lid_of[rlid]
        j = int(np.asarray(q["remote_qp_id"])[i])
        assert j == rows[(lid_of[rlid], rqpn)]
        assert str(np.asarray(q["resolved_by"])[i]) in ("lid", "gid")
    check_perfetto(corr, out, nprocs=2)


@needs_emu
@needs_tracer
@needs_mlx5_provider
def test_devx_two_processes_ops_matched(devx_run):
    cap, out, corr, init_out, target_out = devx_run
    ndb = len(re.findall(r"^DB qpn=", init_out, re.M))
    ops = corr.tables["ops"]
    assert len(np.asarray(ops["op_id"])) > 0 and ndb > 0
    assert (np.asarray(ops["dst_process"]) >= 0).all()


# ---------------------------------------------------------------------------
# 4. fi_pingpong over tcp

FI_PINGPONG = shutil.which("fi_pingpong")
OFI_ITERS, OFI_SIZE = 40, 1000


@pytest.mark.skipif(FI_PINGPONG is None, reason="fi_pingpong not installed (libfabric-bin)")
def test_fi_pingpong_tcp_ops_and_peers(tmp_path):
    lib = _native.tracer_library()
    if lib is None:
        pytest.skip("libsigmatrace.so not built (cmake --build build/dev)")
    info = json.loads((lib.parent / "build_info.json").read_text()) if (lib.parent / "build_info.json").exists() else {}
    if "ofi" not in (info.get("providers") or ["ofi"]):
        pytest.skip("tracer built without the ofi provider (no rdma/fabric.h)")
    cap = tmp_path / "trace"
    env = dict(os.environ, LD_PRELOAD=str(lib), SIGMATRACE_OUTPUT_DIR=str(cap), SIGMATRACE_MODE="full",
               SIGMATRACE_NODE_ID="e2e-ofi")
    common = ["-p", "tcp", "-e", "msg", "-I", str(OFI_ITERS), "-S", str(OFI_SIZE)]
    (rs, so), (rc, co) = serve_and_connect(lambda port: [FI_PINGPONG, *common, "-B", str(port)],
                                           lambda port: [FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"],
                                           env, settle=0.3)
    assert rs == rc == 0, so + co
    out = tmp_path / "out"
    report(cap, out)
    corr = correlated(cap)
    no_losses(corr)
    ops = corr.tables["ops"]
    src = np.array([str(x) for x in np.asarray(ops["source_name"])])
    assert set(src.tolist()) == {"ofi"}
    assert (np.asarray(ops["qp_id"]) == -1).all()
    name = np.array([str(x) for x in np.asarray(ops["opcode_name"])])
    proc, dst, nb = np.asarray(ops["process"]), np.asarray(ops["dst_process"]), np.asarray(ops["bytes"])
    for p in (0, 1):
        sends = (proc == p) & (name == "SEND")
        # OFI_ITERS data messages + one 4-byte synchronisation message (fi_pingpong), each to the other process
        assert int(sends.sum()) == OFI_ITERS + 1
        assert int(np.count_nonzero(nb[sends] == OFI_SIZE)) == OFI_ITERS
        assert (dst[sends] == 1 - p).all(), "every send's peer is resolved to the other process"
    check_perfetto(corr, out, nprocs=2)
    check_query(out, OFI_ITERS * 2 + 2)
