/*
 * libibverbs provider (F5, F1): object lifecycle and QP topology.
 *
 * Exported functions of libibverbs are wrapped by symbol shims (same name,
 * exported from the preloaded tracer) and, for programs that dlopen the
 * library and look functions up by name (NCCL), by the dlsym injection of
 * interpose/ — every shim is in the hook table registered below.  The shims
 * of one shape (resolve, guard, call, record) are generated from the table
 * ibv_shims.def (the shape: rdma_shim.h); the irregular ones are written
 * out below the generated ones.
 *
 * The hot calls (post_send, post_recv, poll_cq, ...) are inline dispatches
 * through the context ops and are wrapped in ibv_hot.c when a context is
 * opened (ibv_context.c, which also records the NIC identity).
 *
 * Lifecycle events are recorded in every mode (they are few, and the
 * correlator needs them to name QPs and join the two ends of a connection),
 * also in aggregate mode where the hot calls only count.
 *
 * Nothing here allocates on a hot path; errno and return values of the real
 * functions reach the application unchanged.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "rdma_shim.h"

/* verbs.h turns some names into macros; we define the exported functions. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

__thread int st_rdma_depth ST_TLS;
pthread_mutex_t st_ibv_lock = PTHREAD_MUTEX_INITIALIZER;

/* the doorbell hijack (hijack/hijack.h) and the mlx5 provider, when linked in */
void st_hijack_cpu_release_ctx(void *ctx) __attribute__((weak)) ST_HIDDEN;
void st_mlx5_verbs_qp_destroyed(uint32_t qpn) __attribute__((weak)) ST_HIDDEN;

/* ---- real functions: real_<name> for every row of ibv_shims.def ---------- */
#define ST_SHIM(fail, provider, ret_type, name, params, args, skip, note, record) ST_RDMA_REAL(ret_type, name, params)
#define ST_SHIM_BY_HAND(provider, ret_type, name, params) ST_RDMA_REAL(ret_type, name, params)
#include "ibv_shims.def"

/* A libibverbs function we call but do not wrap (queries for the identity): wherever the library
 * was loaded from, as for the shims (interpose/resolve.c). */
void *st_ibv_sym(const char *name)
{
	return st_resolve_real(name);
}

/* ---- QP table: (context, QPN) -> state, lock-free lookups ----------------- */
#define QP_SLOTS 8192 /* power of two */
static struct st_ibv_qp qp_tab[QP_SLOTS];

static inline unsigned qp_hash(const struct ibv_context *c, uint32_t qpn)
{
	uint64_t x = ((uint64_t)(uintptr_t)c >> 4) ^ ((uint64_t)qpn * 0x9e3779b97f4a7c15ull);
	x ^= x >> 29;
	return (unsigned)x & (QP_SLOTS - 1);
}

struct st_ibv_qp *st_ibv_qp_find(const struct ibv_context *c, uint32_t qpn)
{
	unsigned h = qp_hash(c, qpn);
	for (unsigned i = 0; i < 64; i++) {
		struct st_ibv_qp *q = &qp_tab[(h + i) & (QP_SLOTS - 1)];
		const struct ibv_context *k = __atomic_load_n(&q->ctx, __ATOMIC_ACQUIRE);
		if (!k)
			return NULL;
		if (k == c && q->qpn == qpn)
			return q;
	}
	return NULL;
}

/* A key no context has: a slot being handed to another QP (readers skip it). */
#define QP_MOVING ((const struct ibv_context *)1)
static uint64_t qp_untracked; /* QPs that found no slot (traced without state); under st_ibv_lock */

