"""Open MPI 4.1 (Debian) with pml ucx over the emulated HCA, traced under mpirun.

    mpirun -np 2 sigmatrace run -o DIR --mode full -- native/tests/mpi/rank.sh \\
        python -m mpi4py.bench pingpong -m 1 -n 4096 -s 5 -l 20

Each rank is its own emulated node (native/tests/mpi/rank.sh: LID 1 + OMPI_COMM_WORLD_RANK, run inside
st-emu-ns so that UCX opens /dev/infiniband/uverbs0), UCX restricted to the IB transports
(rc_mlx5,ud_mlx5 or rc_verbs,ud_verbs, plus self).  The third-party benchmark is mpi4py's pingpong
(mpi4py >= 4, the `mpi` extra).  Checked: exit 0, the same rows as untraced, ranks 0/1 from Open MPI's
variables, every UCX operation matched to the peer rank, and per rank and size the MPI message bytes:
UCX layer = the MPI size exactly, verbs layer (rc_verbs: ibv_post_send work requests) = the MPI size + UCX's
eager header, for rc_mlx5 read from the WQEs (doorbell layer), and those totals = the emulated NIC's
executed WQEs/bytes (SIGMATRACE_EMU_STATS).  UD work requests (UCX's wire-up over ud_verbs/ud_mlx5) are the only
unmatched ones: their destination is per work request (address handle + remote QPN), which the
tracer does not record (see docs/mpi.md).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from native_util import EMU_DIR, EMU_NS, emu_ns_problem, needs_emu, new_fabric, cleanup_fabric
from sigmatrace import _native
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
RANK_SH = ROOT / "native" / "tests" / "mpi" / "rank.sh"
MPIRUN = shutil.which("mpirun")
OMPI_INFO = shutil.which("ompi_info")


def _mpi_problem():
    if not MPIRUN or not OMPI_INFO:
        return "Open MPI not installed (mpirun/ompi_info: Debian openmpi-bin; .ci/install installs it)"
    out = subprocess.run([OMPI_INFO, "--parsable", "--version"], capture_output=True, text=True, timeout=30)
    if "ompi:version:full" not in out.stdout and "Open MPI" not in out.stdout + out.stderr:
        return f"mpirun is not Open MPI: {out.stdout.strip()[:200]}"
    comps = subprocess.run([OMPI_INFO], capture_output=True, text=True, timeout=30).stdout
    if "MCA pml: ucx" not in comps:
        return "this Open MPI has no pml ucx"
    r = subprocess.run([sys.executable, "-c", "import mpi4py, sys; sys.exit(int(mpi4py.__version__.split('.')[0]) < 4)"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return (f"mpi4py >= 4 not importable in {sys.executable} (pip install '.[mpi]', built with mpicc): "
                f"{r.stderr.strip()[-200:]}")
    if emu_ns_problem() is not None:
        return emu_ns_problem()
    return None


MPI_PROBLEM = _mpi_problem() if EMU_DIR else "emulated HCA not built"
needs_mpi = pytest.mark.skipif(MPI_PROBLEM is not None, reason=str(MPI_PROBLEM))

TLS = {"mlx5": "rc_mlx5,ud_mlx5,self", "verbs": "rc_verbs,ud_verbs,self"}
SKIP, LOOP = 5, 20
MIN, MAX = 1, 4096
SIZES = [1 << k for k in range(13) if MIN <= (1 << k) <= MAX]
# UCX 1.13's eager tagged send on the wire: the UCP header (ucp_eager_hdr_t: the 8-byte tag) behind the
# transport's AM header (rc_verbs: uct_rc_hdr_t, 1 byte AM id; rc_mlx5: uct_rc_mlx5_hdr_t, 1 byte
# tag-matching opcode + the 1-byte AM id)
HEADER = {"verbs": 9, "mlx5": 10}


# pml cm + mtl ofi over libfabric's verbs provider (RDM endpoints through ofi_rxm over verbs MSG endpoints,
# connected through the emulated rdma_cm); the BTLs only for Open MPI's own out-of-band needs
OFI_PROV = "verbs;ofi_rxm"
OFI_MCA = ("--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", OFI_PROV,
           "--mca", "btl", "self,tcp", "--mca", "osc", "^ucx")
RXM_HEADER = 64            # libfabric 1.17's ofi_rxm header in front of every eager message (docs/mpi.md)


def mpirun_argv(np_, fabric, tls, stats, extra_env=None, mca=(), pml="ucx"):
    env = {"LD_LIBRARY_PATH": str(EMU_DIR), "SIGMATRACE_EMU_FABRIC": fabric, "ST_EMU_NS": str(EMU_NS),
           "UCX_TLS": tls, "UCX_NET_DEVICES": "mlx5_0:1", "UCX_WARN_UNUSED_ENV_VARS": "n",
           "SIGMATRACE_EMU_STATS": f"{stats}/emu-stats.%p.json", "PYTHONPATH": str(ROOT)}
    if pml == "ofi":
        env["FI_PROVIDER"] = OFI_PROV
    env.update(extra_env or {})
    base = OFI_MCA if pml == "ofi" else ("--mca", "pml", "ucx", "--mca", "btl", "^openib", "--mca", "osc", "^ucx")
    argv = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(np_), *base, *mca]
    for k, v in env.items():
        argv += ["-x", f"{k}={v}"]
    return argv


def base_env():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("OMPI_COMM_WORLD")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_plm_rsh_agent="false")
    return env


def run_mpi(tmp, tls, trace=None, mode="full", prog=None, timeout=240, pml="ucx"):
    stats = tmp / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    fabric = new_fabric("mpi")
    prog = prog or [sys.executable, "-m", "mpi4py.bench", "pingpong", "-m", str(MIN), "-n", str(MAX),
                    "-s", str(SKIP), "-l", str(LOOP)]
    tracer = [] if trace is None else [sys.executable, "-m", "sigmatrace", "run", "-o", str(trace), "--mode", mode,
                                       "--"]
    argv = mpirun_argv(2, fabric, tls, stats, pml=pml) + tracer + [str(RANK_SH), *prog]
    try:
        r = subprocess.run(argv, env=base_env(), capture_output=True, text=True, timeout=timeout, cwd=tmp)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpirun timed out after {timeout} s\n{e.stdout}\n{e.stderr}")
    finally:
        cleanup_fabric(fabric)
    nic = {}
    for p in stats.glob("emu-stats.*.json"):
        d = json.loads(p.read_text())
        nic[d["pid"]] = d
    return r, nic


def rows(text):
    """pingpong's table rows: size -> samples (its header lines start with #)."""
    out = {}
    for ln in text.splitlines():
        m = re.match(r"\s*(\d+)\s+[\d.]+\s+\|\s+[\d.e+-]+\s+±\s+[\d.e+-]+\s+(\d+)\s*$", ln)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if MPI_PROBLEM:
        pytest.skip(MPI_PROBLEM)
    res = {}
    for name, tls in TLS.items():
        tmp = tmp_path_factory.mktemp(f"mpi-{name}")
        plain, _ = run_mpi(tmp / "plain", tls)
        trace = tmp / "trace"
        traced, nic = run_mpi(tmp / "traced", tls, trace=trace)
        res[name] = (plain, traced, trace, nic)
    return res


