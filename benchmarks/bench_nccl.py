"""NCCL AllReduce over the emulated HCA on one GPU: untraced vs aggregate / simple / full mode.

  python benchmarks/bench_nccl.py [--rounds 5] [--iters 20] [--sizes 1048576,134217728] [--out FILE]

Two ranks on one GPU (torchrun, distinct NCCL_HOSTID, MPS), NET/IB over the emulated mlx5 HCA, exactly
as tests/test_gpu_nccl.py launches them.  Each round launches every mode once, in an order rotated per
round (interleaved); a launch times `--iters` AllReduces per size after warm-up (CUDA-synchronised wall
time per collective, rank 0).  Reported per size and mode: the median over rounds of each launch's median,
and its ratio to untraced.  The emulated NIC (a CPU thread per rank) sets the baseline: the ratios are the
tracer's cost on top of it, not what a real ConnectX would give.
"""
import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

MODES = [None, "aggregate", "simple", "full"]


def measure(rounds, iters, sizes, warmup=3):
    from test_gpu_nccl import ground_truth, launch, torchrun_argv
    res = {s: {str(m): [] for m in MODES} for s in sizes}
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                tmp = Path(d) / f"r{r}-{mode}"
                tmp.mkdir()
                rc, out, _, run_dir = launch(tmp, mode, f"bench{r}{mode or 'u'}",
                                       argv=torchrun_argv(sizes=sizes, iters=iters, warmup=warmup,
                                                          ops=("all_reduce",)))
                if rc != 0:
                    raise SystemExit(f"launch failed (mode {mode}):\n{out[-3000:]}")
                for row in ground_truth(run_dir)[0]:
                    if row["rank"] == 0:
                        res[row["bytes"]][str(mode)].append(statistics.median(row["us"]))
    table = {}
    for s, by in res.items():
        base = statistics.median(by["None"])
        table[s] = {m: dict(median_us=statistics.median(v), ratio=statistics.median(v) / base, launches=v)
                    for m, v in by.items()}
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sizes", default=f"{1 << 20},{128 << 20}")
    ap.add_argument("--out")
    a = ap.parse_args()
    t = measure(a.rounds, a.iters, [int(s) for s in a.sizes.split(",")])
    for s, by in t.items():
        print(f"AllReduce {s / 2**20:g} MiB: " + ", ".join(
            f"{'untraced' if m == 'None' else m} {v['median_us']:.1f} us ({v['ratio']:.3f}x)" for m, v in by.items()))
    if a.out:
        Path(a.out).write_text(json.dumps(t, indent=1))


if __name__ == "__main__":
    main()
