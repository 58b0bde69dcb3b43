/* hijack_client -- a CPU-played IBGDA client over the emulated HCA and the
 * emulated CUDA driver (native/emu/cuda).
 *
 * NVSHMEM-style setup (reference §5.1): SQ, CQ, DBRs and the data buffers in
 * "GPU memory" (cuMemAlloc) registered as DevX umems / MRs; the QP's UAR
 * registered with the CUDA driver (Portable|DeviceMap|IoMemory) and its
 * device pointer obtained with cuMemHostGetDevicePointer.  CPU threads play
 * the GPU: every access to SQ/CQ/DBR/UAR goes through device pointers and
 * the emulated driver's page table (emucu_*), like a kernel's stores.  The
 * posting sequence is reference §5.4: WQE (ctrl segment first), fence, DBR =
 * BE32(pi & 0xffff), fence, 8-byte doorbell {BE32(pi<<8), BE32(qpn<<8)}.
 *
 *   hijack_client --mode func   [--api direct|dlsym|gpa] [--log FILE]
 *       put+quiet, get+quiet, fetch-add+quiet, ping-pong (one QP pair)
 *   hijack_client --mode stress --threads T --ops N --depth 128 [--maxbatch B]
 *       T GPU threads, each with its own QP, back-to-back doorbells of 1..B
 *       WQEs (coalescing), SQ wrap-around, N operations in total
 *
 * Ground truth (--log): "D qpn pi" per doorbell, "W qpn idx opcode ds raddr
 * rkey len add" per WQE.  Last stdout line: "RESULT OK ..." / "RESULT FAIL".
 */

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emucuda.h"
#include "ibgda_common.h"

#include "cu_driver.h"

typedef CUresult (*reg_fn)(void *, size_t, unsigned);
typedef CUresult (*gdp_fn)(CUdeviceptr *, void *, unsigned);
typedef CUresult (*unreg_fn)(void *);
static reg_fn p_reg = cuMemHostRegister_v2;
static gdp_fn p_gdp = cuMemHostGetDevicePointer_v2;
static unreg_fn p_unreg = cuMemHostUnregister;

#define DIE(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(__VA_ARGS__); } while (0)
#define CU(x) do { CUresult r_ = (x); CHECK(r_ == 0, "%s = %d", #x, r_); } while (0)

static int g_depth = 128, g_threads = 1, g_maxbatch = 8, g_verbose;
static long g_ops = 1000;
static const char *g_mode = "func", *g_api = "direct";
static FILE *g_log;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_cuctx;


#define BUF_BYTES (1u << 20)
#define OFF_READ_SRC 0x80000
#define OFF_ATOMIC   0x90000
#define OFF_SRC      0xa0000
#define OFF_READ_DST 0xc0000
#define OFF_FETCH    0xe0000

struct ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint32_t pdn, lid, srqn, rcqn;
	struct ibv_srq *srq;
	struct ibv_cq *rcq;
	CUdeviceptr buf;           /* data, GPU memory */
	struct ibv_mr *mr;
	CUdeviceptr cq, cq_dbr;    /* GPU memory */
	uint32_t ncqe, cqn, cq_ci;
	struct mlx5dv_devx_umem *cq_umem, *cq_dbr_umem, *wq_umem, *qp_dbr_umem;
	struct mlx5dv_devx_uar *cq_uar, *uar;
	struct mlx5dv_devx_obj *cq_obj, *qp_obj;
	CUdeviceptr wq, qp_dbr;    /* GPU memory */
	CUdeviceptr db;            /* device pointer of the doorbell register */
	uint32_t qpn, nwqebb, pi, done;
	uint64_t ndb, nwqe;
	struct { uint16_t last; uint32_t next; } pend[1024];
	unsigned ph, pt;
};

static struct ibv_context *g_ibctx;

