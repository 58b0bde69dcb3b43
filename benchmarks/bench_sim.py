"""Benchmarks of the SimPy model (pytest-benchmark, marker sim).

  test_doorbells_per_second   simulated GPU doorbells per second of wall time, full
                              detail (GPU posting, hijack poller with WQE recovery,
                              NIC fetch/execute, fabric, CQ, capture + ground truth
                              written), for put, get, atomic (post + quiet chains),
                              stress, BFS (scale 12) and MoE, side by side in one run;
                              median of 3 rounds; the rates before this version in
                              extra_info
  test_table1_scale_capture   time to write a Table-I-scale AllReduce capture
                              (32 nodes x 4 GPUs, 1 MB, simple mode, >= 40 M events).
                              By default a 1/10 scale run is timed and the full-scale
                              time extrapolated linearly (the generation is per-process
                              vectorised, so time is linear in events); set
                              SIGMATRACE_BENCH_FULL=1 to run the full scale.
Numbers go to benchmark.extra_info.
"""
import os
import statistics
import time

import pytest

pytest.importorskip("simpy")
pytest.importorskip("pytest_benchmark")
from sigmatrace_sim import run_workload  # noqa: E402

pytestmark = pytest.mark.sim

DOORBELL_GOAL = 200_000
TABLE1_EVENTS = 40_000_000
TABLE1_GOAL_S = 600.0


# Workload sizes of the doorbell-rate benchmark and the rates of the previous version
# (per-event post+quiet loops, NIC parsing every WQE from the ring bytes; ~3 SimPy
# events per doorbell), measured side by side with this version on this machine
# (shared 2-core VM, median of 3, same parameters; the MoE layers>1 counter fix applied
# to both): end to end (setup, simulation, capture + ground truth written) and
# simulation alone.  "v0" is the first model (one SimPy event per pipeline stage).
# "closed_form": the post + quiet chain runs in one SimPy step (closed_form.py).
DOORBELL_CASES = {
    "put": (dict(iters=20000, warmup=20, hijack="recovery"), 40_166, 74_060, 19_223),
    "get": (dict(iters=20000, warmup=20, hijack="recovery"), 37_916, 73_517, None),
    "atomic": (dict(iters=20000, warmup=20, hijack="recovery"), 36_115, 64_106, None),
    "stress": (dict(posts=20000, seed=11), 28_544, 45_532, 11_659),
    "bfs": (dict(scale=12, edgefactor=8, seed=3), 12_840, 22_342, 3_577),
    "moe": (dict(skew=1.5, tokens=48, layers=4, seed=5), 9_485, 29_299, None),
}
CLOSED_FORM = ("put", "get", "atomic")


def test_doorbells_per_second(benchmark, tmp_path):
    import sigmatrace_sim.cluster as C
    runs = {name: [] for name in DOORBELL_CASES}
    orig_run = C.Cluster.run
    current = {}

    def timed_run(self, procs):
        t = time.perf_counter()
        r = orig_run(self, procs)
        current["sim_s"] = time.perf_counter() - t
        return r

    def one_round():
        for name, (kw, *_before) in DOORBELL_CASES.items():
            current.clear()
            t = time.perf_counter()
            r = run_workload(name, str(tmp_path / f"{name}.bin"), **kw)
            dt = time.perf_counter() - t
            runs[name].append(dict(dt=dt, sim_s=current["sim_s"], n=r.meta["counts"]["doorbells_simulated"],
                                   wqes=r.meta["counts"]["wqes"]))

    C.Cluster.run = timed_run
    try:
        benchmark.pedantic(one_round, rounds=3, iterations=1)
    finally:
        C.Cluster.run = orig_run
    table = {}
    lines = [f"{'workload':8s} {'doorbells':>9s} {'db/s':>9s} {'before':>8s} {'x':>5s} {'sim db/s':>9s} {'before':>8s}"]
    for name, (kw, before, before_sim, v0) in DOORBELL_CASES.items():
        rs = runs[name]
        rate = statistics.median(x["n"] / x["dt"] for x in rs)
        sim_rate = statistics.median(x["n"] / x["sim_s"] for x in rs)
        table[name] = {"params": kw, "doorbells_simulated": rs[-1]["n"], "wqes": rs[-1]["wqes"],
                       "doorbells_per_s_median": rate, "doorbells_per_s_sim_only_median": sim_rate,
                       "doorbells_per_s_before": before, "doorbells_per_s_sim_only_before": before_sim,
                       "doorbells_per_s_v0": v0, "speedup": rate / before, "goal_met": rate >= DOORBELL_GOAL,
                       "closed_form": name in CLOSED_FORM}
        lines.append(f"{name:8s} {rs[-1]['n']:9d} {rate:9.0f} {before:8d} {rate / before:5.1f} {sim_rate:9.0f} "
                     f"{before_sim:8d}")
    print("\n" + "\n".join(lines))
    benchmark.extra_info.update({"goal_doorbells_per_s": DOORBELL_GOAL, "workloads": table})
    for name in CLOSED_FORM:     # the others are within noise of before on a shared machine: reported only
        assert table[name]["doorbells_per_s_median"] > 3 * table[name]["doorbells_per_s_before"], name


def test_table1_scale_capture(benchmark, tmp_path):
    full = os.environ.get("SIGMATRACE_BENCH_FULL") == "1"
    iters = 420 if full else 42
    out = tmp_path / "allreduce.bin"
    res = {}

    def go():
        t = time.perf_counter()
        res["r"] = run_workload("allreduce", str(out), nodes=32, gpus_per_node=4, size=1 << 20, iters=iters,
                                mode="simple", seed=13)
        res["dt"] = time.perf_counter() - t

    benchmark.pedantic(go, rounds=1, iterations=1)
    r, dt = res["r"], res["dt"]
    per_event = dt / r.events
    est = per_event * TABLE1_EVENTS
    benchmark.extra_info.update({
        "events": r.events, "bytes": r.bytes, "wall_s": dt, "events_per_s": r.events / dt,
        "full_scale_run": full, "extrapolated": not full,
        "estimated_s_for_40M_events": est, "goal_s": TABLE1_GOAL_S, "goal_met": est <= TABLE1_GOAL_S})
    os.remove(out)
    assert est <= TABLE1_GOAL_S
