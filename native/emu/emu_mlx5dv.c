/* libmlx5.so.1 of the emulated HCA: mlx5dv direct verbs and the DevX surface
 * used by IBGDA-style clients (NVSHMEM setup order, reference §5.1).  PRM
 * command buffers are parsed with the DEVX bit rule and the field offsets of
 * reference §4.3-§4.5 (sigmatrace/mlx5.h).  The emulator state lives in
 * libibverbs.so.1 (emu_* helpers exported under SIGMATRACE_EMU_PRIVATE). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

#include "emu_internal.h"

/* from libibverbs.so.1 (private) */
struct emu_nic *emu_ctx_nic(struct ibv_context *c);
uint32_t emu_pd_num(struct ibv_pd *pd);
struct emu_cq *emu_cq_new(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, void *buf,
			  volatile uint32_t *dbrec, int devx);
void emu_cq_free(struct emu_nic *nic, struct emu_cq *cq);
struct emu_cq *emu_cq_new_sized(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, uint32_t cqe_size,
				void *buf, volatile uint32_t *dbrec, int devx);
void emu_cq_init_ex_ops(struct emu_cq *cq);
void *emu_ctx_cq_uar(struct ibv_context *c);
void emu_qp_apply_reset(struct emu_qp *qp);

/* PRM command status values (as in Linux include/linux/mlx5/device.h; not
 * part of the reference): OK 0, BAD_OP 2, BAD_PARAM 3, BAD_RES_STATE 9. */
enum { CMD_OK = 0, CMD_BAD_OP = 2, CMD_BAD_PARAM = 3, CMD_BAD_RES_STATE = 9 };

struct emu_devx_uar { struct mlx5dv_devx_uar pub; struct emu_uar *uar; struct emu_nic *nic; };
struct emu_devx_obj { int kind; void *object; struct emu_nic *nic; struct ibv_context *ctx; };
enum { OBJ_QP = 1, OBJ_CQ = 2 };

static int cmd_status(void *out, size_t outlen, int status, uint32_t syndrome)
{
	if (out && outlen >= 8) {
		memset(out, 0, outlen < 16 ? outlen : 16);
		st_devx_set(out, ST_PRM_OUT_STATUS, (uint64_t)status);
		st_devx_set(out, ST_PRM_OUT_SYNDROME, syndrome);
	}
	return status == CMD_OK ? 0 : (status == CMD_BAD_OP ? EOPNOTSUPP : EINVAL);
}

/* Tear down the QP or CQ behind a handle (the handle itself is the caller's). */
static void devx_obj_release(struct emu_devx_obj *o)
{
	struct emu_nic *nic = o->nic;
	if (o->kind == OBJ_QP) {
		struct emu_qp *qp = o->object;
		pthread_mutex_lock(&nic->lock);
		emu_qp_unregister(nic, qp);
		pthread_mutex_unlock(&nic->lock);
		free(qp->inflight);
		free(qp);
	} else if (o->kind == OBJ_CQ) {
		emu_cq_free(nic, o->object);
	}
}

/* The handle obj_create returns, with the command's OK status in out;
 * without memory for it the new object is released again and creation fails
 * with ENOMEM. */
static struct emu_devx_obj *devx_obj_new(int kind, void *p, struct emu_nic *nic, struct ibv_context *ctx, void *out,
					 size_t outlen)
{
	struct emu_devx_obj obj = { kind, p, nic, ctx };
	struct emu_devx_obj *o = calloc(1, sizeof *o);
	if (!o) {
		devx_obj_release(&obj);
		errno = ENOMEM;
		return NULL;
	}
	*o = obj;
	cmd_status(out, outlen, CMD_OK, 0);
	return o;
}

EXPORT bool mlx5dv_is_supported(struct ibv_device *device) { return true; }

EXPORT struct ibv_context *mlx5dv_open_device(struct ibv_device *device, struct mlx5dv_context_attr *attr)
{
	return ibv_open_device(device);
}

