"""What the report tells a performance engineer (issue 17): latencies over measured values only, flows for
host-library operations, zero-filled bandwidth in GB/s, matrices and barrier figures readable at 128 ranks, a
latency figure for micro-benchmarks, and a terminal summary that names the straggler and the skew truthfully."""
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.correlate import correlate
from sigmatrace.report import build_report

pytestmark = pytest.mark.sim
FIX = Path(__file__).resolve().parent.parent / "fixtures"


def _report_of(tmp_path_factory, name, capture):
    """(correlation, summary, report directory) of a committed capture, without Perfetto."""
    out = tmp_path_factory.mktemp(name)
    corr, summary, _ = build_report(FIX / capture, out, workers=1, perfetto=False, quiet=True)
    return corr, summary, out


@pytest.fixture(scope="module")
def ar_report(tmp_path_factory):
    """The full-mode AllReduce: work requests with and without a recorded completion."""
    return _report_of(tmp_path_factory, "ar", "allreduce_full.bin")


def test_wr_latency_counts_measured_latencies_only(ar_report):
    corr, s, _ = ar_report
    lat = np.asarray(corr.tables["ops"]["latency_ns"])
    known = lat[lat >= 0]
    assert 0 < len(known) < len(lat)
    w = s["wr_latency_ns"]
    assert w["count"] == len(known) and w["max"] == known.max()
    assert w["p50"] == pytest.approx(np.percentile(known, 50)) and w["mean"] == pytest.approx(known.mean())


def _hostlib_capture(path):
    """Three processes: libfabric sends (fi_addr 0 -> the next rank) and UCX puts (endpoint -> the next rank)."""
    from sigmatrace.format import events as E
    from sigmatrace.format import layout as L
    from sigmatrace.format.writer import TraceWriter
    addr = {0: "a0b1c2d3e4f5a6b7", 1: "1111222233334444", 2: "9999888877776666"}
    fab = {0: "10.0.0.1:5000", 1: "10.0.0.2:5000", 2: "10.0.0.3:5000"}
    for rank in range(3):
        with TraceWriter(str(path / f"h{rank}.{rank}.trace"), 0x100 + rank) as w:
            w.process(dict(format_version=1, host=f"h{rank}", node_id=f"h{rank}", rank=rank, world_size=3, mode="full",
                           tsc_hz=1e9, nics=[], gpus=[]))
            w.thread(1, tid=100 + rank, name="main", role="app")
            nxt = (rank + 1) % 3
            rows = [(10, "UCP_WORKER_CREATE", 0, 1, w.side_json({"id": 1, "address_len": 8,
                                                                 "address_prefix": addr[rank]}), None),
                    (11, "UCP_EP_CREATE", 0, 7, w.side_json({"id": 7, "worker": 1, "field_mask": "0x1",
                                                             "remote_address_prefix": addr[nxt] + "00" * 16}), None),
                    (12, "OFI_ENDPOINT", 0, 3, w.side_json({"id": 3, "provider": "tcp", "ep_type": "rdm",
                                                            "src_addr": fab[rank], "dest_addr": None}), None),
                    (13, "OFI_AV_INSERT", 2, 2, w.side_json({"av": 2, "count": 1, "ret": 1, "addrs": [fab[nxt]],
                                                             "fi_addrs": [0]}), None)]
            t = 100
            for k in range(3):
                rows.append((t, "UCP_PUT", 0, 7, 1000, (0xdead0000 + k, 0, 0, 0x55)))
                rows.append((t + 5, "OFI_SEND", 0, 3, 64, (0, 0, 0, 0x77)))
                t += 10
            rows.append((t, "OFI_SEND", 0, 3, 64, (5, 0, 0, 0x78)))     # fi_addr 5: not in the AV, no peer
            out = []
            for tsc, name, aux, obj, arg, ext in rows:
                out.append((tsc, E.value(name), aux, obj, arg))
                if ext is not None:
                    out.append((ext[0], E.EXT, ext[1], ext[2], ext[3]))
            a = np.zeros(len(out), L.EVENT_DTYPE)
            for i, r in enumerate(out):
                a[i] = r
            w.events(1, a)
            w.end(dict(reason="exit", events=0, dropped_events=0))
    return path


