/* emu_nvshmem_client -- NVSHMEM 3.4.5's IBGDA transport, host set-up and
 * device-side WQEs, replayed on the CPU over the emulated HCA.
 *
 * The set-up follows ibgda.cpp call for call (src/modules/transport/ibgda/
 * ibgda.cpp at v3.4.5-0; reference mlx5.md §5.1): QUERY_HCA_CAP general
 * (mlx5 device check, cqe_version, log_bf_reg_size, compact AV) and atomic
 * (CAS/FA/masked CAS/masked FA, 4- and 8-byte sizes, 8-byte endianness
 * mode); PD + init_obj(PD); the QP shared objects (verbs SRQ + init_obj
 * srqn, verbs recv CQ + init_obj cqn, internal buffer, WQ and DBR umems);
 * the DCT shared objects (parent domain, SRQ on it, two CQs, AH +
 * init_obj(AH)); DCTs through mlx5dv_create_qp + ibv_modify_qp INIT/RTR; a
 * DCI and RC QPs through DevX CREATE_CQ (collapsed, overrun ignore, ring
 * filled with 0xff) / CREATE_QP / RST2INIT / INIT2RTR / RTR2RTS with the
 * fields NVSHMEM sets; the symmetric heap registered with ibv_reg_dmabuf_mr,
 * falling back to ibv_reg_mr.  The WQEs are built as ibgda_device.cuh builds
 * them (ibgda_write_rdma_write_wqe, _inl_wqe, _read_wqe, _atomic_wqe,
 * _nop_wqe, _dump_wqe) and announced with NVSHMEM's doorbell: DBR+4 =
 * BE32(pi & 0xffff), then the 8 bytes {BE32(pi << 8), BE32(qpn << 8)} to the
 * UAR; completions are polled on CQE[0] of the collapsed CQ (wqe_counter).
 *
 *   emu_nvshmem_client --caps            QUERY_HCA_CAP answers
 *   emu_nvshmem_client --objects         the PRM objects one by one (create,
 *                                        modify, query, refusals)
 *   emu_nvshmem_client --pair [opts]     two endpoints in one process, the
 *                                        NVSHMEM sequence and the operations
 *   emu_nvshmem_client --rank 0|1 --dir D [opts]   the same in two processes
 *   opts: --gpu      "GPU memory" from the CUDA driver for the heap, the
 *                    internal buffer, the WQ, CQ and DBR rings (NVSHMEM's
 *                    default NVSHMEM_IBGDA_FORCE_NIC_BUF_MEMTYPE=gpumem), all
 *                    touched by this "GPU" only through the driver's device
 *                    accesses, the UAR mapped with cuMemHostRegister(Portable |
 *                    DeviceMap | IoMemory) + cuMemHostGetDevicePointer and
 *                    rung through the device pointer (NIC handler "gpu")
 *         --dmabuf   try ibv_reg_dmabuf_mr (cuMemGetHandleForAddressRange)
 *                    first, as NVSHMEM does where CUDA supports dma-buf
 *         --dc       DCT/DCI objects and DC traffic (SIGMATRACE_EMU_DC=1)
 *         --cpu-proxy  NIC handler "cpu" (what NVSHMEM's auto handler falls
 *                    back to when the UAR cannot be mapped into the GPU): the
 *                    "GPU" only publishes each QP's producer index in a host
 *                    mailbox, a proxy thread writes the DBR and rings the
 *                    doorbell with index = the 64-bit producer index << 8
 *                    (nvshmemt_ibgda_progress), DBR in host memory
 *         --wrap     first push the RC QP's producer index past 65536 with
 *                    NOPs, so that every later check runs with the 16-bit
 *                    WQE index wrapped (and, with --cpu-proxy, byte 0 of the
 *                    doorbell holding index bits 23:16)
 *
 * Output: "CHECK <name> ok" per check, "RESULT OK" at the end (exit 0);
 * "RESULT FAIL ..." (exit 1), exit 2 set-up failure, exit 3 the UAR could not
 * be mapped into the GPU (what sends NVSHMEM's auto handler to the CPU proxy).
 *
 * Over 600 lines: a test program that replays NVSHMEM's whole IBGDA transport (set-up,
 * device-side WQEs, ping-pong over two processes) as one binary, as NVSHMEM is one transport.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include "emucuda.h"
#include "file_exchange.h"
#include "ibgda_common.h"
#include "sigmatrace/mlx5.h"

#include "cu_driver.h" /* the emulated CUDA driver (libcuda.so.1 of native/emu/cuda) */

#define DIE(code, ...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(code); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(1, __VA_ARGS__); } while (0)
#define SETUP(c, ...) do { if (!(c)) DIE(2, __VA_ARGS__); } while (0)
#define OK(name) do { printf("CHECK %s ok\n", name); fflush(stdout); } while (0)

static int g_gpu, g_dmabuf, g_dc, g_cpu_proxy, g_wrap, g_depth = 128, g_linger_ms;

/* PRM values NVSHMEM uses (ibgda.cpp; reference §4.2) */
#define OPMOD_GEN_CUR    ((0 << 1) | 1)     /* MLX5_CAP_GENERAL, HCA_CAP_OPMOD_GET_CUR */
#define OPMOD_ATOMIC_CUR ((3 << 1) | 1)     /* MLX5_CAP_ATOMIC */
#define DC_KEY           0x5623CEAFull      /* IBGDA_DC_ACCESS_KEY */
#define FM_FENCE         0x40               /* IBGDA_MLX5_FM_FENCE (ref §1.2) */
#define CAP_OUT          4112               /* DEVX_ST_SZ_BYTES(query_hca_cap_out) */
#define CAP(buf, ...) cap_get(buf, __VA_ARGS__) /* a cmd_hca_cap / atomic_caps field */
#define cap_get(buf, off, w) st_devx_get(buf, 0x80 + (off), (w))

/* cmd_hca_cap / atomic_caps / qpc / dctc fields (bit offset, width; PRM,
 * computed from NVSHMEM's and rdma-core's mlx5_ifc.h, native/emu/emu_prm.h) */
#define HCAP_CQE_VERSION      0x1fc, 4
#define HCAP_LOG_BF_REG_SIZE  0x26b, 5
#define HCAP_COMPACT_AV       0x200, 1
#define HCAP_DCT              0x21a, 1
#define HCAP_PORT_TYPE        0x1b6, 2
#define HCAP_LOG_MAX_QP       0x09b, 5
#define ACAP_ENDIAN_MODE      0x040, 2
#define ACAP_ENDIAN_MODE1     0x046, 1
#define ACAP_OPS              0x090, 16
#define ACAP_SIZE_QP          0x0b0, 16
#define ACAP_SIZE_DC          0x0d0, 16
#define QPC_STATE             0x0c0, 4
#define QPC_PKEY_INDEX        0x190, 16
#define QPC_SL                0x2a4, 4
#define QPC_LOG_ACK_REQ_FREQ  0x440, 4
#define QPC_LOG_SRA_MAX       0x448, 3
#define QPC_DC_ACCESS_KEY     0x700, 64
#define QPC_SW_SQ_COUNTER     0x670, 16
#define DCTC(off, w)          (0x80 + (off)), (w)
#define DCT_STATE             DCTC(0x004, 4)
#define DCT_CQN               DCTC(0x048, 24)
#define DCT_RRE               DCTC(0x06c, 1)
#define DCT_RWE               DCTC(0x06d, 1)
#define DCT_RAE               DCTC(0x06e, 1)
#define DCT_ATOMIC_MODE       DCTC(0x068, 4)
#define DCT_SRQN              DCTC(0x0a8, 24)
#define DCT_PD                DCTC(0x0c8, 24)
#define DCT_KEY               DCTC(0x100, 64)
#define DCT_MTU               DCTC(0x145, 3)
#define DCT_PORT              DCTC(0x148, 8)

struct node;
static struct node *g_proxy_nodes[2]; /* --cpu-proxy: the nodes whose proxy threads run */
static void *proxy_main(void *arg);

/* ---- memory the "GPU" or the host owns --------------------------------------------- */
struct mem { uint64_t a; size_t n; int gpu; };

static void mem_alloc(struct mem *m, size_t n, int gpu)
{
	m->n = n;
	m->gpu = gpu;
	if (gpu) {
		CUdeviceptr d;
		SETUP(cuMemAlloc_v2(&d, n) == 0, "cuMemAlloc %zu", n);
		SETUP(cuMemsetD8_v2(d, 0, n) == 0, "cuMemsetD8");
		m->a = d;
	} else {
		void *p;
		SETUP(posix_memalign(&p, 4096, n) == 0, "posix_memalign");
		memset(p, 0, n);
		m->a = (uint64_t)(uintptr_t)p;
	}
}
static void mem_wr(const struct mem *m, uint64_t off, const void *src, size_t n)
{
	if (m->gpu)
		emucu_memcpy_to_dev(m->a + off, src, n);
	else
		memcpy((void *)(uintptr_t)(m->a + off), src, n);
}
static void mem_rd(const struct mem *m, uint64_t off, void *dst, size_t n)
{
	if (m->gpu)
		emucu_memcpy_from_dev(dst, m->a + off, n);
	else
		memcpy(dst, (const void *)(uintptr_t)(m->a + off), n);
}
static void mem_fill(const struct mem *m, int v)
{
	if (m->gpu)
		SETUP(cuMemsetD8_v2(m->a, (unsigned char)v, m->n) == 0, "cuMemsetD8");
	else
		memset((void *)(uintptr_t)m->a, v, m->n);
}
static void st32(uint64_t a, uint32_t v, int gpu)
{
	if (gpu)
		emucu_store32(a, v); /* st.release.gpu */
	else
		__atomic_store_n((uint32_t *)(uintptr_t)a, v, __ATOMIC_RELEASE);
}
static void st64(uint64_t a, uint64_t v, int gpu)
{
	if (gpu)
		emucu_store64(a, v);
	else
		__atomic_store_n((uint64_t *)(uintptr_t)a, v, __ATOMIC_RELEASE);
}

