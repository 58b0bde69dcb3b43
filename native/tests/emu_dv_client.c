/* emu_dv_client -- the mlx5dv surface UCX uses, checked on its own
 * (tests/test_emu_ucx.py; docs/emulator.md): doorbells the emulated NIC must
 * refuse or flag, BlueFlame copies, async events, CQs.
 *
 * One process, two RC QPs connected to each other over the loopback (the
 * process's own LID), a verbs send CQ.  The sender is driven the way UCX
 * rc_mlx5 drives a verbs QP: mlx5dv_init_obj(QP) gives the SQ ring, the
 * doorbell record and the BlueFlame register, mlx5dv_init_obj(CQ) the CQ
 * ring; the client writes RDMA WRITE WQEs with rdma-core's own inline helpers
 * (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg; the raddr segment through its
 * struct), rings, and polls raw CQEs.  Run with SIGMATRACE_EMU_STATS to read the NIC's counters.
 *
 *   --stale  WQE 0 and 1 rung on bf.reg; then the doorbell of WQE 0 again
 *            (producer index 1, behind the 2 rung before on that register),
 *            then one whose producer index is more than the ring ahead; then
 *            WQE 2.  Expect: no completion for the two bad doorbells,
 *            db_stale_pi = 1, db_pi_overrun = 1, WQE 2 completes.
 *   --bf     needs bf.size 256.  WQE 0 with an identical 64-byte BlueFlame
 *            copy at bf.reg; WQE 1 whose copy at bf.reg ^ 0x100 names another
 *            remote address than the SQ's WQE; WQE 2 with an 8-byte doorbell
 *            on bf.reg.  Expect bf_copies = 1, bf_mismatch = 1, db_only = 1,
 *            and WQE 1's data where the copy (not the SQ) sent it.
 *   --async  the context's async_fd: a blocking ibv_get_async_event waits
 *            until a QP on an SRQ is moved to ERR, then returns
 *            IBV_EVENT_QP_LAST_WQE_REACHED for that QP; made non-blocking, it
 *            fails with EAGAIN and poll() reports nothing (no EOF); the event
 *            of a QP destroyed before it was read is not delivered; and one
 *            read but not yet acknowledged keeps ibv_destroy_qp waiting until
 *            ibv_ack_async_event (rdma-core's events_completed contract).
 *   --cq     ibv_create_cq_ex fails with EOPNOTSUPP (UCX then uses
 *            ibv_create_cq); mlx5dv_create_cq with 64- and 128-byte CQEs
 *            (init_obj: cqe_size, cq_uar; the CQE in the slot's last 64 bytes;
 *            ibv_start_poll), bad sizes and options refused; an arm doorbell
 *            written to cq_uar + 0x20 gives a channel event for the next CQE,
 *            and at once for a CQE already there; mlx5dv_create_qp(DC) fails.
 * Prints "OK <mode>" and exits 0, or a reason and exits 1 (77: no BlueFlame). */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include "rc_qp.h"

#define FAIL(...) do { fprintf(stderr, "emu_dv_client: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CHECK(c, what) do { if (!(c)) FAIL("%s failed", what); } while (0)

enum { BUF = 65536, DST = 32768 };

static struct {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *tx, *rx;
	struct ibv_mr *mr;
	uint8_t *buf;
	struct mlx5dv_qp dq;
	struct mlx5dv_cq dc;
	uint32_t pi, ci;
} g;

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* An RDMA WRITE of 64 bytes from buf[src] to buf[dst] at WQE index idx. */
static void build(uint8_t *w, uint16_t idx, uint32_t src, uint32_t dst)
{
	memset(w, 0, 64);
	mlx5dv_set_ctrl_seg((struct mlx5_wqe_ctrl_seg *)w, idx, MLX5_OPCODE_RDMA_WRITE, 0, g.tx->qp_num,
			    MLX5_WQE_CTRL_CQ_UPDATE, 3, 0, 0);
	struct mlx5_wqe_raddr_seg *ra = (struct mlx5_wqe_raddr_seg *)(w + 16); /* rdma-core has no setter for it */
	ra->raddr = htobe64((uintptr_t)(g.buf + dst));
	ra->rkey = htobe32(g.mr->rkey);
	mlx5dv_set_data_seg((struct mlx5_wqe_data_seg *)(w + 32), 64, g.mr->lkey, (uintptr_t)(g.buf + src));
}

