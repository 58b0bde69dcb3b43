"""The cluster report (`sigmatrace report --cluster`, sigmatrace.cluster) against the local path: throughput
per worker, peak memory per worker and of the driver, the time of every global stage; how the global stages
grow with events and process files; a projection for the paper's largest run.

The capture is the SimPy model's NCCL-style ring AllReduce in full tracer mode (sigmatrace_sim.run_workload,
the workload of bench_report.py): one capture.bin whose processes the cluster report reads as one part each.
Every run is `build_report` (tables, Perfetto, summary, figures) in a fresh subprocess, so that the peak RSS
of the driver is its own; a cluster run starts its own LocalCluster (one thread per worker process) and
reads each worker's peak RSS (ru_maxrss) before closing it.

  1. side by side (BENCH_CLUSTER_EVENTS, default 2 M events; 32 x 4 GPUs = 128 processes): the local path
     (2 workers), --cluster local:1 and local:2, BENCH_REPEAT rounds (default 3) interleaved, the order
     rotated every round, medians: events/s per worker, peak RSS per worker and of the driver, every stage.
  2. scaling (BENCH_CLUSTER_SCALE, default 2e6,4e6,8e6,16e6 events x 64, 128, 256 processes, local:2, one
     run each): a least-squares fit t = a + b P + c E per global stage, worker-seconds of the task rounds
     per event, worker peak RSS against events per part, driver peak RSS against P and E; then the
     projection for 2,000 M events and 1,024 processes on 16 and 64 workers, printed from the fit.
  3. memory against capture size (BENCH_CLUSTER_MEM_SIZES, default 5e6,20e6,50e6 events; 128 processes in
     one capture.bin; --cluster local:2, one run each, SIGMATRACE_CLUSTER_PART_BYTES as set): peak RSS per
     worker and of the driver, decode tasks, the largest part; -k memory_vs_size.
  4. against a baseline tree (BENCH_BASELINE: a checkout of another commit with its native tree built into
     its own build/dev, as for bench_baseline.py): --cluster local:2 of both trees on one capture
     (BENCH_CLUSTER_BASE_EVENTS, default 16 M events; BENCH_CLUSTER_BASE_PROCESSES, default 256 files),
     BENCH_REPEAT rounds interleaved, the order flipping every round, medians; each tree's global stages
     are the ones its own bench_cluster.py names (GLOBAL), so what moved from the driver into the task
     rounds shows; -k baseline.
  5. SIGMATRACE_BENCH_HUGE=1: one run on BENCH_CLUSTER_HUGE_EVENTS (default 300 M) with the modes of
     BENCH_HUGE_MODES (default cluster:2), at the end; BENCH_CLUSTER_HUGE_PROCESSES (64, 128 or 256) files.

    python -m pytest benchmarks/bench_cluster.py -s -p no:cacheprovider
"""
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the cluster extra (pip install '.[cluster]') is not installed")
pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parent.parent
EVENTS = int(float(os.environ.get("BENCH_CLUSTER_EVENTS", 2e6)))
REPEAT = max(1, int(os.environ.get("BENCH_REPEAT", 3)))
SCALE = [int(float(x)) for x in os.environ.get("BENCH_CLUSTER_SCALE", "2e6,4e6,8e6,16e6").split(",") if x]
HUGE = int(float(os.environ.get("BENCH_CLUSTER_HUGE_EVENTS", 300e6)))
HUGE_PROCESSES = int(os.environ.get("BENCH_CLUSTER_HUGE_PROCESSES", 128))    # 64, 128 or 256 (TOPOLOGY)
MEM_SIZES = [int(float(x)) for x in os.environ.get("BENCH_CLUSTER_MEM_SIZES", "5e6,20e6,50e6").split(",") if x]
# process files -> (nodes, GPUs per node) of the workload, and its events per iteration (measured)
TOPOLOGY = {64: (16, 4), 128: (32, 4), 256: (64, 4)}
EVENTS_PER_ITER = {64: 113_000, 128: 455_000, 256: 1_830_000}
PAPER = dict(events=2_000_000_000, processes=1024, workers=(16, 64))
# stages of the cluster report (driver.stage_s): the task rounds (next to the data, in parallel) and the
# global stages (the driver, or a reduction's root).  The Perfetto trace's tasks (merge tree, cut, window rows,
# the write) and the figures' run beside the rounds after ``write``: their worker time is inside those rounds'
# times; what the driver still waits for them is global (perfetto_s, figures_s)
TASKS = ("plan_tasks", "decode_tasks", "local_tasks", "match_tasks", "pair_tasks", "refine_window_tasks",
         "write_tasks", "summary_reduce_tasks", "latency_reduce_tasks")
