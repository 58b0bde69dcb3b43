"""`sigmatrace doctor`: what was built, and what this machine has."""
import ctypes.util
import json
import os
import platform
import re
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


HIJACK_MODES = ("off", "forward", "blocking", "nonblocking", "sync", "guarded")
HIJACK_DEFAULT_MODE = "guarded"
POLLER_ENV = ("SIGMATRACE_HIJACK_MODE", "SIGMATRACE_HIJACK_GUARD", "SIGMATRACE_POLLER_CPUS",
              "SIGMATRACE_POLLER_SPIN_US", "SIGMATRACE_POLLER_MAX_SLEEP_US", "SIGMATRACE_POLLER_WAIT")


def _c_atoi(v):
    """C atoi(): leading integer, else 0 (how native/src/hijack reads these variables)."""
    m = re.match(r"\s*([+-]?\d+)", v or "")
    return int(m.group(1)) if m else 0


def poller_cpus(value):
    """SIGMATRACE_POLLER_CPUS as the hijack parses it: 'a,b' and 'a-b' items, at most 64 cpus."""
    cpus = []
    for item in value.split(","):
        m = re.match(r"\s*(-?\d+)(?:-(-?\d+))?", item)
        if not m:
            continue
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        for c in range(a, b + 1):
            if len(cpus) < 64:
                cpus.append(c)
    return cpus[:64]


def hijack_info(build, cpu):
    """Whether the tracer can hijack GPU doorbells, and the poller settings it would use."""
    provs = set((build or {}).get("providers", []))
    if "cuda" in provs and "mlx5" in provs:
        built = "yes (cuda + mlx5 providers)"
    elif "cuda" in provs:
        built = "partial (cuda provider without mlx5: doorbells found only from IOMEMORY registrations, no WQE recovery)"
    else:
        built = "no (the tracer was built without the cuda provider)"
    env = {k: os.environ[k] for k in POLLER_ENV if k in os.environ}
    asked = env.get("SIGMATRACE_HIJACK_MODE") or HIJACK_DEFAULT_MODE
    mode, note = asked, ""
    if asked in ("0", "none") or os.environ.get("SIGMATRACE_HIJACK") == "0":
        mode = "off"
    elif asked not in HIJACK_MODES:
        mode, note = HIJACK_DEFAULT_MODE, f"unknown SIGMATRACE_HIJACK_MODE={asked!r}, default used"
    info = {"built": built, "cuda_provider": "cuda" in provs, "mlx5_provider": "mlx5" in provs, "mode": mode,
            "mode_note": note, "env": env}
    g = _c_atoi(env.get("SIGMATRACE_HIJACK_GUARD", "10"))
    info["guard_pct"] = g if 1 <= g <= 100 else 10
    wait = cpu["doorbell_wait"]
    if env.get("SIGMATRACE_POLLER_WAIT") == "spin":
        wait = "spin with pause and bounded back-off (forced by SIGMATRACE_POLLER_WAIT=spin)"
    info["wait"] = wait
    if "SIGMATRACE_POLLER_SPIN_US" in env and env["SIGMATRACE_POLLER_SPIN_US"]:
        info["spin_us"] = _c_atoi(env["SIGMATRACE_POLLER_SPIN_US"])
    else:
        info["spin_us"] = 50
    ms = _c_atoi(env.get("SIGMATRACE_POLLER_MAX_SLEEP_US", ""))
    info["max_sleep_us"] = ms if ms > 0 else 50
    if "SIGMATRACE_POLLER_CPUS" in env:
        cpus = poller_cpus(env["SIGMATRACE_POLLER_CPUS"])
        info["poller_cpus"] = cpus
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            allowed = set(range(os.cpu_count() or 1))
        info["poller_cpus_unusable"] = [c for c in cpus if c not in allowed]
    return info


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


def _build_info(lib):
    """build_info.json next to the tracer library that `sigmatrace run` would preload."""
    if lib is not None and (lib.parent / "build_info.json").is_file():
        try:
            return json.loads((lib.parent / "build_info.json").read_text())
        except (OSError, ValueError):
            return None
    return _native.build_info()


def collect():
    lib = _native.tracer_library()
    build = _build_info(lib)
    cpu = cpu_features()
    return {
        "version": __version__,
        "tracer_library": str(lib) if lib else None,
        "build": build,
        "hijack": hijack_info(build, cpu),
        "emulated_hca": str(_native.find("libibverbs.so.1") or "") or None,
        "libraries": libraries(),
        "cpu": cpu,
        "machine": platform.machine(),
        "kernel": platform.release(),
        "gpus": gpus(),
        "rdma_devices": rdma_devices(),
        "ptp_clocks": sorted(str(p) for p in Path("/dev").glob("ptp*")),
        "trace_processor": os.environ.get("SIGMATRACE_TRACE_PROCESSOR") or shutil.which("trace_processor"),
    }


# provider -> the library it traces.  Every provider is built on every machine (the tracer declares the ABI
# pieces it needs itself, native/src/abi/): one missing from a build is an older build.
PROVIDER_LIBRARY = {"ibv": "libibverbs", "mlx5": "libmlx5", "ucx": "ucx (libucp)", "ofi": "libfabric",
                    "cuda": "cuda driver", "nccl": "nccl"}


