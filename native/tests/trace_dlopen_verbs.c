/* trace_dlopen_verbs -- a verbs client that reaches libibverbs the way NCCL
 * does: dlopen("libibverbs.so.1", RTLD_LOCAL) and function pointers from
 * dlsym / dlvsym.  Built with -DST_DIRECT it calls the same functions linked
 * directly (-libverbs), so tests/test_trace_verbs_dlopen.py can check that
 * both builds produce the same trace.
 *
 * One process, one context, two RC QPs A and B connected to each other.
 * Per iteration: one receive posted on B, then a chain of two WRs on A —
 * an unsignalled RDMA WRITE into B's half of the buffer and a signalled
 * SEND — then poll until A's send and B's receive completed.  At the end one
 * chain whose second WR is invalid (too many SGEs): the first is accepted,
 * the call fails with *bad_wr on the second.
 *
 *   trace_dlopen_verbs [iterations] [size]
 * stdout: "QPS a=0x.. b=0x.. lid=N", "BADWR ret=R bad_is_second=1",
 *         "RESULT OK iters=N" (exit 0) or "RESULT FAIL ..." (exit 1).
 */
#define _GNU_SOURCE /* dlvsym */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fns {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *); /* compat prefix */
};

#define FAIL(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); exit(1); } while (0)

