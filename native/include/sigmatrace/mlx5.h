/* sigmatrace/mlx5.h -- mlx5 send-queue WQE, CQE, doorbell and PRM (DEVX) layouts.
 *
 * One C header for everything in sigmatrace that reads or writes mlx5 bytes
 * (the emulated HCA in native/emu, the tracer's decoders).  Every value below
 * comes from /work/shared/reference/mlx5.md; the section of that file is cited
 * next to each group ("ref §1.2" ...).  All multi-byte fields are big-endian
 * (ref §0) unless stated otherwise.  Self-contained: needs only <stdint.h>,
 * <string.h> and <endian.h>; no rdma-core header is required.
 */
#ifndef SIGMATRACE_MLX5_H
#define SIGMATRACE_MLX5_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ref §1.1 basic units ------------------------------------------------ */
#define ST_MLX5_SEND_WQE_BB        64u   /* WQE basic block (WQEBB) */
#define ST_MLX5_SEND_WQE_SHIFT     6u
#define ST_MLX5_SEND_WQE_DS        16u   /* DS unit */
#define ST_MLX5_WQE_CTRL_DS_MASK   0x3fu
#define ST_MLX5_SEND_WQE_MAX_WQEBBS 16u
#define ST_MLX5_INLINE_SEG         0x80000000u /* ref §1.5 */
#define ST_MLX5_INVALID_LKEY       0x100u      /* ref §1.4: ends a receive scatter list */

/* ---- ref §1.2 control segment ------------------------------------------- */
struct st_mlx5_wqe_ctrl_seg {
	uint32_t opmod_idx_opcode; /* BE: 31:24 opmod, 23:8 wqe_index, 7:0 opcode */
	uint32_t qpn_ds;           /* BE: 31:8 QPN, 7:0 DS (5:0 valid) */
	uint8_t  signature;
	uint8_t  dci_stream_channel_id[2];
	uint8_t  fm_ce_se;         /* 7:5 FM, 3:2 CE, 1 SE */
	uint32_t imm;              /* immediate, copied as given (already network order) */
} __attribute__((packed, aligned(4)));

#define ST_MLX5_WQE_CTRL_SOLICITED          0x02u
#define ST_MLX5_WQE_CTRL_CQ_UPDATE          0x08u /* CE=2: CQE always */
#define ST_MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE  0x0cu
#define ST_MLX5_WQE_CTRL_CE_MASK            0x0cu
#define ST_MLX5_WQE_CTRL_FENCE              0x80u /* rdma-core name; FM = 4 ("small and fence") */
#define ST_MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE 0x20u
#define ST_MLX5_FM_FENCE                    0x40u /* FM = 2 (NVSHMEM IBGDA_MLX5_FM_FENCE) */

/* ---- ref §1.3 .. §1.6 segments ------------------------------------------ */
struct st_mlx5_wqe_raddr_seg {
	uint64_t raddr;    /* BE64 */
	uint32_t rkey;     /* BE32 */
	uint32_t reserved;
} __attribute__((packed, aligned(4)));

struct st_mlx5_wqe_data_seg {
	uint32_t byte_count; /* BE32, bit 31 must be 0 */
	uint32_t lkey;       /* BE32 */
	uint64_t addr;       /* BE64 */
} __attribute__((packed, aligned(4)));

struct st_mlx5_wqe_inl_data_seg {
	uint32_t byte_count; /* BE32: length | ST_MLX5_INLINE_SEG; payload follows, raw */
} __attribute__((packed, aligned(4)));

struct st_mlx5_wqe_atomic_seg {
	uint64_t swap_add; /* BE64: swap value (CS) or add value (FA) */
	uint64_t compare;  /* BE64: compare value (CS) */
} __attribute__((packed, aligned(4)));

