"""Event types of trace format v1 — the Python definition.

Mirrors native/include/sigmatrace/events.h (the conformance test compares
both lists).  Each type names what its record slots mean, so that
`Capture.table(name)` can hand out named numpy columns without a per-event
Python loop.  Slots: aux (u16), obj (u32), arg (u64) of the record itself and
x0 (u64), x1 (u16), x2 (u32), x3 (u64) of its optional EXT continuation.  A
slot spec is a column name, or a tuple of (name, low_bit, width) bit fields.
"""
from dataclasses import dataclass, field

LAYER_TRACE = 0x00
LAYER_IBV = 0x01
LAYER_MLX5 = 0x02
LAYER_CUDA = 0x03
LAYER_DB = 0x04
LAYER_UCX = 0x05
LAYER_OFI = 0x06
LAYER_NCCL = 0x07
LAYER_NAMES = {
    LAYER_TRACE: "trace",
    LAYER_IBV: "ibv",
    LAYER_MLX5: "mlx5",
    LAYER_CUDA: "cuda",
    LAYER_DB: "doorbell",
    LAYER_UCX: "ucx",
    LAYER_OFI: "ofi",
    LAYER_NCCL: "nccl",
}

SLOTS = ("aux", "obj", "arg", "x0", "x1", "x2", "x3")


@dataclass(frozen=True)
class EventType:
    name: str
    value: int
    slots: dict = field(default_factory=dict)
    modes: str = "SF"  # S = simple, F = full (aggregate keeps counters only)

    @property
    def layer(self) -> int:
        return self.value >> 8

    @property
    def has_ext(self) -> bool:
        return any(s in self.slots for s in ("x0", "x1", "x2", "x3"))

    def columns(self):
        """(column name, slot, low bit, width or None) for every named field."""
        out = []
        for slot in SLOTS:
            spec = self.slots.get(slot)
            if spec is None:
                continue
            if isinstance(spec, str):
                out.append((spec, slot, 0, None))
            else:
                for name, lo, width in spec:
                    out.append((name, slot, lo, width))
        return out


def _E(name, value, modes="SF", **slots):
    return EventType(name, value, dict(slots), modes)


