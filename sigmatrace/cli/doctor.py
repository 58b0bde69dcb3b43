"""`sigmatrace doctor`: what was built, and what this machine has."""
import ctypes.util
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

from .. import __version__, _native

# (what, sonames to look for) — the libraries the providers interpose on.
LIBRARIES = {
    "libibverbs": ["libibverbs.so.1"],
    "libmlx5": ["libmlx5.so.1"],
    "libfabric": ["libfabric.so.1"],
    "ucx (libucp)": ["libucp.so.0"],
    "cuda driver": ["libcuda.so.1"],
    "cuda runtime": ["libcudart.so.13", "libcudart.so.12", "libcudart.so"],
    "nvshmem": ["libnvshmem_host.so.3", "libnvshmem_host.so"],
    "nccl": ["libnccl.so.2"],
}
CPU_FLAGS = ("waitpkg", "monitorx", "constant_tsc", "nonstop_tsc", "rdtscp", "sse4_2")


def _ldconfig_libs():
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2:
            found.setdefault(parts[0].split()[0], parts[1])
    return found


def libraries():
    known = _ldconfig_libs()
    result = {}
    for what, names in LIBRARIES.items():
        path = next((known[n] for n in names if n in known), None)
        if path is None:
            base = names[0].split(".so")[0].removeprefix("lib")
            hit = ctypes.util.find_library(base)
            path = hit
        result[what] = path
    return result


def cpu_features():
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    feats = {f: f in flags for f in CPU_FLAGS}
    if feats["waitpkg"]:
        feats["doorbell_wait"] = "umonitor/umwait"
    elif feats["monitorx"]:
        feats["doorbell_wait"] = "monitorx/mwaitx"
    else:
        feats["doorbell_wait"] = "spin with pause and bounded back-off"
    return feats


def gpus():
    out = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=index,name,uuid,pci.bus_id", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            for line in r.stdout.strip().splitlines():
                idx, name, uuid, bus = [x.strip() for x in line.split(",")]
                out.append({"ordinal": int(idx), "name": name, "uuid": uuid, "pci_bus_id": bus})
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return out


def rdma_devices():
    root = Path("/sys/class/infiniband")
    devs = []
    if root.is_dir():
        for d in sorted(root.iterdir()):
            guid = (d / "node_guid").read_text().strip() if (d / "node_guid").exists() else None
            devs.append({"name": d.name, "node_guid": guid})
    return devs


def collect():
    lib = _native.tracer_library()
    return {
        "version": __version__,
        "tracer_library": str(lib) if lib else None,
        "build": _native.build_info(),
        "emulated_hca": str(_native.find("libibverbs.so.1") or "") or None,
        "libraries": libraries(),
        "cpu": cpu_features(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "gpus": gpus(),
        "rdma_devices": rdma_devices(),
        "ptp_clocks": sorted(str(p) for p in Path("/dev").glob("ptp*")),
        "trace_processor": os.environ.get("SIGMATRACE_TRACE_PROCESSOR") or shutil.which("trace_processor"),
    }


def run(args):
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"sigmatrace {info['version']}")
    print(f"  tracer library : {info['tracer_library'] or 'NOT BUILT (pip install . builds it)'}")
    b = info["build"] or {}
    print(f"  built providers: {', '.join(b.get('providers', [])) or 'none'}")
    print(f"  emulated HCA   : {info['emulated_hca'] or 'not built'}")
    print("  libraries:")
    for what, path in info["libraries"].items():
        print(f"    {what:14s} {path or '-'}")
    c = info["cpu"]
    print(f"  cpu            : {info['machine']}, " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in c.items()
                                                        if isinstance(v, bool)))
    print(f"  doorbell poller: {c['doorbell_wait']}")
    print(f"  GPUs           : {', '.join(g['name'] for g in info['gpus']) or 'none'}")
    print(f"  RDMA devices   : {', '.join(d['name'] for d in info['rdma_devices']) or 'none'}")
    print(f"  PTP clocks     : {', '.join(info['ptp_clocks']) or 'none'}")
    print(f"  trace_processor: {info['trace_processor'] or 'not found (PerfettoSQL queries unavailable)'}")
    return 0


def register(sub):
    p = sub.add_parser("doctor", help="report what was built and what this machine has")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
