"""Correlator against the SimPy model's ground truth (fixtures/<workload>.bin + .truth.npz/.json)."""
import json
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.correlate import correlate

pytestmark = pytest.mark.sim
FIX = Path(__file__).resolve().parent.parent / "fixtures"
EPOCH = 1_780_000_000_000_000_000


def _load(name):
    cap = FIX / f"{name}.bin"
    if not cap.exists():
        pytest.skip(f"model fixture {cap.name} not present")
    t = np.load(FIX / f"{name}.truth.npz")
    m = json.loads((FIX / f"{name}.truth.json").read_text())
    return cap, t, m


_cache = {}


def _corr(name, **kw):
    key = (name, tuple(sorted(kw.items())))
    if key not in _cache:
        cap, t, m = _load(name)
        _cache[key] = (correlate(cap, workers=1, **kw), t, m)
    return _cache[key]


@pytest.mark.parametrize("name", ["bfs", "moe", "pingpong", "put", "get", "atomic"])
def test_byte_totals_exact(name):
    c, t, m = _corr(name)
    ops = c.tables["ops"]
    P = c.tables["processes"]
    rank = P["rank"][ops["process"]]
    per_gpu = {str(r): int(ops["bytes"][rank == r].sum()) for r in np.unique(P["rank"])}
    assert per_gpu == {k: v for k, v in m["bytes"]["per_gpu"].items()}
    per_qp = {}
    for r, q, b in zip(rank, ops["qpn"], ops["bytes"]):
        per_qp[f"{r}:{q}"] = per_qp.get(f"{r}:{q}", 0) + int(b)
    assert per_qp == m["bytes"]["per_qp"]
    n = len(c.tables["nodes"]["node"])
    mat = np.zeros((n, n), np.int64)
    np.add.at(mat, (ops["node"], ops["dst_node"]), ops["bytes"])
    assert mat.tolist() == m["bytes"]["node_matrix"]


@pytest.mark.parametrize("name", ["bfs", "moe", "pingpong"])
def test_matching_and_association(name):
    c, t, m = _corr(name)
    ops = c.tables["ops"]
    assert ops["matched"].all()
    w = t["wqes"]
    # every WQE the model says was recovered is associated with its doorbell
    W = c.tables["wqes"]
    assert int((W["doorbell_id"] >= 0).sum()) == int((w["recovered"] == 1).sum())
    # peer side: (rank, peer_rank, qpn, peer_qpn, bytes) multisets agree
    P = c.tables["processes"]
    got = sorted(zip(P["rank"][ops["process"]].tolist(), ops["dst_rank"].tolist(), ops["qpn"].tolist(),
                     ops["dst_qpn"].tolist(), ops["bytes"].tolist()))
    want = sorted(zip(w["rank"].tolist(), w["peer_rank"].tolist(), w["qpn"].tolist(), w["peer_qpn"].tolist(),
                      w["bytes"].tolist()))
    assert got == want


def _db_errors(c, t):
    """Estimated minus true observation time of every recorded doorbell (int ns, relative to EPOCH)."""
    d = t["doorbells"]
    d = d[d["recorded"] & ~d["coalesced"]]
    D = c.tables["doorbells"]
    rank = c.tables["processes"]["rank"][D["process"]]
    got = {}
    for r, q, pi, ns in zip(rank.tolist(), D["qpn"].tolist(), D["producer_index"].tolist(), D["ns"].tolist()):
        got.setdefault((r, q, pi), []).append(ns - EPOCH)
    want = {}
    for x in d:
        want.setdefault((int(x["rank"]), int(x["qpn"]), int(x["pi16"])), []).append((float(x["t_observed"]), int(x["node"])))
    err, node = [], []
    for k, lst in want.items():
        for (tt, n), g in zip(sorted(lst), sorted(got[k])):   # the same PI can be rung twice
            err.append(g - tt)
            node.append(n)
    return np.array(err), np.array(node)


@pytest.mark.parametrize("name", ["bfs", "moe", "pingpong"])
def test_clock_error_with_calibration(name):
    c, t, m = _corr(name)
    err, _ = _db_errors(c, t)
    assert len(err) and np.abs(err).max() <= 1000, np.abs(err).max()


def test_bfs_barriers_match_truth():
    c, t, m = _corr("bfs")
    b = t["barriers"]
    B = c.tables["barriers"]
    levels = np.unique(b["level"])
    assert len(B["barrier"]) == len(levels)
    o = np.argsort(B["first_ns"])
    for lev, i in zip(levels, o):
        tb = b[b["level"] == lev]
        assert int(B["straggler_rank"][i]) == int(tb["rank"][np.argmax(tb["t_arrive"])])
        spread = tb["t_arrive"].max() - tb["t_arrive"].min()
        assert abs(B["spread_ns"][i] - spread) <= 1000, (lev, B["spread_ns"][i], spread)


def test_moe_node_matrix_and_imbalance():
    from sigmatrace.analysis import comm_matrix, skew
    c, t, m = _corr("moe")
    labels, mat, _ = comm_matrix(c, "node")
    assert mat.tolist() == m["bytes"]["node_matrix"]
    sk = skew(c, "node")
    assert sk["egress_imbalance"] == pytest.approx(m["moe"]["egress_imbalance"], rel=1e-9)
    assert sk["heaviest_pair_vs_mean"] == pytest.approx(m["moe"]["heaviest_pair_over_mean"], rel=1e-9)


def _strip_calibration(src, dst):
    """Copy a capture without its CALIBRATION chunks (no wall-clock pairs at all)."""
    from sigmatrace.format import layout as L
    from sigmatrace.format.reader import iter_chunks
    data = Path(src).read_bytes()
    with open(dst, "wb") as f:
        for ch in iter_chunks(src):
            if ch.kind != L.CHUNK_CALIBRATION:
                f.write(data[ch.offset: ch.offset + 32 + len(ch.payload)])


def test_pingpong_clock_without_calibration_f24b(tmp_path):
    cap, t, m = _load("pingpong")
    nocal = tmp_path / "pingpong_nocal.bin"
    _strip_calibration(cap, nocal)
    c = correlate(nocal, workers=1)
    assert c.clock_info["applied"], c.clock_info
    assert (c.tables["clock"]["calibration_pairs"] == 0).all()
    err, node = _db_errors(c, t)
    ref = c.clock_info["reference_node"]
    err = err - np.median(err[node == ref])   # no wall clock: one common offset is unknowable
    assert np.abs(err).max() <= 1000, np.abs(err).max()
