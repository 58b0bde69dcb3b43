"""Real NVSHMEM 3.4.5 IBGDA over the emulated HCA on one GPU, traced (marker gpu; native/tests/run_nvshmem.sh).

Two PEs on the one GPU (two processes, CUDA MPS, NVSHMEM_DISABLE_P2P=1 so traffic takes the transport),
bootstrapped with a unique id (no MPI); NVSHMEM's IBGDA transport over the emulated HCA (DevX QPs, DCTs,
umems; docs/emulator.md "NVSHMEM's IBGDA transport").  Our latency program on NVSHMEM's public API
(native/tests/nvshmem/nvshmem_lat.cu: put + quiet, get, fetch-add, ping-pong, timed with %globaltimer)
runs untraced and traced with the CPU NIC handler (NVSHMEM's proxy thread rings the doorbells: the F24d
path) and the GPU handler (the kernel rings them through the UAR: the F8 path; the test-only CUDA shim
lets the real driver map the emulator's UAR page as I/O memory).  Checked: data correct traced and
untraced; doorbells recorded with their WQEs recovered; the trace equals the emulated NIC's own count of
the WQEs it executed, opcode for opcode.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from native_util import restart_mps
from sigmatrace import _native

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "native" / "tests" / "nvshmem" / "nvshmem_lat.cu"
ITERS, WARMUP = 2000, 200
PE_TIMEOUT = 240


def _emu():
    for d in _native.candidate_dirs():
        if (d / "libsigmatrace.so").exists() and (d / "emu" / "libibverbs.so.1").exists():
            return d
    return None


def _nvshmem_home():
    home = os.environ.get("NVSHMEM_HOME")
    if home and Path(home, "include", "nvshmem.h").exists():
        return Path(home)
    try:
        import nvidia.nvshmem as m
        for p in m.__path__:
            if Path(p, "include", "nvshmem.h").exists():
                return Path(p)
    except ImportError:
        pass
    return None


def _reason():
    if not Path("/dev/nvidia0").exists() and not Path("/dev/nvidiactl").exists():
        return "no NVIDIA GPU device node (/dev/nvidia0) on this machine"
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        return "nvcc not found"
    if _nvshmem_home() is None:
        return "NVSHMEM (headers + libnvshmem_host/device) not found: set NVSHMEM_HOME or install nvidia-nvshmem"
    if _emu() is None:
        return "native build with the emulated HCA missing (cmake -S native -B build/dev)"
    return None


REASON = _reason()


def build(out_dir):
    """nvcc of the latency program against the NVSHMEM found (the benchmark uses it too)."""
    home = _nvshmem_home()
    lib = home / "lib"
    out_dir = Path(out_dir)
    extra = []
    if not (lib / "libnvshmem_host.so").exists():
        link = out_dir / "libnvshmem_host.so"
        if not link.exists():
            link.symlink_to(lib / "libnvshmem_host.so.3")
        extra = [f"-L{out_dir}"]
    out = out_dir / "nvshmem_lat"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    r = subprocess.run([nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-rdc=true", f"-I{home / 'include'}", str(SRC),
                        "-o", str(out), *extra, f"-L{lib}", "-lnvshmem_host", "-lnvshmem_device", "-lcudart",
                        f"-Xlinker=-rpath={lib}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if REASON:
        pytest.skip(REASON)
    return build(tmp_path_factory.mktemp("nvshbin"))


def pe_env(pe, handler, fabric, stats, trace=None, mode="simple", hijack_mode=None, dc=True):
    """The environment of PE `pe`: the emulated HCA first on the library path, NVSHMEM's IBGDA transport with
    `handler`, the CUDA shim for the GPU handler, the tracer (SIGMATRACE_MODE `mode`, SIGMATRACE_HIJACK_MODE
    `hijack_mode`) when `trace` is given."""
    emu, home = _emu(), _nvshmem_home()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=f"{emu / 'emu'}:{home / 'lib'}:" + env.get("LD_LIBRARY_PATH", ""),
               SIGMATRACE_EMU_FABRIC=fabric, SIGMATRACE_EMU_LID=str(16 + pe),
               SIGMATRACE_EMU_STATS=f"{stats}/emu-stats.%p.json", NVSHMEM_DISABLE_DATA_DIRECT="1",
               NVSHMEM_IB_ENABLE_IBGDA="1", NVSHMEM_DISABLE_P2P="1", NVSHMEM_IBGDA_NIC_HANDLER=handler,
               NVSHMEM_IBGDA_FORCE_NIC_BUF_MEMTYPE="hostmem", NVSHMEM_HCA_LIST="mlx5_0",
               NVSHMEM_DISABLE_NVLS="1", NVSHMEM_DEBUG=os.environ.get("NVSHMEM_DEBUG", "WARN"),
               NVSHMEM_BOOTSTRAP="UID", NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME="lo", NVSHMEM_DISABLE_NCCL="1")
    if dc:
        env["SIGMATRACE_EMU_DC"] = "1"
    else:
        env.pop("SIGMATRACE_EMU_DC", None)
    preload = []
    if handler == "gpu":
        preload.append(str(emu / "emu" / "libsigmatrace_emu_cudashim.so"))
    if trace is not None:
        preload.append(str(emu / "libsigmatrace.so"))
        env.update(SIGMATRACE_OUTPUT_DIR=str(trace), SIGMATRACE_MODE=mode)
        if hijack_mode:
            env["SIGMATRACE_HIJACK_MODE"] = hijack_mode
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env


def run_pes(binary, tmp, handler, traced, fabric, iters=ITERS, warmup=WARMUP, mode="simple", hijack_mode=None,
            dc=True, kill_pe1_after=None, timeout=PE_TIMEOUT, extra_env=None):
    """Both PEs, to the end (or killed after `timeout` s); `kill_pe1_after`: SIGKILL PE 1 once PE 0 printed a
    line starting with it.  (outputs [(rc, text)], trace dir, {pe: the emulated NIC's stats})."""
    emu = _emu()
    tmp = Path(tmp)
    stats = tmp / "stats"
    stats.mkdir()
    trace = tmp / "trace"
    idf = tmp / "uid.bin"
    procs = []
    for pe in (0, 1):
        env = pe_env(pe, handler, fabric, stats, trace if traced else None, mode, hijack_mode, dc)
        env.update(extra_env or {})
        argv = [str(binary), str(pe), "2", str(idf), str(iters), str(warmup), "8"]
        if (emu / "emu" / "st-emu-ns").exists() and os.geteuid() == 0:
            argv = [str(emu / "emu" / "st-emu-ns"), *argv]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    texts = ["", ""]
    if kill_pe1_after:
        for line in procs[0].stdout:
            texts[0] += line
            if line.startswith(kill_pe1_after):
                procs[1].kill()
                break
    outs = []
    for i, p in enumerate(procs):
        try:
            o, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            (tmp / f"hang-pe{i}.txt").write_text(snapshot(p.pid))
            p.terminate()          # the tracer's handler writes the trace out, then the signal ends it
            try:
                o, _ = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                o, _ = p.communicate()
            o += f"\n[terminated after {timeout} s]"
        outs.append((p.returncode, texts[i] + o))
    for f in Path("/dev/shm").glob(f"sigmatrace-emu.{fabric}.*"):
        shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)
    if kill_pe1_after or any(rc is None or rc < 0 for rc in (p.returncode for p in procs)):
        restart_mps()
    (tmp / "output.txt").write_text("\n=====\n".join(o for _, o in outs))
    nic = {}
    for f in stats.glob("emu-stats.*.json"):
        d = json.loads(f.read_text())
        nic[int(d["lid"]) - 16] = d
    return outs, trace, nic


def _descendants(pid):
    kids = {}
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = st.read_text().rsplit(")", 1)[1].split()
            kids.setdefault(int(f[1]), []).append(int(st.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def snapshot(pid):
    """What a hung process tree is doing, for the hang hunt: per thread its name, state, kernel wait channel and
    system call, and every thread's stack where gdb or eu-stack is installed."""
    lines = []
    for p in _descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
        except OSError:
            cmd = b"(gone)"
        lines.append(f"== pid {p}: {cmd!r}")
        for t in sorted(Path(f"/proc/{p}/task").glob("*"), key=lambda x: int(x.name)):
            def rd(n):
                try:
                    return (t / n).read_text().strip()
                except OSError:
                    return "?"
            f = rd("stat").rsplit(")", 1)[-1].split()
            cpu = f"utime {f[11]} stime {f[12]} cpu {f[36]}" if len(f) > 36 else ""
            lines.append(f"  tid {t.name} {rd('comm')!r} state {f[:1]} {cpu} wchan {rd('wchan')} "
                         f"syscall {rd('syscall')[:60]}")
        for tool in (["gdb", "-p", str(p), "-batch", "-ex", "thread apply all bt 25"], ["eu-stack", "-p", str(p)]):
            if shutil.which(tool[0]):
                try:
                    r = subprocess.run(tool, capture_output=True, text=True, timeout=60)
                    lines.append(r.stdout[-60000:] + r.stderr[-2000:])
                except subprocess.TimeoutExpired:
                    lines.append(f"{tool[0]} timed out")
                break
    return "\n".join(lines)


def lat_lines(text):
    """{op: p50_ns} of PE 0's LAT lines (the emulator's log may share the line's start)."""
    out = {}
    for m in re.finditer(r"LAT op=(\w+) pe=0 .*?p50_ns=(\d+)", text):
        out[m.group(1)] = int(m.group(2))
    return out


def program_ops(iters=ITERS, warmup=WARMUP):
    """{pe: {mlx5 opcode: (WQEs, bytes)}} the latency program asks NVSHMEM for: PE 0 puts 8 B (RDMA WRITE),
    gets 8 B (READ), fetch-adds 8 B (ATOMIC_FA) and ping-pongs a 4-byte flag (inline WRITE); PE 1 answers the
    ping-pong.  NVSHMEM's barriers (masked compare-swap on the DCI) come on top; their number is NVSHMEM's."""
    n = iters + warmup
    return {0: {0x08: (2 * n, n * 8 + n * 4), 0x10: (n, n * 8), 0x12: (n, n * 8)}, 1: {0x08: (n, n * 4)}}


def pe_of_process(P, nic):
    by_pid = {int(d["pid"]): pe for pe, d in nic.items()}
    return {i: by_pid.get(int(pid)) for i, pid in enumerate(P["pid"])}


# NVSHMEM 3.4.5 names the proxy (CPU) handler without GDRCopy "cpu_host_memory" ("cpu" requires GDRCopy)
@pytest.mark.parametrize("handler", ["cpu_host_memory", "gpu"])
def test_nvshmem_ibgda_traced(binary, tmp_path, handler):
    """Untraced and traced: the program's data checks pass.  Traced: every doorbell's WQEs recovered; per PE
    the operations equal the emulated NIC's own count opcode for opcode and in bytes, and the program's
    iterations exactly; every remote key and address names a memory region the *peer* registered; every
    data operation of an RC QP is matched to the peer process."""
    from sigmatrace.correlate import correlate
    from sigmatrace.mlx5.verbs import DATA_OPS      # NOP, DUMP (consistency) carry no data: no op
    report = {"handler": handler}
    for traced in (False, True):
        tmp = tmp_path / ("traced" if traced else "untraced")
        tmp.mkdir()
        outs, trace, nic = run_pes(binary, tmp, handler, traced, f"nvsh{os.getpid()}{handler}{int(traced)}")
        text = "\n".join(o for _, o in outs)
        report["traced" if traced else "untraced"] = dict(rc=[rc for rc, _ in outs], lat=lat_lines(text),
                                                          nic={pe: d.get("wqes_by_opcode") for pe, d in nic.items()})
        print("NVSHMEM_REPORT " + json.dumps(report))
        assert all(rc == 0 for rc, _ in outs), text[-6000:]
        assert text.count("RESULT OK") == 2, text[-6000:]
        assert set(nic) == {0, 1}, "the emulated NIC wrote no stats"
        want = program_ops()
        for pe in (0, 1):      # the emulator saw what the program asked for (the ground truth is sound)
            for op, (n, b) in want[pe].items():
                assert nic[pe]["wqes_by_opcode"].get(f"0x{op:02x}") == n, (pe, op, nic[pe]["wqes_by_opcode"])
                assert nic[pe]["bytes_by_opcode"].get(f"0x{op:02x}") == b, (pe, op, nic[pe]["bytes_by_opcode"])
        if not traced:
            continue
        corr = correlate(trace, workers=2)
        db, ops, P = corr.tables["doorbells"], corr.tables["ops"], corr.tables["processes"]
        report["doorbells"] = int(len(db["doorbell_id"]))
        report["complete"] = int(db["complete"].sum())
        print("NVSHMEM_REPORT " + json.dumps(report))
        assert len(db["doorbell_id"]) > 0, "no doorbell recorded"
        assert bool(db["complete"].all()), "doorbells whose WQEs were not all recovered"
        pes = pe_of_process(P, nic)
        assert sorted(v for v in pes.values() if v is not None) == [0, 1], pes
        proc_of = {pe: i for i, pe in pes.items()}
        for i, pe in pes.items():
            mine = ops["process"] == i
            oc = ops["opcode"][mine].astype(int)
            got = Counter(oc.tolist())
            truth = {int(k, 16): v for k, v in nic[pe]["wqes_by_opcode"].items() if int(k, 16) in DATA_OPS}
            assert dict(got) == truth, (pe, dict(got), truth)
            got_b = {op: int(ops["bytes"][mine][oc == op].sum()) for op in got}
            truth_b = {int(k, 16): v for k, v in nic[pe]["bytes_by_opcode"].items() if int(k, 16) in DATA_OPS}
            assert got_b == truth_b, (pe, got_b, truth_b)
            for op, (n, b) in program_ops()[pe].items():
                assert got[op] == n and got_b[op] == b, (pe, op, got[op], got_b[op], n, b)
            peer = 1 - pe
            mrs = nic[peer]["mrs"]
            rk = ops["rkey"][mine].astype(np.int64)
            ra = ops["raddr"][mine].astype(np.uint64)
            for op_rkey, op_raddr in set(zip(rk.tolist(), ra.tolist())):
                hit = [m for m in mrs if m["rkey"] == op_rkey]
                assert hit, (pe, hex(op_rkey), "not a key the peer registered", [hex(m["rkey"]) for m in mrs])
                assert any(m["addr"] <= op_raddr < m["addr"] + m["length"] for m in hit), (pe, hex(op_raddr))
            data = np.isin(oc, list(program_ops()[pe]))
            dst = ops["dst_process"][mine][data]
            assert (dst == proc_of[peer]).all(), (pe, Counter(dst.tolist()))


def test_nvshmem_pe_killed_mid_run(binary, tmp_path):
    """PE 1 killed (SIGKILL) after PE 0 finished its puts: PE 0 ends (by NVSHMEM's own error or, if it waits
    for its dead peer, by SIGTERM after a bound), both traces are readable, PE 1's committed doorbells are in
    it, and the report says which process ended early."""
    from sigmatrace.correlate import correlate
    from sigmatrace.report import build_report
    outs, trace, nic = run_pes(binary, tmp_path, "gpu", True, f"nvshk{os.getpid()}", kill_pe1_after="LAT op=put",
                               timeout=60)
    text = "\n".join(o for _, o in outs)
    print("NVSHMEM_KILLED " + json.dumps(dict(rc=[rc for rc, _ in outs], tail=text[-1500:])))
    assert outs[1][0] == -9, text[-4000:]
    corr = correlate(trace, workers=1)
    P, db = corr.tables["processes"], corr.tables["doorbells"]
    assert len(P["pid"]) == 2, P
    # neither PE wrote the emulator's stats (SIGKILL; SIGTERM ends PE 0 before atexit): PE 1 is the one
    # process without END -- PE 0 ends by NVSHMEM's error or by SIGTERM, both of which the tracer closes
    pe1 = [int(i) for i in np.flatnonzero(~P["complete"])]
    assert len(pe1) == 1, (P["pid"], P["complete"])
    assert (db["process"] == pe1[0]).sum() > 0, "none of the killed PE's doorbells survived"
    L = corr.tables["losses"]
    assert [int(p) for k, p in zip(L["kind"], L["process"]) if k == "incomplete_process"] == pe1, L
    try:
        import duckdb  # noqa: F401  (the report's query engine; the GPU machine's venv may lack it)
    except ImportError:
        print("NVSHMEM_KILLED report not built: duckdb is not installed here")
        return
    _, summary, _ = build_report(trace, tmp_path / "rep", workers=1, figures=False, perfetto=False, quiet=True)
    assert summary["losses"]["incomplete_processes"] == [pe1[0]], summary["losses"]
    r = subprocess.run([sys.executable, "-m", "sigmatrace", "report", str(trace), "-o", str(tmp_path / "rep2"),
                        "--no-figures", "--no-perfetto"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"ended early: pid {int(P['pid'][pe1[0]])}" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
def test_nvshmem_init_without_dc_fails_with_its_own_error(binary, tmp_path, traced):
    """An HCA without DC (SIGMATRACE_EMU_DC unset): NVSHMEM's IBGDA set-up needs DCTs and fails; NVSHMEM's own
    error ends both PEs within the bound, the same traced and untraced (never a hang)."""
    outs, _, _ = run_pes(binary, tmp_path, "cpu_host_memory", traced, f"nvshd{os.getpid()}{int(traced)}", dc=False,
                         timeout=45)
    text = "\n".join(o for _, o in outs)
    print("NVSHMEM_NODC " + json.dumps(dict(traced=traced, rc=[rc for rc, _ in outs], tail=text[-2000:])))
    assert "terminated after" not in text, text[-4000:]
    assert all(rc != 0 for rc, _ in outs) or text.count("RESULT OK") == 2, text[-4000:]
