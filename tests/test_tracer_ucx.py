"""The native tracer inside unmodified ucx_perftest (ucx-utils), F10/F3.

Server and client both traced, over UCX_TLS=tcp and a shared-memory
transport (posix + self), for a tag test and an RMA test; warm-up disabled
(-w 0) so the counts are exactly -n iterations of -s bytes.
"""
import os

import numpy as np
import pytest

from native_util import traced_tool, serve_and_connect
from sigmatrace.format import events as E
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

LIB, PERFTEST, needs = traced_tool("ucx_perftest", "ucx-utils")
ITERS, SIZE = 200, 256


def perftest(tmp_path, tls, test, mode="simple", providers=None, iters=ITERS, size=SIZE, traced=True):
    out = tmp_path / f"ucx-{tls}-{test}-{mode}-{providers}-{traced}".replace(",", "_")
    env = dict(os.environ, UCX_TLS=tls, UCX_WARN_UNUSED_ENV_VARS="n")
    if traced:
        env.update(LD_PRELOAD=str(LIB), SIGMATRACE_OUTPUT_DIR=str(out), SIGMATRACE_MODE=mode)
        if providers is not None:
            env["SIGMATRACE_PROVIDERS"] = providers
    srv, cli = serve_and_connect(lambda port: [PERFTEST, "-p", str(port)],
                                 lambda port: [PERFTEST, "-p", str(port), "-t", test, "-n", str(iters), "-s", str(size),
                                               "-w", "0", "127.0.0.1"], env, settle=0.4)
    return out, srv, cli


def op_bytes(cap, name, i):
    t = cap.table(name)
    return t["bytes"][t["process"] == i]


def client_server(cap):
    """(client, server) ProcessInfo: the client has the host argument."""
    a, b = cap.processes
    return (a, b) if "127.0.0.1" in a.header["argv"] else (b, a)


@needs
@pytest.mark.parametrize("tls", ["tcp", "posix,self"])
def test_tag_latency(tmp_path, tls):
    out, (rc_s, _), (rc_c, cout) = perftest(tmp_path, tls, "tag_lat")
    assert rc_s == rc_c == 0, cout
    assert "Final:" in cout
    cap = read_capture(out)
    assert cap.losses == [] and len(cap.processes) == 2
    for p in cap.processes:
        assert p.complete and p.end["dropped_events"] == 0 and "ucx" in p.header["providers"]
        s = op_bytes(cap, "UCP_TAG_SEND", p.index)
        r = op_bytes(cap, "UCP_TAG_RECV", p.index)
        assert len(s) == ITERS and np.all(s == SIZE)
        assert len(r) == ITERS and np.all(r == SIZE)
        names = {E.name_of(t) for t in np.unique(cap.events["type"][cap.event_process == p.index])}
        assert {"UCP_WORKER_CREATE", "UCP_EP_CREATE"} <= names
        assert "UCP_WORKER_PROGRESS" not in names  # simple mode omits progress calls
    # peer identity: each side's endpoint names the other's worker address
    cli, srv = client_server(cap)

    def side_json(p, name):
        t = cap.table(name)
        return p.side[int(t["side_id"][t["process"] == p.index][0])].json()

    assert side_json(cli, "UCP_EP_CREATE")["remote_address_prefix"] == side_json(srv, "UCP_WORKER_CREATE")["address_prefix"]
    assert side_json(srv, "UCP_EP_CREATE")["remote_address_prefix"] == side_json(cli, "UCP_WORKER_CREATE")["address_prefix"]


@needs
@pytest.mark.parametrize("tls", ["tcp", "posix,self"])
def test_put_latency(tmp_path, tls):
    out, (rc_s, _), (rc_c, cout) = perftest(tmp_path, tls, "ucp_put_lat")
    assert rc_s == rc_c == 0, cout
    cap = read_capture(out)
    for p in cap.processes:  # ping-pong of puts: both sides write ITERS times
        b = op_bytes(cap, "UCP_PUT", p.index)
        assert len(b) == ITERS and np.all(b == SIZE)
        raddr = cap.table("UCP_PUT")["raddr"][cap.table("UCP_PUT")["process"] == p.index]
        assert np.all(raddr != 0)