/* ---- ref §2.1 send opcodes ---------------------------------------------- */
enum {
	ST_MLX5_OPCODE_NOP              = 0x00,
	ST_MLX5_OPCODE_SEND_INVAL       = 0x01,
	ST_MLX5_OPCODE_RDMA_WRITE       = 0x08,
	ST_MLX5_OPCODE_RDMA_WRITE_IMM   = 0x09,
	ST_MLX5_OPCODE_SEND             = 0x0a,
	ST_MLX5_OPCODE_SEND_IMM         = 0x0b,
	ST_MLX5_OPCODE_TSO              = 0x0e,
	ST_MLX5_OPCODE_WAIT             = 0x0f,
	ST_MLX5_OPCODE_RDMA_READ        = 0x10,
	ST_MLX5_OPCODE_ATOMIC_CS        = 0x11,
	ST_MLX5_OPCODE_ATOMIC_FA        = 0x12,
	ST_MLX5_OPCODE_ATOMIC_MASKED_CS = 0x14,
	ST_MLX5_OPCODE_ATOMIC_MASKED_FA = 0x15,
	ST_MLX5_OPCODE_BIND_MW          = 0x18,
	ST_MLX5_OPCODE_LOCAL_INVAL      = 0x1b,
	ST_MLX5_OPCODE_DUMP             = 0x23,
	ST_MLX5_OPCODE_UMR              = 0x25,
};
#define ST_MLX5_OPMOD_EXT_ATOMIC_4B 0x08u /* ref §1.7 */
#define ST_MLX5_OPMOD_EXT_ATOMIC_8B 0x09u

/* ---- ref §2.2 CQE -------------------------------------------------------- */
struct st_mlx5_cqe64 {
	uint8_t  rsvd0[2];
	uint16_t wqe_id;         /* @2 */
	uint8_t  rsvd4[13];
	uint8_t  ml_path;        /* @17 */
	uint8_t  rsvd18[4];
	uint16_t slid;           /* @22 BE16 */
	uint32_t flags_rqpn;     /* @24 BE32: 23:0 remote QPN (responder) */
	uint8_t  hds_ip_ext;     /* @28 */
	uint8_t  l4_hdr_type_etc;
	uint16_t vlan_info;
	uint32_t srqn_uidx;      /* @32 BE32 */
	uint32_t imm_inval_pkey; /* @36 */
	uint8_t  app;            /* @40 */
	uint8_t  app_op;
	uint16_t app_info;
	uint32_t byte_cnt;       /* @44 BE32 */
	uint64_t timestamp;      /* @48 BE64 */
	uint32_t sop_drop_qpn;   /* @56 BE32: 31:24 send opcode (requester), 23:0 QPN */
	uint16_t wqe_counter;    /* @60 BE16 */
	uint8_t  signature;      /* @62 */
	uint8_t  op_own;         /* @63: 7:4 opcode, 3:2 format, 1 SE, 0 owner */
} __attribute__((packed));

/* error CQE view (ref §2.2, struct mlx5_err_cqe) */
struct st_mlx5_err_cqe {
	uint8_t  rsvd0[32];
	uint32_t srqn;             /* @32 */
	uint8_t  rsvd36[18];
	uint8_t  vendor_err_synd;  /* @54 */
	uint8_t  syndrome;         /* @55 */
	uint32_t s_wqe_opcode_qpn; /* @56 BE32 */
	uint16_t wqe_counter;      /* @60 */
	uint8_t  signature;
	uint8_t  op_own;
} __attribute__((packed));

enum {
	ST_MLX5_CQE_REQ           = 0,
	ST_MLX5_CQE_RESP_WR_IMM   = 1,
	ST_MLX5_CQE_RESP_SEND     = 2,
	ST_MLX5_CQE_RESP_SEND_IMM = 3,
	ST_MLX5_CQE_RESP_SEND_INV = 4,
	ST_MLX5_CQE_RESIZE_CQ     = 5,
	ST_MLX5_CQE_NO_PACKET     = 6,
	ST_MLX5_CQE_SIG_ERR       = 12,
	ST_MLX5_CQE_REQ_ERR       = 13,
	ST_MLX5_CQE_RESP_ERR      = 14,
	ST_MLX5_CQE_INVALID       = 15,
};
#define ST_MLX5_CQE_OWNER_MASK 1u

/* error syndromes (ref §2.2) */
enum {
	ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR       = 0x01,
	ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR        = 0x02,
	ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR         = 0x04,
	ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR           = 0x05,
	ST_MLX5_CQE_SYNDROME_MW_BIND_ERR            = 0x06,
	ST_MLX5_CQE_SYNDROME_BAD_RESP_ERR           = 0x10,
	ST_MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR       = 0x11,
	ST_MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR   = 0x12,
	ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR      = 0x13,
	ST_MLX5_CQE_SYNDROME_REMOTE_OP_ERR          = 0x14,
	ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR = 0x15,
	ST_MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR      = 0x16,
	ST_MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR     = 0x22,
};

