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
 * pointers in each ibv_qp_ex; those are patched per QP the same way.
 *
 * Modes (F3):
 *   aggregate  st_agg_add per work request / completion, keyed by
 *              (type, opcode, local QPN, peer = dest QPN | peer node << 32)
 *   simple     one IBV_POST_SEND / IBV_POST_RECV / IBV_WR_COMPLETE per call
 *   full       in addition one IBV_SEND_WR / IBV_RECV_WR per work request,
 *              IBV_POLL_CQ per poll (empty ones too), IBV_WC per completion,
 *              IBV_REQ_NOTIFY_CQ
 *
 * Post events carry the time the application called; they are written after
 * the call because only then are the return value and the bad WR known: the
 * WRs in front of *bad_wr were accepted (and announced to the NIC), the rest
 * were not and are not recorded.
 *
 * No allocation, no lock: a context lookup (one compare for the first
 * context), a walk of the WR chain, and 24-byte records.
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

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct st_ibv_ctx *c = st_ibv_ctx_find(qp->context);
	if (unlikely(!c)) /* the context went away under us: nothing to call */
		return EINVAL;
	if (!st_provider_on(ST_PROV_IBV))
		return c->post_send(qp, wr, bad);
	uint64_t t0 = st_tsc();
	int ret = c->post_send(qp, wr, bad);
	int saved = errno;
	const struct ibv_send_wr *stop = (ret && bad) ? *bad : NULL;
	uint32_t qpn = qp->qp_num;
	if (st_aggregate()) {
		uint64_t peer = st_ibv_qp_peer(st_ibv_qp_find(qp->context, qpn));
		for (const struct ibv_send_wr *w = wr; w && w != stop; w = w->next)
			st_agg_add(ST_EV_IBV_SEND_WR, (uint16_t)w->opcode, qpn, peer, sge_bytes(w->sg_list, w->num_sge));
		errno = saved;
		return ret;
	}
	int full = st_full();
	unsigned n = 0;
	uint64_t total = 0;
	for (const struct ibv_send_wr *w = wr; w && w != stop; w = w->next) {
		uint32_t bytes = sge_bytes(w->sg_list, w->num_sge);
		total += bytes;
		n++;
		if (full) {
			uint64_t raddr;
			uint32_t rkey;
			wr_remote(w, &raddr, &rkey);
			if (qp->qp_type == IBV_QPT_UD && !raddr)
				raddr = w->wr.ud.remote_qpn;
			st_ev_ext_at(t0, ST_EV_IBV_SEND_WR, (uint16_t)((w->opcode & 0xff) | ((w->send_flags & 0xff) << 8)),
				     qpn, w->wr_id, raddr, (uint16_t)w->num_sge, rkey, bytes);
		}
	}
	st_ev_ext_at(t0, ST_EV_IBV_POST_SEND, (uint16_t)(n > 0xffff ? 0xffff : n), qpn, total,
		     wr ? wr->wr_id : 0, wr ? (uint16_t)wr->opcode : 0, (uint32_t)ret, 0);
	errno = saved;
	return ret;
}

static int wrap_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct st_ibv_ctx *c = st_ibv_ctx_find(qp->context);
	if (unlikely(!c))
		return EINVAL;
	if (!st_provider_on(ST_PROV_IBV))
		return c->post_recv(qp, wr, bad);
	uint64_t t0 = st_tsc();
	int ret = c->post_recv(qp, wr, bad);
	int saved = errno;
	const struct ibv_recv_wr *stop = (ret && bad) ? *bad : NULL;
	uint32_t qpn = qp->qp_num;
	if (st_aggregate()) {
		uint64_t peer = st_ibv_qp_peer(st_ibv_qp_find(qp->context, qpn));
		for (const struct ibv_recv_wr *w = wr; w && w != stop; w = w->next)
			st_agg_add(ST_EV_IBV_RECV_WR, 0, qpn, peer, sge_bytes(w->sg_list, w->num_sge));
		errno = saved;
		return ret;
	}
	int full = st_full();
	unsigned n = 0;
	uint64_t total = 0;
	for (const struct ibv_recv_wr *w = wr; w && w != stop; w = w->next) {
		uint32_t bytes = sge_bytes(w->sg_list, w->num_sge);
		total += bytes;
		n++;
		if (full)
			st_ev_ext_at(t0, ST_EV_IBV_RECV_WR, (uint16_t)w->num_sge, qpn, w->wr_id,
				     w->num_sge ? w->sg_list[0].addr : 0, 0, w->num_sge ? w->sg_list[0].lkey : 0,
				     bytes);
	}
	st_ev_ext_at(t0, ST_EV_IBV_POST_RECV, (uint16_t)(n > 0xffff ? 0xffff : n), qpn, total, wr ? wr->wr_id : 0, 0,
		     (uint32_t)ret, 0);
	errno = saved;
	return ret;
}