EXPORT int mlx5dv_query_device(struct ibv_context *ctx, struct mlx5dv_context *attrs)
{
	uint64_t want = attrs->comp_mask;
	memset(attrs, 0, sizeof *attrs);
	attrs->version = 0;
	attrs->flags = MLX5DV_CONTEXT_FLAGS_CQE_V1;
	attrs->comp_mask = 0;
	(void)want;
	return 0;
}

/* ---- mlx5dv_init_obj ---------------------------------------------------- */
EXPORT int mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t type)
{
	if (type & MLX5DV_OBJ_QP) {
		struct emu_qp *qp = (struct emu_qp *)obj->qp.in;
		struct mlx5dv_qp *o = obj->qp.out;
		uint64_t want = o->comp_mask;
		memset(o, 0, sizeof *o);
		o->dbrec = (__be32 *)qp->dbrec;
		o->sq.buf = qp->sq_buf;
		o->sq.wqe_cnt = qp->sq_wqebb;
		o->sq.stride = ST_MLX5_SEND_WQE_BB;
		o->rq.buf = qp->rq_buf;
		o->rq.wqe_cnt = qp->rq_wqe_cnt;
		o->rq.stride = qp->rq_stride;
		o->bf.reg = qp->uar + qp->bf_off;
		/* BlueFlame (SIGMATRACE_EMU_BF, default on): two 256-byte halves at
		 * bf.reg and bf.reg ^ 0x100, a WQE copy in either is checked against
		 * the SQ and executed (doorbell.c).  Not where every QP rings one
		 * word (SIGMATRACE_EMU_BFREG=word): copies would collide. */
		o->bf.size = qp->nic->bf_enabled && qp->nic->bfreg_share != 2 ? 256 : 0;
		qp->bf_size = o->bf.size;
		if (want & MLX5DV_QP_MASK_UAR_MMAP_OFFSET) {
			o->comp_mask |= MLX5DV_QP_MASK_UAR_MMAP_OFFSET;
			o->uar_mmap_offset = 0;
		}
		/* the application may now ring this doorbell itself (no kick): poll it */
		if (qp->uarobj && !qp->uarobj->devx) {
			pthread_mutex_lock(&qp->nic->lock);
			qp->uarobj->devx = 1;
			__atomic_fetch_add(&qp->nic->have_devx_uars, 1, __ATOMIC_RELAXED);
			pthread_mutex_unlock(&qp->nic->lock);
		}
	}
	if (type & MLX5DV_OBJ_CQ) {
		struct emu_cq *cq = (struct emu_cq *)obj->cq.in;
		struct mlx5dv_cq *o = obj->cq.out;
		memset(o, 0, sizeof *o);
		o->buf = cq->buf;
		o->dbrec = (__be32 *)cq->dbrec;
		o->cqe_cnt = cq->ncqe;
		o->cqe_size = cq->cqe_size;
		/* the context's CQ UAR: an arm doorbell at +0x20 (uct_ib_mlx5dv_arm_cq) */
		o->cq_uar = emu_ctx_cq_uar(cq->cq.context);
		o->cqn = cq->cqn;
		if (!o->cq_uar)
			return ENOMEM;
	}
	if (type & MLX5DV_OBJ_SRQ) {
		struct emu_srq *s = (struct emu_srq *)obj->srq.in;
		struct mlx5dv_srq *o = obj->srq.out;
		uint64_t want = o->comp_mask;
		memset(o, 0, sizeof *o);
		o->buf = s->buf;
		o->dbrec = (__be32 *)s->dbrec;
		o->stride = s->stride;
		o->head = 0;
		o->tail = s->wqe_cnt - 1;
		if (want & MLX5DV_SRQ_MASK_SRQN) {
			o->comp_mask = MLX5DV_SRQ_MASK_SRQN;
			o->srqn = s->srqn;
		}
	}
	if (type & MLX5DV_OBJ_PD) {
		obj->pd.out->pdn = emu_pd_num(obj->pd.in);
		obj->pd.out->comp_mask = 0;
	}
	if (type & MLX5DV_OBJ_AH) {
		obj->ah.out->av = &((struct emu_ah *)obj->ah.in)->av;
		obj->ah.out->comp_mask = 0;
	}
	if (type & (MLX5DV_OBJ_RWQ | MLX5DV_OBJ_DM))
		return EOPNOTSUPP;
	return 0;
}