/* ---- ref §3 doorbells ---------------------------------------------------- */
#define ST_MLX5_RCV_DBR        0      /* DBR dword index of the RQ counter */
#define ST_MLX5_SND_DBR        1      /* DBR dword index of the SQ counter (DBR+4) */
#define ST_MLX5_DBR_SIZE       8u
#define ST_MLX5_ADAPTER_PAGE_SIZE 4096u
#define ST_MLX5_BF_OFFSET      0x800u /* DB/BF register inside a UAR page */
#define ST_MLX5_CQ_DOORBELL    0x20u  /* CQ arm doorbell inside a UAR page */
#define ST_MLX5_CQ_SET_CI      0
#define ST_MLX5_CQ_ARM_DB      1
#define ST_MLX5_CQ_DB_REQ_NOT_SOL (1u << 24)
#define ST_MLX5_CQ_DB_REQ_NOT     0u

/* ---- ref §4.2 PRM opcodes and enum values -------------------------------- */
enum {
	ST_MLX5_CMD_OP_QUERY_HCA_CAP = 0x100,
	ST_MLX5_CMD_OP_CREATE_MKEY   = 0x200,
	ST_MLX5_CMD_OP_CREATE_CQ     = 0x400,
	ST_MLX5_CMD_OP_DESTROY_CQ    = 0x401, /* CREATE+1 by PRM convention; not in the reference */
	ST_MLX5_CMD_OP_CREATE_QP     = 0x500,
	ST_MLX5_CMD_OP_DESTROY_QP    = 0x501,
	ST_MLX5_CMD_OP_RST2INIT_QP   = 0x502,
	ST_MLX5_CMD_OP_INIT2RTR_QP   = 0x503,
	ST_MLX5_CMD_OP_RTR2RTS_QP    = 0x504,
	ST_MLX5_CMD_OP_RTS2RTS_QP    = 0x505,
	ST_MLX5_CMD_OP_2ERR_QP       = 0x507,
	ST_MLX5_CMD_OP_2RST_QP       = 0x50a,
	ST_MLX5_CMD_OP_QUERY_QP      = 0x50b,
	ST_MLX5_CMD_OP_CREATE_DCT    = 0x710,
	ST_MLX5_CMD_OP_ALLOC_PD      = 0x800,
};
enum { ST_MLX5_QPC_ST_RC = 0x0, ST_MLX5_QPC_ST_UC = 0x1, ST_MLX5_QPC_ST_UD = 0x2,
       ST_MLX5_QPC_ST_XRC = 0x3, ST_MLX5_QPC_ST_DCI = 0x5 };
enum { ST_MLX5_QPC_STATE_RST = 0, ST_MLX5_QPC_STATE_INIT = 1, ST_MLX5_QPC_STATE_RTR = 2,
       ST_MLX5_QPC_STATE_RTS = 3, ST_MLX5_QPC_STATE_SQER = 4, ST_MLX5_QPC_STATE_ERR = 6 };

/* ---- DEVX bit rule (ref §0, from mlx5dv.h __devx_dw_bit_off/_devx_set) ----
 * A field of width w at bit offset o (counted from the MSB of BE dword 0)
 * lives in dword o/32 at bits [31-(o%32) .. 32-w-(o%32)].  Fields of 64 bits
 * are two consecutive dwords (high first).  Widths 1..32 and 64 supported. */
static inline uint64_t st_devx_get(const void *buf, unsigned bit_off, unsigned width)
{
	const uint8_t *p = (const uint8_t *)buf;
	if (width == 64) {
		uint32_t hi, lo;
		memcpy(&hi, p + bit_off / 8, 4);
		memcpy(&lo, p + bit_off / 8 + 4, 4);
		return ((uint64_t)be32toh(hi) << 32) | be32toh(lo);
	}
	uint32_t dw;
	memcpy(&dw, p + (bit_off / 32) * 4, 4);
	dw = be32toh(dw);
	unsigned shift = 32 - width - (bit_off % 32);
	uint32_t mask = width == 32 ? 0xffffffffu : ((1u << width) - 1);
	return (dw >> shift) & mask;
}