static uint8_t *sq_slot(uint32_t idx)
{
	return (uint8_t *)g.dq.sq.buf + (size_t)(idx & (g.dq.sq.wqe_cnt - 1)) * 64;
}

static void set_dbr(uint32_t pi)
{
	__atomic_thread_fence(__ATOMIC_RELEASE);
	g.dq.dbrec[MLX5_SND_DBR] = htobe32(pi & 0xffff);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static void ring8(void *reg, const void *ctrl)
{
	uint64_t v;
	memcpy(&v, ctrl, 8);
	__atomic_store_n((uint64_t *)reg, v, __ATOMIC_RELEASE);
}

/* A 64-byte BlueFlame copy; the doorbell's 8 bytes last, so that the NIC sees
 * the whole copy when it sees the doorbell. */
static void ring_bf(void *reg, const uint8_t *w)
{
	memcpy((uint8_t *)reg + 8, w + 8, 56);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	ring8(reg, w);
}

/* The next CQE within timeout seconds: its wqe_counter, or -1. */
static int poll_cqe(double timeout)
{
	double t0 = now_s();
	for (;;) {
		struct mlx5_cqe64 *c = (struct mlx5_cqe64 *)((uint8_t *)g.dc.buf +
							     (size_t)(g.ci & (g.dc.cqe_cnt - 1)) * g.dc.cqe_size +
							     (g.dc.cqe_size - 64));
		uint8_t op_own = __atomic_load_n(&c->op_own, __ATOMIC_ACQUIRE);
		if ((op_own >> 4) != MLX5_CQE_INVALID && (op_own & 1) == !!(g.ci & g.dc.cqe_cnt)) {
			if ((op_own >> 4) != MLX5_CQE_REQ)
				FAIL("CQE opcode 0x%x (error?)", op_own >> 4);
			g.ci++;
			g.dc.dbrec[0] = htobe32(g.ci & 0xffffff);
			return be16toh(c->wqe_counter);
		}
		if (now_s() - t0 > timeout)
			return -1;
		usleep(100);
	}
}

static void expect_cqe(uint32_t idx)
{
	int c = poll_cqe(5.0);
	if (c < 0)
		FAIL("no completion for WQE %u", idx);
	if ((uint32_t)c != (idx & 0xffff))
		FAIL("completion for WQE %d, expected %u", c, idx);
}

static void setup(void)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n > 0, "ibv_get_device_list");
	CHECK((g.ctx = ibv_open_device(l[0])), "ibv_open_device");
	ibv_free_device_list(l);
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(g.ctx, 1, &pa), "ibv_query_port");
	CHECK((g.pd = ibv_alloc_pd(g.ctx)), "ibv_alloc_pd");
	CHECK((g.cq = ibv_create_cq(g.ctx, 64, NULL, NULL, 0)), "ibv_create_cq");
	CHECK(posix_memalign((void **)&g.buf, 4096, BUF) == 0, "posix_memalign");
	memset(g.buf, 0, BUF);
	for (int i = 0; i < DST; i++)
		g.buf[i] = (uint8_t)(i * 7 + 1);
	CHECK((g.mr = ibv_reg_mr(g.pd, g.buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)), "ibv_reg_mr");
	struct ibv_qp_init_attr qa = { .send_cq = g.cq, .recv_cq = g.cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK((g.tx = ibv_create_qp(g.pd, &qa)), "ibv_create_qp");
	CHECK((g.rx = ibv_create_qp(g.pd, &qa)), "ibv_create_qp");
	CHECK(!rc_to_init(g.tx) && !rc_to_init(g.rx), "to INIT");
	CHECK(!rc_to_rtr_rts(g.tx, g.rx->qp_num, pa.lid, 1) && !rc_to_rtr_rts(g.rx, g.tx->qp_num, pa.lid, 1), "to RTS");
	struct mlx5dv_obj o;
	memset(&o, 0, sizeof o);
	o.qp.in = g.tx;
	o.qp.out = &g.dq;
	o.cq.in = g.cq;
	o.cq.out = &g.dc;
	CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ), "mlx5dv_init_obj");
	CHECK(g.dq.sq.stride == 64 && g.dq.sq.wqe_cnt >= 16 && g.dq.bf.reg, "init_obj QP values");
	printf("SETUP qpn=0x%x sq_wqebb=%u bf_size=%u cqe_size=%u\n", g.tx->qp_num, g.dq.sq.wqe_cnt, g.dq.bf.size,
	       g.dc.cqe_size);
}

