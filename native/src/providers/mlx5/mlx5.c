/*
 * mlx5dv / DevX provider (F6, F24d): the setup of queues that the CPU or GPU
 * drives directly, without ibv_post_send.
 *
 * What an IBGDA client (NVSHMEM, DeepEP, NCCL GIN) or a CPU WQE writer (UCX
 * rc_mlx5) does before its first doorbell is recorded here: UAR pages, umem
 * registrations (with GPU residency), every DevX command with its raw PRM
 * input and output (PRM_COMMAND side records, so the decoder re-parses them
 * with sigmatrace.mlx5.prm), and the verbs-QP introspection of
 * mlx5dv_init_obj.  The doorbell hijack (native/src/hijack/, optional) gets
 * the UAR, umem and QP facts through the agreed st_hijack_note_* calls.
 *
 * All of this is setup: rare calls, so the wrappers may take a mutex and
 * allocate.  Lifecycle events are recorded in every mode.
 *
 * The shims of one shape are generated from the table mlx5_shims.def (the
 * shape: ../ibv/rdma_shim.h); the teardown shims (free_uar, obj_destroy,
 * umem_dereg), which tell the hijack at any recording depth, are written out
 * below the generated ones.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/mlx5dv.h"

#include "../ibv/rdma_shim.h"
#include "sigmatrace/mlx5.h"

/* ---- the doorbell hijack (hijack/hijack.h); absent -> NULL --------------- */
void st_hijack_note_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx) __attribute__((weak)) ST_HIDDEN;
void st_hijack_forget_uar(void *reg_addr) __attribute__((weak)) ST_HIDDEN;
void st_hijack_note_umem(uint32_t umem_id, void *addr, uint64_t size, int gpu) __attribute__((weak)) ST_HIDDEN;
void st_hijack_forget_umem(uint32_t umem_id) __attribute__((weak)) ST_HIDDEN;
void st_hijack_note_qp(uint32_t qpn, uint32_t uar_page, uint32_t wq_umem_id, uint64_t sq_offset,
		       uint32_t log_sq_size, uint32_t dbr_umem_id, uint64_t dbr_offset) __attribute__((weak)) ST_HIDDEN;
void st_hijack_forget_qp(uint32_t qpn) __attribute__((weak)) ST_HIDDEN;
void *st_hijack_cpu_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx, uint32_t flags)
	__attribute__((weak)) ST_HIDDEN;
void *st_hijack_cpu_uar_release(void *app_reg) __attribute__((weak)) ST_HIDDEN;
void *st_hijack_cpu_verbs_reg(void *reg_addr, void *ctx, uint32_t qpn, uint32_t bf_size) __attribute__((weak)) ST_HIDDEN;
void st_hijack_forget_verbs_qp(uint32_t qpn, uint32_t sq_umem_id, uint32_t dbr_umem_id) __attribute__((weak)) ST_HIDDEN;
uint32_t *st_hijack_ring_lock(void *ctx, void *real_reg) __attribute__((weak)) ST_HIDDEN;
int st_hijack_ctx_proxied(void *ctx) __attribute__((weak)) ST_HIDDEN;

/* a verbs QP's SQ and doorbell record are host memory the hijack reads like a
 * umem: synthetic umem ids, out of the kernel's range (they count from 1) */
#define ST_VERBS_SQ_UMEM(qpn) (0xC0000000u | ((qpn) & 0x00FFFFFFu))
#define ST_VERBS_DBR_UMEM(qpn) (0xD0000000u | ((qpn) & 0x00FFFFFFu))

/* ---- real functions: real_<name> for every row of mlx5_shims.def --------- */
#define ST_SHIM(fail, provider, ret_type, name, params, args, skip, note, record) ST_RDMA_REAL(ret_type, name, params)
#define ST_SHIM_BY_HAND(provider, ret_type, name, params) ST_RDMA_REAL(ret_type, name, params)
#include "mlx5_shims.def"

static pthread_mutex_t mlx5_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- DevX objects: handle -> (create opcode, number) ---------------------- */
struct devx_obj_info {
	const void *handle; /* NULL = free */
	uint16_t opcode;    /* the CREATE command */
	uint32_t number;    /* qpn / cqn / object id */
};
#define DEVX_SLOTS 4096
static struct devx_obj_info devx_objs[DEVX_SLOTS];