GLOBAL = ("identity_topology", "offsets_units", "refine", "final_tables", "perfetto_submit", "small_tables",
          "latency_s", "perfetto_s", "summary_s", "figures_submit_s", "figures_s")

_RUN = r"""
import json, resource, sys, time
sys.path[:0] = {paths!r}
from sigmatrace.report import build_report
mode, cap, out = {mode!r}, {cap!r}, {out!r}
res = {{}}
if __name__ == "__main__":
    t = time.perf_counter()
    if mode.startswith("cluster:"):
        import logging, distributed
        n = int(mode.split(":")[1])
        cl = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                                      silence_logs=logging.ERROR)
        client = distributed.Client(cl)
        t = time.perf_counter()
        _, s, tm = build_report(cap, out, workers=n, quiet=True, cluster=client)
        res["wall_s"] = time.perf_counter() - t
        rss = client.run(lambda: __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss)
        res["worker_maxrss_kb"] = sorted(rss.values())
        client.close(); cl.close()
        res["workers"] = n
    else:
        n = int(mode.split(":")[1])
        _, s, tm = build_report(cap, out, workers=n, quiet=True)
        res["wall_s"] = time.perf_counter() - t
        res["workers"] = n
        res["worker_maxrss_kb"] = [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]
    res.update(events=s["events"], processes=s["processes"], operations=s["operations"], timings=tm,
               driver_maxrss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print(json.dumps(res))
"""


def make_capture(path, events, processes=128):
    sys.path[:0] = [str(ROOT), str(ROOT / "sim")]
    from sigmatrace_sim import run_workload
    nodes, gpus = TOPOLOGY[processes]
    iters = max(1, round(events / EVENTS_PER_ITER[processes]))
    t = time.perf_counter()
    r = run_workload("allreduce", str(path), nodes=nodes, gpus_per_node=gpus, size=1 << 20, iters=iters,
                     mode="full", seed=13)
    for suffix in (".truth.npz", ".truth.json"):
        Path(str(path)[: -len(".bin")] + suffix).unlink(missing_ok=True)
    return r.events, time.perf_counter() - t


def _stage_names(root):
    """(TASKS, GLOBAL) as the bench_cluster.py of the tree at root names them (a baseline may differ)."""
    if root == ROOT:
        return TASKS, GLOBAL
    names = {}
    for node in ast.parse((root / "benchmarks" / "bench_cluster.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", "") in (
                "TASKS", "GLOBAL"):
            names[node.targets[0].id] = ast.literal_eval(node.value)
    return names["TASKS"], names["GLOBAL"]


def run_report(cap, mode, out, nice=False, root=ROOT):
    """One report in a fresh process: 'local:W' (the local path, W workers) or 'cluster:N'; the sources
    (and so the native libraries, the tree's build/dev) of the tree at root."""
    import shutil
    tasks, glob = _stage_names(root)
    script = out.with_suffix(".py")          # a file, so that the LocalCluster's spawned workers can start
    script.write_text(_RUN.format(paths=[str(root), str(root / "sim")], mode=mode, cap=str(cap), out=str(out)))
    cmd = (["nice", "-n", "10"] if nice else []) + [sys.executable, str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout)[-2000:], mode=mode)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    d["mode"] = mode
    st = dict(d["timings"].get("cluster_stages_s", {}))
    if "refine" in st:       # the refinement's second pass is a task round inside it
        st["refine"] -= st.get("refine_window_tasks", 0.0)
    for k in ("latency_s", "perfetto_s", "summary_s", "figures_submit_s", "figures_s", "correlate_s", "tables_s",
              *glob):
        if k in d["timings"]:
            st[k] = d["timings"][k]
    d["stages"] = st
    d["global_s"] = sum(st.get(k, 0.0) for k in glob)
    d["tasks_s"] = sum(st.get(k, 0.0) for k in tasks)
    d["events_per_s_per_worker"] = d["events"] / d["wall_s"] / d["workers"]
    d["worker_peak_mib"] = max(d["worker_maxrss_kb"]) / 1024
    d["driver_peak_mib"] = d["driver_maxrss_kb"] / 1024
    return d


