/* emu_ibgda_client -- an IBGDA-style CPU client for the emulated HCA.
 *
 * Follows the NVSHMEM host setup order (reference §5.1): open device, PD
 * (+pdn via mlx5dv_init_obj), SRQ + recv CQ via verbs, data MR, send CQ in a
 * devx umem (filled with 0xff, optional collapsed cc=1), QP WQ and DBR in
 * umems, UAR via mlx5dv_devx_alloc_uar, CREATE_CQ, CREATE_QP, exchange QPN/LID
 * with the peer, RST2INIT -> INIT2RTR(remote_qpn, rlid) -> RTR2RTS.  Then it
 * posts RDMA WRITE / READ / ATOMIC FA / CS / inline WRITE by writing mlx5 WQEs
 * into its own SQ ring, updating the DBR and ringing the doorbell with the
 * NVSHMEM convention {BE32(pi<<8), BE32(qpn<<8)} (reference §3.3), several
 * WQEs per doorbell, with a small ring so that the SQ wraps many times.
 *
 *   emu_ibgda_client --pair [--cc] [--depth N] [--ops N] [--batch B]
 *       two QPs in this process, connected to each other
 *   emu_ibgda_client --rank 0|1 --dir DIR [--cc] ...
 *       two processes; QPN/LID/MR exchanged through files in DIR
 *   --verbs-qp
 *       UCX rc_mlx5 style instead of DevX (F24d): the QP and its send CQ are
 *       created with verbs (ibv_create_qp / ibv_create_cq, connected with
 *       ibv_modify_qp); mlx5dv_init_obj gives the SQ ring, the doorbell record,
 *       the BlueFlame register and the CQ ring, and the client writes WQEs,
 *       rings and polls CQEs itself (no ibv_post_send / ibv_poll_cq).
 *   --bf-alternate[=GAP_US]
 *       ring the two BlueFlame halves in turn, reg and reg ^ 0x100, one
 *       doorbell each, as rdma-core and UCX rc_mlx5 do on every post; with
 *       GAP_US, pause that long after every doorbell on reg itself, so that
 *       each following pair (reg ^ 0x100, then reg) is rung back to back:
 *       a poller that wakes after both sees the newer value in reg, which it
 *       scans first, and the older one in its twin.
 *   --churn N
 *       (--pair, DevX) after the checks, destroy the initiator's QP and create
 *       a new one on the same UAR, SQ and CQ, N times, each connected to the
 *       target and posting one RDMA WRITE (one doorbell): N + 2 QPs in one
 *       process, their numbers reused as the HCA hands them out again
 *       ("CHURN qps=N ok=K" at the end).  With --churn-keep the QPs stay
 *       alive until all N exist (N + 2 live QPs), then all are destroyed.
 *   --teardown N
 *       (--pair, DevX) after the checks, N rounds that tear down while a
 *       doorbell is in flight: a QP with a fresh SQ (mmap'ed, 256 WQEBBs) and
 *       doorbell record in umems, connected to the target, 200 unsignalled
 *       RDMA WRITEs rung with one doorbell, then -- after a pause that grows
 *       from 0 to ~150 us over the rounds, so the teardown meets the poller
 *       at every point of its forward and copy -- QP destroyed, umems
 *       deregistered, the SQ unmapped at once (a late read of it faults);
 *       every 8th round the UAR is freed and a new one allocated as well,
 *       also right after the doorbell ("TEARDOWN rounds=N" at the end).
 *   --interleave N
 *       (--pair --verbs-qp) after the checks, N rounds in which both QPs post
 *       one RDMA WRITE each and ring their registers back to back, then pause
 *       300 us: with SIGMATRACE_EMU_BFREG=word both ring one register word
 *       ("INTERLEAVE rounds=N" at the end).
 *   --op-times
 *       time every wait for a completion (the doorbell reaching the NIC, the
 *       WQEs executed) and print "OPTIMES waits=N max_ms=M over_250ms=K" at
 *       the end: a tracer that holds doorbells back shows as long waits.
 *   --sigwait
 *       after the set-up (every UAR allocated), the main thread blocks
 *       SIGUSR1, a thread waits for it with sigwait, and the process sends
 *       itself one (kill(getpid())): it must reach that thread ("SIGWAIT OK"),
 *       whatever threads a tracer started during the set-up.
 *
 * Ground truth on stdout: one "DB qpn=0x.. pi=.. nwqe=.. first_idx=.." line per
 * doorbell; "RESULT OK ..." or "RESULT FAIL ..." at the end (exit 0 / 1;
 * 2 = timeout/setup failure).
 *
 * Over 600 lines: a test program; one binary whose modes (DevX, verbs QPs, churn, teardown,
 * interleave) reuse one set-up and one WQE writer.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ibgda_common.h"
#include "file_exchange.h"
#include "rc_qp.h"

#define TIMEOUT_S 10.0
#define BUF_BYTES (1 << 20)
#define CHUNK 1024

static int g_cc, g_depth = 64, g_ops = 300, g_batch = 5, g_verbose, g_verbs;
static int g_sigwait, g_churn, g_churn_keep, g_interleave, g_optimes, g_teardown;
static unsigned long g_waits, g_waits_slow;
static double g_wait_max;
static int g_bfalt = -1; /* --bf-alternate: pause (us) after each doorbell on reg itself; -1: off */

#define DIE(code, ...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(code); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(2, __VA_ARGS__); } while (0)

