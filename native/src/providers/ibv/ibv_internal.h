/*
 * libibverbs provider: state shared by its files and by the mlx5dv provider.
 *
 * Two small tables, both lock-free to read:
 *   contexts: one entry per opened ibv_context, holding the provider's own
 *             ops (post_send, poll_cq, ...) that we replaced in the context
 *             with our wrappers, plus the device identity;
 *   QPs:      one entry per (context, QPN), holding what the hot path needs
 *             (the peer for aggregate counters) and, for QPs used through the
 *             ibv_qp_ex API, the provider's wr_* functions and the batch being
 *             built between wr_start and wr_complete.
 * Entries are created under a mutex at object creation (rare) and never
 * moved or freed, so a wrapper racing with a close still finds valid
 * function pointers.  They are reused: a closed context's entry (its copied
 * ops) by the next context opened, a destroyed QP's slot by the next QP whose
 * probe window holds it (with its qp_ex allocations), so the tables never
 * fill up in a process that opens and closes, creates and destroys without
 * end (64 contexts open at once, 64 QPs per probe window).
 */
#ifndef ST_PROV_IBV_INTERNAL_H
#define ST_PROV_IBV_INTERNAL_H

#include <pthread.h>

#include "abi/verbs.h"

#include "core/core.h"
#include "interpose/interpose.h"

/*
 * Re-entrancy guard of the RDMA providers (ibv and mlx5 share it).  Not the
 * core's st_tls_depth on purpose: that one is raised by other layers' wrappers
 * (a traced ucp_init opens verbs contexts inside), and a verbs context opened
 * under it would never get its ops patched.  Ours only stops libibverbs /
 * libmlx5 calling their own exported functions from producing a second event.
 */
extern __thread int st_rdma_depth ST_TLS ST_HIDDEN;
static inline int st_rdma_enter(void) { return st_rdma_depth++ == 0; }
static inline void st_rdma_leave(void) { st_rdma_depth--; }
/* Should a lifecycle wrapper record?  (provider on, not nested) */
static inline int st_rdma_should(unsigned prov) { return st_provider_on(prov) && st_rdma_depth == 0; }

#define ST_IBV_MAX_CTX 64
#define ST_IBV_NAME_MAX 64

struct st_ibv_ctx {
	struct ibv_context *ctx; /* key; published last (release) */
	uint32_t id;             /* st_obj_id of the context */
	uint32_t closed;
	/* the provider's hot ops, replaced in ctx->ops by our wrappers */
#define ST_HOT_OP(slot) __typeof__(((struct ibv_context_ops *)0)->slot) slot;
#include "ibv_hot_ops.def"
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *, struct ibv_qp_init_attr_ex *);
	struct ibv_cq_ex *(*create_cq_ex)(struct ibv_context *, struct ibv_cq_init_attr_ex *);
	char name[ST_IBV_NAME_MAX];
	uint64_t node_guid; /* host order */
	uint32_t ring_locks; /* some QP of this context has a ring_lock: post_send looks its QP up */
};

extern struct st_ibv_ctx st_ibv_ctxs[ST_IBV_MAX_CTX] ST_HIDDEN; /* ibv_context.c */
/* Held while entries of either table are created, and for the NIC list. */
extern pthread_mutex_t st_ibv_lock ST_HIDDEN;

static inline struct st_ibv_ctx *st_ibv_ctx_find(const struct ibv_context *c)
{
	for (unsigned i = 0; i < ST_IBV_MAX_CTX; i++) {
		struct ibv_context *k = __atomic_load_n(&st_ibv_ctxs[i].ctx, __ATOMIC_ACQUIRE);
		if (likely(k == c))
			return &st_ibv_ctxs[i];
		if (!k)
			break;
	}
	return NULL;
}

void st_ibv_ah_created(struct ibv_ah *ah, struct ibv_pd *pd, const struct ibv_ah_attr *attr) ST_HIDDEN;

/* One WR of a batch built with the ibv_qp_ex API (wr_start .. wr_complete). */
struct st_ibv_xwr {
	uint64_t wr_id;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t bytes;
	uint16_t num_sge;
	uint8_t opcode; /* enum ibv_wr_opcode */
	uint8_t flags;  /* enum ibv_send_flags, low 8 bits */
};
#define ST_IBV_XWR_BATCH 32

/* The provider's ibv_qp_ex functions of one QP, replaced in the ibv_qp_ex
 * by our wrappers. */