def test_host_library_ops_get_flows_and_perfetto_draws_them(tmp_path):
    """libfabric / UCX operations have no QP (dst_qp_id = -1) but a known peer process: each matched one is a
    flow (one-sided: no peer completion recorded) and an arrow in Perfetto from the issuing thread's track to
    the target process's track; the unmatched one is drawn without an arrow."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    from sigmatrace.export import write_perfetto
    corr = correlate(_hostlib_capture(tmp_path), workers=1)
    ops = corr.tables["ops"]
    assert (ops["qp_id"] == -1).all() and (ops["dst_qp_id"] == -1).all()
    matched = np.asarray(ops["matched"])
    assert matched.sum() == 18 and (~matched).sum() == 3
    fl = corr.tables["flows"]
    assert sorted(fl["op_id"].tolist()) == np.flatnonzero(matched).tolist()
    assert set(fl["kind"].tolist()) == {"one-sided"} and (fl["dst_completion_id"] == -1).all()
    stats = write_perfetto(corr, tmp_path / "t.pftrace")
    from perfetto_util import read_trace
    tr = read_trace(tmp_path / "t.pftrace")
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    evs = [p.track_event for p in tr.packet if p.HasField("track_event")]
    out = [e for e in evs if e.flow_ids]
    end = [e for e in evs if e.terminating_flow_ids]
    assert stats["flows"] == len(out) == len(end) == 18
    assert {f for e in out for f in e.flow_ids} == {f for e in end for f in e.terminating_flow_ids}
    assert all(tracks[e.track_uuid].HasField("thread") for e in out)       # the issuing thread
    assert all(tracks[e.track_uuid].HasField("process") for e in end)
    end_of = {f: e for e in end for f in e.terminating_flow_ids}
    for e in out:      # the arrow ends on the process its peer annotation names
        peer = next(a.string_value for a in e.debug_annotations if a.name == "peer")
        assert tracks[end_of[e.flow_ids[0]].track_uuid].process.process_name.startswith(peer.split(" h")[0] + " @")
    # every op is drawn, the unmatched ones without an arrow (3 x (3 puts + 4 sends) instants + 18 target ends)
    assert stats["instants"] == 21 + 18


# ------------------------------------------------------------------------------------------------ bandwidth
@pytest.fixture(scope="module")
def moe_report(tmp_path_factory):
    return _report_of(tmp_path_factory, "moe", "moe.bin")


def test_bandwidth_rows_are_zero_filled_in_gbps(moe_report):
    """Every GPU has a row for every bin from the first to the last operation (0 while idle, so a step plot
    falls to 0 in the gaps), and gbps = bytes / bin_ns: integrated over the bins it gives each GPU's bytes."""
    from sigmatrace import analysis as A
    from sigmatrace.query import connect
    corr, _, out = moe_report
    con = connect(out)
    bin_ns = 20_000
    for level in ("gpu", "node"):
        rows = A.bandwidth(con, level, bin_ns)
        by = {}
        for r in rows:
            by.setdefault(r[level], []).append(r)
        grids = {tuple(r["t_ns"] for r in v) for v in by.values()}
        assert len(grids) == 1                       # one grid for every series
        grid = next(iter(grids))
        assert list(np.diff(grid)) == [bin_ns] * (len(grid) - 1)
        ops = corr.tables["ops"]
        for k, v in by.items():
            assert sum(r["gbps"] * bin_ns for r in v) == pytest.approx(int(ops["bytes"][ops[level] == k].sum()))
            assert all(r["gbps"] == pytest.approx(r["bytes"] / bin_ns) for r in v)
        assert sum(1 for v in by.values() for r in v if r["bytes"] == 0) > len(by)   # idle bins are rows


def _rows(series, bins, bin_ns, gap=()):
    rows = []
    for s in range(series):
        for b in range(bins):
            rows.append(dict(gpu=s, label=f"gpu{s}", t_ns=1000 + b * bin_ns,
                             bytes=0 if b in gap else (s + 1) * 1000 * (1 + b % 3)))
    return rows