static void post(uint32_t idx, uint32_t src, uint32_t dst)
{
	build(sq_slot(idx), (uint16_t)idx, src, dst);
	set_dbr(idx + 1);
}

static int mode_stale(void)
{
	void *reg = g.dq.bf.reg;
	uint8_t old0[64], bad[64];
	post(0, 0, DST);
	memcpy(old0, sq_slot(0), 64);
	ring8(reg, sq_slot(0));
	expect_cqe(0);
	post(1, 64, DST + 64);
	ring8(reg, sq_slot(1));
	expect_cqe(1);
	/* the doorbell of WQE 0 once more: producer index 1 < 2 */
	ring8(reg, old0);
	if (poll_cqe(0.3) >= 0)
		FAIL("a completion after the stale doorbell");
	/* producer index 2 + ring + 3: more than the ring ahead (no WQE there) */
	build(bad, (uint16_t)(2 + g.dq.sq.wqe_cnt + 2), 0, DST);
	ring8(reg, bad);
	if (poll_cqe(0.3) >= 0)
		FAIL("a completion after the overrunning doorbell");
	/* the QP still works */
	post(2, 128, DST + 128);
	ring8(reg, sq_slot(2));
	expect_cqe(2);
	if (memcmp(g.buf + DST, g.buf, 192))
		FAIL("data of WQEs 0-2 not written");
	printf("OK stale\n");
	return 0;
}

static int mode_bf(void)
{
	if (g.dq.bf.size != 256) {
		printf("SKIP bf.size %u\n", g.dq.bf.size);
		return 77;
	}
	uint8_t *reg0 = g.dq.bf.reg, *reg1 = (uint8_t *)((uintptr_t)g.dq.bf.reg ^ 0x100);
	/* 1: a faithful copy */
	post(0, 0, DST);
	ring_bf(reg0, sq_slot(0));
	expect_cqe(0);
	/* 2: the copy names DST + 2048, the SQ's WQE DST + 1024 */
	uint8_t copy[64];
	post(1, 64, DST + 1024);
	build(copy, 1, 64, DST + 2048);
	ring_bf(reg1, copy);
	expect_cqe(1);
	/* 3: an 8-byte doorbell on a register that holds an older copy */
	post(2, 128, DST + 4096);
	ring8(reg0, sq_slot(2));
	expect_cqe(2);
	if (memcmp(g.buf + DST, g.buf, 64))
		FAIL("WQE 0 (BlueFlame copy) not executed");
	if (memcmp(g.buf + DST + 2048, g.buf + 64, 64))
		FAIL("WQE 1: the BlueFlame copy's write did not land");
	static const uint8_t zero[64];
	if (memcmp(g.buf + DST + 1024, zero, 64))
		FAIL("WQE 1: the SQ's version was executed");
	if (memcmp(g.buf + DST + 4096, g.buf + 128, 64))
		FAIL("WQE 2 (8-byte doorbell) not executed from the SQ");
	printf("OK bf executed=copy\n");
	return 0;
}

/* ---- --async ------------------------------------------------------------- */
static struct ibv_async_event g_ev;
static volatile int g_ev_done;

static void *async_reader(void *arg)
{
	(void)arg;
	if (ibv_get_async_event(g.ctx, &g_ev) == 0)
		g_ev_done = 1;
	else
		g_ev_done = -1;
	return NULL;
}

static struct ibv_qp *g_doomed;
static volatile int g_destroyed;

static void *destroyer(void *arg)
{
	(void)arg;
	g_destroyed = ibv_destroy_qp(g_doomed) == 0 ? 1 : -1;
	return NULL;
}

