/* PRM (mlx5 command interface) layouts only the emulated HCA needs: the HCA
 * capability pages NVSHMEM's IBGDA transport reads, the QP context fields
 * beyond those of sigmatrace/mlx5.h, and the DCT context.  Test-only; the
 * tracer never parses these commands' outputs.
 *
 * Offsets are bit offsets from the start of the command buffer (or of the
 * capability page where said), width in bits, used with st_devx_get/_set and
 * the DEVX bit rule of reference §0.  They were computed by adding up the
 * `u8 name[bits]` declarations of the PRM structures in
 *   [RC] linux-rdma/rdma-core providers/mlx5/mlx5_ifc.h (HEAD 691953d8),
 *   [NV] NVIDIA/nvshmem v3.4.5-0 src/modules/transport/common/mlx5_ifc.h,
 *   [UX] openucx/ucx v1.13.1 src/uct/ib/mlx5/dv/ib_mlx5_ifc.h (dctc, create_dct_in),
 * which agree wherever they overlap (cmd_hca_cap, atomic_caps, qpc); the qpc
 * fields already in sigmatrace/mlx5.h (reference §4.3/§4.4) are the same
 * numbers.  Enum values are those of the same files. */
#ifndef ST_EMU_PRM_H
#define ST_EMU_PRM_H

#include "sigmatrace/mlx5.h"

/* ---- command opcodes ([RC] mlx5_ifc.h enum; not in the reference) ------------ */
enum {
	EMU_CMD_OP_QUERY_CQ       = 0x402,
	EMU_CMD_OP_DESTROY_DCT    = 0x711,
	EMU_CMD_OP_DRAIN_DCT      = 0x712,
	EMU_CMD_OP_QUERY_DCT      = 0x713,
	EMU_CMD_OP_DEALLOC_PD     = 0x801,
};

/* PRM command status values (Linux include/linux/mlx5/device.h; not in the
 * reference): OK, BAD_OP, BAD_PARAM, BAD_RES (a referenced resource does not
 * exist), BAD_RES_STATE, BAD_INPUT_LEN, BAD_OUTPUT_LEN. */
enum { CMD_OK = 0, CMD_BAD_OP = 2, CMD_BAD_PARAM = 3, CMD_BAD_RES = 5, CMD_BAD_RES_STATE = 9,
       CMD_BAD_INP_LEN = 0x50, CMD_BAD_OUTP_LEN = 0x51 };

/* ---- QUERY_HCA_CAP (0x100) --------------------------------------------------------
 * op_mod = (capability type << 1) | current(1)/maximum(0) ([NV] ibgda.cpp
 * ibgda_create_qp: MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE | (MLX5_CAP_GENERAL << 1) |
 * HCA_CAP_OPMOD_GET_CUR; [NV] mlx5_ifc.h enum mlx5_cap_type). */
enum { EMU_CAPTYPE_GENERAL = 0, EMU_CAPTYPE_ODP = 2, EMU_CAPTYPE_ATOMIC = 3, EMU_CAPTYPE_ROCE = 4 };
#define EMU_QUERY_HCA_CAP_IN_SIZE   16u    /* query_hca_cap_in */
#define EMU_QUERY_HCA_CAP_OUT_SIZE  4112u  /* query_hca_cap_out: 16-byte header + 4096-byte capability */
#define EMU_HCA_CAP_BASE_BITS       0x80   /* query_hca_cap_out.capability */
#define EMU_HCA_CAP_PAGE_BYTES      256u   /* cmd_hca_cap / atomic_caps / roce_cap are 0x800 bits */