static int wrap_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct st_ibv_ctx *c = st_ibv_ctx_find(srq->context);
	if (unlikely(!c))
		return EINVAL;
	if (!st_provider_on(ST_PROV_IBV))
		return c->post_srq_recv(srq, wr, bad);
	uint64_t t0 = st_tsc();
	int ret = c->post_srq_recv(srq, wr, bad);
	int saved = errno;
	const struct ibv_recv_wr *stop = (ret && bad) ? *bad : NULL;
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
	st_ev(ST_EV_IBV_POLL_CQ, (uint16_t)(n < 0 ? 0xffff : n), id, (uint64_t)(int64_t)num);
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

void st_ibv_patch_vctx(struct st_ibv_ctx *c, struct ibv_context *ctx) ST_HIDDEN;

/* Called with the provider's lock held, once per opened context. */
void st_ibv_patch_ops(struct st_ibv_ctx *c, struct ibv_context *ctx)
{
	struct ibv_context_ops *o = &ctx->ops;
	/* keep the provider's functions; never our own (a context seen twice) */
	if (o->post_send != wrap_post_send)
		c->post_send = o->post_send;
	if (o->post_recv != wrap_post_recv)
		c->post_recv = o->post_recv;
	if (o->poll_cq != wrap_poll_cq)
		c->poll_cq = o->poll_cq;
	if (o->req_notify_cq != wrap_req_notify_cq)
		c->req_notify_cq = o->req_notify_cq;
	if (o->post_srq_recv != wrap_post_srq_recv)
		c->post_srq_recv = o->post_srq_recv;
	__atomic_store_n(&c->ctx, ctx, __ATOMIC_RELEASE);
	/* a slot the provider left empty stays empty: the inline call would
	 * have crashed without us, and must fail the same way with us */
	if (c->post_send)
		__atomic_store_n(&o->post_send, wrap_post_send, __ATOMIC_RELEASE);
	if (c->post_recv)
		__atomic_store_n(&o->post_recv, wrap_post_recv, __ATOMIC_RELEASE);
	if (c->poll_cq)
		__atomic_store_n(&o->poll_cq, wrap_poll_cq, __ATOMIC_RELEASE);
	if (c->req_notify_cq)
		__atomic_store_n(&o->req_notify_cq, wrap_req_notify_cq, __ATOMIC_RELEASE);
	if (c->post_srq_recv)
		__atomic_store_n(&o->post_srq_recv, wrap_post_srq_recv, __ATOMIC_RELEASE);
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

/* The provider's function: from our QP entry, or, if the entry was lost (a
 * full table cannot happen after patching, but a destroyed-and-reused entry
 * can), from the patched table kept in the entry's ops.  Every wrapper first
 * finds its entry; xops is never freed. */
#define XOPS(q) ((q)->xops)

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

/* An opcode setter that can no longer find its QP entry still has to reach
 * the provider.  That only happens when the QP was destroyed and its number
 * reused on a context whose qp_ex we have not patched yet — the old ibv_qp_ex
 * is then dead memory the application must not use; fail safe by doing
 * nothing (the provider would have crashed or posted garbage). */

static void x_start(struct ibv_qp_ex *qpx)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	xwr_reset(q);
	XOPS(q)->wr_start(qpx);
}

static int x_complete(struct ibv_qp_ex *qpx)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return EINVAL;
	uint64_t t0 = st_tsc();
	int ret = XOPS(q)->wr_complete(qpx);
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

static void x_abort(struct ibv_qp_ex *qpx)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	xwr_reset(q);
	XOPS(q)->wr_abort(qpx);
}

#define X_OP(fn, opc, raddr, rkey, call)                  \
	do {                                              \
		struct st_ibv_qp *q = xqp(qpx);           \
		if (unlikely(!q))                         \
			return;                           \
		xwr_begin(q, qpx, opc, raddr, rkey);      \
		XOPS(q)->fn call;                         \
	} while (0)

static void x_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t ra, uint64_t cmp, uint64_t swap)
{
	X_OP(wr_atomic_cmp_swp, IBV_WR_ATOMIC_CMP_AND_SWP, ra, rkey, (qpx, rkey, ra, cmp, swap));
}
static void x_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t ra, uint64_t add)
{
	X_OP(wr_atomic_fetch_add, IBV_WR_ATOMIC_FETCH_AND_ADD, ra, rkey, (qpx, rkey, ra, add));
}
static void x_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *bi)
{
	X_OP(wr_bind_mw, IBV_WR_BIND_MW, bi ? bi->addr : 0, rkey, (qpx, mw, rkey, bi));
}
static void x_local_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
	X_OP(wr_local_inv, IBV_WR_LOCAL_INV, 0, rkey, (qpx, rkey));
}
static void x_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t ra)
{
	X_OP(wr_rdma_read, IBV_WR_RDMA_READ, ra, rkey, (qpx, rkey, ra));
}
static void x_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t ra)
{
	X_OP(wr_rdma_write, IBV_WR_RDMA_WRITE, ra, rkey, (qpx, rkey, ra));
}
static void x_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t ra, __be32 imm)
{
	X_OP(wr_rdma_write_imm, IBV_WR_RDMA_WRITE_WITH_IMM, ra, rkey, (qpx, rkey, ra, imm));
}
static void x_send(struct ibv_qp_ex *qpx)
{
	X_OP(wr_send, IBV_WR_SEND, 0, 0, (qpx));
}
static void x_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
	X_OP(wr_send_imm, IBV_WR_SEND_WITH_IMM, 0, 0, (qpx, imm));
}
static void x_send_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
	X_OP(wr_send_inv, IBV_WR_SEND_WITH_INV, 0, rkey, (qpx, rkey));
}
static void x_send_tso(struct ibv_qp_ex *qpx, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	X_OP(wr_send_tso, IBV_WR_TSO, 0, 0, (qpx, hdr, hdr_sz, mss));
}
static void x_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t ra, const void *v)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	/* IBV_WR_ATOMIC_WRITE (15 in newer rdma-core): an 8-byte write */
	xwr_begin(q, qpx, 15, ra, rkey);
	xwr_data(q, 8, 0);
	XOPS(q)->wr_atomic_write(qpx, rkey, ra, v);
}

