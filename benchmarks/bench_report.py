"""Report pipeline benchmark: decode + correlate + Parquet tables, events/s/core with 1 and 2 workers, peak RSS.

The capture is the SimPy model's NCCL-style ring AllReduce in *full* tracer mode (every work request,
every ibv_poll_cq, every completion — the Table I workload): 32 nodes x 4 GPUs, 1 MB, as many iterations
as needed for BENCH_EVENTS primary events (default 20 M; one capture.bin, ~0.8 GB).  Each pipeline run is
a fresh subprocess (so that peak RSS is its own): ``correlate(workers=W)`` + ``write_tables`` (W worker
processes decode the capture and write the events table as part files, the per-operation tables are
written in row ranges).  One test prints side by side: ``decode_file`` alone with the C decode kernel
(libsigmatrace_decode.so) and with the numpy path, then both worker counts with the kernel and without it
(SIGMATRACE_NO_KERNEL=1) (wall time, events/s/core = events / wall / W, peak RSS of the main process and of
the largest worker, main peak bytes per event):

    python -m pytest benchmarks/bench_report.py -s -p no:cacheprovider

SIGMATRACE_BENCH_HUGE=1 adds a run on a >= 300 M-event capture (same workload, ~12 GB on disk, written
to BENCH_DIR or the pytest tmp dir and deleted afterwards) that reports peak RSS; it fails (and says so)
when the pipeline does not fit in memory.  Goals (issue 4): >= 10 M events/s/core, scaling with cores,
a 300 M-event capture within 24 GiB.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parent.parent
EVENTS = int(os.environ.get("BENCH_EVENTS", 20_000_000))
HUGE_EVENTS = int(os.environ.get("BENCH_HUGE_EVENTS", 300_000_000))
EVENTS_PER_ITER = 456_000        # allreduce, 32 nodes x 4 GPUs, 1 MB, full mode (measured)

_RUN = r"""
import json, resource, sys, time
sys.path[:0] = {paths!r}
from sigmatrace.correlate import correlate
from sigmatrace.tables import write_tables
t0 = time.perf_counter()
c = correlate({cap!r}, workers={workers})
t1 = time.perf_counter()
write_tables(c, {out!r})
t2 = time.perf_counter()
res = dict(events=c.stats["events"], correlate_s=t1 - t0, tables_s=t2 - t1, total_s=t2 - t0,
           maxrss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           children_maxrss_kb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
if {floor!r}:
    # the encoder alone: every written table read back into Arrow (untimed), then encoded again with the
    # same writer options into memory (timed) -- what pyarrow's Parquet encoding costs by itself
    import io, pathlib
    import pyarrow.parquet as pq
    from sigmatrace.tables import parquet as T
    enc = {{}}
    for f in sorted(pathlib.Path({out!r}).iterdir()):
        parts = sorted(f.glob("*.parquet")) if f.is_dir() else [f]
        s = 0.0
        for part in parts:
            pf = pq.ParquetFile(part)
            t = pf.read()
            groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
            batches = t.to_batches()
            del t
            tt = time.perf_counter()
            w = pq.ParquetWriter(io.BytesIO(), pf.schema_arrow, **T._opts(pf.schema_arrow))
            for b in batches:
                w.write_batch(b, row_group_size=max(b.num_rows, 1))
            w.close()
            s += time.perf_counter() - tt
            del batches
        enc[f.name.split(".")[0]] = s
    res["encode_only_s"] = enc
print(json.dumps(res))
"""


def make_capture(path, events):
    sys.path[:0] = [str(ROOT), str(ROOT / "sim")]
    from sigmatrace_sim import run_workload
    iters = max(1, -(-events // EVENTS_PER_ITER))
    t = time.perf_counter()
    r = run_workload("allreduce", str(path), nodes=32, gpus_per_node=4, size=1 << 20, iters=iters, mode="full",
                     seed=13)
    for suffix in (".truth.npz", ".truth.json"):
        p = Path(str(path)[: -len(".bin")] + suffix)
        if p.exists():
            p.unlink()
    return r.events, time.perf_counter() - t


_DECODE = r"""
import json, statistics, sys, time
sys.path[:0] = {paths!r}
from sigmatrace.decode import columns as decode, kernel as _kernel
res = {{}}
for mode in ("kernel", "numpy"):
    if mode == "kernel" and _kernel.get() is None:
        continue
    ts = []
    for _ in range({reps}):
        t = time.perf_counter()
        fd = decode.decode_file({cap!r}, kernel=(mode == "kernel"))
        ts.append(time.perf_counter() - t)
    n = sum(p.n_events for p in fd.processes)
    res[mode] = dict(events=n, s=statistics.median(ts), s_all=ts)
print(json.dumps(res))
"""


def run_decode(cap, reps=3):
    """decode_file alone (one process, one core), C kernel vs numpy path: median seconds of ``reps``."""
    code = _DECODE.format(paths=[str(ROOT), str(ROOT / "sim")], cap=str(cap), reps=reps)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout)[-1500:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def _mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class SystemMemory:
    """Peak rise of the machine's memory in use (MemTotal - MemAvailable, sampled every 50 ms) while a
    pipeline runs: the main process, its workers and their /dev/shm hand-over files together, pages shared
    copy-on-write by forked writers counted once (ru_maxrss counts them in every process)."""

    def __enter__(self):
        import threading
        self.base = _mem_available()
        self.low = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            self.low = min(self.low, _mem_available())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak_bytes = max(0, self.base - self.low)


def run_pipeline(cap, workers, out, kernel=True, floor=False):
    code = _RUN.format(paths=[str(ROOT), str(ROOT / "sim")], cap=str(cap), workers=workers, out=str(out),
                       floor=bool(floor))
    env = dict(os.environ)
    if not kernel:
        env["SIGMATRACE_NO_KERNEL"] = "1"
    with SystemMemory() as mem:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), env=env)
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout)[-1500:], returncode=r.returncode)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    d["workers"] = workers
    d["kernel"] = kernel
    d["events_per_s"] = d["events"] / d["total_s"]
    d["events_per_s_per_core"] = d["events_per_s"] / workers
    # peak of the main process or of one decode worker, whichever is larger (both live at the same time
    # only during the decode stage, whose workers hold one batch each)
    d["peak_rss_bytes"] = max(d["maxrss_kb"], d["children_maxrss_kb"]) * 1024
    d["rss_bytes_per_event"] = d["maxrss_kb"] * 1024 / max(d["events"], 1)
    d["system_peak_bytes"] = mem.peak_bytes
    return d


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    d = Path(os.environ.get("BENCH_DIR") or tmp_path_factory.mktemp("bench"))
    cap = d / "allreduce_full.bin"
    n, dt = make_capture(cap, EVENTS)
    yield cap, n, dt
    cap.unlink(missing_ok=True)


def test_report_throughput_and_memory(benchmark, capture, tmp_path):
    """Side by side: decode alone (C kernel vs numpy), then the pipeline with 1 and 2 workers (BENCH_WORKERS=1,2,4
    ... for more), with the kernel and with SIGMATRACE_NO_KERNEL=1 (the numpy path; BENCH_NUMPY=0 leaves it out).
    BENCH_REPEAT=N runs each pipeline N times (median).  One extra run (kernel, 1 worker) then times pyarrow's
    Parquet encoding of the written tables alone (read back untimed, encoded again into memory with the same
    options): the floor that the tables stage cannot go below with this encoder."""
    from sigmatrace.decode import kernel as _kernel
    cap, n, gen_s = capture
    size = cap.stat().st_size
    reps = max(1, int(os.environ.get("BENCH_REPEAT", 1)))
    have_kernel = _kernel.get() is not None
    rows = {}
    dec = {}

    workers = [int(x) for x in os.environ.get("BENCH_WORKERS", "1,2").split(",")]
    kernels = (True, False) if have_kernel and os.environ.get("BENCH_NUMPY", "1") != "0" else (have_kernel,)
    floor = {}

    def go():
        dec.update(run_decode(cap))
        for kern in kernels:
            for w in workers:
                runs = [run_pipeline(cap, w, tmp_path / f"out{w}", kernel=kern) for _ in range(reps)]
                bad = [r for r in runs if "error" in r]
                rows[(kern, w)] = bad[0] if bad else sorted(runs, key=lambda r: r["total_s"])[len(runs) // 2]
        floor.update(run_pipeline(cap, 1, tmp_path / "out_floor", kernel=have_kernel, floor=True))

    benchmark.pedantic(go, rounds=1, iterations=1)
    assert "error" not in floor, floor
    assert "error" not in dec, dec
    for w, r in rows.items():
        assert "error" not in r, r
    print(f"\ncapture: {n:,} events, {size / 2**20:.0f} MiB (allreduce full mode, 32x4 GPUs; written in {gen_s:.1f} s)")
    print("decode_file alone (1 core, median of 3):")
    for mode, d in dec.items():
        print(f"  {mode:>6}: {d['s']:.2f} s  {d['events'] / d['s'] / 1e6:.1f} M events/s")
    if "kernel" in dec and "numpy" in dec:
        print(f"  kernel speed-up {dec['numpy']['s'] / dec['kernel']['s']:.2f}x")
    print(f"{'decode':>7} {'workers':>8} {'total s':>9} {'correlate s':>12} {'tables s':>9} {'M ev/s':>8} "
          f"{'M ev/s/core':>12} {'main RSS MiB':>13} {'worker RSS MiB':>15} {'B/event':>8} {'system MiB':>11}")
    for (kern, w), r in rows.items():
        print(f"{'kernel' if kern else 'numpy':>7} {w:>8} {r['total_s']:>9.2f} {r['correlate_s']:>12.2f} "
              f"{r['tables_s']:>9.2f} {r['events_per_s'] / 1e6:>8.2f} {r['events_per_s_per_core'] / 1e6:>12.2f} "
              f"{r['maxrss_kb'] / 1024:>13.0f} {r['children_maxrss_kb'] / 1024:>15.0f} {r['rss_bytes_per_event']:>8.1f} "
              f"{r['system_peak_bytes'] / 2**20:>11.0f}")
    k = have_kernel
    base = rows.get((k, 1))
    speedup = {w: base["total_s"] / rows[(k, w)]["total_s"] for w in workers if base and (k, w) in rows}
    print("speed-up over 1 worker: " + ", ".join(f"{w} workers {x:.2f}x" for w, x in speedup.items()))
    enc = floor["encode_only_s"]
    tot = sum(enc.values())
    print(f"Parquet encoding alone (pyarrow, same options, 1 core): {tot:.2f} s = {tot / n * 1e9:.0f} ns/event "
          f"(" + ", ".join(f"{k} {v:.2f}" for k, v in sorted(enc.items(), key=lambda kv: -kv[1]) if v >= 0.01) +
          f"); the whole tables stage of that run: {floor['tables_s']:.2f} s, correlate {floor['correlate_s']:.2f} s")
    print(f"goal >= 10 M events/s/core = 100 ns/event; the encoder alone allows at most "
          f"{n / tot / 1e6:.1f} M events/s/core before any decoding or correlation")
    benchmark.extra_info.update(events=n, capture_bytes=size, decode=dec,
                                runs={f"{'kernel' if a else 'numpy'}-{b}": v for (a, b), v in rows.items()},
                                speedup=speedup, encode_only_s=enc, goal_events_per_s_per_core=10e6)


def run_report_cli(cap, workers, out):
    """The user's command, `sigmatrace report CAP -o OUT -j W -q` (Perfetto, summary, figures included), in a
    fresh process: wall seconds, its peak RSS and the machine's peak memory rise."""
    code = ("import resource, sys; sys.path[:0] = %r; from sigmatrace.cli.main import main; rc = main(sys.argv[1:]); "
            "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
            % ([str(ROOT), str(ROOT / "sim")],))
    t = time.perf_counter()
    with SystemMemory() as mem:
        r = subprocess.run([sys.executable, "-c", code, "report", str(cap), "-o", str(out), "-j", str(workers), "-q"],
                           capture_output=True, text=True, cwd=str(ROOT))
    wall = time.perf_counter() - t
    timings = {}
    try:
        timings = json.loads((Path(out) / "summary.json").read_text()).get("timings_s", {})
    except (OSError, ValueError):
        pass
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout)[-1500:], returncode=r.returncode)
    rss = [int(l.split()[1]) for l in r.stdout.splitlines() if l.startswith("MAXRSS_KB")]
    return dict(wall_s=wall, maxrss_kb=rss[-1] if rss else 0, system_peak_bytes=mem.peak_bytes, timings=timings)


