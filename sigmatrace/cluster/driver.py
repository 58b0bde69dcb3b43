"""The cluster report's driver: the rounds of per-part tasks (``shard``) on Dask, and the global stages
between them on compact columns, in the local correlator's order (``correlate.pipeline``), so that every
table, warning and statistic is the local report's.

  plan, decode      per file, per part                 -> metadata, small record types, TSC bounds
  identities, clocks (first pass), QP topology, library peers, NCCL communicators and calls   (driver)
  local             per part                           -> counts per op part, QP GPUs, unmatched, units
  QP GPUs, offsets of every part's rows, unmatched warnings, NCCL units, alternation candidates  (driver)
  match             per part (its receive completions) <- every part's sends to it
  pairs             per part, per QP pair across parts -> causal pairs' clock statistics
  refine            (driver; its second pass runs ``window_stats`` per part)
  write             per part                           -> table parts, barrier candidates, counters, earliest
  barriers, losses, aggregates, small tables, the joined doorbells / wqes                        (driver)
  summary_part      per group of parts (their ops, doorbells, wqes files), merged in a tree -> the summary's
                    and the latency sums (analysis.summable); then quantile_part per group, a pass of the
                    exact latency quantiles' selection each (analysis.quantile), merged in a tree
  the Perfetto window                                                                             (driver)
  window_rows       per part                           -> the rows the trace draws

Data moves between tasks through the scratch directory (shared filesystem, ``store``) or as small results;
nothing per event reaches this process.  ``stage_s`` gets the time of every global stage (benchmarks).
"""
from __future__ import annotations

import contextlib
import functools
import operator
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from ..correlate import clock, collectives, derived, hostlib, identity, ops
from ..correlate.doorbells import doorbell_warnings
from ..correlate.pipeline import time_range
from ..correlate.refine import alternation_candidates, merge_stats, refine
from ..correlate.result import Correlated
from ..correlate.topology import Topology
from ..decode import EventStore, FileDecode, finish_warnings
from ..errors import SigmatraceError, TraceFormatError
from ..export.perfetto import TRACK_TABLES
from ..export.window import scan_grid, top_qps
from ..schema import PART_TABLES, TABLE_NAMES
from ..tables import parquet as PQ
from . import shard, store

FAN_IN = 16                  # results merged per task in the reductions (Perfetto candidates, summary sums)
# the most bytes of a capture file one decode task reads: its decoded columns (a fraction of that) and one
# batch are what the task holds, whatever the size of the file or of the process (docs/cluster.md)
PART_BYTES = 256 << 20
CLEANUP_WAIT_S = 120         # the workers' share of removing the scratch directory, at most (Finishing.close)
REDUCE_ROWS = 1_000_000      # ops rows a summary reduction task reads at most (unless one part holds more): ~360 MiB


class Rounds:
    """Submit one task per argument tuple, follow them (progress), return their results in order; the first
    failure cancels the rest and is raised here as the task raised it.

    Every future a later task depends on (``share``, the ``tables`` round's outputs) is a task Dask can run
    again, and the caller holds it until the last stage that reads it has finished: when a worker dies, the
    scheduler recomputes what it held instead of cancelling the tasks that need it."""

    def __init__(self, client, progress, held=None, scratch=None, tasks=None):
        self.client, self.progress = client, progress or (lambda stage, n=0: None)
        self.tasks = tasks if tasks is not None else {}     # tasks submitted per stage
        self.token = uuid.uuid4().hex[:8]
        self.held = held if held is not None else Held()
        self.scratch = Path(scratch) if scratch is not None else None

    def submit(self, stage, fn, argsets, priority=0):
        argsets = list(argsets)
        self.tasks[stage] = self.tasks.get(stage, 0) + len(argsets)
        if not argsets:
            return []
        assert len({len(a) for a in argsets}) == 1, f"{stage}: tasks of one round take the same arguments"
        # one graph update for the round (client.map), not one per task: ~0.7 ms of the driver per submit
        return self.client.map(fn, *zip(*argsets), key=[f"sigmatrace-{stage}-{self.token}-{i}" for i in range(len(argsets))],
                               pure=False, priority=priority)

    def map(self, stage, fn, argsets, tick=None):
        return self.wait(stage, self.submit(stage, fn, argsets), tick)

    def wait(self, stage, futs, tick=None):
        from distributed import as_completed
        index = {f.key: i for i, f in enumerate(futs)}
        self.progress(stage, 0)
        try:
            for f in as_completed(futs):
                if f.status != "finished":
                    f.result()                      # raises the task's exception
                if tick is None:
                    self.progress(stage, 1)
                else:
                    tick(index[f.key])
            got = self.client.gather(futs)
            self.held.gathered(stage, got)
            return got
        except BaseException:
            self.client.cancel(futs)
            raise

    def share(self, name, obj):
        """A future of ``obj`` for the tasks of later stages: ``obj`` written to the scratch directory and
        loaded by a task (Dask then copies it to the workers that need it).  Not ``client.scatter``:
        scattered data has no lineage -- the scheduler forgets it with the last worker holding it (the
        active memory manager keeps a single replica of a broadcast once no task waits on it) and cancels
        every task that needs it ('already forgotten'); a task's result is recomputed from the file."""
        path = self.scratch / f"shared-{name}.pkl"
        store.save(path, obj)
        return self.client.submit(store.load, str(path), key=f"sigmatrace-shared-{name}-{self.token}", pure=False)


