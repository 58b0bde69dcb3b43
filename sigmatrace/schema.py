"""The correlated tables' schema, declared once (F17): every table, its columns in order, their types.

Producers and consumers read it from here: the correlator names its per-operation columns with it
(``columns``), the Parquet writer checks and orders every table against it before writing
(``sigmatrace.tables.parquet``), and docs/schema.md's table reference is generated from it
(``python -m sigmatrace.schema``; tests/test_schema.py fails when the two differ).

Types are Arrow's names: ``int64``, ``uint64``, ``int32``, ``uint32``, ``uint16``, ``double``, ``bool``, and
``string`` (written as a dictionary array).  Conventions (docs/schema.md): ``*_ns`` int64 nanoseconds on the
capture's one time base, ``tsc`` the recording node's raw counter, ids dense indices, ``-1`` unknown.
A type followed by ``?`` (``latency_ns int64?``) is a *nullable* measurement: unknown is ``-1`` in the
correlator's numpy columns and NULL in the written tables (and in SQL), so that ``avg`` / ``median`` /
``quantile`` over the column count only known values (``NULL_SENTINEL``; ``tables.conform`` converts).
This module imports nothing of the package: every layer may use it.
"""
from __future__ import annotations

from dataclasses import dataclass

TYPES = ("int64", "uint64", "int32", "uint32", "uint16", "double", "bool", "string")


NULL_SENTINEL = -1          # a nullable column's "unknown" in the correlator's numpy columns


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    note: str = ""
    nullable: bool = False    # unknown = NULL in the written tables (NULL_SENTINEL in memory)


@dataclass(frozen=True)
class Table:
    name: str
    row: str                  # what one row is
    columns: tuple
    parts: bool = False       # a directory of part files (the per-record tables) rather than NAME.parquet
    note: str | None = None

    @property
    def names(self):
        return tuple(c.name for c in self.columns)

    def type_of(self, column):
        return next(c.type for c in self.columns if c.name == column)

    @property
    def nullable(self):
        """Names of the nullable columns."""
        return tuple(c.name for c in self.columns if c.nullable)


def table(name, row, spec, parts=False, notes=None, note=None):
    """A Table from ``spec`` = "column type, column type?, ..." (``?``: nullable) and per-column ``notes``."""
    notes = notes or {}
    cols = tuple(Column(c, t.rstrip("?"), notes.get(c, ""), t.endswith("?"))
                 for c, t in (item.split() for item in spec.split(",")))
    bad = [c.name for c in cols if c.type not in TYPES]
    if bad:
        raise ValueError(f"schema of {name}: unknown types for {bad}")
    unknown = set(notes) - {c.name for c in cols}
    if unknown:
        raise ValueError(f"schema of {name}: notes for unknown columns {sorted(unknown)}")
    return Table(name, row, cols, parts, note)


