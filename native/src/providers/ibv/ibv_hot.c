/*
 * libibverbs provider: the hot calls.
 *
 * ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq and
 * ibv_post_srq_recv are static inline functions in verbs.h that call through
 * context->ops, so no symbol shim ever sees them.  When a context is opened
 * we keep its provider's functions in our context entry and store our
 * wrappers in context->ops (the ops table is embedded in the context, one per
 * context, so it is patched in place — one atomic pointer store per slot).
 * The extended post API (ibv_qp_to_qp_ex, then ibv_wr_start / ibv_wr_send /
 * ibv_wr_set_sge / ... / ibv_wr_complete) dispatches through function
 * pointers in each ibv_qp_ex; those are patched per QP the same way.  Which
 * slots: ibv_hot_ops.def and ibv_qpx_ops.def (X-macro tables); the wrappers
 * of one shape (the qp_ex setters) are generated from the latter.
 *
 * Modes (F3):
 *   aggregate  st_agg_add per work request / completion, keyed by
 *              (type, opcode, local QPN, peer = dest QPN | peer node << 32)
 *   simple     one IBV_POST_SEND / IBV_POST_RECV / IBV_WR_COMPLETE per call
 *   full       in addition one IBV_SEND_WR / IBV_RECV_WR per work request,
 *              IBV_POLL_CQ per poll (a run of empty ones: its first and last,
 *              st_idle_poll), IBV_WC per completion,
 *              IBV_REQ_NOTIFY_CQ
 *
 * Post events carry the time the application called; they are written after
 * the call because only then are the return value and the bad WR known: the
 * WRs in front of *bad_wr were accepted (and announced to the NIC), the rest
 * were not and are not recorded.
 *
 * No allocation, no lock: a context lookup (one compare for the first
 * context), a walk of the WR chain, and 24-byte records.  (One exception,
 * finding 9: a post_send on a QP whose real BlueFlame register the hijack
 * also forwards to holds that register's ring lock.)  What is shared
 * between wrappers is shared by macros that expand in place, so no wrapper
 * makes a call or a pointer hop more than before.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ibv_internal.h"

static inline uint32_t sge_bytes(const struct ibv_sge *sg, int n)
{
	uint32_t b = 0;
	for (int i = 0; i < n; i++)
		b += sg[i].length;
	return b;
}

/* remote address / rkey of a send WR, by opcode */
static inline void wr_remote(const struct ibv_send_wr *wr, uint64_t *raddr, uint32_t *rkey)
{
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		*raddr = wr->wr.rdma.remote_addr;
		*rkey = wr->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		*raddr = wr->wr.atomic.remote_addr;
		*rkey = wr->wr.atomic.rkey;
		break;
	default: /* sends: on UD QPs the destination QPN goes in raddr */
		*raddr = 0;
		*rkey = 0;
		break;
	}
}

/* The start every post wrapper shares, expanded in place (no call, no
 * pointer beyond the provider's): find the provider's function in the
 * context entry; provider off: forward; on: stamp the application's call,
 * make it (`call`, with c in scope), keep errno, and see where the accepted
 * WRs stop (*bad, on failure). */
#define POST_CALL(owner, call, wr_type)                                                         \
	struct st_ibv_ctx *c = st_ibv_ctx_find((owner)->context);                               \
	if (unlikely(!c)) /* the context went away under us: nothing to call */                 \
		return EINVAL;                                                                  \
	if (!st_provider_on(ST_PROV_IBV))                                                       \
		return call;                                                                    \
	uint64_t t0 = st_tsc();                                                                 \
	int ret = call;                                                                         \
	int saved = errno;                                                                      \
	const wr_type *stop = (ret && bad) ? *bad : NULL

/* After POST_CALL on a QP: the accepted WRs.  Aggregate mode: a counter per WR
 * (opcode agg_opcode, of w), and the wrapper returns.  Else they are counted
 * (n, total bytes) and the code given last runs for every one in full mode (w and its
 * bytes in scope); the wrapper then records the call. */
