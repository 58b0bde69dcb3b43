/* emu_bfreg_client -- two verbs QPs on one BlueFlame register (rdma-core's shared bfregs), one rung by
 * the program itself and one by libibverbs (tests/test_hijack_cpu.py, issue 12 finding 9).
 *
 *   emu_bfreg_client [--rounds N]
 *
 * Meant for SIGMATRACE_EMU_BFREG=word (every verbs QP on one register word) and
 * SIGMATRACE_EMU_BF_POST=1 (the emulated libibverbs rings as rdma-core's mlx5 does: a one-WQE post is
 * a BlueFlame copy at the bfreg's current half, under the bfreg's lock).
 *
 * QP A, the UCX rc_mlx5 way: mlx5dv_init_obj gives its SQ, doorbell record and BlueFlame register and
 * its send CQ's ring; the client writes an RDMA WRITE WQE, the record and the 8-byte doorbell (the
 * ctrl's first 8 bytes) itself and polls its CQE itself.  QP B: ibv_post_send and ibv_poll_cq only,
 * never init_obj.  A and B are connected to each other.  A's ring (512 WQEs) holds every round's WQE:
 * the emulated HCA may run A's WQE from its doorbell record before the tracer's poller forwards A's
 * doorbell (a shared word), and a poller that sees A's doorbells late must still find every WQE.  Each round rings A and at once posts B, one
 * 64-byte RDMA WRITE each within the one registered buffer, then waits for both completions and
 * checks the bytes written; a last round rings A alone.  Run alone, the program's two writes to the register come one after the
 * other; a tracer that forwards A's doorbell from a thread of its own must not let it land inside B's
 * copy (the emulated HCA counts such a copy as bf_torn).
 *
 * stdout: "BFREG rounds=N", then "RESULT OK" (exit 0) or "RESULT FAIL ..." (exit 1; 2: set-up).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibgda_common.h"
#include "rc_qp.h"

#define DIE(code, ...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); exit(code); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(2, __VA_ARGS__); } while (0)

#define LEN 64
#define SRC_A 0x0000u
#define DST_A 0x1000u
#define SRC_B 0x2000u
#define DST_B 0x3000u

struct dv_qp { /* A's rings, from mlx5dv_init_obj */
	uint8_t *sq, *dbr, *cq, *cq_dbr;
	volatile uint64_t *reg;
	uint32_t nwqebb, ncqe, ci, pi;
};

static void wait_dv_cqe(struct dv_qp *a)
{
	double t0 = ibgda_now_s();
	const struct st_mlx5_cqe64 *c;
	while (!(c = ibgda_cq_next(a->cq, a->cq_dbr, a->ncqe, &a->ci))) {
		if (ibgda_now_s() - t0 > 10)
			DIE(1, "timeout waiting for A's CQE");
		usleep(10);
	}
	if (c->op_own >> 4 != ST_MLX5_CQE_REQ)
		DIE(1, "A: CQE opcode %u", c->op_own >> 4);
}

static void wait_wc(struct ibv_cq *cq)
{
	double t0 = ibgda_now_s();
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
		if (ibgda_now_s() - t0 > 10)
			DIE(1, "timeout waiting for B's completion");
		usleep(10);
	}
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		DIE(1, "B: poll_cq %d status %d", n, n > 0 ? (int)wc.status : -1);
}