def _median_run(runs):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    m = dict(sorted(ok, key=lambda r: r["wall_s"])[len(ok) // 2])
    for k in ("wall_s", "global_s", "tasks_s", "events_per_s_per_worker", "worker_peak_mib", "driver_peak_mib"):
        m[k] = statistics.median(r[k] for r in ok)
    m["stages"] = {k: statistics.median(r["stages"].get(k, 0.0) for r in ok) for k in ok[0]["stages"]}
    m["runs"] = len(ok)
    return m


def _table(rows):
    print(f"{'mode':>10} {'events':>12} {'wall s':>8} {'M ev/s/worker':>14} {'worker peak MiB':>16} "
          f"{'driver peak MiB':>16} {'tasks s':>8} {'global s':>9} {'global %':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:>10} ERROR {r['error'][-300:]}")
            continue
        print(f"{r['mode']:>10} {r['events']:>12,} {r['wall_s']:>8.2f} {r['events_per_s_per_worker'] / 1e6:>14.2f} "
              f"{r['worker_peak_mib']:>16.0f} {r['driver_peak_mib']:>16.0f} {r['tasks_s']:>8.2f} "
              f"{r['global_s']:>9.2f} {100 * r['global_s'] / r['wall_s']:>8.1f}%")


def _stages(rows, glob=GLOBAL):
    """Every stage any row has (this tree's names first), * marking the global ones (glob)."""
    names = [k for k in TASKS + GLOBAL if any(k in r.get("stages", {}) for r in rows)]
    names += sorted({k for r in rows for k in r.get("stages", {})} - set(names) - {"correlate_s", "tables_s"})
    print("stages (s; * = global):" + "".join(f" {r['mode']:>10}" for r in rows))
    for k in names:
        print(f"  {('*' if k in glob else ' ') + k:<22}" + "".join(
            f" {r.get('stages', {}).get(k, float('nan')):>10.3f}" for r in rows))


def test_side_by_side(benchmark, tmp_path):
    """The local path, --cluster local:1 and local:2 on one capture, interleaved rounds, medians."""
    cap = tmp_path / "allreduce_full.bin"
    n, gen_s = make_capture(cap, EVENTS)
    modes = ["local:2", "cluster:1", "cluster:2"]
    runs = {m: [] for m in modes}

    def go():
        for i in range(REPEAT):
            for m in modes[i % len(modes):] + modes[:i % len(modes)]:
                runs[m].append(run_report(cap, m, tmp_path / f"out-{m.replace(':', '')}"))

    benchmark.pedantic(go, rounds=1, iterations=1)
    rows = [_median_run(runs[m]) for m in modes]
    print(f"\ncapture: {n:,} events, {cap.stat().st_size / 2**20:.0f} MiB, 128 processes (written in {gen_s:.1f} s); "
          f"medians of {REPEAT} interleaved rounds; local:2 = the local path with 2 workers")
    _table(rows)
    _stages(rows)
    loc = rows[0]
    for r in rows[1:]:
        if "error" not in r and "error" not in loc:
            print(f"{r['mode']}: wall {r['wall_s'] / loc['wall_s']:.2f}x the local path's")
    benchmark.extra_info.update(events=n, runs={m: runs[m] for m in modes})
    for r in rows:
        assert "error" not in r, r["error"]


BASE = Path(os.environ["BENCH_BASELINE"]) if os.environ.get("BENCH_BASELINE") else None


@pytest.mark.skipif(BASE is None or not (BASE / "build" / "dev").is_dir(),
                    reason="set BENCH_BASELINE to a checkout with its native tree built in build/dev")
def test_against_baseline(benchmark, tmp_path):
    """--cluster local:2 of this tree and of BENCH_BASELINE's on one capture, interleaved rounds, medians."""
    events = int(float(os.environ.get("BENCH_CLUSTER_BASE_EVENTS", 16e6)))
    procs = int(os.environ.get("BENCH_CLUSTER_BASE_PROCESSES", 256))
    cap = tmp_path / "allreduce_full.bin"
    n, gen_s = make_capture(cap, events, procs)
    trees = {"this": ROOT, "baseline": BASE}
    runs = {t: [] for t in trees}

    def go():
        for i in range(REPEAT):
            for t in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                runs[t].append(run_report(cap, "cluster:2", tmp_path / f"out-{t}", root=trees[t]))

    benchmark.pedantic(go, rounds=1, iterations=1)
    rows = {t: _median_run(runs[t]) for t in trees}
    for t, r in rows.items():
        assert "error" not in r, r["error"]
        r["mode"] = t
    print(f"\ncapture: {n:,} events, {procs} processes; --cluster local:2; medians of {REPEAT} interleaved rounds; "
          f"this tree {ROOT} against {BASE}")
    _table(list(rows.values()))
    _stages(list(rows.values()), set(GLOBAL) | set(_stage_names(BASE)[1]))
    a, b = rows["this"], rows["baseline"]
    print(f"this / baseline: wall {a['wall_s'] / b['wall_s']:.3f}x, global stages {a['global_s'] / b['global_s']:.3f}x "
          f"({a['global_s']:.2f} s against {b['global_s']:.2f} s; global share {100 * a['global_s'] / a['wall_s']:.1f} % "
          f"against {100 * b['global_s'] / b['wall_s']:.1f} %)")
    benchmark.extra_info.update(events=n, processes=procs, runs=runs,
                                ratio_wall=a["wall_s"] / b["wall_s"], ratio_global=a["global_s"] / b["global_s"])


def _fit(X, y):
    """Least squares y = X @ c (c clipped at 0: a stage does not get faster with more data)."""
    c, *_ = np.linalg.lstsq(np.asarray(X, float), np.asarray(y, float), rcond=None)
    return np.maximum(c, 0)


def test_scaling_and_projection(benchmark, tmp_path):
    """Global stages against events and process files; the projection for the paper's largest run."""
    runs = []

    def go():
        for P in sorted(TOPOLOGY):
            for E in SCALE:
                cap = tmp_path / f"cap-{P}-{E}.bin"
                make_capture(cap, E, P)
                r = run_report(cap, "cluster:2", tmp_path / f"out-{P}-{E}")
                cap.unlink(missing_ok=True)
                r["P"] = P
                runs.append(r)

    benchmark.pedantic(go, rounds=1, iterations=1)
    bad = [r for r in runs if "error" in r]
    assert not bad, bad[0]["error"]
    print(f"\nscaling, --cluster local:2, one run each ({len(runs)} runs):")
    print(f"{'P':>5} {'events':>12} {'wall s':>8} {'tasks s':>8} {'global s':>9} {'worker MiB':>11} {'driver MiB':>11}")
    for r in runs:
        print(f"{r['P']:>5} {r['events']:>12,} {r['wall_s']:>8.2f} {r['tasks_s']:>8.2f} {r['global_s']:>9.2f} "
              f"{r['worker_peak_mib']:>11.0f} {r['driver_peak_mib']:>11.0f}")
    P = np.array([r["processes"] for r in runs], float)
    E = np.array([r["events"] for r in runs], float)
    X = np.stack([np.ones_like(P), P, E], 1)
    Pp, Ep = PAPER["processes"], PAPER["events"]
    xp = np.array([1.0, Pp, Ep])
    print("global stages, fit t = a + b*P + c*E (s, s/process, ns/event) -> at 2,000 M events, 1,024 processes:")
    g_total, fits = 0.0, {}
    for k in GLOBAL:
        y = [r["stages"].get(k, 0.0) for r in runs]
        c = _fit(X, y)
        fits[k] = c.tolist()
        g_total += float(c @ xp)
        print(f"  {k:<20} a={c[0]:8.3f}  b={c[1] * 1e3:8.3f} ms/process  c={c[2] * 1e9:8.3f} ns/event"
              f"  -> {float(c @ xp):9.1f} s")
    # the task rounds: worker-seconds (2 workers) per event and per process; in parallel over W workers
    ws = _fit(X, [2 * r["tasks_s"] for r in runs])
    # memory: a worker holds one part at a time -> events per part; the driver: processes and events
    per_part = E / P
    wm = _fit(np.stack([np.ones_like(P), per_part], 1), [r["worker_peak_mib"] for r in runs])
    dm = _fit(X, [r["driver_peak_mib"] for r in runs])
    print(f"task rounds: {ws[0]:.2f} + {ws[1] * 1e3:.2f} ms/process + {ws[2] * 1e9:.1f} ns/event worker-seconds; "
          f"worker peak RSS {wm[0]:.0f} MiB + {wm[1] * 1e3:.3f} MiB per 1,000 events of its part; driver peak RSS "
          f"{dm[0]:.0f} MiB + {dm[1]:.3f} MiB/process + {dm[2] * 1e6:.4f} MiB per M events")
    proj = {}
    for W in PAPER["workers"]:
        tasks = float(ws @ xp) / W
        total = tasks + g_total
        proj[W] = dict(tasks_s=tasks, global_s=g_total, total_s=total, global_share=g_total / total,
                       worker_mib=float(wm @ [1.0, Ep / Pp]), driver_mib=float(dm @ xp))
        print(f"projection 2,000 M events, 1,024 processes, {W} workers: task rounds {tasks:,.0f} s + global "
              f"{g_total:,.0f} s = {total:,.0f} s ({total / 60:.1f} min; global {100 * g_total / total:.0f} %), "
              f"per-worker peak {proj[W]['worker_mib']:,.0f} MiB ({Ep / Pp / 1e6:.2f} M events per part), "
              f"driver {proj[W]['driver_mib']:,.0f} MiB")
    print("(assumes the task rounds spread evenly over the workers -- 1,024 parts >= 64 workers -- and a shared "
          "filesystem as fast per worker as this disk; the fit is from this 2-core machine.  perfetto_s and "
          "figures_s are what the driver still waits for at the end, beside rounds that grow with the events: "
          "fitted linearly they read as a cost per event, which they are not -- docs/cluster.md projects from "
          "the 1,000 M-event run instead)")
    benchmark.extra_info.update(runs=runs, global_fits=fits, tasks_fit=ws.tolist(), worker_mem_fit=wm.tolist(),
                                driver_mem_fit=dm.tolist(), projection=proj)


def test_memory_vs_size(benchmark, tmp_path):
    """Peak RSS per worker and of the driver against the capture's size (one run per size, --cluster local:2):
    the decode tasks read at most SIGMATRACE_CLUSTER_PART_BYTES each; the later per-part tasks hold one part
    (here one process: events / 128)."""
    runs = []

    def go():
        for E in MEM_SIZES:
            cap = tmp_path / f"cap-{E}.bin"
            n, gen_s = make_capture(cap, E)
            size = cap.stat().st_size
            r = run_report(cap, "cluster:2", tmp_path / f"out-{E}")
            cap.unlink(missing_ok=True)
            r.update(file_mib=size / 2**20, gen_s=gen_s, mode=f"{n / 1e6:.0f}M ev")
            runs.append(r)

    benchmark.pedantic(go, rounds=1, iterations=1)
    bad = [r for r in runs if "error" in r]
    assert not bad, bad[0]["error"]
    print(f"\nmemory against capture size, --cluster local:2, one run each (part bytes: "
          f"{os.environ.get('SIGMATRACE_CLUSTER_PART_BYTES', 'default')}):")
    print(f"{'events':>12} {'file MiB':>9} {'procs':>6} {'ev/part':>9} {'decode tasks':>13} {'wall s':>8} "
          f"{'worker peak MiB':>16} {'driver peak MiB':>16}")
    for r in runs:
        t = r["timings"].get("cluster_tasks", {})
        print(f"{r['events']:>12,} {r['file_mib']:>9.0f} {r['processes']:>6} {r['events'] // r['processes']:>9,} "
              f"{t.get('decode', 0):>13} {r['wall_s']:>8.1f} {r['worker_peak_mib']:>16.0f} "
              f"{r['driver_peak_mib']:>16.0f}")
    _stages(runs)
    benchmark.extra_info.update(runs=runs)


@pytest.mark.skipif(os.environ.get("SIGMATRACE_BENCH_HUGE") != "1", reason="set SIGMATRACE_BENCH_HUGE=1")
def test_huge_capture(tmp_path):
    """One run per mode of BENCH_HUGE_MODES on a BENCH_CLUSTER_HUGE_EVENTS capture (niced)."""
    d = Path(os.environ.get("BENCH_DIR") or tmp_path)
    cap = d / "allreduce_huge.bin"
    n, gen_s = make_capture(cap, HUGE, HUGE_PROCESSES)
    print(f"\nhuge capture: {n:,} events, {cap.stat().st_size / 2**30:.1f} GiB, {HUGE_PROCESSES} processes "
          f"(written in {gen_s:.0f} s)")
    rows = []
    try:
        for m in os.environ.get("BENCH_HUGE_MODES", "cluster:2").split(","):
            rows.append(run_report(cap, m, d / f"out-huge-{m.replace(':', '')}", nice=True))
            rows[-1]["runs"] = 1
    finally:
        cap.unlink(missing_ok=True)
    _table(rows)
    _stages(rows)
    for r in rows:
        assert "error" not in r, r["error"]