struct ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint32_t pdn, lid;
	struct ibv_srq *srq;
	uint32_t srqn;
	struct ibv_cq *rcq;
	uint32_t rcqn;
	uint8_t *buf;            /* data MR */
	struct ibv_mr *mr;
	/* send CQ */
	uint8_t *cq_buf, *cq_dbr;
	uint32_t ncqe, cqn, cq_ci;
	struct mlx5dv_devx_umem *cq_umem, *cq_dbr_umem;
	struct mlx5dv_devx_uar *cq_uar;
	struct mlx5dv_devx_obj *cq_obj;
	/* QP */
	uint8_t *wq, *qp_dbr;
	struct mlx5dv_devx_umem *wq_umem, *qp_dbr_umem;
	struct mlx5dv_devx_uar *uar;
	struct mlx5dv_devx_obj *qp_obj;
	/* --verbs-qp: the same rings, from mlx5dv_init_obj */
	struct ibv_cq *vcq;
	struct ibv_qp *vqp;
	void *bf_reg;
	uint32_t qpn, nwqebb;
	uint32_t pi;             /* producer index (WQEBBs) */
	uint32_t done_idx;       /* WQEBB index up to which completions are known */
	int ndb;
};

struct peer_info { uint32_t lid, qpn, rkey; uint64_t addr; };

static void verbs_qp_setup(struct ep *e, struct ibv_context *ctx);

static void ep_setup(struct ep *e, struct ibv_context *ctx)
{
	memset(e, 0, sizeof *e);
	e->ctx = ctx;
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(ctx, 1, &pa), "query_port");
	e->lid = pa.lid;
	e->pd = ibv_alloc_pd(ctx);
	CHECK(e->pd, "alloc_pd");
	CHECK(!ibgda_pdn(e->pd, &e->pdn), "init_obj PD");
	/* shared objects through verbs (§5.1 step 3) */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 64, .max_sge = 1 } };
	e->srq = ibv_create_srq(e->pd, &sa);
	CHECK(e->srq, "create_srq");
	CHECK(!ibgda_srqn(e->srq, &e->srqn), "init_obj SRQ");
	e->rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(e->rcq, "create recv cq");
	CHECK(!ibgda_cqn(e->rcq, &e->rcqn), "init_obj CQ");
	/* data buffer */
	CHECK(!posix_memalign((void **)&e->buf, 4096, BUF_BYTES), "memalign");
	memset(e->buf, 0, BUF_BYTES);
	e->mr = ibv_reg_mr(e->pd, e->buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(e->mr, "reg_mr");

	if (g_verbs) {
		verbs_qp_setup(e, ctx);
		return;
	}
	/* send CQ (§5.1 step 5) */
	e->ncqe = (uint32_t)g_depth;
	CHECK(!posix_memalign((void **)&e->cq_buf, 4096, e->ncqe * 64), "memalign cq");
	memset(e->cq_buf, 0xff, e->ncqe * 64);
	CHECK(!posix_memalign((void **)&e->cq_dbr, 64, 64), "memalign dbr");
	memset(e->cq_dbr, 0, 64);
	e->cq_umem = mlx5dv_devx_umem_reg(ctx, e->cq_buf, e->ncqe * 64, IBV_ACCESS_LOCAL_WRITE);
	e->cq_dbr_umem = mlx5dv_devx_umem_reg(ctx, e->cq_dbr, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->cq_umem && e->cq_dbr_umem, "umem_reg cq");
	uint32_t eqn;
	CHECK(!mlx5dv_devx_query_eqn(ctx, 0, &eqn), "query_eqn");
	e->cq_uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC);
	CHECK(e->cq_uar, "alloc_uar cq");
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	e->cq_obj = ibgda_create_cq(ctx, e->cq_umem->umem_id, e->cq_dbr_umem->umem_id, e->ncqe, e->cq_uar->page_id, eqn,
				    g_cc, out, &e->cqn);
	CHECK(e->cq_obj, "CREATE_CQ failed: status 0x%x errno %d", (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS), errno);

	/* QP UAR + WQ + DBR (§5.1 steps 6, 8) */
	e->uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_BF);
	CHECK(e->uar, "alloc_uar qp");
	e->nwqebb = (uint32_t)g_depth;
	CHECK(!posix_memalign((void **)&e->wq, 4096, e->nwqebb * 64), "memalign wq");
	memset(e->wq, 0, e->nwqebb * 64);
	CHECK(!posix_memalign((void **)&e->qp_dbr, 64, 64), "memalign qp dbr");
	memset(e->qp_dbr, 0, 64);
	e->wq_umem = mlx5dv_devx_umem_reg(ctx, e->wq, e->nwqebb * 64, IBV_ACCESS_LOCAL_WRITE);
	e->qp_dbr_umem = mlx5dv_devx_umem_reg(ctx, e->qp_dbr, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->wq_umem && e->qp_dbr_umem, "umem_reg qp");

	/* CREATE_QP (§5.1 step 9) */
	e->qp_obj = ibgda_create_qp(ctx, e->pdn, e->uar->page_id, e->srqn, e->cqn, e->rcqn, e->wq_umem->umem_id, e->nwqebb,
				    e->qp_dbr_umem->umem_id, out, &e->qpn);
	CHECK(e->qp_obj, "CREATE_QP failed: status 0x%x errno %d", (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS), errno);
	printf("SETUP lid=%u qpn=0x%x cqn=0x%x sq_wqebb=%u uar_page=%u cc=%d\n", e->lid, e->qpn, e->cqn, e->nwqebb,
	       e->uar->page_id, g_cc);
}

/* mlx5dv_init_obj on the QP once more: it must give the same rings and the same
 * register (also after doorbells were rung through it) */
static void verbs_reinit(struct ep *e)
{
	struct mlx5dv_qp dq = { 0 };
	struct mlx5dv_obj o = { .qp = { .in = e->vqp, .out = &dq } };
	CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_QP), "init_obj QP again");
	CHECK(dq.bf.reg == e->bf_reg && (uint8_t *)dq.sq.buf == e->wq && (uint8_t *)dq.dbrec == e->qp_dbr,
	      "init_obj QP gave other rings or another register");
}