/* ---- endpoints ------------------------------------------------------------------------- */
struct cqx { struct mem ring, dbr; uint32_t cqn, n; struct mlx5dv_devx_obj *obj; struct mlx5dv_devx_uar *uar; };
struct qpx {
	int dci;
	struct cqx cq;
	struct mem wq, dbr;
	struct mlx5dv_devx_umem *wq_umem, *dbr_umem;
	struct mlx5dv_devx_uar *uar;
	uint64_t db;        /* doorbell register: device pointer (--gpu) or host */
	uint32_t qpn, nwqebb, pi, user_index;
	uint64_t pi64;      /* the producer index as NVSHMEM keeps it (64 bits, WQEBBs) */
	struct mlx5dv_devx_obj *obj;
	int slot;           /* --cpu-proxy: its producer-index mailbox slot */
};
struct node {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint32_t pdn, lid, srqn, rcqn;
	struct ibv_srq *srq;
	struct ibv_cq *rcq;
	struct mem ibuf, heap;
	struct ibv_mr *ibuf_mr, *heap_mr;
	int log_bf_reg_size;
	/* DCT shared objects */
	struct ibv_pd *pdom;
	struct ibv_srq *dsrq;
	struct ibv_cq *dscq, *drcq;
	struct ibv_ah *ah;
	struct mlx5dv_ah dah;
	struct ibv_qp *dct[2];
	struct qpx dci, rc[2];
	/* --cpu-proxy: the producer-index mailbox (host memory the "GPU" writes
	 * through its mapping) and the proxy thread's view */
	uint64_t *mailbox, mailbox_dev;
	uint64_t seen[4];
	struct qpx *slots[4];
	int nslots;
	pthread_t proxy;
};
struct peer { uint32_t lid, qpn[2], dctn, rkey; uint64_t heap; uint8_t av[16]; };

static int cap_query(struct ibv_context *ctx, uint32_t op_mod, uint8_t *out)
{
	uint8_t in[16] = { 0 };
	memset(out, 0, CAP_OUT);
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_QUERY_HCA_CAP);
	st_devx_set(in, ST_PRM_CMD_OP_MOD, op_mod);
	return mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, CAP_OUT);
}

static struct ibv_context *open_dev(void)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	SETUP(l && n > 0, "no device");
	SETUP(strstr(ibv_get_device_name(l[0]), "mlx5"), "device name without mlx5");
	struct ibv_context *c = ibv_open_device(l[0]);
	SETUP(c, "open_device");
	ibv_free_device_list(l);
	return c;
}

/* A memory registration NVSHMEM-style: dma-buf first where asked, then by address. */
static struct ibv_mr *reg_mem(struct node *nd, const struct mem *m)
{
	const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	if (m->gpu && g_dmabuf) {
		int fd = -1;
		SETUP(cuMemGetHandleForAddressRange(&fd, m->a, m->n, 1, 0) == 0, "cuMemGetHandleForAddressRange");
		struct ibv_mr *mr = ibv_reg_dmabuf_mr(nd->pd, 0, m->n, m->a, fd, acc);
		if (mr) {
			printf("REG dmabuf lkey=0x%x\n", mr->lkey);
			return mr; /* NVSHMEM keeps the fd open (handle->fd) */
		}
		printf("REG dmabuf refused errno=%d: ibv_reg_mr\n", errno);
		close(fd);
	}
	struct ibv_mr *mr = ibv_reg_mr(nd->pd, (void *)(uintptr_t)m->a, m->n, acc);
	SETUP(mr, "ibv_reg_mr errno %d", errno);
	return mr;
}

static struct mlx5dv_devx_umem *umem_of(struct node *nd, const struct mem *m)
{
	if (m->gpu && g_dmabuf) { /* ibgda_mobject_nic_map(use_dmabuf): the emulator refuses dma-buf umems */
		int fd = -1;
		SETUP(cuMemGetHandleForAddressRange(&fd, m->a, (m->n + 4095) & ~4095ul, 1, 0) == 0, "dmabuf handle");
		struct mlx5dv_devx_umem_in ui = { .addr = 0, .size = m->n, .access = IBV_ACCESS_LOCAL_WRITE,
						  .pgsz_bitmap = UINT64_MAX & ~4095ull, .comp_mask = MLX5DV_UMEM_MASK_DMABUF,
						  .dmabuf_fd = fd };
		struct mlx5dv_devx_umem *u = mlx5dv_devx_umem_reg_ex(nd->ctx, &ui);
		close(fd);
		CHECK(!u && errno == EOPNOTSUPP, "dma-buf umem: expected EOPNOTSUPP, got %p errno %d", (void *)u, errno);
	}
	struct mlx5dv_devx_umem *u = mlx5dv_devx_umem_reg(nd->ctx, (void *)(uintptr_t)m->a, m->n, IBV_ACCESS_LOCAL_WRITE);
	SETUP(u, "umem_reg errno %d", errno);
	return u;
}

/* ibgda_create_cq: ring of g_depth 64-byte CQEs filled with 0xff, collapsed, overrun ignore */
static void make_cq(struct node *nd, struct cqx *cq)
{
	cq->n = (uint32_t)g_depth;
	mem_alloc(&cq->ring, (size_t)cq->n * 64, g_gpu);
	mem_fill(&cq->ring, 0xff);
	mem_alloc(&cq->dbr, 64, g_gpu);
	struct mlx5dv_devx_umem *ru = umem_of(nd, &cq->ring), *du = umem_of(nd, &cq->dbr);
	uint32_t eqn;
	SETUP(!mlx5dv_devx_query_eqn(nd->ctx, 0, &eqn), "query_eqn");
	cq->uar = mlx5dv_devx_alloc_uar(nd->ctx, MLX5DV_UAR_ALLOC_TYPE_NC);
	SETUP(cq->uar, "alloc_uar NC");
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	cq->obj = ibgda_create_cq(nd->ctx, ru->umem_id, du->umem_id, cq->n, cq->uar->page_id, eqn, 1, out, &cq->cqn);
	SETUP(cq->obj, "CREATE_CQ status 0x%x", (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));
}

/* ibgda_alloc_and_map_qp_uar: NC_DEDICATED (rdma-core 45+), else BF with the
 * register size from log_bf_reg_size; --gpu maps it into the "GPU". */
static void make_uar(struct node *nd, struct qpx *q)
{
	size_t size = 8;
	q->uar = mlx5dv_devx_alloc_uar(nd->ctx, 1u << 31 /* MLX5DV_UAR_ALLOC_TYPE_NC_DEDICATED */);
	if (!q->uar && g_cpu_proxy)
		q->uar = mlx5dv_devx_alloc_uar(nd->ctx, MLX5DV_UAR_ALLOC_TYPE_NC);
	if (!q->uar) {
		size = (size_t)1 << nd->log_bf_reg_size;
		q->uar = mlx5dv_devx_alloc_uar(nd->ctx, MLX5DV_UAR_ALLOC_TYPE_BF);
	}
	SETUP(q->uar, "alloc_uar");
	q->db = (uint64_t)(uintptr_t)q->uar->reg_addr;
	if (!g_gpu || g_cpu_proxy)
		return; /* the CPU rings it (proxy), or there is no GPU */
	CUresult r = cuMemHostRegister_v2(q->uar->reg_addr, size, 0x01 | 0x02 | 0x04); /* Portable|DeviceMap|IoMemory */
	if (r) {
		printf("UARMAP refused cuMemHostRegister=%d\n", r);
		printf("RESULT FAIL the UAR could not be mapped into the GPU\n");
		exit(3);
	}
	CUdeviceptr d;
	SETUP(cuMemHostGetDevicePointer_v2(&d, q->uar->reg_addr, 0) == 0, "cuMemHostGetDevicePointer");
	q->db = d;
	printf("UARMAP ok host=%p dev=0x%llx size=%zu\n", q->uar->reg_addr, (unsigned long long)d, size);
}

/* ibgda_create_qp: CREATE_QP for RC or DCI with the fields NVSHMEM sets */
static void make_qp(struct node *nd, struct qpx *q, int dci, uint32_t user_index)
{
	q->dci = dci;
	q->user_index = user_index;
	q->nwqebb = (uint32_t)g_depth;
	make_cq(nd, &q->cq);
	make_uar(nd, q);
	mem_alloc(&q->wq, (size_t)q->nwqebb * 64, g_gpu);
	mem_alloc(&q->dbr, 64, g_gpu && !g_cpu_proxy); /* CPU handlers: the DBR in host memory */
	if (g_cpu_proxy) {
		q->slot = nd->nslots;
		nd->slots[nd->nslots++] = q;
	}
	q->wq_umem = umem_of(nd, &q->wq);
	q->dbr_umem = umem_of(nd, &q->dbr);
	uint8_t in[ST_PRM_CREATE_QP_IN_SIZE] = { 0 }, out[IBGDA_PRM_OUT_SIZE] = { 0 };
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_CREATE_QP);
	st_devx_set(in, ST_PRM_CREATE_QP_WQ_UMEM_ID, q->wq_umem->umem_id);
	st_devx_set(in, ST_PRM_CREATE_QP_WQ_UMEM_OFFSET, 0);
	st_devx_set(in, ST_PRM_CREATE_QP_WQ_UMEM_VALID, 1);
	st_devx_set(in, ST_PRM_QPC_ST, dci ? ST_MLX5_QPC_ST_DCI : ST_MLX5_QPC_ST_RC);
	st_devx_set(in, ST_PRM_QPC_PM_STATE, 3);
	st_devx_set(in, ST_PRM_QPC_PD, nd->pdn);
	st_devx_set(in, ST_PRM_QPC_UAR_PAGE, q->uar->page_id);
	st_devx_set(in, ST_PRM_QPC_RQ_TYPE, 1);
	st_devx_set(in, ST_PRM_QPC_SRQN, nd->srqn);
	st_devx_set(in, ST_PRM_QPC_CQN_SND, q->cq.cqn);
	st_devx_set(in, ST_PRM_QPC_CQN_RCV, nd->rcqn);
	st_devx_set(in, ST_PRM_QPC_LOG_SQ_SIZE, ibgda_ilog2(q->nwqebb));
	st_devx_set(in, ST_PRM_QPC_LOG_RQ_SIZE, 0);
	st_devx_set(in, ST_PRM_QPC_CS_REQ, 0);
	st_devx_set(in, ST_PRM_QPC_CS_RES, 0);
	st_devx_set(in, ST_PRM_QPC_DBR_UMEM_VALID, 1);
	st_devx_set(in, ST_PRM_QPC_DBR_ADDR, 0);
	st_devx_set(in, ST_PRM_QPC_DBR_UMEM_ID, q->dbr_umem->umem_id);
	st_devx_set(in, ST_PRM_QPC_USER_INDEX, user_index);
	st_devx_set(in, ST_PRM_QPC_PAGE_OFFSET, 0);
	q->obj = mlx5dv_devx_obj_create(nd->ctx, in, sizeof in, out, sizeof out);
	SETUP(q->obj, "CREATE_QP %s status 0x%x", dci ? "DCI" : "RC", (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));
	q->qpn = (uint32_t)st_devx_get(out, ST_PRM_CREATE_QP_OUT_QPN);
}

/* RST2INIT / INIT2RTR / RTR2RTS as ibgda_qp_rst2init, ibgda_rc_init2rtr,
 * ibgda_dci_init2rtr, ibgda_qp_rtr2rts; returns the modify's result and the
 * status byte in *status. */