/* One RDMA WRITE of LEN bytes SRC_A -> DST_A on A: WQE, doorbell record, 8-byte doorbell. */
static void ring_write(struct dv_qp *a, uint32_t qpn, uint8_t *buf, const struct ibv_mr *mr)
{
	uint8_t *w = a->sq + (a->pi & (a->nwqebb - 1)) * 64;
	ibgda_build_wqe(w, ST_MLX5_OPCODE_RDMA_WRITE, (uint16_t)a->pi, qpn, ST_MLX5_WQE_CTRL_CQ_UPDATE,
			(uintptr_t)(buf + DST_A), mr->rkey, (uintptr_t)(buf + SRC_A), mr->lkey, LEN, 0, 0);
	a->pi++;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n((uint32_t *)(a->dbr + 4), ibgda_dbr_value(a->pi), __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	uint64_t db;
	memcpy(&db, w, 8);
	__atomic_store_n(a->reg, db, __ATOMIC_RELEASE);
}

int main(int argc, char **argv)
{
	if (argc != 1 && (argc != 3 || strcmp(argv[1], "--rounds")))
		DIE(2, "usage: emu_bfreg_client [--rounds N]");
	int rounds = argc == 3 ? atoi(argv[2]) : 200;
	setvbuf(stdout, NULL, _IOLBF, 0);
	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	CHECK(list && ndev > 0, "no RDMA device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_port_attr port;
	CHECK(!ibv_query_port(ctx, 1, &port), "query_port");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	uint8_t *buf = aligned_alloc(4096, 0x4000);
	CHECK(pd && buf, "pd/buffer");
	memset(buf, 0, 0x4000);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 0x4000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_cq *cq_a = ibv_create_cq(ctx, 64, NULL, NULL, 0), *cq_b = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(mr && cq_a && cq_b, "mr/cq");
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 512, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	qa.send_cq = qa.recv_cq = cq_a;
	struct ibv_qp *qp_a = ibv_create_qp(pd, &qa);
	qa.send_cq = qa.recv_cq = cq_b;
	struct ibv_qp *qp_b = ibv_create_qp(pd, &qa);
	CHECK(qp_a && qp_b, "create_qp");
	CHECK(!rc_to_init(qp_a) && !rc_to_init(qp_b), "INIT");
	CHECK(!rc_to_rtr_rts(qp_a, qp_b->qp_num, port.lid, 1) && !rc_to_rtr_rts(qp_b, qp_a->qp_num, port.lid, 1),
	      "RTR/RTS");

	struct mlx5dv_qp dq = {0};
	struct mlx5dv_cq dc = {0};
	struct mlx5dv_obj o = {.qp = {.in = qp_a, .out = &dq}, .cq = {.in = cq_a, .out = &dc}};
	CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ), "init_obj A");
	CHECK(dq.sq.stride == 64 && dc.cqe_size == 64, "A's geometry");
	struct dv_qp a = {dq.sq.buf, (uint8_t *)dq.dbrec, dc.buf, (uint8_t *)dc.dbrec, dq.bf.reg, dq.sq.wqe_cnt,
			  dc.cqe_cnt, 0, 0};
	struct ibv_sge sge = {(uintptr_t)(buf + SRC_B), LEN, mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)(buf + DST_B);
	wr.wr.rdma.rkey = mr->rkey;

	for (int i = 0; i <= rounds; i++) {
		memset(buf + SRC_A, 0x40 + (i & 0x3f), LEN);
		memset(buf + SRC_B, 0x80 + (i & 0x3f), LEN);
		ring_write(&a, qp_a->qp_num, buf, mr);
		if (i == rounds) { /* A alone, last: its completion means its last doorbell reached the NIC */
			wait_dv_cqe(&a);
			break;
		}
		struct ibv_send_wr *bad = NULL; /* A rung, and at once B posted */
		wr.wr_id = (uint64_t)i;
		if (ibv_post_send(qp_b, &wr, &bad))
			DIE(1, "post_send B round %d", i);
		wait_dv_cqe(&a);
		wait_wc(cq_b);
		if (buf[DST_A] != (uint8_t)(0x40 + (i & 0x3f)) || buf[DST_B + LEN - 1] != (uint8_t)(0x80 + (i & 0x3f)))
			DIE(1, "round %d: data", i);
	}
	printf("BFREG rounds=%d\n", rounds);
	CHECK(!ibv_destroy_qp(qp_a) && !ibv_destroy_qp(qp_b) && !ibv_destroy_cq(cq_a) && !ibv_destroy_cq(cq_b) &&
	      !ibv_dereg_mr(mr) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "teardown");
	ibv_free_device_list(list);
	free(buf);
	printf("RESULT OK\n");
	return 0;
}
