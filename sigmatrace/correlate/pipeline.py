"""The correlator (F16, F24a, F24b): capture files -> ``Correlated`` columnar tables.

Stages, each in its own module (vectorised; Python loops only over processes, QPs and nodes):
 1. decode every file in a process pool, merge the compact outputs into one ``EventStore`` (``pool``);
 2. processes, nodes, threads, GPUs, NICs from the headers and hijack records (``identity``);
 3. per-node TSC -> ns fit from calibration pairs (``clock.fit_nodes``);
 4. QP topology: local QPs (verbs and DevX) and their remote QPs across processes and nodes (``topology``);
 5. doorbells and recovered WQEs, doorbell <-> WQE association by QPN and unwrapped producer index
    (``doorbells``);
 6. operations with their peer side, post -> completion and send <-> receive matching (``ops``);
 7. F24b clock refinement from matched operations (``clock.matched_pairs``, ``clock.refine_nodes``), then
    every ``*_ns`` column on the final time base;
 8. NCCL communicators and collectives, the work requests each caused (``collectives``: QP ownership and
    attribution in TSC of each process, tables on the final time base);
 9. flows, barriers, losses, aggregates (``derived``).
"""
from __future__ import annotations

import os

import numpy as np

from ..decode import DEFAULT_BATCH_RECORDS, EventStore
from ..errors import TraceFormatError
from ..format.reader import capture_files
from . import clock, collectives, derived, doorbells, hostlib, identity, ops
from .pool import decode_all, memtrace, trim
from .result import Correlated, LazyTable
from .topology import Topology

# the record types with one row per operation or completion: merged from the per-process parts in threads
_LARGE_TYPES = ("IBV_SEND_WR", "IBV_WC", "IBV_POST_SEND", "IBV_WR_COMPLETE", "DB_DOORBELL", "DB_WQE")


def correlate(capture, workers=None, clock_refine="auto", progress=None, refine_windows=16,
              batch_records=DEFAULT_BATCH_RECORDS) -> Correlated:
    """Correlate a capture (file, directory of process files, or list of files).

    ``clock_refine``: "auto" (refine from matched operations when calibration
    pairs are missing, not PTP-disciplined, or disagree with them), "always",
    "never".  ``progress``: optional callable(stage, n, total, unit) (sigmatrace.progress): the decode stage
    counts files, the correlate stage its CORRELATE_STEPS.
    ``batch_records``: records decoded at a time per worker (bounds memory); the
    events table is not held in memory: ``Correlated.tables["events"]`` loads on
    first access, ``tables.write_tables`` streams it in row groups.
    """
    out = Correlated()
    out.batch_records = int(batch_records)
    out.workers = max(1, int(workers if workers is not None else (os.cpu_count() or 1)))
    paths = capture_files(capture)
    out.files = [str(p) for p in paths]
    if progress:
        progress("decode", 0, total=len(paths), unit="file")
    tick = (lambda n: progress("decode", n)) if progress else None
    memtrace("start")
    results = decode_all(paths, workers, tick, batch_records, warnings=out.warnings)
    memtrace("decoded")
    procs = []
    seen = {}
    for r in results:
        if r.error:
            out.warnings.append(f"{r.error}; file skipped")
        out.warnings.extend(r.warnings)
        out.losses.extend(r.losses)
        for p in r.processes:
            if p.uid in seen:
                out.warnings.append(f"{p.path}: process uid {p.uid:#x} duplicates the one in {seen[p.uid]}; ignored")
                continue
            seen[p.uid] = p.path
            procs.append(p)
    del results
    for path, off, nb, why in out.losses:
        out.warnings.append(f"{path}: lost {nb} bytes at offset {off}: {why}")
    if not procs:
        raise TraceFormatError("no process data could be read from the capture", paths[0] if paths else None)
    if progress:
        progress("correlate", 0, total=CORRELATE_STEPS, unit="step")
    trim()
    st = EventStore(procs)
    if progress:
        progress("correlate", 1)           # merged
    out.stats["events"] = int(st.n)
    out.stats["processes"] = len(procs)
    _build(out, st, procs, clock_refine, refine_windows, progress)
    if progress:
        progress("correlate", 1)           # derived tables
    return out


CORRELATE_STEPS = 4   # merge; identities, topology, doorbells, operations, matching; clocks; the event tables