/* Slot q becomes (c, qpn)'s; a slot that held a destroyed QP is hidden from readers meanwhile. */
static struct st_ibv_qp *qp_slot_take(struct st_ibv_qp *q, int was_dead, const struct ibv_context *c, uint32_t qpn)
{
	if (was_dead)
		__atomic_store_n(&q->ctx, QP_MOVING, __ATOMIC_RELEASE);
	q->qpn = qpn;
	q->xcur = -1;
	q->live = q->dead = 0;
	q->dest_qpn = q->peer_node = 0;
	q->ibqp = NULL;
	__atomic_store_n(&q->ring_lock, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&q->qpx, NULL, __ATOMIC_RELEASE); /* its qp_ex allocations stay for the next user */
	__atomic_store_n(&q->ctx, c, __ATOMIC_RELEASE);
	return q;
}

struct st_ibv_qp *st_ibv_qp_get(const struct ibv_context *c, uint32_t qpn)
{
	struct st_ibv_qp *q = st_ibv_qp_find(c, qpn);
	if (q)
		return q;
	pthread_mutex_lock(&st_ibv_lock);
	unsigned h = qp_hash(c, qpn);
	struct st_ibv_qp *dead = NULL;
	for (unsigned i = 0; i < 64; i++) {
		struct st_ibv_qp *s = &qp_tab[(h + i) & (QP_SLOTS - 1)];
		if (s->ctx == c && s->qpn == qpn) {
			q = s;
			break;
		}
		if (s->ctx && s->dead && !dead)
			dead = s; /* a destroyed QP's slot: taken if the key is not further on */
		if (!s->ctx) {
			q = qp_slot_take(dead ? dead : s, dead != NULL, c, qpn);
			break;
		}
	}
	if (!q && dead) /* the window is full of other keys, but one is dead */
		q = qp_slot_take(dead, 1, c, qpn);
	if (!q && qp_untracked++ == 0)
		st_warn("ibv: QP table full around QPN %#x: QPs traced without their state (peer, qp_ex batches)", qpn);
	pthread_mutex_unlock(&st_ibv_lock);
	return q; /* NULL when the neighbourhood holds 64 live QPs: the QP is traced without state */
}

/* ---- ring locks (finding 9, hijack.h) --------------------------------------- */
static void qp_ring_lock_set(struct st_ibv_qp *q, struct ibv_qp *qp)
{
	uint32_t *lock = st_mlx5_verbs_ring_lock ? st_mlx5_verbs_ring_lock(qp) : NULL;
	__atomic_store_n(&q->ring_lock, lock, __ATOMIC_RELEASE);
	struct st_ibv_ctx *c = lock ? st_ibv_ctx_find(qp->context) : NULL;
	if (c)
		__atomic_store_n(&c->ring_locks, 1, __ATOMIC_RELEASE);
}

void st_ibv_ring_locks_refresh(const struct ibv_context *ctx)
{
	pthread_mutex_lock(&st_ibv_lock); /* no slot changes hands meanwhile */
	for (unsigned i = 0; i < QP_SLOTS; i++) {
		struct st_ibv_qp *q = &qp_tab[i];
		if (q->ctx == ctx && q->live && !q->dead && q->ibqp)
			qp_ring_lock_set(q, q->ibqp);
	}
	pthread_mutex_unlock(&st_ibv_lock);
}

