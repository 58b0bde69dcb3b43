// gpu_ibgda_client -- a real-GPU IBGDA client over the emulated mlx5 HCA.
//
// NVSHMEM-style (reference §5.1, §5.4): SQ, CQ, DBR and data buffers are DevX
// umems / MRs; the QP's UAR register is made GPU-visible with the CUDA driver
// (--api driver: cuMemHostRegister + cuMemHostGetDevicePointer) or the runtime
// (--api runtime: cudaHostRegister + cudaHostGetDevicePointer, which cudart
// resolves through cuGetProcAddress).  A single GPU thread builds each WQE,
// fences, writes the DBR and rings the 8-byte doorbell, then polls the CQE
// (quiet).  Each operation is timed with %globaltimer.
//
// NIC buffers live in pinned, GPU-mapped host memory (NVSHMEM's
// NVSHMEM_IBGDA_FORCE_NIC_BUF_MEMTYPE=hostmem placement, §5.2) because the
// emulated NIC is a CPU thread; with --sq managed the SQ is managed memory
// (device-resident pages, so the tracer's WQE copy is a real DtoH copy).
//
//   gpu_ibgda_client --op put|get|fadd|pingpong --iters N --warmup W
//                    [--api driver|runtime] [--sq host|managed] [--lat FILE] [--log FILE]
// Last stdout line: "RESULT OK median_ns=..." or "RESULT FAIL ...".
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "ibgda_common.h"

#define DIE(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(__VA_ARGS__); } while (0)
#define CUDA(x) do { cudaError_t e_ = (x); CHECK(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_)); } while (0)
#define CUDRV(x) do { CUresult r_ = (x); CHECK(r_ == CUDA_SUCCESS, "%s = %d", #x, (int)r_); } while (0)

static int g_depth = 128;
static const char *g_api = "runtime", *g_sq = "host";

// --- device-visible QP state --------------------------------------------------------
struct dqp {
	uint8_t *wq;            // SQ ring (device view)
	uint8_t *cq;            // CQ ring (device view)
	uint32_t *dbr;          // QP DBR (device view)
	uint32_t *cq_dbr;
	unsigned long long *db; // doorbell register (device pointer from the driver: maybe the proxy)
	uint32_t qpn, nwqebb, ncqe, lkey, rkey;
	uint64_t laddr, raddr;  // NIC-visible data addresses (local, remote)
	uint8_t *lbuf, *rbuf;   // device views of the same data buffers
	uint32_t pi, ci;
};

__device__ __forceinline__ uint64_t gtimer()
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
__device__ __forceinline__ uint32_t bswap32(uint32_t x) { return __byte_perm(x, 0, 0x0123); }
__device__ __forceinline__ uint64_t bswap64(uint64_t x)
{
	return ((uint64_t)bswap32((uint32_t)x) << 32) | bswap32((uint32_t)(x >> 32));
}
__device__ __forceinline__ void st32(void *p, uint32_t v) { *(volatile uint32_t *)p = v; }
__device__ __forceinline__ void st64(void *p, uint64_t v) { *(volatile uint64_t *)p = v; }

enum { OP_PUT = 0, OP_GET = 1, OP_FADD = 2 };

