/* load_order.h -- the verbs work shared by the load-order clients (load_order_client.c and the
 * modules built from load_order_module.c), for tests/test_load_order.py, and by
 * trace_dlopen_verbs.c (its QP pair and rounds).
 *
 * However libibverbs was reached (linked, dlopen'ed by the program, by a module, by a module a
 * module loaded, by name with dlsym/dlvsym on the handle), the same work runs through a table of
 * function pointers: the device list (printed), one context, two RC QPs A and B connected to each
 * other, `iters` rounds of a receive on B and an RDMA WRITE + signalled SEND chain on A polled to
 * completion, then teardown.  Everything printed is deterministic, so a traced run must print
 * exactly what the untraced one printed:
 *
 *   DEVICES n=N name...
 *   RESULT OK iters=N completions=M       (or RESULT FAIL <why>, exit 1)
 *   LOADED <basename>...                  the libibverbs / libmlx5 / module objects loaded, in order
 */
#ifndef LOAD_ORDER_H
#define LOAD_ORDER_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "result_fail.h"

struct lo_fns {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *); /* compat prefix */
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned); /* optional */
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
};

/* The table from a handle: dlsym, or dlvsym at `version` (NCCL's way) when version is set. */
static inline int lo_fns_from_handle(struct lo_fns *f, void *h, const char *version)
{
#define LO_SYM(field, name)                                                                     \
	do {                                                                                    \
		*(void **)&f->field = version ? dlvsym(h, name, version) : dlsym(h, name);      \
		if (!f->field) {                                                                \
			printf("RESULT FAIL dlsym %s: %s\n", name, dlerror());                  \
			return -1;                                                              \
		}                                                                               \
	} while (0)
	LO_SYM(get_device_list, "ibv_get_device_list");
	LO_SYM(free_device_list, "ibv_free_device_list");
	LO_SYM(get_device_name, "ibv_get_device_name");
	LO_SYM(open_device, "ibv_open_device");
	LO_SYM(close_device, "ibv_close_device");
	LO_SYM(query_port, "ibv_query_port");
	LO_SYM(alloc_pd, "ibv_alloc_pd");
	LO_SYM(dealloc_pd, "ibv_dealloc_pd");
	LO_SYM(reg_mr, "ibv_reg_mr");
	LO_SYM(dereg_mr, "ibv_dereg_mr");
	LO_SYM(create_cq, "ibv_create_cq");
	LO_SYM(destroy_cq, "ibv_destroy_cq");
	LO_SYM(create_qp, "ibv_create_qp");
	LO_SYM(modify_qp, "ibv_modify_qp");
	LO_SYM(destroy_qp, "ibv_destroy_qp");
#undef LO_SYM
	/* NCCL cherry-picks this one at its own version, and does without it */
	*(void **)&f->reg_mr_iova2 = version ? dlvsym(h, "ibv_reg_mr_iova2", "IBVERBS_1.8") : NULL;
	return 0;
}

/* Linked: the functions themselves (their names without parentheses: never verbs.h's macros). */
#define LO_FNS_LINKED(f)                                                        \
	do {                                                                    \
		memset(&(f), 0, sizeof(f));                                     \
		(f).get_device_list = (void *)ibv_get_device_list;              \
		(f).free_device_list = ibv_free_device_list;                    \
		(f).get_device_name = ibv_get_device_name;                      \
		(f).open_device = ibv_open_device;                              \
		(f).close_device = ibv_close_device;                            \
		(f).query_port = (void *)ibv_query_port;                        \
		(f).alloc_pd = ibv_alloc_pd;                                    \
		(f).dealloc_pd = ibv_dealloc_pd;                                \
		(f).reg_mr = (void *)ibv_reg_mr;                                \
		(f).dereg_mr = ibv_dereg_mr;                                    \
		(f).create_cq = ibv_create_cq;                                  \
		(f).destroy_cq = ibv_destroy_cq;                                \
		(f).create_qp = ibv_create_qp;                                  \
		(f).modify_qp = ibv_modify_qp;                                  \
		(f).destroy_qp = ibv_destroy_qp;                                \
	} while (0)

static inline double lo_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline int lo_connect(const struct lo_fns *f, struct ibv_qp *qp, uint32_t dest, uint16_t lid)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
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
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Two RC QPs A and B of one context connected to each other, over one buffer of 2 * size bytes
 * (A's source half, B's destination half). */
struct lo_pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	uint8_t *buf;
	uint32_t size;
	uint16_t lid;
};