@needs_emu
@needs_mpi
@pytest.mark.parametrize("tls", list(TLS))
def test_pingpong_output_sound(runs, tls):
    plain, traced, _, _ = runs[tls]
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert traced.returncode == 0, traced.stdout + traced.stderr
    want = {s: LOOP for s in SIZES}
    assert rows(plain.stdout) == want, plain.stdout
    assert rows(traced.stdout) == want, traced.stdout
    for text in (plain.stderr, traced.stderr):
        bad = [ln for ln in text.splitlines() if "sigmatrace" in ln.lower() or " ERROR " in ln]
        assert not bad, bad


def correlate_run(trace):
    from sigmatrace.correlate import correlate
    return correlate(trace, workers=1)


@needs_emu
@needs_mpi
@pytest.mark.parametrize("tls", list(TLS))
def test_ranks_from_open_mpi_and_matching(runs, tls):
    _, traced, trace, nic = runs[tls]
    assert traced.returncode == 0, traced.stderr
    names = sorted(p.name for p in trace.iterdir())
    assert len(names) == 2 and any(".r0." in n for n in names) and any(".r1." in n for n in names), names
    corr = correlate_run(trace)
    P = corr.tables["processes"]
    assert sorted(P["rank"].tolist()) == [0, 1]
    from sigmatrace.format import read_capture
    hdrs = [p.header for p in read_capture(trace).processes]
    assert all(h["launcher"] == "mpirun" and h["world_size"] == 2 and h["local_rank"] in (0, 1) for h in hdrs), hdrs
    u = corr.stats["unmatched"]
    # the UCX layer: every tagged send matched to the peer rank
    assert u["ucx"]["operations"] > 0 and u["ucx"]["unmatched"] == 0, u
    ops = corr.tables["ops"]
    lib = "verbs_wr" if tls == "verbs" else "doorbell"
    qps = corr.tables["qps"]
    ud = set(qps["qp_id"][qps["qp_type"] == 4].tolist())     # IBV_QPT_UD
    on_ud = [int(q) in ud for q in ops["qp_id"]]
    mine = [s == lib for s in ops["source_name"]]
    rc_unmatched = sum(1 for m, d, ok in zip(mine, on_ud, ops["matched"]) if m and not d and not ok)
    ud_ops = sum(1 for m, d in zip(mine, on_ud) if m and d)
    assert rc_unmatched == 0, u
    # UCX's wire-up datagrams are matched too, to their destination QP: ud_verbs' work requests by their
    # address handle (IBV_CREATE_AH) and remote QPN, ud_mlx5's own WQEs by their address vector (port + QPN)
    assert ud_ops > 0 and u[lib]["unmatched"] == 0, (u, ud_ops)
    ud_matched = [ok for m, d, ok in zip(mine, on_ud, ops["matched"]) if m and d]
    assert all(ud_matched) and len(ud_matched) == ud_ops
    # the emulated NIC's ground truth: per process, the datagrams it sent and those it received (UCX also
    # sends some to its own UD QP, through an address of its own LID) equal the traced ones
    ud_of = [m and d for m, d in zip(mine, on_ud)]
    for i, pid in enumerate(P["pid"].tolist()):
        truth = nic[int(pid)]
        sent = sum(1 for k, p in enumerate(ops["process"]) if ud_of[k] and p == i)
        got = sum(1 for k, p in enumerate(ops["dst_process"]) if ud_of[k] and p == i)
        assert (sent, got) == (truth["ud_sent"], truth["ud_received"] + truth["ud_dropped"]), (i, sent, got, truth)
    # every matched op's peer is the other rank (but datagrams, which may go to the sender's own UD QP)
    for i, rank in enumerate(P["rank"]):
        m = (ops["process"] == i) & ops["matched"] & ~np.array(on_ud, bool)
        assert set(ops["dst_rank"][m].tolist()) == {1 - rank}, (rank, Counter(ops["dst_rank"][m].tolist()))