/* ---- what the shims record (the `record` column of ibv_shims.def) --------- */
void st_ibv_qp_created(struct ibv_qp *qp, const struct ibv_qp_init_attr_ex *ax, const struct ibv_qp_init_attr *a)
{
	if (!qp)
		return;
	int saved = errno;
	struct st_ibv_qp *q = st_ibv_qp_get(qp->context, qp->qp_num);
	int sig_all = ax ? ax->sq_sig_all : a ? a->sq_sig_all : 0;
	if (q) {
		q->live = 1;
		q->dead = 0;
		q->dest_qpn = 0;
		q->peer_node = 0;
		q->qp_type = (uint8_t)qp->qp_type;
		q->sq_sig_all = (uint8_t)!!sig_all;
		q->xn = q->xtotal = 0;
		q->xbytes = 0;
		q->xcur = -1;
		q->ibqp = qp;
		qp_ring_lock_set(q, qp);
	}
	struct st_ibv_ctx *c = st_ibv_ctx_find(qp->context);
	const struct ibv_qp_cap *cap = ax ? &ax->cap : a ? &a->cap : NULL;
	char buf[1024];
	struct st_json j;
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "qpn", qp->qp_num);
	st_json_uint(&j, "qp_type", qp->qp_type);
	st_json_uint(&j, "ctx", c ? c->id : st_obj_id(qp->context, NULL));
	if (c) {
		char guid[24];
		snprintf(guid, sizeof(guid), "%016llx", (unsigned long long)c->node_guid);
		st_json_str(&j, "device", c->name);
		st_json_str(&j, "node_guid", guid);
	}
	st_json_uint(&j, "pd", st_obj_id(qp->pd, NULL));
	st_json_uint(&j, "send_cq", st_obj_id(qp->send_cq, NULL));
	st_json_uint(&j, "recv_cq", st_obj_id(qp->recv_cq, NULL));
	st_json_uint(&j, "srq", qp->srq ? st_obj_id(qp->srq, NULL) : 0);
	if (cap) {
		st_json_uint(&j, "max_send_wr", cap->max_send_wr);
		st_json_uint(&j, "max_recv_wr", cap->max_recv_wr);
		st_json_uint(&j, "max_send_sge", cap->max_send_sge);
		st_json_uint(&j, "max_recv_sge", cap->max_recv_sge);
		st_json_uint(&j, "max_inline_data", cap->max_inline_data);
	}
	st_json_bool(&j, "sq_sig_all", sig_all);
	if (ax && (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		st_json_hex(&j, "send_ops_flags", ax->send_ops_flags);
	st_json_close(&j, '}');
	uint64_t side = j.overflow ? 0 : st_side_json(buf, j.len);
	st_ev(ST_EV_IBV_CREATE_QP, (uint16_t)qp->qp_type, qp->qp_num, side);
	errno = saved;
}

static void mr_event(struct ibv_mr *mr, struct ibv_pd *pd, uint64_t addr, size_t len, unsigned access)
{
	if (!mr)
		return;
	int saved = errno;
	st_ev_ext(ST_EV_IBV_REG_MR, 0, mr->lkey, addr, len, (uint16_t)access, mr->rkey, st_obj_id(pd, NULL));
	errno = saved;
}

static const char *const attr_names[] = {"state", "cur_state", "en_sqd_async_notify", "access_flags",
					 "pkey_index", "port", "qkey", "av", "path_mtu", "timeout",
					 "retry_cnt", "rnr_retry", "rq_psn", "max_qp_rd_atomic", "alt_path",
					 "min_rnr_timer", "sq_psn", "max_dest_rd_atomic", "path_mig_state",
					 "cap", "dest_qpn"};

/* An address handle: where the UD work requests naming it go (their IBV_SEND_WR carries its id). */
void st_ibv_ah_created(struct ibv_ah *ah, struct ibv_pd *pd, const struct ibv_ah_attr *attr)
{
	int saved = errno;
	char buf[512];
	struct st_json j;
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "pd", st_obj_id(pd, NULL));
	st_json_uint(&j, "dlid", attr ? attr->dlid : 0);
	st_json_uint(&j, "sl", attr ? attr->sl : 0);
	st_json_uint(&j, "port", attr ? attr->port_num : 0);
	st_json_bool(&j, "is_global", attr && attr->is_global);
	if (attr && attr->is_global) {
		char g[40];
		st_ibv_gid_str(g, attr->grh.dgid.raw);
		st_json_str(&j, "dgid", g);
		st_json_uint(&j, "sgid_index", attr->grh.sgid_index);
	}
	st_json_close(&j, '}');
	uint64_t sid = j.overflow ? 0 : st_side_json(buf, j.len);
	st_ev(ST_EV_IBV_CREATE_AH, attr ? attr->port_num : 0, st_obj_id(ah, NULL), sid);
	errno = saved;
}

