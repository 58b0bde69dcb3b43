"""Real NCCL over the emulated HCA on one GPU, traced (marker gpu; native/tests/run_nccl.sh, docs/nccl.md).

torch.distributed's NCCL (NET/IB: the emulated mlx5 HCA; P2P and SHM off) runs every collective of
native/tests/nccl/collectives.py on two ranks launched by torchrun, two ranks on one GPU made to look like
two hosts (distinct NCCL_HOSTID), CUDA MPS running so both ranks' kernels run at once.  Untraced first,
then under `sigmatrace run` in aggregate, simple and full mode.  Checked: NCCL's own results and exit
status unchanged; rank identities from torchrun's variables; per-rank bytes on the wire equal what NCCL's
ring implies for the sizes used; every work request matched to its peer; the QPs of the two ranks resolved
to each other; and the trace equals the emulated NIC's own record of the WQEs it executed, opcode for
opcode (RDMA_WRITE chains, WRITE_WITH_IMM, receives).  The nccl provider: each rank's NCCL calls per op and
size are the iterations + warm-up, joined with the other rank's; every work request of NCCL's QPs is
attributed, each unit's data bytes are the ring volume of its calls, and the report's bytes per call of each
kind and size are that volume plus the small control writes.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from native_util import restart_mps
from sigmatrace import _native

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
NCCL_DIR = ROOT / "native" / "tests" / "nccl"
SIZES = (1 << 20, 16 << 20)
ITERS, WARMUP = 5, 2
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
RDMA_WRITE, RDMA_WRITE_IMM, SEND = 0x08, 0x09, 0x0A
CONTROL_MAX = 64          # NCCL's net_ib posts its receive-buffer FIFO entries as small inline writes


def _emu_dir():
    for d in _native.candidate_dirs():
        if (d / "libsigmatrace.so").exists() and (d / "emu" / "libibverbs.so.1").exists():
            return d
    return None


def _reason():
    if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
        return "no NVIDIA GPU device node (/dev/nvidia0) on this machine"
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return "torch with torch.distributed is not importable by this python"
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        return "torchrun not found"
    if _emu_dir() is None:
        return "native build with the emulated HCA missing (cmake -S native -B build/dev)"
    return None


REASON = _reason()


def nccl_env(fabric, stats_dir, extra=None):
    base = _emu_dir()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(
        LD_LIBRARY_PATH=f"{base / 'emu'}:" + env.get("LD_LIBRARY_PATH", ""),
        SIGMATRACE_EMU_FABRIC=fabric, SIGMATRACE_EMU_STATS=f"{stats_dir}/emu-stats.%p.json",
        NCCL_NET="IB", NCCL_IB_HCA="mlx5_0", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1",
        NCCL_SOCKET_IFNAME="lo", NCCL_NET_GDR_LEVEL="0", NCCL_IB_PCI_RELAXED_ORDERING="0",
        NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
        NCCL_PROTO="Simple", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
        PYTHONPATH=f"{ROOT}:{ROOT / 'sim'}", PYTHONUNBUFFERED="1")
    if (base / "emu" / "st-emu-ns").exists() and os.geteuid() == 0:
        env["ST_EMU_NS"] = str(base / "emu" / "st-emu-ns")
    env.update(extra or {})
    return env


def torchrun_argv(sizes=SIZES, iters=ITERS, warmup=WARMUP, ops=OPS, extra=()):
    tr = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    return [tr, "--standalone", "--nproc_per_node", "2", "--no-python", str(NCCL_DIR / "rank.sh"),
            sys.executable, str(NCCL_DIR / "collectives.py"), "--sizes", ",".join(map(str, sizes)),
            "--iters", str(iters), "--warmup", str(warmup), "--ops", ",".join(ops), "--gt-dir", ".", *extra]


def launch(tmp, mode, fabric, argv=None, timeout=400, env=None, tag=""):
    """(returncode, output, trace dir or None, stats dir) of one torchrun launch; mode None = untraced."""
    stats = tmp / f"stats-{mode or 'untraced'}{tag}"
    stats.mkdir()
    trace = None
    argv = argv or torchrun_argv()
    if mode:
        trace = tmp / f"trace-{mode}{tag}"
        argv = [sys.executable, "-m", "sigmatrace", "run", "-o", str(trace), "--mode", mode, "--"] + argv
    cwd = tmp / f"run-{mode or 'untraced'}{tag}"      # the ranks write their ground truth here (--gt-dir .)
    cwd.mkdir()
    r = subprocess.run(argv, env=nccl_env(fabric, stats, env), capture_output=True, text=True, timeout=timeout,
                       cwd=str(cwd))
    (cwd / "output.txt").write_text(r.stdout + r.stderr)
    for p in Path("/dev/shm").glob(f"sigmatrace-emu.{fabric}.*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return r.returncode, r.stdout + r.stderr, trace, cwd


def ground_truth(run_dir):
    """(rows, done) from the ranks' gt-rank<R>.jsonl files: one row per (collective, size, rank)."""
    rows, done = [], []
    for f in sorted(Path(run_dir).glob("gt-rank*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            (done if d.get("done") else rows).append(d)
    return rows, done


def ring_bytes(op, size, rank, world):
    """Bytes rank `rank` sends over the network for one collective of size S (NCCL ring, Simple)."""
    share = size * (world - 1) // world
    return {"all_reduce": 2 * share, "all_gather": share, "reduce_scatter": share, "all_to_all": share,
            "broadcast": size if rank == 0 else (size if rank < world - 1 else 0),
            "send_recv": size if rank == 0 else 0}[op]


def ring_volume(rows, rank):
    """Bytes `rank` sends over the network for every collective of the ground truth, warm-up included."""
    return sum(ring_bytes(r["op"], r["bytes"], rank, r["world"]) * (r["iters"] + r["warmup"])
               for r in rows if r["rank"] == rank)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if REASON:
        pytest.skip(REASON)
    tmp = tmp_path_factory.mktemp("nccl")
    out = {}
    for mode in (None, "aggregate", "simple", "full"):
        out[mode] = launch(tmp, mode, f"nccl{os.getpid()}{mode or 'u'}")
    summary = {str(m): dict(rc=v[0]) for m, v in out.items()}
    (tmp / "summary.json").write_text(json.dumps(summary))
    return out


@pytest.mark.parametrize("mode", [None, "aggregate", "simple", "full"])
def test_nccl_results_unchanged(runs, mode):
    rc, output, _, run_dir = runs[mode]
    rows, done = ground_truth(run_dir)
    assert rc == 0, output[-6000:]
    assert len(done) == 2 and all(d["ok"] for d in done), output[-4000:]
    assert len(rows) == 2 * len(OPS) * len(SIZES)
    assert "NET/IB : Using [0]mlx5_0" in output, "NCCL did not take the emulated HCA"
    assert "NCCL_BAD" not in output


@pytest.mark.parametrize("mode", [None, "full"])
def test_nccl_warns_nothing_about_the_emulated_device(runs, mode):
    """The emulator gives NCCL a device path it can resolve (st-emu-ns) and async events as rdma-core does."""
    _, output, _, _ = runs[mode]
    warns = [l for l in output.splitlines() if "NCCL WARN" in l]
    bad = [l for l in warns if "/sys/class/infiniband" in l or "async" in l.lower() or "realpath" in l]
    assert not bad, bad[:10]


@pytest.mark.parametrize("mode", ["aggregate", "simple", "full"])
def test_ranks_named_from_torchrun(runs, mode):
    from sigmatrace.format import read_capture
    _, output, trace, _ = runs[mode]
    cap = read_capture(trace, errors="recover")
    ranks = sorted(int(p.header["rank"]) for p in cap.processes
                   if p.header and p.header.get("rank") is not None and p.event_count)
    assert ranks[-2:] == [0, 1] or set(ranks) >= {0, 1}, [p.header for p in cap.processes]


@pytest.mark.parametrize("mode", ["simple", "full"])
def test_bytes_matching_topology_and_nic_ground_truth(runs, mode):
    from sigmatrace.correlate import correlate
    _, output, trace, run_dir = runs[mode]
    stats = run_dir.parent / f"stats-{mode}"
    rows, _ = ground_truth(run_dir)
    corr = correlate(trace, workers=2)
    P = corr.tables["processes"]
    ops = corr.tables["ops"]
    report = {"mode": mode}
    nic = {}
    for p in Path(stats).glob("emu-stats.*.json"):
        d = json.loads(p.read_text())
        nic[d["pid"]] = d
    for i, rank in enumerate(P["rank"]):
        if rank < 0:
            continue
        mine = ops["process"] == i
        if not mine.any():
            continue
        code, nbytes = ops["opcode"][mine], ops["bytes"][mine]
        data = int(nbytes[nbytes > CONTROL_MAX].sum())
        control = int(nbytes[nbytes <= CONTROL_MAX].sum())
        want = ring_volume(rows, int(rank))
        report[f"rank{rank}"] = dict(data=data, control=control, expected=want, ops=int(mine.sum()),
                                     by_opcode={f"{k:#x}": v for k, v in Counter(int(c) for c in code).items()})
        assert data == want, report
        assert bool(ops["matched"][mine].all()), ("unmatched work requests", report)
        truth = nic.get(int(P["pid"][i]))
        if truth is not None and mode == "full":
            got = Counter(int(c) for c in code)
            want_n = {int(k, 16): v for k, v in truth["wqes_by_opcode"].items()}
            report[f"rank{rank}"]["nic"] = truth["wqes_by_opcode"]
            assert dict(got) == want_n, ("trace vs the NIC's executed WQEs", report)
    qps = corr.tables["qps"]
    used = set(int(q) for q in ops["qp_id"][ops["qp_id"] >= 0])
    assert used and all(int(qps["remote_qp_id"][q]) >= 0 for q in used), "a used QP without its remote"
    print("NCCL_REPORT " + json.dumps(report))


# ---------------------------------------------------------------------------
# the nccl provider: NCCL's calls recorded, joined, and linked to their work requests (docs/schema.md)

BENCH_MIN = 64 << 10      # the benchmark's collectives (>= 64 KiB); smaller ones are torch's own (barrier)


def expected_calls(op, size, rank, world):
    """{(NCCL op, bytes of the call): calls per iteration} for one torch.distributed op of size S on `rank`;
    all_to_all: NCCL 2.28's ncclAlltoAll, or (torch without it) a group of a send and a receive per rank."""
    part = size // world
    return {"all_reduce": [{("all_reduce", size): 1}], "all_gather": [{("all_gather", part): 1}],
            "reduce_scatter": [{("reduce_scatter", part): 1}], "broadcast": [{("broadcast", size): 1}],
            "send_recv": [{("send", size): 1} if rank == 0 else {("recv", size): 1}],
            "all_to_all": [{("all_to_all", part): 1}, {("send", part): world, ("recv", part): world}]}[op]


def nccl_ring_bytes(op, nbytes, rank, peer, world):
    """Bytes rank `rank` sends over the network for one NCCL call of `nbytes` (the call's count x size)."""
    if op == "all_reduce":
        return 2 * (nbytes * (world - 1) // world)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return nbytes * (world - 1)
    if op == "broadcast":
        return nbytes if rank < world - 1 else 0
    if op == "send":
        return nbytes if peer != rank else 0
    return 0                                                  # recv: only clear-to-send control writes


@pytest.fixture(scope="module")
def correlated(runs):
    from sigmatrace.correlate import correlate
    return {m: correlate(runs[m][2], workers=2) for m in ("simple", "full")}


@pytest.mark.parametrize("mode", ["simple", "full"])
def test_nccl_calls_recorded_per_op_and_size(runs, correlated, mode):
    """Each rank's NCCL calls of the benchmark sizes: iterations + warm-up of every op, per op and size."""
    _, _, _, run_dir = runs[mode]
    rows, _ = ground_truth(run_dir)
    C = correlated[mode].tables["collectives"]
    P = correlated[mode].tables["processes"]
    report = {}
    for i, prank in enumerate(P["rank"]):
        if prank < 0:
            continue
        mine = (C["process"] == i) & (C["seq"] >= 0) & (C["bytes"] >= BENCH_MIN)
        got = Counter(zip(C["op"][mine].tolist(), C["bytes"][mine].tolist()))
        report[f"rank{prank}"] = {f"{k[0]}:{k[1]}": v for k, v in sorted(got.items())}
        want = Counter()
        for r in rows:
            if r["rank"] != prank:
                continue
            n = r["iters"] + r["warmup"]
            alts = expected_calls(r["op"], r["bytes"], int(prank), r["world"])
            pick = next((a for a in alts if all(got.get(k, 0) >= v * n for k, v in a.items())), alts[0])
            for k, v in pick.items():
                want[k] += v * n
        assert got == want, ("NCCL calls per (op, bytes)", report, dict(want))
        assert (C["result"][(C["process"] == i)] == 0).sum() >= sum(want.values())
    keys = Counter(correlated[mode].tables["communicators"]["key"].tolist())
    assert keys and all(v == 2 for v in keys.values()), ("every communicator joined on both ranks", keys)
    ex = (C["seq"] >= 0) & (C["bytes"] >= BENCH_MIN)
    assert (C["instance_ranks"][ex] == 2).all(), "a call not joined with its partner (the other rank's, or for a " \
        "send to itself its own receive)"
    print("NCCL_CALLS " + json.dumps(report))


@pytest.mark.parametrize("mode", ["simple", "full"])
def test_nccl_work_requests_attributed_with_ring_bytes(runs, correlated, mode, tmp_path):
    """Every work request of NCCL's QPs is attributed to a call (or a group / calls in flight), and each
    unit's data bytes (writes > CONTROL_MAX) are the ring volume of its calls; the report's bytes per call
    of each benchmark size are the ring volume plus the small control writes."""
    corr = correlated[mode]
    C, O, Q = corr.tables["collectives"], corr.tables["ops"], corr.tables["qps"]
    used = np.unique(O["qp_id"][O["qp_id"] >= 0])
    assert len(used) and (Q["comm"][used] >= 0).all(), ("QPs without a communicator",
                                                         Counter(Q["comm_rule"][used].tolist()))
    assert (O["collective_unit"] >= 0).all(), ("work requests not attributed", int((O["collective_unit"] < 0).sum()))
    units = np.unique(C["unit"][C["unit"] >= 0])
    u_data = np.bincount(O["collective_unit"], weights=np.where(O["bytes"] > CONTROL_MAX, O["bytes"], 0),
                         minlength=int(units.max()) + 1 if len(units) else 0)
    checked, report = 0, Counter()
    for u in units:
        m = np.flatnonzero(C["unit"] == u)
        if (C["bytes"][m] < BENCH_MIN).any():
            continue
        want = sum(nccl_ring_bytes(C["op"][i], int(C["bytes"][i]), int(C["rank"][i]), int(C["root"][i]),
                                   int(C["nranks"][i])) for i in m)
        assert int(u_data[u]) == want, ([(C["op"][i], int(C["bytes"][i]), C["attribution"][i]) for i in m],
                                        int(u_data[u]), want)
        report[str(C["attribution"][m[0]])] += 1
        checked += 1
    assert checked > 0
    from sigmatrace.report import build_report
    _, summary, _ = build_report(runs[mode][2], tmp_path / "rep", workers=2, figures=False, perfetto=False,
                                 quiet=True)
    for r in summary["collectives"]["by_kind"]:
        if r["bytes"] < BENCH_MIN or not r["attributed"]:
            continue
        ranks = C["rank"][(C["op"] == r["op"]) & (C["bytes"] == r["bytes"]) & (C["attribution"] == "window")]
        ring = np.mean([nccl_ring_bytes(r["op"], r["bytes"], int(k), (int(k) + 1) % 2, 2) for k in ranks])
        assert ring <= r["wire_bytes_per_call"] <= ring + 64 * 1024, (r, ring)
    print("NCCL_ATTRIBUTION " + json.dumps(dict(mode=mode, units=checked, **report)))


def test_full_mode_records_per_wr_latency(correlated):
    """Full mode records NCCL's completions: every signalled work request on NCCL's QPs has its own completion
    and a real post -> completion latency (F24a); simple mode records post calls only (latency NULL)."""
    O = correlated["full"].tables["ops"]
    sig = np.asarray(O["signaled"]).astype(bool) & (np.asarray(O["qp_id"]) >= 0)
    lat, own = np.asarray(O["latency_ns"]), np.asarray(O["completion"])
    assert sig.sum() > 1000, int(sig.sum())
    assert (own[sig] >= 0).all() and (lat[sig] > 0).all(), (int((own[sig] < 0).sum()), int((lat[sig] <= 0).sum()))
    print("NCCL_WR_LATENCY " + json.dumps(dict(signalled=int(sig.sum()),
                                               p50_ns=int(np.median(lat[sig])), max_ns=int(lat[sig].max()))))


def _nccl_errors(output):
    """NCCL's warnings, without the numbers that differ from run to run (pids, addresses, times, hosts)."""
    out = set()
    for line in output.splitlines():
        if "NCCL WARN" in line:
            out.add(re.sub(r"0x[0-9a-f]+|\d+", "N", line.split("NCCL WARN", 1)[1]).strip())
    return out


def test_killed_rank_mid_collective(tmp_path):
    """Rank 1 dies (SIGKILL) inside a 16 MiB all_reduce: torchrun reports the same failure traced and untraced
    (exit status, rank 1 killed by signal 9), NCCL's warnings on the survivor are the same kinds, the trace
    of the surviving rank is readable and the report names rank 1 as the process that ended early."""
    if REASON:
        pytest.skip(REASON)
    argv = torchrun_argv(sizes=(16 << 20,), iters=20, warmup=2, ops=("all_reduce",), extra=("--die", "1:all_reduce:6"))
    got = {}
    for m in (None, "simple"):
        try:
            got[m] = launch(tmp_path, m, f"ncclk{os.getpid()}{m or 'u'}", argv=argv, timeout=300)
        finally:
            restart_mps()          # the killed rank was an MPS client
    (rc_u, out_u, _, _), (rc_t, out_t, trace, _) = got[None], got["simple"]
    report = dict(rc_untraced=rc_u, rc_traced=rc_t, nccl_untraced=sorted(_nccl_errors(out_u)),
                  nccl_traced=sorted(_nccl_errors(out_t)))
    print("NCCL_KILLED " + json.dumps(report))
    assert rc_u != 0 and rc_t == rc_u, (report, out_t[-3000:])
    for out in (out_u, out_t):
        assert "NCCL_DYING rank 1" in out
        assert re.search(r"exitcode\s*:\s*-9", out), out[-3000:]
    assert _nccl_errors(out_t) == _nccl_errors(out_u), report
    from sigmatrace.correlate import correlate
    from sigmatrace.report import build_report
    corr = correlate(trace, workers=2)
    P, O = corr.tables["processes"], corr.tables["ops"]
    ranks = {int(r): i for i, r in enumerate(P["rank"]) if r >= 0}
    assert set(ranks) >= {0, 1}, P["rank"]
    assert (np.asarray(O["process"]) == ranks[0]).sum() > 0, "the surviving rank's work requests"
    _, summary, _ = build_report(trace, tmp_path / "rep", workers=2, figures=False, perfetto=False, quiet=True)
    early = summary["losses"]["ended_early"]
    assert 1 in [e["rank"] for e in early], early
    e1 = next(e for e in early if e["rank"] == 1)
    assert e1["last_event_ns"] is not None, e1


def test_consumer_process_writes_a_cuda_process_trace(tmp_path):
    """The consumer process asked for explicitly (SIGMATRACE_WRITER=process) in processes that loaded the CUDA
    driver before tracing started (torch: CUDA is initialised before NCCL's first verbs call): each rank's file
    says the consumer wrote it, NCCL's results are right, and the bytes are the ring's, every one matched."""
    if REASON:
        pytest.skip(REASON)
    from sigmatrace.correlate import correlate
    from sigmatrace.format import read_capture
    argv = torchrun_argv(sizes=(1 << 20, 16 << 20), ops=("all_reduce", "broadcast"))
    rc, output, trace, run_dir = launch(tmp_path, "simple", f"ncclw{os.getpid()}", argv=argv,
                                        env={"SIGMATRACE_WRITER": "process"}, tag="-consumer")
    rows, done = ground_truth(run_dir)
    assert rc == 0 and len(done) == 2 and all(d["ok"] for d in done), output[-4000:]
    assert "SIGMATRACE_WRITER=process:" not in output, [l for l in output.splitlines() if "SIGMATRACE_WRITER" in l]
    cap = read_capture(trace, errors="recover")
    writers = {int(p.header["rank"]): (p.header.get("options") or {}).get("writer")
               for p in cap.processes if p.header and p.header.get("rank") is not None and p.event_count}
    assert writers.get(0) == writers.get(1) == "process", writers
    corr = correlate(trace, workers=2)
    P, O = corr.tables["processes"], corr.tables["ops"]
    for i, rank in enumerate(P["rank"]):
        if rank < 0 or not (O["process"] == i).any():
            continue
        mine = O["process"] == i
        nb = O["bytes"][mine]
        want = ring_volume(rows, int(rank))
        assert int(nb[nb > CONTROL_MAX].sum()) == want and bool(O["matched"][mine].all()), (int(rank), want)
    print("NCCL_CONSUMER " + json.dumps(dict(writers=writers, ops=int(len(O["process"])))))