EVENTS = [
    # --- trace (internal) ---
    _E("EXT", 0x0001),
    _E("DROPS", 0x0002, arg="dropped"),
    _E("THREAD_START", 0x0003, obj="tid"),
    _E("THREAD_END", 0x0004, obj="tid"),
    _E("MARK", 0x0005, obj="mark_id", arg="side_id"),
    _E("FORK", 0x0006, obj="child_pid"),
    # --- libibverbs ---
    _E("IBV_OPEN_DEVICE", 0x0101, obj="ctx", arg="side_id"),
    _E("IBV_CLOSE_DEVICE", 0x0102, obj="ctx"),
    _E("IBV_ALLOC_PD", 0x0103, obj="pd", arg="ctx"),
    _E("IBV_DEALLOC_PD", 0x0104, obj="pd"),
    _E("IBV_REG_MR", 0x0105, obj="lkey", arg="addr", x0="length", x1="access", x2="rkey", x3="pd"),
    _E("IBV_DEREG_MR", 0x0106, obj="lkey"),
    _E("IBV_CREATE_CQ", 0x0107, obj="cq", arg="cqe"),
    _E("IBV_DESTROY_CQ", 0x0108, obj="cq"),
    _E("IBV_CREATE_QP", 0x0109, aux="qp_type", obj="qpn", arg="side_id"),
    _E("IBV_MODIFY_QP", 0x010A, aux="state", obj="qpn", arg="side_id", x0="attr_mask", x1="dlid", x2="dest_qpn"),
    _E("IBV_DESTROY_QP", 0x010B, obj="qpn"),
    _E("IBV_POST_SEND", 0x0110, aux="num_wr", obj="qpn", arg="bytes", x0="wr_id", x1="opcode", x2="ret"),
    _E("IBV_SEND_WR", 0x0111, "F", aux=(("opcode", 0, 8), ("send_flags", 8, 8)), obj="qpn", arg="wr_id",
       x0="raddr", x1="num_sge", x2="rkey", x3="bytes"),
    _E("IBV_POST_RECV", 0x0112, aux="num_wr", obj="qpn", arg="bytes", x0="wr_id", x2="ret"),
    _E("IBV_RECV_WR", 0x0113, "F", aux="num_sge", obj="qpn", arg="wr_id", x0="addr", x2="lkey", x3="bytes"),
    _E("IBV_POST_SRQ_RECV", 0x0114, aux="num_wr", obj="srq", arg="bytes"),
    _E("IBV_POLL_CQ", 0x0115, "F", aux="returned", obj="cq", arg=(("requested", 0, 32), ("polls", 32, 32))),
    _E("IBV_WC", 0x0116, "F", aux=(("status", 0, 8), ("opcode", 8, 8)), obj="qpn", arg="wr_id",
       x0="imm", x1="wc_flags", x2="byte_len", x3="vendor_err"),
    _E("IBV_WR_COMPLETE", 0x0118, aux="num_wr", obj="qpn", arg="bytes"),
    _E("IBV_REQ_NOTIFY_CQ", 0x0119, "F", aux="solicited_only", obj="cq"),
    _E("IBV_GET_CQ_EVENT", 0x011A, "F", obj="cq"),
    _E("IBV_CREATE_SRQ", 0x011B, obj="srq", arg="max_wr"),
    _E("IBV_CREATE_AH", 0x011C, aux="port", obj="ah", arg="side_id"),
    _E("IBV_DESTROY_AH", 0x011D, obj="ah"),
    # --- mlx5dv / DevX ---
    _E("MLX5_DEVX_ALLOC_UAR", 0x0201, aux="flags_lo", obj="page_id", arg="reg_addr", x0="base_addr", x2="flags",
       x3="mmap_off"),
    _E("MLX5_DEVX_FREE_UAR", 0x0202, obj="page_id", arg="reg_addr"),
    _E("MLX5_DEVX_UMEM_REG", 0x0203, aux="umem_flags", obj="umem_id", arg="addr", x0="size", x2="access"),
    _E("MLX5_DEVX_UMEM_DEREG", 0x0204, obj="umem_id"),
    _E("MLX5_DEVX_OBJ_CREATE", 0x0205, aux="prm_opcode", obj="number", arg="side_id", x0="handle", x2="status"),
    _E("MLX5_DEVX_OBJ_MODIFY", 0x0206, aux="prm_opcode", obj="qpn", arg="side_id"),
    _E("MLX5_DEVX_OBJ_DESTROY", 0x0207, aux="prm_opcode", obj="number", arg="handle"),
    _E("MLX5_DEVX_GENERAL_CMD", 0x0208, aux="prm_opcode", arg="side_id"),
    _E("MLX5_DEVX_QUERY_EQN", 0x0209, obj="eqn", arg="vector"),
    _E("MLX5_DV_INIT_QP", 0x020A, obj="qpn", arg="side_id"),
    _E("MLX5_DEVX_OBJ_QUERY", 0x020B, aux="prm_opcode", obj="number", arg="side_id"),
    # --- CUDA driver ---
    _E("CU_MEM_HOST_REGISTER", 0x0301, aux="result", obj="flags", arg="host_ptr", x0="size"),
    _E("CU_MEM_HOST_GET_DEVPTR", 0x0302, aux="hijacked", obj="result", arg="host_ptr", x0="device_ptr",
       x3="real_device_ptr"),
    _E("CU_MEM_HOST_UNREGISTER", 0x0303, aux="result", arg="host_ptr"),
    _E("CU_GET_PROC_ADDRESS", 0x0304, aux="wrapped", obj="cuda_version", arg="side_id", x0="flags"),
    _E("CU_GET_EXPORT_TABLE", 0x0305, aux="result", arg="side_id"),
    _E("CU_POINTER_GET_ATTRIBUTE", 0x0306, aux="result", obj="attribute", arg="ptr", x0="value"),
    # --- doorbells ---
    _E("DB_DOORBELL", 0x0401, aux="producer_index", obj="qpn", arg="raw"),
    _E("DB_HIJACK_INSTALL", 0x0402, aux="gpu", obj="page_id", arg="side_id"),
    _E("DB_HIJACK_REMOVE", 0x0403, obj="page_id", arg="doorbells"),
    _E("DB_WQE", 0x0404, aux="first_wqe_index", obj="qpn", arg="side_id"),
    _E("DB_WQE_LOST", 0x0405, aux="first_wqe_index", obj="qpn", arg="num_wqebb", x2="reason"),
    _E("DB_FORWARD", 0x0406, "F", aux="producer_index", obj="qpn", arg="observed_tsc"),
    _E("DB_DBR", 0x0407, "F", aux="producer_index", obj="qpn"),
    # --- UCX ---
    _E("UCP_WORKER_CREATE", 0x0501, obj="worker", arg="side_id"),
    _E("UCP_EP_CREATE", 0x0502, obj="ep", arg="side_id"),
    _E("UCP_EP_CLOSE", 0x0503, obj="ep"),
    _E("UCP_PUT", 0x0504, aux="variant", obj="ep", arg="bytes", x0="raddr", x3="request"),
    _E("UCP_GET", 0x0505, aux="variant", obj="ep", arg="bytes", x0="raddr", x3="request"),
    _E("UCP_ATOMIC", 0x0506, aux="op", obj="ep", arg="bytes", x0="raddr", x3="request"),
    _E("UCP_TAG_SEND", 0x0507, aux="variant", obj="ep", arg="bytes", x0="tag", x3="request"),
    _E("UCP_TAG_RECV", 0x0508, aux="variant", obj="worker", arg="bytes", x0="tag", x3="request"),
    _E("UCP_STREAM_SEND", 0x0509, aux="variant", obj="ep", arg="bytes", x3="request"),
    _E("UCP_STREAM_RECV", 0x050A, aux="variant", obj="ep", arg="bytes", x3="request"),
    _E("UCP_AM_SEND", 0x050B, aux="am_id", obj="ep", arg="bytes", x0="header_bytes", x3="request"),
    _E("UCP_AM_RECV", 0x050C, aux="am_id", obj="worker", arg="bytes"),
    _E("UCP_WORKER_PROGRESS", 0x050D, "F", aux="returned", obj="worker", arg=(("polls", 32, 32),)),
    _E("UCP_REQUEST_DONE", 0x050E, aux="status", obj="owner", arg="request"),
    _E("UCP_FLUSH", 0x050F, obj="owner"),
    # --- libfabric ---
    _E("OFI_FABRIC", 0x0601, obj="fabric", arg="side_id"),
    _E("OFI_DOMAIN", 0x0602, obj="domain", arg="side_id"),
    _E("OFI_ENDPOINT", 0x0603, obj="ep", arg="side_id"),
    _E("OFI_AV_INSERT", 0x0604, aux="inserted", obj="av", arg="side_id"),
    _E("OFI_CQ_OPEN", 0x0605, obj="cq", arg="side_id"),
    _E("OFI_SEND", 0x0606, aux="variant", obj="ep", arg="bytes", x0="dest", x3="context"),
    _E("OFI_RECV", 0x0607, aux="variant", obj="ep", arg="bytes", x0="src", x3="context"),
    _E("OFI_TSEND", 0x0608, aux="variant", obj="ep", arg="bytes", x0="dest", x2="ret", x3="tag"),
    _E("OFI_TRECV", 0x0609, aux="variant", obj="ep", arg="bytes", x0="src", x2="ret", x3="tag"),
    _E("OFI_WRITE", 0x060A, aux="variant", obj="ep", arg="bytes", x0="dest", x2="ret", x3="raddr"),
    _E("OFI_READ", 0x060B, aux="variant", obj="ep", arg="bytes", x0="dest", x2="ret", x3="raddr"),
    _E("OFI_ATOMIC", 0x060C, aux="op", obj="ep", arg="bytes", x0="dest", x2="ret", x3="raddr"),
    _E("OFI_CQ_READ", 0x060D, "F", aux="returned", obj="cq", arg=(("requested", 0, 32), ("polls", 32, 32))),
    _E("OFI_COMPLETION", 0x060E, "F", aux="flags_lo", obj="cq", arg="context", x0="len", x3="flags"),
    _E("OFI_MR_REG", 0x060F, obj="mr", arg="addr", x0="len", x3="key"),
    # --- NCCL (ABI of NCCL 2.28) ---
    _E("NCCL_COMM_INIT", 0x0701, aux="variant", obj="comm", arg="side_id", x0="duration_ticks", x1="result",
       x2="rank", x3="nranks"),
    _E("NCCL_COMM_DESTROY", 0x0702, aux="how", obj="comm", arg="result"),
    _E("NCCL_COLL", 0x0703, aux=(("kind", 0, 8), ("datatype", 8, 8)), obj="comm", arg="count", x0="stream",
       x1=(("result", 0, 8), ("redop", 8, 8)), x2="peer", x3="duration_ticks"),
    _E("NCCL_GROUP_START", 0x0704, aux="depth", arg="result"),
    _E("NCCL_GROUP_END", 0x0705, aux="depth", arg="result", x0="duration_ticks", x1="simulated"),
]

