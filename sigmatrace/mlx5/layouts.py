"""mlx5 layout constants: sizes, opcodes, flags, CQE and PRM enumerations.

Every value here comes from ../shared/reference/mlx5.md (cited as "ref §n").
Nothing in this module computes anything; the decoders and encoders import it.
"""
from __future__ import annotations

from enum import IntEnum

# --- Basic units (ref §1.1) -------------------------------------------------
WQEBB_SIZE = 64            # MLX5_SEND_WQE_BB, ref §1.1
WQEBB_SHIFT = 6            # MLX5_SEND_WQE_SHIFT, ref §1.1
DS_UNIT = 16               # MLX5_SEND_WQE_DS: DS counts 16-byte units, ref §1.1
DS_PER_WQEBB = WQEBB_SIZE // DS_UNIT
DS_MASK = 0x3F             # MLX5_WQE_CTRL_DS_MASK (qpn_ds bits 5:0), ref §1.1
MAX_WQEBBS_PER_WQE = 16    # MLX5_SEND_WQE_MAX_WQEBBS, ref §1.1
WQE_INDEX_MODULUS = 1 << 16  # ctrl wqe_index / DBR / CQE wqe_counter wrap at 0xffff, ref §1.2, §3.4

# --- Segment sizes (ref §1.2-§1.8) -------------------------------------------
CTRL_SEG_SIZE = 16         # struct mlx5_wqe_ctrl_seg, ref §1.2
RADDR_SEG_SIZE = 16        # struct mlx5_wqe_raddr_seg, ref §1.3
DATA_SEG_SIZE = 16         # struct mlx5_wqe_data_seg, ref §1.4
ATOMIC_SEG_SIZE = 16       # struct mlx5_wqe_atomic_seg, ref §1.6
INLINE_HDR_SIZE = 4        # struct mlx5_wqe_inl_data_seg byte_count, ref §1.5
AV_HALF_SIZE = 16          # NVSHMEM "half AV" (first 16 B of mlx5_wqe_av), ref §1.8
AV_FULL_SIZE = 48          # struct mlx5_wqe_av, ref §1.8
EXTENDED_UD_AV = 0x80000000  # MLX5_EXTENDED_UD_AV, bit 31 of av.dqp_dct, ref §1.8

INLINE_SEG_FLAG = 0x80000000  # MLX5_INLINE_SEG: bit 31 of a data segment's byte_count, ref §1.5
INLINE_LENGTH_MASK = 0x7FFFFFFF  # byte_count without the inline flag, ref §1.5
INVALID_LKEY = 0x100       # MLX5_INVALID_LKEY, ref §1.4

# --- fm_ce_se byte (ctrl byte 11), ref §1.2 -----------------------------------
FM_SHIFT = 5               # bits 7:5 fence mode
FM_MASK = 0xE0
CE_SHIFT = 2               # bits 3:2 completion mode
CE_MASK = 0x0C
SE_FLAG = 0x02             # bit 1 solicited event (MLX5_WQE_CTRL_SOLICITED)

WQE_CTRL_SOLICITED = 0x02                 # ref §1.2
WQE_CTRL_CQ_UPDATE = 0x08                 # CE=2 "CQE always", ref §1.2
WQE_CTRL_CQ_UPDATE_AND_EQE = 0x0C         # CE=3, ref §1.2
WQE_CTRL_FENCE = 0x80                     # rdma-core name; = FM 4 "small and fence", ref §1.2
WQE_CTRL_INITIATOR_SMALL_FENCE = 0x20     # ref §1.2


class FenceMode(IntEnum):
    """fm_ce_se bits 7:5 (value before the <<5 shift), ref §1.2."""
    NONE = 0
    INITIATOR_SMALL = 1
    FENCE = 2            # NVSHMEM IBGDA_MLX5_FM_FENCE (0x40)
    STRONG_ORDERING = 3
    SMALL_AND_FENCE = 4  # rdma-core MLX5_WQE_CTRL_FENCE (0x80)


class CompletionMode(IntEnum):
    """fm_ce_se bits 3:2, ref §1.2 (names of CE 0/1 from DOCA)."""
    CQE_ON_ERROR = 0
    CQE_ON_FIRST_ERROR = 1
    CQE_ALWAYS = 2       # MLX5_WQE_CTRL_CQ_UPDATE
    CQE_AND_EQE = 3      # MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE


# --- Send WQE opcodes (ctrl bits 7:0), ref §2.1 -------------------------------
class Opcode(IntEnum):
    NOP = 0x00
    SEND_INVAL = 0x01
    RDMA_WRITE = 0x08
    RDMA_WRITE_IMM = 0x09
    SEND = 0x0A
    SEND_IMM = 0x0B
    TSO = 0x0E              # the kernel calls it LSO
    WAIT = 0x0F
    RDMA_READ = 0x10
    ATOMIC_CS = 0x11
    ATOMIC_FA = 0x12
    ATOMIC_MASKED_CS = 0x14
    ATOMIC_MASKED_FA = 0x15
    BIND_MW = 0x18
    FMR = 0x19
    LOCAL_INVAL = 0x1B
    CONFIG_CMD = 0x1F
    SET_PSV = 0x20
    GET_PSV = 0x21
    CHECK_PSV = 0x22
    DUMP = 0x23
    UMR = 0x25
    RGET_PSV = 0x26
    RCHECK_PSV = 0x27
    TAG_MATCHING = 0x28
    ENHANCED_MPSW = 0x29
    FLOW_TBL_ACCESS = 0x2C
    ACCESS_ASO = 0x2D
    MMO = 0x2F


OPCODE_NAMES: dict[int, str] = {int(op): op.name for op in Opcode}

# Opcode groups by segment composition after the ctrl segment (ref §1.9, §1.6, §1.7):
RDMA_OPCODES = frozenset({Opcode.RDMA_WRITE, Opcode.RDMA_WRITE_IMM, Opcode.RDMA_READ})  # raddr + data/inline
SEND_OPCODES = frozenset({Opcode.SEND, Opcode.SEND_IMM, Opcode.SEND_INVAL})            # data/inline
PLAIN_ATOMIC_OPCODES = frozenset({Opcode.ATOMIC_CS, Opcode.ATOMIC_FA})                 # raddr + atomic + data
MASKED_ATOMIC_OPCODES = frozenset({Opcode.ATOMIC_MASKED_CS, Opcode.ATOMIC_MASKED_FA})  # raddr + masked seg(s) + data
ATOMIC_OPCODES = PLAIN_ATOMIC_OPCODES | MASKED_ATOMIC_OPCODES
GATHER_ONLY_OPCODES = frozenset({Opcode.DUMP})  # DUMP: ctrl + data segment (NVSHMEM), ref §1.9
# Opcodes whose segment layout the reference does not give: only the ctrl segment is decoded.
OPAQUE_OPCODES = frozenset(Opcode) - RDMA_OPCODES - SEND_OPCODES - ATOMIC_OPCODES \
    - GATHER_ONLY_OPCODES - {Opcode.NOP}

# Extended (masked) atomic opmods in ctrl bits 31:24, ref §1.7.
EXT_ATOMIC_OPMOD_4_BYTE = 0x08
EXT_ATOMIC_OPMOD_8_BYTE = 0x09


# --- CQE, ref §2.2 ------------------------------------------------------------
CQE_SIZE = 64
CQE_OWNER_MASK = 0x01        # MLX5_CQE_OWNER_MASK


class CqeOpcode(IntEnum):
    """op_own bits 7:4, ref §2.2."""
    REQ = 0
    RESP_WR_IMM = 1
    RESP_SEND = 2
    RESP_SEND_IMM = 3
    RESP_SEND_INV = 4
    RESIZE_CQ = 5
    NO_PACKET = 6
    SIG_ERR = 12
    REQ_ERR = 13
    RESP_ERR = 14
    INVALID = 15


CQE_OPCODE_NAMES: dict[int, str] = {int(op): op.name for op in CqeOpcode}
ERROR_CQE_OPCODES = frozenset({CqeOpcode.REQ_ERR, CqeOpcode.RESP_ERR})  # struct mlx5_err_cqe layout


class CqeSyndrome(IntEnum):
    """mlx5_err_cqe.syndrome, ref §2.2."""
    LOCAL_LENGTH_ERR = 0x01
    LOCAL_QP_OP_ERR = 0x02
    LOCAL_PROT_ERR = 0x04
    WR_FLUSH_ERR = 0x05
    MW_BIND_ERR = 0x06
    BAD_RESP_ERR = 0x10
    LOCAL_ACCESS_ERR = 0x11
    REMOTE_INVAL_REQ_ERR = 0x12
    REMOTE_ACCESS_ERR = 0x13
    REMOTE_OP_ERR = 0x14
    TRANSPORT_RETRY_EXC_ERR = 0x15
    RNR_RETRY_EXC_ERR = 0x16
    REMOTE_ABORTED_ERR = 0x22