#define POST_WRS(wr_type, agg_ev, agg_opcode, ...)                                                   \
	uint32_t qpn = qp->qp_num;                                                                   \
	if (st_aggregate()) {                                                                        \
		uint64_t peer = st_ibv_qp_peer(st_ibv_qp_find(qp->context, qpn));                    \
		for (const wr_type *w = wr; w && w != stop; w = w->next)                             \
			st_agg_add(agg_ev, agg_opcode, qpn, peer, sge_bytes(w->sg_list, w->num_sge)); \
		errno = saved;                                                                       \
		return ret;                                                                          \
	}                                                                                            \
	int full = st_full();                                                                        \
	unsigned n = 0;                                                                              \
	uint64_t total = 0;                                                                          \
	for (const wr_type *w = wr; w && w != stop; w = w->next) {                                   \
		uint32_t bytes = sge_bytes(w->sg_list, w->num_sge);                                  \
		total += bytes;                                                                      \
		n++;                                                                                 \
		if (full) {                                                                          \
			__VA_ARGS__;                                                                 \
		}                                                                                    \
	}

/* rdma-core rings the QP's real BlueFlame register inside post_send; where the
 * hijack's poller forwards to the same bfreg for a proxied QP, the post holds
 * that bfreg's ring lock (finding 9, hijack.h), traced or not.  Other
 * contexts pay one load. */
static inline int rung_under_lock(uint32_t *lock, int ret)
{
	int saved = errno;
	st_hijack_ring_leave(lock);
	errno = saved;
	return ret;
}

static inline uint32_t *qp_ring_lock(const struct st_ibv_ctx *c, const struct ibv_qp *qp)
{
	if (likely(!__atomic_load_n(&c->ring_locks, __ATOMIC_RELAXED)))
		return NULL;
	const struct st_ibv_qp *q = st_ibv_qp_find(qp->context, qp->qp_num);
	return q ? __atomic_load_n(&q->ring_lock, __ATOMIC_ACQUIRE) : NULL;
}

static int post_send_ringing(const struct st_ibv_ctx *c, struct ibv_qp *qp, struct ibv_send_wr *wr,
			     struct ibv_send_wr **bad)
{
	uint32_t *lock = qp_ring_lock(c, qp);
	if (likely(!lock))
		return c->post_send(qp, wr, bad);
	st_hijack_ring_enter(lock);
	return rung_under_lock(lock, c->post_send(qp, wr, bad));
}

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	POST_CALL(qp, post_send_ringing(c, qp, wr, bad), struct ibv_send_wr);
	POST_WRS(struct ibv_send_wr, ST_EV_IBV_SEND_WR, (uint16_t)w->opcode, {
		uint64_t raddr;
		uint32_t rkey;
		wr_remote(w, &raddr, &rkey);
		if (qp->qp_type == IBV_QPT_UD && !raddr) {
			raddr = w->wr.ud.remote_qpn;
			rkey = w->wr.ud.ah ? st_obj_id(w->wr.ud.ah, NULL) : 0; /* its IBV_CREATE_AH: the destination port */
		}
		st_ev_ext_at(t0, ST_EV_IBV_SEND_WR, (uint16_t)((w->opcode & 0xff) | ((w->send_flags & 0xff) << 8)), qpn,
			     w->wr_id, raddr, (uint16_t)w->num_sge, rkey, bytes);
	});
	st_ev_ext_at(t0, ST_EV_IBV_POST_SEND, (uint16_t)(n > 0xffff ? 0xffff : n), qpn, total,
		     wr ? wr->wr_id : 0, wr ? (uint16_t)wr->opcode : 0, (uint32_t)ret, 0);
	errno = saved;
	return ret;
}

static int wrap_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	POST_CALL(qp, c->post_recv(qp, wr, bad), struct ibv_recv_wr);
	POST_WRS(struct ibv_recv_wr, ST_EV_IBV_RECV_WR, 0,
		 st_ev_ext_at(t0, ST_EV_IBV_RECV_WR, (uint16_t)w->num_sge, qpn, w->wr_id,
			      w->num_sge ? w->sg_list[0].addr : 0, 0, w->num_sge ? w->sg_list[0].lkey : 0, bytes));
	st_ev_ext_at(t0, ST_EV_IBV_POST_RECV, (uint16_t)(n > 0xffff ? 0xffff : n), qpn, total, wr ? wr->wr_id : 0, 0,
		     (uint32_t)ret, 0);
	errno = saved;
	return ret;
}