@pytest.mark.skipif(os.environ.get("SIGMATRACE_BENCH_HUGE") != "1", reason="set SIGMATRACE_BENCH_HUGE=1 (>= 300 M events)")
def test_huge_capture_peak_memory(tmp_path):
    """>= 300 M events: the benchmarked pipeline (correlate + tables) and then the whole `sigmatrace report`
    (Perfetto, summary, figures too), each in a fresh process; peak RSS and the machine's memory rise."""
    d = Path(os.environ.get("BENCH_DIR") or tmp_path)
    cap = d / "allreduce_huge.bin"
    w = int(os.environ.get("BENCH_HUGE_WORKERS", 2))
    try:
        n, gen_s = make_capture(cap, HUGE_EVENTS)
        size = cap.stat().st_size
        r = run_pipeline(cap, w, d / "out_huge")
        rep = run_report_cli(cap, w, d / "report_huge") if "error" not in r else {}
    finally:
        cap.unlink(missing_ok=True)
    print(f"\nhuge capture: {n:,} events, {size / 2**30:.1f} GiB (written in {gen_s:.0f} s)")
    if "error" in r:
        print(f"pipeline failed (exit {r['returncode']}): {r['error'][-400:]}")
    else:
        print(f"correlate + tables: {r['total_s']:.0f} s ({r['workers']} workers), {r['events_per_s'] / 1e6:.2f} M ev/s, "
              f"{r['events_per_s_per_core'] / 1e6:.2f} M ev/s/core; peak RSS main {r['maxrss_kb'] / 2**20:.2f} GiB "
              f"({r['rss_bytes_per_event']:.1f} B/event), largest worker {r['children_maxrss_kb'] / 2**20:.2f} GiB; "
              f"machine memory in use rose by at most {r['system_peak_bytes'] / 2**30:.2f} GiB")
    if "error" in rep:
        print(f"sigmatrace report failed (exit {rep['returncode']}): {rep['error'][-400:]}")
    elif rep:
        print(f"sigmatrace report: {rep['wall_s']:.0f} s, peak RSS {rep['maxrss_kb'] / 2**20:.2f} GiB, machine memory "
              f"rose by at most {rep['system_peak_bytes'] / 2**30:.2f} GiB; stages "
              + ", ".join(f"{k} {v:.0f}" for k, v in rep["timings"].items()))
    assert "error" not in r, "the pipeline did not complete (see output)"
    assert "error" not in rep, "sigmatrace report did not complete (see output)"
    for x in (r, rep):
        assert x["maxrss_kb"] * 1024 <= 24 * 2**30 and x["system_peak_bytes"] <= 24 * 2**30