/* Where a handle's probe chain starts. */
static inline unsigned devx_home(const void *handle)
{
	return (unsigned)(((uintptr_t)handle >> 4) * 2654435761u) & (DEVX_SLOTS - 1);
}

static void devx_remember(const void *handle, uint16_t op, uint32_t number)
{
	pthread_mutex_lock(&mlx5_lock);
	unsigned home = devx_home(handle);
	for (unsigned i = 0; i < DEVX_SLOTS; i++) {
		struct devx_obj_info *slot = &devx_objs[(home + i) & (DEVX_SLOTS - 1)];
		if (!slot->handle || slot->handle == handle) {
			slot->handle = handle;
			slot->opcode = op;
			slot->number = number;
			break;
		}
	}
	pthread_mutex_unlock(&mlx5_lock);
}

/* Look up (and with forget, remove) a handle; 0 when unknown. */
static int devx_lookup(const void *handle, uint16_t *op, uint32_t *number, int forget)
{
	int found = 0;
	pthread_mutex_lock(&mlx5_lock);
	unsigned home = devx_home(handle);
	for (unsigned i = 0; i < DEVX_SLOTS; i++) {
		unsigned k = (home + i) & (DEVX_SLOTS - 1);
		struct devx_obj_info *slot = &devx_objs[k];
		if (!slot->handle)
			break;
		if (slot->handle == handle) {
			*op = slot->opcode;
			*number = slot->number;
			found = 1;
			if (forget) {
				/* backward-shift deletion keeps probe chains intact */
				unsigned hole = k;
				for (unsigned j = (k + 1) & (DEVX_SLOTS - 1); devx_objs[j].handle;
				     j = (j + 1) & (DEVX_SLOTS - 1)) {
					unsigned wanted = devx_home(devx_objs[j].handle);
					if (((j - wanted) & (DEVX_SLOTS - 1)) >= ((j - hole) & (DEVX_SLOTS - 1))) {
						devx_objs[hole] = devx_objs[j];
						hole = j;
					}
				}
				devx_objs[hole].handle = NULL;
			}
			break;
		}
	}
	pthread_mutex_unlock(&mlx5_lock);
	return found;
}

/* ---- PRM helpers (layouts from sigmatrace/mlx5.h) ------------------------ */
static inline uint16_t prm_opcode(const void *in, size_t inlen)
{
	return inlen >= 2 ? (uint16_t)st_devx_get(in, ST_PRM_CMD_OPCODE) : 0;
}

static inline int is_qp_transition(uint16_t op)
{
	return op >= ST_MLX5_CMD_OP_RST2INIT_QP && op <= ST_MLX5_CMD_OP_2RST_QP;
}

/* The number a CREATE command returns: QPN, CQN, ... sit in DW2 bits 23:0;
 * general objects (CREATE_GENERAL_OBJECT 0xa00) return a 32-bit obj_id. */
static uint32_t created_number(uint16_t op, const void *out, size_t outlen)
{
	if (outlen < 12)
		return 0;
	if (op == ST_MLX5_CMD_OP_CREATE_QP)
		return (uint32_t)st_devx_get(out, ST_PRM_CREATE_QP_OUT_QPN);
	if (op == ST_MLX5_CMD_OP_CREATE_CQ)
		return (uint32_t)st_devx_get(out, ST_PRM_CREATE_CQ_OUT_CQN);
	if (op == 0xa00)
		return (uint32_t)st_devx_get(out, 0x040, 32);
	return (uint32_t)st_devx_get(out, 0x048, 24);
}

/* PRM buffers are attached as they are; a command cannot be larger than a
 * few pages, the cap only protects the side channel from nonsense lengths. */
#define PRM_CAP (64u << 10)

static uint64_t prm_side(const void *in, size_t inlen, const void *out, size_t outlen)
{
	if (inlen > PRM_CAP)
		inlen = PRM_CAP;
	if (outlen > PRM_CAP)
		outlen = PRM_CAP;
	struct st_side_prm h = {.in_len = (uint32_t)(in ? inlen : 0), .out_len = (uint32_t)(out ? outlen : 0)};
	return st_side_add(ST_SIDE_PRM_COMMAND, &h, sizeof(h), in, h.in_len, out, h.out_len);
}

/* The SQ of a DevX QP (ref §4.3): umem(wq_umem_id) + wq_umem_offset + RQ
 * bytes; the RQ is 2^log_rq_size entries of 2^(log_rq_stride+4) bytes when
 * the QP has its own (rq_type 0), nothing with an SRQ or a zero-length RQ. */