static void ep_setup(struct ep *e)
{
	memset(e, 0, sizeof *e);
	struct ibv_context *ctx = e->ctx = g_ibctx;
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(ctx, 1, &pa), "query_port");
	e->lid = pa.lid;
	CHECK((e->pd = ibv_alloc_pd(ctx)), "alloc_pd");
	CHECK(!ibgda_pdn(e->pd, &e->pdn), "init_obj PD");
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 16, .max_sge = 1}};
	CHECK((e->srq = ibv_create_srq(e->pd, &sa)), "create_srq");
	CHECK(!ibgda_srqn(e->srq, &e->srqn), "init_obj SRQ");
	CHECK((e->rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0)), "create rcq");
	CHECK(!ibgda_cqn(e->rcq, &e->rcqn), "init_obj CQ");

	/* data buffer in GPU memory, registered for RDMA (GPUDirect) */
	CU(cuMemAlloc_v2(&e->buf, BUF_BYTES));
	CU(cuMemsetD8_v2(e->buf, 0, BUF_BYTES));
	e->mr = ibv_reg_mr(e->pd, (void *)(uintptr_t)e->buf, BUF_BYTES,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(e->mr, "reg_mr on GPU memory");

	/* send CQ + its DBR in GPU memory (§5.1 step 5), CQ filled with 0xff */
	e->ncqe = (uint32_t)g_depth;
	CU(cuMemAlloc_v2(&e->cq, e->ncqe * 64));
	CU(cuMemsetD8_v2(e->cq, 0xff, e->ncqe * 64));
	CU(cuMemAlloc_v2(&e->cq_dbr, 64));
	CU(cuMemsetD8_v2(e->cq_dbr, 0, 64));
	e->cq_umem = mlx5dv_devx_umem_reg(ctx, (void *)(uintptr_t)e->cq, e->ncqe * 64, IBV_ACCESS_LOCAL_WRITE);
	e->cq_dbr_umem = mlx5dv_devx_umem_reg(ctx, (void *)(uintptr_t)e->cq_dbr, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->cq_umem && e->cq_dbr_umem, "umem_reg cq");
	uint32_t eqn;
	CHECK(!mlx5dv_devx_query_eqn(ctx, 0, &eqn), "query_eqn");
	CHECK((e->cq_uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC)), "alloc_uar cq");
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	e->cq_obj = ibgda_create_cq(ctx, e->cq_umem->umem_id, e->cq_dbr_umem->umem_id, e->ncqe, e->cq_uar->page_id, eqn, 0,
				    out, &e->cqn);
	CHECK(e->cq_obj, "CREATE_CQ status 0x%x", (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));

	/* QP: UAR, WQ + DBR in GPU memory (§5.1 steps 6, 8) */
	CHECK((e->uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC)), "alloc_uar qp");
	e->nwqebb = (uint32_t)g_depth;
	CU(cuMemAlloc_v2(&e->wq, e->nwqebb * 64));
	CU(cuMemsetD8_v2(e->wq, 0, e->nwqebb * 64));
	CU(cuMemAlloc_v2(&e->qp_dbr, 64));
	CU(cuMemsetD8_v2(e->qp_dbr, 0, 64));
	e->wq_umem = mlx5dv_devx_umem_reg(ctx, (void *)(uintptr_t)e->wq, e->nwqebb * 64, IBV_ACCESS_LOCAL_WRITE);
	e->qp_dbr_umem = mlx5dv_devx_umem_reg(ctx, (void *)(uintptr_t)e->qp_dbr, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->wq_umem && e->qp_dbr_umem, "umem_reg qp");
	e->qp_obj = ibgda_create_qp(ctx, e->pdn, e->uar->page_id, e->srqn, e->cqn, e->rcqn, e->wq_umem->umem_id, e->nwqebb,
				    e->qp_dbr_umem->umem_id, out, &e->qpn);
	CHECK(e->qp_obj, "CREATE_QP status 0x%x", (unsigned)st_devx_get(out, ST_PRM_OUT_STATUS));
}

static int modify(struct ep *e, uint16_t op, uint32_t rqpn, uint32_t rlid)
{
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	return ibgda_modify_qp(e->qp_obj, e->qpn, op, rqpn, rlid, out);
}

static void connect_pair(struct ep *a, struct ep *b)
{
	struct ep *s[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		struct ep *e = s[i], *p = s[!i];
		CHECK(!modify(e, ST_MLX5_CMD_OP_RST2INIT_QP, 0, 0), "RST2INIT");
		CHECK(!modify(e, ST_MLX5_CMD_OP_INIT2RTR_QP, p->qpn, p->lid), "INIT2RTR");
		CHECK(!modify(e, ST_MLX5_CMD_OP_RTR2RTS_QP, 0, 0), "RTR2RTS");
	}
}