/* UCX rc_mlx5 style: verbs objects, then their rings through mlx5dv_init_obj */
static void verbs_qp_setup(struct ep *e, struct ibv_context *ctx)
{
	e->vcq = ibv_create_cq(ctx, g_depth, NULL, NULL, 0);
	CHECK(e->vcq, "create send cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = e->vcq, .recv_cq = e->rcq, .srq = e->srq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
		.cap = { .max_send_wr = (uint32_t)g_depth / 2, .max_recv_wr = 0, .max_send_sge = 6, .max_recv_sge = 1,
			 .max_inline_data = 16 },
	};
	e->vqp = ibv_create_qp(e->pd, &qa);
	CHECK(e->vqp, "create_qp");
	struct mlx5dv_qp dq = { 0 };
	struct mlx5dv_cq dc = { 0 };
	struct mlx5dv_obj o = { .qp = { .in = e->vqp, .out = &dq }, .cq = { .in = e->vcq, .out = &dc } };
	CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ), "init_obj QP+CQ");
	CHECK(dq.sq.stride == 64 && dq.sq.wqe_cnt >= 16 && !(dq.sq.wqe_cnt & (dq.sq.wqe_cnt - 1)), "SQ geometry");
	e->wq = dq.sq.buf;
	e->nwqebb = dq.sq.wqe_cnt;
	e->qp_dbr = (uint8_t *)dq.dbrec; /* [0] receive, [1] send (MLX5_SND_DBR) */
	e->bf_reg = dq.bf.reg;
	e->qpn = e->vqp->qp_num;
	e->cq_buf = dc.buf;
	e->cq_dbr = (uint8_t *)dc.dbrec;
	e->ncqe = dc.cqe_cnt;
	e->cqn = dc.cqn;
	verbs_reinit(e); /* asked again (libraries do) */
	printf("SETUP lid=%u qpn=0x%x cqn=0x%x sq_wqebb=%u verbs=1 bf_reg_offset=0x%lx\n", e->lid, e->qpn, e->cqn,
	       e->nwqebb, (unsigned long)((uintptr_t)e->bf_reg & 4095));
}

static void verbs_connect(struct ep *e, const struct peer_info *p)
{
	CHECK(!rc_to_init(e->vqp), "INIT");
	CHECK(!rc_to_rtr_rts(e->vqp, p->qpn, (uint16_t)p->lid, 4), "RTR/RTS");
}

static int modify(struct ep *e, uint16_t op, const struct peer_info *p)
{
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	int r = ibgda_modify_qp(e->qp_obj, e->qpn, op, p->qpn, p->lid, out);
	if (r)
		printf("MODIFY op=0x%x failed r=%d status=0x%x\n", op, r, (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));
	return r;
}

static void connect_ep(struct ep *e, const struct peer_info *p)
{
	if (g_verbs) {
		verbs_connect(e, p);
		return;
	}
	CHECK(!modify(e, ST_MLX5_CMD_OP_RST2INIT_QP, p), "RST2INIT");
	CHECK(!modify(e, ST_MLX5_CMD_OP_INIT2RTR_QP, p), "INIT2RTR");
	CHECK(!modify(e, ST_MLX5_CMD_OP_RTR2RTS_QP, p), "RTR2RTS");
}

/* ---- WQE building (reference §1) ----------------------------------------- */
static uint8_t *slot(struct ep *e, uint32_t idx, uint32_t off)
{
	return e->wq + (((idx & (e->nwqebb - 1)) * 64 + off) & (e->nwqebb * 64 - 1));
}

/* Wait until the SQ has room for n more WQEBBs (polling CQEs). */
static void wait_cqe(struct ep *e, uint16_t want_idx);

struct pending { uint16_t last_idx; uint32_t next_pi; };
static struct pending g_pend[4096];
static unsigned g_pend_h, g_pend_t;

static void reserve(struct ep *e, uint32_t n)
{
	while (e->pi + n - e->done_idx > e->nwqebb) {
		CHECK(g_pend_h != g_pend_t, "SQ full with nothing pending");
		struct pending *p = &g_pend[g_pend_h++ % 4096];
		wait_cqe(e, p->last_idx);
		e->done_idx = p->next_pi;
	}
}

static uint32_t put_ctrl(struct ep *e, uint8_t opcode, uint32_t opmod, uint32_t ds, uint8_t fm, uint32_t imm)
{
	uint32_t idx = e->pi;
	st_mlx5_set_ctrl_seg((struct st_mlx5_wqe_ctrl_seg *)slot(e, idx, 0), opmod, (uint16_t)idx, opcode, e->qpn, ds, fm, imm);
	e->pi += st_mlx5_wqebbs(ds);
	return idx;
}

static uint32_t post_write(struct ep *e, const struct peer_info *p, uint64_t loff, uint64_t roff, uint32_t len, int nsge,
			   uint8_t fm)
{
	uint32_t ds = 2 + (uint32_t)nsge;
	reserve(e, st_mlx5_wqebbs(ds));
	uint32_t idx = e->pi;
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)slot(e, idx, 16), p->addr + roff, p->rkey);
	uint32_t per = len / (uint32_t)nsge;
	for (int i = 0; i < nsge; i++) {
		uint32_t l = i == nsge - 1 ? len - per * (uint32_t)(nsge - 1) : per;
		st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)slot(e, idx, 32 + 16 * (uint32_t)i), l, e->mr->lkey,
				     (uint64_t)(uintptr_t)(e->buf + loff + per * (uint32_t)i));
	}
	return put_ctrl(e, ST_MLX5_OPCODE_RDMA_WRITE, 0, ds, fm, 0);
}