static int modify(struct qpx *q, uint16_t op, uint32_t rqpn, uint32_t rlid, uint32_t *status)
{
	uint8_t in[ST_PRM_MODIFY_QP_IN_SIZE] = { 0 }, out[IBGDA_PRM_OUT_SIZE] = { 0 };
	st_devx_set(in, ST_PRM_CMD_OPCODE, op);
	st_devx_set(in, ST_PRM_MODIFY_QP_QPN, q->qpn);
	switch (op) {
	case ST_MLX5_CMD_OP_RST2INIT_QP:
		if (q->dci) {
			st_devx_set(in, QPC_DC_ACCESS_KEY, DC_KEY);
		} else {
			st_devx_set(in, ST_PRM_QPC_RWE, 1);
			st_devx_set(in, ST_PRM_QPC_RRE, 1);
			st_devx_set(in, ST_PRM_QPC_RAE, 1);
			st_devx_set(in, ST_PRM_QPC_ATOMIC_MODE, 3); /* IBGDA_MLX5_QPC_ATOMIC_MODE_UP_TO_64BIT */
		}
		st_devx_set(in, ST_PRM_QPC_VHCA_PORT_NUM, 1);
		st_devx_set(in, QPC_PKEY_INDEX, 0);
		st_devx_set(in, ST_PRM_QPC_PM_STATE, 3);
		st_devx_set(in, ST_PRM_QPC_COUNTER_SET_ID, 0);
		break;
	case ST_MLX5_CMD_OP_INIT2RTR_QP:
		st_devx_set(in, ST_PRM_QPC_MTU, 5);        /* port active_mtu 4096 */
		st_devx_set(in, ST_PRM_QPC_LOG_MSG_MAX, 30); /* IBGDA_LOG_MAX_MSG_SIZE */
		st_devx_set(in, QPC_SL, 0);
		if (!q->dci) {
			st_devx_set(in, ST_PRM_QPC_REMOTE_QPN, rqpn);
			st_devx_set(in, ST_PRM_QPC_MIN_RNR_NAK, 12);
			st_devx_set(in, ST_PRM_QPC_LOG_RRA_MAX, 4); /* ilog2(max_qp_rd_atom 16) */
			st_devx_set(in, ST_PRM_QPC_RLID, rlid);
			st_devx_set(in, ST_PRM_QPC_GRH, 0);
		}
		break;
	case ST_MLX5_CMD_OP_RTR2RTS_QP:
		st_devx_set(in, QPC_LOG_ACK_REQ_FREQ, 0);
		st_devx_set(in, QPC_LOG_SRA_MAX, 4);
		st_devx_set(in, ST_PRM_QPC_NEXT_SEND_PSN, 0);
		st_devx_set(in, ST_PRM_QPC_RETRY_COUNT, 7);
		st_devx_set(in, ST_PRM_QPC_RNR_RETRY, 7);
		st_devx_set(in, ST_PRM_QPC_ACK_TIMEOUT, 20);
		break;
	}
	int r = mlx5dv_devx_obj_modify(q->obj, in, op == ST_MLX5_CMD_OP_2RST_QP ? 16 : sizeof in, out, sizeof out);
	if (status)
		*status = (uint32_t)st_devx_get(out, ST_PRM_OUT_STATUS);
	return r;
}

static void connect_qp(struct qpx *q, uint32_t rqpn, uint32_t rlid)
{
	SETUP(!modify(q, ST_MLX5_CMD_OP_RST2INIT_QP, 0, 0, NULL), "RST2INIT qpn 0x%x", q->qpn);
	SETUP(!modify(q, ST_MLX5_CMD_OP_INIT2RTR_QP, rqpn, rlid, NULL), "INIT2RTR qpn 0x%x", q->qpn);
	SETUP(!modify(q, ST_MLX5_CMD_OP_RTR2RTS_QP, 0, 0, NULL), "RTR2RTS qpn 0x%x", q->qpn);
}

static void query_qp(struct qpx *q, uint8_t *out)
{
	uint8_t in[16] = { 0 };
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_QUERY_QP);
	st_devx_set(in, ST_PRM_MODIFY_QP_QPN, q->qpn);
	CHECK(!mlx5dv_devx_obj_query(q->obj, in, sizeof in, out, 272), "QUERY_QP qpn 0x%x", q->qpn);
}

/* ---- the NVSHMEM set-up of one node (ibgda.cpp, §5.1) ------------------------------------- */
static void node_setup(struct node *nd)
{
	memset(nd, 0, sizeof *nd);
	nd->ctx = open_dev();
	struct ibv_device_attr da;
	SETUP(!ibv_query_device(nd->ctx, &da), "query_device");
	uint8_t *cap = malloc(CAP_OUT);
	/* nvshmemt_ib_common_query_mlx5_caps, _check_nic_ext_atomic_support, _query_endianness_conversion_size */
	SETUP(!cap_query(nd->ctx, OPMOD_GEN_CUR, cap), "QUERY_HCA_CAP general");
	SETUP(!cap_query(nd->ctx, OPMOD_ATOMIC_CUR, cap), "QUERY_HCA_CAP atomic");
	uint32_t ops = (uint32_t)CAP(cap, ACAP_OPS), sq = (uint32_t)CAP(cap, ACAP_SIZE_QP), sd = (uint32_t)CAP(cap, ACAP_SIZE_DC);
	SETUP((ops & 0xf) == 0xf && (sq & 0xc) == 0xc && (sd & 0xc) == 0xc, "atomic caps ops 0x%x qp 0x%x dc 0x%x", ops, sq, sd);
	struct ibv_port_attr pa;
	SETUP(!ibv_query_port(nd->ctx, 1, &pa) && pa.state == IBV_PORT_ACTIVE, "query_port");
	nd->lid = pa.lid;
	union ibv_gid gid;
	SETUP(!ibv_query_gid(nd->ctx, 1, 0, &gid), "query_gid");
	nd->pd = ibv_alloc_pd(nd->ctx);
	SETUP(nd->pd && !ibgda_pdn(nd->pd, &nd->pdn), "pd");
	/* QP shared objects (ibgda_create_qp_shared_objects) */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 1024, .max_sge = 1 } };
	nd->srq = ibv_create_srq(nd->pd, &sa);
	SETUP(nd->srq && !ibgda_srqn(nd->srq, &nd->srqn) && nd->srqn, "srq");
	nd->rcq = ibv_create_cq(nd->ctx, 1024, NULL, NULL, 0);
	SETUP(nd->rcq && !ibgda_cqn(nd->rcq, &nd->rcqn), "recv cq");
	mem_alloc(&nd->ibuf, 4096, g_gpu);
	nd->ibuf_mr = reg_mem(nd, &nd->ibuf);
	SETUP(!cap_query(nd->ctx, OPMOD_GEN_CUR, cap), "QUERY_HCA_CAP general");
	SETUP(CAP(cap, HCAP_CQE_VERSION) == 1, "hca_cap.cqe_version != 1");
	nd->log_bf_reg_size = (int)CAP(cap, HCAP_LOG_BF_REG_SIZE);
	int compact_av = (int)CAP(cap, HCAP_COMPACT_AV);
	free(cap);
	/* DCT shared objects (ibgda_create_dct_shared_objects): a parent domain,
	 * an SRQ on it, two CQs, an AH to our own port + init_obj(AH) */
	struct ibv_parent_domain_init_attr pda = { .pd = nd->pd };
	nd->pdom = ibv_alloc_parent_domain(nd->ctx, &pda);
	SETUP(nd->pdom, "ibv_alloc_parent_domain errno %d", errno);
	nd->dsrq = ibv_create_srq(nd->pdom, &sa);
	SETUP(nd->dsrq, "srq on the parent domain");
	nd->dscq = ibv_create_cq(nd->ctx, 1024, NULL, NULL, 0);
	nd->drcq = ibv_create_cq(nd->ctx, 1024, NULL, NULL, 0);
	SETUP(nd->dscq && nd->drcq, "dct cqs");
	struct ibv_ah_attr aa = { .dlid = (uint16_t)nd->lid, .is_global = 0, .sl = 0, .port_num = 1 };
	nd->ah = ibv_create_ah(nd->pd, &aa);
	SETUP(nd->ah, "create_ah");
	struct mlx5dv_obj o = { .ah = { .in = nd->ah, .out = &nd->dah } };
	SETUP(!mlx5dv_init_obj(&o, MLX5DV_OBJ_AH) && nd->dah.av, "init_obj AH");
	SETUP(compact_av == 1, "compact_address_vector");
	if (g_dc) {
		/* ibgda_create_dct (x NVSHMEM_IBGDA_NUM_DCT = 2) */
		for (int i = 0; i < 2; i++) {
			struct ibv_qp_init_attr_ex qa = { .pd = nd->pdom, .comp_mask = IBV_QP_INIT_ATTR_PD,
							  .qp_type = IBV_QPT_DRIVER, .srq = nd->dsrq, .send_cq = nd->dscq,
							  .recv_cq = nd->drcq,
							  .cap = { .max_send_wr = (uint32_t)g_depth, .max_recv_wr = (uint32_t)g_depth,
								   .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 12 } };
			struct mlx5dv_qp_init_attr dv = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC,
							  .dc_init_attr = { .dc_type = MLX5DV_DCTYPE_DCT,
									    .dct_access_key = DC_KEY } };
			nd->dct[i] = mlx5dv_create_qp(nd->ctx, &qa, &dv);
			SETUP(nd->dct[i], "mlx5dv_create_qp(DCT) errno %d", errno);
			struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
						  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
								     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC };
			SETUP(!ibv_modify_qp(nd->dct[i], &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
			      "DCT INIT");
			memset(&at, 0, sizeof at);
			at.qp_state = IBV_QPS_RTR;
			at.path_mtu = IBV_MTU_4096;
			at.min_rnr_timer = 12;
			at.ah_attr = aa;
			SETUP(!ibv_modify_qp(nd->dct[i], &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER),
			      "DCT RTR");
		}
		/* a DCI (NVSHMEM_IBGDA_NUM_DCI = 1) */
		make_qp(nd, &nd->dci, 1, 0);
		connect_qp(&nd->dci, 0, 0);
	}
	/* RC QPs (NVSHMEM_IBGDA_NUM_RC_PER_PE = 2), connected after the exchange */
	for (int i = 0; i < 2; i++)
		make_qp(nd, &nd->rc[i], 0, (uint32_t)(1 + i));
	if (g_cpu_proxy) {
		/* the producer-index mailbox: host memory, mapped for the "GPU" (ibgda_host_mem_alloc) */
		SETUP(!posix_memalign((void **)&nd->mailbox, 4096, 4096), "mailbox");
		memset(nd->mailbox, 0, 4096);
		nd->mailbox_dev = (uint64_t)(uintptr_t)nd->mailbox;
		if (g_gpu) {
			CUdeviceptr d;
			SETUP(cuMemHostRegister_v2(nd->mailbox, 4096, 0x01 | 0x02) == 0 &&
			      cuMemHostGetDevicePointer_v2(&d, nd->mailbox, 0) == 0, "mailbox mapping");
			nd->mailbox_dev = d;
		}
		g_proxy_nodes[g_proxy_nodes[0] ? 1 : 0] = nd;
		SETUP(!pthread_create(&nd->proxy, NULL, proxy_main, nd), "proxy thread");
	}
	/* the symmetric heap */
	mem_alloc(&nd->heap, 1 << 16, g_gpu);
	nd->heap_mr = reg_mem(nd, &nd->heap);
	printf("SETUP lid=%u pdn=%u srqn=%u rc=0x%x,0x%x dci=0x%x dct=0x%x gpu=%d\n", nd->lid, nd->pdn, nd->srqn,
	       nd->rc[0].qpn, nd->rc[1].qpn, nd->dci.qpn, nd->dct[0] ? nd->dct[0]->qp_num : 0, g_gpu);
}