/* The UAR as the GPU sees it (§5.1 step 6): registered, then its device pointer. */
static void map_uar(struct ep *e)
{
	CHECK(p_reg(e->uar->reg_addr, 8, 0x01 | 0x02 | 0x04) == 0, "cuMemHostRegister(uar)");
	CHECK(p_gdp(&e->db, e->uar->reg_addr, 0) == 0, "cuMemHostGetDevicePointer(uar)");
	void *behind = emucu_translate(e->db, 8);
	int hij = behind != e->uar->reg_addr;
	printf("DBPTR qpn=0x%x uar=%p dev=0x%llx behind=%p hijacked=%d\n", e->qpn, e->uar->reg_addr,
	       (unsigned long long)e->db, behind, hij);
}

/* ---- the "GPU" side ---------------------------------------------------------- */
static void log_wqe(struct ep *e, uint32_t idx, uint8_t opc, uint32_t ds, uint64_t raddr, uint32_t rkey, uint32_t len,
		    uint64_t add)
{
	if (!g_log)
		return;
	pthread_mutex_lock(&log_lock);
	fprintf(g_log, "W %u %u %u %u %llu %u %u %llu\n", e->qpn, idx & 0xffff, opc, ds, (unsigned long long)raddr, rkey,
		len, (unsigned long long)add);
	pthread_mutex_unlock(&log_lock);
}

/* Write one WQE (ctrl segment first, as NVSHMEM does) into the SQ in GPU memory. */
static void put_wqe(struct ep *e, const uint8_t *w, uint32_t nbb)
{
	uint32_t idx = e->pi;
	for (uint32_t b = 0; b < nbb; b++) {
		CUdeviceptr slot = e->wq + (((idx + b) & (e->nwqebb - 1)) * 64u);
		if (b == 0) {
			emucu_memcpy_to_dev(slot, w, 16);
			emucu_memcpy_to_dev(slot + 16, w + 16, 48);
		} else
			emucu_memcpy_to_dev(slot, w + 64 * b, 64);
	}
	e->pi += nbb;
	e->nwqe++;
}

static int poll_cq(struct ep *e, uint16_t want, double timeout)
{
	double t0 = ibgda_now_s();
	for (;;) {
		CUdeviceptr c = e->cq + (e->cq_ci & (e->ncqe - 1)) * 64u;
		struct st_mlx5_cqe64 cqe;
		emucu_memcpy_from_dev(&cqe, c, 64);
		if (st_mlx5_cqe_valid(&cqe, e->cq_ci, e->ncqe)) {
			uint16_t ctr = be16toh(cqe.wqe_counter);
			if (st_mlx5_cqe_opcode(&cqe) != ST_MLX5_CQE_REQ)
				DIE("CQE opcode %u (syndrome 0x%x) qpn 0x%x wqe %u", st_mlx5_cqe_opcode(&cqe),
				    ((struct st_mlx5_err_cqe *)&cqe)->syndrome, e->qpn, ctr);
			e->cq_ci++;
			emucu_store32(e->cq_dbr, ibgda_cq_ci_value(e->cq_ci));
			if (ctr == want)
				return 0;
			continue;
		}
		if (ibgda_now_s() - t0 > timeout)
			DIE("timeout waiting for CQE of wqe %u on qpn 0x%x", want, e->qpn);
		sched_yield();
	}
}

static void reserve(struct ep *e, uint32_t n)
{
	while (e->pi + n - e->done > e->nwqebb) {
		CHECK(e->ph != e->pt, "SQ full with nothing in flight");
		poll_cq(e, e->pend[e->ph % 1024].last, 20.0);
		e->done = e->pend[e->ph % 1024].next;
		e->ph++;
	}
}

static void quiet(struct ep *e)
{
	while (e->ph != e->pt) {
		poll_cq(e, e->pend[e->ph % 1024].last, 20.0);
		e->done = e->pend[e->ph % 1024].next;
		e->ph++;
	}
}

