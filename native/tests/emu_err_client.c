/* emu_err_client -- verbs-level checks of the emulated HCA: completion
 * contents and error completions.  Plain verbs (ibv_post_send & co), so the
 * emulator's WQE writer, NIC and CQE reader are all on the path.
 *
 *   emu_err_client --checks
 *       loopback QP pairs in one process: SEND/RECV (+imm), WRITE_WITH_IMM,
 *       READ, FETCH_ADD, CMP_SWAP (opcode/byte_len/wr_id/imm/values), then
 *       bad rkey, out-of-range, missing remote access -> IBV_WC_REM_ACCESS_ERR
 *       and flush of the following WR, bad lkey -> IBV_WC_LOC_PROT_ERR,
 *       SEND larger than the receive buffer -> REM_INV_REQ_ERR / LOC_LEN_ERR,
 *       post_send in INIT -> EINVAL, RESET->RTR -> EINVAL; a QP destroyed
 *       or reset with completions unpolled leaves none in a shared CQ.
 *   emu_err_client --survivor DIR | --victim DIR
 *       two processes connected through files in DIR; the victim keeps the
 *       connection busy until killed; the survivor keeps RDMA writes and
 *       receives outstanding and must see error completions (not hang).
 * Prints "RESULT OK" / "RESULT FAIL ..."; every wait is bounded.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "file_exchange.h"
#include "rc_qp.h"

static int fails;
#define EXPECT(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __func__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
#define DIE(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); exit(2); } while (0)

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr, *mr_ro; /* mr: all access; mr_ro: local only */
	uint8_t *buf, *buf_ro;
	int shared_cq; /* cq is another side's */
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static uint16_t my_lid;

/* a side on its own CQ, or (cq given) on another side's */
static void mk_side_on(struct side *s, struct ibv_cq *cq)
{
	s->shared_cq = cq != NULL;
	s->cq = cq ? cq : ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
						.max_inline_data = 64 } };
	s->qp = ibv_create_qp(pd, &ia);
	s->buf = aligned_alloc(4096, 65536);
	s->buf_ro = aligned_alloc(4096, 4096);
	memset(s->buf, 0, 65536);
	memset(s->buf_ro, 0x5a, 4096);
	s->mr = ibv_reg_mr(pd, s->buf, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					     IBV_ACCESS_REMOTE_ATOMIC);
	s->mr_ro = ibv_reg_mr(pd, s->buf_ro, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!s->cq || !s->qp || !s->mr || !s->mr_ro)
		DIE("setup failed (%s)", strerror(errno));
}

static void mk_side(struct side *s)
{
	mk_side_on(s, NULL);
}

static void rm_side(struct side *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	if (!s->shared_cq)
		ibv_destroy_cq(s->cq);
	ibv_dereg_mr(s->mr);
	ibv_dereg_mr(s->mr_ro);
	free(s->buf);
	free(s->buf_ro);
}

static void connect_pair(struct side *a, struct side *b)
{
	if (rc_to_init(a->qp) || rc_to_init(b->qp) || rc_to_rtr_rts(a->qp, b->qp->qp_num, my_lid, 1) ||
	    rc_to_rtr_rts(b->qp, a->qp->qp_num, my_lid, 1))
		DIE("connect failed");
}

static int poll1(struct ibv_cq *cq, struct ibv_wc *wc, double tmo)
{
	double t0 = now_s();
	while (now_s() - t0 < tmo) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			return -1;
		if (n == 1)
			return 1;
		usleep(50);
	}
	return 0;
}

/* post one WR: opcode, local sge, remote addr/rkey */
static int post(struct side *s, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr, uint32_t len, uint32_t lkey,
		uint64_t raddr, uint32_t rkey, uint32_t imm, uint64_t cmp_add, uint64_t swap)
{
	struct ibv_sge sge = { (uint64_t)(uintptr_t)laddr, len, lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = htonl(imm) }, *bad;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = cmp_add;
		wr.wr.atomic.swap = swap;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(s->qp, &wr, &bad);
}