static int wrap_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	POST_CALL(srq, c->post_srq_recv(srq, wr, bad), struct ibv_recv_wr);
	uint32_t id = st_obj_id(srq, NULL);
	unsigned n = 0;
	uint64_t total = 0;
	for (const struct ibv_recv_wr *w = wr; w && w != stop; w = w->next) {
		uint32_t bytes = sge_bytes(w->sg_list, w->num_sge);
		if (st_aggregate())
			st_agg_add(ST_EV_IBV_POST_SRQ_RECV, 0, id, 0, bytes);
		total += bytes;
		n++;
	}
	if (!st_aggregate()) {
		struct st_event *e = st_reserve(1);
		if (e) {
			e->tsc = t0;
			e->type = ST_EV_IBV_POST_SRQ_RECV;
			e->aux = (uint16_t)(n > 0xffff ? 0xffff : n);
			e->obj = id;
			e->arg = total;
			st_commit();
		}
	}
	errno = saved;
	return ret;
}

static int wrap_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct st_ibv_ctx *c = st_ibv_ctx_find(cq->context);
	if (unlikely(!c))
		return -1;
	int n = c->poll_cq(cq, num, wc);
	if (!st_provider_on(ST_PROV_IBV))
		return n;
	/* simple mode omits high-frequency polling (F3) */
	if (st_aggregate()) {
		if (n > 0) {
			int saved = errno;
			for (int i = 0; i < n; i++) {
				const struct ibv_wc *w = &wc[i];
				uint64_t peer = st_ibv_qp_peer(st_ibv_qp_find(cq->context, w->qp_num));
				st_agg_add(ST_EV_IBV_WC, (uint16_t)((w->status & 0xff) | ((w->opcode & 0xff) << 8)),
					   w->qp_num, peer, w->status == IBV_WC_SUCCESS ? w->byte_len : 0);
			}
			errno = saved;
		}
		return n;
	}
	if (!st_full())
		return n;
	int saved = errno;
	uint32_t id = st_obj_id(cq, NULL);
	if (n == 0) { /* empty: a run of them is its first and last poll (st_idle_poll) */
		st_idle_poll(st_tsc(), ST_EV_IBV_POLL_CQ, id, (uint32_t)num);
		errno = saved;
		return n;
	}
	st_ev(ST_EV_IBV_POLL_CQ, (uint16_t)(n < 0 ? 0xffff : n), id, (uint32_t)num);
	for (int i = 0; i < n; i++) {
		const struct ibv_wc *w = &wc[i];
		/* byte_len is defined only for successful receive completions;
		 * what the provider wrote is passed on as is */
		st_ev_ext(ST_EV_IBV_WC, (uint16_t)((w->status & 0xff) | ((w->opcode & 0xff) << 8)), w->qp_num, w->wr_id,
			  (uint64_t)be32toh(w->imm_data), (uint16_t)w->wc_flags, w->byte_len, w->vendor_err);
	}
	errno = saved;
	return n;
}

static int wrap_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct st_ibv_ctx *c = st_ibv_ctx_find(cq->context);
	if (unlikely(!c))
		return EINVAL;
	int ret = c->req_notify_cq(cq, solicited_only);
	if (st_provider_on(ST_PROV_IBV) && st_full()) {
		int saved = errno;
		st_ev(ST_EV_IBV_REQ_NOTIFY_CQ, (uint16_t)!!solicited_only, st_obj_id(cq, NULL), (uint64_t)(int64_t)ret);
		errno = saved;
	}
	return ret;
}