static void node_export(const struct node *nd, struct peer *p)
{
	memset(p, 0, sizeof *p);
	p->lid = nd->lid;
	p->qpn[0] = nd->rc[0].qpn;
	p->qpn[1] = nd->rc[1].qpn;
	p->dctn = nd->dct[0] ? nd->dct[0]->qp_num : 0;
	p->rkey = nd->heap_mr->rkey;
	p->heap = nd->heap.a;
	/* ibgda_get_dct_handle: the AV of our AH, dqp_dct = the DCT (no extended bit), key */
	memcpy(p->av, nd->dah.av, 16);
	uint32_t dqp = htobe32(p->dctn & 0xffffff);
	uint64_t key = htobe64(DC_KEY);
	memcpy(p->av, &key, 8);
	memcpy(p->av + 8, &dqp, 4);
}

/* ---- WQEs as ibgda_device.cuh writes them ------------------------------------------------ */
static void w_ctrl(uint8_t *w, uint32_t opmod, uint32_t idx, uint8_t op, uint32_t qpn, uint32_t ds, uint8_t fm)
{
	st_mlx5_set_ctrl_seg((struct st_mlx5_wqe_ctrl_seg *)w, opmod, (uint16_t)idx, op, qpn, ds, fm, 0);
}
static void w_be32(uint8_t *p, uint32_t v) { v = htobe32(v); memcpy(p, &v, 4); }
static void w_be64(uint8_t *p, uint64_t v) { v = htobe64(v); memcpy(p, &v, 8); }

/* Copy a WQE of ds DS units into the ring at the QP's producer index, WQEBB
 * by WQEBB (the second one wraps to slot 0), and advance the index. */
static uint32_t post(struct qpx *q, const uint8_t *w, uint32_t ds)
{
	uint32_t idx = q->pi, nbb = st_mlx5_wqebbs(ds);
	for (uint32_t b = 0; b < nbb; b++)
		mem_wr(&q->wq, (uint64_t)((idx + b) & (q->nwqebb - 1)) * 64, w + 64 * b, 64);
	q->pi += nbb;
	q->pi64 += nbb;
	return idx;
}

/* ibgda_post_send: DBR+4 = BE32(pi & 0xffff), then the 8-byte doorbell; with
 * --cpu-proxy the "GPU" only publishes the producer index (atomicMax_system
 * on its mailbox slot) and the proxy rings. */
static void ring_db(struct qpx *q)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (g_cpu_proxy) {
		for (int k = 0; k < 2; k++) {
			struct node *nd = g_proxy_nodes[k];
			if (nd && q->slot < nd->nslots && nd->slots[q->slot] == q) {
				if (g_gpu)
					emucu_store64(nd->mailbox_dev + 8 * (uint64_t)q->slot, q->pi64);
				else
					__atomic_store_n(&nd->mailbox[q->slot], q->pi64, __ATOMIC_RELEASE);
			}
		}
		return;
	}
	st32(q->dbr.a + 4, ibgda_dbr_value(q->pi), q->dbr.gpu);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	st64(q->db, ibgda_db_value(q->pi, q->qpn), g_gpu);
}

/* nvshmemt_ibgda_progress: the proxy thread of NVSHMEM's CPU NIC handlers */
static void *proxy_main(void *arg)
{
	struct node *nd = arg;
	for (;;) {
		for (int i = 0; i < nd->nslots; i++) {
			uint64_t pi = __atomic_load_n(&nd->mailbox[i], __ATOMIC_ACQUIRE);
			if (pi <= nd->seen[i])
				continue;
			struct qpx *q = nd->slots[i];
			uint32_t w[2] = { htobe32((uint32_t)(pi << 8)), htobe32(q->qpn << 8) }; /* index from 64 bits */
			uint64_t v;
			memcpy(&v, w, 8);
			__atomic_store_n((uint32_t *)(uintptr_t)(q->dbr.a + 4), htobe32((uint32_t)(pi & 0xffff)), __ATOMIC_RELAXED);
			__atomic_thread_fence(__ATOMIC_RELEASE);
			__atomic_store_n((uint64_t *)(uintptr_t)q->db, v, __ATOMIC_RELAXED);
			nd->seen[i] = pi;
		}
		usleep(20);
	}
	return NULL;
}

/* ibgda_poll_cq on CQE[0] of the collapsed CQ: the CQE of WQE idx; returns its op_own>>4 */
static int quiet(struct qpx *q, uint32_t idx, uint8_t *cqe)
{
	double t0 = ibgda_now_s();
	for (;;) {
		/* the last 8 bytes first, in one load (wqe_counter and op_own), then the rest */
		uint64_t tail = q->cq.ring.gpu ? emucu_load64(q->cq.ring.a + 56)
					       : __atomic_load_n((uint64_t *)(uintptr_t)(q->cq.ring.a + 56), __ATOMIC_ACQUIRE);
		memcpy(cqe + 56, &tail, 8);
		uint16_t wc;
		memcpy(&wc, cqe + 60, 2);
		if (cqe[63] != 0xff && be16toh(wc) == (uint16_t)idx) {
			mem_rd(&q->cq.ring, 0, cqe, 56);
			return cqe[63] >> 4;
		}
		if (ibgda_now_s() - t0 > 10)
			DIE(2, "timeout waiting for the CQE of wqe %u on qpn 0x%x (CQE[0] op_own 0x%02x counter %u)", idx,
			    q->qpn, cqe[63], be16toh(wc));
		usleep(20);
	}
}

static void wait_ok(struct qpx *q, uint32_t idx, const char *what)
{
	uint8_t cqe[64];
	int op = quiet(q, idx, cqe);
	CHECK(op == ST_MLX5_CQE_REQ, "%s: CQE opcode %d syndrome 0x%02x", what, op, cqe[55]);
}

/* RDMA WRITE/READ, one data segment (ibgda_write_rdma_write_wqe / _read_wqe); DCI: half AV first */
static uint32_t post_rw(struct qpx *q, const struct peer *p, uint8_t op, uint64_t roff, uint32_t lkey, uint64_t laddr,
			uint32_t len, uint8_t fm)
{
	uint8_t w[128] = { 0 };
	uint32_t off = 16;
	if (q->dci) {
		memcpy(w + 16, p->av, 16);
		off += 16;
	}
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)(w + off), p->heap + roff, p->rkey);
	st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)(w + off + 16), len, lkey, laddr);
	uint32_t ds = (off + 32) / 16;
	w_ctrl(w, 0, q->pi, op, q->qpn, ds, fm);
	return post(q, w, ds);
}

/* RDMA WRITE inline, up to 12 bytes (ibgda_write_rdma_write_inl_wqe, DS 3) */
static uint32_t post_inl(struct qpx *q, const struct peer *p, uint64_t roff, const void *v, uint32_t len, uint8_t fm)
{
	uint8_t w[64] = { 0 };
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)(w + 16), p->heap + roff, p->rkey);
	w_be32(w + 32, len | ST_MLX5_INLINE_SEG);
	memcpy(w + 36, v, len);
	w_ctrl(w, 0, q->pi, ST_MLX5_OPCODE_RDMA_WRITE, q->qpn, 3, fm);
	return post(q, w, 3);
}

/* NVSHMEM's atomic ops (nvshmemi_amo_t) as ibgda_write_atomic_wqe encodes them */
enum amo { A_INC, A_ADD, A_FETCH_ADD, A_AND, A_OR, A_XOR, A_SET, A_SWAP, A_CSWAP, A_FETCH, A_BYTE_ADD };
static const char *amo_name[] = { "inc", "add", "fetch_add", "and", "or", "xor", "set", "swap", "cswap", "fetch", "byte_add" };

static uint32_t post_amo(struct qpx *q, const struct peer *p, enum amo a, uint32_t size, uint64_t roff, uint64_t val,
			 uint64_t cmp, uint64_t laddr, uint32_t lkey, uint8_t fm)
{
	uint8_t w[128] = { 0 };
	uint32_t ds = 4, opmod = size == 4 ? ST_MLX5_OPMOD_EXT_ATOMIC_4B : ST_MLX5_OPMOD_EXT_ATOMIC_8B;
	uint8_t op = ST_MLX5_OPCODE_ATOMIC_MASKED_FA;
	uint8_t *s1 = w + 32, *s2 = w + 48; /* atomic segments; the data segment follows them */
	uint64_t ones = size == 4 ? 0xffffffffull : ~0ull;
	uint64_t add = 0, bound = 0, swap = 0, cmpv = 0, smask = 0, cmask = 0;
	int cs = 0;
	switch (a) {
	case A_INC: add = 1; break;
	case A_ADD: add = val; break;
	case A_FETCH: add = 0; break;
	case A_XOR: add = val; bound = ones; break;
	case A_BYTE_ADD: add = val; bound = 0x8080808080808080ull & ones; break; /* carries cut after every byte */
	case A_FETCH_ADD: add = val; break;
	case A_SET: case A_SWAP: cs = 1; swap = val; smask = ones; break;
	case A_AND: cs = 1; swap = val; smask = ~val & ones; break;
	case A_OR: cs = 1; swap = val; smask = val; break;
	case A_CSWAP: cs = 1; swap = val; cmpv = cmp; smask = ones; cmask = ones; break;
	}
	if (size == 8 && (a == A_FETCH_ADD || a == A_CSWAP)) {
		/* 8 bytes: the IB atomics (ATOMIC_FA / ATOMIC_CS, opmod 0) */
		op = a == A_FETCH_ADD ? ST_MLX5_OPCODE_ATOMIC_FA : ST_MLX5_OPCODE_ATOMIC_CS;
		opmod = 0;
		w_be64(s1, val);                          /* add, or swap */
		w_be64(s1 + 8, a == A_FETCH_ADD ? 0 : cmp); /* compare */
	} else if (!cs) {
		if (size == 4) {
			w_be32(s1, (uint32_t)add);
			w_be32(s1 + 4, (uint32_t)bound);
		} else {
			w_be64(s1, add);
			w_be64(s1 + 8, bound);
		}
	} else {
		op = ST_MLX5_OPCODE_ATOMIC_MASKED_CS;
		if (size == 4) {
			w_be32(s1, (uint32_t)swap);
			w_be32(s1 + 4, (uint32_t)cmpv);
			w_be32(s1 + 8, (uint32_t)smask);
			w_be32(s1 + 12, (uint32_t)cmask);
		} else {
			w_be64(s1, swap);
			w_be64(s1 + 8, cmpv);
			w_be64(s2, smask);
			w_be64(s2 + 8, cmask);
			ds = 5; /* 2 WQEBBs: the data segment opens the second */
		}
	}
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)(w + 16), p->heap + roff, p->rkey);
	st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)(w + 16 * (ds - 1)), size, lkey, laddr);
	w_ctrl(w, opmod, q->pi, op, q->qpn, ds, fm);
	return post(q, w, ds);
}

