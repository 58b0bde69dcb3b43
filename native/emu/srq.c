/* libibverbs.so.1 of the emulated HCA: shared receive queues.  SRQ numbers
 * index a process-wide table, which DevX CREATE_QP (rq_type 1) looks up.
 * The ring is rdma-core's mlx5 SRQ (struct emu_srq): WQEs of a next segment
 * and data segments, a free list threaded through next_wqe_index, and a
 * doorbell record that counts the WQEs posted -- what mlx5dv_init_obj(SRQ)
 * hands to a library that posts receives itself (UCX rc_mlx5). */
#include <string.h>
#include <errno.h>
#include <stdlib.h>

#include "emu_internal.h"

static struct emu_srq *g_srqs[256];

/* ---- SRQ -------------------------------------------------------------------- */
/* An SRQ's buffers and itself freed (not made, or destroyed); ENOMEM for the caller that could not make it. */
static struct ibv_srq *srq_unmade(struct emu_srq *s)
{
	emu_ring_free(&s->sbuf, &s->dbuf, s->buf);
	free(s->wrid);
	free(s);
	errno = ENOMEM;
	return NULL;
}

static struct ibv_srq *srq_create(struct ibv_context *c, struct ibv_pd *pd, struct ibv_srq_init_attr *a)
{
	struct emu_nic *nic = to_ectx(c)->nic;
	if (a->attr.max_wr < 1 || a->attr.max_wr > 32767 || a->attr.max_sge > EMU_MAX_SGE - 2) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_srq *s = emu_zalloc(sizeof *s);
	if (!s)
		return NULL;
	s->wqe_cnt = roundup_pow2(a->attr.max_wr + 1);
	s->stride = roundup_pow2(16 + (a->attr.max_sge ? a->attr.max_sge : 1) * 16);
	s->max_sge = (s->stride - 16) / 16;
	/* on a parent domain with allocators: the application's ring and doorbell record (pd.c) */
	int from_pd = pd && emu_pd_of(pd) != (struct emu_pd *)pd;
	size_t bytes = (size_t)s->wqe_cnt * s->stride;
	s->buf = emu_ring_alloc(&s->sbuf, &s->dbuf, pd, bytes, MLX5DV_RES_TYPE_SRQ);
	s->wrid = calloc(s->wqe_cnt, sizeof(uint64_t));
	if (!s->buf || !s->wrid)
		return srq_unmade(s);
	s->dbrec = (volatile uint32_t *)(from_pd ? s->dbuf.ptr : s->dbr_storage);
	memset(s->buf, 0, (size_t)s->wqe_cnt * s->stride);
	for (uint32_t w = 0; w < s->wqe_cnt; w++) { /* the free list: 0 -> 1 -> ... -> cnt-1 */
		uint16_t next = htobe16((uint16_t)((w + 1) & (s->wqe_cnt - 1)));
		memcpy(s->buf + (size_t)w * s->stride + 2, &next, 2);
	}
	s->head = 0;
	s->tail = s->wqe_cnt - 1;
	s->limit = a->attr.srq_limit;
	pthread_spin_init(&s->plock, PTHREAD_PROCESS_PRIVATE);
	pthread_mutex_lock(&nic->lock);
	uint32_t i = EMU_FREE_SLOT(g_srqs, 256);
	if (i == 256) {
		pthread_mutex_unlock(&nic->lock);
		return srq_unmade(s);
	}
	g_srqs[i] = s;
	s->srqn = i;
	pthread_mutex_unlock(&nic->lock);
	s->srq.context = c;
	s->srq.srq_context = a->srq_context;
	s->srq.pd = pd;
	s->srq.handle = i;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	a->attr.max_wr = s->wqe_cnt - 1;
	a->attr.max_sge = s->max_sge;
	return &s->srq;
}

EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a)
{
	return srq_create(pd->context, pd, a);
}

struct ibv_srq *emu_create_srq_ex(struct ibv_context *c, struct ibv_srq_init_attr_ex *a)
{
	if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type != IBV_SRQT_BASIC)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_srq_init_attr ia = { .srq_context = a->srq_context, .attr = a->attr };
	struct ibv_srq *s = srq_create(c, a->pd, &ia);
	if (s)
		a->attr = ia.attr;
	return s;
}

EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	struct emu_nic *nic = to_ectx(srq->context)->nic;
	pthread_mutex_lock(&nic->lock);
	g_srqs[s->srqn] = NULL;
	pthread_mutex_unlock(&nic->lock);
	srq_unmade(s);
	return 0;
}

EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	if (mask & IBV_SRQ_MAX_WR)
		return EINVAL;
	if (mask & IBV_SRQ_LIMIT)
		s->limit = attr->srq_limit;
	return 0;
}

EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	attr->max_wr = s->wqe_cnt - 1;
	attr->max_sge = s->max_sge;
	attr->srq_limit = s->limit;
	return 0;
}

EXPORT struct emu_srq *emu_srq_lookup(uint32_t srqn) { return srqn < 256 ? g_srqs[srqn] : NULL; }

/* The NIC takes the next posted WQE: the one at its head, whose link names
 * the next head.  0 and the WQE index, or -1 when none is posted. */
int emu_srq_take(struct emu_srq *s, uint32_t *wqe)
{
	uint16_t posted = (uint16_t)be32toh(s->dbrec[0]);
	if ((uint16_t)(posted - s->nic_count) == 0)
		return -1;
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	uint32_t idx = s->nic_head & (s->wqe_cnt - 1);
	uint16_t next;
	memcpy(&next, s->buf + (size_t)idx * s->stride + 2, 2);
	s->nic_head = be16toh(next);
	s->nic_count++;
	*wqe = idx;
	return 0;
}