static void x_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah, uint32_t rqpn, uint32_t qkey)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	if (q->xcur >= 0 && !q->xwr[q->xcur].raddr)
		q->xwr[q->xcur].raddr = rqpn; /* UD: the destination QPN, as in post_send */
	XOPS(q)->wr_set_ud_addr(qpx, ah, rqpn, qkey);
}
static void x_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t len)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	xwr_data(q, (uint32_t)len, 1);
	XOPS(q)->wr_set_inline_data(qpx, addr, len);
}
static void x_set_inline_data_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_data_buf *bl)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	uint32_t b = 0;
	for (size_t i = 0; i < n; i++)
		b += (uint32_t)bl[i].length;
	xwr_data(q, b, (uint16_t)n);
	XOPS(q)->wr_set_inline_data_list(qpx, n, bl);
}
static void x_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t len)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	xwr_data(q, len, 1);
	XOPS(q)->wr_set_sge(qpx, lkey, addr, len);
}
static void x_set_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *sg)
{
	struct st_ibv_qp *q = xqp(qpx);
	if (unlikely(!q))
		return;
	xwr_data(q, sge_bytes(sg, (int)n), (uint16_t)n);
	XOPS(q)->wr_set_sge_list(qpx, n, sg);
}

/* Replace the qp_ex function pointers of one QP.  Not a hot path (once per
 * QP); may allocate.  Slots the provider left NULL stay NULL. */
void st_ibv_qp_ex_patch(struct ibv_qp_ex *qpx)
{
	if (qpx->wr_start == x_start) /* already ours */
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
	struct st_ibv_qp_ex_ops *o = q->xops;
	xwr_reset(q);
#define SAVE(f)                                      \
	do {                                         \
		o->f = qpx->f;                       \
	} while (0)
	SAVE(wr_atomic_cmp_swp); SAVE(wr_atomic_fetch_add); SAVE(wr_bind_mw); SAVE(wr_local_inv);
	SAVE(wr_rdma_read); SAVE(wr_rdma_write); SAVE(wr_rdma_write_imm); SAVE(wr_send); SAVE(wr_send_imm);
	SAVE(wr_send_inv); SAVE(wr_send_tso); SAVE(wr_set_ud_addr); SAVE(wr_set_inline_data);
	SAVE(wr_set_inline_data_list); SAVE(wr_set_sge); SAVE(wr_set_sge_list); SAVE(wr_start);
	SAVE(wr_complete); SAVE(wr_abort); SAVE(wr_atomic_write);
#undef SAVE
	__atomic_store_n(&q->qpx, qpx, __ATOMIC_RELEASE);
#define PATCH(f, w)                                                   \
	do {                                                          \
		if (o->f)                                             \
			__atomic_store_n(&qpx->f, w, __ATOMIC_RELEASE); \
	} while (0)
	PATCH(wr_atomic_cmp_swp, x_atomic_cmp_swp); PATCH(wr_atomic_fetch_add, x_atomic_fetch_add);
	PATCH(wr_bind_mw, x_bind_mw); PATCH(wr_local_inv, x_local_inv); PATCH(wr_rdma_read, x_rdma_read);
	PATCH(wr_rdma_write, x_rdma_write); PATCH(wr_rdma_write_imm, x_rdma_write_imm); PATCH(wr_send, x_send);
	PATCH(wr_send_imm, x_send_imm); PATCH(wr_send_inv, x_send_inv); PATCH(wr_send_tso, x_send_tso);
	PATCH(wr_set_ud_addr, x_set_ud_addr); PATCH(wr_set_inline_data, x_set_inline_data);
	PATCH(wr_set_inline_data_list, x_set_inline_data_list); PATCH(wr_set_sge, x_set_sge);
	PATCH(wr_set_sge_list, x_set_sge_list); PATCH(wr_atomic_write, x_atomic_write);
	PATCH(wr_complete, x_complete); PATCH(wr_abort, x_abort);
	PATCH(wr_start, x_start); /* last: it marks the QP as patched */
#undef PATCH
}