def _by_size(ops, proc, source):
    m = (ops["process"] == proc) & (ops["source_name"] == source) & (ops["opcode_name"] == "SEND")
    return Counter(ops["bytes"][m].tolist())


def _rc_wqes_of(corr, proc, rc, header):
    """What a failure of the per-size check shows: the recovered WQEs of the rank's RC QPs by
    (opcode, bytes, inline, valid, duplicate), those of the MPI sizes' header excepted."""
    W = corr.tables["wqes"]
    keep = Counter()
    for p, q, op, b, inl, ok, dup in zip(W["process"], W["qp_id"], W["opcode_name"], W["bytes"], W["inline"],
                                         W["valid"], W["duplicate"]):
        if int(p) == proc and int(q) in rc and not (op == "SEND" and ok and not dup and int(b) - header in SIZES):
            keep[(op, int(b), bool(inl), bool(ok), bool(dup))] += 1
    return dict(keep)


@needs_emu
@needs_mpi
@pytest.mark.parametrize("tls", list(TLS))
def test_mpi_bytes_per_rank_and_size(runs, tls):
    """Per rank and MPI size: UCX's tagged sends carry exactly the MPI bytes (SKIP + LOOP of each size);
    on the RC QPs the work requests carry the same plus UCX's eager header (a constant per transport:
    HEADER: 9 bytes on rc_verbs, 10 on rc_mlx5, see docs/mpi.md); the traced RC SENDs (count and bytes)
    and UD SENDs equal what the emulated NIC executed (wqes/bytes_by_opcode 0x0a, ud_sent)."""
    _, traced, trace, nic = runs[tls]
    # full mode, every call: a progress loop's empty polls are coalesced by the recorder (each run its first
    # and last call), so nothing is dropped (each of them a record, ~4.7 M per rank, dropped 14-17% here)
    cap = read_capture(trace)
    assert cap.dropped_events() == 0, [p.end for p in cap.processes]
    prog = cap.table("UCP_WORKER_PROGRESS")
    for p in cap.processes:
        records = int(np.count_nonzero(prog["process"] == p.index))
        assert cap.calls("UCP_WORKER_PROGRESS", p.index) > records, (p.index, records)   # runs were coalesced
    corr = correlate_run(trace)
    ops = corr.tables["ops"]
    P = corr.tables["processes"]
    qps = corr.tables["qps"]
    rc = set(qps["qp_id"][qps["qp_type"] == 2].tolist())     # IBV_QPT_RC
    lib = "verbs_wr" if tls == "verbs" else "doorbell"
    report = {}
    L = corr.tables["losses"]
    for i, rank in enumerate(P["rank"].tolist()):
        # what the trace reports lost for this rank, shown when the exact accounting fails (full mode drops
        # events under load -- mostly UCP_WORKER_PROGRESS, which this check does not count)
        lost = {k: int(c) for k, p, c in zip(L["kind"], L["process"], L["count"]) if int(p) == i}
        u = _by_size(ops, i, "ucx")
        want = {s: SKIP + LOOP for s in SIZES}
        assert {s: u[s] for s in SIZES} == want, (rank, u, "losses", lost)
        m = (ops["process"] == i) & (ops["source_name"] == lib)
        on_rc = m & [int(q) in rc for q in ops["qp_id"]]
        w = Counter(ops["bytes"][on_rc & (ops["opcode_name"] == "SEND")].tolist())
        # one header for every size: each MPI message is one work request of size + header bytes
        hdrs = [h for h in range(1, 17) if all(w[s + h] >= SKIP + LOOP for s in SIZES)]
        assert hdrs == [HEADER[tls]], (rank, hdrs, w, "losses", lost, "other RC WQEs", _rc_wqes_of(corr, i, rc, HEADER[tls]))
        report[rank] = dict(header=hdrs[0], wr=dict(w))
        truth = nic[int(P["pid"][i])]
        sends = m & (ops["opcode_name"] == "SEND")
        rc_sends = sends & on_rc
        ud_sends = sends & ~on_rc
        got = dict(rc=int(rc_sends.sum()), rc_bytes=int(ops["bytes"][rc_sends].sum()), ud=int(ud_sends.sum()))
        nic_ = dict(rc=truth["wqes_by_opcode"].get("0x0a", 0), rc_bytes=truth["bytes_by_opcode"].get("0x0a", 0),
                    ud=truth["ud_sent"])
        assert got == nic_, (rank, got, nic_, "losses", lost, truth)