class Held:
    """The driver's account of what it materializes from the capture's records: per intermediate, the most
    rows it held at once (``rows``, the dict given or a new one).  Per-record intermediates are bounded by
    a constant (the Perfetto window, a Parquet batch); ``TABLE_ROWS``, the rows of the small tables built
    here (one per barrier arrival), grow with what they count, not with the events."""

    TABLE_ROWS = ("barrier_arrivals",)

    def __init__(self, rows=None):
        self.rows = rows if rows is not None else {}

    def __call__(self, name, n):
        self.rows[name] = max(self.rows.get(name, 0), int(n))
        return n

    def gathered(self, stage, results):
        """The bytes of one round's results that came back to the driver (their pickles: what crossed the
        wire; ``dask.sizeof`` samples large containers and varies from run to run), as ``bytes:<stage>``:
        what the tasks return must not grow with the events either."""
        import pickle
        key = f"bytes:{stage}"
        self.rows[key] = self.rows.get(key, 0) + sum(len(pickle.dumps(r, protocol=5)) for r in results)

    def per_record(self):
        """Rows of the per-record intermediates held at most at once (their peaks summed: an upper bound)."""
        return sum(v for k, v in self.rows.items() if k not in self.TABLE_ROWS and not k.startswith("bytes:"))

    def gathered_bytes(self, exclude=("barriers",)):
        """Bytes of task results gathered into the driver, every round but ``exclude`` (the barrier
        arrivals: rows of a small table)."""
        return sum(v for k, v in self.rows.items() if k.startswith("bytes:") and k[6:] not in exclude)



class _Timer:
    def __init__(self, into):
        self.into, self.t = into, time.perf_counter()

    def __call__(self, name):
        now = time.perf_counter()
        self.into[name] = self.into.get(name, 0.0) + now - self.t
        self.t = now


def correlate_and_write(client, files, out_dir, progress=None, workers=None, clock_refine="auto", perfetto=True,
                        max_perfetto_events=500_000, batch_records=None, refine_windows=16, bins=400,
                        stage_s=None, held=None, part_bytes=None, tasks=None, figures=True):
    """Correlate the capture ``files`` on the Dask cluster of ``client`` and write every table under
    ``out_dir/tables``; returns (``Correlated`` with the small tables, a ``Finishing``: the Perfetto trace
    ``out_dir/trace.pftrace``, still being written by tasks; close it when the report is done).
    ``stage_s``: gets the seconds of every stage; ``held``: a ``Held`` (or a dict it fills), what this
    process materialized of the capture's records (tests and benchmarks: it must not grow with the capture).
    ``tasks``: a dict that gets the number of tasks of every round; ``figures``: the figures' sums too.
    ``part_bytes``: the most bytes of a capture file one ``decode`` task reads (default PART_BYTES, or
    SIGMATRACE_CLUSTER_PART_BYTES): a file, or a process, larger than that is decoded in several tasks."""
    from ..decode import DEFAULT_BATCH_RECORDS
    out_dir = Path(out_dir).resolve()
    scratch = Path(tempfile.mkdtemp(prefix=".sigmatrace-cluster-", dir=out_dir.parent))
    stage_s = stage_s if stage_s is not None else {}
    R = Rounds(client, progress, held if isinstance(held, Held) else Held(held), scratch, tasks)
    fin = Finishing(R, scratch, stage_s)
    try:
        with lost_cluster():
            out = _report(R, fin, files, out_dir, scratch, workers, clock_refine, perfetto, max_perfetto_events,
                          batch_records or DEFAULT_BATCH_RECORDS, refine_windows, bins, stage_s, R.held,
                          part_bytes_of(part_bytes), figures)
        return out, fin
    except BaseException:
        fin.close(failed=True)
        raise


@contextlib.contextmanager
def lost_cluster():
    """A report the Dask cluster lost (a task's worker died too often, a future cancelled) as one line."""
    from distributed import KilledWorker
    from distributed.client import FutureCancelledError
    try:
        yield
    except (KilledWorker, FutureCancelledError) as e:
        raise SigmatraceError(f"the Dask cluster lost the report: {type(e).__name__}: {e}") from None


