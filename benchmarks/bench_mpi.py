"""mpi4py pingpong small-message latency, Open MPI pml ucx over the emulated HCA: untraced vs simple / full.

  python benchmarks/bench_mpi.py [--rounds 5] [--tls rc_mlx5,ud_mlx5,self] [--sizes 1,64,1024] [--loop 200]
                                 [--out FILE]

Two ranks under mpirun, each its own emulated node (native/tests/mpi/rank.sh), exactly as
tests/test_mpi.py launches them.  Each round launches every mode once, in an order rotated per round
(interleaved); one launch is `python -m mpi4py.bench pingpong -m S -n S -s 20 -l LOOP` per size
(mpi4py's own timing, rank 0: the mean over LOOP iterations of half a Send/Recv round trip, i.e.
the one-way latency).  Reported per size and mode: the median over rounds of the launches' means, its
ratio to untraced and the spread (min..max over rounds).  The emulated NIC (a CPU thread per rank,
2 cores shared) sets the baseline; the ratios are the tracer's cost on top of it.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

MODES = [None, "simple", "full"]


def launch(tmp, mode, tls, size, loop, skip):
    from native_util import cleanup_fabric, new_fabric
    from test_mpi import RANK_SH, base_env, mpirun_argv, rows
    fabric = new_fabric("bmpi")
    (tmp / "stats").mkdir(parents=True, exist_ok=True)
    tracer = [] if mode is None else [sys.executable, "-m", "sigmatrace", "run", "-o", str(tmp / "trace"),
                                      "--mode", mode, "--"]
    argv = mpirun_argv(2, fabric, tls, tmp / "stats", extra_env={"SIGMATRACE_EMU_STATS": ""}) + tracer + [
        str(RANK_SH), sys.executable, "-m", "mpi4py.bench", "pingpong", "-m", str(size), "-n", str(size),
        "-s", str(skip), "-l", str(loop)]
    try:
        r = subprocess.run(argv, env=base_env(), capture_output=True, text=True, timeout=300, cwd=tmp)
    finally:
        cleanup_fabric(fabric)
    if r.returncode != 0 or size not in rows(r.stdout):
        raise SystemExit(f"launch failed (mode {mode}, size {size}, rc {r.returncode}):\n{r.stdout[-2000:]}"
                         f"{r.stderr[-2000:]}")
    for ln in r.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+[\d.]+\s+\|\s+([\d.e+-]+)\s+±", ln)
        if m and int(m.group(1)) == size:
            return float(m.group(2)) * 1e6
    raise SystemExit(r.stdout)


def measure(rounds, tls, sizes, loop, skip):
    res = {s: {str(m): [] for m in MODES} for s in sizes}
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for size in sizes:
                for mode in order:
                    tmp = Path(d) / f"r{r}-{size}-{mode}"
                    tmp.mkdir()
                    res[size][str(mode)].append(launch(tmp, mode, tls, size, loop, skip))
    table = {}
    for s, by in res.items():
        base = statistics.median(by["None"])
        table[s] = {m: dict(median_us=statistics.median(v), ratio=statistics.median(v) / base,
                            min_us=min(v), max_us=max(v), launches=v) for m, v in by.items()}
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tls", default="rc_mlx5,ud_mlx5,self")
    ap.add_argument("--sizes", default="1,64,1024")
    ap.add_argument("--loop", type=int, default=200)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    sizes = [int(x) for x in a.sizes.split(",")]
    table = measure(a.rounds, a.tls, sizes, a.loop, a.skip)
    print(f"mpi4py pingpong, pml ucx UCX_TLS={a.tls}, {a.rounds} interleaved rounds, {a.loop} iterations/launch")
    for s, by in table.items():
        print(f"{s:>7} B: " + ", ".join(
            f"{'untraced' if m == 'None' else m} {v['median_us']:.1f} us ({v['ratio']:.2f}x, "
            f"{v['min_us']:.1f}..{v['max_us']:.1f})" for m, v in by.items()))
    if a.out:
        Path(a.out).write_text(json.dumps(dict(tls=a.tls, rounds=a.rounds, loop=a.loop, table=table), indent=1))


if __name__ == "__main__":
    main()