static uint64_t amo_expect(enum amo a, uint32_t size, uint64_t old, uint64_t val, uint64_t cmp)
{
	uint64_t m = size == 4 ? 0xffffffffull : ~0ull, r = old;
	switch (a) {
	case A_INC: r = old + 1; break;
	case A_ADD: case A_FETCH_ADD: r = old + val; break;
	case A_AND: r = old & val; break;
	case A_OR: r = old | val; break;
	case A_XOR: r = old ^ val; break;
	case A_SET: case A_SWAP: r = val; break;
	case A_CSWAP: r = (old & m) == (cmp & m) ? val : old; break;
	case A_FETCH: r = old; break;
	case A_BYTE_ADD:
		r = 0;
		for (int i = 0; i < 8; i++)
			r |= (uint64_t)(uint8_t)((old >> (8 * i)) + (val >> (8 * i))) << (8 * i);
		break;
	}
	return r & m;
}

/* ---- the operations ------------------------------------------------------------------------ */
static void ops(struct node *a, const struct peer *b)
{
	struct qpx *q = &a->rc[0];
	uint32_t hk = a->heap_mr->lkey, ik = a->ibuf_mr->lkey;
	uint8_t buf[256], back[256];
	if (g_wrap) {
		/* 65600+ WQEBBs of NOPs, 64 per doorbell (half the ring), the last of each batch signalled */
		while (q->pi64 < 65600) {
			uint32_t last = 0;
			for (int i = 0; i < 64; i++) {
				uint8_t w[64] = { 0 };
				w_ctrl(w, 0, q->pi, ST_MLX5_OPCODE_NOP, q->qpn, 2, i == 63 ? ST_MLX5_WQE_CTRL_CQ_UPDATE : 0);
				last = post(q, w, 2);
			}
			ring_db(q);
			wait_ok(q, last, "NOP batch");
		}
		printf("WRAP pi=%llu (16-bit index %u)\n", (unsigned long long)q->pi64, q->pi & 0xffff);
		OK("wrap");
	}
	/* put / get */
	for (int i = 0; i < 256; i++)
		buf[i] = (uint8_t)(i * 7 + 3);
	mem_wr(&a->heap, 0, buf, 256);
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 0, hk, a->heap.a, 256, 0);
	uint32_t last = post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 0, hk, a->heap.a + 4096, 256, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	wait_ok(q, last, "put+get");
	mem_rd(&a->heap, 4096, back, 256);
	CHECK(!memcmp(buf, back, 256), "get: the bytes read back differ from those put");
	OK("put_get");
	/* inline put of 12 bytes (DS 3) */
	const uint8_t inl[12] = { 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8 };
	post_inl(q, b, 512, inl, 12, 0);
	last = post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 512, hk, a->heap.a + 8192, 12, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	wait_ok(q, last, "inline put");
	mem_rd(&a->heap, 8192, back, 12);
	CHECK(!memcmp(inl, back, 12), "inline put: remote bytes differ");
	OK("put_inline");
	/* atomics, 4 and 8 bytes: initial value by inline put, the atomic, the value read back */
	static const struct { enum amo a; uint64_t old, val, cmp; } cases[] = {
		{ A_INC, 41, 0, 0 },
		{ A_ADD, 1000, 0xfffffff0, 0 },          /* 4 B: wraps */
		{ A_FETCH_ADD, 7, 5, 0 },
		{ A_AND, 0xf0f0f0f0f0f0f0f0ull, 0x0ff00ff00ff00ff0ull, 0 },
		{ A_OR, 0x1111000011110000ull, 0x0000222200002222ull, 0 },
		{ A_XOR, 0xaaaaaaaaaaaaaaaaull, 0xffff0000ffff0000ull, 0 },
		{ A_SET, 0x1234, 0xcafebabe8badf00dull, 0 },
		{ A_SWAP, 99, 0x77, 0 },
		{ A_CSWAP, 0x55, 0x66, 0x55 },            /* matches: swapped */
		{ A_CSWAP, 0x55, 0x66, 0x54 },            /* does not: kept */
		{ A_FETCH, 0x0123456789abcdefull, 0, 0 },
		{ A_BYTE_ADD, 0x01ff7f80fe0203ffull, 0x0101010101010101ull, 0 },
	};
	int n = 0;
	for (uint32_t size = 4; size <= 8; size += 4)
		for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
			if (cases[c].a == A_BYTE_ADD && size == 4)
				continue;
			uint64_t m = size == 4 ? 0xffffffffull : ~0ull;
			uint64_t old = cases[c].old & m, zero = 0;
			uint64_t roff = 16384 + 64 * (uint64_t)n;
			mem_wr(&a->ibuf, 0, &zero, 8);
			post_inl(q, b, roff, &old, size, 0);
			post_amo(q, b, cases[c].a, size, roff, cases[c].val & m, cases[c].cmp & m, a->ibuf.a, ik, 0);
			last = post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, roff, hk, a->heap.a + 12288, size, ST_MLX5_WQE_CTRL_CQ_UPDATE);
			ring_db(q);
			wait_ok(q, last, amo_name[cases[c].a]);
			uint64_t fetched = 0, now = 0;
			mem_rd(&a->ibuf, 0, &fetched, size);
			mem_rd(&a->heap, 12288, &now, size);
			if (size == 4)
				fetched = be32toh((uint32_t)fetched); /* nvshmemi_ibgda_amo_fetch_impl: BSWAP32 for 4-byte results */
			uint64_t want = amo_expect(cases[c].a, size, old, cases[c].val, cases[c].cmp);
			CHECK(now == want, "%u-byte %s: memory 0x%llx, expected 0x%llx (old 0x%llx val 0x%llx)", size,
			      amo_name[cases[c].a], (unsigned long long)now, (unsigned long long)want, (unsigned long long)old,
			      (unsigned long long)(cases[c].val & m));
			CHECK(fetched == old, "%u-byte %s: fetched 0x%llx, expected the old value 0x%llx", size,
			      amo_name[cases[c].a], (unsigned long long)fetched, (unsigned long long)old);
			printf("AMO size=%u op=%s old=0x%llx new=0x%llx\n", size, amo_name[cases[c].a], (unsigned long long)old,
			       (unsigned long long)now);
			n++;
		}
	OK("atomics");
	/* NOP (DS 2 as ibgda_write_nop_wqe, DS 1 as the DCI path) and DUMP with NIC fence */
	uint8_t w[64] = { 0 }, cqe[64];
	w_ctrl(w, 0, q->pi, ST_MLX5_OPCODE_NOP, q->qpn, 2, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	last = post(q, w, 2);
	ring_db(q);
	CHECK(quiet(q, last, cqe) == ST_MLX5_CQE_REQ && cqe[56] == ST_MLX5_OPCODE_NOP, "NOP ds 2: CQE op 0x%02x", cqe[56]);
	memset(w, 0, 64);
	w_ctrl(w, 0, q->pi, ST_MLX5_OPCODE_NOP, q->qpn, 1, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	last = post(q, w, 1);
	ring_db(q);
	CHECK(quiet(q, last, cqe) == ST_MLX5_CQE_REQ, "NOP ds 1");
	OK("nop");
	memset(w, 0, 64);
	st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)(w + 16), 1, ik, a->ibuf.a);
	w_ctrl(w, 0, q->pi, ST_MLX5_OPCODE_DUMP, q->qpn, 2, FM_FENCE | ST_MLX5_WQE_CTRL_CQ_UPDATE);
	last = post(q, w, 2);
	ring_db(q);
	CHECK(quiet(q, last, cqe) == ST_MLX5_CQE_REQ && cqe[56] == ST_MLX5_OPCODE_DUMP, "DUMP: CQE op 0x%02x", cqe[56]);
	OK("dump");
	/* NIC fence: READ X into L, then a fenced WRITE of L to Y: Y must hold X's bytes */
	for (int i = 0; i < 64; i++)
		buf[i] = (uint8_t)(0xa0 + i);
	mem_wr(&a->heap, 20480, buf, 64);
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 24576, hk, a->heap.a + 20480, 64, 0); /* X = P */
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 24576, hk, a->heap.a + 28672, 64, 0);  /* L = X */
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 32768, hk, a->heap.a + 28672, 64, FM_FENCE); /* Y = L, fenced */
	last = post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 32768, hk, a->heap.a + 36864, 64, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	wait_ok(q, last, "fenced write");
	mem_rd(&a->heap, 36864, back, 64);
	CHECK(!memcmp(buf, back, 64), "fence: the fenced WRITE did not carry the bytes its earlier READ fetched");
	OK("fence");
	/* the same without the fence: what the WRITE carries is not ordered after the READ */
	for (int i = 0; i < 64; i++)
		buf[i] = (uint8_t)(0x50 + i);
	mem_wr(&a->heap, 20480, buf, 64);
	memset(back, 0, 64);
	mem_wr(&a->heap, 40960, back, 64);
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 24576, hk, a->heap.a + 20480, 64, 0);
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 24576, hk, a->heap.a + 40960, 64, 0);
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 45056, hk, a->heap.a + 40960, 64, 0);
	last = post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 45056, hk, a->heap.a + 49152, 64, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	wait_ok(q, last, "unfenced write");
	mem_rd(&a->heap, 49152, back, 64);
	printf("UNFENCED write carried the read's bytes: %s\n", memcmp(buf, back, 64) ? "no" : "yes");
}

/* An opcode the HCA does not know, and a masked atomic without its opmod,
 * on the second RC QP: a local QP operation error CQE each, the QP in error;
 * 2RST and reconnecting makes it usable again.  Round r posts r NOPs first,
 * so that no doorbell after a reset repeats the value rung before it (a
 * doorbell poller, the tracer's included, cannot see a store of the value a
 * register already holds). */