static void note_created_qp(const void *in, size_t inlen, uint32_t qpn)
{
	if (!st_hijack_note_qp || inlen < ST_PRM_CREATE_QP_IN_SIZE)
		return;
	uint64_t rq_bytes = 0;
	/* as sigmatrace.mlx5.prm.CreateQP.rq_size_bytes: a regular RQ of more than one entry */
	if (st_devx_get(in, ST_PRM_QPC_RQ_TYPE) == 0 && st_devx_get(in, ST_PRM_QPC_LOG_RQ_SIZE) > 0)
		rq_bytes = (1ull << st_devx_get(in, ST_PRM_QPC_LOG_RQ_SIZE)) << (st_devx_get(in, ST_PRM_QPC_LOG_RQ_STRIDE) + 4);
	uint64_t sq_offset = st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_OFFSET) + rq_bytes;
	uint32_t dbr_umem = st_devx_get(in, ST_PRM_QPC_DBR_UMEM_VALID) ? (uint32_t)st_devx_get(in, ST_PRM_QPC_DBR_UMEM_ID) : 0;
	uint32_t wq_umem = st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_VALID)
				   ? (uint32_t)st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_ID) : 0;
	st_hijack_note_qp(qpn, (uint32_t)st_devx_get(in, ST_PRM_QPC_UAR_PAGE), wq_umem, sq_offset,
			  (uint32_t)st_devx_get(in, ST_PRM_QPC_LOG_SQ_SIZE), dbr_umem, st_devx_get(in, ST_PRM_QPC_DBR_ADDR));
}

/* ---- GPU residency --------------------------------------------------------
 * Asked of the CUDA driver only when the program has loaded it; looked up in
 * libcuda itself (not RTLD_DEFAULT), so a traced cuPointerGetAttribute of the
 * cuda provider does not record our own question. */
static int addr_on_gpu(const void *addr)
{
	void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!lib)
		return 0;
	typedef int (*get_attr_fn)(void *, int, unsigned long long);
	get_attr_fn fn = (get_attr_fn)st_real_dlsym(lib, "cuPointerGetAttribute");
	int gpu = 0;
	if (fn) {
		unsigned int memtype = 0;
		/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_MEMORYTYPE_DEVICE = 2 */
		gpu = fn(&memtype, 2, (unsigned long long)(uintptr_t)addr) == 0 && memtype == 2;
	}
	dlclose(lib);
	return gpu;
}

/* F24d for verbs QPs: a CPU WQE writer (UCX rc_mlx5) rings dv->bf.reg itself.
 * Hand it a register in a proxy page of ours instead (same offset), watched by
 * the hijack's poller, which forwards each value to the real register, records
 * it and recovers the WQEs from the SQ (host memory, registered like a umem,
 * only once the proxy is handed out -- the application cannot ring it before
 * init_obj returns).  The proxy address, or NULL: hijack absent or off, an
 * unusual SQ, an SQ in GPU memory (recovery would need the copy stream), or a
 * register word another QP rings (hijack.h). */
static void *verbs_qp_doorbells(const struct ibv_qp *qp, struct mlx5dv_qp *dv)
{
	if (!st_hijack_cpu_verbs_reg || !st_hijack_note_umem || !st_hijack_note_qp || !dv->bf.reg || !dv->sq.buf ||
	    dv->sq.stride != 64 || !dv->sq.wqe_cnt || (dv->sq.wqe_cnt & (dv->sq.wqe_cnt - 1)) || !dv->dbrec ||
	    addr_on_gpu(dv->sq.buf))
		return NULL;
	void *proxy = st_hijack_cpu_verbs_reg(dv->bf.reg, qp->context, qp->qp_num, dv->bf.size);
	if (!proxy)
		return NULL;
	uint32_t qpn = qp->qp_num, log_sq = (uint32_t)__builtin_ctz(dv->sq.wqe_cnt);
	st_hijack_note_umem(ST_VERBS_SQ_UMEM(qpn), dv->sq.buf, (uint64_t)dv->sq.wqe_cnt * 64, 0);
	st_hijack_note_umem(ST_VERBS_DBR_UMEM(qpn), (void *)dv->dbrec, 8, 0);
	st_hijack_note_qp(qpn, 0, ST_VERBS_SQ_UMEM(qpn), 0, log_sq, ST_VERBS_DBR_UMEM(qpn), 0);
	dv->bf.reg = proxy;
	/* the context's QPs rdma-core rings on that bfreg now post under its ring lock (this one too) */
	if (st_hijack_ring_lock)
		st_ibv_ring_locks_refresh(qp->context);
	return proxy;
}