def _build(out, st, procs, clock_refine, refine_windows, progress):
    tables = out.tables
    st.prefetch(_LARGE_TYPES, min(out.workers, 4))
    # identities and clocks
    nodes = identity.processes_and_nodes(out, st, procs)
    node_of, ranks, labels = nodes.node_of, nodes.ranks, nodes.labels
    clocks = clock.fit_nodes(out, procs, nodes)
    out.clock = clocks
    to_ns = clock.TimeBase(clocks, node_of)
    pollers = identity.threads(out, st, procs, node_of)
    gpus = identity.Gpus(procs, nodes)
    gpus.register(pollers)
    nics = identity.Nics(procs, node_of)
    # QP topology (QPs that doorbells, WQEs and work requests name without a creation record included)
    records = {name: st.table(name) for name in ("DB_DOORBELL", "DB_WQE", "IBV_SEND_WR", "IBV_POST_SEND",
                                                 "IBV_WR_COMPLETE", "IBV_WC")}
    topo = Topology(out, st, procs, nics, [records[n] for n in ("DB_DOORBELL", "DB_WQE", "IBV_SEND_WR",
                                                                "IBV_POST_SEND", "IBV_WR_COMPLETE")])
    trim()
    memtrace("qps")
    dbs = doorbells.associate(out, st, procs, topo, pollers, gpus, node_of, records.pop("DB_DOORBELL"),
                              records.pop("DB_WQE"))
    memtrace("doorbells/wqes")
    peers = hostlib.Peers({n: st.table(n) for n in hostlib.ID_TYPES}, procs)
    out._peers = peers
    op_base = ops.assemble(out, st, procs, topo, dbs, records, peers)
    ops.explain_unmatched(out, ops.unmatched_counts(op_base, topo), peers)
    memtrace("ops built")
    wc = records.pop("IBV_WC")
    m = ops.match(out, op_base, topo, wc)
    trim()
    memtrace("matched")
    # NCCL: which QPs are a communicator's, which work requests each collective caused (docs/schema.md)
    coll = collectives.Collectives(out, st, procs, topo, tables["threads"], node_of)
    coll.attribute(op_base, m.op_completion, m.wc_tsc, collectives.receiving_qps(st.table("IBV_POST_RECV"), topo))
    memtrace("collectives")
    # F24b: refine the clocks from matched operations, then every time column on the final time base
    pairs = clock.matched_pairs(op_base, m, node_of, ranks, topo.remote, to_ns, topo.process)
    memtrace("pairs built")
    if progress:
        progress("correlate", 1)           # operations matched
    clock.refine_nodes(out, clocks, labels, pairs, clock_refine, refine_windows)
    trim()
    memtrace("refined")
    tables["doorbells"]["ns"] = to_ns(dbs.process, dbs.tsc)
    tables["wqes"]["record_ns"] = to_ns(dbs.wqe_process, dbs.wqe_tsc)
    op_base["completion"] = m.op_completion
    op_base["peer_completion"] = m.op_peer
    completions = dict(process=m.wc_process, thread=wc["thread"], qp_id=m.wc_qp, qpn=wc["qpn"], wr_id=wc["wr_id"],
                       status=wc["status"], wc_opcode=wc["opcode"], byte_len=wc["byte_len"], is_recv=m.is_recv,
                       tsc=m.wc_tsc, op_id=m.wc_op)
    del wc
    tables["ops"], tables["completions"] = ops.op_tables(op_base, completions, node_of, ranks, topo.qpn,
                                                         topo.process, dbs.qp_gpu, topo.remote, to_ns)
    tables["qps"] = topo.table(node_of, ranks, dbs.qp_gpu)
    tables["qps"]["comm"] = coll.qp_comm[:topo.n].astype(np.int64)
    tables["qps"]["comm_rule"] = coll.qp_rule
    tables["collectives"], tables["communicators"] = coll.tables(to_ns, node_of, ranks)
    tables["nics"] = nics.table()
    tables["gpus"] = gpus.table()
    tables["nodes"] = dict(node=np.arange(len(labels), dtype=np.int64), label=np.array(labels, dtype=object),
                           processes=np.bincount(node_of, minlength=len(labels)).astype(np.int64))
    memtrace("op tables")
    # the events table: streamed from the capture on first use, on the final time base
    if progress:
        progress("correlate", 1)           # clocks refined
    out.procs = procs
    out.proc_node = node_of
    out._to_ns = to_ns
    tables["events"] = LazyTable(out._load_events, st.n)
    out.stats["time_range_ns"] = time_range(tsc_bounds(procs), to_ns)
    tables["clock"] = clock.clock_table(clocks, labels)
    memtrace("events idx")
    derived.build_flows(out)
    memtrace("flows")
    derived.build_barriers(out)
    derived.build_losses(out, procs)
    derived.build_aggregates(out, procs, topo.of, topo.remote, topo.process, dbs.qp_gpu, node_of, ranks)


def tsc_bounds(procs):
    """Per process (index, first TSC, last TSC) of its events, from the chunk index."""
    out = []
    for i, p in enumerate(procs):
        ch = p.chunks
        if ch is not None and len(ch):
            out.append((i, int(ch["tsc_min"].min()), int(ch["tsc_max"].max())))
    return out


def time_range(bounds, to_ns):
    """[first, last] ns of all events: the TSC -> ns map is monotone per node, so the per-process TSC bounds
    (``tsc_bounds``) suffice."""
    lo, hi = [], []
    for i, a, b in bounds:
        v = to_ns(np.full(2, i, np.int64), np.array([a, b], np.uint64))
        lo.append(int(v.min()))
        hi.append(int(v.max()))
    return [min(lo), max(hi)] if lo else None