@needs
def test_put_bandwidth_aggregate(tmp_path):
    out, (rc_s, _), (rc_c, cout) = perftest(tmp_path, "tcp", "ucp_put_bw", mode="aggregate")
    assert rc_s == rc_c == 0, cout
    cap = read_capture(out)
    cli, srv = client_server(cap)
    agg = cli.aggregates
    put = agg[agg["type"] == E.value("UCP_PUT")]
    # ITERS puts of SIZE bytes (perftest may add one closing put of the same size)
    assert int(put["count"].sum()) in (ITERS, ITERS + 1)
    assert int(put["bytes"].sum()) == int(put["count"].sum()) * SIZE
    assert len(srv.aggregates[srv.aggregates["type"] == E.value("UCP_PUT")]) == 0  # one-sided
    assert cap.count_by_type().get("UCP_PUT", 0) == 0  # counters only, no events


@needs
def test_full_mode_progress_and_completions(tmp_path):
    out, (rc_s, _), (rc_c, cout) = perftest(tmp_path, "tcp", "tag_bw", mode="full", iters=50)
    assert rc_s == rc_c == 0, cout
    cap = read_capture(out)
    cli, srv = client_server(cap)
    by = cap.count_by_type()
    assert by["UCP_WORKER_PROGRESS"] > 0
    assert len(op_bytes(cap, "UCP_TAG_SEND", cli.index)) == 50
    assert len(op_bytes(cap, "UCP_TAG_RECV", srv.index)) == 50
    # every send either completed in place or was reported done later
    done = cap.table("UCP_REQUEST_DONE")
    assert np.count_nonzero(done["process"] == cli.index) >= 1
    # the timeline draws each run of idle progress calls as one slice: every call in one slice, far fewer slices
    # than calls, so a progress loop does not fill the window before the sends (all 50 drawn)
    from perfetto_util import read_trace
    from sigmatrace.correlate import correlate
    from sigmatrace.export.perfetto import write_perfetto
    prog = cap.table("UCP_WORKER_PROGRESS")
    # the recorder writes a run of empty calls as its first and last, the last counting the calls between
    is_idle = prog["returned"] == 0
    idle = int(np.maximum(prog["polls"][is_idle].astype(np.int64), 1).sum())
    busy = len(prog["returned"]) - int(np.count_nonzero(is_idle))
    assert idle > 10 * int(np.count_nonzero(is_idle)), (idle, busy)
    corr = correlate(out, workers=1)
    n_ev = int(np.count_nonzero((np.asarray(corr.tables["events"]["type"]) >> 8) != E.LAYER_TRACE))
    # the window: a quarter of the events, but never less than what the run needs drawn besides the idle
    # calls (~800: 100 sends/receives, 401 counters, ~200 slices); on a loaded machine the loop polls less
    # (seen: under 2,600 events in all, so a quarter of them did not hold the rest)
    st = write_perfetto(corr, tmp_path / "t.pftrace", max_events=max(1000, n_ev // 4))
    assert not st["truncated"], st
    calls, slices, sends = 0, 0, 0
    for p in read_trace(tmp_path / "t.pftrace").packet:
        te = p.track_event
        if p.HasField("track_event") and te.type == te.TYPE_SLICE_BEGIN and te.name.startswith("UCP_WORKER_PROGRESS"):
            ann = {a.name: a.int_value for a in te.debug_annotations}
            if ann["aux"] == 0:
                calls += ann.get("calls", 1)
                slices += 1
                assert te.name.endswith(" (idle)") == ("calls" in ann)
        sends += p.HasField("track_event") and te.type == te.TYPE_SLICE_BEGIN and te.name == "UCP_TAG_SEND"
    assert calls == idle > 10 * slices, (calls, idle, slices, busy)
    assert sends == 50


@needs
def test_ucx_disabled_provider(tmp_path):
    out, (rc_s, _), (rc_c, _) = perftest(tmp_path, "tcp", "tag_lat", providers="ofi")
    assert rc_s == rc_c == 0
    # no UCX record; the file exists only to say that libucp was loaded untraced (issue 17)
    cap = read_capture(out)
    assert len(cap.processes) == 2 and not np.any((cap.events["type"] >> 8) == E.LAYER_UCX)
    for p in cap.processes:
        assert ("libucp.so.0", "ucx", "disabled") in {(x["library"], x["provider"], x["reason"])
                                                      for x in p.untraced_libraries}
