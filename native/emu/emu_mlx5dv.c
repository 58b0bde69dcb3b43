/* libmlx5.so.1 of the emulated HCA: mlx5dv direct verbs for verbs objects
 * (init_obj, create_qp/cq), DevX UARs, umems and EQs -- the surface used by
 * UCX's rc_mlx5 and by IBGDA-style clients (NVSHMEM setup order, reference
 * §5.1).  The DevX PRM commands themselves are in devx_prm.c.  The emulator
 * state lives in libibverbs.so.1 (emu_* helpers exported under
 * SIGMATRACE_EMU_PRIVATE). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

#include "emu_devx.h"

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
		cq->dv_owned = 1;
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
	if (m && (m->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_DC)) {
		/* DC (dct.c): DCTs where the HCA has DC (SIGMATRACE_EMU_DC=1; UCX 1.13
		 * probes DC support with exactly this call, and would then want verbs
		 * DCIs, which are not emulated); NVSHMEM makes its DCTs here */
		if (!c || !emu_ctx_nic(c)->dc_enabled || !a || a->qp_type != IBV_QPT_DRIVER ||
		    m->dc_init_attr.dc_type != MLX5DV_DCTYPE_DCT ||
		    (m->comp_mask & ~(uint64_t)(MLX5DV_QP_INIT_ATTR_MASK_DC | MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS))) {
			errno = EOPNOTSUPP;
			return NULL;
		}
		return emu_dct_create(c, a, m->dc_init_attr.dct_access_key);
	}
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
	if ((a->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) || (a->wc_flags & ~wc_ok) ||
	    ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (a->flags & ~(uint32_t)(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (a->cqe < 1 || a->cqe > 4194303 || a->comp_vector >= (uint32_t)c->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	/* on a parent domain (IBV_CQ_INIT_ATTR_MASK_PD): its allocators give the
	 * ring (MLX5DV_RES_TYPE_CQ) and the doorbell record (pd.c) */
	struct ibv_pd *pdom = (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) ? a->parent_domain : NULL;
	if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) && (!pdom || emu_pd_of(pdom) == (struct emu_pd *)pdom)) {
		errno = EINVAL; /* rdma-core: the PD attribute must be a parent domain */
		return NULL;
	}
	uint32_t ncqe = roundup_pow2(a->cqe + 1);
	struct emu_buf cbuf = { 0 }, dbuf = { 0 };
	if (pdom && (emu_buf_alloc(&cbuf, pdom, (size_t)ncqe * cqe_size, 4096, MLX5DV_RES_TYPE_CQ) ||
		     emu_buf_alloc(&dbuf, pdom, ST_MLX5_DBR_SIZE, 8, MLX5DV_RES_TYPE_DBR))) {
		emu_buf_free(&cbuf);
		errno = ENOMEM;
		return NULL;
	}
	struct emu_cq *cq = emu_cq_new_sized(emu_ctx_nic(c), c, ncqe, cqe_size, cbuf.ptr, dbuf.ptr, 0);
	if (!cq) {
		emu_buf_free(&cbuf);
		emu_buf_free(&dbuf);
		errno = ENOMEM;
		return NULL;
	}
	if (pdom) { /* the ring is the application's: made empty here as for the emulator's own */
		cq->cbuf = cbuf;
		cq->dbuf = dbuf;
		for (uint32_t i = 0; i < ncqe; i++)
			emu_cqe_at(cq, i)->op_own = (ST_MLX5_CQE_INVALID << 4) | 1;
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
	/* NVSHMEM puts its WQ, CQ and doorbell records in GPU memory by default
	 * (NVSHMEM_IBGDA_FORCE_NIC_BUF_MEMTYPE=gpumem): such a umem is a device
	 * range of dma.c, the NIC reads and writes it through CUDA */
	u->gpu = emu_devmem_register((uint64_t)(uintptr_t)addr, size) == 1;
	EMU_LOG("umem %u: %p + %zu%s", i, addr, size, u->gpu ? " (GPU memory)" : "");
	return (struct mlx5dv_devx_umem *)u;
}

/* A dma-buf umem has no address (umem_in.addr is the offset into the
 * dma-buf), and the emulated NIC cannot reach a dma-buf's pages (dma.c): it
 * fails with EOPNOTSUPP, and NVSHMEM registers the buffer by address instead
 * (ibgda.cpp ibgda_check_nic_mapping_memtypes: dmabuf_support_for_control_buffers
 * false, then ibgda_mobject_nic_map without dmabuf). */
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
	if (u->gpu)
		emu_devmem_unregister((uint64_t)(uintptr_t)u->addr, u->size);
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