EXPORT struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp) { errno = EOPNOTSUPP; return NULL; }
/* An RC/UC/UD QP like ibv_create_qp_ex; of the mlx5 attributes only the
 * scatter-to-CQE create flags are accepted (the emulated NIC never scatters
 * into CQEs, which those flags allow but do not require).  DC (UCX probes
 * DCT support here) and the other mlx5 options fail with EOPNOTSUPP. */
EXPORT struct ibv_qp *mlx5dv_create_qp(struct ibv_context *c, struct ibv_qp_init_attr_ex *a, struct mlx5dv_qp_init_attr *m)
{
	if (m) {
		const uint64_t flags_ok = MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE | MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
		if ((m->comp_mask & ~(uint64_t)MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) ||
		    ((m->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) && (m->create_flags & ~flags_ok))) {
			errno = EOPNOTSUPP;
			return NULL;
		}
		if ((m->create_flags & flags_ok) == flags_ok) {
			errno = EINVAL; /* rdma-core refuses both at once */
			return NULL;
		}
	}
	if (!a || a->qp_type == IBV_QPT_DRIVER) {
		errno = a ? EOPNOTSUPP : EINVAL;
		return NULL;
	}
	return ibv_create_qp_ex(c, a);
}

/* A CQ of 64- or 128-byte CQEs (MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE; with 128
 * the 64-byte CQE is the second half of each slot, rdma-core's layout).
 * Compressed CQEs and completion timestamps fail with EOPNOTSUPP. */