class Finishing:
    """What still runs when ``correlate_and_write`` returns: the Perfetto trace's tasks (``_perfetto``), which
    the summary reductions did not wait for.  ``perfetto()`` waits for the trace; ``close()`` lets go of the
    tasks and removes the scratch directory they read."""

    def __init__(self, R, scratch, stage_s):
        self.R, self.scratch, self.stage_s = R, scratch, stage_s
        self.futures, self.trace = [], None

    def perfetto(self):
        """The Perfetto trace's statistics (``write_perfetto``'s), once the task has written it; None without
        one.  ``stage_s`` gets perfetto_trace_task, the task's own time."""
        if self.trace is None:
            return None
        with lost_cluster():
            got = self.R.wait("perfetto", [self.trace])[0]
        self.stage_s["perfetto_trace_task"] = got["seconds"]
        return got["stats"]

    def close(self, failed=False):
        """The tasks let go of and the scratch directory removed: by the workers first, FAN_IN directories a
        task, unless the report ``failed`` (the cluster may be what failed), then what is left here.  Its
        files are a dozen per part (12,301 at 1,024 parts took the driver 1.8 s to unlink alone; on a shared
        filesystem each unlink is a round trip to its metadata server)."""
        if self.futures:
            self.R.client.cancel(self.futures)
        self.futures, self.trace = [], None
        try:
            dirs = sorted(str(p) for p in self.scratch.iterdir() if p.is_dir())
        except OSError:
            dirs = []
        if not failed and len(dirs) > FAN_IN:
            from distributed import wait
            groups = [dirs[i:i + FAN_IN] for i in range(0, len(dirs), FAN_IN)]
            futs = []
            try:
                futs = self.R.client.map(store.remove_trees, groups, pure=False,
                                         key=[f"sigmatrace-cleanup-{self.R.token}-{i}" for i in range(len(groups))])
                wait(futs, timeout=CLEANUP_WAIT_S)
            except Exception:       # noqa: BLE001 -- whatever the workers did not remove goes below
                self.R.client.cancel(futs)
        shutil.rmtree(self.scratch, ignore_errors=True)


def part_bytes_of(given=None):
    """The byte-range bound of a ``decode`` task: ``given``, else SIGMATRACE_CLUSTER_PART_BYTES, else
    PART_BYTES; a one-line error when it is not a positive number of bytes."""
    v = given if given is not None else os.environ.get("SIGMATRACE_CLUSTER_PART_BYTES")
    if v is None:
        return PART_BYTES
    try:
        n = int(float(v))
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise SigmatraceError(f"the cluster part size must be a positive number of bytes, not {v!r}")
    return n