/* cmd_hca_cap, bit offsets inside the capability page */
#define EMU_CAP_LOG_MAX_SRQ_SZ          0x080, 8
#define EMU_CAP_LOG_MAX_QP_SZ           0x088, 8
#define EMU_CAP_LOG_MAX_QP              0x09b, 5
#define EMU_CAP_LOG_MAX_SRQ             0x0ab, 5
#define EMU_CAP_LOG_MAX_CQ_SZ           0x0c8, 8
#define EMU_CAP_LOG_MAX_CQ              0x0db, 5
#define EMU_CAP_LOG_MAX_EQ_SZ           0x0e0, 8
#define EMU_CAP_LOG_MAX_MKEY            0x0ea, 6
#define EMU_CAP_LOG_MAX_EQ              0x0fc, 4
#define EMU_CAP_LOG_MAX_MRW_SZ          0x109, 7
#define EMU_CAP_LOG_MAX_RA_REQ_DC       0x12a, 6
#define EMU_CAP_LOG_MAX_RA_RES_DC       0x13a, 6
#define EMU_CAP_LOG_MAX_RA_REQ_QP       0x14a, 6
#define EMU_CAP_LOG_MAX_RA_RES_QP       0x15a, 6
#define EMU_CAP_GID_TABLE_SIZE          0x170, 16
#define EMU_CAP_PKEY_TABLE_SIZE         0x190, 16
#define EMU_CAP_PORT_TYPE               0x1b6, 2   /* 0 InfiniBand, 1 Ethernet */
#define EMU_CAP_NUM_PORTS               0x1b8, 8
#define EMU_CAP_LOG_MAX_MSG             0x1c3, 5
#define EMU_CAP_CQE_VERSION             0x1fc, 4
#define EMU_CAP_COMPACT_ADDRESS_VECTOR  0x200, 1
#define EMU_CAP_DCT                     0x21a, 1
#define EMU_CAP_ROCE                    0x21d, 1
#define EMU_CAP_ATOMIC                  0x21e, 1
#define EMU_CAP_CQ_OI                   0x220, 1
#define EMU_CAP_CQ_RESIZE               0x221, 1
#define EMU_CAP_XRC                     0x23c, 1
#define EMU_CAP_UD                      0x23d, 1
#define EMU_CAP_UC                      0x23e, 1
#define EMU_CAP_RC                      0x23f, 1
#define EMU_CAP_UAR_4K                  0x240, 1
#define EMU_CAP_UMEM_UID_0              0x252, 1
#define EMU_CAP_LOG_PG_SZ               0x258, 8
#define EMU_CAP_BF                      0x260, 1
#define EMU_CAP_LOG_BF_REG_SIZE         0x26b, 5
#define EMU_CAP_MAX_WQE_SZ_SQ           0x290, 16
#define EMU_CAP_MAX_WQE_SZ_RQ           0x2b0, 16
#define EMU_CAP_MAX_WQE_SZ_SQ_DC        0x2d0, 16
#define EMU_CAP_LOG_MAX_PD              0x32b, 5
#define EMU_CAP_LOG_UAR_PAGE_SZ         0x490, 16
#define EMU_CAP_NUM_OF_UARS_PER_PAGE    0x520, 32
#define EMU_CAP_LOG_MAX_DCT_CONNECTIONS 0x57b, 5
#define EMU_CAP_LOG_MAX_ATOMIC_SIZE_QP  0x580, 8
#define EMU_CAP_LOG_MAX_ATOMIC_SIZE_DC  0x598, 8

/* atomic_caps, bit offsets inside the capability page ([NV] transport_mlx5_common.cpp
 * reads these four; bit values from [NV] transport_mlx5_common.h) */
#define EMU_ACAP_8B_ENDIANNESS_MODE         0x040, 2  /* atomic_req_8B_endianness_mode */
#define EMU_ACAP_8B_ENDIANNESS_MODE_1_SUPP  0x046, 1  /* supported_atomic_req_8B_endianness_mode_1 */
#define EMU_ACAP_ATOMIC_OPERATIONS          0x090, 16
#define EMU_ACAP_ATOMIC_SIZE_QP             0x0b0, 16
#define EMU_ACAP_ATOMIC_SIZE_DC             0x0d0, 16
enum { EMU_ATOMIC_OP_CAS = 0x1, EMU_ATOMIC_OP_FA = 0x2, EMU_ATOMIC_OP_MASKED_CAS = 0x4, EMU_ATOMIC_OP_MASKED_FA = 0x8 };
enum { EMU_ATOMIC_SIZE_4B = 0x4, EMU_ATOMIC_SIZE_8B = 0x8 };

/* ---- QP context fields beyond sigmatrace/mlx5.h (absolute bit offsets in
 * create_qp_in / *2*_qp_in / query_qp_out, qpc at bit 0xc0) -------------------- */