@needs_emu
@needs_mpi
def test_one_rank_killed(tmp_path):
    """Rank 1 SIGKILLs itself after 20 ping-pongs: mpirun ends the job (non-zero), rank 0's trace is readable,
    the report lists the killed process (no END chunk) and nothing hangs."""
    prog = [sys.executable, "-c",
            "from mpi4py import MPI; import os, signal; c = MPI.COMM_WORLD; r = c.Get_rank(); b = bytearray(64)\n"
            "for i in range(40):\n"
            "    if r == 1 and i == 20: os.kill(os.getpid(), signal.SIGKILL)\n"
            "    (c.Send(b, 1 - r), c.Recv(b, 1 - r)) if r == 0 else (c.Recv(b, 1 - r), c.Send(b, 1 - r))\n"]
    trace = tmp_path / "trace"
    r, _ = run_mpi(tmp_path, TLS["verbs"], trace=trace, mode="simple", prog=prog, timeout=120)
    assert r.returncode != 0
    assert "signal 9" in r.stdout + r.stderr or "Killed" in r.stdout + r.stderr, r.stdout + r.stderr
    from sigmatrace.report.summary import build_summary
    corr = correlate_run(trace)
    P = corr.tables["processes"]
    assert sorted(P["rank"].tolist()) == [0, 1]
    L = corr.tables["losses"]
    early = [int(P["rank"][p]) for k, p in zip(L["kind"], L["process"]) if k == "incomplete_process"]
    assert 1 in early, dict(L)
    ops = corr.tables["ops"]
    r0 = (ops["process"] == int(list(P["rank"]).index(0))) & (ops["source_name"] == "ucx")
    assert int(r0.sum()) >= 20
    s = build_summary(corr)
    assert int(list(P["rank"]).index(1)) in s["losses"]["incomplete_processes"], s["losses"]