/* ibv_modify_qp's record: the peer of aggregate counters (dest QPN, peer
 * node) into the QP entry, then the event with every attribute set. */
static void qp_modified(int ret, struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	int saved = errno;

	uint32_t dest = (mask & IBV_QP_DEST_QPN) ? attr->dest_qp_num : 0;
	uint16_t dlid = (mask & IBV_QP_AV) ? attr->ah_attr.dlid : 0;
	int global = (mask & IBV_QP_AV) && attr->ah_attr.is_global;
	if (ret == 0 && (mask & (IBV_QP_DEST_QPN | IBV_QP_AV))) {
		struct st_ibv_qp *q = st_ibv_qp_get(qp->context, qp->qp_num);
		if (q) {
			if (mask & IBV_QP_DEST_QPN)
				q->dest_qpn = dest;
			if (mask & IBV_QP_AV) {
				const uint8_t *g = attr->ah_attr.grh.dgid.raw;
				q->peer_node = dlid ? dlid
						    : global ? ((uint32_t)g[12] << 24 | (uint32_t)g[13] << 16 |
								(uint32_t)g[14] << 8 | g[15])
							     : 0;
			}
		}
	}

	char buf[1024];
	struct st_json j;
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "qpn", qp->qp_num);
	st_json_hex(&j, "attr_mask", (unsigned)mask);
	st_json_open(&j, "attrs", '[');
	for (unsigned b = 0; b < sizeof(attr_names) / sizeof(attr_names[0]); b++)
		if (mask & (1 << b))
			st_json_str(&j, NULL, attr_names[b]);
	st_json_close(&j, ']');
	if (mask & IBV_QP_STATE)
		st_json_uint(&j, "state", attr->qp_state);
	if (mask & IBV_QP_DEST_QPN)
		st_json_uint(&j, "dest_qp_num", dest);
	if (mask & IBV_QP_PORT)
		st_json_uint(&j, "port_num", attr->port_num);
	if (mask & IBV_QP_AV) {
		st_json_uint(&j, "dlid", dlid);
		st_json_uint(&j, "sl", attr->ah_attr.sl);
		st_json_uint(&j, "port", attr->ah_attr.port_num);
		st_json_bool(&j, "is_global", global);
		if (global) {
			char s[40];
			st_ibv_gid_str(s, attr->ah_attr.grh.dgid.raw);
			st_json_str(&j, "dgid", s);
			st_json_uint(&j, "sgid_index", attr->ah_attr.grh.sgid_index);
			st_json_uint(&j, "hop_limit", attr->ah_attr.grh.hop_limit);
			st_json_uint(&j, "traffic_class", attr->ah_attr.grh.traffic_class);
		}
	}
	if (mask & IBV_QP_PATH_MTU)
		st_json_uint(&j, "path_mtu", attr->path_mtu);
	if (mask & IBV_QP_RQ_PSN)
		st_json_uint(&j, "rq_psn", attr->rq_psn);
	if (mask & IBV_QP_SQ_PSN)
		st_json_uint(&j, "sq_psn", attr->sq_psn);
	if (mask & IBV_QP_QKEY)
		st_json_hex(&j, "qkey", attr->qkey);
	if (mask & IBV_QP_ACCESS_FLAGS)
		st_json_hex(&j, "access_flags", attr->qp_access_flags);
	if (mask & IBV_QP_TIMEOUT)
		st_json_uint(&j, "timeout", attr->timeout);
	if (mask & IBV_QP_RETRY_CNT)
		st_json_uint(&j, "retry_cnt", attr->retry_cnt);
	if (mask & IBV_QP_RNR_RETRY)
		st_json_uint(&j, "rnr_retry", attr->rnr_retry);
	st_json_int(&j, "ret", ret);
	st_json_close(&j, '}');
	uint64_t side = j.overflow ? 0 : st_side_json(buf, j.len);
	/* aux: the new state, or 0xffff when the call changes no state */
	uint16_t state = (mask & IBV_QP_STATE) ? (uint16_t)attr->qp_state : 0xffff;
	st_ev_ext(ST_EV_IBV_MODIFY_QP, state, qp->qp_num, side, (uint64_t)(unsigned)mask, dlid, dest, 0);
	errno = saved;
}