/* Called with the provider's lock held, once per opened context. */
void st_ibv_patch_ops(struct st_ibv_ctx *c, struct ibv_context *ctx)
{
	struct ibv_context_ops *ops = &ctx->ops;
	/* keep the provider's functions; never our own (a context seen twice) */
#define ST_HOT_OP(slot)                   \
	if (ops->slot != wrap_##slot)     \
		c->slot = ops->slot;
#include "ibv_hot_ops.def"
	__atomic_store_n(&c->ctx, ctx, __ATOMIC_RELEASE);
	/* a slot the provider left empty stays empty: the inline call would
	 * have crashed without us, and must fail the same way with us */
#define ST_HOT_OP(slot)                                                  \
	if (c->slot)                                                     \
		__atomic_store_n(&ops->slot, wrap_##slot, __ATOMIC_RELEASE);
#include "ibv_hot_ops.def"
	st_ibv_patch_vctx(c, ctx);
}

/* ==== the ibv_qp_ex API ====================================================
 * Between wr_start and wr_complete the application builds WRs: it sets
 * qpx->wr_id / wr_flags, calls one opcode setter (wr_send, wr_rdma_write, ...)
 * and then a data setter (wr_set_sge, wr_set_inline_data, ...).  We note each
 * WR in the QP's batch (the application serialises calls on one QP, as the
 * API requires, so the batch needs no lock) and record at wr_complete, when
 * the provider has accepted or refused the whole batch.  wr_abort drops it.
 */
static inline struct st_ibv_qp *xqp(struct ibv_qp_ex *qpx)
{
	struct st_ibv_qp *q = st_ibv_qp_find(qpx->qp_base.context, qpx->qp_base.qp_num);
	return likely(q && __atomic_load_n(&q->qpx, __ATOMIC_ACQUIRE) == qpx) ? q : NULL;
}

static void xwr_flush(struct st_ibv_qp *q, uint64_t tsc);

static inline void xwr_begin(struct st_ibv_qp *q, struct ibv_qp_ex *qpx, uint8_t opcode, uint64_t raddr, uint32_t rkey)
{
	if (!st_provider_on(ST_PROV_IBV))
		return;
	if (q->xn == ST_IBV_XWR_BATCH) /* a long batch: write what we have */
		xwr_flush(q, st_tsc());
	struct st_ibv_xwr *w = &q->xwr[q->xn];
	w->wr_id = qpx->wr_id;
	w->flags = (uint8_t)qpx->wr_flags;
	w->opcode = opcode;
	w->raddr = raddr;
	w->rkey = rkey;
	w->bytes = 0;
	w->num_sge = 0;
	q->xcur = (int)q->xn++;
	q->xtotal++;
}

static inline void xwr_data(struct st_ibv_qp *q, uint32_t bytes, uint16_t nsge)
{
	if (q->xcur >= 0) {
		q->xwr[q->xcur].bytes += bytes;
		q->xwr[q->xcur].num_sge += nsge;
		q->xbytes += bytes;
	}
}

/* per-WR records of the noted WRs (full) or counters (aggregate) */
static void xwr_flush(struct st_ibv_qp *q, uint64_t tsc)
{
	uint32_t qpn = q->qpn;
	if (st_aggregate()) {
		uint64_t peer = st_ibv_qp_peer(q);
		for (uint32_t i = 0; i < q->xn; i++)
			st_agg_add(ST_EV_IBV_SEND_WR, q->xwr[i].opcode, qpn, peer, q->xwr[i].bytes);
	} else if (st_full()) {
		for (uint32_t i = 0; i < q->xn; i++) {
			const struct st_ibv_xwr *w = &q->xwr[i];
			st_ev_ext_at(tsc, ST_EV_IBV_SEND_WR, (uint16_t)(w->opcode | (w->flags << 8)), qpn, w->wr_id,
				     w->raddr, w->num_sge, w->rkey, w->bytes);
		}
	}
	q->xn = 0;
	q->xcur = -1;
}

static inline void xwr_reset(struct st_ibv_qp *q)
{
	q->xn = q->xtotal = 0;
	q->xbytes = 0;
	q->xcur = -1;
}

static inline uint32_t data_buf_bytes(const struct ibv_data_buf *list, size_t n)
{
	uint32_t b = 0;
	for (size_t i = 0; i < n; i++)
		b += (uint32_t)list[i].length;
	return b;
}

/* UD: the destination QPN, as in post_send, unless the opcode gave one */
static inline void xwr_ud_dest(struct st_ibv_qp *q, struct ibv_ah *ah, uint32_t rqpn)
{
	if (q->xcur >= 0 && !q->xwr[q->xcur].raddr) {
		q->xwr[q->xcur].raddr = rqpn;
		q->xwr[q->xcur].rkey = ah ? st_obj_id(ah, NULL) : 0;
	}
}

/* The wrappers of ibv_qpx_ops.def.  One that can no longer find its QP entry
 * still has to reach the provider.  That only happens when the QP was
 * destroyed and its number reused on a context whose qp_ex we have not
 * patched yet — the old ibv_qp_ex is then dead memory the application must
 * not use; fail safe by doing nothing (the provider would have crashed or
 * posted garbage). */
#define ST_QPX_OP(fn, params, args, note)          \
	static void x_##fn params                  \
	{                                          \
		struct st_ibv_qp *q = xqp(qpx);    \
		if (unlikely(!q))                  \
			return;                    \
		note;                              \
		q->xops->fn args;                  \
	}
#define ST_QPX_BY_HAND(fn)
#include "ibv_qpx_ops.def"

/* wr_complete: the provider accepted or refused the whole batch; the WRs
 * are recorded now, with the time the application called. */
static int x_wr_complete(struct ibv_qp_ex *qpx)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return EINVAL;
	uint64_t t0 = st_tsc();
	uint32_t *lock = __atomic_load_n(&q->ring_lock, __ATOMIC_ACQUIRE); /* rings like post_send */
	if (lock)
		st_hijack_ring_enter(lock);
	int ret = q->xops->wr_complete(qpx);
	if (lock)
		ret = rung_under_lock(lock, ret);
	if (!st_provider_on(ST_PROV_IBV)) {
		xwr_reset(q);
		return ret;
	}
	int saved = errno;
	uint32_t total = q->xtotal;
	uint64_t bytes = q->xbytes;
	if (ret == 0)
		xwr_flush(q, t0);
	/* a refused batch posts nothing: aux (WRs accepted) is 0 */
	if (!st_aggregate()) {
		struct st_event *e = st_reserve(1);
		if (e) {
			e->tsc = t0;
			e->type = ST_EV_IBV_WR_COMPLETE;
			e->aux = ret ? 0 : (uint16_t)(total > 0xffff ? 0xffff : total);
			e->obj = q->qpn;
			e->arg = ret ? 0 : bytes;
			st_commit();
		}
	}
	xwr_reset(q);
	errno = saved;
	return ret;
}

/* Replace the qp_ex function pointers of one QP.  Not a hot path (once per
 * QP); may allocate.  Slots the provider left NULL stay NULL. */
void st_ibv_qp_ex_patch(struct ibv_qp_ex *qpx)
{
	if (qpx->wr_start == x_wr_start) /* already ours */
		return;
	struct st_ibv_qp *q = st_ibv_qp_get(qpx->qp_base.context, qpx->qp_base.qp_num);
	if (!q)
		return;
	if (!q->xops) {
		q->xops = calloc(1, sizeof(*q->xops));
		q->xwr = calloc(ST_IBV_XWR_BATCH, sizeof(*q->xwr));
		if (!q->xops || !q->xwr) {
			free(q->xops);
			free(q->xwr);
			q->xops = NULL;
			q->xwr = NULL;
			return;
		}
	}
	struct st_ibv_qp_ex_ops *provider_ops = q->xops;
	xwr_reset(q);
#define ST_QPX_OP(fn, params, args, note) provider_ops->fn = qpx->fn;
#define ST_QPX_BY_HAND(fn) provider_ops->fn = qpx->fn;
#include "ibv_qpx_ops.def"
	__atomic_store_n(&q->qpx, qpx, __ATOMIC_RELEASE);
	/* in the table's order: wr_start last, it marks the QP as patched */
#define ST_QPX_OP(fn, params, args, note)                                               \
	if (provider_ops->fn)                                                           \
		__atomic_store_n(&qpx->fn, x_##fn, __ATOMIC_RELEASE);
#define ST_QPX_BY_HAND(fn) ST_QPX_OP(fn, , , )
#include "ibv_qpx_ops.def"
}