EXPORT struct ibv_cq_ex *mlx5dv_create_cq(struct ibv_context *c, struct ibv_cq_init_attr_ex *a, struct mlx5dv_cq_init_attr *m)
{
	uint32_t cqe_size = 64;
	if (!c || !a) {
		errno = EINVAL;
		return NULL;
	}
	if (m) {
		if (m->comp_mask & ~(uint64_t)(MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE | MLX5DV_CQ_INIT_ATTR_MASK_FLAGS)) {
			errno = EOPNOTSUPP;
			return NULL;
		}
		if (m->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE) {
			if (m->cqe_size != 64 && m->cqe_size != 128) {
				errno = EINVAL;
				return NULL;
			}
			cqe_size = m->cqe_size;
		}
		if ((m->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_FLAGS) && (m->flags & ~(uint32_t)MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD)) {
			errno = EOPNOTSUPP;
			return NULL;
		}
	}
	const uint64_t wc_ok = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
			       IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS;
	if ((a->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS) || (a->wc_flags & ~wc_ok) ||
	    ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (a->flags & ~(uint32_t)(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (a->cqe < 1 || a->cqe > 4194303 || a->comp_vector >= (uint32_t)c->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_cq *cq = emu_cq_new_sized(emu_ctx_nic(c), c, roundup_pow2(a->cqe + 1), cqe_size, NULL, NULL, 0);
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->ignore_overrun = (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (a->flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN);
	cq->cq.cq_context = a->cq_context;
	cq->cq.channel = a->channel;
	if (a->channel) {
		pthread_mutex_lock(&c->mutex);
		a->channel->refcnt++;
		pthread_mutex_unlock(&c->mutex);
	}
	emu_cq_init_ex_ops(cq);
	EMU_LOG("mlx5dv_create_cq cqn 0x%x %u x %u B%s", cq->cqn, cq->ncqe, cqe_size,
		cq->ignore_overrun ? " (overrun ignored)" : "");
	return &cq->cqx;
}

/* ---- UAR / UMEM / EQ ------------------------------------------------------- */
EXPORT struct mlx5dv_devx_uar *mlx5dv_devx_alloc_uar(struct ibv_context *ctx, uint32_t flags)
{
	if (flags != MLX5DV_UAR_ALLOC_TYPE_BF && flags != MLX5DV_UAR_ALLOC_TYPE_NC && flags != (1u << 31)) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_nic *nic = emu_ctx_nic(ctx);
	struct emu_devx_uar *d = emu_zalloc(sizeof *d);
	if (!d)
		return NULL;
	pthread_mutex_lock(&nic->lock);
	d->uar = emu_uar_alloc(nic, 1);
	pthread_mutex_unlock(&nic->lock);
	if (!d->uar) {
		free(d);
		errno = ENOMEM;
		return NULL;
	}
	d->nic = nic;
	d->uar->devx_obj = d;
	d->pub.base_addr = d->uar->page;
	d->pub.reg_addr = d->uar->page + ST_MLX5_BF_OFFSET; /* ref §3.2 */
	d->pub.page_id = d->uar->page_id;
	d->pub.mmap_off = 0;
	d->pub.comp_mask = 0;
	emu_nic_kick(nic);
	return &d->pub;
}

EXPORT void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *uar)
{
	struct emu_devx_uar *d = (struct emu_devx_uar *)uar;
	if (!d)
		return;
	pthread_mutex_lock(&d->nic->lock);
	emu_uar_free(d->nic, d->uar);
	pthread_mutex_unlock(&d->nic->lock);
	free(d);
}

EXPORT struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg(struct ibv_context *ctx, void *addr, size_t size, uint32_t access)
{
	struct emu_nic *nic = emu_ctx_nic(ctx);
	if (!addr || !size) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_umem *u = emu_zalloc(sizeof *u);
	if (!u)
		return NULL;
	pthread_mutex_lock(&nic->lock);
	uint32_t i = EMU_FREE_SLOT(nic->umems, EMU_MAX_UMEM);
	if (i == EMU_MAX_UMEM)
		return emu_table_full(nic, u);
	u->umem_id = i;
	u->nic = nic;
	u->addr = addr;
	u->size = size;
	u->valid = 1;
	nic->umems[i] = u;
	pthread_mutex_unlock(&nic->lock);
	EMU_LOG("umem %u: %p + %zu", i, addr, size);
	return (struct mlx5dv_devx_umem *)u;
}

EXPORT struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg_ex(struct ibv_context *ctx, struct mlx5dv_devx_umem_in *in)
{
	if (in->comp_mask & MLX5DV_UMEM_MASK_DMABUF) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return mlx5dv_devx_umem_reg(ctx, in->addr, in->size, (uint32_t)in->access);
}

EXPORT int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem)
{
	struct emu_umem *u = (struct emu_umem *)umem;
	struct emu_nic *nic = u ? u->nic : NULL;
	if (!u)
		return EINVAL;
	if (nic) {
		pthread_mutex_lock(&nic->lock);
		if (u->umem_id < EMU_MAX_UMEM && nic->umems[u->umem_id] == u)
			nic->umems[u->umem_id] = NULL;
		pthread_mutex_unlock(&nic->lock);
	}
	u->valid = 0;
	free(u);
	return 0;
}

EXPORT int mlx5dv_devx_query_eqn(struct ibv_context *ctx, uint32_t vector, uint32_t *eqn)
{
	if (vector >= (uint32_t)ctx->num_comp_vectors)
		return EINVAL;
	*eqn = vector;
	return 0;
}

static uint8_t *umem_ptr(struct emu_nic *nic, uint32_t id, uint64_t off, uint64_t len)
{
	if (id >= EMU_MAX_UMEM || !nic->umems[id])
		return NULL;
	struct emu_umem *u = nic->umems[id];
	if (off > u->size || len > u->size - off)
		return NULL;
	return (uint8_t *)u->addr + off;
}

/* A doorbell record: in a umem when the command says so (dbr_umem_valid),
 * else at the address the command gives. */
static uint8_t *dbr_ptr(struct emu_nic *nic, uint64_t in_umem, uint32_t umem_id, uint64_t addr)
{
	return in_umem ? umem_ptr(nic, umem_id, addr, 8) : (uint8_t *)(uintptr_t)addr;
}

/* ---- CREATE_CQ (ref §4.5) ---------------------------------------------- */
static struct emu_devx_obj *create_cq(struct ibv_context *ctx, struct emu_nic *nic, const void *in, void *out,
				      size_t outlen)
{
	uint32_t log = (uint32_t)st_devx_get(in, ST_PRM_CQC_LOG_CQ_SIZE);
	uint32_t cc = (uint32_t)st_devx_get(in, ST_PRM_CQC_CC);
	if (st_devx_get(in, ST_PRM_CQC_CQE_SZ) != 0 || !st_devx_get(in, ST_PRM_CREATE_CQ_UMEM_VALID) || log > 22) {
		errno = cmd_status(out, outlen, CMD_BAD_PARAM, 0x1);
		return NULL;
	}
	uint32_t n = 1u << log;
	uint8_t *buf = umem_ptr(nic, (uint32_t)st_devx_get(in, ST_PRM_CREATE_CQ_UMEM_ID),
			       st_devx_get(in, ST_PRM_CREATE_CQ_UMEM_OFFSET), (uint64_t)(cc ? 1 : n) * 64);
	uint8_t *dbr = dbr_ptr(nic, st_devx_get(in, ST_PRM_CQC_DBR_UMEM_VALID), (uint32_t)st_devx_get(in, ST_PRM_CQC_DBR_UMEM_ID),
			       st_devx_get(in, ST_PRM_CQC_DBR_ADDR));
	if (!buf || !dbr) {
		errno = cmd_status(out, outlen, CMD_BAD_PARAM, 0x2);
		return NULL;
	}
	struct emu_cq *cq = emu_cq_new(nic, ctx, n, buf, (volatile uint32_t *)dbr, 1);
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->collapsed = (int)cc;
	struct emu_devx_obj *o = devx_obj_new(OBJ_CQ, cq, nic, ctx, out, outlen);
	if (!o)
		return NULL;
	if (outlen >= 16)
		st_devx_set(out, ST_PRM_CREATE_CQ_OUT_CQN, cq->cqn);
	EMU_LOG("devx CREATE_CQ cqn 0x%x log_size %u cc %u", cq->cqn, log, cc);
	return o;
}

/* ---- CREATE_QP (ref §4.3) ---------------------------------------------- */
struct emu_srq *emu_srq_lookup(uint32_t srqn);

static struct emu_devx_obj *create_qp(struct ibv_context *ctx, struct emu_nic *nic, const void *in, void *out,
				      size_t outlen)
{
	uint32_t service_type = (uint32_t)st_devx_get(in, ST_PRM_QPC_ST);
	if (service_type != ST_MLX5_QPC_ST_RC || !st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_VALID)) {
		errno = cmd_status(out, outlen, CMD_BAD_PARAM, 0x10);
		return NULL;
	}
	uint32_t log_sq = (uint32_t)st_devx_get(in, ST_PRM_QPC_LOG_SQ_SIZE);
	uint32_t rq_type = (uint32_t)st_devx_get(in, ST_PRM_QPC_RQ_TYPE);
	uint32_t log_rq = (uint32_t)st_devx_get(in, ST_PRM_QPC_LOG_RQ_SIZE);
	uint32_t rq_stride = 16u << st_devx_get(in, ST_PRM_QPC_LOG_RQ_STRIDE);
	uint64_t rq_bytes = rq_type == 0 ? ((uint64_t)1 << log_rq) * rq_stride : 0;
	uint32_t nbb = 1u << log_sq;
	uint64_t off = st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_OFFSET);
	uint8_t *wq = umem_ptr(nic, (uint32_t)st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_ID), off, rq_bytes + (uint64_t)nbb * 64);
	uint8_t *dbr = dbr_ptr(nic, st_devx_get(in, ST_PRM_QPC_DBR_UMEM_VALID), (uint32_t)st_devx_get(in, ST_PRM_QPC_DBR_UMEM_ID),
			       st_devx_get(in, ST_PRM_QPC_DBR_ADDR));
	struct emu_cq *scq = emu_cq_lookup(nic, (uint32_t)st_devx_get(in, ST_PRM_QPC_CQN_SND));
	struct emu_cq *rcq = emu_cq_lookup(nic, (uint32_t)st_devx_get(in, ST_PRM_QPC_CQN_RCV));
	struct emu_srq *srq = rq_type == 1 ? emu_srq_lookup((uint32_t)st_devx_get(in, ST_PRM_QPC_SRQN)) : NULL;
	if (!wq || !dbr || !scq || log_sq > 15 || (rq_type == 1 && !srq)) {
		EMU_LOG("devx CREATE_QP rejected: wq %p dbr %p scq %p log_sq %u", (void *)wq, (void *)dbr, (void *)scq, log_sq);
		errno = cmd_status(out, outlen, CMD_BAD_PARAM, 0x11);
		return NULL;
	}
	struct emu_qp *qp = emu_zalloc(sizeof *qp);
	if (!qp)
		return NULL;
	qp->devx = 1;
	qp->rq_buf = rq_type == 0 ? wq : NULL;
	qp->rq_wqe_cnt = rq_type == 0 ? (1u << log_rq) : 0;
	qp->rq_stride = rq_stride;
	qp->sq_buf = wq + rq_bytes;
	qp->sq_wqebb = nbb;
	qp->sq_max_wqe_bb = ST_MLX5_SEND_WQE_MAX_WQEBBS;
	qp->dbrec = (volatile uint32_t *)dbr;
	qp->scq = scq;
	qp->rcq = rcq ? rcq : scq;
	qp->srq = srq;
	qp->inflight = calloc(nbb, sizeof(struct emu_inflight));
	qp->inflight_cap = nbb;
	qp->state = IBV_QPS_RESET;
	uint32_t page = (uint32_t)st_devx_get(in, ST_PRM_QPC_UAR_PAGE);
	pthread_mutex_lock(&nic->lock);
	qp->bf_off = ST_MLX5_BF_OFFSET;
	for (struct emu_uar *u = nic->uars; u; u = u->next)
		if (u->page_id == page)
			qp->uar = u->page;
	int r = qp->inflight ? emu_qp_register(nic, qp) : -1;
	pthread_mutex_unlock(&nic->lock);
	if (r) {
		free(qp->inflight);
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	qp->qpx.qp_base.context = ctx;
	qp->qpx.qp_base.qp_num = qp->qpn;
	qp->qpx.qp_base.qp_type = IBV_QPT_RC;
	struct emu_devx_obj *o = devx_obj_new(OBJ_QP, qp, nic, ctx, out, outlen);
	if (!o)
		return NULL;
	if (outlen >= 12)
		st_devx_set(out, ST_PRM_CREATE_QP_OUT_QPN, qp->qpn);
	EMU_LOG("devx CREATE_QP qpn 0x%x sq %u WQEBBs at %p (umem off %llu, rq %llu B) dbr %p uar_page %u cqn %u",
		qp->qpn, nbb, (void *)qp->sq_buf, (unsigned long long)off, (unsigned long long)rq_bytes, (void *)dbr, page,
		scq->cqn);
	return o;
}

EXPORT struct mlx5dv_devx_obj *mlx5dv_devx_obj_create(struct ibv_context *ctx, const void *in, size_t inlen, void *out,
						      size_t outlen)
{
	struct emu_nic *nic = emu_ctx_nic(ctx);
	if (!in || inlen < 16) {
		errno = EINVAL;
		return NULL;
	}
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	struct emu_devx_obj *o = NULL;
	switch (op) {
	case ST_MLX5_CMD_OP_CREATE_CQ:
		if (inlen < 0x60) {
			errno = cmd_status(out, outlen, CMD_BAD_PARAM, 0x3);
			return NULL;
		}
		o = create_cq(ctx, nic, in, out, outlen);
		break;
	case ST_MLX5_CMD_OP_CREATE_QP:
		if (inlen < ST_PRM_CREATE_QP_IN_SIZE) {
			errno = cmd_status(out, outlen, CMD_BAD_PARAM, 0x4);
			return NULL;
		}
		o = create_qp(ctx, nic, in, out, outlen);
		break;
	default:
		errno = cmd_status(out, outlen, CMD_BAD_OP, op);
		return NULL;
	}
	if (o)
		emu_nic_kick(nic);
	return (struct mlx5dv_devx_obj *)o;
}

/* ---- modify (ref §4.4) ------------------------------------------------------ */
EXPORT int mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	struct emu_devx_obj *o = (struct emu_devx_obj *)obj;
	if (!o || !in || inlen < 16)
		return EINVAL;
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	if (o->kind != OBJ_QP)
		return cmd_status(out, outlen, CMD_BAD_OP, op);
	struct emu_qp *qp = o->object;
	if (st_devx_get(in, ST_PRM_MODIFY_QP_QPN) != qp->qpn)
		return cmd_status(out, outlen, CMD_BAD_PARAM, 0x20);
	if (op != ST_MLX5_CMD_OP_2ERR_QP && op != ST_MLX5_CMD_OP_2RST_QP && inlen < ST_PRM_MODIFY_QP_IN_SIZE)
		return cmd_status(out, outlen, CMD_BAD_PARAM, 0x21);
	int nw, need_cur = -1;
	switch (op) {
	case ST_MLX5_CMD_OP_RST2INIT_QP: need_cur = IBV_QPS_RESET; nw = IBV_QPS_INIT; break;
	case ST_MLX5_CMD_OP_INIT2RTR_QP: need_cur = IBV_QPS_INIT; nw = IBV_QPS_RTR; break;
	case ST_MLX5_CMD_OP_RTR2RTS_QP: need_cur = IBV_QPS_RTR; nw = IBV_QPS_RTS; break;
	case ST_MLX5_CMD_OP_RTS2RTS_QP: need_cur = IBV_QPS_RTS; nw = IBV_QPS_RTS; break;
	case ST_MLX5_CMD_OP_2ERR_QP: nw = IBV_QPS_ERR; break;
	case ST_MLX5_CMD_OP_2RST_QP: nw = IBV_QPS_RESET; break;
	default: return cmd_status(out, outlen, CMD_BAD_OP, op);
	}
	struct emu_nic *nic = o->nic;
	pthread_mutex_lock(&nic->lock);
	if (need_cur >= 0 && qp->state != need_cur) {
		EMU_LOG("devx modify 0x%x on qp 0x%x in state %s rejected", op, qp->qpn, emu_state_name(qp->state));
		pthread_mutex_unlock(&nic->lock);
		return cmd_status(out, outlen, CMD_BAD_RES_STATE, 0x22);
	}
	switch (op) {
	case ST_MLX5_CMD_OP_RST2INIT_QP:
		qp->qp_access = (st_devx_get(in, ST_PRM_QPC_RRE) ? IBV_ACCESS_REMOTE_READ : 0) |
				(st_devx_get(in, ST_PRM_QPC_RWE) ? IBV_ACCESS_REMOTE_WRITE : 0) |
				(st_devx_get(in, ST_PRM_QPC_RAE) ? IBV_ACCESS_REMOTE_ATOMIC : 0);
		qp->port = (uint8_t)st_devx_get(in, ST_PRM_QPC_VHCA_PORT_NUM);
		break;
	case ST_MLX5_CMD_OP_INIT2RTR_QP:
		qp->dest_qpn = (uint32_t)st_devx_get(in, ST_PRM_QPC_REMOTE_QPN);
		qp->dlid = (uint32_t)st_devx_get(in, ST_PRM_QPC_RLID);
		qp->is_global = (int)st_devx_get(in, ST_PRM_QPC_GRH);
		memcpy(qp->dgid, (const uint8_t *)in + ST_PRM_QPC_RGID_BYTE, 16);
		qp->mtu = (uint8_t)st_devx_get(in, ST_PRM_QPC_MTU);
		qp->rq_psn = (uint32_t)st_devx_get(in, ST_PRM_QPC_NEXT_RCV_PSN);
		qp->min_rnr_timer = (uint8_t)st_devx_get(in, ST_PRM_QPC_MIN_RNR_NAK);
		qp->peer = NULL;
		emu_resolve_peer(qp);
		break;
	case ST_MLX5_CMD_OP_RTR2RTS_QP:
		qp->retry_cnt = (uint8_t)st_devx_get(in, ST_PRM_QPC_RETRY_COUNT);
		qp->rnr_retry = (uint8_t)st_devx_get(in, ST_PRM_QPC_RNR_RETRY);
		qp->sq_psn = (uint32_t)st_devx_get(in, ST_PRM_QPC_NEXT_SEND_PSN);
		qp->timeout = (uint8_t)st_devx_get(in, ST_PRM_QPC_ACK_TIMEOUT);
		break;
	case ST_MLX5_CMD_OP_2ERR_QP:
		emu_qp_to_error(qp);
		break;
	case ST_MLX5_CMD_OP_2RST_QP:
		emu_qp_reset_nic_state(qp);
		break;
	}
	qp->state = nw;
	qp->qpx.qp_base.state = (enum ibv_qp_state)nw;
	EMU_LOG("devx qp 0x%x -> %s (remote qpn 0x%x rlid %u)", qp->qpn, emu_state_name(nw), qp->dest_qpn, qp->dlid);
	pthread_mutex_unlock(&nic->lock);
	emu_nic_kick(nic);
	return cmd_status(out, outlen, CMD_OK, 0);
}