/* ---- the generated shims (rows ST_SHIM of ibv_shims.def) ------------------ */
#define ST_SHIM ST_RDMA_SHIM
#define ST_SHIM_BY_HAND(provider, ret_type, name, params)
#include "ibv_shims.def"

/* ---- the shims written out (rows ST_SHIM_BY_HAND) ------------------------- */
ST_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	if (!ST_REAL(real_ibv_get_device_list, "ibv_get_device_list")) {
		errno = ENOSYS;
		return NULL;
	}
	return real_ibv_get_device_list(num);
}

ST_EXPORT int ibv_close_device(struct ibv_context *ctx)
{
	if (!ST_REAL(real_ibv_close_device, "ibv_close_device"))
		return ENOSYS;
	/* always, traced or not: the pollers of its verbs QPs' proxied BlueFlame
	 * registers must stop before the real UAR pages go */
	if (st_hijack_cpu_release_ctx)
		st_hijack_cpu_release_ctx(ctx);
	if (!st_rdma_should(ST_PROV_IBV))
		return real_ibv_close_device(ctx);
	struct st_ibv_ctx *c = st_ibv_ctx_find(ctx);
	uint32_t id = c ? c->id : st_obj_id(ctx, NULL);
	st_rdma_enter();
	int ret = real_ibv_close_device(ctx);
	st_rdma_leave();
	int saved = errno;
	if (ret == 0 && c)
		c->closed = 1; /* its function pointers stay valid until another context takes the entry */
	st_ev(ST_EV_IBV_CLOSE_DEVICE, 0, id, (uint64_t)(int64_t)ret);
	if (ret == 0)
		st_obj_forget(ctx);
	errno = saved;
	return ret;
}

ST_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	if (!ST_REAL(real_ibv_get_cq_event, "ibv_get_cq_event")) {
		errno = ENOSYS; /* its contract: -1 and errno */
		return -1;
	}
	int ret = real_ibv_get_cq_event(ch, cq, cq_context);
	if (ret == 0 && cq && st_provider_on(ST_PROV_IBV) && st_full()) {
		int saved = errno;
		st_ev(ST_EV_IBV_GET_CQ_EVENT, 0, st_obj_id(*cq, NULL), 0);
		errno = saved;
	}
	return ret;
}

ST_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	if (!ST_REAL(real_ibv_destroy_qp, "ibv_destroy_qp"))
		return ENOSYS;
	/* always, traced or not (the proxy was handed out by the mlx5 provider):
	 * its SQ goes away, so the hijack forgets it first */
	if (qp && st_mlx5_verbs_qp_destroyed)
		st_mlx5_verbs_qp_destroyed(qp->qp_num);
	if (!qp)
		return real_ibv_destroy_qp(qp);
	int record = st_rdma_should(ST_PROV_IBV);
	uint32_t qpn = qp->qp_num;
	const struct ibv_context *ctx = qp->context;
	st_rdma_enter();
	int ret = real_ibv_destroy_qp(qp);
	st_rdma_leave();
	int saved = errno;
	if (ret == 0) {
		/* traced or not: the QP's entry (made while tracing) is freed */
		struct st_ibv_qp *q = st_ibv_qp_find(ctx, qpn);
		if (q) {
			q->live = 0;
			__atomic_store_n(&q->ring_lock, NULL, __ATOMIC_RELEASE);
			/* a QP created later with this number must not inherit the
			 * old qp_ex state: the pointer check in the wr_* wrappers
			 * uses qpx, cleared here */
			__atomic_store_n(&q->qpx, NULL, __ATOMIC_RELEASE);
			q->dead = 1; /* the slot may go to another QP */
		}
		if (record)
			st_ev(ST_EV_IBV_DESTROY_QP, 0, qpn, 0);
	}
	errno = saved;
	return ret;
}

