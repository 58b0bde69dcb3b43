"""Fig. 4 on real NVSHMEM: per-operation latency of NVSHMEM 3.4.5's IBGDA transport over the emulated HCA,
untraced (baseline) and traced with each doorbell-hijack mode -- forward-only, blocking recovery (the paper's),
non-blocking and guarded (default) -- for both NIC handlers: `gpu` (the kernel rings the doorbell: F8) and
`cpu_host_memory` (NVSHMEM's proxy thread rings it: F24d).

  python benchmarks/bench_nvshmem.py [--rounds 5] [--iters 5000] [--warmup 500] [--handlers gpu,cpu_host_memory]
  pytest -m gpu benchmarks/bench_nvshmem.py      # one short round, as a test (skips without a GPU)

Our latency program (native/tests/nvshmem/nvshmem_lat.cu) times each put + quiet, get, fetch-add and
ping-pong on the GPU with %globaltimer; one run gives PE 0's median per operation.  Runs are interleaved:
every round runs each mode once, in turn, and the figure per mode is the median over rounds of those
medians.  The emulated NIC -- a CPU thread that copies through CUDA -- sets the baseline: absolute numbers
are the emulator's; the ratios and the added nanoseconds are the tracer's cost on top of it.  Pollers and
the emulated NIC spin (the machine has cores to spare), in every mode alike.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MODES = ["baseline", "forward", "blocking", "nonblocking", "guarded"]
OPS = ["put", "get", "fadd", "pingpong"]


def measure(rounds=5, iters=5000, warmup=500, handlers=("gpu", "cpu_host_memory"), log=print):
    import test_gpu_nvshmem as T
    if T.REASON:
        return {"skipped": T.REASON}
    work = Path(tempfile.mkdtemp(prefix="bench-nvshmem"))
    binary = T.build(work)
    os.environ.setdefault("SIGMATRACE_POLLER_SPIN_US", "-1")
    os.environ.setdefault("SIGMATRACE_EMU_NIC_SPIN", "1")
    out = {"iters": iters, "warmup": warmup, "rounds": rounds, "handlers": {}}
    for handler in handlers:
        samples = {m: {op: [] for op in OPS} for m in MODES}
        for r in range(rounds):
            for mode in MODES:                      # interleaved: each round runs every mode once
                tmp = work / f"{handler}-{mode}-{r}"
                tmp.mkdir()
                traced = mode != "baseline"
                outs, _, _ = T.run_pes(binary, tmp, handler, traced, f"bnv{os.getpid()}{r}{mode[:3]}{handler[:3]}",
                                       iters=iters, warmup=warmup, hijack_mode=mode if traced else None,
                                       timeout=300)
                text = "\n".join(o for _, o in outs)
                if not all(rc == 0 for rc, _ in outs) or text.count("RESULT OK") != 2:
                    raise RuntimeError(f"{handler} {mode} round {r} failed: {text[-3000:]}")
                lat = T.lat_lines(text)
                for op in OPS:
                    samples[mode][op].append(lat[op])
                log(f"{handler} round {r} {mode}: " + " ".join(f"{op}={lat[op]}" for op in OPS))
        med = {m: {op: statistics.median(v) for op, v in ops.items()} for m, ops in samples.items()}
        base = med["baseline"]
        out["handlers"][handler] = {
            "median_p50_ns": med,
            "ratio": {m: {op: med[m][op] / base[op] for op in OPS} for m in MODES},
            "added_ns": {m: {op: med[m][op] - base[op] for op in OPS} for m in MODES},
            "samples_p50_ns": samples,
        }
    return out


@pytest.mark.gpu
def test_nvshmem_hijack_modes():
    r = measure(rounds=1, iters=500, warmup=50, handlers=("gpu",))
    if "skipped" in r:
        pytest.skip(r["skipped"])
    print(json.dumps({h: v["ratio"] for h, v in r["handlers"].items()}, indent=1))
    assert all(v > 0 for m in r["handlers"]["gpu"]["median_p50_ns"].values() for v in m.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--handlers", default="gpu,cpu_host_memory")
    ap.add_argument("--out")
    a = ap.parse_args()
    r = measure(a.rounds, a.iters, a.warmup, tuple(a.handlers.split(",")), log=lambda s: print(s, flush=True))
    s = json.dumps({k: v for k, v in r.items()}, indent=1)
    if a.out:
        Path(a.out).write_text(s)
    if "handlers" in r:
        for h, v in r["handlers"].items():
            print(f"== {h}: median of {a.rounds} rounds of PE 0's p50 (ns), ratio to baseline, added ns")
            for m in MODES:
                print(f"  {m:12s} " + "  ".join(
                    f"{op} {v['median_p50_ns'][m][op]:.0f} ({v['ratio'][m][op]:.3f}, {v['added_ns'][m][op]:+.0f})"
                    for op in OPS))
    else:
        print(s)


if __name__ == "__main__":
    main()
