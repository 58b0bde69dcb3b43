/* emu_objchurn -- many verbs objects created and destroyed in one process, on
 * the emulated HCA (issue 12 finding 4: the tracer's object-id table).
 *
 *   emu_objchurn [--pds P] [--iters N]
 *
 * Allocates P protection domains and keeps them (so many objects are live at
 * once), then N times: a CQ, an RC QP on PD i % P connected to itself, an MR
 * on that PD, one signalled RDMA WRITE, its completion polled by a second
 * thread (so the object's id is looked up on another thread than the one
 * that created it, whose per-thread cache saw the previous CQ at the same
 * address), then QP, CQ and MR destroyed.  At the end the PDs go.
 * Prints "CHURN iters=N ok=K pds=P" (exit 0 when every write completed).
 *
 *   emu_objchurn --reopen N
 *
 * N contexts in rounds of 60 (the ibv provider's context table holds 64), with one
 * more kept open throughout: each round opens 60, makes a PD, CQ, QP and MR
 * on each with one write polled to completion, then closes them all and
 * takes their freed memory (blocks of the context's size, kept), so the next
 * round's contexts land at new addresses, as those of a long-running program
 * do.  Prints "REOPEN n=N ok=K distinct=D" (D: distinct context addresses).
 */
#include <getopt.h>
#include <malloc.h>
#include <stddef.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "rc_qp.h"

static struct ibv_cq *volatile g_cq;
static sem_t g_go, g_done;
static volatile int g_quit, g_polled;

static void *poller(void *arg)
{
	(void)arg;
	for (;;) {
		sem_wait(&g_go);
		if (g_quit)
			return NULL;
		struct ibv_wc wc;
		int got = 0;
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			int n = ibv_poll_cq(g_cq, 1, &wc);
			if (n > 0) {
				got = wc.status == IBV_WC_SUCCESS;
				break;
			}
			if (n < 0)
				break;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec > 10)
				break;
		}
		g_polled = got;
		sem_post(&g_done);
	}
}

/* One write on a fresh QP of ctx, polled here; 1 when it completed. */
static int one_write(struct ibv_context *ctx, struct ibv_pd *pd, uint16_t lid, char *buf, size_t len)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = cq ? ibv_create_qp(pd, &qa) : NULL;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!qp || !mr || rc_to_init(qp) || rc_to_rtr_rts(qp, qp->qp_num, lid, 1))
		return 0;
	struct ibv_sge sg = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = (uintptr_t)buf + 4096, .rkey = mr->rkey}};
	struct ibv_send_wr *bad;
	int ok = 0;
	if (!ibv_post_send(qp, &wr, &bad)) {
		struct ibv_wc wc;
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n) {
				ok = n > 0 && wc.status == IBV_WC_SUCCESS;
				break;
			}
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec > 10)
				break;
		}
	}
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	return ok;
}

static int reopen(struct ibv_device *dev, int n)
{
	static char buf[8192];
	enum { ROUND = 60 }; /* with the anchor, fewer live contexts than the table holds */
	void **seen = calloc((size_t)n, sizeof *seen);
	int ok = 0, distinct = 0;
	struct ibv_context *anchor = ibv_open_device(dev); /* the emulated NIC stays up between the rounds */
	for (int done = 0; done < n;) {
		struct ibv_context *ctx[ROUND];
		int m = n - done < ROUND ? n - done : ROUND;
		size_t sz = 0;
		for (int i = 0; i < m; i++) {
			ctx[i] = ibv_open_device(dev);
			struct ibv_port_attr pa;
			if (!ctx[i] || ibv_query_port(ctx[i], 1, &pa))
				return 2;
			int dup = 0;
			for (int k = 0; k < distinct && !dup; k++)
				dup = seen[k] == ctx[i];
			if (!dup)
				seen[distinct++] = ctx[i];
			struct ibv_pd *pd = ibv_alloc_pd(ctx[i]);
			ok += pd && one_write(ctx[i], pd, pa.lid, buf, sizeof buf);
			ibv_dealloc_pd(pd);
			/* the emulated context: a calloc'ed block that starts with the verbs_context */
			sz = malloc_usable_size((char *)ctx[i] - offsetof(struct verbs_context, context));
		}
		for (int i = 0; i < m; i++)
			ibv_close_device(ctx[i]);
		/* take the freed contexts' blocks (malloc: the thread cache; calloc, as the emulated HCA
		 * allocates: the rest), so the next round's contexts land elsewhere */
		for (int k = 0; k < 16; k++) {
			void *plug = malloc(sz);
			(void)plug;
		}
		for (int k = 0; k < 2 * ROUND; k++) {
			void *plug = calloc(1, sz);
			(void)plug;
		}
		done += m;
	}
	ibv_close_device(anchor);
	printf("REOPEN n=%d ok=%d distinct=%d\n", n, ok, distinct);
	return ok == n ? 0 : 1;
}

int main(int argc, char **argv)
{
	int npd = 7000, iters = 10500, nreopen = 0;
	static struct option opts[] = {{"pds", required_argument, 0, 'p'}, {"iters", required_argument, 0, 'n'},
				       {"reopen", required_argument, 0, 'r'}, {0, 0, 0, 0}};
	int ch;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (ch == 'p')
			npd = atoi(optarg);
		else if (ch == 'n')
			iters = atoi(optarg);
		else if (ch == 'r')
			nreopen = atoi(optarg);
		else
			return 2;
	}
	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	if (!list || ndev < 1)
		return 2;
	if (nreopen)
		return reopen(list[0], nreopen);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_port_attr pa;
	if (!ctx || ibv_query_port(ctx, 1, &pa))
		return 2;
	struct ibv_pd **pds = calloc((size_t)npd, sizeof *pds);
	for (int i = 0; i < npd; i++)
		if (!(pds[i] = ibv_alloc_pd(ctx))) {
			printf("alloc_pd %d failed\n", i);
			return 2;
		}
	static char buf[8192];
	sem_init(&g_go, 0, 0);
	sem_init(&g_done, 0, 0);
	pthread_t th;
	pthread_create(&th, NULL, poller, NULL);
	int ok = 0;
	for (int i = 0; i < iters; i++) {
		struct ibv_pd *pd = pds[i % npd];
		struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
		struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		struct ibv_qp *qp = cq ? ibv_create_qp(pd, &qa) : NULL;
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!qp || !mr || rc_to_init(qp) || rc_to_rtr_rts(qp, qp->qp_num, pa.lid, 1)) {
			printf("setup %d failed\n", i);
			return 2;
		}
		struct ibv_sge sg = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
		struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED,
					 .wr.rdma = {.remote_addr = (uintptr_t)buf + 4096, .rkey = mr->rkey}};
		struct ibv_send_wr *bad;
		if (ibv_post_send(qp, &wr, &bad)) {
			printf("post %d failed\n", i);
			return 2;
		}
		g_cq = cq;
		sem_post(&g_go);
		sem_wait(&g_done);
		ok += g_polled;
		if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr)) {
			printf("destroy %d failed\n", i);
			return 2;
		}
	}
	g_quit = 1;
	sem_post(&g_go);
	pthread_join(th, NULL);
	for (int i = 0; i < npd; i++)
		ibv_dealloc_pd(pds[i]);
	ibv_close_device(ctx);
	printf("CHURN iters=%d ok=%d pds=%d\n", iters, ok, npd);
	return ok == iters ? 0 : 1;
}