ST_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	if (!ST_REAL(real_ibv_qp_to_qp_ex, "ibv_qp_to_qp_ex")) {
		errno = ENOSYS;
		return NULL;
	}
	struct ibv_qp_ex *qpx = real_ibv_qp_to_qp_ex(qp);
	if (qpx && st_provider_on(ST_PROV_IBV)) {
		int saved = errno;
		st_ibv_qp_ex_patch(qpx);
		errno = saved;
	}
	return qpx;
}

/* ---- verbs_context ops: ibv_create_qp_ex / ibv_create_cq_ex are inline ---- */
/* The shape of a shim, with the provider's function kept in the context
 * entry instead of a real_<name> (the call never reaches a symbol). */
#define VCTX_WRAPPER(ret_type, slot, attr_type, record)                         \
	static ret_type *wrap_##slot(struct ibv_context *ctx, attr_type *attr)  \
	{                                                                       \
		struct st_ibv_ctx *c = st_ibv_ctx_find(ctx);                    \
		if (unlikely(!c || !c->slot)) {                                 \
			errno = EOPNOTSUPP;                                     \
			return NULL;                                            \
		}                                                               \
		if (!st_rdma_should(ST_PROV_IBV))                               \
			return c->slot(ctx, attr);                              \
		st_rdma_enter();                                                \
		ret_type *ret = c->slot(ctx, attr);                             \
		st_rdma_leave();                                                \
		record;                                                         \
		return ret;                                                     \
	}

VCTX_WRAPPER(struct ibv_qp, create_qp_ex, struct ibv_qp_init_attr_ex, st_ibv_qp_created(ret, attr, NULL))
/* ibv_cq_ex_to_cq: the ibv_cq is the prefix of the ibv_cq_ex, so the id
 * matches the one poll_cq sees */
VCTX_WRAPPER(struct ibv_cq_ex, create_cq_ex, struct ibv_cq_init_attr_ex,
	     ST_RDMA_CREATED((struct ibv_cq *)ret, ST_EV_IBV_CREATE_CQ, (uint64_t)((struct ibv_cq *)ret)->cqe))

void st_ibv_patch_vctx(struct st_ibv_ctx *c, struct ibv_context *ctx)
{
	struct verbs_context *v = verbs_get_ctx_op(ctx, create_qp_ex);
	if (v && v->create_qp_ex != wrap_create_qp_ex) {
		c->create_qp_ex = v->create_qp_ex;
		__atomic_store_n(&v->create_qp_ex, wrap_create_qp_ex, __ATOMIC_RELEASE);
	}
	v = verbs_get_ctx_op(ctx, create_cq_ex);
	if (v && v->create_cq_ex != wrap_create_cq_ex) {
		c->create_cq_ex = v->create_cq_ex;
		__atomic_store_n(&v->create_cq_ex, wrap_create_cq_ex, __ATOMIC_RELEASE);
	}
}

/* ---- registration: symbol shims double as dlsym/dlvsym injection hooks ---- */
static const struct st_hook ibv_hooks[] = {
#define ST_SHIM(fail, provider, ret_type, name, params, args, skip, note, record) ST_RDMA_HOOK(provider, name)
#define ST_SHIM_BY_HAND(provider, ret_type, name, params) ST_RDMA_HOOK(provider, name)
#include "ibv_shims.def"
};

ST_HOOKS_CONSTRUCTOR(110, ibv_hooks)

/* held across fork, so no child inherits it locked (core.h, st_fork_guard) */
__attribute__((constructor(110))) static void ibv_fork_guard(void)
{
	st_fork_guard(&st_ibv_lock, ST_FORK_RANK_IBV);
}