static int mode_async(void)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(g.pd, &sa);
	CHECK(srq, "ibv_create_srq");
	struct ibv_qp_init_attr qa = { .send_cq = g.cq, .recv_cq = g.cq, .srq = srq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(g.pd, &qa);
	CHECK(qp, "ibv_create_qp (SRQ)");
	CHECK(!rc_to_init(qp), "to INIT");
	pthread_t t;
	CHECK(!pthread_create(&t, NULL, async_reader, NULL), "pthread_create");
	usleep(200000);
	if (g_ev_done)
		FAIL("ibv_get_async_event returned without an event (%d)", g_ev_done);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "modify to ERR");
	for (int i = 0; i < 500 && !g_ev_done; i++)
		usleep(10000);
	if (g_ev_done != 1)
		FAIL("no async event after the QP entered ERR");
	pthread_join(t, NULL);
	if (g_ev.event_type != IBV_EVENT_QP_LAST_WQE_REACHED || g_ev.element.qp != qp)
		FAIL("event %d for %p, expected LAST_WQE_REACHED (%d) for %p", g_ev.event_type, (void *)g_ev.element.qp,
		     IBV_EVENT_QP_LAST_WQE_REACHED, (void *)qp);
	ibv_ack_async_event(&g_ev);
	/* non-blocking: EAGAIN, and the fd is not readable (no EOF) */
	int fl = fcntl(g.ctx->async_fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(g.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "fcntl O_NONBLOCK");
	struct ibv_async_event ev;
	errno = 0;
	if (ibv_get_async_event(g.ctx, &ev) != -1 || errno != EAGAIN)
		FAIL("non-blocking ibv_get_async_event: expected -1/EAGAIN, errno %d", errno);
	struct pollfd pfd = { .fd = g.ctx->async_fd, .events = POLLIN };
	if (poll(&pfd, 1, 50) != 0)
		FAIL("async_fd readable without an event (revents 0x%x)", pfd.revents);
	ibv_destroy_qp(qp);
	/* a QP destroyed before its event was read: the event is not delivered (the kernel drops a destroyed
	 * object's pending events); its record is still in the pipe, so the fd may poll readable once */
	struct ibv_qp *qp2 = ibv_create_qp(g.pd, &qa);
	CHECK(qp2, "ibv_create_qp (SRQ, 2)");
	CHECK(!rc_to_init(qp2), "to INIT (2)");
	CHECK(!ibv_modify_qp(qp2, &a, IBV_QP_STATE), "modify to ERR (2)");
	ibv_destroy_qp(qp2);
	errno = 0;
	if (ibv_get_async_event(g.ctx, &ev) != -1 || errno != EAGAIN)
		FAIL("the event of a destroyed QP was delivered (event %d for %p; errno %d)", ev.event_type,
		     (void *)ev.element.qp, errno);
	/* an event read but not acknowledged: its QP stays alive (ibv_destroy_qp waits) */
	g_doomed = ibv_create_qp(g.pd, &qa);
	CHECK(g_doomed, "ibv_create_qp (SRQ, 3)");
	uint32_t qpn3 = g_doomed->qp_num;
	CHECK(!rc_to_init(g_doomed), "to INIT (3)");
	CHECK(!ibv_modify_qp(g_doomed, &a, IBV_QP_STATE), "modify to ERR (3)");
	CHECK(fcntl(g.ctx->async_fd, F_SETFL, fl) == 0, "fcntl blocking");
	CHECK(ibv_get_async_event(g.ctx, &ev) == 0, "ibv_get_async_event (3)");
	pthread_t d;
	CHECK(!pthread_create(&d, NULL, destroyer, NULL), "pthread_create (destroyer)");
	usleep(200000);
	if (g_destroyed)
		FAIL("ibv_destroy_qp returned (%d) while its event was not acknowledged", g_destroyed);
	if (ev.event_type != IBV_EVENT_QP_LAST_WQE_REACHED || ev.element.qp->qp_num != qpn3)
		FAIL("event %d for QPN 0x%x, expected LAST_WQE_REACHED for 0x%x", ev.event_type, ev.element.qp->qp_num,
		     qpn3);
	ibv_ack_async_event(&ev);
	pthread_join(d, NULL);
	if (g_destroyed != 1)
		FAIL("ibv_destroy_qp after the ack: %d", g_destroyed);
	ibv_destroy_srq(srq);
	printf("OK async event=%d\n", g_ev.event_type);
	return 0;
}

