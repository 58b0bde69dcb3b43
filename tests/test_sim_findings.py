"""The paper's qualitative findings come out of the model (nothing here is hard-coded:
each number is measured from a simulation run)."""
import numpy as np
import pytest

pytest.importorskip("simpy")
from sigmatrace.format import read_capture  # noqa: E402
from sigmatrace_sim import run_workload  # noqa: E402

pytestmark = pytest.mark.sim


def _median_latency(tmp_path, op, hijack):
    r = run_workload(op, str(tmp_path / f"{op}-{hijack}.bin"), iters=60, warmup=5, hijack=hijack)
    return r.meta["latency_ns"]["median"]


def test_fig4_forward_small_recovery_more_pingpong_most(tmp_path):
    over = {}
    for op in ("put", "get", "atomic", "pingpong"):
        base = _median_latency(tmp_path, op, "baseline")
        fwd = _median_latency(tmp_path, op, "forward")
        rec = _median_latency(tmp_path, op, "recovery")
        over[op] = ((fwd - base) / base, (rec - base) / base)
    for op, (f, r) in over.items():
        assert 0 < f < 0.10, (op, f)          # forwarding: small fixed cost
        assert r > 2 * f, (op, f, r)           # WQE recovery costs clearly more
    assert max(over, key=lambda op: over[op][1]) == "pingpong"
    # non-blocking recovery (F24c) costs about what forwarding costs
    nb = _median_latency(tmp_path, "put", "nonblocking")
    base = _median_latency(tmp_path, "put", "baseline")
    assert (nb - base) / base < over["put"][0] * 1.5


def test_fig8_9_bfs_barrier_spread_largest_early_on_hub_owner(tmp_path):
    r = run_workload("bfs", str(tmp_path / "bfs.bin"), scale=9, edgefactor=8, seed=3)
    b = r.meta["bfs"]
    assert b["levels_match_reference"]
    levels = b["per_level"]
    spreads = [lv["spread_ns"] for lv in levels]
    worst = int(np.argmax(spreads))
    assert worst < (len(levels) + 1) // 2                     # early level
    assert spreads[worst] > 3 * spreads[-1]                    # much larger than at the end
    lv = levels[worst]
    heaviest = int(np.argmax(lv["remote_ops"]))
    assert heaviest == b["hub_owner"] == 0                      # GPU 0 owns the hubs and makes the traffic
    assert lv["last_rank"] == heaviest                          # ... and arrives last at the barrier
    # the barrier arrivals are observable in the capture: barrier atomics are tag 4 in the truth,
    # and their doorbells are recorded
    from sigmatrace_sim.verify import load_truth
    truth, _ = load_truth(tmp_path / "bfs.bin")
    w = truth["wqes"]
    assert (w["recovered"][w["tag"] == 4] == 1).all()


@pytest.mark.parametrize("skew,lo,hi", [(0.0, 0.0, 1.15), (1.5, 2.0, 100.0)])
def test_fig10_moe_node_egress_imbalance(tmp_path, skew, lo, hi):
    r = run_workload("moe", str(tmp_path / f"moe{skew}.bin"), skew=skew, tokens=16, seed=5)
    assert lo <= r.meta["moe"]["egress_imbalance"] <= hi
    # the same imbalance is visible from the capture alone (decoded WQE bytes per node)
    from sigmatrace_sim.verify import decode
    cap, _, wqes, _ = decode(tmp_path / f"moe{skew}.bin")
    node_of = {p.header["rank"]: p.header["node_id"] for p in cap.processes}
    qp_peer = {}
    for p in r.meta["processes"]:
        for q in p["qps"]:
            qp_peer[(p["rank"], q["qpn"])] = q["peer_rank"]
    egress = np.zeros(4)
    for (rank, qpn), ws in wqes.items():
        if node_of[qp_peer[(rank, qpn)]] != node_of[rank]:
            egress[node_of[rank]] += sum(x["bytes"] for x in ws)
    assert lo <= egress.max() / egress.min() <= hi


def test_table1_event_counts_grow_with_mode(tmp_path):
    n = {}
    size = {}
    for mode in ("aggregate", "simple", "full"):
        out = tmp_path / f"ar-{mode}.bin"
        run_workload("allreduce", str(out), nodes=4, size=1 << 20, iters=2, mode=mode)
        cap = read_capture(out)
        n[mode] = cap.summary()["events"] + sum(len(p.aggregates) for p in cap.processes)
        size[mode] = out.stat().st_size
        if mode == "aggregate":
            agg = np.concatenate([p.aggregates for p in cap.processes])
            assert agg["bytes"].sum() > 0 and "IBV_POST_SEND" not in cap.count_by_type()
        if mode == "full":
            by = cap.count_by_type()
            assert by["IBV_POLL_CQ"] > 0 and by["IBV_SEND_WR"] > 0 and by["IBV_WC"] > 0
    assert n["aggregate"] < n["simple"] < n["full"]
    assert size["aggregate"] < size["simple"] < size["full"]
    assert n["full"] > 3 * n["simple"]