/* One-WQEBB WQE (a WQEBB never straddles the ring's end). */
static uint32_t post_one(struct ep *e, uint8_t opcode, const struct peer_info *p, uint64_t roff, uint64_t loff,
			 uint32_t len, uint64_t a, uint64_t b, uint8_t fm)
{
	reserve(e, 1);
	uint32_t idx = e->pi;
	uint32_t ds = ibgda_build_wqe(slot(e, idx, 0), opcode, (uint16_t)idx, e->qpn, fm, p->addr + roff, p->rkey,
				      (uint64_t)(uintptr_t)(e->buf + loff), e->mr->lkey, len, a, b);
	e->pi += st_mlx5_wqebbs(ds);
	return idx;
}

static uint32_t post_read(struct ep *e, const struct peer_info *p, uint64_t loff, uint64_t roff, uint32_t len, uint8_t fm)
{
	return post_one(e, ST_MLX5_OPCODE_RDMA_READ, p, roff, loff, len, 0, 0, fm);
}

static uint32_t post_atomic(struct ep *e, const struct peer_info *p, uint8_t opcode, uint64_t roff, uint64_t a, uint64_t b,
			    uint64_t loff, uint8_t fm)
{
	return post_one(e, opcode, p, roff, loff, 8, a, b, fm);
}

static uint32_t post_inline_write(struct ep *e, const struct peer_info *p, uint64_t roff, uint32_t val, uint8_t fm)
{
	reserve(e, 1);
	uint32_t idx = e->pi;
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)slot(e, idx, 16), p->addr + roff, p->rkey);
	uint32_t bc = htobe32(4 | ST_MLX5_INLINE_SEG);
	memcpy(slot(e, idx, 32), &bc, 4);
	memcpy(slot(e, idx, 36), &val, 4); /* raw, no swap (reference §1.5) */
	return put_ctrl(e, ST_MLX5_OPCODE_RDMA_WRITE, 0, 3, fm, 0); /* DS=3, DeepEP-style */
}

