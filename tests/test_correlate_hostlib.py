"""UCX / libfabric operations become ops rows with their peer (from endpoint identities), and aggregate-mode
counters are folded into the rank / node matrices."""
import json

import numpy as np
import pytest

from sigmatrace.correlate import correlate
from sigmatrace.format import events as E
from sigmatrace.format import layout as L
from sigmatrace.format.writer import TraceWriter

pytestmark = pytest.mark.sim


def _ev(rows):
    """rows: (tsc, type name, aux, obj, arg, ext) with ext None or (x0, x1, x2, x3) -> event records."""
    out = []
    for tsc, name, aux, obj, arg, ext in rows:
        out.append((tsc, E.value(name), aux, obj, arg))
        if ext is not None:
            x0, x1, x2, x3 = ext
            out.append((x0, E.EXT, x1, x2, x3))
    a = np.zeros(len(out), L.EVENT_DTYPE)
    for i, r in enumerate(out):
        a[i] = r
    return a


def _proc(path, uid, rank, host, build):
    with TraceWriter(str(path), uid) as w:
        w.process(dict(format_version=1, host=host, node_id=host, rank=rank, world_size=3, mode="full",
                       tsc_hz=1e9, nics=[], gpus=[]))
        w.thread(1, tid=100 + rank, name="main", role="app")
        w.events(1, _ev(build(w)))
        w.end(dict(reason="exit", events=0, dropped_events=0))


def test_ucx_and_ofi_ops_with_peers(tmp_path):
    addr = {0: "a0b1c2d3e4f5a6b7", 1: "1111222233334444", 2: "9999888877776666"}
    fab = {0: "10.0.0.1:5000", 1: "10.0.0.2:5000", 2: "10.0.0.3:5000"}

    def build(rank):
        def f(w):
            rows = []
            sw = w.side_json({"id": 1, "address_len": 8, "address_prefix": addr[rank]})
            rows.append((10, "UCP_WORKER_CREATE", 0, 1, sw, None))
            peer = (rank + 1) % 3
            remote = addr[peer] + "00" * 16          # 24 bytes of the peer's address (it has only 8)
            se = w.side_json({"id": 7, "worker": 1, "field_mask": "0x1", "remote_address_prefix": remote})
            rows.append((11, "UCP_EP_CREATE", 0, 7, se, None))
            so = w.side_json({"id": 3, "provider": "tcp", "ep_type": "rdm", "src_addr": fab[rank], "dest_addr": None})
            rows.append((12, "OFI_ENDPOINT", 0, 3, so, None))
            sa = w.side_json({"av": 2, "count": 2, "ret": 2, "addrs": [fab[(rank + 1) % 3], fab[(rank + 2) % 3]],
                              "fi_addrs": [0, 1]})
            rows.append((13, "OFI_AV_INSERT", 2, 2, sa, None))
            t = 100
            for k in range(4):                       # UCX puts to the next rank
                rows.append((t, "UCP_PUT", 0, 7, 1000 + rank, (0xdead0000 + k, 0, 0, 0x55)))
                t += 10
            rows.append((t, "UCP_ATOMIC", 0, 7, 8, (0xbeef, 0, 0, 0x56)))   # op 0 = add
            t += 10
            for fi in (0, 1, 1):                     # libfabric sends to fi_addr 0 (next) and 1 (the one after)
                rows.append((t, "OFI_SEND", 0, 3, 64 * (rank + 1), (fi, 0, 0, 0x77)))
                t += 10
            rows.append((t, "OFI_WRITE", 0, 3, 4096, (0, 0, 0, 0x9000)))
            return rows
        return f

    for r in range(3):
        _proc(tmp_path / f"h{r}.{r}.trace", 0x100 + r, r, f"h{r}", build(r))
    c = correlate(tmp_path, workers=1)
    ops = c.tables["ops"]
    src = ops["source_name"]
    ucx = src == "ucx"
    ofi = src == "ofi"
    assert ucx.sum() == 15 and ofi.sum() == 12
    assert (ops["dst_rank"][ucx] == (ops["rank"][ucx] + 1) % 3).all()
    assert (ops["qp_id"][ucx | ofi] == -1).all() and ops["matched"][ucx | ofi].all()
    assert set(ops["opcode_name"][ucx].tolist()) == {"RDMA_WRITE", "ATOMIC_FA"}
    put = ucx & (ops["opcode_name"] == "RDMA_WRITE")
    assert sorted(ops["raddr"][put & (ops["rank"] == 0)].tolist()) == [0xdead0000 + k for k in range(4)]
    # libfabric: fi_addr 0 -> next rank, 1 -> the one after; the write goes to fi_addr 0
    send = ofi & (ops["opcode_name"] == "SEND")
    exp = []
    for r in range(3):
        exp += [(r, (r + 1) % 3), (r, (r + 2) % 3), (r, (r + 2) % 3)]
    assert sorted(zip(ops["rank"][send].tolist(), ops["dst_rank"][send].tolist())) == sorted(exp)
    assert send.sum() == 9
    wr = ofi & (ops["opcode_name"] == "RDMA_WRITE")
    assert (ops["dst_rank"][wr] == (ops["rank"][wr] + 1) % 3).all() and (ops["raddr"][wr] == 0x9000).all()
    # they enter the rank matrix
    from sigmatrace.analysis import comm_matrix
    labels, m, n = comm_matrix(c, "rank")
    for r in range(3):
        nxt, nn = (r + 1) % 3, (r + 2) % 3
        assert m[r, nxt] == 4 * (1000 + r) + 8 + 64 * (r + 1) + 4096
        assert m[r, nn] == 2 * 64 * (r + 1)
        assert n[r, nxt] == 7 and n[r, nn] == 2