TABLES = (
    table('processes', 'traced process',
          'process int64, uid string, path string, host string, node int64, node_label string, rank int64, '
          'pid int64, mode string, complete bool, has_header bool, events int64, dropped_events int64, '
          'tsc_hz double, gpus string, nics string',
          notes={'complete': 'END seen', 'gpus': 'JSON', 'nics': 'JSON'}),
    table('threads', 'thread',
          'process int64, thread int64, tid int64, name string, role string, gpu_ordinal int64, node int64',
          notes={'gpu_ordinal': 'hijacked doorbell page it polls'}),
    table('nodes', 'node (header node_id, else host)',
          'node int64, label string, processes int64'),
    table('nics', 'NIC (node_guid)',
          'nic int64, process int64, node int64, name string, node_guid string'),
    table('gpus', 'GPU (uuid per node; owner = the process that rings its doorbells)',
          'gpu int64, node int64, process int64, rank int64, ordinal int64, uuid string, label string'),
    table('qps', 'local QP (process, qpn)',
          'qp_id int64, process int64, node int64, rank int64, gpu int64, qpn int64, nic int64, kind string, '
          'qp_type int64, log_sq_size int64, uar_page int64, remote_qpn int64, rlid int64, rgid string, '
          'remote_qp_id int64, resolved_by string, remote_process int64, remote_node int64, '
          'remote_rank int64, remote_gpu int64, comm int64, comm_rule string',
          notes={'kind': 'verbs/devx/implicit', 'resolved_by': 'gid/lid/mutual-qpn/unresolved',
                 'comm': 'the NCCL communicator it belongs to (communicators.comm), -1: none',
                 'comm_rule': "how: call (created inside one communicator's call) / comm-thread (by a thread "
                              "of that communicator) / nccl-thread (by a thread named NCCL*, the process's only "
                              "communicator) / empty"}),
    table('events', 'primary trace record (process order, file order inside a process; one row group per decode batch; directory of parts)',
          'process int32, thread int32, tsc uint64, ns int64, type uint16, aux uint16, obj uint32, '
          'arg uint64, type_name string, x0 uint64, x1 uint16, x2 uint32, x3 uint64, node int32',
          parts=True, notes={'x0': 'EXT slot, 0 when absent', 'x1': 'EXT slot, 0 when absent', 'x2': 'EXT slot, 0 when absent', 'x3': 'EXT slot, 0 when absent'}, note='field meanings of aux/obj/arg/x0..x3 per type in sigmatrace/format/events.py'),
    table('doorbells', 'DB_DOORBELL',
          'doorbell_id int64, process int64, thread int64, node int64, qp_id int64, qpn int64, '
          'producer_index int64, raw uint64, tsc uint64, gpu int64, delta_wqebbs int64, pi_unwrapped int64, '
          'wqes int64, covered_wqebbs int64, lost_wqebbs int64, complete bool, ns int64',
          notes={'producer_index': '16-bit', 'delta_wqebbs': 'PI delta = WQEBBs announced', 'complete': 'all announced WQEBBs recovered'}),
    table('wqes', 'recovered WQE (decode_wqebbs)',
          'wqe_id int64, process int64, node int64, qp_id int64, qpn int64, wqe_index int64, '
          'wqe_unwrapped int64, num_wqebbs int64, opcode int64, opcode_name string, opmod int64, '
          'bytes int64, raddr uint64, rkey int64, laddr uint64, signaled bool, fm_ce_se int64, inline bool, '
          'valid bool, duplicate bool, doorbell_id int64, record_tsc uint64, verified bool, record_ns int64'),
    table('ops', 'operation: GPU WQE (source doorbell), CPU work request (verbs_wr), post call (verbs_post, simple mode), UCX call (ucx: UCP_PUT/GET/ATOMIC/TAG_SEND/STREAM_SEND/AM_SEND) or libfabric call (ofi: OFI_SEND/TSEND/WRITE/READ/ATOMIC; both with qp_id = -1 and the peer process from endpoint identities, docs/report.md)',
          'source int64, process int64, thread int64, qp_id int64, tsc uint64, opcode int64, bytes int64, '
          'raddr uint64, rkey int64, wr_id int64, num_wr int64, doorbell_id int64, wqe_id int64, '
          'signaled bool, gpu int64, op_id int64, node int64, rank int64, qpn int64, dst_qp_id int64, '
          'dst_qpn int64, dst_process int64, dst_node int64, dst_rank int64, dst_gpu int64, matched bool, '
          'opcode_name string, source_name string, is_read bool, ns int64, complete_ns int64, '
          'latency_ns int64?, peer_completion int64, peer_ns int64, completion int64, collective_id int64, '
          'collective_unit int64, parent_op_id int64',
          parts=True, notes={'opcode': 'mlx5 code', 'dst_qp_id': 'the remote QP of a connected QP; a UD datagram\'s own destination (address handle + remote QPN, docs/report.md)', 'latency_ns': 'post → own completion, F24a; NULL without a recorded completion', 'peer_ns': 'receive completion on the target',
                             'collective_id': 'the NCCL call it was attributed to (collectives.collective_id); -1: not attributed, or attributed to a unit of several calls',
                             'collective_unit': 'the attribution unit (collectives.unit): one call, or the calls of one NCCL group / calls in flight together; -1: not attributed',
                             'parent_op_id': 'the UCP call (source ucx) or libfabric call (source ofi) whose work this WQE / work request is, -1 none (F25; rule in docs/report.md)'}),
    table('completions', 'IBV_WC',
          'completion_id int64, process int64, thread int64, node int64, qp_id int64, qpn int64, '
          'wr_id int64, status int64, wc_opcode int64, byte_len int64, is_recv bool, tsc uint64, ns int64, '
          'op_id int64, latency_ns int64?',
          parts=True, notes={'op_id': 'matched post or send', 'latency_ns': 'post → this completion; NULL for receives and unmatched completions'}),
    table('flows', 'matched op: target QP or, for UCX / libfabric, target process known (arrow in Perfetto)',
          'flow_id int64, op_id int64, kind string, src_ns int64, dst_ns int64, dst_completion_id int64',
          parts=True, notes={'kind': "send-recv: to the receive completion on the target / op-completion: to the op's own completion / one-sided: no completion recorded (UCX / libfabric operations: their completions are not matched)", 'src_ns': "= the op's ns", 'dst_completion_id': 'the completion that ends the arrow, -1 for one-sided'}, note="QPs, processes, nodes, bytes and opcode are the op's: `flows JOIN ops USING (op_id)`"),
    table('communicators', 'NCCL communicator (an accepted ncclCommInit* / ncclCommSplit of one process)',
          'comm int64, process int64, node int64, rank int64, nranks int64, key string, call string, '
          'init_ns int64, init_duration_ns int64, end_ns int64?, cuda_dev int64, qps int64, calls int64',
          notes={'rank': 'in the communicator', 'key': 'cross-process key: unique-id hash and size, parent key / '
                 'split / color, or local:… when none', 'end_ns': 'ncclCommDestroy / ncclCommAbort; NULL: never',
                 'qps': 'QPs that belong to it (qps.comm)', 'calls': 'executed collective / point-to-point calls'}),
    table('collectives', 'NCCL collective or point-to-point call (NCCL_COLL), in (process, time) order',
          'collective_id int64, process int64, thread int64, node int64, rank int64, nranks int64, comm int64, '
          'comm_key string, op string, count int64, datatype string, bytes int64, redop string, root int64, '
          'seq int64, instance int64, call_ns int64, call_duration_ns int64, result int64, group int64, unit int64, '
          'attribution string, wrs int64, wire_bytes int64, first_wr_ns int64?, last_wr_ns int64?, '
          'last_completion_ns int64?, end_ns int64?, duration_ns int64?, instance_ranks int64, slowest_rank int64, '
          'last_call_rank int64',
          notes={'rank': 'in the communicator', 'comm': 'communicators.comm, -1: unknown communicator',
                 'op': 'all_reduce / broadcast (ncclBroadcast, ncclBcast) / reduce / all_gather / reduce_scatter / '
                       'all_to_all / gather / scatter / send / recv',
                 'count': "the call's count (all_gather: sendcount, reduce_scatter: recvcount, all_to_all: per peer)",
                 'bytes': 'count × datatype size', 'root': 'root, or the peer of send / recv; -1: none',
                 'seq': "k-th executed collective of the communicator (send / recv: k-th to / from that peer); -1: "
                        "not executed",
                 'instance': "the same call on every rank (communicator key + seq), -1: no cross-process key",
                 'result': 'ncclResult_t (0 success, 7 in progress: executed; others refused)',
                 'group': 'outermost ncclGroupStart..End of the calling thread, -1: none',
                 'unit': 'what the work requests are attributed to (ops.collective_unit)',
                 'attribution': 'window (its own unit) / group (a unit of several calls of one NCCL group) / '
                                'in-flight (merged: a work request completed after the next call) / no-qps / '
                                'no-communicator / refused / simulated',
                 'wrs': "work requests of its unit", 'wire_bytes': "bytes of its unit's work requests",
                 'end_ns': 'last completion of its unit (full mode), else its last work request',
                 'duration_ns': 'call → end_ns', 'instance_ranks': 'calls joined in the instance',
                 'slowest_rank': 'of the instance: the rank whose end_ns is last (-1: an end unknown)',
                 'last_call_rank': 'of the instance: the rank that called last'}),
    table('barriers', 'barrier instance',
          'barrier int64, series int64, instance int64, participants int64, first_ns int64, last_ns int64, '
          'spread_ns int64, first_participant int64, straggler int64, straggler_rank int64, '
          'straggler_gpu int64, straggler_label string, arrival_order string',
          notes={'arrival_order': 'JSON list'}),
    table('barrier_arrivals', '(barrier, participant)',
          'barrier int64, participant int64, gpu int64, process int64, rank int64, node int64, label string, '
          'ns int64, position int64, wait_ns int64, op_id int64',
          notes={'position': '0 = first'}),
    table('clock', 'node',
          'node int64, label string, source string, calibration_pairs int64, ptp bool, ns_per_tick double, '
          'fit_residual_ns double, offset_ns double, drift_ppm double, refined bool, refine_pairs int64, '
          'residual_ns double, method string',
          notes={'source': 'realtime/tai/tsc_hz/none'}),
    table('losses', 'loss item',
          'kind string, process int64, path string, bytes int64, count int64, detail string',
          notes={'kind': 'file / dropped_events / incomplete_process / missing_header / wqe_lost / doorbell_unrecovered / bad_side_records'}),
    table('aggregates', 'AGGREGATE counter (aggregate mode)',
          'process int64, thread int64, type int64, type_name string, aux int64, obj int64, peer int64, '
          'count int64, bytes int64, qp_id int64, dst_process int64, dst_node int64, dst_rank int64, '
          'dst_gpu int64, node int64, rank int64, gpu int64, is_op bool',
          notes={'is_op': 'an operation counter: IBV_SEND_WR, IBV_POST_SEND of a QP without work-request counters, UCX/libfabric operations — these are folded into matrix_node / matrix_rank / matrix_gpu'}),
)

BY_NAME = {t.name: t for t in TABLES}
TABLE_NAMES = tuple(t.name for t in TABLES)
PART_TABLES = tuple(t.name for t in TABLES if t.parts)


def columns(table):
    """The column names of ``table``, in order."""
    return BY_NAME[table].names


def markdown():
    """docs/schema.md's table reference (between its ``schema:begin`` / ``schema:end`` markers)."""
    lines = ["| table | one row per | columns (type; note) |", "|---|---|---|"]
    for t in TABLES:
        cols = ", ".join(f"{c.name} ({c.type}{', nullable' if c.nullable else ''}{'; ' + c.note if c.note else ''})"
                         for c in t.columns)
        note = f" — {t.note}" if t.note else ""
        lines.append(f"| {t.name}{' (directory of parts)' if t.parts else ''} | {t.row} | {cols}{note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