// Build one WQE (ctrl first), fence, DBR, fence, 8-byte doorbell (reference §5.4,
// NIC buffers in host memory -> __threadfence_system()).
__device__ void post_one(dqp *q, int op, uint32_t loff, uint32_t roff, uint32_t len, uint64_t add)
{
	uint32_t idx = q->pi;
	uint8_t *w = q->wq + ((idx & (q->nwqebb - 1)) << 6);
	uint32_t opc = op == OP_PUT ? 0x08 : op == OP_GET ? 0x10 : 0x12;
	uint32_t ds = op == OP_FADD ? 4 : 3;
	st32(w + 0, bswap32(((idx & 0xffff) << 8) | opc));
	st32(w + 4, bswap32((q->qpn << 8) | ds));
	st32(w + 8, 0x08u << 24); // signature 0, dci 0, fm_ce_se = CQ_UPDATE (byte 11), little-endian store
	st32(w + 12, 0);           // imm
	st64(w + 16, bswap64(q->raddr + roff));
	st32(w + 24, bswap32(q->rkey));
	st32(w + 28, 0);
	if (op == OP_FADD) {
		st64(w + 32, bswap64(add));
		st64(w + 40, 0);
		st32(w + 48, bswap32(8));
		st32(w + 52, bswap32(q->lkey));
		st64(w + 56, bswap64(q->laddr + loff));
	} else {
		st32(w + 32, bswap32(len));
		st32(w + 36, bswap32(q->lkey));
		st64(w + 40, bswap64(q->laddr + loff));
	}
	q->pi = idx + 1;
	__threadfence_system();
	st32(q->dbr + 1, bswap32(q->pi & 0xffff));
	__threadfence_system();
	uint64_t v = (uint64_t)bswap32((q->pi & 0xffff) << 8) | ((uint64_t)bswap32(q->qpn << 8) << 32);
	st64(q->db, v);
}

__device__ void quiet(dqp *q)
{
	for (;;) {
		volatile uint8_t *c = q->cq + ((q->ci & (q->ncqe - 1)) << 6);
		uint8_t op_own = c[63];
		if ((op_own >> 4) != 0xf && (op_own & 1) == ((q->ci & q->ncqe) ? 1 : 0)) {
			q->ci++;
			__threadfence_system();
			st32(q->cq_dbr, bswap32(q->ci & 0xffffff));
			if ((op_own >> 4) != 0)
				asm volatile("trap;");
			return;
		}
	}
}

__global__ void run_kernel(dqp *qa, dqp *qb, int op, int iters, int warmup, uint64_t *lat, int *err)
{
	for (int i = 0; i < warmup + iters; i++) {
		uint64_t t0 = gtimer();
		if (op == 3) { // ping-pong: a puts i+1 into b's buffer, b puts it back
			uint64_t v = (uint64_t)i + 1;
			st64(qa->lbuf + 0x100, v);
			__threadfence_system();
			post_one(qa, OP_PUT, 0x100, 0x200, 8, 0);
			quiet(qa);
			while (*(volatile uint64_t *)(qb->lbuf + 0x200) != v) {}
			st64(qb->lbuf + 0x100, v);
			__threadfence_system();
			post_one(qb, OP_PUT, 0x100, 0x200, 8, 0);
			quiet(qb);
			while (*(volatile uint64_t *)(qa->lbuf + 0x200) != v) {}
		} else {
			post_one(qa, op, 0x1000 + (i % 64) * 64, 0x1000 + (i % 64) * 64, 64, 1);
			quiet(qa);
		}
		uint64_t t1 = gtimer();
		if (i >= warmup)
			lat[i - warmup] = t1 - t0;
	}
}

// --- host side ------------------------------------------------------------------------
struct ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint32_t pdn, lid, srqn, rcqn, cqn, qpn;
	struct ibv_srq *srq;
	struct ibv_cq *rcq;
	struct ibv_mr *mr;
	uint8_t *buf, *cq, *cq_dbr, *wq, *qp_dbr; // host addresses (NIC view)
	struct mlx5dv_devx_umem *cq_umem, *cq_dbr_umem, *wq_umem, *qp_dbr_umem;
	struct mlx5dv_devx_uar *cq_uar, *uar;
	struct mlx5dv_devx_obj *cq_obj, *qp_obj;
	dqp d;
};

static void *host_alloc(size_t n, int managed)
{
	void *p;
	if (managed)
		CUDA(cudaMallocManaged(&p, n));
	else
		CUDA(cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable));
	memset(p, 0, n);
	return p;
}
static void *dev_view(void *h, int managed)
{
	if (managed)
		return h;
	void *d;
	CUDA(cudaHostGetDevicePointer(&d, h, 0));
	return d;
}