BY_NAME = {e.name: e for e in EVENTS}
BY_VALUE = {e.value: e for e in EVENTS}
# Polls that return how much they found (aux): with aux 0 the call found nothing.  A progress loop makes
# millions of these between two operations; the timeline draws each run of them on a thread as one slice.
IDLE_POLLS = (BY_NAME["UCP_WORKER_PROGRESS"].value, BY_NAME["OFI_CQ_READ"].value, BY_NAME["IBV_POLL_CQ"].value)
# The recorder writes a run of idle polls (aux 0; one thread; one key: type, object, requested count; nothing
# but idle polls of the thread between) as its first and its last call; the last one's arg bits 32..63
# ("polls") are the calls it stands for (itself and the unrecorded ones since the first); 0 there: one call
# (events.h).
IDLE_POLLS_SHIFT = 32
IDLE_POLLS_MAX = 0xFFFFFFFF
EXT = BY_NAME["EXT"].value
DROPS = BY_NAME["DROPS"].value

# Constants shared with events.h (checked by the conformance test).
UMEM_F_GPU = 0x1
UMEM_F_DMABUF = 0x2
WQE_LOST_OVERWRITTEN = 1
WQE_LOST_CORRUPT = 2
WQE_LOST_COPY_FAILED = 3
WQE_LOST_RING_FULL = 4
WQE_LOST_TRACE_DROPPED = 5
NCCL_INIT_RANK = 0
NCCL_INIT_RANK_CONFIG = 1
NCCL_INIT_ALL = 2
NCCL_INIT_RANK_SCALABLE = 3
NCCL_INIT_SPLIT = 4
NCCL_END_DESTROY = 0
NCCL_END_ABORT = 1
NCCL_END_FINALIZE = 2
NCCL_COLL_ALL_REDUCE = 0
NCCL_COLL_BROADCAST = 1
NCCL_COLL_BCAST = 2
NCCL_COLL_REDUCE = 3
NCCL_COLL_ALL_GATHER = 4
NCCL_COLL_REDUCE_SCATTER = 5
NCCL_COLL_ALL_TO_ALL = 6
NCCL_COLL_GATHER = 7
NCCL_COLL_SCATTER = 8
NCCL_COLL_SEND = 9
NCCL_COLL_RECV = 10
NCCL_REDOP_NONE = 0xFF
NCCL_NO_PEER = 0xFFFFFFFF

# One past the largest event type of any layer (name lookup tables index by type value).
TYPE_RANGE = ((max(e.value for e in EVENTS) >> 8) + 1) << 8


def value(name: str) -> int:
    """Numeric type of an event name (KeyError names the unknown event)."""
    return BY_NAME[name].value


def name_of(type_value: int) -> str:
    e = BY_VALUE.get(int(type_value))
    return e.name if e else f"UNKNOWN_0x{int(type_value):04x}"