/* Finding 9: the ring lock of the bfreg that holds the real BlueFlame register rdma-core rings for
 * qp, when the hijack proxies that bfreg for some QP of the context (NULL otherwise).  The register
 * is asked of libmlx5 with the real mlx5dv_init_obj, which for a QP only reports where its rings
 * are (rdma-core's mlx5dv_get_qp): nothing is recorded, the application sees nothing. */
uint32_t *st_mlx5_verbs_ring_lock(struct ibv_qp *qp)
{
	if (!qp || !st_hijack_ring_lock || !st_hijack_ctx_proxied || !st_hijack_ctx_proxied(qp->context) ||
	    !ST_REAL(real_mlx5dv_init_obj, "mlx5dv_init_obj"))
		return NULL;
	struct mlx5dv_qp dv;
	memset(&dv, 0, sizeof dv);
	struct mlx5dv_obj o;
	memset(&o, 0, sizeof o);
	o.qp.in = qp;
	o.qp.out = &dv;
	int saved = errno;
	int r = real_mlx5dv_init_obj(&o, MLX5DV_OBJ_QP);
	errno = saved;
	return r == 0 && dv.bf.reg ? st_hijack_ring_lock(qp->context, dv.bf.reg) : NULL;
}

/* ibv_destroy_qp (ibv provider): the hijack forgets a verbs QP's SQ. */
void st_mlx5_verbs_qp_destroyed(uint32_t qpn)
{
	if (st_hijack_forget_verbs_qp)
		st_hijack_forget_verbs_qp(qpn, ST_VERBS_SQ_UMEM(qpn), ST_VERBS_DBR_UMEM(qpn));
}

/* ---- what the shims record (the `record` column of mlx5_shims.def) -------- */
/* MLX5_DV_INIT_QP: where a verbs QP's send queue, doorbell record and
 * BlueFlame register are — what a CPU WQE writer (UCX rc_mlx5) uses from then
 * on instead of ibv_post_send (F24d). */
static void qp_introspected(int ret, struct mlx5dv_obj *obj, uint64_t type)
{
	if (ret != 0 || !obj || !(type & MLX5DV_OBJ_QP) || !obj->qp.in || !obj->qp.out)
		return;
	int saved = errno;
	const struct ibv_qp *qp = obj->qp.in;
	const struct mlx5dv_qp *dv_qp = obj->qp.out;
	char buf[768];
	struct st_json j;
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "qpn", qp->qp_num);
	st_json_hex(&j, "sq_buf", (uintptr_t)dv_qp->sq.buf);
	st_json_uint(&j, "sq_wqe_cnt", dv_qp->sq.wqe_cnt);
	st_json_uint(&j, "sq_stride", dv_qp->sq.stride);
	st_json_hex(&j, "rq_buf", (uintptr_t)dv_qp->rq.buf);
	st_json_uint(&j, "rq_wqe_cnt", dv_qp->rq.wqe_cnt);
	st_json_uint(&j, "rq_stride", dv_qp->rq.stride);
	st_json_hex(&j, "dbrec", (uintptr_t)dv_qp->dbrec);
	st_json_hex(&j, "bf_reg", (uintptr_t)dv_qp->bf.reg);
	st_json_uint(&j, "bf_size", dv_qp->bf.size);
	st_json_hex(&j, "comp_mask", dv_qp->comp_mask);
	void *proxy = verbs_qp_doorbells(qp, obj->qp.out);
	if (proxy)
		st_json_hex(&j, "bf_proxy", (uintptr_t)proxy);
	st_json_close(&j, '}');
	st_ev(ST_EV_MLX5_DV_INIT_QP, 0, qp->qp_num, j.overflow ? 0 : st_side_json(buf, j.len));
	errno = saved;
}

/* A UAR page: its event, the hijack told, and the application handed a
 * proxy register when the hijack proxies CPU doorbells. */