/* ---- --cq ------------------------------------------------------------------ */
static struct ibv_cq_ex *dv_cq(int cqe_size, struct ibv_comp_channel *ch, int *err)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .channel = ch, .comp_vector = 0 };
	struct mlx5dv_cq_init_attr da = { .comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE, .cqe_size = cqe_size };
	errno = 0;
	struct ibv_cq_ex *c = mlx5dv_create_cq(g.ctx, &ca, &da);
	*err = errno;
	return c;
}

/* An RDMA WRITE through ibv_post_send on a QP whose send CQ is cq. */
static void write_via(struct ibv_qp *qp, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)g.buf, 64, g.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)(g.buf + DST);
	wr.wr.rdma.rkey = g.mr->rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send");
}

static struct mlx5_cqe64 *raw_cqe(struct mlx5dv_cq *d, uint32_t i)
{
	return (struct mlx5_cqe64 *)((uint8_t *)d->buf + (size_t)(i & (d->cqe_cnt - 1)) * d->cqe_size + d->cqe_size - 64);
}

static int raw_ready(struct mlx5dv_cq *d, uint32_t ci)
{
	uint8_t op_own = __atomic_load_n(&raw_cqe(d, ci)->op_own, __ATOMIC_ACQUIRE);
	return (op_own >> 4) != MLX5_CQE_INVALID && (op_own & 1) == !!(ci & d->cqe_cnt);
}

static void arm_uar(struct mlx5dv_cq *d, uint32_t sn, uint32_t ci)
{
	uint32_t sn_cmd_ci = ((sn & 3) << 28) | (ci & 0xffffff); /* cmd 0: any CQE */
	d->dbrec[1] = htobe32(sn_cmd_ci);
	uint64_t db = htobe64(((uint64_t)sn_cmd_ci << 32) | d->cqn);
	__atomic_store_n((uint64_t *)((uint8_t *)d->cq_uar + 0x20), db, __ATOMIC_RELEASE);
}

static int wait_event(struct ibv_comp_channel *ch, struct ibv_cq *want, int ms)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	if (poll(&pfd, 1, ms) != 1)
		return 0;
	struct ibv_cq *cq;
	void *ctx;
	CHECK(!ibv_get_cq_event(ch, &cq, &ctx), "ibv_get_cq_event");
	if (cq != want)
		FAIL("event for another CQ");
	ibv_ack_cq_events(cq, 1);
	return 1;
}

