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
 * The QP pair and its rounds are load_order.h's (lo_pair_*).
 *
 *   trace_dlopen_verbs [iterations] [size]
 * stdout: "QPS a=0x.. b=0x.. lid=N", "BADWR ret=R bad_is_second=1",
 *         "RESULT OK iters=N" (exit 0) or "RESULT FAIL ..." (exit 1).
 */
#include "load_order.h"

/* The functions as NCCL reaches them: dlopen RTLD_LOCAL, dlsym on the handle, two by version
 * (dlvsym at IBVERBS_1.1, as NCCL's ibvwrap does for some); or linked (-DST_DIRECT). */
static int load(struct lo_fns *f)
{
#ifdef ST_DIRECT
	LO_FNS_LINKED(*f);
#else
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		RESULT_FAIL("dlopen: %s", dlerror());
	if (lo_fns_from_handle(f, h, NULL))
		return 1;
	*(void **)&f->open_device = dlvsym(h, "ibv_open_device", "IBVERBS_1.1");
	*(void **)&f->create_qp = dlvsym(h, "ibv_create_qp", "IBVERBS_1.1");
	if (!f->open_device || !f->create_qp)
		RESULT_FAIL("dlvsym: %s", dlerror());
#endif
	return 0;
}

/* A chain whose second WR is invalid (too many SGEs): the first one is still posted. */
static void post_bad_chain(struct lo_pair *p)
{
	struct ibv_sge src = {.addr = (uintptr_t)p->buf, .length = p->size, .lkey = p->mr->lkey};
	struct ibv_sge many[4] = {src, src, src, src};
	struct ibv_send_wr w2 = {.wr_id = 9002, .sg_list = many, .num_sge = 4, .opcode = IBV_WR_RDMA_WRITE};
	struct ibv_send_wr w1 = {.wr_id = 9001, .next = &w2, .sg_list = &src, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
	w1.wr.rdma.remote_addr = w2.wr.rdma.remote_addr = (uintptr_t)p->buf + p->size;
	w1.wr.rdma.rkey = w2.wr.rdma.rkey = p->mr->rkey;
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(p->qa, &w1, &bad);
	printf("BADWR ret=%d bad_is_second=%d\n", ret, bad == &w2);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 50;
	uint32_t size = argc > 2 ? (uint32_t)atoi(argv[2]) : 256;
	struct lo_fns f;
	if (load(&f))
		return 1;
	int n = 0;
	struct ibv_device **list = f.get_device_list(&n);
	if (!list || n < 1)
		RESULT_FAIL("no device");
	struct lo_pair p;
	if (lo_pair_open(&f, list[0], size, &p))
		return 1;
	printf("QPS a=0x%x b=0x%x lid=%u\n", p.qa->qp_num, p.qb->qp_num, p.lid);
	for (int i = 0; i < iters; i++)
		if (lo_pair_round(&p, i))
			return 1;
	post_bad_chain(&p);
	if (lo_pair_close(&f, &p))
		return 1;
	f.free_device_list(list);
	printf("RESULT OK iters=%d\n", iters);
	return 0;
}
