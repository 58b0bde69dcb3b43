"""Helpers of the traced-verbs tests (tests/test_trace_verbs_*.py); no tests here.

Programs run on the emulated HCA (native/emu, selected with LD_LIBRARY_PATH)
with the tracer preloaded through `sigmatrace run`'s own environment builder,
each test on its own emulated fabric and TCP port.  The emulated-HCA basics
(needs_emu, the `fabric` fixture, ports, process cleanup) are in
tests/native_util.py and tests/conftest.py.
"""
import argparse
import glob
import subprocess

import numpy as np
import pytest

from native_util import emu_env, free_port, popen, reaped, wait_listen
from sigmatrace import _native
from sigmatrace.format import read_capture

TRACER = _native.tracer_library()
IBGDA_CLIENT = _native.find("emu_ibgda_client")
RC_PINGPONG = "/usr/bin/ibv_rc_pingpong"


def _tracer_build_info():
    """build_info.json next to the tracer that will be preloaded (not the first one found)."""
    import json
    try:
        return json.loads((TRACER.parent / "build_info.json").read_text()) if TRACER else {}
    except (OSError, ValueError):
        return {}


_info = _tracer_build_info()
needs_tracer = pytest.mark.skipif(
    TRACER is None or "ibv" not in (_info.get("providers") or []),
    reason="libsigmatrace.so with the ibv provider not built (cmake --build build/dev)",
)
needs_mlx5_provider = pytest.mark.skipif(
    "mlx5" not in (_info.get("providers") or []), reason="tracer built without the mlx5 provider (an older build: rebuild)")


def env_for(fabric, lid, out=None, mode="full", **extra):
    """Environment of one emulated node; traced when `out` is a directory."""
    env = emu_env(fabric, lid)
    if out is not None:
        try:
            from sigmatrace.cli.run import build_env
            args = argparse.Namespace(output=str(out), mode=mode, providers=None, buffer_kb=None, eager=False)
            env = build_env(args, env)
        except ImportError:  # before `sigmatrace run` existed: the same variables by hand
            env["LD_PRELOAD"] = str(TRACER)
            env["SIGMATRACE_OUTPUT_DIR"] = str(out)
            env["SIGMATRACE_MODE"] = mode
        # exact counts below: a full buffer waits for the writer instead of dropping
        env["SIGMATRACE_DROP_POLICY"] = "block"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_pair(argv, fabric, out=None, mode="full", timeout=25.0, lids=(0x11, 0x12)):
    """Server and client of a socket-bootstrapped rdma-core program (pingpong,
    perftest) on two emulated nodes.  Returns (server stdout, client stdout)."""
    port = str(free_port())
    argv = list(argv) + ["-p", port]
    srv = popen(argv, env_for(fabric, lids[0], out, mode))
    with reaped(srv):
        wait_listen(int(port), srv)
        cli = subprocess.run(argv + ["localhost"], env=env_for(fabric, lids[1], out, mode), capture_output=True,
                             text=True, timeout=timeout)
        so, se = srv.communicate(timeout=timeout)
    assert cli.returncode == 0, f"client rc={cli.returncode}\n{cli.stdout}\n{cli.stderr}"
    assert srv.returncode == 0, f"server rc={srv.returncode}\n{so}\n{se}"
    return so, cli.stdout


def capture(out):
    cap = read_capture(out)
    assert cap.dropped_events() == 0 and cap.lost_bytes == 0, cap.summary()
    assert not cap.summary()["incomplete_processes"], cap.summary()
    return cap


def per_process(table, proc, cond=None):
    sel = table["process"] == proc
    if cond is not None:
        sel &= cond
    return int(np.count_nonzero(sel))


def pingpong_recvs_posted(iters, rx_depth):
    """Receives ibv_rc_pingpong posts: rx_depth up front, then whenever only
    one is left outstanding after a receive completion, a refill back to
    rx_depth (libibverbs/examples/rc_pingpong.c, parse_single_wc)."""
    routs = posted = rx_depth
    for _ in range(iters):
        routs -= 1
        if routs <= 1:
            posted += rx_depth - routs
            routs = rx_depth
    return posted


