"""SimPy model: determinism, and the decoder (sigmatrace.format + sigmatrace.mlx5)
reproduces the model's ground truth exactly."""
import json

import numpy as np
import pytest

pytest.importorskip("simpy")
from sigmatrace.format import read_capture  # noqa: E402
from sigmatrace_sim import run_workload  # noqa: E402
from sigmatrace_sim.cluster import truth_paths  # noqa: E402
from sigmatrace_sim.verify import compare, load_truth  # noqa: E402

pytestmark = pytest.mark.sim

SMALL = {
    "put": dict(iters=30, warmup=3),
    "pingpong": dict(iters=30, warmup=3),
    "atomic": dict(iters=20, warmup=2),
    "get": dict(iters=20, warmup=2),
    "bfs": dict(scale=8, edgefactor=8),
    "moe": dict(tokens=6, skew=1.5, nodes=2, gpus_per_node=2),
}


@pytest.fixture(scope="module")
def stress(tmp_path_factory):
    out = tmp_path_factory.mktemp("stress") / "stress.bin"
    run_workload("stress", str(out), posts=300, seed=11)
    return out


@pytest.mark.parametrize("workload", ["put", "bfs", "moe", "allreduce"])
def test_same_seed_byte_identical(tmp_path, workload):
    kw = SMALL.get(workload, dict(nodes=2, size=1 << 18, iters=1))
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    run_workload(workload, str(a), seed=7, **kw)
    run_workload(workload, str(b), seed=7, **kw)
    assert a.read_bytes() == b.read_bytes()
    ja, jb = (json.loads(open(truth_paths(p)[1]).read()) for p in (a, b))
    assert ja == jb
    c = tmp_path / "c.bin"
    run_workload(workload, str(c), seed=8, **kw)
    assert c.read_bytes() != a.read_bytes()


@pytest.mark.parametrize("workload", ["put", "get", "atomic", "pingpong", "bfs", "moe"])
def test_decoder_reproduces_truth(tmp_path, workload):
    out = tmp_path / f"{workload}.bin"
    res = run_workload(workload, str(out), **SMALL[workload])
    rep = compare(out)
    assert rep["problems"] == {}
    truth, meta = load_truth(out)
    w, d = truth["wqes"], truth["doorbells"]
    assert rep["doorbells"] == int((d["recorded"] & ~d["coalesced"]).sum()) > 0
    assert rep["wqes"] == len(w) == res.meta["counts"]["wqes_recovered"]
    # per-QP and per-GPU byte totals decoded == ground truth totals
    assert {f"{r}:{q}": b for (r, q), b in rep["per_qp_bytes"].items()} == meta["bytes"]["per_qp"]
    assert {str(r): b for r, b in rep["per_gpu_bytes"].items()} == {k: v for k, v in meta["bytes"]["per_gpu"].items() if v}


def test_capture_structure_matches_tracer(tmp_path):
    out = tmp_path / "bfs.bin"
    run_workload("bfs", str(out), scale=7, edgefactor=4)
    cap = read_capture(out)
    assert not cap.warnings and all(p.complete for p in cap.processes)
    h = cap.processes[0].header
    for key in ("format_version", "process_uid", "tracer", "host", "rank", "world_size", "mode", "tsc_hz",
                "options", "nics", "gpus"):
        assert key in h
    assert h["tracer"] == "sim" and h["options"]["batch_threshold"] == 128
    roles = {t["role"] for p in cap.processes for t in p.threads.values()}
    assert {"app", "poller"} <= roles
    by = cap.count_by_type()
    nqp = len(cap.table("DB_HIJACK_INSTALL")["tsc"])
    assert by["MLX5_DEVX_OBJ_MODIFY"] == 3 * nqp
    assert by["CU_MEM_HOST_GET_DEVPTR"] == nqp
    assert (cap.table("CU_MEM_HOST_GET_DEVPTR")["hijacked"] == 1).all()
    assert (cap.table("MLX5_DEVX_UMEM_REG")["umem_flags"] == 1).all()
    # CREATE_QP PRM records carry the QPN and the SQ size
    from sigmatrace.mlx5 import parse_create_qp
    oc = cap.table("MLX5_DEVX_OBJ_CREATE")
    for proc, op, num, sid in zip(oc["process"], oc["prm_opcode"], oc["number"], oc["side_id"]):
        if op == 0x500:
            qp = parse_create_qp(*cap.side_record(int(proc), int(sid)).prm())
            assert qp.qpn == num and qp.sq_wqebbs == 1024
    # doorbell TSCs are monotonic per poller thread
    db = cap.table("DB_DOORBELL")
    for key in set(zip(db["process"].tolist(), db["thread"].tolist())):
        m = (db["process"] == key[0]) & (db["thread"] == key[1])
        assert (np.diff(db["tsc"][m].astype(np.int64)) >= 0).all()


def test_stress_coalescing_and_wraps(stress):
    rep = compare(stress)
    assert rep["problems"] == {}
    truth, meta = load_truth(stress)
    d, w = truth["doorbells"], truth["wqes"]
    rec = d[d["recorded"]]
    assert rec["coalesced"].sum() > 0                        # GPU rang again before the poller looked
    assert (rec["pi"] >= 65536).any() and (rec["pi"] < 65536).any()   # 16-bit wrap inside the window
    assert int(meta["counts"]["sq_ring_wraps"]) > 2            # the SQ ring wrapped
    multi = w[(w["recovered"] == 1) & (w["num_wqebb"] > 1)]
    depth = meta["qp_depth"]
    assert ((multi["wqe_index"] % depth) == depth - 1).any()   # a 2-WQEBB WQE straddles the ring end
    # every coalesced store is covered by the PI of the observation that absorbed it
    obs = {int(r["doorbell_id"]): int(r["pi"]) for r in d[~d["coalesced"] & d["recorded"]]}
    for r in d[d["coalesced"] & d["recorded"]]:
        assert obs[int(r["observed_as"])] >= int(r["pi"])
    # the capture announces exactly the WQEBBs it recovered (nothing lost, nothing doubled)
    cap = read_capture(stress)
    wq = cap.table("DB_WQE")
    n = sum(cap.side_record(int(p), int(s)).wqe()[0]["num_wqebb"] for p, s in zip(wq["process"], wq["side_id"]))
    assert n == int(w["num_wqebb"][w["recovered"] == 1].sum())