static void nops(struct qpx *q, int n)
{
	for (int i = 0; i < n; i++) {
		uint8_t w[64] = { 0 };
		w_ctrl(w, 0, q->pi, ST_MLX5_OPCODE_NOP, q->qpn, 2, 0);
		post(q, w, 2);
	}
}

static void errors(struct node *a, const struct peer *b)
{
	struct qpx *q = &a->rc[1];
	uint8_t w[64] = { 0 }, cqe[64], out[272];
	for (int round = 0; round < 2; round++) {
		memset(w, 0, 64);
		uint8_t opc = round ? ST_MLX5_OPCODE_ATOMIC_MASKED_FA : 0x03;
		if (round) { /* masked FA with opmod 0 instead of 0x08 / 0x09 */
			st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)(w + 16), b->heap + 16384, b->rkey);
			w_be64(w + 32, 1);
			st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)(w + 48), 8, a->ibuf_mr->lkey, a->ibuf.a);
		}
		nops(q, round);
		w_ctrl(w, 0, q->pi, opc, q->qpn, round ? 4 : 2, ST_MLX5_WQE_CTRL_CQ_UPDATE);
		uint32_t idx = post(q, w, round ? 4 : 2);
		ring_db(q);
		int op = quiet(q, idx, cqe);
		uint32_t sqpn;
		memcpy(&sqpn, cqe + 56, 4);
		sqpn = be32toh(sqpn);
		CHECK(op == ST_MLX5_CQE_REQ_ERR && cqe[55] == ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR && (sqpn >> 24) == opc &&
			      (sqpn & 0xffffff) == q->qpn,
		      "opcode 0x%02x: CQE %d syndrome 0x%02x opcode/qpn 0x%08x", opc, op, cqe[55], sqpn);
		query_qp(q, out);
		CHECK(st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_ERR, "QP state after the error: %u",
		      (unsigned)st_devx_get(out, QPC_STATE));
		printf("BADWQE opcode=0x%02x syndrome=0x%02x\n", opc, cqe[55]);
		/* back to work: 2RST, a fresh CQ ring, the counters from 0, reconnect */
		CHECK(!modify(q, ST_MLX5_CMD_OP_2RST_QP, 0, 0, NULL), "2RST");
		mem_fill(&q->cq.ring, 0xff);
		q->pi = 0;
		q->pi64 = 0;
		if (g_cpu_proxy) /* the proxy's view of the slot starts over too */
			for (int k = 0; k < 2; k++)
				if (g_proxy_nodes[k] && g_proxy_nodes[k]->slots[q->slot] == q) {
					__atomic_store_n(&g_proxy_nodes[k]->mailbox[q->slot], 0, __ATOMIC_RELEASE);
					usleep(1000);
					g_proxy_nodes[k]->seen[q->slot] = 0;
				}
		connect_qp(q, b->qpn[1], b->lid);
	}
	nops(q, 2);
	uint32_t idx = post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 53248, a->heap_mr->lkey, a->heap.a, 64, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	wait_ok(q, idx, "write after reset");
	OK("bad_opcode");
}

/* DC: a DCI reaches the peer's DCT by the half AV of its handle; a wrong key is refused */
static void dc_ops(struct node *a, const struct peer *b)
{
	struct qpx *q = &a->dci;
	uint32_t hk = a->heap_mr->lkey;
	uint8_t buf[128], back[128], cqe[64];
	for (int i = 0; i < 128; i++)
		buf[i] = (uint8_t)(0x33 ^ i);
	mem_wr(&a->heap, 0, buf, 128);
	post_rw(q, b, ST_MLX5_OPCODE_RDMA_WRITE, 57344, hk, a->heap.a, 128, 0);
	uint32_t last = post_rw(q, b, ST_MLX5_OPCODE_RDMA_READ, 57344, hk, a->heap.a + 61440, 128, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	wait_ok(q, last, "DC write+read");
	mem_rd(&a->heap, 61440, back, 128);
	CHECK(!memcmp(buf, back, 128), "DC: bytes read back differ");
	OK("dc_put_get");
	struct peer bad = *b;
	uint64_t key = htobe64(DC_KEY ^ 1);
	memcpy(bad.av, &key, 8);
	last = post_rw(q, &bad, ST_MLX5_OPCODE_RDMA_WRITE, 57344, hk, a->heap.a, 8, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring_db(q);
	int op = quiet(q, last, cqe);
	CHECK(op == ST_MLX5_CQE_REQ_ERR && cqe[55] == ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, "DC wrong key: CQE %d syndrome 0x%02x",
	      op, cqe[55]);
	OK("dc_key");
}

/* ---- --caps ----------------------------------------------------------------------------------- */
static int run_caps(void)
{
	struct ibv_context *c = open_dev();
	uint8_t *o = malloc(CAP_OUT);
	CHECK(!cap_query(c, OPMOD_GEN_CUR, o) && st_devx_get(o, ST_PRM_OUT_STATUS) == 0, "general caps");
	CHECK(CAP(o, HCAP_CQE_VERSION) == 1, "cqe_version %u", (unsigned)CAP(o, HCAP_CQE_VERSION));
	CHECK(CAP(o, HCAP_LOG_BF_REG_SIZE) == 9, "log_bf_reg_size %u", (unsigned)CAP(o, HCAP_LOG_BF_REG_SIZE));
	CHECK(CAP(o, HCAP_COMPACT_AV) == 1, "compact_address_vector");
	CHECK(CAP(o, HCAP_PORT_TYPE) == 0, "port_type IB");
	CHECK(CAP(o, HCAP_DCT) == (uint64_t)g_dc, "dct %u, expected %d", (unsigned)CAP(o, HCAP_DCT), g_dc);
	CHECK(CAP(o, HCAP_LOG_MAX_QP) >= 10, "log_max_qp");
	printf("CAPS general cqe_version=%u log_bf_reg_size=%u compact_av=%u dct=%u log_max_qp=%u\n",
	       (unsigned)CAP(o, HCAP_CQE_VERSION), (unsigned)CAP(o, HCAP_LOG_BF_REG_SIZE), (unsigned)CAP(o, HCAP_COMPACT_AV),
	       (unsigned)CAP(o, HCAP_DCT), (unsigned)CAP(o, HCAP_LOG_MAX_QP));
	CHECK(!cap_query(c, OPMOD_GEN_CUR & ~1, o), "general caps (maximum)");
	CHECK(CAP(o, HCAP_CQE_VERSION) == 1, "maximum cqe_version");
	CHECK(!cap_query(c, OPMOD_ATOMIC_CUR, o), "atomic caps");
	CHECK(CAP(o, ACAP_OPS) == 0xf && CAP(o, ACAP_SIZE_QP) == 0xc && CAP(o, ACAP_SIZE_DC) == 0xc,
	      "atomic ops 0x%x size_qp 0x%x size_dc 0x%x", (unsigned)CAP(o, ACAP_OPS), (unsigned)CAP(o, ACAP_SIZE_QP),
	      (unsigned)CAP(o, ACAP_SIZE_DC));
	CHECK(CAP(o, ACAP_ENDIAN_MODE1) == 1 && CAP(o, ACAP_ENDIAN_MODE) == 1, "8-byte endianness mode 1");
	printf("CAPS atomic ops=0x%x size_qp=0x%x size_dc=0x%x endianness_mode=%u\n", (unsigned)CAP(o, ACAP_OPS),
	       (unsigned)CAP(o, ACAP_SIZE_QP), (unsigned)CAP(o, ACAP_SIZE_DC), (unsigned)CAP(o, ACAP_ENDIAN_MODE));
	CHECK(!cap_query(c, (4 << 1) | 1, o), "roce caps");
	/* an unknown capability page, an unknown command, a short output buffer */
	CHECK(cap_query(c, (0x1a << 1) | 1, o) && st_devx_get(o, ST_PRM_OUT_STATUS) == 0x3, "crypto caps: BAD_PARAM");
	uint8_t in[16] = { 0 }, out[16];
	st_devx_set(in, ST_PRM_CMD_OPCODE, 0x754 /* QUERY_NIC_VPORT_CONTEXT */);
	CHECK(mlx5dv_devx_general_cmd(c, in, 16, out, 16) == EOPNOTSUPP && st_devx_get(out, ST_PRM_OUT_STATUS) == 0x2,
	      "unknown command: BAD_OP");
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_QUERY_HCA_CAP);
	CHECK(mlx5dv_devx_general_cmd(c, in, 16, out, 16) && st_devx_get(out, ST_PRM_OUT_STATUS) == 0x51,
	      "short output: BAD_OUTPUT_LEN");
	OK("caps");
	free(o);
	printf("RESULT OK caps\n");
	return 0;
}

/* ---- --objects ---------------------------------------------------------------------------------- */
static int n_alloc[8], n_free[8];
static void *pd_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
	int t = (int)(type & 7);
	n_alloc[t]++;
	if (t == 5 && *(int *)ctx)
		return IBV_ALLOCATOR_USE_DEFAULT; /* CQ rings from the library's own memory, once asked */
	void *p = NULL;
	return posix_memalign(&p, align < 8 ? 8 : align, size) ? NULL : p;
}
static void pd_free(struct ibv_pd *pd, void *ctx, void *ptr, uint64_t type)
{
	n_free[type & 7]++;
	free(ptr);
}