/* 0, or RESULT FAIL printed and 1. */
static inline int lo_pair_open(const struct lo_fns *f, struct ibv_device *dev, uint32_t size, struct lo_pair *p)
{
	memset(p, 0, sizeof(*p));
	p->size = size;
	p->ctx = f->open_device(dev);
	if (!p->ctx)
		RESULT_FAIL("open_device");
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	if (f->query_port(p->ctx, 1, &pa))
		RESULT_FAIL("query_port");
	p->lid = pa.lid;
	p->pd = f->alloc_pd(p->ctx);
	p->buf = calloc(1, 2 * (size_t)size);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	p->mr = !p->pd ? NULL
	      : f->reg_mr_iova2 ? f->reg_mr_iova2(p->pd, p->buf, 2 * (size_t)size, (uintptr_t)p->buf, (unsigned)access)
				: f->reg_mr(p->pd, p->buf, 2 * (size_t)size, access);
	p->cq = f->create_cq(p->ctx, 256, NULL, NULL, 0);
	if (!p->pd || !p->mr || !p->cq)
		RESULT_FAIL("pd/mr/cq");
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = p->cq;
	ia.recv_cq = p->cq;
	ia.cap.max_send_wr = 64;
	ia.cap.max_recv_wr = 64;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.qp_type = IBV_QPT_RC;
	p->qa = f->create_qp(p->pd, &ia);
	p->qb = f->create_qp(p->pd, &ia);
	if (!p->qa || !p->qb)
		RESULT_FAIL("create_qp");
	if (lo_connect(f, p->qa, p->qb->qp_num, p->lid) || lo_connect(f, p->qb, p->qa->qp_num, p->lid))
		RESULT_FAIL("connect");
	return 0;
}

/* Round i: a receive on B, then on A a chain of an unsignalled RDMA WRITE into B's half and a
 * signalled SEND, polled until both completions came and the bytes arrived.  0, or RESULT FAIL. */
static inline int lo_pair_round(struct lo_pair *p, int i)
{
	uint32_t size = p->size;
	struct ibv_sge src = {.addr = (uintptr_t)p->buf, .length = size, .lkey = p->mr->lkey};
	struct ibv_sge dst = {.addr = (uintptr_t)p->buf + size, .length = size, .lkey = p->mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 1000 + i, .sg_list = &dst, .num_sge = 1}, *rbad;
	if (ibv_post_recv(p->qb, &rwr, &rbad))
		RESULT_FAIL("post_recv %d", i);
	memset(p->buf, i & 0xff, size);
	struct ibv_send_wr send = {.wr_id = i, .sg_list = &src, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr write = {.wr_id = 5000 + i, .next = &send, .sg_list = &src, .num_sge = 1,
				    .opcode = IBV_WR_RDMA_WRITE};
	write.wr.rdma.remote_addr = (uintptr_t)p->buf + size;
	write.wr.rdma.rkey = p->mr->rkey;
	struct ibv_send_wr *bad;
	if (ibv_post_send(p->qa, &write, &bad))
		RESULT_FAIL("post_send %d", i);
	int got = 0;
	double t0 = lo_now();
	while (got < 2) {
		struct ibv_wc wc[4];
		int ne = ibv_poll_cq(p->cq, 4, wc);
		if (ne < 0)
			RESULT_FAIL("poll_cq");
		for (int k = 0; k < ne; k++)
			if (wc[k].status != IBV_WC_SUCCESS)
				RESULT_FAIL("wc status %d wr_id %llu", wc[k].status, (unsigned long long)wc[k].wr_id);
		got += ne;
		if (lo_now() - t0 > 10)
			RESULT_FAIL("timeout at %d", i);
	}
	if (p->buf[size] != (uint8_t)(i & 0xff))
		RESULT_FAIL("data %d", i);
	return 0;
}

static inline int lo_pair_close(const struct lo_fns *f, struct lo_pair *p)
{
	if (f->destroy_qp(p->qa) || f->destroy_qp(p->qb) || f->destroy_cq(p->cq) || f->dereg_mr(p->mr) ||
	    f->dealloc_pd(p->pd) || f->close_device(p->ctx))
		RESULT_FAIL("teardown");
	free(p->buf);
	return 0;
}

/* The work; 0 = RESULT OK printed.  iters 0: the device list only. */
static inline int lo_work(const struct lo_fns *f, int iters)
{
	int n = -1;
	struct ibv_device **list = f->get_device_list(&n);
	printf("DEVICES n=%d", list ? n : -1);
	for (int i = 0; list && i < n; i++)
		printf(" %s", f->get_device_name(list[i]));
	printf("\n");
	if (!list)
		RESULT_FAIL("no device list");
	if (iters == 0 || n < 1) {
		f->free_device_list(list);
		printf("RESULT OK iters=0 completions=0\n");
		return 0;
	}
	struct lo_pair p;
	if (lo_pair_open(f, list[0], 256, &p))
		return 1;
	for (int i = 0; i < iters; i++)
		if (lo_pair_round(&p, i))
			return 1;
	if (lo_pair_close(f, &p))
		return 1;
	f->free_device_list(list);
	printf("RESULT OK iters=%d completions=%d\n", iters, 2 * iters);
	return 0;
}

static inline int lo_print_loaded_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *name = info->dlpi_name ? info->dlpi_name : "";
	const char *base = strrchr(name, '/');
	base = base ? base + 1 : name;
	if (strstr(base, "ibverbs") || strstr(base, "mlx5") || strstr(base, "rdmav") || strstr(base, "lo_") ||
	    strstr(base, "libcuda"))
		printf(" %s", base);
	return 0;
}

/* The objects of interest loaded now, in load order (the tracer's own is not among them). */
static inline void lo_print_loaded(void)
{
	printf("LOADED");
	dl_iterate_phdr(lo_print_loaded_cb, NULL);
	printf("\n");
}

#endif /* LOAD_ORDER_H */