/* DBR then 8-byte doorbell, NVSHMEM/DeepEP convention (reference §3.3, DB1) */
static void ring(struct ep *e, uint32_t first_idx, uint32_t nwqe, uint16_t last_idx)
{
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n((uint32_t *)(e->qp_dbr + 4), ibgda_dbr_value(e->pi), __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	uintptr_t reg = (uintptr_t)(g_verbs ? e->bf_reg : e->uar->reg_addr);
	int twin = g_bfalt >= 0 && (e->ndb & 1); /* rdma-core / UCX: bf->offset ^= bf->buf_size on every post */
	__atomic_store_n((uint64_t *)(twin ? reg ^ 0x100 : reg), ibgda_db_value(e->pi, e->qpn), __ATOMIC_RELEASE);
	printf("DB qpn=0x%x pi=%u nwqe=%u first_idx=%u\n", e->qpn, e->pi & 0xffff, nwqe, first_idx & 0xffff);
	e->ndb++;
	if (g_bfalt > 0 && !twin)
		usleep((useconds_t)g_bfalt);
	struct pending *p = &g_pend[g_pend_t++ % 4096];
	p->last_idx = last_idx;
	p->next_pi = e->pi;
}

static void note_wait(double t0)
{
	double d = ibgda_now_s() - t0;
	g_waits++;
	if (d > g_wait_max)
		g_wait_max = d;
	if (d > 0.25)
		g_waits_slow++;
}

static void wait_cqe(struct ep *e, uint16_t want_idx)
{
	double t0 = ibgda_now_s();
	for (;;) {
		if (g_cc) {
			/* collapsed CQ: every CQE lands in slot 0; NVSHMEM-style completion test */
			struct st_mlx5_cqe64 *c = (struct st_mlx5_cqe64 *)e->cq_buf;
			uint8_t op_own = __atomic_load_n(&c->op_own, __ATOMIC_ACQUIRE);
			if (op_own != 0xff) {
				uint8_t opc = op_own >> 4;
				if (opc == ST_MLX5_CQE_REQ_ERR)
					DIE(1, "error CQE syndrome 0x%x wqe %u", ((struct st_mlx5_err_cqe *)c)->syndrome,
					    be16toh(c->wqe_counter));
				uint16_t ctr = be16toh(c->wqe_counter);
				if ((uint16_t)(ctr - want_idx) < 0x8000) {
					note_wait(t0);
					return;
				}
			}
		} else {
			const struct st_mlx5_cqe64 *c = ibgda_cq_next(e->cq_buf, e->cq_dbr, e->ncqe, &e->cq_ci);
			if (c) {
				uint8_t opc = c->op_own >> 4;
				uint16_t ctr = be16toh(c->wqe_counter);
				if (opc == ST_MLX5_CQE_REQ_ERR)
					DIE(1, "error CQE syndrome 0x%x wqe %u", ((const struct st_mlx5_err_cqe *)c)->syndrome, ctr);
				if (opc != ST_MLX5_CQE_REQ)
					DIE(1, "unexpected CQE opcode %u", opc);
				if (g_verbose)
					printf("CQE ci=%u wqe_counter=%u opcode=0x%x byte_cnt=%u\n", e->cq_ci - 1, ctr,
					       be32toh(c->sop_drop_qpn) >> 24, be32toh(c->byte_cnt));
				if (ctr == want_idx) {
					note_wait(t0);
					return;
				}
				continue;
			}
		}
		if (ibgda_now_s() - t0 > TIMEOUT_S)
			DIE(2, "timeout waiting for CQE of wqe %u", want_idx);
		usleep(20);
	}
}

static void drain(struct ep *e)
{
	while (g_pend_h != g_pend_t) {
		struct pending *p = &g_pend[g_pend_h++ % 4096];
		wait_cqe(e, p->last_idx);
		e->done_idx = p->next_pi;
	}
}

/* Memory map of each side's 1 MiB buffer */
#define OFF_WRITE_DST   0x00000  /* peer writes here: g_ops chunks of CHUNK bytes, up to 512 KiB */
#define OFF_READ_SRC    0x80000  /* pattern the peer reads (64 KiB) */
#define OFF_ATOMIC      0x90000  /* counter for FA, word for CS */
#define OFF_FLAG        0x90100  /* inline write target */
#define OFF_SRC         0xa0000  /* local source of writes (up to 256 KiB, reused) */
#define OFF_READ_DST    0xe0000  /* local destination of reads */
#define OFF_FETCH       0xf0000  /* fetched atomic values */

static uint8_t pattern(uint32_t seed, uint32_t i) { return (uint8_t)(seed * 131 + i * 7 + (i >> 8)); }

static void fill_target(struct ep *e, uint32_t seed)
{
	for (uint32_t i = 0; i < 0x10000; i++)
		e->buf[OFF_READ_SRC + i] = pattern(seed, i);
	uint64_t z = 0;
	memcpy(e->buf + OFF_ATOMIC, &z, 8);
	uint64_t cs = 0x1111;
	memcpy(e->buf + OFF_ATOMIC + 8, &cs, 8);
}

static int n_fa(void) { return g_ops < 64 ? g_ops : 64; }

/* initiator: returns number of failures */
static int run_initiator(struct ep *e, const struct peer_info *p, uint32_t target_seed)
{
	int fails = 0;
	uint32_t nwrite = (uint32_t)g_ops;
	if (nwrite * CHUNK > 0x80000)
		nwrite = 0x80000 / CHUNK;
	/* 1. RDMA WRITEs, g_batch per doorbell, only the last of a batch signalled */
	for (uint32_t i = 0; i < nwrite;) {
		uint32_t first = e->pi, n = 0;
		uint32_t last = 0;
		for (; n < (uint32_t)g_batch && i < nwrite; n++, i++) {
			uint64_t src = OFF_SRC + (uint64_t)(i % 128) * CHUNK * 2;
			for (uint32_t k = 0; k < CHUNK; k++)
				e->buf[src + k] = pattern(i + 1000, k);
			int nsge = (i % 7 == 3) ? 6 : 1; /* 6 SGEs: DS=8, 2 WQEBBs (wraps at ring end) */
			int last_in_batch = (n + 1 == (uint32_t)g_batch) || (i + 1 == nwrite);
			last = post_write(e, p, src, (uint64_t)i * CHUNK, CHUNK, nsge,
					  last_in_batch ? ST_MLX5_WQE_CTRL_CQ_UPDATE : 0);
		}
		ring(e, first, n, (uint16_t)last);
	}
	drain(e);
	if (g_verbs) /* and once more between phases, after doorbells went through the register */
		verbs_reinit(e);
	/* 2. RDMA READ of the peer's pattern, 4 KiB per WQE, 4 per doorbell */
	for (uint32_t i = 0; i < 16;) {
		uint32_t first = e->pi, n = 0, last = 0;
		for (; n < 4 && i < 16; n++, i++)
			last = post_read(e, p, OFF_READ_DST + i * 4096, OFF_READ_SRC + i * 4096, 4096,
					 n == 3 ? ST_MLX5_WQE_CTRL_CQ_UPDATE : 0);
		ring(e, first, n, (uint16_t)last);
	}
	drain(e);
	for (uint32_t i = 0; i < 0x10000; i++)
		if (e->buf[OFF_READ_DST + i] != pattern(target_seed, i)) {
			printf("CHECK read mismatch at %u: %u != %u\n", i, e->buf[OFF_READ_DST + i], pattern(target_seed, i));
			fails++;
			break;
		}
	/* 3. ATOMIC FA +1 x n_fa, each fetching into its own slot; signal every one */
	int nfa = n_fa();
	memset(e->buf + OFF_FETCH, 0xee, 8 * (size_t)nfa + 16);
	for (int i = 0; i < nfa;) {
		uint32_t first = e->pi, n = 0, last = 0;
		for (; n < 8 && i < nfa; n++, i++)
			last = post_atomic(e, p, ST_MLX5_OPCODE_ATOMIC_FA, OFF_ATOMIC, 1, 0, OFF_FETCH + 8 * (uint64_t)i,
					   ST_MLX5_WQE_CTRL_CQ_UPDATE);
		ring(e, first, n, (uint16_t)last);
		drain(e);
	}
	for (int i = 0; i < nfa; i++) {
		uint64_t v;
		memcpy(&v, e->buf + OFF_FETCH + 8 * i, 8);
		if (v != (uint64_t)i) {
			printf("CHECK fetch-add %d returned %llu\n", i, (unsigned long long)v);
			fails++;
			break;
		}
	}
	/* 4. ATOMIC CS: 0x1111 -> 0x2222 succeeds, then 0x1111 -> 0x3333 fails (returns 0x2222) */
	uint32_t first = e->pi;
	post_atomic(e, p, ST_MLX5_OPCODE_ATOMIC_CS, OFF_ATOMIC + 8, 0x2222, 0x1111, OFF_FETCH + 0x1000, 0);
	uint32_t last = post_atomic(e, p, ST_MLX5_OPCODE_ATOMIC_CS, OFF_ATOMIC + 8, 0x3333, 0x1111, OFF_FETCH + 0x1008,
				    ST_MLX5_WQE_CTRL_CQ_UPDATE);
	/* 5. DeepEP-style 4-byte inline write of a flag, same doorbell */
	last = post_inline_write(e, p, OFF_FLAG, 0xcafef00d, ST_MLX5_WQE_CTRL_CQ_UPDATE);
	ring(e, first, 3, (uint16_t)last);
	drain(e);
	uint64_t c1, c2;
	memcpy(&c1, e->buf + OFF_FETCH + 0x1000, 8);
	memcpy(&c2, e->buf + OFF_FETCH + 0x1008, 8);
	if (c1 != 0x1111 || c2 != 0x2222) {
		printf("CHECK compare-swap returned 0x%llx 0x%llx\n", (unsigned long long)c1, (unsigned long long)c2);
		fails++;
	}
	printf("INITIATOR writes=%u reads=16 fa=%d cs=2 inline=1 doorbells=%d wraps=%u fails=%d\n", nwrite, nfa, e->ndb,
	       e->pi / e->nwqebb, fails);
	return fails;
}

/* target-side verification of what the initiator did */
static int verify_target(struct ep *e)
{
	int fails = 0;
	uint32_t nwrite = (uint32_t)g_ops;
	if (nwrite * CHUNK > 0x80000)
		nwrite = 0x80000 / CHUNK;
	for (uint32_t i = 0; i < nwrite && !fails; i++)
		for (uint32_t k = 0; k < CHUNK; k++)
			if (e->buf[OFF_WRITE_DST + i * CHUNK + k] != pattern(i + 1000, k)) {
				printf("CHECK write %u mismatch at byte %u\n", i, k);
				fails++;
				break;
			}
	uint64_t v, cs;
	uint32_t flag;
	memcpy(&v, e->buf + OFF_ATOMIC, 8);
	memcpy(&cs, e->buf + OFF_ATOMIC + 8, 8);
	memcpy(&flag, e->buf + OFF_FLAG, 4);
	if (v != (uint64_t)n_fa()) {
		printf("CHECK counter %llu != %d\n", (unsigned long long)v, n_fa());
		fails++;
	}
	if (cs != 0x2222) {
		printf("CHECK cs word 0x%llx\n", (unsigned long long)cs);
		fails++;
	}
	if (flag != 0xcafef00d) {
		printf("CHECK flag 0x%x\n", flag);
		fails++;
	}
	printf("TARGET verified writes=%u counter=%llu fails=%d\n", nwrite, (unsigned long long)v, fails);
	return fails;
}

/* ---- --churn: many short-lived QPs on one UAR page ------------------------- */
static int run_churn(struct ep *a, const struct peer_info *pb)
{
	int ok = 0;
	struct mlx5dv_devx_obj **keep = g_churn_keep ? calloc((size_t)g_churn, sizeof *keep) : NULL;
	for (int i = 0; i < g_churn; i++) {
		if (keep)
			keep[i] = a->qp_obj;
		else
			CHECK(!mlx5dv_devx_obj_destroy(a->qp_obj), "destroy QP %d", i);
		memset(a->qp_dbr, 0, 8);
		uint8_t out[IBGDA_PRM_OUT_SIZE];
		a->qp_obj = ibgda_create_qp(a->ctx, a->pdn, a->uar->page_id, a->srqn, a->cqn, a->rcqn, a->wq_umem->umem_id,
					    a->nwqebb, a->qp_dbr_umem->umem_id, out, &a->qpn);
		CHECK(a->qp_obj, "CREATE_QP %d failed: status 0x%x", i, (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));
		connect_ep(a, pb);
		a->pi = a->done_idx = 0;
		g_pend_h = g_pend_t;
		uint32_t k = (uint32_t)i % 256;
		uint32_t last = post_write(a, pb, OFF_SRC + k * CHUNK, (uint64_t)k * CHUNK, 64, 1, ST_MLX5_WQE_CTRL_CQ_UPDATE);
		ring(a, last, 1, (uint16_t)last);
		drain(a);
		ok++;
	}
	for (int i = 0; keep && i < g_churn; i++)
		CHECK(!mlx5dv_devx_obj_destroy(keep[i]), "destroy kept QP %d", i);
	free(keep);
	printf("CHURN qps=%d ok=%d\n", g_churn, ok);
	return ok != g_churn;
}

/* ---- --teardown: destroy while a doorbell is in flight ------------------------ */
static void spin_us(double us)
{
	double t0 = ibgda_now_s();
	while ((ibgda_now_s() - t0) * 1e6 < us)
		;
}

static int run_teardown(struct ep *a, const struct peer_info *pb)
{
	const uint32_t nbb = 256, nwqe = 200;
	uint8_t *keep_wq = a->wq;
	uint32_t keep_n = a->nwqebb;
	for (int i = 0; i < g_teardown; i++) {
		uint8_t *sq = mmap(NULL, nbb * 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(sq != MAP_FAILED, "mmap sq");
		uint8_t *dbr = NULL;
		CHECK(!posix_memalign((void **)&dbr, 64, 64), "memalign dbr");
		memset(dbr, 0, 64);
		struct mlx5dv_devx_umem *wq_umem = mlx5dv_devx_umem_reg(a->ctx, sq, nbb * 64, IBV_ACCESS_LOCAL_WRITE);
		struct mlx5dv_devx_umem *dbr_umem = mlx5dv_devx_umem_reg(a->ctx, dbr, 8, IBV_ACCESS_LOCAL_WRITE);
		CHECK(wq_umem && dbr_umem, "umem_reg teardown %d", i);
		uint8_t out[IBGDA_PRM_OUT_SIZE];
		a->wq = sq;
		a->nwqebb = nbb;
		a->qp_dbr = dbr;
		a->qp_obj = ibgda_create_qp(a->ctx, a->pdn, a->uar->page_id, a->srqn, a->cqn, a->rcqn, wq_umem->umem_id, nbb,
					    dbr_umem->umem_id, out, &a->qpn);
		CHECK(a->qp_obj, "CREATE_QP teardown %d failed: status 0x%x", i, (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));
		connect_ep(a, pb);
		a->pi = a->done_idx = 0;
		g_pend_h = g_pend_t;
		uint32_t first = a->pi, last = 0;
		for (uint32_t k = 0; k < nwqe; k++)
			last = post_write(a, pb, OFF_SRC + (k % 64) * CHUNK, (uint64_t)(k % 256) * CHUNK, 64, 1, 0);
		ring(a, first, nwqe, (uint16_t)last);
		g_pend_h = g_pend_t; /* nothing signalled: no completion to wait for */
		spin_us((double)(i % 32) * 5.0);
		CHECK(!mlx5dv_devx_obj_destroy(a->qp_obj), "destroy QP teardown %d", i);
		CHECK(!mlx5dv_devx_umem_dereg(wq_umem) && !mlx5dv_devx_umem_dereg(dbr_umem), "umem_dereg teardown %d", i);
		munmap(sq, nbb * 64); /* a read of the SQ from now on faults */
		free(dbr);
		if (i % 8 == 7) {
			/* and the UAR while a doorbell is in flight: ring once more on a last QP, free at once */
			a->wq = keep_wq;
			a->nwqebb = keep_n;
			mlx5dv_devx_free_uar(a->uar);
			a->uar = mlx5dv_devx_alloc_uar(a->ctx, MLX5DV_UAR_ALLOC_TYPE_BF);
			CHECK(a->uar, "alloc_uar teardown %d", i);
		}
	}
	a->wq = keep_wq;
	a->nwqebb = keep_n;
	a->qp_obj = NULL;
	printf("TEARDOWN rounds=%d\n", g_teardown);
	return 0;
}

/* ---- --interleave: two QPs ring back to back --------------------------------- */
static int run_interleaved(struct ep *a, struct ep *b, const struct peer_info *pa, const struct peer_info *pb)
{
	for (int i = 0; i < g_interleave; i++) {
		uint32_t k = (uint32_t)i % 256;
		uint32_t la = post_write(a, pb, OFF_SRC + k * CHUNK, (uint64_t)k * CHUNK, 64, 1, ST_MLX5_WQE_CTRL_CQ_UPDATE);
		ring(a, la, 1, (uint16_t)la);
		uint32_t lb = post_write(b, pa, OFF_SRC + k * CHUNK, (uint64_t)k * CHUNK, 64, 1, ST_MLX5_WQE_CTRL_CQ_UPDATE);
		ring(b, lb, 1, (uint16_t)lb);
		g_pend_h = g_pend_t; /* completions handled here */
		usleep(300);
		wait_cqe(a, (uint16_t)la);
		a->done_idx = a->pi;
		wait_cqe(b, (uint16_t)lb);
		b->done_idx = b->pi;
	}
	printf("INTERLEAVE rounds=%d\n", g_interleave);
	return 0;
}

/* ---- --sigwait: a process-directed signal reaches the thread that waits for it */
static void *sigwait_main(void *arg)
{
	sigset_t *set = arg;
	int sig = 0;
	if (sigwait(set, &sig) == 0 && sig == SIGUSR1)
		return (void *)1;
	return NULL;
}

static void sigwait_check(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	CHECK(!pthread_sigmask(SIG_BLOCK, &set, NULL), "pthread_sigmask");
	pthread_t t;
	CHECK(!pthread_create(&t, NULL, sigwait_main, &set), "pthread_create");
	CHECK(!kill(getpid(), SIGUSR1), "kill");
	void *got = NULL;
	CHECK(!pthread_join(t, &got), "pthread_join");
	CHECK(got, "sigwait did not get SIGUSR1");
	printf("SIGWAIT OK\n");
}

/* ---- file exchange --------------------------------------------------------- */
static void put_file(const char *dir, const char *name, const char *text)
{
	CHECK(!xchg_put(dir, name, text), "cannot write %s/%s", dir, name);
}

static void get_file(const char *dir, const char *name, char *buf, size_t n)
{
	if (xchg_get(dir, name, buf, n, TIMEOUT_S))
		DIE(2, "timeout waiting for %s/%s", dir, name);
}

int main(int argc, char **argv)
{
	int pair = 0, rank = -1;
	const char *dir = NULL;
	static struct option opts[] = {
		{ "pair", no_argument, 0, 'P' }, { "rank", required_argument, 0, 'r' }, { "dir", required_argument, 0, 'd' },
		{ "cc", no_argument, 0, 'c' }, { "depth", required_argument, 0, 'D' }, { "ops", required_argument, 0, 'n' },
		{ "batch", required_argument, 0, 'b' }, { "verbose", no_argument, 0, 'v' },
		{ "verbs-qp", no_argument, 0, 'V' }, { "bf-alternate", optional_argument, 0, 'A' },
		{ "sigwait", no_argument, 0, 'S' }, { "churn", required_argument, 0, 'C' },
		{ "churn-keep", no_argument, 0, 'K' }, { "op-times", no_argument, 0, 'T' },
		{ "teardown", required_argument, 0, 'X' },
		{ "interleave", required_argument, 0, 'I' }, { 0, 0, 0, 0 },
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (ch) {
		case 'P': pair = 1; break;
		case 'r': rank = atoi(optarg); break;
		case 'd': dir = optarg; break;
		case 'c': g_cc = 1; break;
		case 'D': g_depth = atoi(optarg); break;
		case 'n': g_ops = atoi(optarg); break;
		case 'b': g_batch = atoi(optarg); break;
		case 'v': g_verbose = 1; break;
		case 'V': g_verbs = 1; break;
		case 'S': g_sigwait = 1; break;
		case 'C': g_churn = atoi(optarg); break;
		case 'K': g_churn_keep = 1; break;
		case 'T': g_optimes = 1; break;
		case 'X': g_teardown = atoi(optarg); break;
		case 'I': g_interleave = atoi(optarg); break;
		case 'A': g_bfalt = optarg ? atoi(optarg) : 0; break;
		default: fprintf(stderr, "usage: see source\n"); return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (g_depth < 16 || (g_depth & (g_depth - 1)) || g_batch < 1 || g_batch > g_depth / 4)
		DIE(2, "bad --depth/--batch");
	if (!pair && (rank < 0 || rank > 1 || !dir))
		DIE(2, "need --pair or --rank 0|1 --dir DIR");
	if (g_verbs && g_cc)
		DIE(2, "--cc is a DevX CQ option (not with --verbs-qp)");

	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	CHECK(list && ndev > 0, "no RDMA device");
	CHECK(mlx5dv_is_supported(list[0]), "not an mlx5 device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	printf("DEVICE %s\n", ibv_get_device_name(list[0]));

	int fails = 0;
	if (pair) {
		struct ep a, b;
		ep_setup(&a, ctx);
		ep_setup(&b, ctx);
		if (g_sigwait)
			sigwait_check();
		fill_target(&b, 77);
		struct peer_info pa = { a.lid, a.qpn, a.mr->rkey, (uint64_t)(uintptr_t)a.buf };
		struct peer_info pb = { b.lid, b.qpn, b.mr->rkey, (uint64_t)(uintptr_t)b.buf };
		connect_ep(&a, &pb);
		connect_ep(&b, &pa);
		printf("CONNECT qpn=0x%x <-> qpn=0x%x\n", a.qpn, b.qpn);
		fails += run_initiator(&a, &pb, 77);
		fails += verify_target(&b);
		if (g_churn && !g_verbs)
			fails += run_churn(&a, &pb);
		if (g_teardown && !g_verbs)
			fails += run_teardown(&a, &pb);
		if (g_interleave && g_verbs)
			fails += run_interleaved(&a, &b, &pa, &pb);
		if (g_verbs) { /* the register goes away with the context: closing must not hang or fault */
			CHECK(!ibv_destroy_qp(a.vqp) && !ibv_destroy_qp(b.vqp), "destroy_qp");
			/* a QP made after those are gone (it may get their register) */
			struct ibv_qp_init_attr qa = { .send_cq = a.vcq, .recv_cq = a.rcq, .srq = a.srq, .qp_type = IBV_QPT_RC,
						       .cap = { .max_send_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
			struct ibv_qp *c = ibv_create_qp(a.pd, &qa);
			CHECK(c, "create_qp after destroy");
			struct mlx5dv_qp dq = { 0 };
			struct mlx5dv_obj o = { .qp = { .in = c, .out = &dq } };
			CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_QP), "init_obj QP after destroy");
			printf("LATE qpn=0x%x bf_reg_offset=0x%lx\n", c->qp_num, (unsigned long)((uintptr_t)dq.bf.reg & 4095));
			CHECK(!ibv_destroy_qp(c), "destroy late qp");
			CHECK(!ibv_destroy_cq(a.vcq) && !ibv_destroy_cq(b.vcq), "destroy_cq");
			CHECK(!ibv_close_device(ctx), "close_device");
			printf("TEARDOWN OK\n");
		}
	} else {
		struct ep e;
		ep_setup(&e, ctx);
		fill_target(&e, 50 + (uint32_t)rank);
		char txt[256], name[32];
		snprintf(txt, sizeof txt, "%u %u %u %llu\n", e.lid, e.qpn, e.mr->rkey, (unsigned long long)(uintptr_t)e.buf);
		snprintf(name, sizeof name, "info%d", rank);
		put_file(dir, name, txt);
		snprintf(name, sizeof name, "info%d", 1 - rank);
		get_file(dir, name, txt, sizeof txt);
		struct peer_info p;
		unsigned long long addr;
		CHECK(sscanf(txt, "%u %u %u %llu", &p.lid, &p.qpn, &p.rkey, &addr) == 4, "bad peer info");
		p.addr = addr;
		connect_ep(&e, &p);
		printf("CONNECT local lid=%u qpn=0x%x remote lid=%u qpn=0x%x\n", e.lid, e.qpn, p.lid, p.qpn);
		/* both sides must be RTR before anyone sends */
		snprintf(name, sizeof name, "ready%d", rank);
		put_file(dir, name, "1\n");
		snprintf(name, sizeof name, "ready%d", 1 - rank);
		get_file(dir, name, txt, sizeof txt);
		if (rank == 0) {
			fails += run_initiator(&e, &p, 51);
			snprintf(txt, sizeof txt, "%d\n", fails);
			put_file(dir, "done0", txt);
			get_file(dir, "done1", txt, sizeof txt);
			fails += atoi(txt);
		} else {
			get_file(dir, "done0", txt, sizeof txt);
			int f = verify_target(&e);
			snprintf(txt, sizeof txt, "%d\n", f);
			put_file(dir, "done1", txt);
			fails += f + atoi(txt) * 0;
		}
	}
	if (g_optimes)
		printf("OPTIMES waits=%lu max_ms=%.1f over_250ms=%lu\n", g_waits, g_wait_max * 1e3, g_waits_slow);
	if (fails)
		DIE(1, "%d check(s) failed", fails);
	printf("RESULT OK\n");
	return 0;
}