static int post_recv(struct side *s, uint64_t wr_id, void *addr, uint32_t len)
{
	struct ibv_sge sge = { (uint64_t)(uintptr_t)addr, len, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(s->qp, &wr, &bad);
}

static void good_path(void)
{
	struct side a, b;
	mk_side(&a);
	mk_side(&b);
	connect_pair(&a, &b);
	struct ibv_wc wc;
	/* SEND with immediate, 3000 bytes (not inline) */
	for (int i = 0; i < 3000; i++)
		a.buf[i] = (uint8_t)(i * 3);
	EXPECT(!post_recv(&b, 77, b.buf + 8192, 4096), "post_recv");
	EXPECT(!post(&a, IBV_WR_SEND_WITH_IMM, 11, a.buf, 3000, a.mr->lkey, 0, 0, 0x1234abcd, 0, 0), "post send");
	EXPECT(poll1(a.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 11,
	       "send completion status %d opcode %d wr_id %llu", wc.status, wc.opcode, (unsigned long long)wc.wr_id);
	EXPECT(poll1(b.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 77 &&
		       wc.byte_len == 3000 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x1234abcd &&
		       wc.src_qp == a.qp->qp_num && wc.qp_num == b.qp->qp_num,
	       "recv completion status %d opcode %d wr_id %llu len %u imm 0x%x", wc.status, wc.opcode,
	       (unsigned long long)wc.wr_id, wc.byte_len, ntohl(wc.imm_data));
	EXPECT(!memcmp(a.buf, b.buf + 8192, 3000), "send payload differs");
	/* RDMA WRITE with immediate consumes a receive */
	EXPECT(!post_recv(&b, 78, b.buf + 16384, 16), "post_recv");
	EXPECT(!post(&a, IBV_WR_RDMA_WRITE_WITH_IMM, 12, a.buf, 512, a.mr->lkey, (uint64_t)(uintptr_t)(b.buf + 20000),
		     b.mr->rkey, 0x55, 0, 0), "post write imm");
	EXPECT(poll1(a.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 12,
	       "write completion");
	EXPECT(poll1(b.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		       wc.wr_id == 78 && ntohl(wc.imm_data) == 0x55 && wc.byte_len == 512,
	       "write-imm recv completion opcode %d len %u", wc.opcode, wc.byte_len);
	EXPECT(!memcmp(a.buf, b.buf + 20000, 512), "write payload differs");
	/* RDMA READ */
	for (int i = 0; i < 2048; i++)
		b.buf[30000 + i] = (uint8_t)(i ^ 0x3c);
	EXPECT(!post(&a, IBV_WR_RDMA_READ, 13, a.buf + 40000, 2048, a.mr->lkey, (uint64_t)(uintptr_t)(b.buf + 30000),
		     b.mr->rkey, 0, 0, 0), "post read");
	EXPECT(poll1(a.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.wr_id == 13 &&
		       wc.byte_len == 2048, "read completion status %d len %u", wc.status, wc.byte_len);
	EXPECT(!memcmp(a.buf + 40000, b.buf + 30000, 2048), "read data differs");
	/* ATOMICs */
	uint64_t v = 40;
	memcpy(b.buf + 48000, &v, 8);
	EXPECT(!post(&a, IBV_WR_ATOMIC_FETCH_AND_ADD, 14, a.buf + 50000, 8, a.mr->lkey, (uint64_t)(uintptr_t)(b.buf + 48000),
		     b.mr->rkey, 0, 2, 0), "post fa");
	EXPECT(poll1(a.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD && wc.wr_id == 14,
	       "fa completion");
	EXPECT(!post(&a, IBV_WR_ATOMIC_CMP_AND_SWP, 15, a.buf + 50008, 8, a.mr->lkey, (uint64_t)(uintptr_t)(b.buf + 48000),
		     b.mr->rkey, 0, 42, 99), "post cs");
	EXPECT(poll1(a.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP && wc.wr_id == 15,
	       "cs completion");
	uint64_t r1, r2, fin;
	memcpy(&r1, a.buf + 50000, 8);
	memcpy(&r2, a.buf + 50008, 8);
	memcpy(&fin, b.buf + 48000, 8);
	EXPECT(r1 == 40 && r2 == 42 && fin == 99, "atomics returned %llu %llu final %llu", (unsigned long long)r1,
	       (unsigned long long)r2, (unsigned long long)fin);
	printf("CHECK good_path done\n");
	rm_side(&a);
	rm_side(&b);
}

/* one remote-error scenario: expect `st` for the WR and WR_FLUSH_ERR for the next */
static void remote_error(const char *name, enum ibv_wr_opcode op, int which, enum ibv_wc_status st)
{
	struct side a, b;
	mk_side(&a);
	mk_side(&b);
	connect_pair(&a, &b);
	uint64_t raddr = (uint64_t)(uintptr_t)b.buf;
	uint32_t rkey = b.mr->rkey;
	if (which == 0)
		rkey ^= 0x7700; /* bad rkey */
	else if (which == 1)
		raddr += 65536 - 16; /* runs past the end of the MR */
	else if (which == 2) {
		raddr = (uint64_t)(uintptr_t)b.buf_ro; /* MR without remote access */
		rkey = b.mr_ro->rkey;
	}
	EXPECT(!post(&a, op, 100, a.buf, op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : 256, a.mr->lkey, raddr, rkey, 0, 1, 0),
	       "post");
	EXPECT(!post(&a, IBV_WR_RDMA_WRITE, 101, a.buf, 8, a.mr->lkey, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, 0, 0, 0),
	       "post 2");
	struct ibv_wc wc;
	int n = poll1(a.cq, &wc, 5);
	EXPECT(n == 1 && wc.status == st && wc.wr_id == 100, "%s: got n=%d status %s (%d) wr_id %llu", name, n,
	       n == 1 ? ibv_wc_status_str(wc.status) : "-", n == 1 ? (int)wc.status : -1, (unsigned long long)wc.wr_id);
	n = poll1(a.cq, &wc, 5);
	EXPECT(n == 1 && wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 101, "%s: second WR n=%d status %d", name, n,
	       n == 1 ? (int)wc.status : -1);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qia);
	EXPECT(qa.qp_state == IBV_QPS_ERR, "%s: QP state %d after error", name, qa.qp_state);
	printf("CHECK %s -> %s\n", name, ibv_wc_status_str(st));
	rm_side(&a);
	rm_side(&b);
}

static void local_errors(void)
{
	struct side a, b;
	mk_side(&a);
	mk_side(&b);
	struct ibv_wc wc;
	/* posting before RTS / invalid transition */
	EXPECT(rc_to_init(a.qp) == 0, "to_init");
	EXPECT(post(&a, IBV_WR_RDMA_WRITE, 1, a.buf, 8, a.mr->lkey, 0, 0, 0, 0, 0) == EINVAL, "post in INIT must be EINVAL");
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_RTS };
	EXPECT(ibv_modify_qp(b.qp, &at, IBV_QP_STATE) == EINVAL, "RESET->RTS must be EINVAL");
	struct ibv_qp_attr rtr = { .qp_state = IBV_QPS_RTR };
	EXPECT(ibv_modify_qp(a.qp, &rtr, IBV_QP_STATE) == EINVAL, "INIT->RTR without attrs must be EINVAL");
	EXPECT(rc_to_init(b.qp) == 0, "to_init b");
	EXPECT(!rc_to_rtr_rts(a.qp, b.qp->qp_num, my_lid, 1) && !rc_to_rtr_rts(b.qp, a.qp->qp_num, my_lid, 1), "connect");
	/* bad lkey -> local protection error */
	EXPECT(!post(&a, IBV_WR_RDMA_WRITE, 2, a.buf, 64, a.mr->lkey ^ 0x3300, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, 0, 0, 0),
	       "post");
	int n = poll1(a.cq, &wc, 5);
	EXPECT(n == 1 && wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == 2, "bad lkey: n=%d status %d", n,
	       n == 1 ? (int)wc.status : -1);
	printf("CHECK bad lkey -> %s\n", ibv_wc_status_str(IBV_WC_LOC_PROT_ERR));
	rm_side(&a);
	rm_side(&b);
	/* SEND larger than the posted receive */
	mk_side(&a);
	mk_side(&b);
	connect_pair(&a, &b);
	EXPECT(!post_recv(&b, 9, b.buf, 100), "post_recv");
	EXPECT(!post(&a, IBV_WR_SEND, 3, a.buf, 1000, a.mr->lkey, 0, 0, 0, 0, 0), "post send");
	n = poll1(a.cq, &wc, 5);
	/* requester and responder share nothing but the fabric: the order of the two CQEs on a shared CQ is free */
	int seen_req = 0, seen_resp = 0;
	for (int k = 0; k < 2 && n == 1; k++) {
		if (wc.wr_id == 3)
			seen_req = wc.status == IBV_WC_REM_INV_REQ_ERR;
		if (wc.wr_id == 9)
			seen_resp = wc.status == IBV_WC_LOC_LEN_ERR;
		if (k == 0)
			n = poll1(wc.wr_id == 3 ? b.cq : a.cq, &wc, 5);
	}
	EXPECT(seen_req && seen_resp, "oversized send: requester REM_INV_REQ_ERR %d, responder LOC_LEN_ERR %d", seen_req,
	       seen_resp);
	printf("CHECK oversized send -> %s / %s\n", ibv_wc_status_str(IBV_WC_REM_INV_REQ_ERR),
	       ibv_wc_status_str(IBV_WC_LOC_LEN_ERR));
	rm_side(&a);
	rm_side(&b);
}

/* A QP destroyed (or moved to RESET) with completions not yet polled: its
 * CQEs leave the CQ it shares with another QP, as with rdma-core's mlx5
 * (mlx5_destroy_qp, mlx5_modify_qp -> __mlx5_cq_clean); the other QP's stay,
 * in order.  Before, ibv_poll_cq returned them with wr_id 0 (libfabric's
 * verbs provider took that as a pointer, fi_pingpong verbs;ofi_rxd). */
static void cq_clean(int reset)
{
	struct side a, b, c, e;
	mk_side(&a);
	mk_side(&b);
	mk_side(&c);
	mk_side_on(&e, b.cq);
	connect_pair(&a, &b);
	connect_pair(&c, &e);
	struct ibv_wc wc;
	for (int i = 0; i < 3; i++) {
		EXPECT(!post_recv(&b, 100 + i, b.buf + 1024 * i, 1024), "post_recv b");
		EXPECT(!post(&a, IBV_WR_SEND, 10 + i, a.buf, 64, a.mr->lkey, 0, 0, 0, 0, 0), "post send a");
	}
	/* a's send completions come with the ACKs, after b's receive CQEs are written */
	for (int i = 0; i < 3; i++)
		EXPECT(poll1(a.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 + (uint64_t)i,
		       "send %d completion", i);
	EXPECT(!post_recv(&e, 200, e.buf, 1024), "post_recv e");
	EXPECT(!post(&c, IBV_WR_SEND, 20, c.buf, 32, c.mr->lkey, 0, 0, 0, 0, 0), "post send c");
	EXPECT(poll1(c.cq, &wc, 5) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 20, "send c completion");
	/* b's CQ: 3 receive CQEs of b, then e's */
	uint32_t bqpn = b.qp->qp_num;
	if (reset) {
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_RESET };
		EXPECT(ibv_modify_qp(b.qp, &at, IBV_QP_STATE) == 0, "b -> RESET");
	} else {
		EXPECT(ibv_destroy_qp(b.qp) == 0, "destroy b");
		b.qp = NULL;
	}
	int n = poll1(b.cq, &wc, 5);
	EXPECT(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 200 &&
		       wc.qp_num == e.qp->qp_num && wc.byte_len == 32,
	       "after %s of qp 0x%x: n=%d wr_id %llu qp 0x%x (want e's receive: wr_id 200, qp 0x%x)",
	       reset ? "RESET" : "destroy", bqpn, n, n == 1 ? (unsigned long long)wc.wr_id : 0ull,
	       n == 1 ? wc.qp_num : 0, e.qp->qp_num);
	n = ibv_poll_cq(b.cq, 1, &wc);
	EXPECT(n == 0, "a completion of qp 0x%x is left: n=%d wr_id %llu qp 0x%x", bqpn, n,
	       n == 1 ? (unsigned long long)wc.wr_id : 0ull, n == 1 ? wc.qp_num : 0);
	printf("CHECK %s with completions unpolled -> its CQEs leave the shared CQ\n", reset ? "RESET" : "destroy_qp");
	rm_side(&e);
	rm_side(&c);
	rm_side(&b);
	rm_side(&a);
}

/* ---- peer death ------------------------------------------------------------- */
static void put_file(const char *dir, const char *name, const char *text)
{
	if (xchg_put(dir, name, text))
		DIE("cannot write %s/%s", dir, name);
}

static void get_file(const char *dir, const char *name, char *buf, size_t n)
{
	if (xchg_get(dir, name, buf, n, 10))
		DIE("timeout waiting for %s/%s", dir, name);
}

#define RECV_ID (1ull << 40)
static int peer_mode(const char *dir, int survivor)
{
	struct side s;
	mk_side(&s);
	char txt[256];
	snprintf(txt, sizeof txt, "%u %u %u %llu\n", my_lid, s.qp->qp_num, s.mr->rkey, (unsigned long long)(uintptr_t)s.buf);
	put_file(dir, survivor ? "survivor" : "victim", txt);
	get_file(dir, survivor ? "victim" : "survivor", txt, sizeof txt);
	unsigned lid, qpn, rkey;
	unsigned long long addr;
	if (sscanf(txt, "%u %u %u %llu", &lid, &qpn, &rkey, &addr) != 4)
		DIE("bad info");
	if (rc_to_init(s.qp))
		DIE("to_init");
	for (int i = 0; i < 8; i++)
		if (post_recv(&s, RECV_ID + i, s.buf + 32768 + 1024 * i, 1024))
			DIE("post_recv");
	if (rc_to_rtr_rts(s.qp, qpn, (uint16_t)lid, 1))
		DIE("connect");
	put_file(dir, survivor ? "survivor.ready" : "victim.ready", "1\n");
	get_file(dir, survivor ? "victim.ready" : "survivor.ready", txt, sizeof txt);
	printf("CONNECTED qpn=0x%x peer lid=%u qpn=0x%x\n", s.qp->qp_num, lid, qpn);
	double t0 = now_s();
	uint64_t ops = 0, outstanding = 0;
	struct ibv_wc wc;
	int errs = 0, recv_flushed = 0;
	enum ibv_wc_status first_err = IBV_WC_SUCCESS;
	while (now_s() - t0 < 20) {
		if (outstanding < 4 && !errs) {
			if (post(&s, IBV_WR_RDMA_WRITE, ops, s.buf, 4096, s.mr->lkey, addr, rkey, 0, 0, 0) == 0)
				outstanding++;
			ops++;
		}
		int n = ibv_poll_cq(s.cq, 1, &wc);
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS) {
				if (!errs)
					first_err = wc.status;
				errs++;
				if (wc.wr_id >= RECV_ID)
					recv_flushed++;
			}
			if (wc.wr_id < RECV_ID)
				outstanding--;
			if (errs && recv_flushed == 8 && outstanding == 0)
				break;
		} else {
			usleep(100);
		}
		if (!survivor && ops == 200) {
			printf("VICTIM busy\n");
			fflush(stdout);
		}
	}
	if (!survivor) {
		printf("RESULT FAIL victim was not killed\n");
		return 1;
	}
	printf("SURVIVOR ops=%llu errors=%d first_error=%s recv_flushed=%d after=%.2fs\n", (unsigned long long)ops, errs,
	       ibv_wc_status_str(first_err), recv_flushed, now_s() - t0);
	if (!errs || (first_err != IBV_WC_RETRY_EXC_ERR && first_err != IBV_WC_WR_FLUSH_ERR) || recv_flushed != 8) {
		printf("RESULT FAIL no proper error completions\n");
		return 1;
	}
	printf("RESULT OK\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		DIE("no device");
	ctx = ibv_open_device(l[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		DIE("open/pd");
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		DIE("query_port");
	my_lid = pa.lid;
	if (argc == 3 && !strcmp(argv[1], "--survivor"))
		return peer_mode(argv[2], 1);
	if (argc == 3 && !strcmp(argv[1], "--victim"))
		return peer_mode(argv[2], 0);
	if (argc != 2 || strcmp(argv[1], "--checks"))
		DIE("usage: --checks | --survivor DIR | --victim DIR");
	good_path();
	remote_error("bad rkey WRITE", IBV_WR_RDMA_WRITE, 0, IBV_WC_REM_ACCESS_ERR);
	remote_error("out-of-range WRITE", IBV_WR_RDMA_WRITE, 1, IBV_WC_REM_ACCESS_ERR);
	remote_error("bad rkey READ", IBV_WR_RDMA_READ, 0, IBV_WC_REM_ACCESS_ERR);
	remote_error("READ without remote access", IBV_WR_RDMA_READ, 2, IBV_WC_REM_ACCESS_ERR);
	remote_error("bad rkey FETCH_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD, 0, IBV_WC_REM_ACCESS_ERR);
	local_errors();
	cq_clean(0);
	cq_clean(1);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	if (fails) {
		printf("RESULT FAIL %d check(s)\n", fails);
		return 1;
	}
	printf("RESULT OK\n");
	return 0;
}
