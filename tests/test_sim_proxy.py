"""CPU proxy threads as SimPy processes (host.CpuProxy): the SimPy AllReduce engine agrees
with the closed-form (vector) engine, records verbs events as the native provider does per
mode, and the correlator matches every send to its target and receive."""
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("simpy")
from sigmatrace.format import read_capture  # noqa: E402
from sigmatrace_sim import run_workload  # noqa: E402
from sigmatrace_sim.verify import load_truth  # noqa: E402

pytestmark = pytest.mark.sim
SMALL = dict(nodes=2, gpus_per_node=2, size=1 << 18, iters=1, seed=13)


def _counts(cap):
    agg = Counter()
    for p in cap.processes:
        for a in p.aggregates:
            agg[(int(a["type"]), int(a["aux"]), int(a["obj"]), int(a["peer"]))] += int(a["count"])
            agg[("bytes", int(a["type"]), int(a["aux"]))] += int(a["bytes"])
    return Counter(cap.count_by_type()), agg


@pytest.mark.parametrize("mode", ["aggregate", "simple", "full"])
@pytest.mark.parametrize("shape", [dict(nodes=2, gpus_per_node=2), dict(nodes=4, gpus_per_node=2, size=1 << 20)])
def test_engines_agree(tmp_path, mode, shape):
    kw = dict(SMALL, **shape)
    caps, truth = {}, {}
    for eng in ("simpy", "vector"):
        out = tmp_path / f"{eng}.bin"
        r = run_workload("allreduce", str(out), mode=mode, engine=eng, **kw)
        assert r.meta["engine"] == eng
        caps[eng] = read_capture(out)
        truth[eng] = load_truth(out)[0]["rank_bytes"]
    assert np.array_equal(truth["simpy"], truth["vector"])          # bytes per rank pair
    assert truth["simpy"].sum() > 0
    (ns, ags), (nv, agv) = _counts(caps["simpy"]), _counts(caps["vector"])
    polls_s, polls_v = ns.pop("IBV_POLL_CQ", 0), nv.pop("IBV_POLL_CQ", 0)
    assert ns == nv                                                   # every event type but the polls
    assert ags == agv                                                 # aggregate counters and bytes
    if mode == "full":
        assert polls_s >= ns["IBV_WC"] // 2 and polls_v > 0          # polling is timing-dependent
        for cap in caps.values():   # every completion is returned by exactly one recorded poll
            pc = cap.table("IBV_POLL_CQ")
            assert int(pc["returned"].sum()) == cap.count_by_type()["IBV_WC"]
            # the model writes every empty poll, and its headers say so
            assert not pc["polls"].any() and {p.header["options"]["idle_polls"] for p in cap.processes} == {"each"}
    else:
        assert polls_s == polls_v == 0
    if mode == "aggregate":
        assert not {"IBV_POST_SEND", "IBV_SEND_WR", "IBV_WC"} & set(ns)


def test_simpy_proxy_moves_bytes_through_the_nic(tmp_path):
    out = tmp_path / "ar.bin"
    r = run_workload("allreduce", str(out), mode="simple", engine="simpy", **SMALL)
    truth, meta = load_truth(out)
    # the NIC model executed the genuine WQEs: data bytes + 8-byte CTS writes
    n_cts = read_capture(out).count_by_type()["IBV_POST_RECV"]
    assert meta["counts"]["nic_bytes_moved"] == int(truth["rank_bytes"].sum()) + 8 * n_cts
    assert r.meta["t_end_ns"] > 200000.0


@pytest.mark.parametrize("mode", ["simple", "full"])
def test_correlator_matches_simpy_capture(tmp_path, mode):
    from sigmatrace.correlate import correlate
    out = tmp_path / "ar.bin"
    run_workload("allreduce", str(out), mode=mode, engine="simpy", nodes=4, gpus_per_node=2, size=1 << 20, iters=1)
    truth, meta = load_truth(out)
    c = correlate(out, workers=1)
    ops = c.tables["ops"]
    assert len(ops["op_id"]) and ops["matched"].all()                # every send resolved to its target QP
    P = c.tables["processes"]
    rank = P["rank"][ops["process"]]
    # bytes per rank pair from the capture alone == truth (CTS writes are the 8-byte ops)
    data = ops["bytes"] > 8
    got = np.zeros_like(truth["rank_bytes"])
    np.add.at(got, (rank[data], ops["dst_rank"][data]), ops["bytes"][data])
    assert np.array_equal(got, truth["rank_bytes"])
    if mode == "full":
        # every RDMA_WRITE_WITH_IMM is matched to the receive completion it consumed on the target
        imm = ops["opcode"] == 0x09
        assert imm.any() and (ops["peer_completion"][imm] >= 0).all()
        comp = c.tables["completions"]
        assert (comp["op_id"] >= 0).all()                             # every completion has its operation
