"""Real NCCL over the emulated HCA on one GPU, traced (marker gpu; native/tests/run_nccl.sh, docs/nccl.md).

torch.distributed's NCCL (NET/IB: the emulated mlx5 HCA; P2P and SHM off) runs every collective of
native/tests/nccl/collectives.py on two ranks launched by torchrun, two ranks on one GPU made to look like
two hosts (distinct NCCL_HOSTID), CUDA MPS running so both ranks' kernels run at once.  Untraced first,
then under `sigmatrace run` in aggregate, simple and full mode.  Checked: NCCL's own results and exit
status unchanged; rank identities from torchrun's variables; per-rank bytes on the wire equal what NCCL's
ring implies for the sizes used; every work request matched to its peer; the QPs of the two ranks resolved
to each other; and the trace equals the emulated NIC's own record of the WQEs it executed, opcode for
opcode (RDMA_WRITE chains, WRITE_WITH_IMM, receives).
"""
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

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


def torchrun_argv(sizes=SIZES, iters=ITERS, warmup=WARMUP, ops=OPS):
    tr = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    return [tr, "--standalone", "--nproc_per_node", "2", "--no-python", str(NCCL_DIR / "rank.sh"),
            sys.executable, str(NCCL_DIR / "collectives.py"), "--sizes", ",".join(map(str, sizes)),
            "--iters", str(iters), "--warmup", str(warmup), "--ops", ",".join(ops), "--gt-dir", "."]


def launch(tmp, mode, fabric, argv=None, timeout=400):
    """(returncode, output, trace dir or None, stats dir) of one torchrun launch; mode None = untraced."""
    stats = tmp / f"stats-{mode or 'untraced'}"
    stats.mkdir()
    trace = None
    argv = argv or torchrun_argv()
    if mode:
        trace = tmp / f"trace-{mode}"
        argv = [sys.executable, "-m", "sigmatrace", "run", "-o", str(trace), "--mode", mode, "--"] + argv
    cwd = tmp / f"run-{mode or 'untraced'}"      # the ranks write their ground truth here (--gt-dir .)
    cwd.mkdir()
    r = subprocess.run(argv, env=nccl_env(fabric, stats), capture_output=True, text=True, timeout=timeout,
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
        want = sum(ring_bytes(r["op"], r["bytes"], int(rank), r["world"]) * (r["iters"] + r["warmup"])
                   for r in rows if r["rank"] == rank)
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
