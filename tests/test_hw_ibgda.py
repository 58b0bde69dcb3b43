"""GPU-initiated RDMA on a real IBGDA node (marker hw): real mlx5 NIC, real GPU(s),
real NVSHMEM / NCCL / DeepEP programs, traced with `sigmatrace run`.

    pytest -m hw tests/test_hw_ibgda.py -v -rs      (docs/gpu.md, "Real IBGDA nodes")

Every test runs its program twice, untraced and under
`sigmatrace run -o DIR --providers ibv,mlx5,cuda -- ...` (one `sigmatrace run`
per rank, inside the launcher), checks the program's own success output both
times, then decodes the trace:

* NVSHMEM perftests (shmem_put_latency / shmem_get_latency /
  shmem_atomic_latency, 2 PEs, NVSHMEM_IB_ENABLE_IBGDA=1): every DevX CREATE_QP
  parses with sigmatrace.mlx5.parse_create_qp; the doorbell page was hijacked
  (DB_HIJACK_INSTALL, a replaced device pointer); DB_DOORBELL count > 0, every
  doorbell names a QP the process created through DevX and its producer index
  never goes back (mod 2^16, steps no larger than the SQ); DB_WQE side records
  are VERIFIED and decode with sigmatrace.mlx5 to the operation's opcodes
  (RDMA_WRITE for put, RDMA_READ for get, an atomic for atomics); DB_WQE_LOST
  only with a known reason (overwritten / staging ring full) and at most 1% of
  the announced WQEBBs, never CORRUPT or COPY_FAILED; `sigmatrace report`
  of the trace succeeds.
* nccl-tests all_reduce_perf (2 ranks, IB transport forced): "Out of bounds
  values : 0 OK"; IBV_POST_SEND events on QPs the process created; every
  QP moved to RTR points at a QP another rank created (topology across ranks);
  report succeeds.
* DeepEP low-latency test (NVSHMEM IBGDA underneath): exits 0 without a
  traceback; the IBGDA checks above with RDMA_WRITE required.

Each missing prerequisite skips with the precise reason.  Knobs (environment):

  SIGMATRACE_NVSHMEM_PERFTEST_DIR  directory holding the perftest binaries
                                   (else $NVSHMEM_HOME/bin/perftest/device/pt-to-pt, ...)
  SIGMATRACE_NVSHMEM_PERFTEST_ARGS extra arguments for every perftest
  SIGMATRACE_HW_LAUNCHER           launcher prefix for 2 ranks, e.g.
                                   "srun -N2 -n2" or "mpirun -np 2 -H a,b"
                                   (default: nvshmrun -n 2 -ppn 2, else mpirun -np 2)
  SIGMATRACE_HW_OUTDIR             where traces go (a shared file system for
                                   multi-node launchers; default: pytest tmp dir)
  SIGMATRACE_NCCL_TESTS_DIR        directory holding all_reduce_perf
  SIGMATRACE_DEEPEP_TEST           DeepEP's tests/test_low_latency.py
  SIGMATRACE_DEEPEP_ARGS           its arguments (default: --num-processes 2)
  SIGMATRACE_HW_TIMEOUT            seconds per program run (default 600)
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sigmatrace import _native

pytestmark = pytest.mark.hw

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = int(os.environ.get("SIGMATRACE_HW_TIMEOUT", "600"))
PROVIDERS = "ibv,mlx5,cuda"

# mlx5 opcodes (ref §1.5)
OP_NOP, OP_RDMA_WRITE, OP_RDMA_WRITE_IMM, OP_SEND, OP_RDMA_READ = 0x00, 0x08, 0x09, 0x0A, 0x10
ATOMICS = {0x11, 0x12, 0x14, 0x15}  # CS, FA, masked CS, masked FA (NVSHMEM/DeepEP ext atomics: 0x14/0x15)
OP_DUMP = 0x23  # NVSHMEM's consistency/fence WQE
HOUSEKEEPING = {OP_NOP, OP_DUMP}
PRM_CREATE_QP = 0x500
LOST_OVERWRITTEN, LOST_CORRUPT, LOST_COPY_FAILED, LOST_RING_FULL = 1, 2, 3, 4
IBV_QPS_RTR = 3

PERFTEST_SUBDIRS = ("", "device/pt-to-pt", "perftest/device/pt-to-pt", "bin/perftest/device/pt-to-pt",
                    "share/nvshmem/perftest/device/pt-to-pt")

# test id -> (binary, opcodes that must be decoded, opcodes also allowed)
PERFTESTS = {
    "put": ("shmem_put_latency", {OP_RDMA_WRITE}, HOUSEKEEPING | {OP_RDMA_WRITE_IMM}),
    "get": ("shmem_get_latency", {OP_RDMA_READ}, HOUSEKEEPING),
    # the atomic latency test walks every AMO; fetch/set variants may go out as
    # reads/writes next to the atomics themselves
    "atomic": ("shmem_atomic_latency", ATOMICS, HOUSEKEEPING | {OP_RDMA_WRITE, OP_RDMA_READ}),
}


# ---- prerequisites ------------------------------------------------------------------------------
def mlx5_devices():
    """Real mlx5 devices: /sys/class/infiniband/mlx5_* backed by a PCI device."""
    return sorted(Path(p).name for p in glob.glob("/sys/class/infiniband/mlx5_*") if Path(p, "device").exists())


def gpu_count():
    if not Path("/dev/nvidia0").exists():
        return 0
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 1  # the node exists; count unknown
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 1
    return max(1, sum(1 for ln in out.splitlines() if ln.startswith("GPU ")))


NEEDED_PROVIDERS = {"cuda", "mlx5", "ibv"}


def _providers_of(d):
    try:
        return set(json.loads((d / "build_info.json").read_text()).get("providers", []))
    except (OSError, ValueError):
        return set()


def tracer_dir():
    """First native dir whose libsigmatrace.so was built with the cuda, mlx5 and ibv providers."""
    for d in _native.candidate_dirs():
        if (d / "libsigmatrace.so").exists() and NEEDED_PROVIDERS <= _providers_of(d):
            return d
    return None


def _launcher_env_override():
    v = os.environ.get("SIGMATRACE_HW_LAUNCHER")
    return shlex.split(v) if v else None


def find_launcher():
    """(argv prefix for 2 ranks, kind) or (None, reason)."""
    over = _launcher_env_override()
    if over:
        kind = "mpi" if Path(over[0]).name.startswith(("mpirun", "mpiexec", "srun")) else "custom"
        return over, kind
    home = os.environ.get("NVSHMEM_HOME")
    for cand in ([str(Path(home, "bin", n)) for n in ("nvshmrun", "nvshmrun.hydra")] if home else []) + \
            [shutil.which("nvshmrun") or "", shutil.which("nvshmrun.hydra") or ""]:
        if cand and Path(cand).exists():
            return [cand, "-n", "2", "-ppn", "2"], "hydra"
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun:
        argv = [mpirun, "-np", "2"]
        try:
            ver = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            ver = ""
        if "Open MPI" in ver or "OpenRTE" in ver:
            argv += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
        return argv, "mpi"
    return None, ("no launcher for 2 ranks: nvshmrun/nvshmrun.hydra ($NVSHMEM_HOME/bin or PATH) and mpirun/mpiexec "
                  "not found; set SIGMATRACE_HW_LAUNCHER (e.g. 'srun -N2 -n2')")


def perftest_dirs():
    roots = []
    if os.environ.get("SIGMATRACE_NVSHMEM_PERFTEST_DIR"):
        roots.append(os.environ["SIGMATRACE_NVSHMEM_PERFTEST_DIR"])
    if os.environ.get("NVSHMEM_HOME"):
        roots.append(os.environ["NVSHMEM_HOME"])
    roots += ["/usr/local/nvshmem", "/opt/nvidia/nvshmem", *sorted(glob.glob("/usr/lib/*/nvshmem/*")),
              *sorted(glob.glob("/opt/nvidia/hpc_sdk/Linux_x86_64/*/comm_libs/*/nvshmem"))]
    out = []
    for r in roots:
        for sub in PERFTEST_SUBDIRS:
            d = Path(r, sub)
            if d.is_dir() and d not in out:
                out.append(d)
    return out


def find_perftest(name):
    for d in perftest_dirs():
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def node_reasons(min_gpus=1):
    """What this node lacks for an hw test (empty: nothing)."""
    why = []
    if tracer_dir() is None:
        built = [d for d in _native.candidate_dirs() if (d / "libsigmatrace.so").exists()]
        if not built:
            why.append("libsigmatrace.so not built (cmake -S native -B build/dev && cmake --build build/dev)")
        else:
            why.append("no libsigmatrace.so built with the cuda, mlx5 and ibv providers (build_info.json: "
                       + "; ".join(f"{d}: {','.join(sorted(_providers_of(d))) or '?'}" for d in built) + ")")
    if not mlx5_devices():
        have = sorted(Path(p).name for p in glob.glob("/sys/class/infiniband/*"))
        why.append("no real mlx5 RDMA device (/sys/class/infiniband/mlx5_* absent"
                   + (f"; this node has {', '.join(have)})" if have else "; /sys/class/infiniband is empty)"))
    n = gpu_count()
    if n == 0:
        why.append("no NVIDIA GPU (/dev/nvidia0 absent)")
    elif n < min_gpus and not _launcher_env_override():
        why.append(f"{min_gpus} GPUs needed for {min_gpus} ranks on this node, nvidia-smi -L lists {n} "
                   "(or set SIGMATRACE_HW_LAUNCHER to spread the ranks over nodes)")
    return why


def skip_if(why):
    if why:
        pytest.skip("; ".join(why))


# ---- running -------------------------------------------------------------------------------------
def outdir(tmp_path, name):
    base = os.environ.get("SIGMATRACE_HW_OUTDIR")
    d = Path(base) / f"{name}-{os.getpid()}" if base else tmp_path / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def rank_cmd(prog, trace_dir, env_vars):
    """The per-rank command: `env K=V ... [python -m sigmatrace run -o DIR --providers ... --] PROG`.

    Variables travel on the command line, so that every launcher (hydra,
    mpirun, srun, a custom prefix) delivers them to every rank on every node."""
    env_vars = dict(env_vars)
    env_vars["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    lib = tracer_dir()
    env_vars.setdefault("SIGMATRACE_LIB_DIR", str(lib))
    pre = ["env"] + [f"{k}={v}" for k, v in env_vars.items()]
    if trace_dir is None:
        return pre + list(prog)
    return pre + [sys.executable, "-m", "sigmatrace", "run", "-o", str(trace_dir), "--providers", PROVIDERS, "--"] \
        + list(prog)


def run(argv, timeout=TIMEOUT):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    # never the emulated HCA / driver of the build tree: this is the real hardware
    lib = tracer_dir()
    emu = {str(lib / "emu"), str(lib / "emu" / "cuda")} if lib else set()
    env["LD_LIBRARY_PATH"] = ":".join(p for p in env.get("LD_LIBRARY_PATH", "").split(":")
                                      if p and os.path.normpath(p) not in emu)
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n[timed out after {timeout} s]"
    return p.returncode, p.stdout + "\n" + p.stderr


ERROR_WORD = re.compile(r"\b(ERROR|FAILED|FAIL|Traceback|Segmentation fault|Aborted)\b")
TABLE_ROW = re.compile(r"^\s*(\d+)\s+([0-9]+\.?[0-9]*(?:[eE][-+]?\d+)?)\s*$", re.M)


def perftest_success(rc, out):
    """(ok, rows): exit 0, no error words, at least one '<size> <value>' result row."""
    rows = [(int(a), float(b)) for a, b in TABLE_ROW.findall(out)]
    return rc == 0 and not ERROR_WORD.search(out) and len(rows) > 0, rows


def trace_files(d):
    return sorted(glob.glob(str(Path(d) / "*.trace")))


# ---- trace checks --------------------------------------------------------------------------------
def devx_qps(cap):
    """{(process, qpn): CreateQP} from the PRM side records of every DevX CREATE_QP."""
    import sigmatrace.mlx5 as M
    cr = cap.table("MLX5_DEVX_OBJ_CREATE")
    out = {}
    for k in np.flatnonzero(cr["prm_opcode"] == PRM_CREATE_QP):
        proc = int(cr["process"][k])
        if int(cr["status"][k]) != 0:
            continue
        rec = cap.side_record(proc, int(cr["side_id"][k]))
        assert rec is not None, f"CREATE_QP (process {proc}) without its PRM side record"
        in_buf, out_buf = rec.prm()
        q = M.parse_create_qp(in_buf, out_buf)
        assert q.qpn == int(cr["number"][k]), "CREATE_QP event obj is the QPN of create_qp_out"
        assert q.sq_wqebbs >= 1 and q.wq_umem_valid, f"QP {q.qpn:#x}: SQ not in a registered umem"
        out[(proc, q.qpn)] = q
    return out


def check_doorbells(cap, qps):
    """DB_DOORBELL > 0; each names a DevX QP of its process; PIs never go back (mod 2^16)."""
    t = cap.table("DB_DOORBELL")
    n = len(t["tsc"])
    assert n > 0, "no DB_DOORBELL recorded: the GPU rang no hijacked doorbell"
    per = collections.defaultdict(list)
    for i in np.argsort(t["tsc"], kind="stable"):
        per[(int(t["process"][i]), int(t["qpn"][i]))].append(int(t["producer_index"][i]))
    for key, pis in per.items():
        assert key in qps, f"doorbell for QP {key[1]:#x} (process {key[0]}) that no DevX CREATE_QP made"
        ring = qps[key].sq_wqebbs
        steps = np.diff(np.asarray(pis, dtype=np.int64)) & 0xFFFF
        bad = np.flatnonzero(steps > ring)
        assert not len(bad), (f"QP {key[1]:#x}: producer index went back or jumped more than the SQ ({ring}) at "
                              f"doorbell {int(bad[0]) + 1}: {pis[int(bad[0])]} -> {pis[int(bad[0]) + 1]}")
    return n, per


def check_wqes(cap, qps, required, allowed):
    """Decode every DB_WQE record; return {opcode: count}."""
    from sigmatrace.mlx5 import parse_wqe
    t = cap.table("DB_WQE")
    assert len(t["tsc"]) > 0, "no DB_WQE recorded: no WQE recovered"
    ops = collections.Counter()
    wqebb_ok = 0
    for i in range(len(t["tsc"])):
        proc = int(t["process"][i])
        rec = cap.side_record(proc, int(t["side_id"][i]))
        assert rec is not None, "DB_WQE without its WQE_BYTES side record"
        hdr, body = rec.wqe()
        assert hdr["flags"] & 1, "WQE_BYTES record not VERIFIED"
        assert (proc, hdr["qpn"]) in qps, f"WQEs of QP {hdr['qpn']:#x} that no DevX CREATE_QP made"
        off = 0
        while off < len(body):
            w = parse_wqe(body, off)
            assert w.qpn == hdr["qpn"], f"ctrl QPN {w.qpn:#x} in a record of QP {hdr['qpn']:#x}"
            ops[w.opcode] += 1
            off += 64 * w.num_wqebbs
        wqebb_ok += len(body) // 64
    names = {k: f"{k:#x}" for k in ops}
    assert required & set(ops), f"none of the expected opcodes {sorted(map(hex, required))} decoded; got {names}"
    unexpected = set(ops) - required - allowed
    assert not unexpected, f"unexpected opcodes decoded: {sorted(map(hex, unexpected))} (all: {dict(ops)})"
    return ops, wqebb_ok


def check_losses(cap, wqebb_ok):
    lost = cap.table("DB_WQE_LOST")
    reasons = collections.Counter()
    for r, n in zip(lost["reason"].tolist(), lost["num_wqebb"].tolist()):
        reasons[int(r)] += int(n)
    assert not reasons.get(LOST_CORRUPT), f"{reasons[LOST_CORRUPT]} WQEBBs CORRUPT (ctrl index/QPN/DS mismatch)"
    assert not reasons.get(LOST_COPY_FAILED), f"{reasons[LOST_COPY_FAILED]} WQEBBs COPY_FAILED (device copy error)"
    unknown = set(reasons) - {LOST_OVERWRITTEN, LOST_RING_FULL}
    assert not unknown, f"DB_WQE_LOST with unknown reason(s) {sorted(unknown)}"
    total = sum(reasons.values())
    assert total <= (total + wqebb_ok) // 100, f"{total} WQEBBs lost of {total + wqebb_ok} (> 1%): {dict(reasons)}"
    return total


def check_hijack(cap):
    by = cap.count_by_type()
    dp = cap.table("CU_MEM_HOST_GET_DEVPTR")
    if not by.get("DB_HIJACK_INSTALL") and not (dp["hijacked"] == 1).any():
        pytest.skip("the program never asked the CUDA driver for a device pointer of a UAR doorbell (NVSHMEM used "
                    "a CPU NIC handler?): load nvidia with NVreg_RegistryDwords=PeerMappingOverride=1 "
                    "(reference §5) or set NVSHMEM_IBGDA_NIC_HANDLER=gpu")
    assert by.get("DB_HIJACK_INSTALL", 0) >= 1, "device pointer replaced but no poller installed"
    hij = dp["hijacked"] == 1
    assert (dp["device_ptr"][hij] != dp["real_device_ptr"][hij]).all()
    inst = cap.table("DB_HIJACK_INSTALL")
    for i in range(len(inst["tsc"])):
        j = cap.side_record(int(inst["process"][i]), int(inst["side_id"][i])).json()
        assert j["mode"] and j["wait"], j


def check_report(trace_dir, tmp_path):
    out = tmp_path / "report"
    p = subprocess.run([sys.executable, "-m", "sigmatrace", "report", str(trace_dir), "-o", str(out), "-q",
                        "--no-figures"], capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, f"sigmatrace report failed: {p.stderr[-2000:]}"
    assert (out / "summary.json").exists(), "report wrote no summary.json"
    return json.loads((out / "summary.json").read_text())


def check_ibgda_trace(trace_dir, tmp_path, required, allowed, nprocs=2):
    from sigmatrace.format import read_capture
    files = trace_files(trace_dir)
    assert len(files) >= nprocs, f"{len(files)} trace files in {trace_dir}, {nprocs} ranks ran"
    cap = read_capture(files)
    check_hijack(cap)
    qps = devx_qps(cap)
    assert qps, "no DevX CREATE_QP recorded (mlx5 provider)"
    ndb, per = check_doorbells(cap, qps)
    ops, ok = check_wqes(cap, qps, required, allowed)
    lost = check_losses(cap, ok)
    check_report(trace_dir, tmp_path)
    print(f"\n  doorbells={ndb} qps_rung={len(per)} devx_qps={len(qps)} wqebb_verified={ok} lost={lost} "
          f"opcodes={ {hex(k): v for k, v in sorted(ops.items())} }")
    return cap


# ---- NVSHMEM perftests -----------------------------------------------------------------------------
NVSHMEM_ENV = {"NVSHMEM_IB_ENABLE_IBGDA": "1",
               # two PEs on one node would talk over NVLink/P2P: force the IB transport
               "NVSHMEM_DISABLE_P2P": "1"}


def nvshmem_env(kind):
    env = {k: os.environ.get(k, v) for k, v in NVSHMEM_ENV.items()}
    for k, v in os.environ.items():  # the user's NVSHMEM_* settings win and travel to every rank
        if k.startswith(("NVSHMEM_", "NVSHMEMTEST_")):
            env[k] = v
    if kind == "mpi":
        env.setdefault("NVSHMEMTEST_USE_MPI_LAUNCHER", "1")  # perftests bootstrap through MPI
    return env


@pytest.mark.parametrize("op", sorted(PERFTESTS))
def test_nvshmem_perftest_ibgda(tmp_path, op):
    name, required, allowed = PERFTESTS[op]
    why = node_reasons(min_gpus=2)
    binary = find_perftest(name)
    if binary is None:
        where = ", ".join(str(d) for d in perftest_dirs()) or "no candidate directory exists"
        why.append(f"NVSHMEM perftest {name} not found (set SIGMATRACE_NVSHMEM_PERFTEST_DIR or NVSHMEM_HOME; "
                   f"searched $SIGMATRACE_NVSHMEM_PERFTEST_DIR, $NVSHMEM_HOME, /usr/local/nvshmem, /opt/nvidia/nvshmem, "
                   f"/usr/lib/*/nvshmem/*, HPC SDK comm_libs, each with {', '.join(s or '.' for s in PERFTEST_SUBDIRS)}: "
                   f"{where})")
    launcher, kind = find_launcher()
    if launcher is None:
        why.append(kind)
    skip_if(why)
    prog = [str(binary), *shlex.split(os.environ.get("SIGMATRACE_NVSHMEM_PERFTEST_ARGS", ""))]
    env = nvshmem_env(kind)
    rc, out = run(launcher + rank_cmd(prog, None, env))
    ok, rows = perftest_success(rc, out)
    if not ok:
        pytest.skip(f"untraced {name} does not succeed on this node (rc={rc}); environment, not tracer: "
                    f"{out[-1500:]}")
    tdir = outdir(tmp_path, f"trace-{op}")
    rc, tout = run(launcher + rank_cmd(prog, tdir, env))
    tok, trows = perftest_success(rc, tout)
    assert tok, f"traced {name} failed (rc={rc}): {tout[-3000:]}"
    assert [s for s, _ in trows] == [s for s, _ in rows], "traced run measured other sizes than the untraced run"
    check_ibgda_trace(tdir, tmp_path, required, allowed)


# ---- nccl-tests ------------------------------------------------------------------------------------
def find_nccl_test(name="all_reduce_perf"):
    dirs = []
    if os.environ.get("SIGMATRACE_NCCL_TESTS_DIR"):
        dirs.append(Path(os.environ["SIGMATRACE_NCCL_TESTS_DIR"]))
    if os.environ.get("NCCL_TESTS_HOME"):
        dirs += [Path(os.environ["NCCL_TESTS_HOME"]) / "build", Path(os.environ["NCCL_TESTS_HOME"])]
    dirs += [Path("/opt/nccl-tests/build"), Path("/usr/local/nccl-tests/build"), Path("/workspace/nccl-tests/build")]
    for d in dirs:
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return d / name
    hit = shutil.which(name)
    return Path(hit) if hit else None


def test_nccl_all_reduce_over_ib(tmp_path):
    why = node_reasons(min_gpus=2)
    binary = find_nccl_test()
    if binary is None:
        why.append("nccl-tests all_reduce_perf not found (set SIGMATRACE_NCCL_TESTS_DIR; searched it, "
                   "$NCCL_TESTS_HOME[/build], /opt/nccl-tests/build, /usr/local/nccl-tests/build, "
                   "/workspace/nccl-tests/build, PATH)")
    launcher, kind = find_launcher()
    if launcher is None:
        why.append(kind)
    skip_if(why)
    # one GPU per rank; the network (IB verbs) transport even between ranks of one node
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
    env = {k: os.environ.get(k, v) for k, v in env.items()}
    env.update({k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    prog = [str(binary), "-b", "8", "-e", "1M", "-f", "4", "-g", "1", "-n", "20", "-w", "5"]
    rc, out = run(launcher + rank_cmd(prog, None, env))
    if rc != 0 or "Out of bounds values : 0 OK" not in out:
        pytest.skip(f"untraced all_reduce_perf does not succeed on this node (rc={rc}); environment, not tracer: "
                    f"{out[-1500:]}")
    tdir = outdir(tmp_path, "trace-nccl")
    rc, tout = run(launcher + rank_cmd(prog, tdir, env))
    assert rc == 0 and "Out of bounds values : 0 OK" in tout, f"traced all_reduce_perf failed: {tout[-3000:]}"
    from sigmatrace.format import read_capture
    files = trace_files(tdir)
    assert len(files) >= 2, f"{len(files)} trace files for 2 ranks"
    cap = read_capture(files)
    procs = sorted(set(cap.table("IBV_CREATE_QP")["process"].tolist()))
    assert len(procs) >= 2, f"QPs created by {len(procs)} process(es), 2 ranks ran"
    cq = cap.table("IBV_CREATE_QP")
    own = collections.defaultdict(set)
    for p, q in zip(cq["process"].tolist(), cq["qpn"].tolist()):
        own[int(p)].add(int(q))
    ps = cap.table("IBV_POST_SEND")
    assert len(ps["tsc"]) > 0, "no IBV_POST_SEND recorded"
    for p in procs:
        m = ps["process"] == p
        assert m.any(), f"rank process {p}: no IBV_POST_SEND"
        assert set(ps["qpn"][m].tolist()) <= own[p], f"process {p} posted on a QP it did not create"
    mq = cap.table("IBV_MODIFY_QP")
    rtr = mq["state"] == IBV_QPS_RTR
    assert rtr.any(), "no QP moved to RTR"
    for p, d in zip(mq["process"][rtr].tolist(), mq["dest_qpn"][rtr].tolist()):
        others = set().union(*(own[o] for o in procs if o != p))
        assert int(d) in others, f"process {p}: RTR dest_qpn {int(d):#x} is no QP of another rank"
    check_report(tdir, tmp_path)
    print(f"\n  IBV_POST_SEND={len(ps['tsc'])} qps={ {p: len(own[p]) for p in procs} } rtr={int(rtr.sum())}")


# ---- DeepEP ----------------------------------------------------------------------------------------
def find_deepep_test():
    cands = []
    if os.environ.get("SIGMATRACE_DEEPEP_TEST"):
        cands.append(Path(os.environ["SIGMATRACE_DEEPEP_TEST"]))
    if os.environ.get("DEEPEP_HOME"):
        cands.append(Path(os.environ["DEEPEP_HOME"]) / "tests" / "test_low_latency.py")
    try:
        spec = subprocess.run([sys.executable, "-c", "import deep_ep, os; print(os.path.dirname(deep_ep.__file__))"],
                              capture_output=True, text=True, timeout=120)
        if spec.returncode == 0 and spec.stdout.strip():
            pkg = Path(spec.stdout.strip().splitlines()[-1])
            cands += [pkg.parent / "tests" / "test_low_latency.py", pkg.parent.parent / "tests" / "test_low_latency.py"]
    except (OSError, subprocess.SubprocessError):
        pass
    for c in cands:
        if c.is_file():
            return c
    return None


def deepep_importable():
    try:
        p = subprocess.run([sys.executable, "-c", "import deep_ep"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    return p.returncode == 0, (p.stderr.strip().splitlines() or ["?"])[-1]


def test_deepep_low_latency_ibgda(tmp_path):
    why = node_reasons(min_gpus=2)
    ok, err = deepep_importable()
    script = None
    if not ok:
        why.append(f"DeepEP not installed (python -c 'import deep_ep': {err})")
    else:
        script = find_deepep_test()
        if script is None:
            why.append("deep_ep imports but DeepEP's tests/test_low_latency.py was not found "
                       "(set SIGMATRACE_DEEPEP_TEST or DEEPEP_HOME)")
    skip_if(why)
    args = shlex.split(os.environ.get("SIGMATRACE_DEEPEP_ARGS", "--num-processes 2"))
    prog = [sys.executable, str(script), *args]
    env = {k: v for k, v in os.environ.items() if k.startswith("NVSHMEM_")}
    env.setdefault("NVSHMEM_IB_ENABLE_IBGDA", "1")  # DeepEP sets it itself; harmless
    # DeepEP spawns its ranks itself (torch.multiprocessing): no launcher
    rc, out = run(rank_cmd(prog, None, env))
    if rc != 0 or ERROR_WORD.search(out):
        pytest.skip(f"untraced DeepEP low-latency test does not succeed on this node (rc={rc}); environment, not "
                    f"tracer: {out[-1500:]}")
    tdir = outdir(tmp_path, "trace-deepep")
    rc, tout = run(rank_cmd(prog, tdir, env))
    assert rc == 0 and not ERROR_WORD.search(tout), f"traced DeepEP test failed (rc={rc}): {tout[-3000:]}"
    check_ibgda_trace(tdir, tmp_path, {OP_RDMA_WRITE}, HOUSEKEEPING | ATOMICS | {OP_RDMA_WRITE_IMM, OP_RDMA_READ},
                      nprocs=2)