# ---------------------------------------------------------------------------
# pml cm + mtl ofi over libfabric's verbs provider (verbs;ofi_rxm)

def _ofi_problem():
    if MPI_PROBLEM:
        return MPI_PROBLEM
    r = subprocess.run(["ompi_info"], capture_output=True, text=True, timeout=60)
    if "MCA mtl: ofi" not in r.stdout:
        return "this Open MPI has no mtl ofi"
    if not (EMU_DIR / "librdmacm.so.1").exists():
        return "emulated librdmacm not built (rdma-core's <rdma/rdma_cma.h> missing)"
    return None


@pytest.fixture(scope="module")
def ofi_runs(tmp_path_factory):
    why = _ofi_problem()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("mpi-ofi")
    plain, _ = run_mpi(tmp / "plain", "", pml="ofi")
    trace = tmp / "trace"
    traced, nic = run_mpi(tmp / "traced", "", trace=trace, pml="ofi")
    return plain, traced, trace, nic


@needs_emu
@needs_mpi
def test_mtl_ofi_over_verbs_pingpong(ofi_runs):
    """mpi4py's pingpong over Open MPI's mtl ofi on libfabric's verbs;ofi_rxm (the emulated rdma_cm connects
    the verbs MSG endpoints; each rank binds its own node's address for Open MPI's "no node" lookup), untraced
    and traced: the same sound output; ranks 0 and 1 from Open MPI's variables; every libfabric send and every
    verbs work request matched to the other rank; per rank and MPI size, SKIP + LOOP libfabric tagged sends of
    exactly that size, each one verbs SEND of that size + ofi_rxm's 64-byte header, and the traced verbs SENDs
    (count and bytes) equal to what the emulated NIC executed."""
    plain, traced, trace, nic = ofi_runs
    want = {s: LOOP for s in SIZES}
    for r in (plain, traced):
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert rows(r.stdout) == want, r.stdout
        bad = [ln for ln in r.stderr.splitlines() if "sigmatrace" in ln.lower() or " ERROR " in ln]
        assert not bad, bad
    corr = correlate_run(trace)
    P, ops = corr.tables["processes"], corr.tables["ops"]
    assert sorted(P["rank"].tolist()) == [0, 1]
    u = corr.stats["unmatched"]
    assert u["libfabric"]["operations"] > 0 and u["libfabric"]["unmatched"] == 0, u
    assert u["verbs_wr"]["operations"] > 0 and u["verbs_wr"]["unmatched"] == 0, u
    assert bool(np.asarray(ops["matched"]).all())
    parent, op_id = np.asarray(ops["parent_op_id"]), np.asarray(ops["op_id"])
    for i, rank in enumerate(P["rank"].tolist()):
        mine = ops["process"] == i
        assert set(ops["dst_rank"][mine].tolist()) == {1 - rank}
        f = _by_size(ops, i, "ofi")
        assert {s: f[s] for s in SIZES} == {s: SKIP + LOOP for s in SIZES}, (rank, f)
        w = _by_size(ops, i, "verbs_wr")
        assert all(w[s + RXM_HEADER] >= SKIP + LOOP for s in SIZES), (rank, w)
        # F25: every libfabric send of an MPI size -> the one verbs SEND it posted (size + the rxm header)
        for k in np.flatnonzero(mine & (ops["source_name"] == "ofi") & np.isin(ops["bytes"], SIZES)):
            kids = np.flatnonzero(parent == op_id[k])
            assert len(kids) == 1 and int(ops["bytes"][kids[0]]) == int(ops["bytes"][k]) + RXM_HEADER, (rank, k)
        sends = mine & (ops["source_name"] == "verbs_wr") & (ops["opcode_name"] == "SEND")
        truth = nic[int(P["pid"][i])]
        got = (int(sends.sum()), int(ops["bytes"][sends].sum()))
        assert got == (truth["wqes_by_opcode"].get("0x0a", 0), truth["bytes_by_opcode"].get("0x0a", 0)), (rank, got)