OBJCHURN = _native.find("emu_objchurn")


def _churn(tmp_path, fabric, *args, **env):
    out = tmp_path / "trace"
    r = subprocess.run([str(OBJCHURN), *args], env=env_for(fabric, 0x31, out, **env), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and "CHURN" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    cap = read_capture(sorted(glob.glob(str(out / "*.trace"))))
    (p,) = cap.processes
    return cap, p, out


def _cq_attribution_errors(cap):
    """IBV_POLL_CQ / IBV_DESTROY_CQ records (any thread) whose CQ id is not that of the last IBV_CREATE_CQ: the
    client makes, polls (on another thread) and destroys one CQ at a time."""
    ev = []
    for name, kind in (("IBV_CREATE_CQ", 0), ("IBV_POLL_CQ", 1), ("IBV_DESTROY_CQ", 2)):
        t = cap.table(name)
        ev += [(int(a), kind, int(b)) for a, b in zip(t["tsc"], t["cq"])]
    cur, bad = None, 0
    for _, kind, cq in sorted(ev):
        if kind == 0:
            cur = cq
        elif cq != cur:
            bad += 1
    return bad


@needs_tracer
@pytest.mark.skipif(OBJCHURN is None, reason="emu_objchurn not built (cmake --build build/dev)")
def test_object_ids_stay_consistent_over_10k_objects(tmp_path, fabric):
    """Issue 12 finding 4: 7,000 PDs kept alive, then 10,500 times a CQ, a QP on one of the PDs, an MR, one
    write polled to completion by a second thread, all destroyed.  The object-id table frees a destroyed
    object's entry, reuses slots, and never hands out a dead object's id from a thread's cache when the
    address comes back: every CQ's polls and destroy carry the CQ's own id, every QP's creation names its own
    PD and CQ, every MR its PD; no object is left unmapped and lookups never had to take the table's lock."""
    n, npd = 10500, 7000
    cap, p, out = _churn(tmp_path, fabric, "--iters", str(n), "--pds", str(npd))
    pds = cap.table("IBV_ALLOC_PD")["pd"].tolist()
    assert len(pds) == npd and len(set(pds)) == npd and 0 not in pds
    cqs = cap.table("IBV_CREATE_CQ")["cq"].tolist()
    assert len(cqs) == n
    assert _cq_attribution_errors(cap) == 0
    qp = cap.table("IBV_CREATE_QP")
    js = [cap.side_record(0, int(s)).json() for s in qp["side_id"]]
    assert [j["pd"] for j in js] == [pds[i % npd] for i in range(n)]
    assert [j["send_cq"] for j in js] == cqs
    assert cap.table("IBV_REG_MR")["pd"].tolist() == [pds[i % npd] for i in range(n)]
    # each QP's operations are its own: one write posted, one completion, on its QPN
    wc, post = cap.table("IBV_WC"), cap.table("IBV_POST_SEND")
    assert post["qpn"].tolist() == qp["qpn"].tolist() and wc["qpn"].tolist() == qp["qpn"].tolist()
    ids = p.end["object_ids"]
    assert ids["unmapped"] == 0 and ids["live"] == 0 and ids["peak"] >= npd, ids
    assert ids["first_seen_on_use"] == 0, ids  # no lookup took the lock to insert
    # the correlator's tables: one op per iteration, each on a QP of its own number, nothing lost
    from sigmatrace.correlate import correlate
    c = correlate(str(out))
    ops, qps = c.tables["ops"], c.tables["qps"]
    assert sorted(ops["wr_id"].tolist()) == list(range(n))
    assert (qps["qpn"][ops["qp_id"]] == ops["qpn"]).all()
    assert len(c.tables["losses"]["kind"]) == 0


@needs_tracer
@pytest.mark.skipif(OBJCHURN is None, reason="emu_objchurn not built (cmake --build build/dev)")
def test_object_id_overflow_is_reported(tmp_path, fabric):
    """More live objects than the id table holds (test hook SIGMATRACE_TEST_OBJ_LIMIT=500): the objects it cannot
    take get id 0 in every record of theirs (never a second, different id), and END counts them."""
    cap, p, _ = _churn(tmp_path, fabric, "--iters", "200", "--pds", "800", SIGMATRACE_TEST_OBJ_LIMIT="500")
    pds = cap.table("IBV_ALLOC_PD")["pd"].tolist()
    assert len(set(pds[:499])) == 499 and 0 not in pds[:499] and set(pds[500:]) == {0}
    assert _cq_attribution_errors(cap) == 0
    assert cap.table("IBV_CREATE_CQ")["cq"].tolist() == [0] * 200  # the table is full of PDs
    ids = p.end["object_ids"]
    assert ids["capacity"] == 500 and ids["unmapped"] >= 800 - 499, ids


@needs_tracer
@pytest.mark.skipif(OBJCHURN is None, reason="emu_objchurn not built (cmake --build build/dev)")
def test_closed_contexts_free_their_entries(tmp_path, fabric):
    """Issue 12 finding 10: the ibv provider keeps a copy of each context's ops in a table of 64 entries, and a
    closed context's entry was never given to another context: after 64 contexts at distinct addresses (a
    program that opens and closes devices for long) every new one went untraced.  Closed entries are reused:
    300 contexts in rounds of 60, each with one write, all traced."""
    n = 300
    out = tmp_path / "trace"
    r = subprocess.run([str(OBJCHURN), "--reopen", str(n)], env=env_for(fabric, 0x32, out), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and f"REOPEN n={n} ok={n}" in r.stdout, r.stdout + r.stderr
    distinct = int(r.stdout.split("distinct=")[1].split()[0])
    assert distinct > 64  # the client made the contexts land at new addresses
    assert "not traced" not in r.stderr, r.stderr
    by = read_capture(out).count_by_type()
    assert by["IBV_OPEN_DEVICE"] == n + 1 and by["IBV_CLOSE_DEVICE"] == n + 1 and by["IBV_POST_SEND"] == n, by


FORKLOCK = _native.find("emu_forklock")


@needs_tracer
@pytest.mark.skipif(FORKLOCK is None, reason="emu_forklock not built (cmake --build build/dev)")
def test_fork_while_threads_hold_the_providers_locks(tmp_path, fabric):
    """Issue 12 review (d): the fork handlers held the writer's locks across fork but not the ibv provider's,
    the mlx5 provider's or the object-id table's: a child forked while another thread held one inherited it
    locked and hung at its first use (seen: the child's ibv_dealloc_pd waiting for st_objmap_lock for ever).
    Then (issue 12, the resolver): the tracer's dlclose and its lazy resolution of shims walk the loaded
    objects with dl_iterate_phdr, whose loader lock glibc's fork does not reset; a child forked during a walk
    hung at its own first walk (seen: the child's dlclose in dl_iterate_phdr, on _rtld_global's
    dl_load_write_lock).  300 forks while three threads allocate PDs, one opens devices and one drops libc
    references with dlclose; every child deallocates a PD, calls dlclose and exits.  Untraced first: the
    program itself (and the emulated HCA, which takes no lock in ibv_dealloc_pd, as rdma-core's mlx5 takes
    none) survives every fork, so a hang traced is the tracer's."""
    r = subprocess.run([str(FORKLOCK), "--forks", "300"], env=env_for(fabric, 0x33), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "FORKLOCK forks=300 ok=300" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    out = tmp_path / "trace"
    r = subprocess.run([str(FORKLOCK), "--forks", "300"], env=env_for(fabric, 0x33, out), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "FORKLOCK forks=300 ok=300" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
