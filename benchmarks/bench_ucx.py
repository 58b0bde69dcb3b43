"""Real UCX on the emulated HCA: the cost of tracing UCX's own doorbells (F24d) -- ucx_perftest -x rc_mlx5
am_lat 8 B and put_bw -D zcopy 64 KiB, untraced vs `sigmatrace run --mode simple` vs `--mode full`,
interleaved (one run of each configuration per round), medians over the rounds.

  python benchmarks/bench_ucx.py [--rounds 5] [--lat-iters 2000] [--bw-iters 2000] [--mmio bf_post]

The emulated NIC (a CPU thread per process) sets the baseline: absolute numbers are the emulator's, the
differences are the tracer's cost on top of it.  Added nanoseconds per doorbell:
  am_lat: ucx_perftest reports the one-way latency (half a round trip); each one-way step is one doorbell
          (one AM SEND rung by one side), so added ns/doorbell = traced latency - untraced latency;
  put_bw: one RDMA WRITE per iteration, one doorbell each: added ns/doorbell = 1e9/rate_traced - 1e9/rate.
Each run is a fresh emulated fabric, both processes in st-emu-ns.
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

from native_util import cleanup_fabric, emu_env, emu_ns, free_port, new_fabric, popen, wait_listen  # noqa: E402

CONFIGS = ["untraced", "simple", "full"]


def one(perftest, args, config, mmio, tmp):
    fab = new_fabric("bu")
    try:
        port = free_port()
        argv = [perftest, "-p", str(port), "-d", "mlx5_0:1", "-x", "rc_mlx5", *args]
        out = Path(tempfile.mkdtemp(dir=tmp))

        def wrap(a):
            if config == "untraced":
                return a
            return [sys.executable, "-m", "sigmatrace", "run", "-o", str(out), "--mode", config, "--", *a]
        env = lambda lid: dict(emu_env(fab, lid, UCX_WARN_UNUSED_ENV_VARS="n", UCX_RC_MLX5_MMIO_MODE=mmio,
                                       UCX_IB_MLX5_DEVX="no", SIGMATRACE_DROP_POLICY="block"),
                               PYTHONPATH=str(ROOT))
        srv = popen(emu_ns(wrap(argv)), env(1))
        try:
            wait_listen(port, srv, timeout=20)
            cli = subprocess.run(emu_ns(wrap(argv + ["127.0.0.1"])), env=env(2), capture_output=True, text=True,
                                 timeout=300)
            srv.communicate(timeout=60)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.communicate()
        rows = [ln.split() for ln in cli.stdout.splitlines() if ln.startswith("Final:")]
        if cli.returncode or not rows:
            raise SystemExit(f"{config} {args}: rc {cli.returncode}\n{cli.stdout}{cli.stderr}")
        v = [float(x) for x in rows[-1][1:]]
        # iterations, latency typical/avg/overall (us), bw avg/overall (MB/s), rate avg/overall (msg/s)
        return dict(lat_us=v[3], bw_mbs=v[5], rate=v[7])
    finally:
        cleanup_fabric(fab)


def main():
    import shutil
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lat-iters", type=int, default=2000)
    ap.add_argument("--bw-iters", type=int, default=2000)
    ap.add_argument("--mmio", default="bf_post", choices=["bf_post", "db"])
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    perftest = shutil.which("ucx_perftest")
    if not perftest:
        raise SystemExit("ucx_perftest (ucx-utils) not installed")
    tests = {"am_lat_8B": ["-t", "am_lat", "-s", "8", "-n", str(a.lat_iters), "-w", "100"],
             "put_bw_64KiB": ["-t", "put_bw", "-D", "zcopy", "-s", "65536", "-n", str(a.bw_iters), "-w", "100"]}
    res = {t: {c: [] for c in CONFIGS} for t in tests}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for t, args in tests.items():
                for c in CONFIGS:        # interleaved: every configuration once per round
                    res[t][c].append(one(perftest, args, c, a.mmio, tmp))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    summary = {}
    for t in tests:
        med = {c: {k: statistics.median(x[k] for x in res[t][c]) for k in ("lat_us", "bw_mbs", "rate")}
               for c in CONFIGS}
        spread = {c: [round(x["lat_us"] if t.startswith("am") else 1e9 / x["rate"]) if not t.startswith("am")
                       else round(x["lat_us"] * 1000) for x in res[t][c]] for c in CONFIGS}
        if t.startswith("am"):
            per = {c: med[c]["lat_us"] * 1000 for c in CONFIGS}     # ns per one-way step = per doorbell
        else:
            per = {c: 1e9 / med[c]["rate"] for c in CONFIGS}        # ns per WRITE = per doorbell
        summary[t] = dict(median=med, ns_per_doorbell={c: round(per[c]) for c in CONFIGS},
                          added_ns_per_doorbell={c: round(per[c] - per["untraced"]) for c in CONFIGS[1:]},
                          runs_ns_per_doorbell=spread)
        print(f"{t} ({a.mmio}, {a.rounds} rounds, medians): " + ", ".join(
            f"{c} {per[c]:.0f} ns/doorbell" for c in CONFIGS) + " | added: " + ", ".join(
            f"{c} {per[c] - per['untraced']:+.0f} ns" for c in CONFIGS[1:]))
        if t.startswith("put"):
            print("   bandwidth MB/s: " + ", ".join(f"{c} {med[c]['bw_mbs']:.0f}" for c in CONFIGS))
        print("   per run (ns/doorbell): " + json.dumps(spread))
    if a.json:
        Path(a.json).write_text(json.dumps(dict(args=vars(a), cpus=os.cpu_count(), summary=summary), indent=1))


if __name__ == "__main__":
    main()