EXPORT int mlx5dv_devx_obj_query(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	struct emu_devx_obj *o = (struct emu_devx_obj *)obj;
	if (!o || !in || inlen < 8 || !out)
		return EINVAL;
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	if (op == ST_MLX5_CMD_OP_QUERY_QP && o->kind == OBJ_QP) {
		struct emu_qp *qp = o->object;
		memset(out, 0, outlen);
		cmd_status(out, outlen, CMD_OK, 0);
		/* query_qp_out carries the qpc at bit 0xc0 like create_qp_in; qpc.state
		 * is its first 4 bits (inferred from qpc.st at 0xc8; not in the reference) */
		static const int map[] = { ST_MLX5_QPC_STATE_RST, ST_MLX5_QPC_STATE_INIT, ST_MLX5_QPC_STATE_RTR,
					   ST_MLX5_QPC_STATE_RTS, 7, ST_MLX5_QPC_STATE_SQER, ST_MLX5_QPC_STATE_ERR };
		if (outlen >= 0x30) {
			st_devx_set(out, ST_PRM_QPC_BASE_BITS, 4, (uint64_t)map[qp->state]);
			st_devx_set(out, ST_PRM_QPC_REMOTE_QPN, qp->dest_qpn);
			st_devx_set(out, ST_PRM_QPC_LOG_SQ_SIZE, (uint64_t)__builtin_ctz(qp->sq_wqebb));
		}
		return 0;
	}
	return cmd_status(out, outlen, CMD_BAD_OP, op);
}