static int run_objects(void)
{
	struct node nd;
	memset(&nd, 0, sizeof nd);
	nd.ctx = open_dev();
	nd.pd = ibv_alloc_pd(nd.ctx);
	CHECK(nd.pd && !ibgda_pdn(nd.pd, &nd.pdn), "pd");
	/* parent domain with allocators: SRQ, QP and CQ rings and their doorbell records come from them */
	int use_default = 0;
	struct ibv_parent_domain_init_attr pa = { .pd = nd.pd, .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
									    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
						  .alloc = pd_alloc, .free = pd_free, .pd_context = &use_default };
	struct ibv_pd *pdom = ibv_alloc_parent_domain(nd.ctx, &pa);
	CHECK(pdom, "parent domain errno %d", errno);
	uint32_t pdn2;
	CHECK(!ibgda_pdn(pdom, &pdn2) && pdn2 == nd.pdn, "init_obj(PD) of the parent domain: %u, its PD %u", pdn2, nd.pdn);
	struct ibv_parent_domain_init_attr pa2 = { .pd = pdom };
	CHECK(!ibv_alloc_parent_domain(nd.ctx, &pa2) && errno == EINVAL, "a parent domain of a parent domain: EINVAL");
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 64, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pdom, &sa);
	CHECK(srq && n_alloc[4] == 1 && n_alloc[3] == 1, "SRQ on the parent domain: allocs srq %d dbr %d", n_alloc[4], n_alloc[3]);
	struct mlx5dv_srq ds = { .comp_mask = MLX5DV_SRQ_MASK_SRQN };
	struct mlx5dv_obj o = { .srq = { .in = srq, .out = &ds } };
	CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_SRQ) && ds.srqn && ds.stride == 32, "init_obj SRQ srqn %u stride %u", ds.srqn,
	      ds.stride);
	struct ibv_cq *cq = ibv_create_cq(nd.ctx, 64, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_send_sge = 1, .max_inline_data = 16 } };
	struct ibv_qp *qp = ibv_create_qp(pdom, &qa);
	CHECK(qp && n_alloc[1] == 1 && n_alloc[3] == 2, "QP on the parent domain: allocs qp %d dbr %d", n_alloc[1], n_alloc[3]);
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = pdom };
	struct ibv_cq_ex *cqx = mlx5dv_create_cq(nd.ctx, &ca, NULL);
	CHECK(cqx && n_alloc[5] == 1 && n_alloc[3] == 3, "mlx5dv_create_cq on the parent domain: allocs cq %d dbr %d",
	      n_alloc[5], n_alloc[3]);
	use_default = 1; /* the allocator answers IBV_ALLOCATOR_USE_DEFAULT for the next CQ ring */
	struct ibv_cq_ex *cqx2 = mlx5dv_create_cq(nd.ctx, &ca, NULL);
	CHECK(cqx2 && n_alloc[5] == 2, "CQ with IBV_ALLOCATOR_USE_DEFAULT");
	struct ibv_cq_init_attr_ex cb = { .cqe = 8, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = nd.pd };
	CHECK(!mlx5dv_create_cq(nd.ctx, &cb, NULL) && errno == EINVAL, "CQ PD attribute that is no parent domain: EINVAL");
	CHECK(ibv_dealloc_pd(nd.pd) == EBUSY, "dealloc a PD its parent domain uses: EBUSY");
	CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_srq(srq) && !ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) &&
	      !ibv_destroy_cq(ibv_cq_ex_to_cq(cqx2)), "destroy");
	CHECK(n_free[1] == 1 && n_free[4] == 1 && n_free[5] == 1 && n_free[3] == 4, "frees qp %d srq %d cq %d dbr %d", n_free[1],
	      n_free[4], n_free[5], n_free[3]);
	CHECK(!ibv_dealloc_pd(pdom) && !ibv_dealloc_pd(nd.pd), "dealloc parent domain, then PD");
	OK("parent_domain");
	/* AH: the mlx5 AV through init_obj(AH) */
	nd.pd = ibv_alloc_pd(nd.ctx);
	CHECK(nd.pd && !ibgda_pdn(nd.pd, &nd.pdn), "pd again");
	struct ibv_ah_attr aa = { .dlid = 0x1234, .sl = 3, .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(nd.pd, &aa);
	struct mlx5dv_ah dah;
	struct mlx5dv_obj oa = { .ah = { .in = ah, .out = &dah } };
	CHECK(ah && !mlx5dv_init_obj(&oa, MLX5DV_OBJ_AH) && be16toh(dah.av->rlid) == 0x1234 && (dah.av->stat_rate_sl & 0xf) == 3,
	      "init_obj AH rlid/sl");
	OK("ah");
	/* DevX: ALLOC_PD, CREATE_QP and the modify chain, each step read back with QUERY_QP */
	uint8_t in[16] = { 0 }, out[272];
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_ALLOC_PD);
	CHECK(!mlx5dv_devx_general_cmd(nd.ctx, in, 16, out, 16) && st_devx_get(out, 0x48, 24), "DevX ALLOC_PD");
	sa.attr.max_wr = 64;
	nd.srq = ibv_create_srq(nd.pd, &sa);
	nd.rcq = ibv_create_cq(nd.ctx, 64, NULL, NULL, 0);
	CHECK(nd.srq && nd.rcq && !ibgda_srqn(nd.srq, &nd.srqn) && !ibgda_cqn(nd.rcq, &nd.rcqn), "srq, recv cq");
	uint8_t *cap = malloc(CAP_OUT);
	CHECK(!cap_query(nd.ctx, OPMOD_GEN_CUR, cap), "caps");
	nd.log_bf_reg_size = (int)CAP(cap, HCAP_LOG_BF_REG_SIZE);
	free(cap);
	struct qpx *q = &nd.rc[0];
	make_qp(&nd, q, 0, 7);
	query_qp(q, out);
	CHECK(st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_RST && st_devx_get(out, ST_PRM_QPC_ST) == 0 &&
	      st_devx_get(out, ST_PRM_QPC_PD) == nd.pdn && st_devx_get(out, ST_PRM_QPC_UAR_PAGE) == q->uar->page_id &&
	      st_devx_get(out, ST_PRM_QPC_USER_INDEX) == 7 && st_devx_get(out, ST_PRM_QPC_LOG_SQ_SIZE) == ibgda_ilog2(q->nwqebb) &&
	      st_devx_get(out, ST_PRM_QPC_CQN_SND) == q->cq.cqn && st_devx_get(out, ST_PRM_QPC_CQN_RCV) == nd.rcqn &&
	      st_devx_get(out, ST_PRM_QPC_RQ_TYPE) == 1 && st_devx_get(out, ST_PRM_QPC_SRQN) == nd.srqn &&
	      st_devx_get(out, ST_PRM_QPC_PM_STATE) == 3,
	      "QUERY_QP after CREATE_QP");
	uint32_t st;
	CHECK(modify(q, ST_MLX5_CMD_OP_INIT2RTR_QP, 0x123, 5, &st) && st == 0x9, "INIT2RTR from RESET: BAD_RES_STATE, got 0x%x", st);
	CHECK(!modify(q, ST_MLX5_CMD_OP_RST2INIT_QP, 0, 0, NULL), "RST2INIT");
	query_qp(q, out);
	CHECK(st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_INIT && st_devx_get(out, ST_PRM_QPC_ATOMIC_MODE) == 3 &&
	      st_devx_get(out, ST_PRM_QPC_RWE) && st_devx_get(out, ST_PRM_QPC_RRE) && st_devx_get(out, ST_PRM_QPC_RAE) &&
	      st_devx_get(out, ST_PRM_QPC_VHCA_PORT_NUM) == 1 && st_devx_get(out, ST_PRM_QPC_COUNTER_SET_ID) == 0,
	      "QUERY_QP after RST2INIT");
	CHECK(!modify(q, ST_MLX5_CMD_OP_INIT2RTR_QP, 0x456, nd.lid, NULL), "INIT2RTR");
	query_qp(q, out);
	CHECK(st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_RTR && st_devx_get(out, ST_PRM_QPC_REMOTE_QPN) == 0x456 &&
	      st_devx_get(out, ST_PRM_QPC_RLID) == nd.lid && st_devx_get(out, ST_PRM_QPC_MTU) == 5 &&
	      st_devx_get(out, ST_PRM_QPC_LOG_MSG_MAX) == 30 && st_devx_get(out, ST_PRM_QPC_MIN_RNR_NAK) == 12 &&
	      st_devx_get(out, ST_PRM_QPC_LOG_RRA_MAX) == 4 && st_devx_get(out, ST_PRM_QPC_GRH) == 0,
	      "QUERY_QP after INIT2RTR");
	CHECK(!modify(q, ST_MLX5_CMD_OP_RTR2RTS_QP, 0, 0, NULL), "RTR2RTS");
	query_qp(q, out);
	CHECK(st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_RTS && st_devx_get(out, ST_PRM_QPC_RETRY_COUNT) == 7 &&
	      st_devx_get(out, ST_PRM_QPC_RNR_RETRY) == 7 && st_devx_get(out, ST_PRM_QPC_ACK_TIMEOUT) == 20 &&
	      st_devx_get(out, QPC_LOG_SRA_MAX) == 4 && st_devx_get(out, ST_PRM_QPC_NEXT_SEND_PSN) == 0,
	      "QUERY_QP after RTR2RTS");
	CHECK(!modify(q, ST_MLX5_CMD_OP_2ERR_QP, 0, 0, NULL), "2ERR");
	query_qp(q, out);
	CHECK(st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_ERR, "QUERY_QP after 2ERR");
	OK("devx_qp");
	/* what a real HCA refuses: an unknown PD, an unallocated UAR, 128-byte CQEs */
	uint8_t cin[ST_PRM_CREATE_QP_IN_SIZE] = { 0 }, cout[16];
	st_devx_set(cin, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_CREATE_QP);
	st_devx_set(cin, ST_PRM_CREATE_QP_WQ_UMEM_ID, q->wq_umem->umem_id);
	st_devx_set(cin, ST_PRM_CREATE_QP_WQ_UMEM_VALID, 1);
	st_devx_set(cin, ST_PRM_QPC_LOG_SQ_SIZE, 4);
	st_devx_set(cin, ST_PRM_QPC_DBR_UMEM_VALID, 1);
	st_devx_set(cin, ST_PRM_QPC_DBR_UMEM_ID, q->dbr_umem->umem_id);
	st_devx_set(cin, ST_PRM_QPC_CQN_SND, q->cq.cqn);
	st_devx_set(cin, ST_PRM_QPC_UAR_PAGE, q->uar->page_id);
	st_devx_set(cin, ST_PRM_QPC_PD, 4000);
	CHECK(!mlx5dv_devx_obj_create(nd.ctx, cin, sizeof cin, cout, 16) && st_devx_get(cout, ST_PRM_OUT_STATUS) == 0x5,
	      "CREATE_QP unknown pd: BAD_RES");
	st_devx_set(cin, ST_PRM_QPC_PD, nd.pdn);
	st_devx_set(cin, ST_PRM_QPC_UAR_PAGE, 0xabcd);
	CHECK(!mlx5dv_devx_obj_create(nd.ctx, cin, sizeof cin, cout, 16) && st_devx_get(cout, ST_PRM_OUT_STATUS) == 0x5,
	      "CREATE_QP unknown uar_page: BAD_RES");
	st_devx_set(cin, ST_PRM_QPC_UAR_PAGE, q->uar->page_id);
	st_devx_set(cin, ST_PRM_QPC_ST, ST_MLX5_QPC_ST_DCI);
	struct mlx5dv_devx_obj *dci = mlx5dv_devx_obj_create(nd.ctx, cin, sizeof cin, cout, 16);
	CHECK(g_dc ? dci != NULL : (!dci && st_devx_get(cout, ST_PRM_OUT_STATUS) == 0x3), "CREATE_QP DCI (dc %d)", g_dc);
	if (dci)
		mlx5dv_devx_obj_destroy(dci);
	uint8_t qin[0x60] = { 0 };
	st_devx_set(qin, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_CREATE_CQ);
	st_devx_set(qin, ST_PRM_CQC_CQE_SZ, 1);
	CHECK(!mlx5dv_devx_obj_create(nd.ctx, qin, sizeof qin, cout, 16) && st_devx_get(cout, ST_PRM_OUT_STATUS) == 0x3,
	      "CREATE_CQ 128-byte CQEs: BAD_PARAM");
	OK("devx_refusals");
	/* DC: a DevX DCI, a DevX DCT, a verbs DCT; or their refusal where the HCA has no DC */
	struct ibv_qp_init_attr_ex dqa = { .pd = nd.pd, .comp_mask = IBV_QP_INIT_ATTR_PD, .qp_type = IBV_QPT_DRIVER,
					   .srq = nd.srq, .send_cq = nd.rcq, .recv_cq = nd.rcq };
	struct mlx5dv_qp_init_attr dv = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC,
					  .dc_init_attr = { .dc_type = MLX5DV_DCTYPE_DCT, .dct_access_key = DC_KEY } };
	struct ibv_qp *vdct = mlx5dv_create_qp(nd.ctx, &dqa, &dv);
	uint8_t din[128] = { 0 }, dout[128];
	st_devx_set(din, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_CREATE_DCT);
	st_devx_set(din, DCT_PD, nd.pdn);
	st_devx_set(din, DCT_SRQN, nd.srqn);
	st_devx_set(din, DCT_CQN, nd.rcqn);
	st_devx_set(din, DCT_RWE, 1);
	st_devx_set(din, DCT_RRE, 1);
	st_devx_set(din, DCT_RAE, 1);
	st_devx_set(din, DCT_ATOMIC_MODE, 3);
	st_devx_set(din, DCT_KEY, DC_KEY);
	st_devx_set(din, DCT_MTU, 5);
	st_devx_set(din, DCT_PORT, 1);
	struct mlx5dv_devx_obj *dct = mlx5dv_devx_obj_create(nd.ctx, din, sizeof din, dout, sizeof dout);
	if (!g_dc) {
		CHECK(!vdct && errno == EOPNOTSUPP, "mlx5dv_create_qp(DCT) without DC: EOPNOTSUPP");
		CHECK(!dct && st_devx_get(dout, ST_PRM_OUT_STATUS) == 0x2, "CREATE_DCT without DC: BAD_OP");
		OK("dc_refused");
	} else {
		CHECK(vdct && vdct->qp_num, "mlx5dv_create_qp(DCT) errno %d", errno);
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_RTR };
		CHECK(ibv_modify_qp(vdct, &at, IBV_QP_STATE) == EINVAL, "DCT RESET->RTR: EINVAL");
		at.qp_state = IBV_QPS_INIT;
		at.port_num = 1;
		at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		CHECK(!ibv_modify_qp(vdct, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "DCT INIT");
		memset(&at, 0, sizeof at);
		at.qp_state = IBV_QPS_RTR;
		at.path_mtu = IBV_MTU_4096;
		at.min_rnr_timer = 12;
		at.ah_attr.dlid = (uint16_t)nd.lid;
		at.ah_attr.port_num = 1;
		CHECK(ibv_modify_qp(vdct, &at, IBV_QP_STATE | IBV_QP_AV) == EINVAL, "DCT RTR without PATH_MTU: EINVAL");
		CHECK(!ibv_modify_qp(vdct, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER), "DCT RTR");
		CHECK(!ibv_destroy_qp(vdct), "destroy DCT");
		CHECK(dct, "CREATE_DCT status 0x%x", (unsigned)st_devx_get(dout, ST_PRM_OUT_STATUS));
		uint32_t dctn = (uint32_t)st_devx_get(dout, 0x48, 24);
		uint8_t qi[16] = { 0 }, qo[128];
		st_devx_set(qi, ST_PRM_CMD_OPCODE, 0x713 /* QUERY_DCT */);
		st_devx_set(qi, 0x48, 24, dctn);
		CHECK(!mlx5dv_devx_obj_query(dct, qi, 16, qo, sizeof qo) && st_devx_get(qo, DCT_STATE) == 0 &&
		      st_devx_get(qo, DCT_KEY) == DC_KEY && st_devx_get(qo, DCT_SRQN) == nd.srqn && st_devx_get(qo, DCT_CQN) == nd.rcqn &&
		      st_devx_get(qo, DCT_PD) == nd.pdn && st_devx_get(qo, DCT_RWE) && st_devx_get(qo, DCT_RAE) &&
		      st_devx_get(qo, DCT_MTU) == 5,
		      "QUERY_DCT");
		st_devx_set(qi, ST_PRM_CMD_OPCODE, 0x712 /* DRAIN_DCT */);
		CHECK(!mlx5dv_devx_obj_modify(dct, qi, 16, qo, 16), "DRAIN_DCT");
		st_devx_set(qi, ST_PRM_CMD_OPCODE, 0x713);
		CHECK(!mlx5dv_devx_obj_query(dct, qi, 16, qo, sizeof qo) && st_devx_get(qo, DCT_STATE) == 2, "QUERY_DCT drained");
		CHECK(!mlx5dv_devx_obj_destroy(dct), "destroy DevX DCT");
		struct qpx d = { 0 };
		make_qp(&nd, &d, 1, 9);
		connect_qp(&d, 0, 0);
		query_qp(&d, out);
		CHECK(st_devx_get(out, ST_PRM_QPC_ST) == ST_MLX5_QPC_ST_DCI && st_devx_get(out, QPC_STATE) == ST_MLX5_QPC_STATE_RTS &&
		      st_devx_get(out, QPC_DC_ACCESS_KEY) == DC_KEY && st_devx_get(out, ST_PRM_QPC_USER_INDEX) == 9,
		      "QUERY_QP of the DCI");
		OK("dc_objects");
	}
	printf("RESULT OK objects\n");
	return 0;
}

