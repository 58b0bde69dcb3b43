"""Doorbell hijack overhead: baseline / forward-only / blocking recovery (paper) /
non-blocking recovery (F24c) / guarded non-blocking recovery (default).

  python benchmarks/bench_hijack.py            # emulated path (CPU "GPU" + emulated driver/HCA)
  python benchmarks/bench_hijack.py --gpu      # real GPU kernels, %globaltimer per op (>= 5,000 iters)
  python benchmarks/bench_hijack.py --stress   # WQE losses and doorbells/s per recovery mode (emulated
                                               # stress: 4 threads x 25,000 ops, depth 128; docs/hijack.md)
  pytest benchmarks/bench_hijack.py            # the emulated comparison as a test

The emulated NIC (a CPU thread) sets the baseline in both cases: absolute
numbers are the emulator's, the ratios are the tracer's cost on top of it.
Pollers spin (SIGMATRACE_POLLER_SPIN_US=-1) on a core of their own when the
machine has cores to spare.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MODES = ["baseline", "forward", "blocking", "nonblocking", "guarded"]


def _base():
    from sigmatrace import _native
    for d in _native.candidate_dirs():
        if (d / "libsigmatrace.so").exists() and (d / "emu" / "libibverbs.so.1").exists() and \
                (d / "tests" / "hijack_client").exists():
            return d
    raise SystemExit("build first: cmake -S native -B build/dev && cmake --build build/dev")


def _env(mode, tmp, extra_ld):
    base = _base()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(LD_LIBRARY_PATH=extra_ld + env.get("LD_LIBRARY_PATH", ""), SIGMATRACE_OUTPUT_DIR=str(tmp),
               SIGMATRACE_EMU_FABRIC=str(Path(tmp) / "fabric"))
    ncpu = os.cpu_count() or 1
    if ncpu >= 4:
        env.setdefault("SIGMATRACE_POLLER_SPIN_US", "-1")
        # the emulated NIC busy-polls too, so its idle sleep does not set the baseline
        env.setdefault("SIGMATRACE_EMU_NIC_SPIN", "1")
        # one core per poller (the client rings two doorbell pages): two pollers
        # spinning on one core take turns by scheduler time slice (milliseconds)
        env.setdefault("SIGMATRACE_POLLER_CPUS", f"{ncpu - 2}-{ncpu - 1}")
    if mode != "baseline":
        env["LD_PRELOAD"] = str(base / "libsigmatrace.so")
        env["SIGMATRACE_HIJACK_MODE"] = mode
    return env


def emulated(ops=3000, reps=3):
    base = _base()
    client = base / "tests" / "hijack_client"
    res = {}
    for mode in MODES:
        meds = []
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as tmp:
                env = _env(mode, tmp, f"{base}/emu:{base}/emu/cuda:")
                p = subprocess.run([str(client), "--mode", "lat", "--ops", str(ops)], env=env, capture_output=True,
                                   text=True, timeout=120)
                line = [l for l in p.stdout.splitlines() if l.startswith("LAT ")]
                assert p.returncode == 0 and line, p.stdout + p.stderr
                meds.append(int(line[0].split("median_ns=")[1].split()[0]))
        res[mode] = statistics.median(meds)
    return {"path": "emulated", "op": "put+quiet", "ops": ops, "median_ns": res,
            "ratio": {m: res[m] / res["baseline"] for m in MODES}}


def gpu(iters=5000, warmup=1000):
    import test_gpu_hijack as T
    why = T._gpu_reason()
    if why:
        return {"skipped": why}
    client = T.build_gpu_client(tempfile.mkdtemp(prefix="gpu"))
    out = {"path": "gpu", "iters": iters, "warmup": warmup, "median_ns": {}, "ratio": {}}
    base = _base()
    for op in ["put", "get", "fadd", "pingpong"]:
        med = {}
        for mode in MODES:
            tmp = Path(tempfile.mkdtemp(prefix=f"bench-{op}-{mode}"))
            env = _env(mode, tmp, f"{base}/emu:")
            lat = tmp / "lat.txt"
            p = subprocess.run([str(client), "--op", op, "--api", "runtime", "--iters", str(iters), "--warmup",
                                str(warmup), "--lat", str(lat)], env=env, capture_output=True, text=True, timeout=600)
            assert p.returncode == 0 and "RESULT OK" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
            v = [int(x) for x in lat.read_text().split()]
            med[mode] = statistics.median(v)
        out["median_ns"][op] = med
        out["ratio"][op] = {m: med[m] / med["baseline"] for m in MODES}
    return out


STRESS_MODES = ["untraced", "nonblocking", "guarded", "blocking", "sync"]


def stress(reps=5, modes=STRESS_MODES, guard=None):
    """Per mode: WQEBBs lost (of 100,000), doorbells rung per second, doorbells held by the guard."""
    import test_hijack_emu as T
    out = {}
    for mode in modes:
        runs = []
        for _ in range(reps):
            tmp = Path(tempfile.mkdtemp(prefix=f"stress-{mode}"))
            extra = {"SIGMATRACE_HIJACK_GUARD": str(guard)} if guard else {}
            traced = mode != "untraced"
            stdout, cap, gt = T.run_client(tmp, ["--mode", "stress", "--threads", "4", "--ops", "100000",
                                                 "--depth", "128"], mode=mode if traced else "nonblocking",
                                           traced=traced, env_extra=extra, timeout=300)
            st = dict(kv.split("=") for kv in next(l for l in stdout.splitlines() if l.startswith("STATS")).split()[1:])
            lost = held = 0
            if traced:
                _, wqes_gt = T.ground_truth(gt)
                _, lost = T.check_recovery(cap, wqes_gt, allow_lost=True)
                held = sum(j.get("guard_waits", 0) for j in T.poller_summaries(cap))
            runs.append({"lost": lost, "doorbells_per_s": int(st["doorbells"]) / float(st["seconds"]), "held": held})
        out[mode] = {"runs": runs, "lost_median": statistics.median(r["lost"] for r in runs),
                     "lost_max": max(r["lost"] for r in runs),
                     "doorbells_per_s_median": statistics.median(r["doorbells_per_s"] for r in runs),
                     "held_median": statistics.median(r["held"] for r in runs)}
    return {"path": "emulated stress", "guard_pct": guard or 10, "reps": reps, "modes": out}


def test_emulated_doorbell_forwarding():
    r = emulated(ops=2000, reps=1)
    print(json.dumps(r, indent=1))
    assert all(v > 0 for v in r["median_ns"].values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--stress", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--guard", type=int, default=None, help="SIGMATRACE_HIJACK_GUARD for --stress")
    ap.add_argument("--out")
    a = ap.parse_args()
    r = gpu(a.iters) if a.gpu else stress(a.reps, guard=a.guard) if a.stress else emulated(a.ops)
    s = json.dumps(r, indent=1)
    print(s)
    if a.out:
        Path(a.out).write_text(s)


if __name__ == "__main__":
    main()
