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
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from sigmatrace import _native

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "native" / "tests" / "nvshmem" / "nvshmem_lat.cu"
ITERS, WARMUP = 2000, 200


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


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if REASON:
        pytest.skip(REASON)
    home = _nvshmem_home()
    lib = home / "lib"
    if not (lib / "libnvshmem_host.so").exists():
        link = tmp_path_factory.mktemp("nvshlib") / "libnvshmem_host.so"
        link.symlink_to(lib / "libnvshmem_host.so.3")
        extra = [f"-L{link.parent}"]
    else:
        extra = []
    out = tmp_path_factory.mktemp("nvshbin") / "nvshmem_lat"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    r = subprocess.run([nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-rdc=true", f"-I{home / 'include'}", str(SRC),
                        "-o", str(out), *extra, f"-L{lib}", "-lnvshmem_host", "-lnvshmem_device", "-lcudart",
                        f"-Xlinker=-rpath={lib}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def run_pes(binary, tmp, handler, traced, fabric):
    emu = _emu()
    home = _nvshmem_home()
    stats = tmp / "stats"
    stats.mkdir()
    trace = tmp / "trace"
    idf = tmp / "uid.bin"
    procs = []
    for pe in (0, 1):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env.update(LD_LIBRARY_PATH=f"{emu / 'emu'}:{home / 'lib'}:" + env.get("LD_LIBRARY_PATH", ""),
                   SIGMATRACE_EMU_FABRIC=fabric, SIGMATRACE_EMU_LID=str(16 + pe), SIGMATRACE_EMU_DC="1",
                   SIGMATRACE_EMU_STATS=f"{stats}/emu-stats.%p.json", NVSHMEM_DISABLE_DATA_DIRECT="1",
                   NVSHMEM_IB_ENABLE_IBGDA="1", NVSHMEM_DISABLE_P2P="1", NVSHMEM_IBGDA_NIC_HANDLER=handler,
                   NVSHMEM_IBGDA_FORCE_NIC_BUF_MEMTYPE="hostmem", NVSHMEM_HCA_LIST="mlx5_0",
                   NVSHMEM_DISABLE_NVLS="1", NVSHMEM_DEBUG=os.environ.get("NVSHMEM_DEBUG", "WARN"),
                   NVSHMEM_BOOTSTRAP="UID", NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME="lo", NVSHMEM_DISABLE_NCCL="1")
        preload = []
        if handler == "gpu":
            preload.append(str(emu / "emu" / "libsigmatrace_emu_cudashim.so"))
        if traced:
            preload.append(str(emu / "libsigmatrace.so"))
            env.update(SIGMATRACE_OUTPUT_DIR=str(trace), SIGMATRACE_MODE="full")
        if preload:
            env["LD_PRELOAD"] = " ".join(preload)
        argv = [str(binary), str(pe), "2", str(idf), str(ITERS), str(WARMUP), "8"]
        if (emu / "emu" / "st-emu-ns").exists() and os.geteuid() == 0:
            argv = [str(emu / "emu" / "st-emu-ns"), *argv]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, _ = p.communicate()
            o += "\n[killed after 240 s]"
        outs.append((p.returncode, o))
    for f in Path("/dev/shm").glob(f"sigmatrace-emu.{fabric}.*"):
        shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)
    (tmp / "output.txt").write_text("\n=====\n".join(o for _, o in outs))
    nic = {}
    for f in stats.glob("emu-stats.*.json"):
        d = json.loads(f.read_text())
        nic[d["pid"]] = d
    return outs, trace, nic


# NVSHMEM 3.4.5 names the proxy (CPU) handler without GDRCopy "cpu_host_memory" ("cpu" requires GDRCopy)
@pytest.mark.parametrize("handler", ["cpu_host_memory", "gpu"])
def test_nvshmem_ibgda_traced(binary, tmp_path, handler):
    report = {"handler": handler}
    for traced in (False, True):
        tmp = tmp_path / ("traced" if traced else "untraced")
        tmp.mkdir()
        outs, trace, nic = run_pes(binary, tmp, handler, traced, f"nvsh{os.getpid()}{handler}{int(traced)}")
        text = "\n".join(o for _, o in outs)
        lat = [l for l in text.splitlines() if l.startswith("LAT ")]
        report["traced" if traced else "untraced"] = dict(rc=[rc for rc, _ in outs], lat=lat,
                                                          nic={d["pid"]: d.get("wqes_by_opcode") for d in nic.values()})
        print("NVSHMEM_REPORT " + json.dumps(report))
        assert all(rc == 0 for rc, _ in outs), text[-6000:]
        assert text.count("RESULT OK") == 2, text[-6000:]
        if not traced:
            continue
        from sigmatrace.correlate import correlate
        corr = correlate(trace, workers=2)
        db = corr.tables["doorbells"]
        ops = corr.tables["ops"]
        P = corr.tables["processes"]
        report["doorbells"] = int(len(db["doorbell_id"]))
        report["complete"] = int(db["complete"].sum())
        print("NVSHMEM_REPORT " + json.dumps(report))
        assert len(db["doorbell_id"]) > 0, "no doorbell recorded"
        assert bool(db["complete"].all()), "doorbells whose WQEs were not all recovered"
        for i, pid in enumerate(P["pid"]):
            truth = nic.get(int(pid))
            if truth is None:
                continue
            mine = ops["process"] == i
            got = Counter(int(c) for c in ops["opcode"][mine])
            from sigmatrace.mlx5.verbs import DATA_OPS      # NOP, DUMP (consistency) carry no data: no op
            want = {int(k, 16): v for k, v in truth["wqes_by_opcode"].items() if int(k, 16) in DATA_OPS}
            assert {k: v for k, v in got.items()} == want, (int(pid), dict(got), want)