static void ep_setup(ep *e, struct ibv_context *ctx)
{
	memset(e, 0, sizeof *e);
	e->ctx = ctx;
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(ctx, 1, &pa), "query_port");
	e->lid = pa.lid;
	CHECK((e->pd = ibv_alloc_pd(ctx)), "alloc_pd");
	CHECK(!ibgda_pdn(e->pd, &e->pdn), "init_obj PD");
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof sa);
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 1;
	CHECK((e->srq = ibv_create_srq(e->pd, &sa)), "create_srq");
	CHECK(!ibgda_srqn(e->srq, &e->srqn), "init_obj SRQ");
	CHECK((e->rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0)), "create rcq");
	CHECK(!ibgda_cqn(e->rcq, &e->rcqn), "init_obj CQ");
	int managed = !strcmp(g_sq, "managed");
	e->buf = (uint8_t *)host_alloc(1 << 20, 0);
	e->mr = ibv_reg_mr(e->pd, e->buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(e->mr, "reg_mr");
	unsigned ncqe = (unsigned)g_depth;
	e->cq = (uint8_t *)host_alloc(ncqe * 64, 0);
	memset(e->cq, 0xff, ncqe * 64);
	e->cq_dbr = (uint8_t *)host_alloc(64, 0);
	e->cq_umem = mlx5dv_devx_umem_reg(ctx, e->cq, ncqe * 64, IBV_ACCESS_LOCAL_WRITE);
	e->cq_dbr_umem = mlx5dv_devx_umem_reg(ctx, e->cq_dbr, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->cq_umem && e->cq_dbr_umem, "umem cq");
	uint32_t eqn;
	CHECK(!mlx5dv_devx_query_eqn(ctx, 0, &eqn), "eqn");
	CHECK((e->cq_uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC)), "uar cq");
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	CHECK((e->cq_obj = ibgda_create_cq(ctx, e->cq_umem->umem_id, e->cq_dbr_umem->umem_id, ncqe, e->cq_uar->page_id,
					   eqn, 0, out, &e->cqn)),
	      "CREATE_CQ");
	CHECK((e->uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC)), "uar qp");
	unsigned nw = (unsigned)g_depth;
	e->wq = (uint8_t *)host_alloc(nw * 64, managed);
	e->qp_dbr = (uint8_t *)host_alloc(64, 0);
	e->wq_umem = mlx5dv_devx_umem_reg(ctx, e->wq, nw * 64, IBV_ACCESS_LOCAL_WRITE);
	e->qp_dbr_umem = mlx5dv_devx_umem_reg(ctx, e->qp_dbr, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->wq_umem && e->qp_dbr_umem, "umem qp");
	CHECK((e->qp_obj = ibgda_create_qp(ctx, e->pdn, e->uar->page_id, e->srqn, e->cqn, e->rcqn, e->wq_umem->umem_id, nw,
					   e->qp_dbr_umem->umem_id, out, &e->qpn)),
	      "CREATE_QP");
	e->d.wq = (uint8_t *)dev_view(e->wq, managed);
	e->d.cq = (uint8_t *)dev_view(e->cq, 0);
	e->d.dbr = (uint32_t *)dev_view(e->qp_dbr, 0);
	e->d.cq_dbr = (uint32_t *)dev_view(e->cq_dbr, 0);
	e->d.lbuf = (uint8_t *)dev_view(e->buf, 0);
	e->d.qpn = e->qpn;
	e->d.nwqebb = nw;
	e->d.ncqe = ncqe;
	e->d.lkey = e->mr->lkey;
	e->d.laddr = (uint64_t)(uintptr_t)e->buf;
}

static int modify(ep *e, uint16_t op, uint32_t rqpn, uint32_t rlid)
{
	uint8_t out[IBGDA_PRM_OUT_SIZE];
	return ibgda_modify_qp(e->qp_obj, e->qpn, op, rqpn, rlid, out);
}