static int mode_cq(void)
{
	int err;
	struct ibv_cq_init_attr_ex ex = { .cqe = 16 };
	errno = 0;
	if (ibv_create_cq_ex(g.ctx, &ex) || errno != EOPNOTSUPP)
		FAIL("ibv_create_cq_ex: expected NULL/EOPNOTSUPP, errno %d", errno);
	if (dv_cq(256, NULL, &err) || err != EINVAL)
		FAIL("mlx5dv_create_cq(cqe_size 256): expected EINVAL, errno %d", err);
	{
		struct ibv_cq_init_attr_ex ca = { .cqe = 16 };
		struct mlx5dv_cq_init_attr da = { .comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE,
						  .cqe_comp_res_format = MLX5DV_CQE_RES_FORMAT_HASH };
		errno = 0;
		if (mlx5dv_create_cq(g.ctx, &ca, &da) || errno != EOPNOTSUPP)
			FAIL("mlx5dv_create_cq(compressed): expected EOPNOTSUPP, errno %d", errno);
	}
	{
		struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_DRIVER, .send_cq = g.cq, .recv_cq = g.cq,
						  .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = g.pd };
		struct mlx5dv_qp_init_attr da = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC,
						  .dc_init_attr = { .dc_type = MLX5DV_DCTYPE_DCT, .dct_access_key = 1 } };
		errno = 0;
		if (mlx5dv_create_qp(g.ctx, &qa, &da) || errno != EOPNOTSUPP)
			FAIL("mlx5dv_create_qp(DCT): expected EOPNOTSUPP, errno %d", errno);
	}
	struct ibv_comp_channel *ch = ibv_create_comp_channel(g.ctx);
	CHECK(ch, "ibv_create_comp_channel");
	for (int size = 64; size <= 128; size *= 2) {
		struct ibv_cq_ex *cx = dv_cq(size, ch, &err);
		if (!cx)
			FAIL("mlx5dv_create_cq(cqe_size %d): errno %d", size, err);
		struct ibv_cq *cq = ibv_cq_ex_to_cq(cx);
		struct mlx5dv_cq d;
		struct mlx5dv_obj o = { .cq = { .in = cq, .out = &d } };
		CHECK(!mlx5dv_init_obj(&o, MLX5DV_OBJ_CQ), "mlx5dv_init_obj(CQ)");
		if (d.cqe_size != (uint32_t)size || d.cqe_cnt < 17 || (d.cqe_cnt & (d.cqe_cnt - 1)) || !d.cq_uar || !d.buf)
			FAIL("init_obj(CQ %d): cqe_size %u cqe_cnt %u cq_uar %p", size, d.cqe_size, d.cqe_cnt, d.cq_uar);
		struct ibv_poll_cq_attr pa = { 0 };
		if (ibv_start_poll(cx, &pa) != ENOENT)
			FAIL("ibv_start_poll on an empty CQ: expected ENOENT");
		/* a QP whose send CQ is this one, to the loopback partner */
		struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = g.cq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *qp = ibv_create_qp(g.pd, &qa), *peer = ibv_create_qp(g.pd, &qa);
		CHECK(qp && peer, "ibv_create_qp");
		struct ibv_port_attr port;
		CHECK(!ibv_query_port(g.ctx, 1, &port), "ibv_query_port");
		CHECK(!rc_to_init(qp) && !rc_to_init(peer), "to INIT");
		CHECK(!rc_to_rtr_rts(qp, peer->qp_num, port.lid, 1) && !rc_to_rtr_rts(peer, qp->qp_num, port.lid, 1), "to RTS");
		/* arm (UAR doorbell, ci 0), then a completion: one event */
		arm_uar(&d, 0, 0);
		usleep(20000); /* the NIC samples the arm doorbell */
		write_via(qp, 1);
		if (!wait_event(ch, cq, 3000))
			FAIL("CQ %d: no event for the CQE after arming", size);
		double t0 = now_s();
		while (!raw_ready(&d, 0))
			if (now_s() - t0 > 3)
				FAIL("CQ %d: no CQE in the ring's slot 0", size);
		struct mlx5_cqe64 *c = raw_cqe(&d, 0);
		if ((c->op_own >> 4) != MLX5_CQE_REQ || (be32toh(c->sop_drop_qpn) & 0xffffff) != qp->qp_num)
			FAIL("CQ %d: CQE opcode 0x%x qpn 0x%x", size, c->op_own >> 4, be32toh(c->sop_drop_qpn) & 0xffffff);
		/* arming with ci 0 while that CQE is there: an event at once */
		arm_uar(&d, 1, 0);
		if (!wait_event(ch, cq, 3000))
			FAIL("CQ %d: no event when armed behind a CQE", size);
		/* the verbs view of the same CQE (lazy polling) */
		if (ibv_start_poll(cx, &pa) != 0 || cx->status != IBV_WC_SUCCESS || cx->wr_id != 1 ||
		    ibv_wc_read_opcode(cx) != IBV_WC_RDMA_WRITE)
			FAIL("CQ %d: ibv_start_poll did not return the completion", size);
		ibv_end_poll(cx);
		CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_qp(peer), "ibv_destroy_qp");
		CHECK(!ibv_destroy_cq(cq), "ibv_destroy_cq");
	}
	CHECK(!ibv_destroy_comp_channel(ch), "ibv_destroy_comp_channel");
	printf("OK cq\n");
	return 0;
}

int main(int argc, char **argv)
{
	static const char *modes[] = { "--stale", "--bf", "--async", "--cq" };
	int m = -1;
	for (int i = 0; argc == 2 && i < 4; i++)
		if (!strcmp(argv[1], modes[i]))
			m = i;
	if (m < 0) {
		fprintf(stderr, "usage: emu_dv_client --stale | --bf | --async | --cq\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	setup();
	int r = m == 0 ? mode_stale() : m == 1 ? mode_bf() : m == 2 ? mode_async() : mode_cq();
	ibv_destroy_qp(g.tx);
	ibv_destroy_qp(g.rx);
	ibv_dereg_mr(g.mr);
	ibv_destroy_cq(g.cq);
	ibv_dealloc_pd(g.pd);
	ibv_close_device(g.ctx);
	return r;
}