/* §5.4: fence, DBR store, fence, 8-byte doorbell store */
static void ring(struct ep *e, uint16_t last_idx)
{
	emucu_fence_system();
	emucu_store32(e->qp_dbr + 4, ibgda_dbr_value(e->pi));
	emucu_fence_system();
	emucu_store64(e->db, ibgda_db_value(e->pi, e->qpn));
	e->ndb++;
	if (g_log) {
		pthread_mutex_lock(&log_lock);
		fprintf(g_log, "D %u %u\n", e->qpn, e->pi & 0xffff);
		pthread_mutex_unlock(&log_lock);
	}
	e->pend[e->pt % 1024].last = last_idx;
	e->pend[e->pt % 1024].next = e->pi;
	e->pt++;
}

enum { OP_PUT, OP_GET, OP_FA };

/* Build and write one operation; returns its WQE index. */
static uint16_t post(struct ep *e, struct ep *peer, int op, uint32_t loff, uint32_t roff, uint32_t len, uint64_t add,
		     int signal)
{
	uint8_t w[64];
	memset(w, 0, sizeof w);
	uint8_t opc = op == OP_PUT ? ST_MLX5_OPCODE_RDMA_WRITE : op == OP_GET ? ST_MLX5_OPCODE_RDMA_READ : ST_MLX5_OPCODE_ATOMIC_FA;
	reserve(e, 1);
	uint32_t idx = e->pi;
	uint64_t raddr = peer->buf + roff;
	if (op == OP_FA)
		len = 8;
	uint32_t ds = ibgda_build_wqe(w, opc, (uint16_t)idx, e->qpn, signal ? ST_MLX5_WQE_CTRL_CQ_UPDATE : 0, raddr,
				      peer->mr->rkey, e->buf + loff, e->mr->lkey, len, add, 0);
	log_wqe(e, idx, opc, ds, raddr, peer->mr->rkey, len, op == OP_FA ? add : 0);
	put_wqe(e, w, 1);
	return (uint16_t)idx;
}

static uint8_t pat(uint32_t seed, uint32_t i) { return (uint8_t)(seed * 131 + i * 7 + (i >> 8)); }