def advice(info):
    """What a user can do about each missing piece: [(what, what to do)]."""
    out = []
    if not info["tracer_library"]:
        out.append(("tracer library", "not built: run `bash .ci/install` (or `pip install .` in a virtual "
                                      "environment) from a checkout; set SIGMATRACE_LIB_DIR for a build elsewhere"))
    built = set((info["build"] or {}).get("providers", []))
    for prov, lib in PROVIDER_LIBRARY.items():
        if info["tracer_library"] and prov not in built:
            present = info["libraries"].get(lib)
            out.append((f"{prov} provider", f"not in this build (built before every provider was built everywhere?), "
                        f"so {lib} calls are not traced" + (f" although {present} is here" if present else "")
                        + ": rebuild (`bash .ci/install`, or `pip install .`); no development headers are needed"))
    if not info["emulated_hca"]:
        out.append(("emulated HCA", "not built (test-only; it alone needs the rdma-core headers, libibverbs-dev): "
                                    "the verbs tests and examples without an RDMA NIC need it"))
    if not info["rdma_devices"]:
        emu = info["emulated_hca"]
        out.append(("RDMA devices", "none in /sys/class/infiniband: real traffic needs an mlx5 NIC; to try the "
                                    "tracer without one, put the emulated HCA first: LD_LIBRARY_PATH="
                                    + (str(Path(emu).parent) if emu else "<emulator dir>") + " (docs/emulator.md)"))
    if not info["gpus"]:
        out.append(("GPUs", "none visible: GPU-initiated doorbells (NVSHMEM/DeepEP IBGDA) can only be traced on a "
                            "machine with an NVIDIA GPU and driver"))
    c = info["cpu"]
    if not c.get("waitpkg") and not c.get("monitorx"):
        out.append(("poller wait", "no WAITPKG/MONITORX (common in VMs): doorbell pollers spin with pause and "
                                   "back off; give each poller its own core with SIGMATRACE_POLLER_CPUS "
                                   "(docs/hijack.md)"))
    if not c.get("constant_tsc") or not c.get("nonstop_tsc"):
        out.append(("TSC", "not constant/nonstop: timestamps drift with frequency changes; the correlator refits "
                           "them from the calibration pairs, but per-event times are less exact"))
    if not info["ptp_clocks"]:
        out.append(("PTP clocks", "none: clocks of different nodes are aligned from matched operations (F24b); a "
                                  "PTP-disciplined CLOCK_TAI makes cross-node times exact"))
    if not info["trace_processor"]:
        out.append(("trace_processor", "not found: `sigmatrace query --perfetto` needs Perfetto's trace_processor "
                                       "binary (set SIGMATRACE_TRACE_PROCESSOR=PATH); DuckDB queries work without it"))
    return out


def run(args):
    info = collect()
    info["advice"] = [{"what": w, "do": d} for w, d in advice(info)]
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"sigmatrace {info['version']}")
    print(f"  tracer library : {info['tracer_library'] or 'NOT BUILT (pip install . builds it)'}")
    b = info["build"] or {}
    print(f"  built providers: {', '.join(b.get('providers', [])) or 'none'}")
    for prov, what in (b.get("declarations") or {}).items():
        print(f"    {prov:5s} against {what}")
    print(f"  emulated HCA   : {info['emulated_hca'] or 'not built'}")
    print("  libraries:")
    for what, path in info["libraries"].items():
        print(f"    {what:14s} {path or '-'}")
    c = info["cpu"]
    print(f"  cpu            : {info['machine']}, " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in c.items()
                                                        if isinstance(v, bool)))
    print(f"  doorbell poller: {c['doorbell_wait']}")
    h = info["hijack"]
    print(f"  GPU hijack     : {h['built']}")
    if h["env"]:
        print(f"    mode         : {h['mode']}" + (f" (guard {h['guard_pct']}% of the SQ)" if h["mode"] == "guarded" else "")
              + (f" [{h['mode_note']}]" if h["mode_note"] else ""))
        print(f"    poller wait  : {h['wait']}")
        if "SIGMATRACE_POLLER_SPIN_US" in h["env"]:
            sp = h["spin_us"]
            what = "spin forever (dedicated cores)" if sp < 0 else f"spin {sp} us after activity, then wait/back off"
            print(f"    poller spin  : SIGMATRACE_POLLER_SPIN_US={h['env']['SIGMATRACE_POLLER_SPIN_US']} -> {what}")
        if "SIGMATRACE_POLLER_MAX_SLEEP_US" in h["env"]:
            print(f"    back-off cap : SIGMATRACE_POLLER_MAX_SLEEP_US={h['env']['SIGMATRACE_POLLER_MAX_SLEEP_US']} "
                  f"-> {h['max_sleep_us']} us")
        if "poller_cpus" in h:
            cp = h["poller_cpus"]
            txt = ("pollers pinned round-robin to cpu " + ",".join(map(str, cp))) if cp else \
                "no valid cpu: pollers not pinned"
            if h["poller_cpus_unusable"]:
                txt += f" (cpu {','.join(map(str, h['poller_cpus_unusable']))} not available to this process: " \
                       "those pollers run unpinned)"
            print(f"    poller cpus  : SIGMATRACE_POLLER_CPUS={h['env']['SIGMATRACE_POLLER_CPUS']} -> {txt}")
    print(f"  GPUs           : {', '.join(g['name'] for g in info['gpus']) or 'none'}")
    print(f"  RDMA devices   : {', '.join(d['name'] for d in info['rdma_devices']) or 'none'}")
    print(f"  PTP clocks     : {', '.join(info['ptp_clocks']) or 'none'}")
    print(f"  trace_processor: {info['trace_processor'] or 'not found (PerfettoSQL queries unavailable)'}")
    if info["advice"]:
        print("what to do:")
        for a in info["advice"]:
            print(f"  {a['what']}: {a['do']}")
    return 0


def register(sub):
    p = sub.add_parser("doctor", help="report what was built and what this machine has")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
