"""This tree against a baseline checkout, side by side in one run (issue 11: "benchmark numbers unchanged within
noise after the restructure"): the report pipeline (decode alone; correlate + Parquet tables, the host rows of the
Perfetto window collected on the way as the report does), and the
tracer's recording cost per call.

BENCH_BASELINE is a checkout of the commit to compare with (e.g. `git worktree add --detach /work/wt-old
3f40fc1`), its native tree built into its own build/dev (`cmake -S native -B build/dev && cmake --build
build/dev`); without it the tests skip.  Each tree runs from its own sources and native libraries (the
decode kernel, libsigmatrace.so), in a fresh process per run; the runs of the two trees alternate, the
order flipping every round, BENCH_ROUNDS rounds (default 7); what counts is the ratio of the medians
(this tree / baseline: < 1 is faster).  The capture is written once by this tree's model (the full-mode
AllReduce of bench_report.py, BENCH_EVENTS primary events, default 4 M) and read by both trees.

    BENCH_BASELINE=/work/wt-old python -m pytest benchmarks/bench_baseline.py -s -p no:cacheprovider
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import pytest

pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parent.parent
BASE = Path(os.environ["BENCH_BASELINE"]) if os.environ.get("BENCH_BASELINE") else None
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 7))
EVENTS = int(os.environ.get("BENCH_EVENTS", 4_000_000))
needs_base = pytest.mark.skipif(BASE is None or not (BASE / "build" / "dev").is_dir(),
                                reason="set BENCH_BASELINE to a checkout with its native tree built in build/dev")

# the pipeline of bench_report.py, for either tree's layout (the table writer moved from export to tables,
# the decoder from correlate to decode)
_RUN = r"""
import inspect, json, sys, time
sys.path[:0] = {paths!r}
from sigmatrace.correlate import correlate
try:
    from sigmatrace.tables import write_tables
except ImportError:
    from sigmatrace.export import write_tables
try:
    from sigmatrace.decode import columns as decode, kernel as _kernel
except ImportError:
    from sigmatrace.correlate import _kernel, decode
assert _kernel.get() is not None, "no decode kernel"
# the report's own call: the Perfetto window's host rows collected while the events are written (a tree from
# before the host collector has no collect_host)
kw = dict(collect_host=500_000) if "collect_host" in inspect.signature(write_tables).parameters else {{}}
t = time.perf_counter()
fd = decode.decode_file({cap!r}, kernel=True)
t0 = time.perf_counter()
c = correlate({cap!r}, workers=1)
t1 = time.perf_counter()
write_tables(c, {out!r}, **kw)
t2 = time.perf_counter()
print(json.dumps(dict(events=c.stats["events"], decode_s=t0 - t, correlate_s=t1 - t0, tables_s=t2 - t1,
                      pipeline_s=t2 - t0)))
