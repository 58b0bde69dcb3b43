"""The nccl provider (F25) and the attribution of work requests to NCCL calls, on a fake NCCL.

native/tests/fake_nccl: a libnccl.so.2 with NCCL 2.28's API whose collectives really post RDMA writes on
emulated RC QPs from a proxy thread (as NCCL's proxy does), and a two-rank program over it (nccl_client).
Checked: the provider is transparent (results, return codes and outputs the same traced in every mode and
untraced; `--providers` without nccl records no NCCL event); the NCCL calls are decoded (communicator
creation with its key, every call with its result, groups, ncclBcast recorded once although the fake
forwards it to its exported ncclBroadcast); both ranks' calls are joined per call (communicator key + seq);
every work request of the fake's QPs is attributed to the call that posted it (the fake writes the call's
sequence number into each wr_id) or, for an NCCL group, to the group; per call the work requests and bytes
on the wire equal what the fake posted (its ground-truth file); the report and the Perfetto trace show the
collectives (communicator tracks, slices, flows to their work requests).
"""
import json
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from native_util import emu_env, finish, needs_emu, popen, reaped
from sigmatrace import _native
from sigmatrace.format import events as E
from test_trace_verbs_support import _info, capture, env_for, needs_tracer

FAKE = _native.find("fake_nccl/libnccl.so.2")
CLIENT = _native.find("fake_nccl/nccl_client")
pytestmark = [pytest.mark.sim, needs_emu, needs_tracer,
              pytest.mark.skipif(FAKE is None or CLIENT is None,
                                 reason="fake NCCL not built (build/dev/tests/fake_nccl: cmake --build build/dev)"),
              pytest.mark.skipif("nccl" not in (_info.get("providers") or []),
                                 reason="tracer built without the nccl provider")]

OPS = ("all_reduce", "broadcast", "bcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
       "scatter", "send_recv", "p2p_ring", "group", "split", "errors")