/* ---- functional mode ---------------------------------------------------------- */
static int run_func(void)
{
	struct ep *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
	ep_setup(a);
	ep_setup(b);
	connect_pair(a, b);
	map_uar(a);
	map_uar(b);
	int fails = 0;
	uint8_t *h = malloc(BUF_BYTES), *h2 = malloc(BUF_BYTES);
	/* source patterns */
	for (uint32_t i = 0; i < 0x10000; i++)
		h[i] = pat(7, i);
	CU(cuMemcpyHtoD_v2(a->buf + OFF_SRC, h, 0x10000));
	for (uint32_t i = 0; i < 0x10000; i++)
		h[i] = pat(9, i);
	CU(cuMemcpyHtoD_v2(b->buf + OFF_READ_SRC, h, 0x10000));
	/* 1. put + quiet: sizes 8 B .. 4 KiB */
	uint32_t roff = 0;
	for (int i = 0; i < 64; i++) {
		uint32_t len = 8u << (i % 10);
		uint16_t idx = post(a, b, OP_PUT, OFF_SRC + (uint32_t)i * 16, roff, len, 0, 1);
		ring(a, idx);
		quiet(a);
		CU(cuMemcpyDtoH_v2(h2, b->buf + roff, len));
		for (uint32_t k = 0; k < len; k++)
			if (h2[k] != pat(7, (uint32_t)i * 16 + k)) {
				fails++;
				printf("PUT %d mismatch at %u\n", i, k);
				break;
			}
		roff += len;
	}
	/* 2. get + quiet */
	for (int i = 0; i < 64; i++) {
		uint32_t len = 16u << (i % 8);
		uint16_t idx = post(a, b, OP_GET, OFF_READ_DST + (uint32_t)i * 64, (uint32_t)(OFF_READ_SRC + i * 32), len, 0, 1);
		ring(a, idx);
		quiet(a);
		CU(cuMemcpyDtoH_v2(h2, a->buf + OFF_READ_DST + (uint32_t)i * 64, len));
		for (uint32_t k = 0; k < len; k++)
			if (h2[k] != pat(9, (uint32_t)i * 32 + k)) {
				fails++;
				printf("GET %d mismatch at %u\n", i, k);
				break;
			}
	}
	/* 3. fetch-add + quiet: fetched values must be the running sums */
	uint64_t sum = 0;
	for (int i = 0; i < 64; i++) {
		uint64_t add = (uint64_t)i * 3 + 1;
		uint16_t idx = post(a, b, OP_FA, OFF_FETCH + (uint32_t)i * 8, OFF_ATOMIC, 8, add, 1);
		ring(a, idx);
		quiet(a);
		uint64_t got;
		CU(cuMemcpyDtoH_v2(&got, a->buf + OFF_FETCH + (uint32_t)i * 8, 8));
		if (got != sum) {
			fails++;
			printf("FA %d fetched %llu want %llu\n", i, (unsigned long long)got, (unsigned long long)sum);
		}
		sum += add;
	}
	uint64_t fin;
	CU(cuMemcpyDtoH_v2(&fin, b->buf + OFF_ATOMIC, 8));
	if (fin != sum) {
		fails++;
		printf("FA total %llu want %llu\n", (unsigned long long)fin, (unsigned long long)sum);
	}
	/* 4. ping-pong: a writes a counter to b, b writes it back, 64 rounds, both sides through hijacked doorbells */
	for (uint32_t r = 1; r <= 64; r++) {
		uint64_t v = r;
		CU(cuMemcpyHtoD_v2(a->buf + OFF_SRC + 0x8000, &v, 8));
		uint16_t idx = post(a, b, OP_PUT, OFF_SRC + 0x8000, 0x70000, 8, 0, 1);
		ring(a, idx);
		quiet(a);
		double t0 = ibgda_now_s();
		while (emucu_load64(b->buf + 0x70000) != v)
			CHECK(ibgda_now_s() - t0 < 10, "ping %u not seen", r);
		emucu_store64(b->buf + OFF_SRC + 0x8000, v); /* b's "GPU" copies it to its source */
		idx = post(b, a, OP_PUT, OFF_SRC + 0x8000, 0x70000, 8, 0, 1);
		ring(b, idx);
		quiet(b);
		t0 = ibgda_now_s();
		while (emucu_load64(a->buf + 0x70000) != v)
			CHECK(ibgda_now_s() - t0 < 10, "pong %u not seen", r);
	}
	printf("STATS doorbells=%llu wqes=%llu hostmapped_stores=%llu\n", (unsigned long long)(a->ndb + b->ndb),
	       (unsigned long long)(a->nwqe + b->nwqe), (unsigned long long)emucu_stat_hostmapped_stores());
	/* teardown in the application's order: unregister, free the UAR */
	CHECK(p_unreg(a->uar->reg_addr) == 0, "unregister a");
	CHECK(p_unreg(b->uar->reg_addr) == 0, "unregister b");
	mlx5dv_devx_obj_destroy(a->qp_obj);
	mlx5dv_devx_obj_destroy(b->qp_obj);
	mlx5dv_devx_free_uar(a->uar);
	mlx5dv_devx_free_uar(b->uar);
	return fails;
}

/* ---- latency mode: put+quiet per operation, timed on the "GPU" thread ---------- */
static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

static int run_lat(void)
{
	struct ep *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
	ep_setup(a);
	ep_setup(b);
	connect_pair(a, b);
	map_uar(a);
	long n = g_ops, warm = g_ops / 10;
	uint64_t *lat = calloc((size_t)n, sizeof *lat);
	for (long i = 0; i < warm + n; i++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		uint16_t idx = post(a, b, OP_PUT, OFF_SRC, 0, 8, 0, 1);
		ring(a, idx);
		quiet(a);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (i >= warm)
			lat[i - warm] = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)(t1.tv_nsec - t0.tv_nsec);
	}
	qsort(lat, (size_t)n, sizeof *lat, cmp_u64);
	printf("LAT n=%ld median_ns=%llu p10_ns=%llu p90_ns=%llu\n", n, (unsigned long long)lat[n / 2],
	       (unsigned long long)lat[n / 10], (unsigned long long)lat[n * 9 / 10]);
	p_unreg(a->uar->reg_addr);
	return 0;
}