static void uar_allocated(struct mlx5dv_devx_uar *uar, struct ibv_context *ctx, uint32_t flags)
{
	int saved = errno;
	st_ev_ext(ST_EV_MLX5_DEVX_ALLOC_UAR, (uint16_t)flags, uar->page_id, (uintptr_t)uar->reg_addr,
		  (uintptr_t)uar->base_addr, 0, flags, (uint64_t)uar->mmap_off);
	if (st_hijack_note_uar)
		st_hijack_note_uar(uar->reg_addr, uar->base_addr, uar->page_id, ctx);
	/* CPU doorbells (F24d): the application rings a proxy register of
	 * ours, same offset in the page; base_addr and page_id stay real */
	if (st_hijack_cpu_uar) {
		void *proxy = st_hijack_cpu_uar(uar->reg_addr, uar->base_addr, uar->page_id, ctx, flags);
		if (proxy)
			uar->reg_addr = proxy;
	}
	errno = saved;
}

static void umem_event(struct mlx5dv_devx_umem *umem, void *addr, size_t size, uint32_t access, unsigned flags)
{
	int saved = errno;
	st_ev_ext(ST_EV_MLX5_DEVX_UMEM_REG, (uint16_t)flags, umem->umem_id, (uintptr_t)addr, size, 0, access, 0);
	if (st_hijack_note_umem && !(flags & ST_UMEM_F_DMABUF))
		st_hijack_note_umem(umem->umem_id, addr, size, !!(flags & ST_UMEM_F_GPU));
	errno = saved;
}

/* GPU residency of a umem; errno kept (asking is a CUDA driver call). */
static unsigned umem_residency(const void *addr)
{
	int saved = errno;
	unsigned flags = addr_on_gpu(addr) ? ST_UMEM_F_GPU : 0;
	errno = saved;
	return flags;
}

static unsigned umem_ex_flags(const struct mlx5dv_devx_umem_in *in)
{
	/* with a dma-buf, addr is the offset in the buffer (ref §4.1); the
	 * exporter (cuMemGetHandleForAddressRange in NVSHMEM) is a GPU */
	return (in->comp_mask & MLX5DV_UMEM_MASK_DMABUF) ? ST_UMEM_F_DMABUF | ST_UMEM_F_GPU : umem_residency(in->addr);
}

/* DEVX_OBJ_CREATE with the raw command; the object remembered by its
 * handle, so modify/query/destroy events name it by its number. */
static void devx_obj_created(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, const void *out,
			     size_t outlen)
{
	int saved = errno;
	uint16_t op = prm_opcode(in, inlen);
	uint32_t number = obj ? created_number(op, out, outlen) : 0;
	uint32_t status = outlen >= 1 ? ((const uint8_t *)out)[0] : 0;
	uint64_t side = prm_side(in, inlen, out, outlen);
	st_ev_ext(ST_EV_MLX5_DEVX_OBJ_CREATE, op, number, side, (uintptr_t)obj, 0, status, 0);
	if (obj) {
		devx_remember(obj, op, number);
		if (op == ST_MLX5_CMD_OP_CREATE_QP)
			note_created_qp(in, inlen, number);
	}
	errno = saved;
}

/* obj of a modify/query event: the QPN in the command for QP transitions,
 * else the number the object was created with */
static uint32_t command_number(const void *handle, uint16_t op, const void *in, size_t inlen)
{
	if ((is_qp_transition(op) || op == ST_MLX5_CMD_OP_QUERY_QP) && inlen >= 12)
		return (uint32_t)st_devx_get(in, ST_PRM_MODIFY_QP_QPN);
	uint16_t created_op;
	uint32_t number = 0;
	if (handle && devx_lookup(handle, &created_op, &number, 0))
		return number;
	return 0;
}

/* A DevX command's event: opcode in aux, `number` (an expression that may
 * use op) in obj, the raw PRM input and output in a side record.  Expanded
 * inside a shim of mlx5_shims.def: in, inlen, out, outlen are its arguments. */
#define DEVX_COMMAND_EVENT(type, number)                                           \
	do {                                                                       \
		int saved = errno;                                                 \
		uint16_t op = prm_opcode(in, inlen);                               \
		st_ev(type, op, (number), prm_side(in, inlen, out, outlen));       \
		errno = saved;                                                     \
	} while (0)

static void eqn_queried(int ret, uint32_t vector, const uint32_t *eqn)
{
	if (ret != 0 || !eqn)
		return;
	int saved = errno;
	st_ev(ST_EV_MLX5_DEVX_QUERY_EQN, 0, *eqn, vector);
	errno = saved;
}

/* ---- the generated shims (rows ST_SHIM of mlx5_shims.def) ----------------- */
#define ST_SHIM ST_RDMA_SHIM
#define ST_SHIM_BY_HAND(provider, ret_type, name, params)
#include "mlx5_shims.def"