static inline void st_devx_set(void *buf, unsigned bit_off, unsigned width, uint64_t v)
{
	uint8_t *p = (uint8_t *)buf;
	if (width == 64) {
		uint32_t hi = htobe32((uint32_t)(v >> 32)), lo = htobe32((uint32_t)v);
		memcpy(p + bit_off / 8, &hi, 4);
		memcpy(p + bit_off / 8 + 4, &lo, 4);
		return;
	}
	uint32_t dw;
	memcpy(&dw, p + (bit_off / 32) * 4, 4);
	dw = be32toh(dw);
	unsigned shift = 32 - width - (bit_off % 32);
	uint32_t mask = width == 32 ? 0xffffffffu : ((1u << width) - 1);
	dw = (dw & ~(mask << shift)) | (((uint32_t)v & mask) << shift);
	dw = htobe32(dw);
	memcpy(p + (bit_off / 32) * 4, &dw, 4);
}

/* PRM field descriptors: ST_PRM_<CMD>_<FIELD> = bit offset, width (from the
 * start of the command buffer).  Use as st_devx_get(buf, ST_PRM_X). */
/* common command header (ref §4.3 / §4.4) */
#define ST_PRM_CMD_OPCODE               0x000, 16
#define ST_PRM_CMD_UID                  0x010, 16
#define ST_PRM_CMD_OP_MOD               0x030, 16
#define ST_PRM_OUT_STATUS               0x000, 8
#define ST_PRM_OUT_SYNDROME             0x020, 32
/* create_qp_in (ref §4.3); qpc starts at bit 0xc0 (byte 0x18) */
#define ST_PRM_QP_OPT_PARAM_MASK        0x080, 32
#define ST_PRM_QPC_BASE_BITS            0x0c0
#define ST_PRM_QPC_ST                   0x0c8, 8
#define ST_PRM_QPC_PM_STATE             0x0d3, 2
#define ST_PRM_QPC_PD                   0x0e8, 24
#define ST_PRM_QPC_MTU                  0x100, 3
#define ST_PRM_QPC_LOG_MSG_MAX          0x103, 5
#define ST_PRM_QPC_LOG_RQ_SIZE          0x109, 4
#define ST_PRM_QPC_LOG_RQ_STRIDE        0x10d, 3
#define ST_PRM_QPC_NO_SQ                0x110, 1
#define ST_PRM_QPC_LOG_SQ_SIZE          0x111, 4
#define ST_PRM_QPC_COUNTER_SET_ID       0x120, 8
#define ST_PRM_QPC_UAR_PAGE             0x128, 24
#define ST_PRM_QPC_USER_INDEX           0x148, 24
#define ST_PRM_QPC_LOG_PAGE_SIZE        0x163, 5
#define ST_PRM_QPC_REMOTE_QPN           0x168, 24
#define ST_PRM_QPC_CQN_SND              0x4a8, 24
#define ST_PRM_QPC_PAGE_OFFSET          0x554, 6
#define ST_PRM_QPC_CQN_RCV              0x5a8, 24
#define ST_PRM_QPC_DBR_ADDR             0x5c0, 64
#define ST_PRM_QPC_RQ_TYPE              0x625, 3
#define ST_PRM_QPC_SRQN                 0x628, 24
#define ST_PRM_QPC_CS_REQ               0x6f0, 8
#define ST_PRM_QPC_CS_RES               0x6f8, 8
#define ST_PRM_QPC_DBR_UMEM_VALID       0x743, 1
#define ST_PRM_QPC_DBR_UMEM_ID          0x7e0, 32
#define ST_PRM_CREATE_QP_WQ_UMEM_OFFSET 0x800, 64 /* NVSHMEM copy only (ref §8) */
#define ST_PRM_CREATE_QP_WQ_UMEM_ID     0x840, 32
#define ST_PRM_CREATE_QP_WQ_UMEM_VALID  0x860, 1
#define ST_PRM_CREATE_QP_IN_SIZE        272u
#define ST_PRM_CREATE_QP_OUT_QPN        0x048, 24
#define ST_PRM_CREATE_QP_OUT_SIZE       16u
/* *2*_qp_in modify commands (ref §4.4): same header + qpn, same qpc layout */
#define ST_PRM_MODIFY_QP_QPN            0x048, 24
#define ST_PRM_QPC_RLID                 0x1b0, 16 /* byte 0x36 */
#define ST_PRM_QPC_GRH                  0x1a8, 1  /* byte 0x35 bit 23 of DW13 */
#define ST_PRM_QPC_RGID_BYTE            0x40      /* 16 bytes at byte 0x40 */
#define ST_PRM_QPC_VHCA_PORT_NUM        0x2a8, 8  /* byte 0x55 */
#define ST_PRM_QPC_ACK_TIMEOUT          0x1c0, 5  /* byte 0x38, DW14 31:27 */
#define ST_PRM_QPC_RETRY_COUNT          0x44d, 3  /* DW34 18:16 */
#define ST_PRM_QPC_RNR_RETRY            0x450, 3  /* DW34 15:13 */
#define ST_PRM_QPC_NEXT_SEND_PSN        0x488, 24 /* byte 0x91 */
#define ST_PRM_QPC_LOG_RRA_MAX          0x548, 3  /* DW42 23:21 */
#define ST_PRM_QPC_ATOMIC_MODE          0x54c, 4  /* DW42 19:16 */
#define ST_PRM_QPC_RRE                  0x550, 1  /* DW42 bit 15 */
#define ST_PRM_QPC_RWE                  0x551, 1  /* DW42 bit 14 */
#define ST_PRM_QPC_RAE                  0x552, 1  /* DW42 bit 13 */
#define ST_PRM_QPC_MIN_RNR_NAK          0x563, 5  /* DW43 28:24 */
#define ST_PRM_QPC_NEXT_RCV_PSN         0x568, 24 /* DW43 23:0 */
#define ST_PRM_MODIFY_QP_IN_SIZE        272u
/* create_cq_in (ref §4.5) */
#define ST_PRM_CQC_DBR_UMEM_VALID       0x086, 1
#define ST_PRM_CQC_CQE_SZ               0x088, 3
#define ST_PRM_CQC_CC                   0x08b, 1
#define ST_PRM_CQC_OI                   0x08e, 1
#define ST_PRM_CQC_DBR_UMEM_ID          0x0a0, 32
#define ST_PRM_CQC_LOG_CQ_SIZE          0x0e3, 5
#define ST_PRM_CQC_UAR_PAGE             0x0e8, 24
#define ST_PRM_CQC_C_EQN                0x138, 8
#define ST_PRM_CQC_LOG_PAGE_SIZE        0x143, 5
#define ST_PRM_CQC_DBR_ADDR             0x240, 64
#define ST_PRM_CREATE_CQ_UMEM_OFFSET    0x280, 64
#define ST_PRM_CREATE_CQ_UMEM_ID        0x2c0, 32
#define ST_PRM_CREATE_CQ_UMEM_VALID     0x2e0, 1
#define ST_PRM_CREATE_CQ_OUT_CQN        0x048, 24

