"""mlx5 knowledge for Python: WQE / CQE / doorbell / PRM decoding and encoding.

Follows ../shared/reference/mlx5.md (cited in the code as "ref §n").  The C side
of the project has its own single module; tests check both against rdma-core's
inline helpers from ``infiniband/mlx5dv.h``.

Decoders raise ``Mlx5DecodeError`` (a ``ValueError``) on malformed bytes, except
``walk_send_queue``, which reports problems in its result.
"""
from .cqe import CQE, build_cqe, cqe_owner_valid, parse_cqe
from .doorbell import Doorbell, dbr_bytes, doorbell_bytes, doorbell_value, parse_dbr, parse_doorbell
from .encode import (
    build_atomic_seg, build_av_seg, build_ctrl, build_data_seg, build_inline_seg,
    build_masked_atomic_segs, build_raddr_seg, build_wqe,
)
from .errors import Mlx5DecodeError
from .layouts import (
    CQE_OPCODE_NAMES, CQE_SYNDROME_NAMES, DS_UNIT, EXT_ATOMIC_OPMOD_4_BYTE, EXT_ATOMIC_OPMOD_8_BYTE,
    INLINE_SEG_FLAG, OPCODE_NAMES, PRM_OPCODE_NAMES, QP_TRANSITIONS, WQE_CTRL_CQ_UPDATE,
    WQE_CTRL_CQ_UPDATE_AND_EQE, WQE_CTRL_FENCE, WQE_CTRL_INITIATOR_SMALL_FENCE, WQE_CTRL_SOLICITED,
    WQEBB_SIZE, CompletionMode, CqeOpcode, CqeSyndrome, FenceMode, Opcode, PrmOpcode,
    QpcRqType, QpcServiceType,
)
from .prm import (
    CREATE_CQ_IN_FIELDS, CREATE_QP_IN_FIELDS, CREATE_QP_OUT_FIELDS, MODIFY_QP_IN_FIELDS, QPC_FIELDS,
    CreateCQ, CreateQP, ModifyQP, PrmField, build_create_cq_in, build_create_cq_out,
    build_create_qp_in, build_create_qp_out, build_modify_qp_in, decode_fields, encode_fields,
    parse_create_cq, parse_create_qp, parse_modify_qp, prm_get, prm_set,
)
from .vector import WQEBB_DTYPE, decode_wqebbs, gather_slots
from .wqe import (
    WQE, AtomicOperands, WalkProblem, WalkResult, parse_wqe, ring_offset, walk_send_queue,
    wqebbs_for_ds, write_wqe_to_ring,
)

__all__ = [
    # decoding
    "parse_wqe", "walk_send_queue", "parse_doorbell", "parse_dbr", "parse_cqe", "cqe_owner_valid",
    "parse_create_qp", "parse_create_cq", "parse_modify_qp", "decode_wqebbs", "gather_slots",
    "WQE", "AtomicOperands", "WalkResult", "WalkProblem", "Doorbell", "CQE", "CreateQP", "CreateCQ",
    "ModifyQP", "WQEBB_DTYPE", "Mlx5DecodeError",
    # encoding
    "build_ctrl", "build_raddr_seg", "build_data_seg", "build_inline_seg", "build_atomic_seg",
    "build_masked_atomic_segs", "build_av_seg", "build_wqe", "write_wqe_to_ring", "doorbell_value",
    "doorbell_bytes", "dbr_bytes", "build_cqe", "build_create_qp_in", "build_create_qp_out",
    "build_modify_qp_in", "build_create_cq_in", "build_create_cq_out",
    # PRM accessor
    "PrmField", "prm_get", "prm_set", "decode_fields", "encode_fields", "QPC_FIELDS",
    "CREATE_QP_IN_FIELDS", "CREATE_QP_OUT_FIELDS", "MODIFY_QP_IN_FIELDS", "CREATE_CQ_IN_FIELDS",
    # helpers and constants
    "wqebbs_for_ds", "ring_offset", "Opcode", "OPCODE_NAMES", "CqeOpcode", "CQE_OPCODE_NAMES",
    "CqeSyndrome", "CQE_SYNDROME_NAMES", "PrmOpcode", "PRM_OPCODE_NAMES", "QP_TRANSITIONS",
    "FenceMode", "CompletionMode", "QpcServiceType", "QpcRqType", "WQEBB_SIZE", "DS_UNIT",
    "INLINE_SEG_FLAG", "EXT_ATOMIC_OPMOD_4_BYTE", "EXT_ATOMIC_OPMOD_8_BYTE", "WQE_CTRL_CQ_UPDATE",
    "WQE_CTRL_CQ_UPDATE_AND_EQE", "WQE_CTRL_SOLICITED", "WQE_CTRL_FENCE",
    "WQE_CTRL_INITIATOR_SMALL_FENCE",
]