def test_unresolved_ucx_peer_stays_unknown(tmp_path):
    def f(w):
        se = w.side_json({"id": 7, "worker": 1, "sockaddr": "10.1.1.1:13337"})
        return [(11, "UCP_EP_CREATE", 0, 7, se, None), (20, "UCP_TAG_SEND", 0, 7, 128, (5, 0, 0, 1))]
    _proc(tmp_path / "x.0.trace", 0x77, 0, "x", f)
    c = correlate(tmp_path, workers=1)
    ops = c.tables["ops"]
    assert ops["source_name"].tolist() == ["ucx"] and ops["dst_rank"].tolist() == [-1]
    assert not ops["matched"][0] and ops["opcode_name"][0] == "SEND"


def test_aggregate_counters_fold_into_matrices(tmp_path):
    """The same AllReduce in aggregate mode (counters only) and in full mode (every operation) gives the same
    rank and node matrices."""
    from sigmatrace.analysis import comm_matrix
    from sigmatrace_sim import run_workload
    got = {}
    for mode in ("aggregate", "full"):
        cap = tmp_path / f"ar_{mode}.bin"
        run_workload("allreduce", str(cap), nodes=2, gpus_per_node=2, size=1 << 18, iters=2, mode=mode, seed=5)
        c = correlate(cap, workers=1)
        if mode == "aggregate":
            A = c.tables["aggregates"]
            assert c.tables["ops"].n_rows == 0 and A["is_op"].any()
            assert (A["dst_rank"][A["is_op"]] >= 0).all()
        got[mode] = {lv: comm_matrix(c, lv)[1:] for lv in ("rank", "node")}
        truth = json.loads((tmp_path / f"ar_{mode}.truth.json").read_text())
    for lv in ("rank", "node"):
        assert got["aggregate"][lv][0].tolist() == got["full"][lv][0].tolist(), lv
        assert got["aggregate"][lv][1].tolist() == got["full"][lv][1].tolist(), lv
        assert got["aggregate"][lv][0].sum() > 0
    # data bytes of the model's ground truth (the matrices also hold the 8-byte flag writes)
    assert got["aggregate"]["node"][0].sum() >= sum(map(sum, truth["bytes"]["node_matrix"]))
