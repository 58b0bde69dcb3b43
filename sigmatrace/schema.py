"""The correlated tables' schema, declared once (F17): every table, its columns in order, their types.

Producers and consumers read it from here: the correlator names its per-operation columns with it
(``columns``), the Parquet writer checks and orders every table against it before writing
(``sigmatrace.tables.parquet``), and docs/schema.md's table reference is generated from it
(``python -m sigmatrace.schema``; tests/test_schema.py fails when the two differ).

Types are Arrow's names: ``int64``, ``uint64``, ``int32``, ``uint32``, ``uint16``, ``double``, ``bool``, and
``string`` (written as a dictionary array).  Conventions (docs/schema.md): ``*_ns`` int64 nanoseconds on the
capture's one time base, ``tsc`` the recording node's raw counter, ids dense indices, ``-1`` unknown.
This module imports nothing of the package: every layer may use it.
"""
from __future__ import annotations

from dataclasses import dataclass

TYPES = ("int64", "uint64", "int32", "uint32", "uint16", "double", "bool", "string")


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    note: str = ""


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


TABLES = (
    Table('processes', 'traced process', parts=False, note=None, columns=(
        Column('process', 'int64'),
        Column('uid', 'string'),
        Column('path', 'string'),
        Column('host', 'string'),
        Column('node', 'int64'),
        Column('node_label', 'string'),
        Column('rank', 'int64'),
        Column('pid', 'int64'),
        Column('mode', 'string'),
        Column('complete', 'bool', 'END seen'),
        Column('has_header', 'bool'),
        Column('events', 'int64'),
        Column('dropped_events', 'int64'),
        Column('tsc_hz', 'double'),
        Column('gpus', 'string', 'JSON'),
        Column('nics', 'string', 'JSON'),
    )),
    Table('threads', 'thread', parts=False, note=None, columns=(
        Column('process', 'int64'),
        Column('thread', 'int64'),
        Column('tid', 'int64'),
        Column('name', 'string'),
        Column('role', 'string'),
        Column('gpu_ordinal', 'int64', 'hijacked doorbell page it polls'),
        Column('node', 'int64'),
    )),
    Table('nodes', 'node (header node_id, else host)', parts=False, note=None, columns=(
        Column('node', 'int64'),
        Column('label', 'string'),
        Column('processes', 'int64'),
    )),
    Table('nics', 'NIC (node_guid)', parts=False, note=None, columns=(
        Column('nic', 'int64'),
        Column('process', 'int64'),
        Column('node', 'int64'),
        Column('name', 'string'),
        Column('node_guid', 'string'),
    )),
    Table('gpus', 'GPU (uuid per node; owner = the process that rings its doorbells)', parts=False, note=None, columns=(
        Column('gpu', 'int64'),
        Column('node', 'int64'),
        Column('process', 'int64'),
        Column('rank', 'int64'),
        Column('ordinal', 'int64'),
        Column('uuid', 'string'),
        Column('label', 'string'),
    )),
    Table('qps', 'local QP (process, qpn)', parts=False, note=None, columns=(
        Column('qp_id', 'int64'),
        Column('process', 'int64'),
        Column('node', 'int64'),
        Column('rank', 'int64'),
        Column('gpu', 'int64'),
        Column('qpn', 'int64'),
        Column('nic', 'int64'),
        Column('kind', 'string', 'verbs/devx/implicit'),
        Column('qp_type', 'int64'),
        Column('log_sq_size', 'int64'),
        Column('uar_page', 'int64'),
        Column('remote_qpn', 'int64'),
        Column('rlid', 'int64'),
        Column('rgid', 'string'),
        Column('remote_qp_id', 'int64'),
        Column('resolved_by', 'string', 'gid/lid/mutual-qpn/unresolved'),
        Column('remote_process', 'int64'),
        Column('remote_node', 'int64'),
        Column('remote_rank', 'int64'),
        Column('remote_gpu', 'int64'),
    )),
    Table('events', 'primary trace record (process order, file order inside a process; one row group per decode batch; directory of parts)', parts=True, note='field meanings of aux/obj/arg/x0..x3 per type in sigmatrace/format/events.py', columns=(
        Column('process', 'int32'),
        Column('thread', 'int32'),
        Column('tsc', 'uint64'),
        Column('ns', 'int64'),
        Column('type', 'uint16'),
        Column('aux', 'uint16'),
        Column('obj', 'uint32'),
        Column('arg', 'uint64'),
        Column('type_name', 'string'),
        Column('x0', 'uint64', 'EXT slot, 0 when absent'),
        Column('x1', 'uint16', 'EXT slot, 0 when absent'),
        Column('x2', 'uint32', 'EXT slot, 0 when absent'),
        Column('x3', 'uint64', 'EXT slot, 0 when absent'),
        Column('node', 'int32'),
    )),
    Table('doorbells', 'DB_DOORBELL', parts=False, note=None, columns=(
        Column('doorbell_id', 'int64'),
        Column('process', 'int64'),
        Column('thread', 'int64'),
        Column('node', 'int64'),
        Column('qp_id', 'int64'),
        Column('qpn', 'int64'),
        Column('producer_index', 'int64', '16-bit'),
        Column('raw', 'uint64'),
        Column('tsc', 'uint64'),
        Column('gpu', 'int64'),
        Column('delta_wqebbs', 'int64', 'PI delta = WQEBBs announced'),
        Column('pi_unwrapped', 'int64'),
        Column('wqes', 'int64'),
        Column('covered_wqebbs', 'int64'),
        Column('lost_wqebbs', 'int64'),
        Column('complete', 'bool', 'all announced WQEBBs recovered'),
        Column('ns', 'int64'),
    )),
    Table('wqes', 'recovered WQE (decode_wqebbs)', parts=False, note=None, columns=(
        Column('wqe_id', 'int64'),
        Column('process', 'int64'),
        Column('node', 'int64'),
        Column('qp_id', 'int64'),
        Column('qpn', 'int64'),
        Column('wqe_index', 'int64'),
        Column('wqe_unwrapped', 'int64'),
        Column('num_wqebbs', 'int64'),
        Column('opcode', 'int64'),
        Column('opcode_name', 'string'),
        Column('opmod', 'int64'),
        Column('bytes', 'int64'),
        Column('raddr', 'uint64'),
        Column('rkey', 'int64'),
        Column('laddr', 'uint64'),
        Column('signaled', 'bool'),
        Column('fm_ce_se', 'int64'),
        Column('inline', 'bool'),
        Column('valid', 'bool'),
        Column('duplicate', 'bool'),
        Column('doorbell_id', 'int64'),
        Column('record_tsc', 'uint64'),
        Column('verified', 'bool'),
        Column('record_ns', 'int64'),
    )),
    Table('ops', 'operation: GPU WQE (source doorbell), CPU work request (verbs_wr), post call (verbs_post, simple mode), UCX call (ucx: UCP_PUT/GET/ATOMIC/TAG_SEND/STREAM_SEND/AM_SEND) or libfabric call (ofi: OFI_SEND/TSEND/WRITE/READ/ATOMIC; both with qp_id = -1 and the peer process from endpoint identities, docs/report.md)', parts=True, note=None, columns=(
        Column('source', 'int64'),
        Column('process', 'int64'),
        Column('thread', 'int64'),
        Column('qp_id', 'int64'),
        Column('tsc', 'uint64'),
        Column('opcode', 'int64', 'mlx5 code'),
        Column('bytes', 'int64'),
        Column('raddr', 'uint64'),
        Column('rkey', 'int64'),
        Column('wr_id', 'int64'),
        Column('num_wr', 'int64'),
        Column('doorbell_id', 'int64'),
        Column('wqe_id', 'int64'),
        Column('signaled', 'bool'),
        Column('gpu', 'int64'),
        Column('op_id', 'int64'),
        Column('node', 'int64'),
        Column('rank', 'int64'),
        Column('qpn', 'int64'),
        Column('dst_qp_id', 'int64'),
        Column('dst_qpn', 'int64'),
        Column('dst_process', 'int64'),
        Column('dst_node', 'int64'),
        Column('dst_rank', 'int64'),
        Column('dst_gpu', 'int64'),
        Column('matched', 'bool'),
        Column('opcode_name', 'string'),
        Column('source_name', 'string'),
        Column('is_read', 'bool'),
        Column('ns', 'int64'),
        Column('complete_ns', 'int64'),
        Column('latency_ns', 'int64', 'post → own completion, F24a'),
        Column('peer_completion', 'int64'),
        Column('peer_ns', 'int64', 'receive completion on the target'),
        Column('completion', 'int64'),
    )),
    Table('completions', 'IBV_WC', parts=True, note=None, columns=(
        Column('completion_id', 'int64'),
        Column('process', 'int64'),
        Column('thread', 'int64'),
        Column('node', 'int64'),
        Column('qp_id', 'int64'),
        Column('qpn', 'int64'),
        Column('wr_id', 'int64'),
        Column('status', 'int64'),
        Column('wc_opcode', 'int64'),
        Column('byte_len', 'int64'),
        Column('is_recv', 'bool'),
        Column('tsc', 'uint64'),
        Column('ns', 'int64'),
        Column('op_id', 'int64', 'matched post or send'),
        Column('latency_ns', 'int64'),
    )),
    Table('flows', 'matched op (arrow in Perfetto)', parts=True, note="QPs, processes, nodes, bytes and opcode are the op's: `flows JOIN ops USING (op_id)`", columns=(
        Column('flow_id', 'int64'),
        Column('op_id', 'int64'),
        Column('kind', 'string', "send-recv: to the receive completion on the target / op-completion: to the op's own completion / one-sided: no completion recorded"),
        Column('src_ns', 'int64', "= the op's ns"),
        Column('dst_ns', 'int64'),
        Column('dst_completion_id', 'int64', 'the completion that ends the arrow, -1 for one-sided'),
    )),
    Table('barriers', 'barrier instance', parts=False, note=None, columns=(
        Column('barrier', 'int64'),
        Column('series', 'int64'),
        Column('instance', 'int64'),
        Column('participants', 'int64'),
        Column('first_ns', 'int64'),
        Column('last_ns', 'int64'),
        Column('spread_ns', 'int64'),
        Column('first_participant', 'int64'),
        Column('straggler', 'int64'),
        Column('straggler_rank', 'int64'),
        Column('straggler_gpu', 'int64'),
        Column('straggler_label', 'string'),
        Column('arrival_order', 'string', 'JSON list'),
    )),
    Table('barrier_arrivals', '(barrier, participant)', parts=False, note=None, columns=(
        Column('barrier', 'int64'),
        Column('participant', 'int64'),
        Column('gpu', 'int64'),
        Column('process', 'int64'),
        Column('rank', 'int64'),
        Column('node', 'int64'),
        Column('label', 'string'),
        Column('ns', 'int64'),
        Column('position', 'int64', '0 = first'),
        Column('wait_ns', 'int64'),
        Column('op_id', 'int64'),
    )),
    Table('clock', 'node', parts=False, note=None, columns=(
        Column('node', 'int64'),
        Column('label', 'string'),
        Column('source', 'string', 'realtime/tai/tsc_hz/none'),
        Column('calibration_pairs', 'int64'),
        Column('ptp', 'bool'),
        Column('ns_per_tick', 'double'),
        Column('fit_residual_ns', 'double'),
        Column('offset_ns', 'double'),
        Column('drift_ppm', 'double'),
        Column('refined', 'bool'),
        Column('refine_pairs', 'int64'),
        Column('residual_ns', 'double'),
        Column('method', 'string'),
    )),
    Table('losses', 'loss item', parts=False, note=None, columns=(
        Column('kind', 'string', 'file / dropped_events / incomplete_process / missing_header / wqe_lost / doorbell_unrecovered / bad_side_records'),
        Column('process', 'int64'),
        Column('path', 'string'),
        Column('bytes', 'int64'),
        Column('count', 'int64'),
        Column('detail', 'string'),
    )),
    Table('aggregates', 'AGGREGATE counter (aggregate mode)', parts=False, note=None, columns=(
        Column('process', 'int64'),
        Column('thread', 'int64'),
        Column('type', 'int64'),
        Column('type_name', 'string'),
        Column('aux', 'int64'),
        Column('obj', 'int64'),
        Column('peer', 'int64'),
        Column('count', 'int64'),
        Column('bytes', 'int64'),
        Column('qp_id', 'int64'),
        Column('dst_process', 'int64'),
        Column('dst_node', 'int64'),
        Column('dst_rank', 'int64'),
        Column('dst_gpu', 'int64'),
        Column('node', 'int64'),
        Column('rank', 'int64'),
        Column('gpu', 'int64'),
        Column('is_op', 'bool', 'an operation counter: IBV_SEND_WR, IBV_POST_SEND of a QP without work-request counters, UCX/libfabric operations — these are folded into matrix_node / matrix_rank / matrix_gpu'),
    )),
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
        cols = ", ".join(f"{c.name} ({c.type}{'; ' + c.note if c.note else ''})" for c in t.columns)
        note = f" — {t.note}" if t.note else ""
        lines.append(f"| {t.name}{' (directory of parts)' if t.parts else ''} | {t.row} | {cols}{note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