/* ---- stress mode ------------------------------------------------------------------ */
struct worker {
	struct ep *a, *b;
	long ops;
	unsigned seed;
	uint64_t fa_sum;
	int fails;
	pthread_t t;
};

static void *stress_thread(void *arg)
{
	struct worker *w = arg;
	struct ep *a = w->a, *b = w->b;
	cuCtxSetCurrent(g_cuctx);
	long done = 0;
	unsigned s = w->seed;
	while (done < w->ops) {
		s = s * 1103515245u + 12345u;
		int nb = 1 + (int)((s >> 16) % (unsigned)g_maxbatch);
		if (nb > w->ops - done)
			nb = (int)(w->ops - done);
		uint16_t last = 0;
		for (int k = 0; k < nb; k++) {
			s = s * 1103515245u + 12345u;
			int op = (int)((s >> 16) % 3);
			uint32_t slot = (uint32_t)((done + k) % 256);
			if (op == OP_PUT)
				last = post(a, b, OP_PUT, OFF_SRC + slot * 64, slot * 256, 8 + ((s >> 8) & 0xf8), 0, k == nb - 1);
			else if (op == OP_GET)
				last = post(a, b, OP_GET, OFF_READ_DST + slot * 256, OFF_READ_SRC + slot * 64, 64, 0, k == nb - 1);
			else {
				uint64_t add = 1 + ((s >> 20) & 7);
				w->fa_sum += add;
				last = post(a, b, OP_FA, OFF_FETCH + slot * 8, OFF_ATOMIC, 8, add, k == nb - 1);
			}
		}
		ring(a, last); /* back-to-back doorbells: the poller may see several as one */
		done += nb;
	}
	quiet(a);
	uint64_t fin;
	CU(cuMemcpyDtoH_v2(&fin, b->buf + OFF_ATOMIC, 8));
	if (fin != w->fa_sum) {
		w->fails++;
		printf("STRESS qpn 0x%x FA total %llu want %llu\n", a->qpn, (unsigned long long)fin,
		       (unsigned long long)w->fa_sum);
	}
	return NULL;
}

static int run_stress(void)
{
	struct worker *w = calloc((size_t)g_threads, sizeof *w);
	for (int t = 0; t < g_threads; t++) {
		w[t].a = calloc(1, sizeof(struct ep));
		w[t].b = calloc(1, sizeof(struct ep));
		ep_setup(w[t].a);
		ep_setup(w[t].b);
		connect_pair(w[t].a, w[t].b);
		map_uar(w[t].a);
		w[t].ops = g_ops / g_threads + (t < g_ops % g_threads);
		w[t].seed = 12345u + (unsigned)t * 7919u;
	}
	double t0 = ibgda_now_s();
	for (int t = 0; t < g_threads; t++)
		pthread_create(&w[t].t, NULL, stress_thread, &w[t]);
	int fails = 0;
	uint64_t ndb = 0, nwqe = 0;
	for (int t = 0; t < g_threads; t++) {
		pthread_join(w[t].t, NULL);
		fails += w[t].fails;
		ndb += w[t].a->ndb;
		nwqe += w[t].a->nwqe;
	}
	double dt = ibgda_now_s() - t0;
	printf("STATS doorbells=%llu wqes=%llu seconds=%.3f ops_per_s=%.0f hostmapped_stores=%llu\n",
	       (unsigned long long)ndb, (unsigned long long)nwqe, dt, nwqe / dt,
	       (unsigned long long)emucu_stat_hostmapped_stores());
	for (int t = 0; t < g_threads; t++) {
		p_unreg(w[t].a->uar->reg_addr);
		mlx5dv_devx_obj_destroy(w[t].a->qp_obj);
		mlx5dv_devx_free_uar(w[t].a->uar);
	}
	return fails;
}