"""


def _trees():
    return {"this": ROOT, "baseline": BASE}


def _alternating(names, rounds):
    """Round r runs the trees in order, the order reversed every other round."""
    for r in range(rounds):
        yield from (names if r % 2 == 0 else names[::-1])


def _pipeline(tree, cap, out):
    code = _RUN.format(paths=[str(tree), str(tree / "sim")], cap=str(cap), out=str(out))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tree), timeout=600)
    shutil.rmtree(out, ignore_errors=True)
    assert r.returncode == 0, (tree, r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    sys.path[:0] = [str(ROOT), str(ROOT / "sim")]
    from sigmatrace_sim import run_workload
    cap = tmp_path_factory.mktemp("base") / "allreduce_full.bin"
    run_workload("allreduce", str(cap), nodes=32, gpus_per_node=4, size=1 << 20, iters=max(1, -(-EVENTS // 456_000)),
                 mode="full", seed=13)
    yield cap
    cap.unlink(missing_ok=True)


def _ratios(samples, keys):
    med = {t: {k: median(s[k] for s in runs) for k in keys} for t, runs in samples.items()}
    return med, {k: round(med["this"][k] / med["baseline"][k], 3) for k in keys}


@needs_base
def test_report_pipeline_against_baseline(benchmark, capture, tmp_path):
    samples = {"this": [], "baseline": []}

    def go():
        for name in _alternating(list(_trees()), ROUNDS):
            samples[name].append(_pipeline(_trees()[name], capture, tmp_path / f"out-{name}"))

    benchmark.pedantic(go, rounds=1, iterations=1)
    assert samples["this"][0]["events"] == samples["baseline"][0]["events"]
    keys = ("decode_s", "correlate_s", "tables_s", "pipeline_s")
    med, ratio = _ratios(samples, keys)
    n = samples["this"][0]["events"]
    print(f"\n{n:,} events, {ROUNDS} rounds alternating, medians (s) and this / baseline:")
    for k in keys:
        print(f"  {k:>12}: this {med['this'][k]:.3f}  baseline {med['baseline'][k]:.3f}  ratio {ratio[k]:.3f}")
    benchmark.extra_info.update(events=n, rounds=ROUNDS, medians=med, ratio=ratio, samples=samples)


def _hammer(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    exe = tmp_path / "tracer_hammer"
    r = subprocess.run([cc, "-O2", "-o", str(exe), str(ROOT / "native" / "tests" / "tracer_hammer.c"), "-lfabric",
                        "-lpthread"], capture_output=True, text=True, timeout=120)
    if r.returncode:
        pytest.skip("cannot build tracer_hammer: " + r.stderr[-300:])
    return exe


def _ns_per_call(hammer, lib, mode, out, calls=2_000_000):
    env = dict(os.environ)
    if lib is not None:
        env.update(LD_PRELOAD=str(lib), SIGMATRACE_MODE=mode, SIGMATRACE_OUTPUT_DIR=str(out))
    r = subprocess.run([str(hammer), "-p", "udp", "-a", "time", "-n", str(calls), "-i"], env=env, capture_output=True,
                       text=True, timeout=60, check=True)
    shutil.rmtree(out, ignore_errors=True)
    return float(re.search(r"ns_per_call ([\d.]+)", r.stdout).group(1))


@needs_base
@pytest.mark.skipif(shutil.which("fi_info") is None, reason="needs libfabric (tracer_hammer)")
def test_recording_cost_against_baseline(benchmark, tmp_path):
    """tracer_hammer (fi_cq_read on an empty CQ, the ops-table path) preloaded with each tree's
    libsigmatrace.so: ns per call traced minus untraced, simple (the unwrapped call) and full (one event per
    call); all runs of one round interleaved."""
    hammer = _hammer(tmp_path)
    libs = {name: tree / "build" / "dev" / "libsigmatrace.so" for name, tree in _trees().items()}
    samples = {"this": [], "baseline": []}

    def go():
        for name in _alternating(list(libs), ROUNDS):
            base = _ns_per_call(hammer, None, None, tmp_path / "u")
            row = {"untraced": base}
            for mode in ("simple", "full"):
                row[mode] = _ns_per_call(hammer, libs[name], mode, tmp_path / f"t-{name}-{mode}") - base
            samples[name].append(row)

    benchmark.pedantic(go, rounds=1, iterations=1)
    keys = ("simple", "full")
    med, _ = _ratios(samples, keys)
    # simple mode leaves fi_cq_read unwrapped: a cost of ~0 ns, whose ratio means nothing
    ratio = {k: round(med["this"][k] / med["baseline"][k], 3) if min(med["this"][k], med["baseline"][k]) > 5 else None
             for k in keys}
    print(f"\nrecording cost per fi_cq_read (ns, traced - untraced), {ROUNDS} rounds, medians:")
    for k in keys:
        print(f"  {k:>7}: this {med['this'][k]:.1f}  baseline {med['baseline'][k]:.1f}  ratio {ratio[k]}")
    benchmark.extra_info.update(rounds=ROUNDS, medians=med, ratio=ratio, samples=samples)
