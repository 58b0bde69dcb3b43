"""Perfetto export parses back with perfetto's protos and has the tracks, events, counters and flows."""
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.correlate import correlate
from sigmatrace.export import perfetto as PF
from sigmatrace.export import write_perfetto
from sigmatrace.tables import write_tables

from perfetto_util import read_trace

pytestmark = pytest.mark.sim
FIX = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(scope="module")
def corr(tmp_path_factory):
    cap = FIX / "bfs.bin"
    if not cap.exists():
        from sigmatrace_sim.synthetic import write_synthetic
        cap, _ = write_synthetic(tmp_path_factory.mktemp("syn"))
    return correlate(cap, workers=1)


@pytest.fixture(scope="module")
def ar_corr():
    """The model's full-mode AllReduce: host calls, work requests, completions, all three flow kinds."""
    cap = FIX / "allreduce_full.bin"
    if not cap.exists():
        pytest.skip("model fixture allreduce_full.bin not present (fixtures/make_fixtures.py)")
    return correlate(cap, workers=1)


def test_perfetto_structure(corr, tmp_path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    path = tmp_path / "t.pftrace"
    stats = write_perfetto(corr, path)
    tr = read_trace(path)      # interned names resolved
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    names = [t.name for t in tracks.values() if not t.HasField("counter")]
    assert sum(1 for t in tracks.values() if t.HasField("process")) == len(corr.tables["processes"]["process"])
    assert any(t.HasField("thread") for t in tracks.values())
    assert sum(1 for n in names if n.startswith("GPU ")) == len(corr.tables["gpus"]["gpu"])
    assert sum(1 for n in names if n.startswith("QP ")) >= len(corr.tables["qps"]["qp_id"])
    counters = {u for u, t in tracks.items() if t.HasField("counter")}
    assert counters
    evs = [p.track_event for p in tr.packet if p.HasField("track_event")]
    assert all(e.track_uuid in tracks for e in evs)
    db = [e for e in evs if e.name == "doorbell"]
    assert len(db) == len(corr.tables["doorbells"]["doorbell_id"])
    ann = {a.name for a in db[0].debug_annotations}
    assert {"qpn", "producer_index", "wqes"} <= ann
    opev = [e for e in evs if e.type == P.TrackEvent.TYPE_INSTANT and e.flow_ids]
    assert {"opcode", "bytes", "raddr", "rkey", "peer"} <= {a.name for a in opev[0].debug_annotations}
    out_ids = {f for e in evs for f in e.flow_ids}
    in_ids = {f for e in evs for f in e.terminating_flow_ids}
    assert out_ids and out_ids == in_ids and len(out_ids) == int(corr.tables["ops"]["matched"].sum())
    cv = [e for e in evs if e.type == P.TrackEvent.TYPE_COUNTER]
    assert cv and all(e.track_uuid in counters for e in cv) and max(e.double_counter_value for e in cv) > 0
    # each egress counter integrates (GB/s x bin) to its GPU's / node's / QP's bytes
    ts_of = {}
    for p in tr.packet:
        if p.HasField("track_event") and p.track_event.type == P.TrackEvent.TYPE_COUNTER:
            ts_of.setdefault(p.track_event.track_uuid, []).append((p.timestamp, p.track_event.double_counter_value))
    ops = corr.tables["ops"]
    want = {}
    for g, lab in zip(corr.tables["gpus"]["gpu"], corr.tables["gpus"]["label"]):
        want[f"GPU {lab} egress GB/s"] = int(ops["bytes"][ops["gpu"] == g].sum())
    for n, lab in enumerate(corr.tables["nodes"]["label"]):
        want[f"node {lab} egress GB/s"] = int(ops["bytes"][ops["node"] == n].sum())
    Q = corr.tables["qps"]
    qpns, cnt = np.unique(Q["qpn"], return_counts=True)
    unique = set(qpns[cnt == 1].tolist())
    for q, qpn in zip(Q["qp_id"], Q["qpn"]):
        if int(qpn) in unique:      # a QP counter is named by its QPN: check the unambiguous ones
            want[f"QP {int(qpn):#x} GB/s"] = int(ops["bytes"][ops["qp_id"] == q].sum())
    checked = 0
    for u, pts in ts_of.items():
        name = tracks[u].name
        if name not in want:
            continue
        pts.sort()
        integral = sum(v * (pts[k + 1][0] - t) for k, (t, v) in enumerate(pts[:-1]))
        assert pts[-1][1] == 0.0 and abs(integral - want[name]) <= 1e-6 * max(want[name], 1), name
        checked += 1
    assert checked >= len(corr.tables["gpus"]["gpu"]) + len(corr.tables["nodes"]["label"])
    begins = sum(1 for e in evs if e.type == P.TrackEvent.TYPE_SLICE_BEGIN)
    assert begins == sum(1 for e in evs if e.type == P.TrackEvent.TYPE_SLICE_END) and begins > 0
    assert stats["flows"] == len(out_ids)


def test_parquet_tables_roundtrip(corr, tmp_path):
    import pyarrow.parquet as pq
    written = write_tables(corr, tmp_path)
    for name in ("events", "doorbells", "wqes", "qps", "processes", "flows", "completions", "ops", "clock"):
        t = pq.read_table(written[name])
        first = next(iter(corr.tables[name].values()))
        assert t.num_rows == len(first), name
    ops = pq.read_table(written["ops"]).to_pydict()
    assert sum(ops["bytes"]) == int(corr.tables["ops"]["bytes"].sum())


def test_truncated_trace_is_one_time_window(ar_corr, tmp_path):
    """With a budget smaller than the capture, the trace is the run's first events across every process and
    every kind (host calls, operations with their flows), cut at one time — not the first category's or the
    first processes' events."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    corr = ar_corr
    budget = 2000
    stats = write_perfetto(corr, tmp_path / "t.pftrace", max_events=budget)
    assert stats["truncated"] and stats["slices"] > 0 and stats["flows"] > 0
    cut = stats["window_end_ns"]
    ops = corr.tables["ops"]
    drawn_ops = int((ops["ns"] <= cut).sum())
    assert 0 < drawn_ops < len(ops["ns"]) and stats["slices"] + drawn_ops <= budget + 64     # ties at the cut
    assert len(np.unique(ops["process"][ops["ns"] <= cut])) > 1
    tr = read_trace(tmp_path / "t.pftrace")
    starts = [p.timestamp for p in tr.packet if p.HasField("track_event")
              and p.track_event.type in (P.TrackEvent.TYPE_SLICE_BEGIN,)
              or (p.HasField("track_event") and p.track_event.flow_ids)]
    assert starts and max(starts) <= cut
    flows_out = [p.track_event for p in tr.packet if p.HasField("track_event") and p.track_event.flow_ids]
    assert len(flows_out) == int(((ops["ns"] <= cut) & ops["matched"]).sum())


def test_streaming_scan_equals_one_pass(ar_corr, tmp_path, monkeypatch):
    """The ops are scanned in ranges (counters, window candidates) and, with many QPs, the top QPs' series in a
    second pass: tiny ranges and the second pass give the same trace as one range."""
    from sigmatrace.export import perfetto as PF
    from sigmatrace.export import window as W
    corr = ar_corr
    a = PF.write_perfetto(corr, tmp_path / "a.pftrace", max_events=1500)
    monkeypatch.setattr(W, "SCAN_ROWS", 7)
    monkeypatch.setattr(W, "QP_SERIES_MAX", 0)
    b = PF.write_perfetto(corr, tmp_path / "b.pftrace", max_events=1500)
    assert a == b and a["truncated"] and a["counters"] > 0
    assert (tmp_path / "a.pftrace").read_bytes() == (tmp_path / "b.pftrace").read_bytes()


def test_host_events_tied_at_the_cut_are_kept():
    """The host-event collector keeps the budget earliest events and every event tied with the last one, so the
    time window drawn from them includes ties at its end like it does for operations."""
    from sigmatrace.tables.host_events import HostCollector
    hc = HostCollector(2)
    n = 5
    host_type = 0x0100          # a host-layer event type (layer 0x01)
    hc.add(dict(tsc=np.zeros(n, np.uint64), type=np.full(n, host_type), process=np.zeros(n), thread=np.arange(n),
                ns=np.array([3, 1, 1, 1, 0]), aux=np.zeros(n), obj=np.zeros(n), arg=np.zeros(n, np.uint64)))
    hc._compact()
    cols, total = hc.result()
    assert total == n and sorted(cols["ns"].tolist()) == [0, 1, 1, 1]      # 2 earliest + the ties at ns 1


def test_chunked_emission_independent_of_workers(ar_corr, tmp_path, monkeypatch):
    """Drawn events are emitted in chunks (own packet sequence each) by forked workers: the file is the same
    for 1 and 3 workers, and the events are those of one sequence."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    from sigmatrace.export import perfetto as PF
    corr = ar_corr
    ref = PF.write_perfetto(corr, tmp_path / "ref.pftrace", max_events=1500)
    monkeypatch.setattr(PF, "_CHUNK", 97)
    one = PF.write_perfetto(corr, tmp_path / "one.pftrace", max_events=1500)
    monkeypatch.setattr(corr, "workers", 3)
    three = PF.write_perfetto(corr, tmp_path / "three.pftrace", max_events=1500)
    assert ref == one == three
    assert (tmp_path / "one.pftrace").read_bytes() == (tmp_path / "three.pftrace").read_bytes()

    def events(path):
        tr = read_trace(path)
        seqs = {p.trusted_packet_sequence_id for p in tr.packet}
        evs = sorted((p.timestamp, p.track_event.track_uuid, p.track_event.type, p.track_event.name,
                      tuple(p.track_event.flow_ids), tuple(p.track_event.terminating_flow_ids),
                      tuple((a.name, a.int_value, a.string_value) for a in p.track_event.debug_annotations))
                     for p in tr.packet if p.HasField("track_event"))
        return evs, seqs
    ev_ref, seq_ref = events(tmp_path / "ref.pftrace")
    ev_one, seq_one = events(tmp_path / "one.pftrace")
    assert ev_ref == ev_one and len(seq_one) > len(seq_ref) > 1


def _drawn_bytes(path):
    """Bytes of the bundles / packets of the drawn events' sequences (all but the tracks-and-counters one)."""
    import zlib
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P
    from sigmatrace.export import perfetto as PF
    outer = P.Trace()
    outer.ParseFromString(Path(path).read_bytes())
    n = 0
    for p in outer.packet:
        inner = [p]
        if p.HasField("compressed_packets"):
            t = P.Trace()
            t.ParseFromString(zlib.decompress(p.compressed_packets))
            inner = list(t.packet)
        if any(q.trusted_packet_sequence_id != PF._SEQ for q in inner):
            n += len(p.SerializeToString()) + 4        # the record's tag and length: at most 4 bytes
    return n


@pytest.mark.parametrize("fixture", ["allreduce_full.bin", "moe.bin"])
def test_trace_size_per_event(tmp_path, monkeypatch, fixture):
    """Interned names and deflate bundles: at most 40 B per drawn event (a slice, begin and end, is one event;
    was ~100-120 B), the same events and annotations as the plain interned trace, which alone is at most 80 B
    per drawn event; every bundle below 512 KiB (read_trace checks)."""
    cap = FIX / fixture
    if not cap.exists():
        pytest.skip(f"model fixture {fixture} not present")
    corr = correlate(cap, workers=1)
    st = write_perfetto(corr, tmp_path / "z.pftrace")
    monkeypatch.setenv("SIGMATRACE_PERFETTO_COMPRESS", "0")
    assert write_perfetto(corr, tmp_path / "plain.pftrace") == st
    drawn = st["slices"] + st["instants"]
    assert _drawn_bytes(tmp_path / "z.pftrace") / drawn <= 40
    assert _drawn_bytes(tmp_path / "plain.pftrace") / drawn <= 80

    def content(path):
        cats = {}
        tr = read_trace(path, categories=cats)
        return [(p.trusted_packet_sequence_id, p.timestamp, p.track_event.type, p.track_event.name,
                 tuple(cats.get(i, ())),
                 tuple((a.name, a.int_value, a.string_value, a.bool_value) for a in p.track_event.debug_annotations))
                for i, p in enumerate(tr.packet) if p.HasField("track_event")]
    z, plain = content(tmp_path / "z.pftrace"), content(tmp_path / "plain.pftrace")
    assert z == plain and len(z) == drawn + st["slices"] + st["counters"] + 1 - (0 if st["truncated"] else 1)
    assert {c for e in z for c in e[4]} == {"host", "op"} | ({"doorbell"} if len(corr.tables["doorbells"]["ns"]) else set())


def test_a_chunk_alone_gives_its_bytes(ar_corr, corr, tmp_path):
    """``chunk_state`` (what a cluster chunk task is given): each chunk of host slices, doorbells and operations
    emitted from its own slice of the state is byte for byte the chunk emitted from the whole state."""
    seen = set()

    def check(state, jobs):
        for k, job in enumerate(jobs):
            whole = PF.emit_chunk(state, k, job)
            sub, sub_job = PF.chunk_state(state, job)
            assert PF.emit_chunk(sub, k, sub_job) == whole, (k, job)
            seen.add(job[0])
            yield whole

    for c in (ar_corr, corr):
        a = PF.write_perfetto(c, tmp_path / "a.pftrace", max_events=6000, chunk=1000, emit_map=check)
        b = PF.write_perfetto(c, tmp_path / "b.pftrace", max_events=6000, chunk=1000)
        assert a == b and (tmp_path / "a.pftrace").read_bytes() == (tmp_path / "b.pftrace").read_bytes()
    assert seen == {"host", "doorbells", "ops"}, seen