/* ---- main ---------------------------------------------------------------------------------------- */
static void gpu_init(void)
{
	int dev;
	void *ctx;
	SETUP(cuInit(0) == 0 && cuDeviceGet(&dev, 0) == 0, "cuInit");
	SETUP(cuDevicePrimaryCtxRetain(&ctx, dev) == 0 && cuCtxSetCurrent(ctx) == 0, "primary context");
}

static void peer_put(const char *dir, const char *name, const struct peer *p)
{
	char t[512];
	snprintf(t, sizeof t, "%u %u %u %u %u %llu", p->lid, p->qpn[0], p->qpn[1], p->dctn, p->rkey, (unsigned long long)p->heap);
	for (int i = 0; i < 16; i++)
		snprintf(t + strlen(t), sizeof t - strlen(t), " %u", p->av[i]);
	SETUP(!xchg_put(dir, name, t), "write %s", name);
}
static void peer_get(const char *dir, const char *name, struct peer *p)
{
	char t[512];
	SETUP(!xchg_get(dir, name, t, sizeof t, 20), "no %s from the peer", name);
	unsigned long long h;
	char *s = t;
	int k;
	SETUP(sscanf(s, "%u %u %u %u %u %llu%n", &p->lid, &p->qpn[0], &p->qpn[1], &p->dctn, &p->rkey, &h, &k) == 6, "parse");
	p->heap = h;
	s += k;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		SETUP(sscanf(s, "%u%n", &v, &k) == 1, "parse av");
		p->av[i] = (uint8_t)v;
		s += k;
	}
}

int main(int argc, char **argv)
{
	int caps = 0, objects = 0, pair = 0, rank = -1;
	const char *dir = NULL;
	static struct option lo[] = { { "caps", 0, 0, 'c' }, { "objects", 0, 0, 'o' }, { "pair", 0, 0, 'p' },
				      { "rank", 1, 0, 'r' }, { "dir", 1, 0, 'd' }, { "gpu", 0, 0, 'g' },
				      { "dmabuf", 0, 0, 'b' }, { "dc", 0, 0, 'x' }, { "depth", 1, 0, 'n' },
				      { "cpu-proxy", 0, 0, 'P' }, { "wrap", 0, 0, 'w' }, { "linger-ms", 1, 0, 'l' },
				      { 0, 0, 0, 0 } };
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1)
		switch (c) {
		case 'c': caps = 1; break;
		case 'o': objects = 1; break;
		case 'p': pair = 1; break;
		case 'r': rank = atoi(optarg); break;
		case 'd': dir = optarg; break;
		case 'g': g_gpu = 1; break;
		case 'b': g_dmabuf = 1; break;
		case 'x': g_dc = 1; break;
		case 'n': g_depth = atoi(optarg); break;
		case 'P': g_cpu_proxy = 1; break;
		case 'w': g_wrap = 1; break;
		case 'l': g_linger_ms = atoi(optarg); break;
		default: return 2;
		}
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *dce = getenv("SIGMATRACE_EMU_DC");
	if ((dce && *dce && *dce != '0') != g_dc)
		DIE(2, "--dc and SIGMATRACE_EMU_DC=1 go together");
	if (caps)
		return run_caps();
	if (objects)
		return run_objects();
	if (g_gpu)
		gpu_init();
	if (pair) {
		static struct node a, b;
		node_setup(&a);
		node_setup(&b);
		struct peer pa, pb;
		node_export(&a, &pa);
		node_export(&b, &pb);
		for (int i = 0; i < 2; i++) {
			connect_qp(&a.rc[i], pb.qpn[i], pb.lid);
			connect_qp(&b.rc[i], pa.qpn[i], pa.lid);
		}
		ops(&a, &pb);
		errors(&a, &pb);
		if (g_dc)
			dc_ops(&a, &pb);
		if (g_linger_ms) /* the NIC idles with every QP still up (its watchdog's test) */
			usleep((useconds_t)g_linger_ms * 1000);
		printf("RESULT OK pair gpu=%d dmabuf=%d dc=%d cpu_proxy=%d wrap=%d\n", g_gpu, g_dmabuf, g_dc, g_cpu_proxy, g_wrap);
		return 0;
	}
	if ((rank != 0 && rank != 1) || !dir)
		DIE(2, "usage: --caps | --objects | --pair | --rank 0|1 --dir DIR [--gpu] [--dmabuf] [--dc]");
	static struct node me;
	struct peer mine, other;
	node_setup(&me);
	node_export(&me, &mine);
	peer_put(dir, rank ? "peer1" : "peer0", &mine);
	peer_get(dir, rank ? "peer0" : "peer1", &other);
	for (int i = 0; i < 2; i++)
		connect_qp(&me.rc[i], other.qpn[i], other.lid);
	SETUP(!xchg_put(dir, rank ? "ready1" : "ready0", "1"), "ready");
	char t[16];
	SETUP(!xchg_get(dir, rank ? "ready0" : "ready1", t, sizeof t, 20), "peer not ready");
	if (rank == 0) {
		ops(&me, &other);
		errors(&me, &other);
		if (g_dc)
			dc_ops(&me, &other);
		SETUP(!xchg_put(dir, "done", "1"), "done");
	} else {
		SETUP(!xchg_get(dir, "done", t, sizeof t, 60), "rank 0 did not finish");
	}
	printf("RESULT OK rank=%d gpu=%d dmabuf=%d dc=%d\n", rank, g_gpu, g_dmabuf, g_dc);
	return 0;
}