EXPORT int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj)
{
	struct emu_devx_obj *o = (struct emu_devx_obj *)obj;
	if (!o)
		return EINVAL;
	struct emu_nic *nic = o->nic;
	if (o->kind == OBJ_CQ) {
		pthread_mutex_lock(&nic->lock);
		for (int i = 0; i < nic->nq; i++)
			if (nic->qlist[i]->scq == o->object || nic->qlist[i]->rcq == o->object) {
				pthread_mutex_unlock(&nic->lock);
				return EBUSY;
			}
		pthread_mutex_unlock(&nic->lock);
	}
	devx_obj_release(o);
	free(o);
	return 0;
}

EXPORT int mlx5dv_devx_qp_query(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_qp_modify(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_cq_query(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_cq_modify(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }

EXPORT int mlx5dv_devx_general_cmd(struct ibv_context *ctx, const void *in, size_t inlen, void *out, size_t outlen)
{
	if (!in || inlen < 8 || !out || outlen < 8)
		return EINVAL;
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	struct emu_nic *nic = emu_ctx_nic(ctx);
	switch (op) {
	case ST_MLX5_CMD_OP_QUERY_HCA_CAP:
		/* capabilities are returned zeroed: their layout is not part of the reference */
		memset(out, 0, outlen);
		return cmd_status(out, outlen, CMD_OK, 0);
	case ST_MLX5_CMD_OP_ALLOC_PD:
		memset(out, 0, outlen);
		cmd_status(out, outlen, CMD_OK, 0);
		if (outlen >= 12) {
			pthread_mutex_lock(&nic->lock);
			st_devx_set(out, 0x48, 24, nic->next_pdn++);
			pthread_mutex_unlock(&nic->lock);
		}
		return 0;
	default:
		return cmd_status(out, outlen, CMD_BAD_OP, op);
	}
}
