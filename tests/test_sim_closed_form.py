"""The model's shortcuts give exactly what the per-event model gives.

* closed_form.post_quiet_run (a post + quiet chain in one SimPy step): same capture
  bytes, same ground truth, same latencies as the per-event loop, in every hijack
  and recording mode; refused (per-event fallback) where it does not apply.
* nic.SendQueue.decoded (the NIC's decode of a ring slot, kept with the bytes): every
  WQE the NIC executes is also decoded from the ring bytes and must agree.
"""
import numpy as np
import pytest

pytest.importorskip("simpy")
import sigmatrace_sim.closed_form as CF  # noqa: E402
import sigmatrace_sim.nic as NIC  # noqa: E402
from sigmatrace_sim import run_workload  # noqa: E402
from sigmatrace_sim.verify import compare, load_truth  # noqa: E402

pytestmark = pytest.mark.sim


def _both(tmp_path, workload, **kw):
    """Run per-event and closed-form; returns [(capture bytes, truth arrays, meta, commits)] x 2."""
    out = []
    orig = CF._commit
    for enabled in (False, True):
        commits = []

        def spy(*a, **k):
            commits.append(1)
            return orig(*a, **k)

        CF.ENABLED = enabled
        CF._commit = spy
        try:
            path = tmp_path / f"{workload}-{enabled}.bin"
            run_workload(workload, str(path), **kw)
        finally:
            CF.ENABLED = True
            CF._commit = orig
        truth, meta = load_truth(path)
        out.append((path.read_bytes(), truth, meta, len(commits), path))
    return out


def _same_truth(a, b):
    for name in a:
        for f in a[name].dtype.names or ():
            x, y = a[name][f], b[name][f]
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (name, f)
        if a[name].dtype.names is None:
            assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("op", ["put", "get", "atomic"])
@pytest.mark.parametrize("hijack,mode", [("baseline", "simple"), ("forward", "full"), ("recovery", "simple"),
                                         ("recovery", "full"), ("nonblocking", "full")])
def test_post_quiet_chain_equals_per_event(tmp_path, op, hijack, mode):
    (cap_e, tr_e, meta_e, n_e, _), (cap_c, tr_c, meta_c, n_c, path) = _both(
        tmp_path, op, iters=300, warmup=5, hijack=hijack, mode=mode, batch_threshold=32)
    assert n_e == 0 and n_c == 1                 # the shortcut was taken (once, for the whole chain)
    assert cap_c == cap_e                         # byte-identical capture
    _same_truth(tr_e, tr_c)                       # identical ground truth, incl. every time and latency
    assert meta_c == meta_e
    assert compare(path)["problems"] == {}


def test_post_quiet_chain_refuses_what_it_cannot_prove(tmp_path):
    # a recovery batch larger than the SQ: the per-event model decides what is overwritten
    (cap_e, tr_e, _, _, _), (cap_c, tr_c, _, n_c, _) = _both(
        tmp_path, "put", iters=80, warmup=2, hijack="recovery", qp_depth=16, batch_threshold=64)
    assert n_c == 0 and cap_c == cap_e
    _same_truth(tr_e, tr_c)
    # ping-pong interleaves two PEs: always per event
    (_, _, _, _, _), (_, _, _, n_c, _) = _both(tmp_path, "pingpong", iters=20, warmup=2)
    assert n_c == 0


@pytest.mark.parametrize("workload,kw", [("bfs", dict(scale=8, edgefactor=8)),
                                         ("moe", dict(tokens=6, skew=1.5, nodes=2, gpus_per_node=2)),
                                         ("stress", dict(posts=300, seed=11)),
                                         ("allreduce", dict(nodes=2, size=1 << 18, iters=1, engine="simpy"))])
def test_nic_decoded_slots_match_ring_bytes(tmp_path, workload, kw):
    a, b = tmp_path / "plain.bin", tmp_path / "checked.bin"
    run_workload(workload, str(a), **kw)
    NIC.Nic.CHECK_BYTES = True      # decode every executed WQE from the ring bytes and assert equality
    try:
        run_workload(workload, str(b), **kw)
    finally:
        NIC.Nic.CHECK_BYTES = False
    assert a.read_bytes() == b.read_bytes()