/* ---- the shims written out (rows ST_SHIM_BY_HAND) ------------------------- */
/* The teardown shims (free_uar, obj_destroy, umem_dereg) tell the hijack
 * always, traced or not, at any recording depth: what it proxies or reads
 * was set up while tracing, and a UAR unmapped or an SQ freed under a
 * running poller would be written or read after it is gone.  Only the
 * event depends on recording. */
ST_EXPORT void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *uar)
{
	if (!ST_REAL(real_mlx5dv_devx_free_uar, "mlx5dv_devx_free_uar"))
		return;
	if (!uar) {
		real_mlx5dv_devx_free_uar(uar);
		return;
	}
	int record = st_rdma_should(ST_PROV_MLX5);
	uint32_t page = uar->page_id;
	int saved = errno;
	/* a proxied UAR: its poller forwards what it holds and stops, and the
	 * library gets the struct back as it made it */
	if (st_hijack_cpu_uar_release) {
		void *real = st_hijack_cpu_uar_release(uar->reg_addr);
		if (real)
			uar->reg_addr = real;
	}
	void *reg = uar->reg_addr;
	/* the hijack lets go of the page before it disappears */
	if (st_hijack_forget_uar)
		st_hijack_forget_uar(reg);
	errno = saved;
	st_rdma_enter();
	real_mlx5dv_devx_free_uar(uar);
	st_rdma_leave();
	if (record) {
		saved = errno;
		st_ev(ST_EV_MLX5_DEVX_FREE_UAR, 0, page, (uintptr_t)reg);
		errno = saved;
	}
}

ST_EXPORT int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj)
{
	if (!ST_REAL(real_mlx5dv_devx_obj_destroy, "mlx5dv_devx_obj_destroy"))
		return ENOSYS;
	if (!obj)
		return real_mlx5dv_devx_obj_destroy(obj);
	int record = st_rdma_should(ST_PROV_MLX5);
	uint16_t op = 0;
	uint32_t number = 0;
	int saved = errno;
	int known = devx_lookup(obj, &op, &number, 0);
	/* before the QP's memory can be reused: returns once its pollers are done with its SQ */
	if (known && op == ST_MLX5_CMD_OP_CREATE_QP && st_hijack_forget_qp)
		st_hijack_forget_qp(number);
	errno = saved;
	st_rdma_enter();
	int ret = real_mlx5dv_devx_obj_destroy(obj);
	st_rdma_leave();
	saved = errno;
	if (ret == 0) {
		if (known)
			devx_lookup(obj, &op, &number, 1);
		if (record)
			st_ev(ST_EV_MLX5_DEVX_OBJ_DESTROY, op, number, (uintptr_t)obj);
	}
	errno = saved;
	return ret;
}

ST_EXPORT int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem)
{
	if (!ST_REAL(real_mlx5dv_devx_umem_dereg, "mlx5dv_devx_umem_dereg"))
		return ENOSYS;
	int record = umem && st_rdma_should(ST_PROV_MLX5);
	uint32_t id = umem ? umem->umem_id : 0; /* read before the umem is freed */
	st_rdma_enter();
	int ret = real_mlx5dv_devx_umem_dereg(umem);
	st_rdma_leave();
	if (ret != 0 || !umem)
		return ret;
	int saved = errno;
	/* the hijack forgets the umem before its id can be reused, and before the
	 * application frees its memory: returns once no poller holds a pointer into it */
	if (st_hijack_forget_umem)
		st_hijack_forget_umem(id);
	if (record)
		st_ev(ST_EV_MLX5_DEVX_UMEM_DEREG, 0, id, 0);
	errno = saved;
	return ret;
}

/* ---- registration -------------------------------------------------------- */
static const struct st_hook mlx5_hooks[] = {
#define ST_SHIM(fail, provider, ret_type, name, params, args, skip, note, record) ST_RDMA_HOOK(provider, name)
#define ST_SHIM_BY_HAND(provider, ret_type, name, params) ST_RDMA_HOOK(provider, name)
#include "mlx5_shims.def"
};

ST_HOOKS_CONSTRUCTOR(111, mlx5_hooks)

/* held across fork, so no child inherits it locked (core.h, st_fork_guard) */
__attribute__((constructor(111))) static void mlx5_fork_guard(void)
{
	st_fork_guard(&mlx5_lock, ST_FORK_RANK_MLX5);
}