struct st_ibv_qp_ex_ops {
#define ST_QPX_OP(fn, params, args, note) __typeof__(((struct ibv_qp_ex *)0)->fn) fn;
#define ST_QPX_BY_HAND(fn) __typeof__(((struct ibv_qp_ex *)0)->fn) fn;
#include "ibv_qpx_ops.def"
};

struct st_ibv_qp {
	const struct ibv_context *ctx; /* key part 1 */
	uint32_t qpn;                  /* key part 2; slot used when ctx != NULL */
	uint32_t live;
	uint32_t dead;       /* destroyed: the slot may go to another (context, QPN) */
	uint32_t dest_qpn;
	uint32_t peer_node;  /* dlid, or the low 32 bits of the dgid (RoCE) */
	uint8_t qp_type;
	uint8_t sq_sig_all;
	struct ibv_qp *ibqp;
	/* finding 9: the real BlueFlame register rdma-core rings for this QP is in a bfreg the hijack
	 * proxies for another QP (or for this one): its posts hold this lock, the poller's forwards to
	 * that bfreg too (hijack.h, st_hijack_ring_lock); NULL otherwise */
	uint32_t *ring_lock;
	/* ibv_qp_ex API (set once the qp_ex is patched) */
	struct ibv_qp_ex *qpx;
	struct st_ibv_qp_ex_ops *xops;
	struct st_ibv_xwr *xwr;     /* ST_IBV_XWR_BATCH entries */
	uint32_t xn, xtotal;        /* entries used; WRs in this batch */
	uint64_t xbytes;            /* bytes in this batch */
	int xcur;                   /* index of the WR being built, -1 none */
};

/* Peer key of aggregate counters: remote QPN | peer node << 32. */
static inline uint64_t st_ibv_qp_peer(const struct st_ibv_qp *q)
{
	return q ? ((uint64_t)q->peer_node << 32) | q->dest_qpn : 0;
}

struct st_ibv_qp *st_ibv_qp_find(const struct ibv_context *c, uint32_t qpn) ST_HIDDEN;
struct st_ibv_qp *st_ibv_qp_get(const struct ibv_context *c, uint32_t qpn) ST_HIDDEN; /* find or insert */

/* Finding 9 (hijack.h): the ring lock of a QP, from the mlx5 provider (weak: NULL without it or
 * the hijack); every live QP of ctx asks again when the hijack proxies a register of ctx. */
uint32_t *st_mlx5_verbs_ring_lock(struct ibv_qp *qp) __attribute__((weak)) ST_HIDDEN;
void st_ibv_ring_locks_refresh(const struct ibv_context *ctx) ST_HIDDEN;
void st_hijack_ring_enter(uint32_t *lock) __attribute__((weak)) ST_HIDDEN;
void st_hijack_ring_leave(uint32_t *lock) __attribute__((weak)) ST_HIDDEN;

/* Called for every context handed to the application (ibv_open_device,
 * mlx5dv_open_device): patches its ops, records IBV_OPEN_DEVICE and the NIC
 * identity.  Idempotent. */
void st_ibv_context_opened(struct ibv_context *ctx) ST_HIDDEN;
/* Records IBV_CREATE_QP for a QP handed to the application (any creator). */
void st_ibv_qp_created(struct ibv_qp *qp, const struct ibv_qp_init_attr_ex *attr_ex,
		       const struct ibv_qp_init_attr *attr) ST_HIDDEN;
/* Patches the ibv_qp_ex function pointers of a QP (idempotent). */
void st_ibv_qp_ex_patch(struct ibv_qp_ex *qpx) ST_HIDDEN;
/* Ops-table wrappers (ibv_hot.c). */
void st_ibv_patch_ops(struct st_ibv_ctx *c, struct ibv_context *ctx) ST_HIDDEN;
/* The verbs_context slots create_qp_ex / create_cq_ex (ibv.c). */
void st_ibv_patch_vctx(struct st_ibv_ctx *c, struct ibv_context *ctx) ST_HIDDEN;
/* A libibverbs function the wrappers need but do not wrap. */
void *st_ibv_sym(const char *name) ST_HIDDEN;
/* A GID as the correlator reads it: eight groups of four hex digits. */
void st_ibv_gid_str(char out[40], const uint8_t g[16]) ST_HIDDEN;

#endif /* ST_PROV_IBV_INTERNAL_H */