def _report(R, fin, files, out_dir, scratch, workers, clock_refine, perfetto, K, batch_records, refine_windows,
            bins, stage_s, held, part_bytes, figures):
    T0 = _Timer(stage_s)
    files = [str(f) for f in files]
    absf = [str(Path(f).resolve()) for f in files]
    planned = R.map("plan", shard.plan_file, [(f, a, part_bytes) for f, a in zip(files, absf)])
    T0("plan_tasks")
    parts, part_file = [], []
    for fi, (_, spans) in enumerate(planned):
        for a, b, ranges in spans:
            parts.append(shard.Part(len(parts), files[fi], absf[fi], a, b, str(scratch), tuple(ranges)))
            part_file.append(fi)
    jobs = [(k, j) for k, p in enumerate(parts) for j in range(len(p.ranges))]
    left = {}
    for k, _ in jobs:
        left[part_file[k]] = left.get(part_file[k], 0) + 1

    def tick(i):
        fi = part_file[jobs[i][0]]
        left[fi] -= 1
        if not left[fi]:
            R.progress("decode", 1)
    got = R.map("decode", shard.decode, [(parts[k], j, batch_records) for k, j in jobs], tick=tick)
    by_part = {}
    for (k, _), r in zip(jobs, got):
        by_part.setdefault(k, []).append(r)
    metas = [shard.merge_decoded(parts[k].path, by_part[k]) for k in range(len(parts))]
    del got, by_part
    T0("decode_tasks")
    out = Correlated()
    out.batch_records, out.workers, out.files = int(batch_records), max(1, int(workers or 1)), files
    procs, where, bounds, keys = _processes(out, files, planned, parts, part_file, metas)
    n = len(procs)
    st = EventStore(procs)
    out.stats["events"] = int(sum(p.n_events for p in procs))
    out.stats["processes"] = n
    # ---- identities, first-pass clocks, QP topology, library peers, NCCL calls --------------------------
    tables = out.tables
    nodes = identity.processes_and_nodes(out, st, procs)
    node_of, ranks, labels = nodes.node_of, nodes.ranks, nodes.labels
    clocks = clock.fit_nodes(out, procs, nodes)
    out.clock = clocks
    pollers = identity.threads(out, st, procs, node_of)
    gpus = identity.Gpus(procs, nodes)
    gpus.register(pollers)
    nics = identity.Nics(procs, node_of)
    topo = Topology(out, st, procs, nics, keys)
    peers = hostlib.Peers({t: st.table(t) for t in hostlib.ID_TYPES}, procs)
    out._peers = peers
    coll = collectives.Collectives(out, st, procs, topo, tables["threads"], node_of)
    active = sorted({k for k, _ in where})
    part_of_process = np.array([k for k, _ in where], np.int64)
    first = {k: int(np.flatnonzero(part_of_process == k)[0]) for k in active}
    ctx = dict(topo=topo, pollers=pollers, gpus=_detached(gpus, "procs"), peers=peers, node_of=node_of, ranks=ranks,
               coll=_detached(coll, "procs", "warnings") if coll.comms else None, clocks=clocks,
               part_of_process=part_of_process)
    T0("identity_topology")
    ctx_f = R.share("ctx", ctx)
    loc = R.map("correlate", shard.local, [(parts[k], ctx_f, [i for kk, i in where if kk == k], first[k])
                                           for k in active])
    T0("local_tasks")
    loc = dict(zip(active, loc))
    # ---- QP GPUs, row offsets, unmatched operations, NCCL units -----------------------------------------
    qp_gpu = np.full(topo.n, -1, np.int64)
    for k in active:
        r = loc[k]
        qlo, qhi = r["qp_range"]
        for i, v in zip(range(qlo, qhi), r["log_sq"]):
            topo.row_at(i)["log_sq_size"] = v
        qp_gpu[qlo:qhi] = r["qp_gpu"]
        for p_, o_ in r["gpu_uses"]:
            gpus.id(p_, o_)
    out.warnings.extend(doorbell_warnings(sum(loc[k]["missing_wqe_side"] for k in active),
                                          sum(loc[k]["bad_wqes"] for k in active)))
    link, ofi_link = {}, {}
    for k in active:
        for lib, v in loc[k]["peers_total"].items():
            peers.total[lib] = peers.total.get(lib, 0) + v
        for lib, rs in loc[k]["peers_unmatched"].items():
            d = peers.unmatched.setdefault(lib, {})
            for why, c in rs.items():
                d[why] = d.get(why, 0) + c
        for key, v in loc[k]["ucp_link"].items():
            link[key] = link.get(key, 0) + v
        for key, v in loc[k]["ofi_link"].items():
            ofi_link[key] = ofi_link.get(key, 0) + v
    out.stats["ucp_wqe_link"], out.stats["ofi_wqe_link"] = link, ofi_link
    ops.explain_unmatched(out, ops.merge_unmatched([loc[k]["unmatched"] for k in active]), peers)
    coll.merge_units([loc[k]["unit_stats"] for k in active])
    g = _offsets(active, loc)
    T0("offsets_units")
    # ---- send -> receive, then the causal pairs ---------------------------------------------------------
    sources = {t: [(k, *loc[k]["send_index"][t], g[k]["op_local"], g[k]["op_global"]) for k in active
                   if t in loc[k]["send_index"]] for t in active}
    matched = R.map("match", shard.match, [(parts[t], None, sources[t], g[t]["completion"]) for t in active])
    T0("match_tasks")
    back = dict(zip(active, matched))
    targets = {s: [(t, *back[t][s]) for t in active if s in back[t]] for s in active}
    qp_ops = np.zeros(topo.n, np.int64)
    for k in active:
        qlo, qhi = loc[k]["qp_range"]
        qp_ops[qlo:qhi] = loc[k]["qp_ops"]
    part_of_qp = part_of_process[topo.process] if topo.n else np.zeros(0, np.int64)
    groups = {}
    for qa, qb in alternation_candidates(qp_ops, node_of[topo.process] if topo.n else qp_ops, topo.remote):
        groups.setdefault((int(part_of_qp[qa]), int(part_of_qp[qb])), []).append(
            (qa, int(part_of_qp[qa]), qb, int(part_of_qp[qb])))
    alt_dirs = [len(parts) + i for i in range(len(groups))]
    futs = R.submit("pairs", shard.pairs, [(parts[s], ctx_f, targets[s]) for s in active])
    futs += R.submit("alternation", shard.alternation, [(str(scratch), d, ctx_f, c)
                                                         for d, c in zip(alt_dirs, groups.values())])
    got = R.wait("pairs", futs)
    pair_dirs = [parts[s].dir for s in active] + [shard.store.part_dir(scratch, d) for d in alt_dirs]
    T0("pair_tasks")
    # ---- clock refinement (F24b) ------------------------------------------------------------------------
    R.progress("clock", 0)
    src = _ClusterPairs(R, pair_dirs, got, stage_s)
    out.clock_info = refine(clocks, src, clock_refine, windows=refine_windows)
    clock.refined_warnings(out, clocks, labels)
    T0("refine")
    # ---- tables on the final time base ------------------------------------------------------------------
    to_ns = clock.TimeBase(clocks, node_of)
    tables["qps"] = topo.table(node_of, ranks, qp_gpu)
    tables["qps"]["comm"] = coll.qp_comm[:topo.n].astype(np.int64)
    tables["qps"]["comm_rule"] = coll.qp_rule
    tables["collectives"], tables["communicators"] = coll.tables(to_ns, node_of, ranks)
    tables["nics"] = nics.table()
    tables["gpus"] = gpus.table()
    tables["nodes"] = dict(node=np.arange(len(labels), dtype=np.int64), label=np.array(labels, dtype=object),
                           processes=np.bincount(node_of, minlength=len(labels)).astype(np.int64))
    out.procs, out.proc_node, out._to_ns = procs, node_of, to_ns
    out.stats["time_range_ns"] = time_range(bounds, to_ns)
    tables["clock"] = clock.clock_table(clocks, labels)
    tdir = out_dir / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    files_of = _part_files(tdir, active, loc, g, {k: any(_has_events(where, bounds, k)) for k in active})
    tr = out.stats["time_range_ns"]
    ctx5 = dict(ctx, clocks=clocks, qp_gpu=qp_gpu, coll=_detached(coll, "procs", "warnings") if coll.comms else None,
                max_events=int(K), perfetto=bool(perfetto), batch_records=int(batch_records),
                grid=scan_grid(tuple(tr) if tr else (0, 0), bins), n_gpu=len(tables["gpus"]["gpu"]),
                n_node=len(labels), n_qp=topo.n)
    T0("final_tables")
    ctx5_f = R.share("ctx5", ctx5)
    wf = R.submit("tables", shard.write, [(parts[k], ctx5_f, g[k], files_of[k]) for k in active])
    res_f = [R.client.submit(operator.getitem, f, 0, key=f"{f.key}-result") for f in wf]
    topk_f = [R.client.submit(operator.getitem, f, 1, key=f"{f.key}-earliest") for f in wf]
    written = R.wait("tables", res_f)
    T0("write_tasks")
    if perfetto:        # tasks from here on, in parallel with what follows (Finishing waits for the trace)
        _perfetto(R, fin, parts, active, ctx5_f, g, topk_f, written, loc, K, ctx5, tables, out_dir / "trace.pftrace")
        fin.futures += wf          # the candidates' own inputs
    else:
        R.client.cancel(topk_f)
    T0("perfetto_submit")
    # ---- barriers, losses, aggregates, the small tables, doorbells / wqes -------------------------------
    _barriers(R, out, parts, active, [w["barrier_counts"] for w in written], held)
    derived.build_losses(out, procs, (np.concatenate([loc[k]["lost_wqebbs"] for k in active]),
                                      np.concatenate([loc[k]["incomplete"] for k in active])))
    derived.build_aggregates(out, procs, topo.of, topo.remote, topo.process, qp_gpu, node_of, ranks)
    PQ.write_tables(out, tdir, names=[t for t in TABLE_NAMES if t not in PART_TABLES + ("doorbells", "wqes")])
    for name in ("doorbells", "wqes"):
        held(f"{name}_join_batch", PQ.join_parts([parts[k].dir / f"{name}.parquet" for k in active],
                                                 tdir / f"{name}.parquet"))
    T0("small_tables")
    out.summed, lat_values = _summed(R, out_dir, parts, active, files_of, figures)
    T0("summary_reduce_tasks")
    out.latency = _latency(R, out.summed, lat_values, figures)
    T0("latency_reduce_tasks")
    return out