CQE_SYNDROME_NAMES: dict[int, str] = {int(s): s.name for s in CqeSyndrome}
CQE_VENDOR_SYNDROME_ODP_PFAULT = 0x93  # ref §2.2

# --- Doorbells, ref §3 ----------------------------------------------------------
DBR_SIZE = 8                 # two BE32 counters, ref §3.1
DBR_RCV_INDEX = 0            # MLX5_RCV_DBR, ref §3.1
DBR_SND_INDEX = 1            # MLX5_SND_DBR: the SQ counter is at DBR+4, ref §3.1
DOORBELL_SIZE = 8            # the 8-byte UAR store, ref §3.3
UAR_DB_OFFSET = 0x800        # MLX5_BF_OFFSET, ref §3.2
UAR_CQ_DOORBELL_OFFSET = 0x20  # MLX5_CQ_DOORBELL, ref §3.2

DOORBELL_CONVENTIONS = ("rdma-core", "nvshmem", "doca")  # ref §3.3


# --- PRM commands, ref §4.2 -----------------------------------------------------
class PrmOpcode(IntEnum):
    QUERY_HCA_CAP = 0x100
    CREATE_MKEY = 0x200
    CREATE_CQ = 0x400
    CREATE_QP = 0x500
    DESTROY_QP = 0x501
    RST2INIT_QP = 0x502
    INIT2RTR_QP = 0x503
    RTR2RTS_QP = 0x504
    RTS2RTS_QP = 0x505
    QP_2ERR = 0x507       # "2ERR_QP"
    QP_2RST = 0x50A       # "2RST_QP"
    QUERY_QP = 0x50B
    CREATE_DCT = 0x710
    ALLOC_PD = 0x800


PRM_OPCODE_NAMES: dict[int, str] = {int(op): op.name for op in PrmOpcode}

# QP state transitions carried by modify commands (ref §4.2, §4.4): opcode -> name.
QP_TRANSITIONS: dict[int, str] = {
    PrmOpcode.RST2INIT_QP: "RST2INIT",
    PrmOpcode.INIT2RTR_QP: "INIT2RTR",
    PrmOpcode.RTR2RTS_QP: "RTR2RTS",
    PrmOpcode.RTS2RTS_QP: "RTS2RTS",
    PrmOpcode.QP_2ERR: "2ERR",
    PrmOpcode.QP_2RST: "2RST",
}
QP_TRANSITION_OPCODES: dict[str, int] = {name: int(op) for op, name in QP_TRANSITIONS.items()}
# Transitions whose input carries a qpc (ref §4.4: RST2INIT/INIT2RTR/RTR2RTS share one header + qpc).
QP_TRANSITIONS_WITH_QPC = frozenset({PrmOpcode.RST2INIT_QP, PrmOpcode.INIT2RTR_QP,
                                     PrmOpcode.RTR2RTS_QP, PrmOpcode.RTS2RTS_QP})


class QpcServiceType(IntEnum):
    """qpc.st, ref §4.2."""
    RC = 0x0
    UC = 0x1
    UD = 0x2
    XRC = 0x3
    MLX = 0x4
    DCI = 0x5
    DCT = 0x6
    QP0 = 0x7
    QP1 = 0x8
    RAW_DATAGRAM = 0x9
    REG_UMR = 0xC


class QpcRqType(IntEnum):
    """qpc.rq_type, ref §4.2."""
    REGULAR = 0
    SRQ = 1          # SRQ / RMP / XRC-SRQ / XRQ
    CYCLIC = 2       # "CRQ"
    ZERO_LENGTH = 3


QPC_MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}  # qpc.mtu, ref §4.2 (7 = raw-eth)

CREATE_QP_IN_SIZE = 272      # create_qp_in, ref §4.3
CREATE_QP_OUT_SIZE = 16      # create_qp_out, ref §4.3
MODIFY_QP_IN_SIZE = 272      # *_qp_in for the modify commands, ref §4.4