/* ---- how the driver entry points are reached --------------------------------------- */
static void resolve_api(void)
{
	if (!strcmp(g_api, "direct"))
		return;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CHECK(h, "dlopen libcuda.so.1");
	if (!strcmp(g_api, "dlsym")) {
		p_reg = (reg_fn)dlsym(h, "cuMemHostRegister_v2");
		p_gdp = (gdp_fn)dlsym(h, "cuMemHostGetDevicePointer_v2");
		p_unreg = (unreg_fn)dlsym(h, "cuMemHostUnregister");
	} else { /* gpa: the way cudart does it */
		typedef CUresult (*gpa2_fn)(const char *, void **, int, uint64_t, int *);
		typedef CUresult (*gpa1_fn)(const char *, void **, int, uint64_t);
		gpa2_fn gpa2 = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
		gpa1_fn gpa1 = (gpa1_fn)dlsym(h, "cuGetProcAddress");
		CHECK(gpa2 && gpa1, "cuGetProcAddress symbols");
		/* cuGetProcAddress can resolve itself: use the resolved one */
		void *self = NULL;
		int st = -1;
		CHECK(gpa2("cuGetProcAddress", &self, 12000, 0, &st) == 0 && self, "gpa(cuGetProcAddress)");
		gpa2 = (gpa2_fn)self;
		const char *names[] = {"cuMemHostRegister", "cuMemHostGetDevicePointer", "cuMemHostUnregister",
				       "cuPointerGetAttribute", "cuMemAlloc", "cuStreamCreate"};
		for (unsigned i = 0; i < 6; i++)
			for (uint64_t fl = 0; fl < 3; fl++)
				for (int v = 0; v < 3; v++) {
					int ver = v == 0 ? 11040 : v == 1 ? 12000 : 13000;
					void *pfn = NULL;
					CUresult r = v == 0 ? gpa1(names[i], &pfn, ver, fl) : gpa2(names[i], &pfn, ver, fl, &st);
					Dl_info di;
					const char *lib = (pfn && dladdr(pfn, &di) && di.dli_fname) ? di.dli_fname : "?";
					const char *base = strrchr(lib, '/');
					printf("GPA %s ver=%d flags=%llu r=%d lib=%s\n", names[i], ver, (unsigned long long)fl, r,
					       base ? base + 1 : lib);
				}
		void *p = NULL;
		CHECK(gpa2("cuMemHostRegister", &p, 12000, 0, &st) == 0, "gpa reg");
		p_reg = (reg_fn)p;
		CHECK(gpa2("cuMemHostGetDevicePointer", &p, 12000, 2, &st) == 0, "gpa gdp");
		p_gdp = (gdp_fn)p;
		CHECK(gpa2("cuMemHostUnregister", &p, 12000, 1, &st) == 0, "gpa unreg");
		p_unreg = (unreg_fn)p;
	}
	CHECK(p_reg && p_gdp && p_unreg, "driver entry points");
}

int main(int argc, char **argv)
{
	static struct option lo[] = {{"mode", 1, 0, 'm'}, {"api", 1, 0, 'a'}, {"threads", 1, 0, 't'},
				     {"ops", 1, 0, 'n'}, {"depth", 1, 0, 'd'}, {"maxbatch", 1, 0, 'b'},
				     {"log", 1, 0, 'l'}, {"verbose", 0, 0, 'v'}, {0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'm': g_mode = optarg; break;
		case 'a': g_api = optarg; break;
		case 't': g_threads = atoi(optarg); break;
		case 'n': g_ops = atol(optarg); break;
		case 'd': g_depth = atoi(optarg); break;
		case 'b': g_maxbatch = atoi(optarg); break;
		case 'l': g_log = fopen(optarg, "w"); CHECK(g_log, "open log"); break;
		case 'v': g_verbose = 1; break;
		default: return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	CU(cuInit(0));
	int dev;
	CU(cuDeviceGet(&dev, 0));
	CU(cuCtxCreate_v2(&g_cuctx, 0, dev));
	resolve_api();
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n > 0, "no RDMA device (emulated HCA not selected?)");
	CHECK((g_ibctx = ibv_open_device(l[0])), "open_device");
	int fails = !strcmp(g_mode, "stress") ? run_stress() : !strcmp(g_mode, "lat") ? run_lat() : run_func();
	if (g_log)
		fclose(g_log);
	if (fails)
		DIE("%d check(s) failed", fails);
	printf("RESULT OK\n");
	return 0;
}