ITERS, COUNT = 2, 1024
# NCCL calls per iteration of each client operation, per rank (rank 0, rank 1): {op: [(kind, count)]}
CALLS = {"all_reduce": [("all_reduce", COUNT)], "broadcast": [("broadcast", COUNT)], "bcast": [("broadcast", COUNT)],
         "reduce": [("reduce", COUNT)], "all_gather": [("all_gather", COUNT)],
         "reduce_scatter": [("reduce_scatter", COUNT)], "all_to_all": [("all_to_all", COUNT)],
         "gather": [("gather", COUNT)], "scatter": [("scatter", COUNT)],
         "group": [("all_reduce", COUNT), ("all_reduce", COUNT // 2)]}


def run_ranks(tmp, fabric, mode=None, ops=OPS, iters=ITERS, count=COUNT, providers=None, args=(), extra=None):
    """Both ranks of nccl_client (traced in `mode`, untraced for None); returns ([(rc, stdout, stderr)],
    trace dir or None, ground-truth dir)."""
    tag = mode or "untraced"
    rdv, gt = tmp / f"rdv-{tag}", tmp / f"gt-{tag}"
    rdv.mkdir()
    gt.mkdir()
    out = tmp / f"trace-{tag}" if mode else None
    procs = []
    with reaped() as live:
        for r in (0, 1):
            env = env_for(fabric, 0x11 + r, out, mode) if mode else emu_env(fabric, 0x11 + r)
            env["LD_LIBRARY_PATH"] = f"{FAKE.parent}:{env['LD_LIBRARY_PATH']}"
            env.update(FAKE_NCCL_DIR=str(rdv), FAKE_NCCL_GT_DIR=str(gt))
            if providers is not None:
                env["SIGMATRACE_PROVIDERS"] = providers
            env.update(extra or {})
            p = popen([str(CLIENT), str(r), "2", str(rdv), "--ops", ",".join(ops), "--iters", str(iters),
                       "--count", str(count), *args], env)
            live.append(p)
            procs.append(p)
        res = [finish(p, 90) for p in procs]
    for r, (rc, so, se) in enumerate(res):
        assert rc == 0 and so.rstrip().endswith("OK"), f"rank {r} rc={rc}\n{so}\n{se}"
    return res, out, gt


def ground_truth(gt):
    """{(pid, token): {"qpns": [...], "items": [...]}} from the fake's files."""
    out = {}
    for f in sorted(Path(gt).glob("gt-*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        head = lines[0]
        out[(head["pid"], head["token"])] = dict(rank=head["rank"], qpns=head["qpns"], items=lines[1:])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The client untraced and traced in each mode (one emulated fabric each)."""
    from native_util import cleanup_fabric, new_fabric
    tmp = tmp_path_factory.mktemp("nccl")
    got = {}
    for mode in (None, "aggregate", "simple", "full"):
        fab = new_fabric("n")
        try:
            got[mode] = run_ranks(tmp, fab, mode)
        finally:
            cleanup_fabric(fab)
    return got


@pytest.fixture(scope="module")
def corrs(runs):
    from sigmatrace.correlate import correlate
    return {m: correlate(runs[m][1], workers=1) for m in ("aggregate", "simple", "full")}


def _lines(res):
    return [so.splitlines() for _, so, _ in res]


def test_transparent_in_every_mode(runs):
    """The same return codes, results and checksums traced (aggregate, simple, full) as untraced."""
    base = _lines(runs[None][0])
    assert any(l.startswith("ERRORS 4 4 5") for l in base[0])       # the refused calls refused
    assert sum(l.startswith("OP ") for l in base[0]) == len(OPS) * ITERS
    for mode in ("aggregate", "simple", "full"):
        assert _lines(runs[mode][0]) == base, mode


def test_without_the_nccl_provider_no_nccl_event(tmp_path, fabric):
    res, out, _ = run_ranks(tmp_path, fabric, "full", ops=("all_reduce", "group"), providers="ibv,mlx5")
    cap = capture(out)
    counts = cap.count_by_type()
    assert not [n for n in counts if n.startswith("NCCL_")], counts
    assert counts.get("IBV_SEND_WR", 0) > 0, "the verbs provider still records the fake's work requests"
    from sigmatrace.correlate import correlate
    c = correlate(out, workers=1)
    assert len(c.tables["collectives"]["collective_id"]) == 0
    assert (c.tables["ops"]["collective_unit"] == -1).all()


def test_nccl_events_decoded(runs):
    cap = capture(runs["full"][1])
    counts = cap.count_by_type()
    n_calls = sum(len(CALLS.get(o, [])) for o in OPS) * ITERS + ITERS * (1 + 1 + 1)   # + send_recv, p2p_ring, split
    ci, cc = cap.table("NCCL_COMM_INIT"), cap.table("NCCL_COLL")
    gs, ge = cap.table("NCCL_GROUP_START"), cap.table("NCCL_GROUP_END")
    for p in range(2):
        mine = ci["process"] == p
        # ncclCommInitRank, then one ncclCommSplit per split iteration: all with their key and rank
        assert list(ci["variant"][mine]) == [E.NCCL_INIT_RANK] + [E.NCCL_INIT_SPLIT] * ITERS
        assert (ci["result"][mine] == 0).all() and (ci["nranks"][mine] == 2).all()
        js = [cap.side_record(p, int(s)).json() for s in ci["side_id"][mine]]
        assert js[0]["call"] == "ncclCommInitRank" and len(js[0]["unique_id_hash"]) == 16
        assert js[0]["nccl_version"] == 22809 and js[0]["rank"] == int(ci["rank"][mine][0])
        assert all(j["parent"] == js[0]["id"] and j["color"] == 0 for j in js[1:])
        c = cc["process"] == p
        ok = c & (cc["result"] == 0)
        # rank 0 sends in send_recv, rank 1 receives; p2p_ring: one send and one receive each
        assert int(ok.sum()) == n_calls + ITERS, (p, Counter(cc["kind"][ok].tolist()))
        kinds = Counter(int(k) for k in cc["kind"][ok])
        assert kinds[E.NCCL_COLL_BCAST] == ITERS, "ncclBcast once per call (its inner ncclBroadcast not recorded)"
        assert kinds[E.NCCL_COLL_BROADCAST] == ITERS
        assert kinds[E.NCCL_COLL_SEND] == ITERS * (2 if p == 0 else 1)
        assert kinds[E.NCCL_COLL_RECV] == ITERS * (1 if p == 0 else 2)
        # the refused calls: bad datatype, bad peer (ncclInvalidArgument)
        bad = c & (cc["result"] != 0)
        assert int(bad.sum()) == 2 * ITERS and (cc["result"][bad] == 4).all()
        assert set(cc["datatype"][bad & (cc["kind"] == E.NCCL_COLL_ALL_REDUCE)].tolist()) == {99}
        assert (cc["stream"][c] == 0x5151).all() and (cc["duration_ticks"][c] > 0).all()
        reduce_ = ok & (cc["kind"] == E.NCCL_COLL_ALL_REDUCE)
        assert set(cc["redop"][reduce_].tolist()) == {0, 2}                 # sum, and max in the groups
        assert set(cc["redop"][ok & (cc["kind"] == E.NCCL_COLL_ALL_GATHER)].tolist()) == {E.NCCL_REDOP_NONE}
        # groups: group + p2p_ring per iteration; the ncclGroupEnd outside a group (errors) refused, depth 0
        assert int((gs["process"] == p).sum()) == 2 * ITERS and (gs["depth"][gs["process"] == p] == 1).all()
        e = ge["process"] == p
        assert int(e.sum()) == 3 * ITERS
        assert sorted(zip(ge["depth"][e].tolist(), ge["result"][e].tolist())) == \
            sorted([(1, 0)] * (2 * ITERS) + [(0, 5)] * ITERS)
    assert counts["NCCL_COMM_DESTROY"] == 2 * (1 + ITERS)


def _fake_seq(C, sel):
    """The fake's sequence number of each executed call: its index among the executed calls of its
    communicator in call order (the fake numbers every call it enqueues)."""
    seq = np.full(len(C["collective_id"]), -1, np.int64)
    ex = np.flatnonzero(C["seq"] >= 0)
    for comm in np.unique(C["comm"][ex]):
        m = ex[C["comm"][ex] == comm]
        m = m[np.argsort(C["call_ns"][m], kind="stable")]
        seq[m] = np.arange(len(m))
    return seq


@pytest.mark.parametrize("mode", ["simple", "full"])
def test_calls_joined_attributed_and_counted(runs, corrs, mode):
    corr = corrs[mode]
    C, K, Q, O = (corr.tables[n] for n in ("collectives", "communicators", "qps", "ops"))
    P = corr.tables["processes"]
    gt = ground_truth(runs[mode][2])
    # communicators: per process the main one and one per split, keyed alike on both ranks
    assert len(K["comm"]) == 2 * (1 + ITERS)
    keys = Counter(K["key"].tolist())
    assert len(keys) == 1 + ITERS and set(keys.values()) == {2}
    assert all("/split" in k for k in keys if k != K["key"][0])
    # every QP is the fake's, known to belong to its communicator (created inside ncclCommInitRank / Split)
    assert (Q["comm"] >= 0).all() and set(Q["comm_rule"].tolist()) == {"call"}
    pid = {int(p): i for i, p in enumerate(P["pid"])}
    comm_of_token = {}
    for (p, token), g in gt.items():
        proc = pid[p]
        qp_comm = {int(Q["qpn"][i]): int(Q["comm"][i]) for i in np.flatnonzero(Q["process"] == proc)}
        comms = {qp_comm[q] for q in g["qpns"]}
        assert len(comms) == 1, (token, comms)
        comm_of_token[(p, token)] = comms.pop()
    # calls: executed ones joined across both ranks
    ex = C["seq"] >= 0
    assert (C["instance_ranks"][ex] == 2).all()
    assert set(C["attribution"][~ex].tolist()) == {"refused"}
    lab = Counter(C["attribution"][ex].tolist())
    assert lab["group"] == 2 * ITERS * 2 + 2 * ITERS * 2, lab        # group: 2 all_reduces; p2p_ring: send + recv
    assert set(lab) == {"window", "group"}, lab
    # every work request attributed, to the call that posted it (wr_id >> 20 = the fake's sequence number)
    fseq = _fake_seq(C, ex)
    assert (O["collective_unit"] >= 0).all(), "a work request of the fake's QPs not attributed"
    wr_seq = O["wr_id"] >> 20
    one = O["collective_id"] >= 0
    np.testing.assert_array_equal(fseq[O["collective_id"][one]], wr_seq[one])
    for u in np.unique(O["collective_unit"][~one]):
        members = np.flatnonzero(C["unit"] == u)
        assert len(members) > 1 and set(C["group"][members].tolist()) != {-1}
        assert set(wr_seq[O["collective_unit"] == u].tolist()) <= set(fseq[members].tolist())
    # per unit: work requests and bytes on the wire = what the fake posted for that proxy item
    checked = 0
    for (p, token), g in gt.items():
        comm = comm_of_token[(p, token)]
        mine = np.flatnonzero((C["comm"] == comm) & ex)
        by_seq = {int(fseq[i]): i for i in mine}
        for item in g["items"]:
            rows = [by_seq[o["seq"]] for o in item["item"]]
            units = set(C["unit"][rows].tolist())
            assert len(units) == 1 and len(np.flatnonzero(C["unit"] == units.pop())) == len(rows), item
            r = rows[0]
            assert int(C["wire_bytes"][r]) == item["wire_bytes"] and int(C["wrs"][r]) == item["wrs"], \
                (item, C["op"][r], int(C["wire_bytes"][r]), int(C["wrs"][r]))
            assert [C["op"][i] for i in rows] == [o["op"] for o in item["item"]]
            assert [int(C["bytes"][i]) for i in rows] == [o["bytes"] for o in item["item"]]
            checked += 1
    assert checked == sum(len(g["items"]) for g in gt.values()) > 0
    # times: a call's work ends after it was called; full mode: the end is the last completion
    w = ex & (C["wrs"] > 0)
    assert (C["end_ns"][w] >= C["call_ns"][w]).all() and (C["duration_ns"][w] >= 0).all()
    if mode == "full":
        assert (C["last_completion_ns"][w] >= C["last_wr_ns"][w]).all() and (C["last_completion_ns"][w] > 0).all()
        assert (C["slowest_rank"][ex] >= 0).all()
    else:
        assert (C["last_completion_ns"][w] == -1).all() and (C["end_ns"][w] == C["last_wr_ns"][w]).all()


def test_report_and_perfetto_show_the_collectives(runs, tmp_path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

    from perfetto_util import read_trace
    from sigmatrace.report import build_report
    corr, summary, _ = build_report(runs["full"][1], tmp_path / "rep", workers=1, figures=False, quiet=True)
    s = summary["collectives"]
    C = corr.tables["collectives"]
    assert s["calls"] == len(C["collective_id"]) and s["communicators"] == 2 * (1 + ITERS)
    assert s["ops_attributed"] == corr.tables["ops"].n_rows
    by = {(r["op"], r["bytes"]): r for r in s["by_kind"]}
    ar = by[("all_reduce", COUNT * 4)]
    # alone: the all_reduce iterations and the splits' all_reduce on both ranks; the groups' are shared
    assert ar["attributed"] == 2 * ITERS * 2 and ar["shared"] == 2 * ITERS
    win = (C["op"] == "all_reduce") & (C["bytes"] == COUNT * 4) & (C["attribution"] == "window")
    assert ar["wire_bytes"] == int(C["wire_bytes"][win].sum()) > 0 and ar["slowest_rank"] in (0, 1)
    assert ar["p50_ns"] > 0
    assert by[("broadcast", COUNT * 4)]["calls"] == 2 * 2 * ITERS           # ncclBroadcast and ncclBcast
    assert {u["ops"] for u in s["shared_units"]} == {"all_reduce+all_reduce", "send+recv"}
    from sigmatrace.cli.report import print_summary
    import io
    buf = io.StringIO()
    print_summary(summary, tmp_path / "rep", file=buf)
    text = buf.getvalue()
    assert "NCCL collectives:" in text and "all_reduce 4.10 KB" in text, text
    # Perfetto: a track per communicator, a slice per unit, a flow from it to each of its work requests
    tr = read_trace(tmp_path / "rep" / "trace.pftrace")
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    comm_tracks = {u for u, t in tracks.items() if t.name.startswith("NCCL comm ")}
    assert len(comm_tracks) == len(corr.tables["communicators"]["comm"])
    evs = [p.track_event for p in tr.packet if p.HasField("track_event")]
    slices = [e for e in evs if e.track_uuid in comm_tracks and e.type == P.TrackEvent.TYPE_SLICE_BEGIN]
    assert len(slices) == len(np.unique(C["unit"][C["unit"] >= 0]))
    assert {e.name for e in slices} >= {"all_reduce", "broadcast", "group: all_reduce+all_reduce",
                                         "group: send+recv", "all_to_all"}
    coll_flows = {f for e in slices for f in e.flow_ids}
    ends = {f for e in evs if e.track_uuid not in comm_tracks for f in e.terminating_flow_ids}
    assert len(coll_flows) == corr.tables["ops"].n_rows and coll_flows <= ends


def test_aggregate_mode_counts_the_calls(corrs):
    A = corrs["aggregate"].tables["aggregates"]
    m = A["type_name"] == "NCCL_COLL"
    calls = Counter()
    for aux, n in zip(A["aux"][m], A["count"][m]):
        calls[int(aux) & 0xFF] += int(n)
    assert calls[E.NCCL_COLL_ALL_REDUCE] == 2 * ITERS * (1 + 2 + 1)          # alone, in groups, on the splits
    assert calls[E.NCCL_COLL_BCAST] == 2 * ITERS and calls[E.NCCL_COLL_SEND] == 3 * ITERS
    assert len(corrs["aggregate"].tables["communicators"]["comm"]) == 2 * (1 + ITERS)


def test_unsynchronised_calls_keep_every_byte_on_its_communicator(tmp_path, fabric):
    """Calls made without waiting for the previous one (--nowait): the window rule cannot tell each call's
    work requests apart then unless completions show the overlap; what holds regardless: every work request
    is attributed to a unit of its own communicator, and the units' bytes add up to what the fake posted."""
    res, out, gt = run_ranks(tmp_path, fabric, "full", ops=("all_reduce", "all_gather", "broadcast"), iters=4,
                             args=("--nowait",))
    from sigmatrace.correlate import correlate
    c = correlate(out, workers=1)
    C, O = c.tables["collectives"], c.tables["ops"]
    assert (O["collective_unit"] >= 0).all()
    g = ground_truth(gt)
    P = c.tables["processes"]
    for (pid, _), truth in g.items():
        proc = int(np.flatnonzero(P["pid"] == pid)[0])
        units = np.unique(C["unit"][(C["process"] == proc) & (C["unit"] >= 0)])
        first = [int(np.flatnonzero(C["unit"] == u)[0]) for u in units]
        assert int(C["wire_bytes"][first].sum()) == sum(i["wire_bytes"] for i in truth["items"])
        assert int(C["wrs"][first].sum()) == sum(i["wrs"] for i in truth["items"])
    assert set(C["attribution"].tolist()) <= {"window", "in-flight"}


@pytest.mark.parametrize("connect,rule", [("call", "call"), ("async", "nccl-thread")])
def test_qps_created_by_the_proxy_thread(tmp_path, fabric, connect, rule):
    """QPs that NCCL's own thread creates: while the first call waits for the connection (runtime
    connection: rule "call"), or after the init returned with nobody waiting (a non-blocking communicator:
    the only communicator, a thread named NCCL*: rule "nccl-thread"); the attribution is the same."""
    res, out, gt = run_ranks(tmp_path, fabric, "full", ops=("all_reduce", "group", "send_recv"),
                             extra={"FAKE_NCCL_CONNECT": connect})
    from sigmatrace.correlate import correlate
    c = correlate(out, workers=1)
    C, Q, O, T = (c.tables[n] for n in ("collectives", "qps", "ops", "threads"))
    assert len(Q["qp_id"]) == 2 and set(Q["comm_rule"].tolist()) == {rule} and (Q["comm"] >= 0).all()
    cap = capture(out)
    cq = cap.table("IBV_CREATE_QP")
    names = {(int(p), int(t)): str(n) for p, t, n in zip(T["process"], T["thread"], T["name"])}
    assert {names[(int(p), int(t))] for p, t in zip(cq["process"], cq["thread"])} == {"NCCL Progress"}
    assert (O["collective_unit"] >= 0).all()
    one = O["collective_id"] >= 0
    np.testing.assert_array_equal(_fake_seq(C, C["seq"] >= 0)[O["collective_id"][one]], (O["wr_id"] >> 20)[one])
    truth = ground_truth(gt)
    P = c.tables["processes"]
    for (pid, _), g in truth.items():
        proc = int(np.flatnonzero(P["pid"] == pid)[0])
        mine = (C["process"] == proc) & (C["seq"] >= 0)
        units = np.unique(C["unit"][mine])
        first = [int(np.flatnonzero(C["unit"] == u)[0]) for u in units]
        assert sorted(int(C["wire_bytes"][i]) for i in first) == sorted(i["wire_bytes"] for i in g["items"])


@pytest.mark.parametrize("mode", ["simple", "full"])
def test_root_running_ahead_keeps_each_call_on_a_sending_qp(tmp_path, fabric, mode):
    """NCCL's net transport (FAKE_NCCL_NET=ib: a sending QP without receives and a receiving QP per peer, the
    receiver's clear-to-send write at the start of each call) with rank 0 not waiting for its calls: it only
    sends in these operations (a broadcast / scatter root, the sender of send_recv, a reduce leaf), so its
    calls are all made before its proxy has posted much.  A sending QP's window begins at the later of the two
    ranks' calls (docs/schema.md, rule 4), so each of rank 0's calls keeps exactly its own work requests and
    bytes on the wire (the fake's ground truth per proxy item) -- in full mode units may merge where a
    completion shows the overlap, and then hold exactly their items' sum."""
    ops = ("broadcast", "bcast", "scatter", "reduce", "send_recv")
    res, out, gt = run_ranks(tmp_path, fabric, mode, ops=ops, iters=6, count=64 * 1024,
                             args=("--nowait-rank", "0"), extra={"FAKE_NCCL_NET": "ib"})
    from sigmatrace.correlate import correlate
    c = correlate(out, workers=1)
    C, O, Q, P = (c.tables[n] for n in ("collectives", "ops", "qps", "processes"))
    assert len(Q["qp_id"]) == 4 and (Q["comm"] >= 0).all()
    assert (O["collective_unit"] >= 0).all(), "a work request not attributed"
    ex = C["seq"] >= 0
    fseq = _fake_seq(C, ex)
    truth = ground_truth(gt)
    pid = {int(p): i for i, p in enumerate(P["pid"])}
    ahead = 0
    for (p, _), g in truth.items():
        proc = pid[p]
        mine = np.flatnonzero((C["process"] == proc) & ex)
        by_seq = {int(fseq[i]): i for i in mine}
        calls = np.sort(C["call_ns"][mine])
        per_unit = Counter()
        for item in g["items"]:
            (o,) = item["item"]
            r = by_seq[o["seq"]]
            per_unit[int(C["unit"][r])] += item["wire_bytes"]
            if mode == "simple" or C["attribution"][r] == "window":
                assert C["attribution"][r] == "window" and int(C["wire_bytes"][r]) == item["wire_bytes"] \
                    and int(C["wrs"][r]) == item["wrs"], (P["rank"][proc], item, int(C["wire_bytes"][r]))
            later = calls[calls > C["call_ns"][r]]
            if len(later) and C["first_wr_ns"][r] > later[0]:
                ahead += 1                # its work began after this rank's next call
        for u, want in per_unit.items():
            r = int(np.flatnonzero(C["unit"] == u)[0])
            assert int(C["wire_bytes"][r]) == want, (u, int(C["wire_bytes"][r]), want)
    one = O["collective_id"] >= 0
    np.testing.assert_array_equal(fseq[O["collective_id"][one]], (O["wr_id"] >> 20)[one])
    if mode == "simple":
        assert one.all()
    assert ahead >= 10, f"rank 0 did not run ahead of its proxy ({ahead} calls)"