#define EMU_QPC_STATE                   0x0c0, 4
#define EMU_QPC_PKEY_INDEX              0x190, 16
#define EMU_QPC_MLID                    0x1a9, 7
#define EMU_QPC_SRC_ADDR_INDEX          0x1c8, 8
#define EMU_QPC_HOP_LIMIT               0x1d8, 8
#define EMU_QPC_TCLASS                  0x1e4, 8
#define EMU_QPC_FLOW_LABEL              0x1ec, 20
#define EMU_QPC_SL                      0x2a4, 4
#define EMU_QPC_LOG_ACK_REQ_FREQ        0x440, 4
#define EMU_QPC_LOG_SRA_MAX             0x448, 3
#define EMU_QPC_Q_KEY                   0x600, 32
#define EMU_QPC_HW_SQ_WQEBB_COUNTER     0x660, 16
#define EMU_QPC_SW_SQ_WQEBB_COUNTER     0x670, 16
#define EMU_QPC_DC_ACCESS_KEY           0x700, 64
#define EMU_QUERY_QP_IN_SIZE            16u
#define EMU_QUERY_QP_OUT_SIZE           272u
enum { EMU_QPC_ATOMIC_MODE_IB_SPEC = 1, EMU_QPC_ATOMIC_MODE_ONLY_8B = 2, EMU_QPC_ATOMIC_MODE_UP_TO_8B = 3 };
enum { EMU_QPC_PM_STATE_MIGRATED = 3 };

/* ---- DCT: create_dct_in ([UX]): dctc at bit 0x80, 128 bytes in all;
 * create_dct_out: dctn at 0x48; query_dct_in: dctn at 0x48; query_dct_out
 * ([RC]): dctc at bit 0x80.  DCTC fields relative to the dctc: */
#define EMU_CREATE_DCT_IN_SIZE          128u
#define EMU_CREATE_DCT_OUT_DCTN         0x048, 24
#define EMU_DCT_DCTN                    0x048, 24 /* query_dct_in, drain_dct_in */
#define EMU_DCTC_BASE_BITS              0x080
#define EMU_DCTC_STATE                  0x004, 4
#define EMU_DCTC_USER_INDEX             0x028, 24
#define EMU_DCTC_CQN                    0x048, 24
#define EMU_DCTC_COUNTER_SET_ID         0x060, 8
#define EMU_DCTC_ATOMIC_MODE            0x068, 4
#define EMU_DCTC_RRE                    0x06c, 1
#define EMU_DCTC_RWE                    0x06d, 1
#define EMU_DCTC_RAE                    0x06e, 1
#define EMU_DCTC_CS_RES                 0x088, 8
#define EMU_DCTC_MIN_RNR_NAK            0x093, 5
#define EMU_DCTC_SRQN                   0x0a8, 24
#define EMU_DCTC_PD                     0x0c8, 24
#define EMU_DCTC_TCLASS                 0x0e0, 8
#define EMU_DCTC_FLOW_LABEL             0x0ec, 20
#define EMU_DCTC_DC_ACCESS_KEY          0x100, 64
#define EMU_DCTC_MTU                    0x145, 3
#define EMU_DCTC_PORT                   0x148, 8
#define EMU_DCTC_PKEY_INDEX             0x150, 16
#define EMU_DCTC_MY_ADDR_INDEX          0x168, 8
#define EMU_DCTC_HOP_LIMIT              0x178, 8
#define EMU_QUERY_DCT_OUT_SIZE          128u
/* dctc.state ([UX] UCT_IB_MLX5_DCTC_STATE_*): ACTIVE 0, DRAINING 1, DRAINED 2 */
enum { EMU_DCTC_STATE_ACTIVE = 0, EMU_DCTC_STATE_DRAINING = 1, EMU_DCTC_STATE_DRAINED = 2 };

/* A DEVX field at bit offset `base` + the relative descriptor (for the
 * capability pages and the dctc). */
#define EMU_AT(base, ...) emu_at_((base), __VA_ARGS__)
#define emu_at_(base, off, width) ((base) + (off)), (width)

#endif