def test_bandwidth_figure_falls_to_zero_has_units_and_an_outside_legend():
    from sigmatrace.analysis import figures as F
    bin_ns = 10_000
    rows = [r for r in _rows(3, 40, bin_ns, gap=range(10, 30)) if r["bytes"]]    # no rows in the gap at all
    fig = F.bandwidth_plot(rows, "gpu", "label", "t", bin_ns)
    ax = fig.axes[0]
    steps = [p for p in ax.patches if p.get_label().startswith("gpu")]
    assert len(steps) == 3
    for p in steps:
        vals = p.get_data().values
        assert len(vals) == 40 and (vals[10:30] == 0).all() and (vals[:10] > 0).all()
    # units: the peak is 3 * 1000 * 3 bytes per 10 µs = 0.9 GB/s -> MB/s, 900
    assert ax.get_ylabel() == "MB/s posted" and max(p.get_data().values.max() for p in steps) == pytest.approx(900)
    fig.canvas.draw()
    leg = ax.get_legend().get_window_extent()
    assert leg.x0 >= ax.get_window_extent().x1           # right of the axes, never over the data
    colours = {tuple(p.get_edgecolor()) for p in steps}
    assert len(colours) == 3
    F.pyplot().close(fig)


def test_bandwidth_figure_many_series_top_and_others():
    from sigmatrace.analysis import figures as F
    bin_ns = 10_000
    fig = F.bandwidth_plot(_rows(128, 20, bin_ns), "gpu", "label", "t", bin_ns)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == F.TOP_LINES + 2 and labels[0].startswith("gpu127 ")        # the heaviest first
    assert any(t.startswith("others: 120 GPUs") for t in labels)
    lines = [p for p in ax.patches if p.get_label().startswith("gpu")]
    assert len({tuple(p.get_edgecolor()) for p in lines}) == F.TOP_LINES             # all distinguishable
    F.pyplot().close(fig)