// The UAR made GPU-visible (§5.1 step 6).  The emulated UAR is ordinary memory,
// so IoMemory is not passed to the real driver (it would refuse RAM); the
// tracer recognises the doorbell from mlx5dv_devx_alloc_uar.
static void map_uar(ep *e)
{
	void *reg = e->uar->reg_addr;
	unsigned long long dptr = 0;
	if (!strcmp(g_api, "driver")) {
		CUDRV(cuMemHostRegister(reg, 8, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
		CUdeviceptr d;
		CUDRV(cuMemHostGetDevicePointer(&d, reg, 0));
		dptr = d;
	} else {
		CUDA(cudaHostRegister(reg, 8, cudaHostRegisterPortable | cudaHostRegisterMapped));
		void *d;
		CUDA(cudaHostGetDevicePointer(&d, reg, 0));
		dptr = (unsigned long long)(uintptr_t)d;
	}
	e->d.db = (unsigned long long *)(uintptr_t)dptr;
	unsigned long long hostp = 0;
	cuPointerGetAttribute(&hostp, CU_POINTER_ATTRIBUTE_HOST_POINTER, (CUdeviceptr)dptr);
	printf("DBPTR qpn=0x%x uar=%p dev=0x%llx host_attr=0x%llx\n", e->qpn, reg, dptr, hostp);
}

static void unmap_uar(ep *e)
{
	if (!strcmp(g_api, "driver"))
		cuMemHostUnregister(e->uar->reg_addr);
	else
		cudaHostUnregister(e->uar->reg_addr);
}

int main(int argc, char **argv)
{
	const char *op_s = "put", *lat_path = NULL, *log_path = NULL;
	int iters = 5000, warmup = 500;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--op")) op_s = argv[i + 1];
		else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--api")) g_api = argv[i + 1];
		else if (!strcmp(argv[i], "--sq")) g_sq = argv[i + 1];
		else if (!strcmp(argv[i], "--lat")) lat_path = argv[i + 1];
		else if (!strcmp(argv[i], "--log")) log_path = argv[i + 1];
		else if (!strcmp(argv[i], "--depth")) g_depth = atoi(argv[i + 1]);
		else DIE("unknown option %s", argv[i]);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	int op = !strcmp(op_s, "put") ? 0 : !strcmp(op_s, "get") ? 1 : !strcmp(op_s, "fadd") ? 2 : 3;
	CUDA(cudaSetDevice(0));
	CUDA(cudaFree(0));
	CUDRV(cuInit(0));
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n > 0, "no RDMA device (emulated HCA not selected?)");
	struct ibv_context *ctx = ibv_open_device(l[0]);
	CHECK(ctx, "open_device");
	ep *a = new ep, *b = new ep;
	ep_setup(a, ctx);
	ep_setup(b, ctx);
	ep *s[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		CHECK(!modify(s[i], ST_MLX5_CMD_OP_RST2INIT_QP, 0, 0), "RST2INIT");
		CHECK(!modify(s[i], ST_MLX5_CMD_OP_INIT2RTR_QP, s[!i]->qpn, s[!i]->lid), "INIT2RTR");
		CHECK(!modify(s[i], ST_MLX5_CMD_OP_RTR2RTS_QP, 0, 0), "RTR2RTS");
	}
	map_uar(a);
	map_uar(b);
	a->d.raddr = (uint64_t)(uintptr_t)b->buf;
	a->d.rkey = b->mr->rkey;
	a->d.rbuf = b->d.lbuf;
	b->d.raddr = (uint64_t)(uintptr_t)a->buf;
	b->d.rkey = a->mr->rkey;
	b->d.rbuf = a->d.lbuf;
	for (int i = 0; i < 0x10000; i++)
		a->buf[0x1000 + i] = (uint8_t)(i * 7 + 3), b->buf[0x1000 + i] = (uint8_t)(i * 13 + 5);
	dqp *da, *db;
	CUDA(cudaMalloc(&da, sizeof(dqp)));
	CUDA(cudaMalloc(&db, sizeof(dqp)));
	CUDA(cudaMemcpy(da, &a->d, sizeof(dqp), cudaMemcpyHostToDevice));
	CUDA(cudaMemcpy(db, &b->d, sizeof(dqp), cudaMemcpyHostToDevice));
	uint64_t *lat;
	int *err;
	CUDA(cudaMalloc(&lat, sizeof(uint64_t) * (size_t)iters));
	CUDA(cudaMalloc(&err, sizeof(int)));
	run_kernel<<<1, 1>>>(da, db, op, iters, warmup, lat, err);
	CUDA(cudaGetLastError());
	CUDA(cudaDeviceSynchronize());
	std::vector<uint64_t> h((size_t)iters);
	CUDA(cudaMemcpy(h.data(), lat, sizeof(uint64_t) * (size_t)iters, cudaMemcpyDeviceToHost));
	// data checks
	int fails = 0;
	int total = warmup + iters;
	if (op == 0)
		for (int k = 0; k < 64 * 64; k++)
			fails += b->buf[0x1000 + k] != a->buf[0x1000 + k];
	else if (op == 1)
		for (int k = 0; k < 64 * 64; k++)
			fails += a->buf[0x1000 + k] != b->buf[0x1000 + k];
	else if (op == 2) {
		// op i adds 1 to the 8-byte word at 0x1000 + (i % 64) * 64
		for (int s = 0; s < 64; s++) {
			uint64_t v, init = 0;
			memcpy(&v, b->buf + 0x1000 + s * 64, 8);
			for (int k = 0; k < 8; k++)
				init |= (uint64_t)(uint8_t)((s * 64 + k) * 13 + 5) << (8 * k);
			uint64_t adds = (uint64_t)(total / 64 + (s < total % 64));
			fails += v != init + adds;
		}
	} else {
		uint64_t v;
		memcpy(&v, a->buf + 0x200, 8);
		fails += v != (uint64_t)total;
	}
	if (log_path) { // ground truth: every op is one WQE and one doorbell, PI = 1, 2, ...
		FILE *f = fopen(log_path, "w");
		uint32_t opc = op == 0 || op == 3 ? 8 : op == 1 ? 0x10 : 0x12;
		for (int i = 0; i < total; i++) {
			uint32_t off = op == 3 ? 0x200 : 0x1000 + (uint32_t)(i % 64) * 64;
			fprintf(f, "W %u %u %u %u %llu %u %u %u\n", a->qpn, i & 0xffff, opc, op == 2 ? 4 : 3,
				(unsigned long long)((uintptr_t)b->buf + off), b->mr->rkey, op == 2 ? 8 : op == 3 ? 8 : 64,
				op == 2 ? 1 : 0);
			fprintf(f, "D %u %u\n", a->qpn, (i + 1) & 0xffff);
			if (op == 3)
				fprintf(f, "D %u %u\n", b->qpn, (i + 1) & 0xffff);
		}
		fclose(f);
	}
	if (lat_path) {
		FILE *f = fopen(lat_path, "w");
		for (int i = 0; i < iters; i++)
			fprintf(f, "%llu\n", (unsigned long long)h[(size_t)i]);
		fclose(f);
	}
	std::sort(h.begin(), h.end());
	unmap_uar(a);
	unmap_uar(b);
	mlx5dv_devx_obj_destroy(a->qp_obj);
	mlx5dv_devx_obj_destroy(b->qp_obj);
	mlx5dv_devx_free_uar(a->uar);
	mlx5dv_devx_free_uar(b->uar);
	if (fails)
		DIE("%d data check(s) failed", fails);
	printf("RESULT OK op=%s iters=%d median_ns=%llu p99_ns=%llu qpn_a=%u qpn_b=%u\n", op_s, iters,
	       (unsigned long long)h[(size_t)iters / 2], (unsigned long long)h[(size_t)iters * 99 / 100], a->qpn, b->qpn);
	return 0;
}