def _reduce_groups(R, active, files_of):
    """The parts in consecutive groups, one reduction task each: about equal ops rows per group, at most
    ``REDUCE_ROWS`` (unless one part holds more), at least two groups per worker thread while there are parts
    enough.  A part is small next to a task's fixed cost (a query connection over the report, Dask's own)
    in a capture of many small processes; grouped, a task's work is bounded by REDUCE_ROWS, not the capture."""
    rows = [sum(hi - lo for _, lo, hi in files_of[k].get("ops", ())) for k in active]
    threads = max(1, sum(R.client.nthreads().values()))
    n = min(len(active), max(2 * threads, -(-sum(rows) // REDUCE_ROWS)))
    w = [r + 1 for r in rows]             # an empty part still costs a little
    target = sum(w) / n
    groups, cur, acc = [], [], 0
    for k, r in zip(active, w):
        if cur and acc + r / 2 > target * (len(groups) + 1) and len(groups) < n - 1:
            groups.append(cur)
            cur = []
        cur.append(k)
        acc += r
    return groups + [cur]


def _summed(R, out_dir, parts, active, files_of, figures):
    """The summary's and figures' sums over the per-record tables (``analysis.summable``: totals, opcodes,
    matrices, GPU volumes, the time span, doorbell and WQE counts, the ``part`` rows of the split named
    queries, the latency sums; with ``figures`` then the bandwidth bins) as Dask reductions: one task per group
    of parts (``_reduce_groups``) over their ops, doorbells and wqes files (and one for the aggregate-mode
    counters), merged in a tree of FAN_IN; only the root (one row per key: node / rank / GPU / process pair,
    QP, GPU, opcode, latency group, bin) comes here, not the rows.  Returns it and the files where each task
    left its latency values (sorted per group) for the quantile passes (``_latency``)."""
    from ..analysis import bandwidth_bin_ns
    from ..analysis.summable import BINNED, LATENCY, LATENCY_HIST, SUMMARY, merge, span_ns
    groups = _reduce_groups(R, active, files_of)
    tables = [{"ops": [p for k in grp for p, _, _ in files_of[k].get("ops", ())],
               "doorbells": [str(parts[k].dir / "doorbells.parquet") for k in grp],
               "wqes": [str(parts[k].dir / "wqes.parquet") for k in grp]} for grp in groups]
    values = [str(R.scratch / f"latency-values-{i}.pkl") for i in range(len(groups))]
    names = SUMMARY + LATENCY + ((LATENCY_HIST,) if figures else ())
    got = _reduce(R, "summary", shard.summary_part, [(str(out_dir), t, names, None, v) for t, v in zip(tables, values)] +
                  [(str(out_dir), {"aggregates": None}, SUMMARY, None, None)], merge)
    if figures:
        bins = dict(bin_ns=bandwidth_bin_ns(span_ns(got)))
        got.update(_reduce(R, "bandwidth", shard.summary_part, [(str(out_dir), {"ops": t["ops"]}, tuple(BINNED), bins)
                                                                for t in tables if t["ops"]], merge))
    return got, values


def _latency(R, got, values, figures):
    """``analysis.latency_reduction`` from the parts: their sums (in ``got``, ``_summed``'s) and the exact
    quantiles by radix selection (``analysis.quantile.Selection``), each pass one ``quantile_part`` task per
    values file (a group of parts' values, sorted), the bucket counts merged in a tree (2 passes for
    latencies below 2**32 ns).  None when some QP's rows are in two groups of parts (its intervals would
    cross them): the driver then queries the written tables as the local report does."""
    from ..analysis import LATENCY_QS, WR_GROUP, latency_stats
    from ..analysis.quantile import Selection, merge_counts
    from ..analysis.summable import LATENCY_HIST, rows
    if not _qps_in_one_part(got):
        return None
    names = ("latency_groups", "wr_latency") + ((LATENCY_HIST,) if figures else ())
    sums = {name: rows(got, name) for name in names}
    sel = Selection(latency_stats(sums), LATENCY_QS)
    n = 0
    while sel.targets:
        n += 1
        rg = sel.ranges()
        sel.feed_ranges(_reduce(R, f"quantiles{n}", shard.quantile_part, [(v, rg) for v in values], merge_counts))
    q = sel.result()
    wr_q = q.pop(WR_GROUP, None)
    return {"sums": sums, "quantiles": q, "wr_quantiles": wr_q}


def _qps_in_one_part(latency_sums):
    """Whether every QP's ops and doorbells are in one part (``summable``'s latency_qps, summed)."""
    return all(v[0] <= 1 for v in latency_sums["latency_qps"][1].values())


def _tree(R, leaves, combine, name, priority=0):
    """Futures ``leaves`` combined in a tree of FAN_IN-input tasks of ``combine`` (keys
    ``sigmatrace-<name>-...``, Dask ``priority``): every level, the root's last.  The caller holds them all
    until the root is in, so a lost one is recomputed from its inputs."""
    levels = [leaves]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([R.client.submit(combine, *below[i:i + FAN_IN],
                                       key=f"sigmatrace-{name}-{R.token}-{len(levels)}-{i}", pure=False,
                                       priority=priority)
                       for i in range(0, len(below), FAN_IN)])
    return levels


def _reduce(R, stage, fn, argsets, combine):
    """``fn`` over every argument tuple (one task each), the results combined in a tree (``_tree``) of
    ``combine``; the root's result."""
    levels = _tree(R, R.submit(stage, fn, argsets), combine, f"summed-{stage}")
    return R.wait(stage, levels[-1])[0]


def _barriers(R, out, parts, active, counts, held):
    """The barrier tables from the parts' hit counts per (address, participant): the barrier addresses and
    series here (one row per pair, not per hit), then each part's arrivals (one row per barrier instance and
    participant).  When a participant's hits are in several parts (a GPU shared by processes of two files)
    the parts' candidates are gathered instead (``held``: barrier_candidates)."""
    owner = {}
    for i, c in enumerate(counts):
        for p in np.unique(c["participant"]).tolist():
            owner.setdefault(p, set()).add(i)
    held("barrier_counts", sum(len(c["count"]) for c in counts))
    if any(len(v) > 1 for v in owner.values()):
        got = R.map("barriers", shard.barrier_candidates, [(parts[k],) for k in active])
        cand = {c: np.concatenate([w[c] for w in got]) for c in got[0]}
        held("barrier_candidates", len(cand["op_id"]))
        o = np.argsort(cand["op_id"], kind="stable")
        derived.build_barriers(out, {c: v[o] for c, v in cand.items()})
        return
    series = derived.barrier_series({c: np.concatenate([w[c] for w in counts]) for c in counts[0]})
    if not len(series["series"]):
        derived.barrier_tables(out, np.zeros((0, 3), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        return
    got = R.map("barriers", shard.barrier_arrivals, [(parts[k], series) for k in active])
    uk = np.concatenate([a for a, _, _ in got])
    arr_ns = np.concatenate([b for _, b, _ in got])
    arr_op = np.concatenate([c for _, _, c in got])
    held("barrier_arrivals", len(uk))
    o = np.lexsort((uk[:, 2], uk[:, 1], uk[:, 0]))
    derived.barrier_tables(out, uk[o], arr_ns[o], arr_op[o])


def _detached(obj, *attrs):
    """A shallow copy of ``obj`` without the attributes the workers must not receive (every process's
    metadata) -- they are not read by the per-part stages."""
    import copy
    c = copy.copy(obj)
    for a in attrs:
        setattr(c, a, None)
    return c


def _processes(out, files, planned, parts, part_file, metas):
    """The capture's processes in the local correlator's order, with its warnings and losses (duplicated
    process uids dropped): (metadata, (part, index in the part) of each, TSC bounds, implicit-QP records)."""
    for w, _ in planned:
        out.warnings.extend(w)
    procs, where, bounds, seen = [], [], [], {}
    qp_keys = {n: ([], []) for n in shard.QP_NAMING}
    for fi, path in enumerate(files):
        ks = [k for k, f in enumerate(part_file) if f == fi]
        fd = FileDecode(path)
        for k in ks:
            err, warns, losses, meta = metas[k]
            if err and fd.error is None:
                fd.error = err
            fd.warnings.extend(warns)
            fd.losses.extend(losses)
            fd.processes.extend((k, i, m) for i, m in enumerate(meta))
        items = fd.processes
        fd.processes = [m[0] for _, _, m in items]
        finish_warnings(fd)
        if fd.error:
            out.warnings.append(f"{fd.error}; file skipped")
        out.warnings.extend(fd.warnings)
        out.losses.extend(fd.losses)
        for k, i, (p, b, qk) in items:
            if p.uid in seen:
                out.warnings.append(f"{p.path}: process uid {p.uid:#x} duplicates the one in {seen[p.uid]}; ignored")
                continue
            seen[p.uid] = p.path
            gi = len(procs)
            procs.append(p)
            where.append((k, i))
            if b is not None:
                bounds.append((gi, b[0], b[1]))
            for name, q in qk.items():
                qp_keys[name][0].append(np.full(len(q), gi, np.int64))
                qp_keys[name][1].append(q)
    for path, off, nb, why in out.losses:
        out.warnings.append(f"{path}: lost {nb} bytes at offset {off}: {why}")
    if not procs:
        raise TraceFormatError("no process data could be read from the capture", files[0] if files else None)
    keys = []
    for name in shard.QP_NAMING:
        pr, q = qp_keys[name]
        pr = np.concatenate(pr) if pr else np.zeros(0, np.int64)
        keys.append(dict(tsc=np.zeros(len(pr), np.uint64), process=pr,
                         qpn=np.concatenate(q) if q else np.zeros(0, np.int64)))
    return procs, where, bounds, keys


def _has_events(where, bounds, k):
    with_events = {gi for gi, _, _ in bounds}
    return [gi in with_events for gi, (kk, _) in enumerate(where) if kk == k]


def _offsets(active, loc):
    """Per part: where its rows go in the global tables (op parts, matched ops = flows, completions,
    doorbells, WQEs)."""
    op = np.array([loc[k]["op_parts"] for k in active], np.int64).reshape(len(active), -1)
    fl = np.array([loc[k]["op_matched"] for k in active], np.int64).reshape(len(active), -1)
    g = {}
    bases = {}
    for name, m in (("op", op), ("flow", fl)):
        tot = m.sum(0)
        part_base = np.concatenate([[0], np.cumsum(tot)[:-1]])
        before = np.cumsum(m, 0) - m               # rows of earlier parts, per op part
        bases[name] = (part_base[None, :] + before, np.cumsum(m, 1) - m)
    for name in ("completion", "doorbell", "wqe"):
        v = np.array([loc[k][{"completion": "n_wc", "doorbell": "n_doorbells", "wqe": "n_wqes"}[name]]
                      for k in active], np.int64)
        bases[name] = np.cumsum(v) - v
    for s, k in enumerate(active):
        g[k] = dict(op_global=bases["op"][0][s], op_local=bases["op"][1][s], flow_global=bases["flow"][0][s],
                    flow_local=bases["flow"][1][s], completion=int(bases["completion"][s]),
                    doorbell=int(bases["doorbell"][s]), wqe=int(bases["wqe"][s]), qp_range=loc[k]["qp_range"],
                    op_counts=op[s], flow_counts=fl[s])
    return g


def _part_files(tdir, active, loc, g, has_events):
    """The part files each part writes: ops and flows per op part (op part order, then part order, as the
    rows' global order), completions and events per part; one empty part when a table has no rows."""
    segs = {name: [] for name in PART_TABLES}
    nparts = len(g[active[0]]["op_counts"])
    for j in range(nparts):
        for k in active:
            lo = int(g[k]["op_local"][j])
            hi = lo + int(g[k]["op_counts"][j])
            if hi > lo:
                segs["ops"].append((k, lo, hi))
                if g[k]["flow_counts"][j]:
                    segs["flows"].append((k, lo, hi))
    for k in active:
        if loc[k]["n_wc"]:
            segs["completions"].append((k, 0, loc[k]["n_wc"]))
        if has_events[k]:
            segs["events"].append((k, 0, 0))
    files = {k: {} for k in active}
    for name, lst in segs.items():
        d = PQ._fresh_dir(tdir / name)
        if not lst:
            lst = [(active[0], 0, 0)]
        width = max(5, len(str(len(lst) - 1)))
        for i, (k, lo, hi) in enumerate(lst):
            path = str(d / f"part-{i:0{width}d}.parquet")
            files[k].setdefault(name, []).append(path if name == "events" else (path, lo, hi))
    return files


class _ClusterPairs:
    """``refine``'s pair source: first-pass statistics from the ``pairs`` tasks, the second pass by
    ``window_stats`` tasks over the pair files."""

    def __init__(self, R, dirs, got, stage_s):
        self.R, self.dirs, self.stage_s = R, dirs, stage_s
        self.count = sum(c for c, _ in got)
        self.first = merge_stats(s for _, s in got)

    def stats(self, plan=None):
        if plan is None:
            return self.first
        t = time.perf_counter()
        res = merge_stats(self.R.map("clock", shard.window_stats, [(str(d), plan) for d in self.dirs]))
        self.stage_s["refine_window_tasks"] = time.perf_counter() - t
        return res


def _perfetto(R, fin, parts, active, ctx5_f, g, topk_f, written, loc, K, ctx5, tables, path):
    """The Perfetto trace as tasks, submitted and not waited for (``fin`` holds them): the earliest of each
    kind reduced in a tree of ``merge_earliest`` tasks, the cut at its root (``window_cut_of``), every part's
    drawn rows (``window_rows``), the trace written from them (``perfetto_trace``).  Only the counters (per
    bin and QP, summed here) and the event counts come from the driver.  Their Dask priority (shard.TRACE_PRIORITY)
    puts them before the figures' tasks when both are ready: the trace is the longest of what the driver
    waits for at the end."""
    levels = _tree(R, topk_f, functools.partial(shard.merge_earliest, K), "earliest", shard.TRACE_PRIORITY)
    n_host = sum(w["n_host"] for w in written)
    n_db = sum(loc[k]["n_doorbells"] for k in active)
    n_ops = int(sum(g[k]["op_counts"].sum() for k in active))
    cut_f = R.client.submit(shard.window_cut_of, levels[-1][0], K, n_host + n_db + n_ops, n_host,
                            key=f"sigmatrace-cut-{R.token}", pure=False, priority=shard.TRACE_PRIORITY)
    grid = ctx5["grid"]
    nb = grid[2]
    gpu, node = np.zeros(ctx5["n_gpu"] * nb), np.zeros(ctx5["n_node"] * nb)
    qtot = np.zeros(ctx5["n_qp"])
    for k, w in zip(active, written):
        for into, (rows, vals) in ((gpu, w["gpu"]), (node, w["node"])):
            into.reshape(-1, nb)[rows] += vals
        qlo, qhi = g[k]["qp_range"]
        qtot[qlo:qhi] = w["qtot"]
    top = top_qps(qtot)
    rows_f = R.submit("perfetto", shard.window_rows,
                      [(parts[k], ctx5_f, g[k], cut_f, [q for q in top if g[k]["qp_range"][0] <= q < g[k]["qp_range"][1]])
                       for k in active], shard.TRACE_PRIORITY)
    meta = dict(tables={t: tables[t] for t in TRACK_TABLES if t in tables}, n_host=n_host, n_doorbells=n_db, n_ops=n_ops,
                grid=grid, gpu=gpu, node=node, top_qps=top, max_events=int(K))
    fin.trace = R.client.submit(shard.perfetto_trace, str(path), meta, cut_f, *rows_f,
                                key=f"sigmatrace-trace-{R.token}", pure=False, priority=shard.TRACE_PRIORITY)
    # held until the trace is in: a lost result is recomputed from its inputs
    fin.futures = [f for level in levels for f in level] + [cut_f, *rows_f, fin.trace, ctx5_f]