def test_report_bandwidth_figures_written(moe_report):
    _, _, out = moe_report
    for level in ("gpu", "node"):
        assert (out / "figures" / f"bandwidth_{level}.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------------ matrices
def test_heatmap_scale_from_zero_and_units_per_cell():
    from sigmatrace.analysis import figures as F
    m = np.full((4, 4), 1_000_000.0)
    m[0, 1] = 1_020_000.0                                   # a uniform matrix, one cell 1.02x
    fig = F.heatmap_plot([f"n{i}" for i in range(4)], m)
    im = fig.axes[0].images[0]
    assert im.norm.vmin == 0                                # 1.02x does not look like 10x
    F.pyplot().close(fig)
    m = np.zeros((3, 3))
    m[0, 1], m[1, 2], m[2, 0], m[1, 0] = 4, 1_730_000, 28_700, 3_000_000
    fig = F.heatmap_plot(["a", "b", "c"], m)
    texts = sorted(t.get_text() for t in fig.axes[0].texts)
    assert texts == ["1.73 MB", "28.7 KB", "3.00 MB", "4 B"]  # each cell its own unit; no "0.0MB"; no text if 0
    assert np.ma.is_masked(fig.axes[0].images[0].get_array()[0, 0])    # no traffic: masked (grey), not "0"
    F.pyplot().close(fig)


def test_heatmap_of_128_ranks_has_no_cell_text_and_thinned_ticks():
    from sigmatrace.analysis import figures as F
    n = 128
    m = np.random.default_rng(1).integers(1, 10**6, (n, n)).astype(float)
    fig = F.heatmap_plot([f"rank{i}" for i in range(n)], m)
    ax = fig.axes[0]
    assert not ax.texts
    assert len(ax.get_xticks()) <= F.MAX_TICKS and len(ax.get_yticks()) <= F.MAX_TICKS
    w, h = fig.get_size_inches()
    assert w <= 16 and h <= 14.5
    F.pyplot().close(fig)


# ------------------------------------------------------------------------------------------------ barriers
def _barrier_rows(parts, instances, late):
    """``late``: participant index that arrives last at each instance (None: the last index)."""
    bars, arr = [], []
    for k in range(instances):
        first = 1_000_000 * k
        order = [p for p in range(parts) if p != late[k]] + [late[k]]
        for pos, p in enumerate(order):
            arr.append(dict(barrier=k, instance=k, position=pos, label=f"node{p // 4:03d}/gpu{p % 4}@r{p}", rank=p,
                            gpu=p, node=p // 4, ns=first + 100 * pos, wait_ns=100 * (parts - 1 - pos)))
        bars.append(dict(barrier=k, first_ns=first, last_ns=first + 100 * (parts - 1), spread_ns=100 * (parts - 1),
                         participants=parts, straggler_label=arr[-1]["label"]))
    return bars, arr


def test_barrier_figure_at_128_gpus_is_readable_and_names_the_straggler():
    from sigmatrace.analysis import figures as F
    late = [77, 5, 77, 77, 9]
    bars, arr = _barrier_rows(128, 5, late)
    fig = F.barrier_plot(bars, arr)
    top, mat = fig.axes[0], fig.axes[1]
    assert len(mat.get_yticks()) <= F.MAX_TICKS                       # 128 rows, thinned labels
    assert "most often last: node019/gpu1@r77 (3 of 5 instances)" in mat.get_title()
    assert fig.legends and "straggler" in fig.legends[0].get_texts()[0].get_text()
    assert any("last: node019/gpu1@r77" in t.get_text() for t in top.texts)
    pts = mat.collections[0].get_offsets()                             # the red circles: (instance, row)
    assert sorted(map(tuple, np.asarray(pts).astype(int).tolist())) == sorted((k, p) for k, p in enumerate(late))
    F.pyplot().close(fig)


def test_report_barrier_figure_written(moe_report):
    _, _, out = moe_report
    assert (out / "figures" / "barriers.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------------ latency
@pytest.mark.parametrize("fixture", ["put_forward", "put", "get", "atomic", "pingpong"])
def test_micro_benchmark_gets_a_latency_figure_that_matches_the_model(tmp_path, fixture):
    """A micro-benchmark (a blocking loop: post, wait, repeat) had no figure at all (put_forward: no recovered
    operation, so no matrix and no bandwidth).  Its latency figure shows the issue interval per QP: the loop's
    iteration time, which the model measures per iteration (truth: latency_ns) — equal to within 0.1 %."""
    import json
    from sigmatrace import analysis as A
    from sigmatrace.query import connect
    out = tmp_path / "r"
    build_report(FIX / f"{fixture}.bin", out, workers=1, perfetto=False, quiet=True)
    assert (out / "figures" / "latency.png").stat().st_size > 0
    truth = json.loads((FIX / f"{fixture}.truth.json").read_text())["latency_ns"]["median"]
    groups = A.op_latency(connect(out))
    iv = [g for g in groups if g["measure"] == "interval"]
    assert len(iv) == 1 and iv[0]["count"] >= 60
    assert iv[0]["p50_ns"] == pytest.approx(truth, rel=1e-3)
    assert (iv[0]["kind"], iv[0]["source"]) == (("doorbell", "doorbell") if fixture == "put_forward" else
                                                (dict(put="RDMA_WRITE", pingpong="RDMA_WRITE", get="RDMA_READ",
                                                      atomic="ATOMIC_FA")[fixture], "doorbell"))
    h = np.array(iv[0]["hist"])
    assert h[:, 2].sum() == iv[0]["count"] and (h[:, 0] <= truth * 1.001).any()


def test_measured_latency_per_kind_where_completions_are_recorded(ar_report):
    """Full-mode verbs: post -> own completion per work request (the NULL latencies left out), per opcode."""
    from sigmatrace import analysis as A
    from sigmatrace.query import connect
    corr, _, out = ar_report
    ops = corr.tables["ops"]
    lat = np.asarray(ops["latency_ns"])
    groups = {(g["kind"], g["source"]): g for g in A.op_latency(connect(out)) if g["measure"] == "completion"}
    for kind in np.unique(ops["opcode_name"][lat >= 0]):
        k = lat[(lat >= 0) & (ops["opcode_name"] == kind)]
        g = groups[(str(kind), "verbs_wr")]
        assert g["count"] == len(k) and g["p50_ns"] == pytest.approx(np.percentile(k, 50))
        assert g["max_ns"] == k.max() and g["min_ns"] >= 0
    assert sum(g["count"] for g in groups.values()) == int((lat >= 0).sum())
    assert (out / "figures" / "latency.png").exists()


def test_latency_figure_panels_and_legend():
    from sigmatrace.analysis import figures as F
    g = lambda kind, m, v: dict(kind=kind, source="doorbell", measure=m, count=3, p50_ns=v, p99_ns=v, max_ns=v,
                                hist=[(v * 0.999, v * 1.001, 3)])
    fig = F.latency_plot([g("RDMA_WRITE", "completion", 5000), g("RDMA_WRITE", "interval", 14663),
                          g("RDMA_READ", "interval", 16314)])
    axes = [a for a in fig.axes if a.get_legend()]
    assert len(axes) == 2 and "completion" in axes[0].get_title() and "interval" in axes[1].get_title()
    texts = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert any("p50 14.66 µs" in t for t in texts) and any("RDMA_READ" in t for t in texts)
    lo, hi = axes[1].get_xlim()
    assert lo < 14.663 and hi > 16.314 and hi - lo < 10          # a window around a narrow distribution
    F.pyplot().close(fig)


# ------------------------------------------------------------------------------------------------ terminal summary
def _text(summary, out="OUT"):
    import io
    from sigmatrace.cli.report import print_summary
    buf = io.StringIO()
    print_summary(summary, out, file=buf)
    return buf.getvalue()


def test_summary_names_the_most_often_last_straggler(moe_report):
    """The straggler is who is last most often (node001/gpu3@r7: 5 of 11 instances), not the last arrival of
    the instance with the worst spread (node000/gpu2@r2, once)."""
    corr, s, _ = moe_report
    B = corr.tables["barriers"]
    labels, counts = np.unique(np.asarray(B["straggler_label"]).astype(str), return_counts=True)
    want = labels[counts == counts.max()].tolist()
    m = s["barriers"]["most_often_last"]
    assert m["labels"] == want == ["node001/gpu3@r7"] and m["times_last"] == counts.max() == 5
    worst = s["barriers"]["worst"][0]["straggler_label"]
    assert worst != want[0]
    text = _text(s)
    assert f"most often last: node001/gpu3@r7 (5 of {len(B['barrier'])})" in text
    assert f"last {worst}" in text                       # the worst instance's last arrival, named as such


def test_summary_gpu_skew_pairs_once_relative_times(moe_report):
    corr, s, _ = moe_report
    text = _text(s)
    assert "skew (GPUs):" in text and "skew (nodes):" in text
    sk = s["skew"]["gpu"]
    assert sk["heaviest_src_label"] in text and sk["heaviest_dst_label"] in text
    # every unordered pair once, with both directions' bytes
    pairs = [(r["process_a"], r["process_b"]) for r in s["top_pairs"]]
    assert len(set(frozenset(p) for p in pairs)) == len(pairs) and all(a < b for a, b in pairs)
    ops = corr.tables["ops"]
    for r in s["top_pairs"]:
        ab = int(ops["bytes"][(ops["process"] == r["process_a"]) & (ops["dst_process"] == r["process_b"])].sum())
        ba = int(ops["bytes"][(ops["process"] == r["process_b"]) & (ops["dst_process"] == r["process_a"])].sum())
        assert (r["a_to_b_bytes"], r["b_to_a_bytes"], r["bytes"]) == (ab, ba, ab + ba)
        assert (r["rank_a"], r["rank_b"]) == tuple(int(corr.tables["processes"]["rank"][q]) for q in pairs[0]) \
            or r is not s["top_pairs"][0]
    top = s["top_pairs"][0]
    assert f"rank {top['rank_a']} ({top['node_a']}) ↔ rank {top['rank_b']} ({top['node_b']})" in text
    import re
    assert not re.search(r"\d{12,}", text)                # no epoch nanoseconds: times since the start
    assert "over 1.886 ms" in text and "at +0." in text


def test_summary_ring_is_not_skew(ar_report):
    """The full-mode AllReduce is a ring (each node sends its data to the next, small acknowledgements back):
    egress/ingress 1.00x; the heaviest pair is 3x the mean over all 12 node pairs (8 idle or tiny) and 2x the
    mean active pair, but 1.00x the other nodes' heaviest pairs — which the summary leads with."""
    _, s, _ = ar_report
    sk = s["skew"]["node"]
    assert sk["egress_imbalance"] == pytest.approx(1.0) and sk["heaviest_pair_vs_top_pairs"] == pytest.approx(1.0)
    assert sk["heaviest_pair_vs_mean"] == pytest.approx(3.0, rel=1e-2) and sk["active_pairs"] == 8
    text = _text(s)
    assert "8 of 12 node pairs active, each node sends to 2 others" in text
    assert "= 1.00× the other nodes' heaviest pairs" in text


def test_skew_metrics_of_an_even_ring():
    """A ring of 5 nodes, equal bytes: every skew ratio that compares like with like is 1; only the mean over
    every pair (idle ones included) gives N-1 = 4."""
    import duckdb
    from test_query_sql import skew_of
    con = duckdb.connect()
    n = 5
    rows = [(s, (s + 1) % n, 1000) for s in range(n)]
    for name, r in skew_of(con, rows, n).items():
        assert r["egress_imbalance"] == r["heaviest_pair_vs_top_pairs"] == r["heaviest_pair_vs_active_mean"] == 1
        assert r["heaviest_pair_vs_mean"] == n - 1 and (r["active_pairs"], r["pairs"]) == (n, n * (n - 1))
        assert r["min_destinations"] == r["max_destinations"] == 1


def test_summary_one_clock_line_for_many_nodes(moe_report):
    import copy
    _, s, _ = moe_report
    s = copy.deepcopy(s)
    base = s["clock"]["nodes"][0]
    s["clock"]["nodes"] = [dict(base, node=k, label=f"node{k:03d}") for k in range(32)]
    s["clock"]["nodes"][5].update(source="tsc_hz", calibration_pairs=0, ptp=False)
    lines = [ln for ln in _text(s).splitlines() if ln.startswith("  clock")]
    assert len(lines) == 2, lines                        # the nodes, the refinement
    assert "31 nodes on CLOCK_REALTIME calibration" in lines[0] and "1 node (node005) on the header's tsc_hz" in lines[0]


def test_summary_names_untraced_peers_and_plurals(tmp_path):
    (tmp_path / "cap").mkdir()
    corr, s, _ = build_report(_hostlib_capture(tmp_path / "cap"), tmp_path / "out", workers=1, quiet=True,
                              figures=False, perfetto=False)
    text = _text(s)
    assert "→ untraced peers (not in the capture or not resolved)" in text and "rank -1" not in text
    assert "(es)" not in text and "(s)" not in text and "1 op" in text
    one = dict(s, processes=1, nodes=["h0"], ranks=[0], events=1, operations=1, operations_matched=1)
    one["doorbells"] = dict(total=1, recovered=1, coalesced=0, wqes=1)
    t1 = _text(one)
    assert "1 process (rank 0) on 1 node, 1 event" in t1 and "1 operation (" in t1 and "1 doorbell (" in t1
    lost = dict(s, losses=dict(s["losses"], dropped_events=1, lost_bytes=1, wqe_lost_wqebbs=2,
                               incomplete_processes=[0]))
    assert "1 dropped event, 1 byte lost from files, 2 WQEBBs unrecovered, 1 incomplete process" in _text(lost)


def test_summary_pairs_processes_without_ranks(moe_report):
    """A program without ranks (fi_pingpong: rank -1 on both sides) is still two processes talking: the pair is
    named by pid, not as 'an untraced process -> untraced peers'."""
    import copy
    _, s, _ = moe_report
    s = copy.deepcopy(s)
    s["top_pairs"] = [dict(process_a=0, process_b=1, rank_a=-1, rank_b=-1, pid_a=18370, pid_b=18371, node_a="vm",
                           node_b="vm", bytes=81920, a_to_b_bytes=40960, b_to_a_bytes=40960, ops=82),
                      dict(process_a=1, process_b=-1, rank_a=-1, rank_b=-1, pid_a=18371, pid_b=None, node_a="vm",
                           node_b=None, bytes=64, a_to_b_bytes=64, b_to_a_bytes=0, ops=1)]
    text = _text(s)
    assert "pid 18370 (vm) ↔ pid 18371 (vm): 81.9 KB (41.0 KB →, 41.0 KB ←) in 82 ops" in text
    assert "pid 18371 (vm) → untraced peers (not in the capture or not resolved): 64 B in 1 op" in text