static void load(struct fns *f)
{
#ifdef ST_DIRECT
	/* function names without parentheses: never the verbs.h macros */
	f->get_device_list = (void *)ibv_get_device_list;
	f->free_device_list = ibv_free_device_list;
	f->open_device = ibv_open_device;
	f->close_device = ibv_close_device;
	f->alloc_pd = ibv_alloc_pd;
	f->dealloc_pd = ibv_dealloc_pd;
	f->reg_mr = (void *)ibv_reg_mr;
	f->dereg_mr = ibv_dereg_mr;
	f->create_cq = ibv_create_cq;
	f->destroy_cq = ibv_destroy_cq;
	f->create_qp = ibv_create_qp;
	f->modify_qp = ibv_modify_qp;
	f->destroy_qp = ibv_destroy_qp;
	f->query_port = (void *)ibv_query_port;
#else
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		FAIL("dlopen: %s", dlerror());
#define L(field, name)                                      \
	do {                                                \
		*(void **)&f->field = dlsym(h, name);       \
		if (!f->field)                              \
			FAIL("dlsym %s: %s", name, dlerror()); \
	} while (0)
	L(get_device_list, "ibv_get_device_list");
	L(free_device_list, "ibv_free_device_list");
	L(close_device, "ibv_close_device");
	L(alloc_pd, "ibv_alloc_pd");
	L(dealloc_pd, "ibv_dealloc_pd");
	L(reg_mr, "ibv_reg_mr");
	L(dereg_mr, "ibv_dereg_mr");
	L(create_cq, "ibv_create_cq");
	L(destroy_cq, "ibv_destroy_cq");
	L(modify_qp, "ibv_modify_qp");
	L(destroy_qp, "ibv_destroy_qp");
	L(query_port, "ibv_query_port");
#undef L
	/* two by version, as NCCL's ibvwrap does for some */
	*(void **)&f->open_device = dlvsym(h, "ibv_open_device", "IBVERBS_1.1");
	*(void **)&f->create_qp = dlvsym(h, "ibv_create_qp", "IBVERBS_1.1");
	if (!f->open_device || !f->create_qp)
		FAIL("dlvsym: %s", dlerror());
#endif
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void connect_qp(struct fns *f, struct ibv_qp *qp, uint32_t dest, uint16_t lid)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	if (f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		FAIL("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					 IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("RTS");
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 50;
	uint32_t size = argc > 2 ? (uint32_t)atoi(argv[2]) : 256;
	struct fns f;
	load(&f);

	int n = 0;
	struct ibv_device **list = f.get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = f.open_device(list[0]);
	if (!ctx)
		FAIL("open_device");
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	if (f.query_port(ctx, 1, &pa))
		FAIL("query_port");
	struct ibv_pd *pd = f.alloc_pd(ctx);
	uint8_t *buf = calloc(1, 2 * (size_t)size);
	struct ibv_mr *mr = pd ? f.reg_mr(pd, buf, 2 * (size_t)size,
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
	struct ibv_cq *cq = f.create_cq(ctx, 256, NULL, NULL, 0);
	if (!pd || !mr || !cq)
		FAIL("pd/mr/cq");
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.cap.max_send_wr = 64;
	ia.cap.max_recv_wr = 64;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.qp_type = IBV_QPT_RC;
	struct ibv_qp *qa = f.create_qp(pd, &ia);
	struct ibv_qp *qb = f.create_qp(pd, &ia);
	if (!qa || !qb)
		FAIL("create_qp");
	connect_qp(&f, qa, qb->qp_num, pa.lid);
	connect_qp(&f, qb, qa->qp_num, pa.lid);
	printf("QPS a=0x%x b=0x%x lid=%u\n", qa->qp_num, qb->qp_num, pa.lid);

	struct ibv_sge src = {.addr = (uintptr_t)buf, .length = size, .lkey = mr->lkey};
	struct ibv_sge dst = {.addr = (uintptr_t)buf + size, .length = size, .lkey = mr->lkey};
	for (int i = 0; i < iters; i++) {
		struct ibv_recv_wr rwr = {.wr_id = 1000 + i, .sg_list = &dst, .num_sge = 1}, *rbad;
		if (ibv_post_recv(qb, &rwr, &rbad))
			FAIL("post_recv %d", i);
		memset(buf, i & 0xff, size);
		struct ibv_send_wr send = {.wr_id = i, .sg_list = &src, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED};
		struct ibv_send_wr write = {.wr_id = 5000 + i, .next = &send, .sg_list = &src, .num_sge = 1,
					    .opcode = IBV_WR_RDMA_WRITE};
		write.wr.rdma.remote_addr = (uintptr_t)buf + size;
		write.wr.rdma.rkey = mr->rkey;
		struct ibv_send_wr *bad;
		if (ibv_post_send(qa, &write, &bad))
			FAIL("post_send %d", i);
		int got = 0;
		double t0 = now_s();
		while (got < 2) {
			struct ibv_wc wc[4];
			int ne = ibv_poll_cq(cq, 4, wc);
			if (ne < 0)
				FAIL("poll_cq");
			for (int k = 0; k < ne; k++)
				if (wc[k].status != IBV_WC_SUCCESS)
					FAIL("wc status %d wr_id %llu", wc[k].status, (unsigned long long)wc[k].wr_id);
			got += ne;
			if (now_s() - t0 > 10)
				FAIL("timeout at %d", i);
		}
		if (buf[size] != (uint8_t)(i & 0xff))
			FAIL("data %d", i);
	}

	/* a chain with an invalid second WR: the first one is still posted */
	struct ibv_sge many[4] = {src, src, src, src};
	struct ibv_send_wr w2 = {.wr_id = 9002, .sg_list = many, .num_sge = 4, .opcode = IBV_WR_RDMA_WRITE};
	struct ibv_send_wr w1 = {.wr_id = 9001, .next = &w2, .sg_list = &src, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
	w1.wr.rdma.remote_addr = w2.wr.rdma.remote_addr = (uintptr_t)buf + size;
	w1.wr.rdma.rkey = w2.wr.rdma.rkey = mr->rkey;
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(qa, &w1, &bad);
	printf("BADWR ret=%d bad_is_second=%d\n", ret, bad == &w2);

	if (f.destroy_qp(qa) || f.destroy_qp(qb) || f.destroy_cq(cq) || f.dereg_mr(mr) || f.dealloc_pd(pd) ||
	    f.close_device(ctx))
		FAIL("teardown");
	f.free_device_list(list);
	free(buf);
	printf("RESULT OK iters=%d\n", iters);
	return 0;
}