/* ---- inline helpers ------------------------------------------------------ */
static inline uint32_t st_mlx5_ctrl_opcode(const struct st_mlx5_wqe_ctrl_seg *c)
{ return be32toh(c->opmod_idx_opcode) & 0xffu; }
static inline uint32_t st_mlx5_ctrl_wqe_index(const struct st_mlx5_wqe_ctrl_seg *c)
{ return (be32toh(c->opmod_idx_opcode) >> 8) & 0xffffu; }
static inline uint32_t st_mlx5_ctrl_opmod(const struct st_mlx5_wqe_ctrl_seg *c)
{ return be32toh(c->opmod_idx_opcode) >> 24; }
static inline uint32_t st_mlx5_ctrl_qpn(const struct st_mlx5_wqe_ctrl_seg *c)
{ return be32toh(c->qpn_ds) >> 8; }
static inline uint32_t st_mlx5_ctrl_ds(const struct st_mlx5_wqe_ctrl_seg *c)
{ return be32toh(c->qpn_ds) & ST_MLX5_WQE_CTRL_DS_MASK; }

static inline void st_mlx5_set_ctrl_seg(struct st_mlx5_wqe_ctrl_seg *c, uint32_t opmod,
					uint16_t wqe_index, uint8_t opcode, uint32_t qpn,
					uint32_t ds, uint8_t fm_ce_se, uint32_t imm_raw)
{
	c->opmod_idx_opcode = htobe32((opmod << 24) | ((uint32_t)wqe_index << 8) | opcode);
	c->qpn_ds = htobe32((qpn << 8) | (ds & ST_MLX5_WQE_CTRL_DS_MASK));
	c->signature = 0;
	c->dci_stream_channel_id[0] = c->dci_stream_channel_id[1] = 0;
	c->fm_ce_se = fm_ce_se;
	c->imm = imm_raw;
}

static inline void st_mlx5_set_raddr_seg(struct st_mlx5_wqe_raddr_seg *r, uint64_t raddr, uint32_t rkey)
{ r->raddr = htobe64(raddr); r->rkey = htobe32(rkey); r->reserved = 0; }

static inline void st_mlx5_set_data_seg(struct st_mlx5_wqe_data_seg *d, uint32_t len, uint32_t lkey, uint64_t addr)
{ d->byte_count = htobe32(len & ~ST_MLX5_INLINE_SEG); d->lkey = htobe32(lkey); d->addr = htobe64(addr); }

static inline void st_mlx5_set_atomic_seg(struct st_mlx5_wqe_atomic_seg *a, uint64_t swap_add, uint64_t compare)
{ a->swap_add = htobe64(swap_add); a->compare = htobe64(compare); }

/* WQEBBs a WQE of `ds` DS units occupies (ref §1.1). */
static inline uint32_t st_mlx5_wqebbs(uint32_t ds) { return (ds * 16 + 63) / 64; }
/* DS contribution of an inline segment carrying n bytes (ref §1.5). */
static inline uint32_t st_mlx5_inline_ds(uint32_t n) { return (n + 4 + 15) / 16; }

static inline uint8_t st_mlx5_cqe_opcode(const struct st_mlx5_cqe64 *c) { return c->op_own >> 4; }
static inline uint8_t st_mlx5_cqe_owner(const struct st_mlx5_cqe64 *c) { return c->op_own & 1; }
/* A CQE at consumer index ci in a ring of n (power of 2) entries is valid
 * when its opcode is not INVALID and its owner bit equals !!(ci & n) (ref §2.2). */
static inline int st_mlx5_cqe_valid(const struct st_mlx5_cqe64 *c, uint32_t ci, uint32_t n)
{ return st_mlx5_cqe_opcode(c) != ST_MLX5_CQE_INVALID && (st_mlx5_cqe_owner(c) == !!(ci & n)); }

/* The 8-byte UAR doorbell (ref §3.3): bytes 1-2 WQE index, bytes 4-6 QPN,
 * byte 7 DS (0 in the NVSHMEM/DOCA convention, where the index is the new
 * producer index; non-zero in the rdma-core convention, where it is the
 * last WQE's ctrl and the producer index is index + WQEBBs(DS)). */
struct st_mlx5_db {
	uint16_t wqe_index;
	uint32_t qpn;
	uint8_t  ds;
	uint8_t  opcode;
	uint16_t next_pi; /* producer index the doorbell announces */
};
static inline struct st_mlx5_db st_mlx5_decode_db(const uint8_t b[8])
{
	struct st_mlx5_db d;
	d.wqe_index = (uint16_t)((b[1] << 8) | b[2]);
	d.opcode = b[3];
	d.qpn = ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 8) | b[6];
	d.ds = b[7] & ST_MLX5_WQE_CTRL_DS_MASK;
	d.next_pi = d.ds ? (uint16_t)(d.wqe_index + st_mlx5_wqebbs(d.ds)) : d.wqe_index;
	return d;
}
/* NVSHMEM/DeepEP GPU doorbell value for producer index pi (ref §3.3, DB1). */
static inline void st_mlx5_make_nvshmem_db(uint8_t out[8], uint32_t pi, uint32_t qpn)
{
	uint32_t w0 = htobe32((pi & 0xffffu) << 8), w1 = htobe32(qpn << 8);
	memcpy(out, &w0, 4);
	memcpy(out + 4, &w1, 4);
}

#ifdef __cplusplus
}
#endif
#endif /* SIGMATRACE_MLX5_H */
