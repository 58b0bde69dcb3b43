/*
 * NCCL provider (F25): NCCL's public calls as events, so that the
 * correlator can tie each collective to the work requests NCCL's proxy
 * thread posts for it (docs/schema.md, "collectives").
 *
 * NCCL's API is a set of exported functions of libnccl.so.2, so symbol
 * call; the shims are listed in nccl_shims.def (X-macros) and all but the
 * three group calls are generated from it in one shape (NCCL_SHIM): the
 * collectives and point-to-point calls record with coll_record, each
 * communicator call with a function of its own below (<row>_done).  We never link
 * libnccl: the real functions come from ST_REAL (the next definition), and
 * helpers (ncclCommCount, ncclCommUserRank, ncclCommCuDevice,
 * ncclGetVersion) are resolved the same way when a communicator is made.
 *
 * No nccl.h: the few ABI pieces used are declared here, as NCCL 2.28 has
 * them (src/nccl.h.in of v2.28.9-1; unchanged in layout since 2.19 except
 * for the added calls): ncclResult_t / ncclDataType_t / ncclRedOp_t are
 * int-sized enums, ncclComm_t an opaque pointer, ncclUniqueId 128 bytes
 * passed by value; ncclConfig_t and ncclSimInfo_t are opaque here (their
 * pointers are recorded, never read).
 *
 * Re-entrancy: NCCL calls its own exported functions (ncclBcast ->
 * ncclBroadcast, communicator creation inside a group ...); a thread-local
 * depth of this provider makes those inner calls plain forwarders, so one
 * application call is one event.  Unlike the other providers this one does
 * NOT raise the shared guard (st_enter) around the call: the verbs and CUDA
 * calls NCCL makes on the calling thread while a collective or an init runs
 * (device open, QP creation, registrations, posts) are exactly what the
 * correlator links to the call, so they stay recorded.
 *
 * Recording rules (docs/tracer.md): every call is recorded with its result
 * (the correlator counts only the accepted ones: ncclSuccess, and
 * ncclInProgress of a non-blocking communicator); times are the TSC at entry
 * and the call's duration in ticks (one more TSC read).  Aggregate mode
 * counts accepted collectives per (kind|datatype, communicator, root/peer)
 * with their bytes (count x datatype size); communicator creation is an
 * event in every mode.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "interpose/interpose.h"

/* ---- the NCCL ABI (NCCL 2.28, src/nccl.h.in) ------------------------------------------------------- */
typedef struct ncclComm *ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef int ncclResult_t;   /* enum: ncclSuccess 0 .. ncclInProgress 7, ncclNumResults 8 */
typedef int ncclDataType_t; /* enum: ncclInt8 0 .. ncclFloat8e5m2 11, ncclNumTypes 12 */
typedef int ncclRedOp_t;    /* enum: ncclSum 0 .. ncclAvg 4; >= ncclNumOps (5): ncclRedOpCreate* */
typedef struct ncclConfig_v22800 ncclConfig_t;  /* opaque here */
typedef struct ncclSimInfo_v22200 ncclSimInfo_t; /* opaque here */
typedef void *cudaStream_t;                      /* struct CUstream_st * */
enum { ncclSuccess = 0, ncclInternalError = 3, ncclInProgress = 7 };

/* bytes of one element per ncclDataType_t (0 for values NCCL 2.28 does not define) */
static const uint8_t dt_size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static inline uint64_t nbytes(size_t count, ncclDataType_t dt)
{
	return (dt >= 0 && (unsigned)dt < sizeof(dt_size)) ? (uint64_t)count * dt_size[dt] : 0;
}

static inline int accepted(ncclResult_t r)
{
	return r == ncclSuccess || r == ncclInProgress;
}

/* this provider's re-entrancy depth (NCCL calling its own exports) and the thread's NCCL group depth */
static __thread int nccl_depth ST_TLS;
static __thread int group_depth ST_TLS;

/* recording: the provider is on, this is the application's call (not NCCL calling itself), and no other
 * provider's traced call is in progress on this thread */
#define ON() likely(st_provider_on(ST_PROV_NCCL) && !nccl_depth && !st_tls_depth)

/* real_<name> for every row of nccl_shims.def, and our prototypes */
#define ST_NCCL_COLL(name, kind, params, args, count, datatype, redop, peer, comm, stream) \
	static ncclResult_t(*real_##name) params;                                           \
	ncclResult_t name params;
#define ST_NCCL_CALL(name, params, args, after) \
	static ncclResult_t(*real_##name) params;  \
	ncclResult_t name params;
#define ST_NCCL_BY_HAND(name, ret_type, params) \
	static ret_type(*real_##name) params;    \
	ret_type name params;
#include "nccl_shims.def"

#define R(name) ST_REAL(real_##name, #name)

/* call the real function under this provider's guard only */
#define CALL(var, real, args)     \
	do {                      \
		nccl_depth++;     \
		var = real args;  \
		nccl_depth--;     \
	} while (0)

/* The one shape of every generated shim: the real function, or ncclInternalError without one;
 * not recording: a plain forward; else the entry time t0 (the expression), the call under the
 * provider's guard, and `after` (a statement: t0, ret and the parameters in scope). */
#define NCCL_SHIM(name, params, args, t0_expr, after)    \
	ST_EXPORT ncclResult_t name params                \
	{                                                 \
		__typeof__(real_##name) real = R(name);   \
		if (unlikely(!real))                      \
			return ncclInternalError;         \
		if (!ON())                                \
			return real args;                 \
		uint64_t t0 = t0_expr;                    \
		ncclResult_t ret;                         \
		CALL(ret, real, args);                    \
		after;                                    \
		return ret;                               \
	}
#define NCCL_ARGS(...) __VA_ARGS__ /* (a, b) -> a, b */

/* ---- collectives and point to point (rows ST_NCCL_COLL) ------------------------------------------- */
static inline void coll_record(uint64_t t0, uint16_t kind, ncclComm_t comm, size_t count, ncclDataType_t dt,
			       long redop, long peer, cudaStream_t stream, ncclResult_t ret)
{
	int saved = errno;
	uint32_t id = st_obj_id(comm, NULL);
	uint16_t aux = (uint16_t)(kind | ((uint16_t)(dt & 0xff) << 8));
	uint32_t p = peer < 0 ? ST_NCCL_NO_PEER : (uint32_t)peer;
	if (st_aggregate()) {
		if (accepted(ret))
			st_agg_add(ST_EV_NCCL_COLL, aux, id, p, nbytes(count, dt));
	} else {
		uint64_t t1 = st_tsc();
		uint16_t op = redop < 0 ? ST_NCCL_REDOP_NONE : (redop > 0xfe ? 0xfe : (uint16_t)redop);
		st_ensure_active();
		st_ev_ext_at(t0, ST_EV_NCCL_COLL, aux, id, (uint64_t)count, (uint64_t)(uintptr_t)stream,
			     (uint16_t)((ret & 0xff) | (op << 8)), p, t1 - t0);
	}
	errno = saved;
}

#define ST_NCCL_COLL(name, kind, params, args, count, datatype, redop, peer, comm, stream)            \
	NCCL_SHIM(name, params, args, st_aggregate() ? 0 : st_tsc(),                                    \
		  coll_record(t0, kind, comm, count, datatype, (long)(redop), (long)(peer), stream, ret))
#define ST_NCCL_CALL(name, params, args, after)
#define ST_NCCL_BY_HAND(name, ret_type, params)
#include "nccl_shims.def"

/* ---- communicators ------------------------------------------------------------------------------------ */

/* FNV-1a 64 of the unique id(s): the cross-process key of a communicator (every rank passes the same id) */
static uint64_t fnv1a(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static void json_hash(struct st_json *j, const char *key, uint64_t h)
{
	char s[17];
	static const char hx[] = "0123456789abcdef";
	for (int i = 0; i < 16; i++)
		s[i] = hx[(h >> (60 - 4 * i)) & 0xf];
	s[16] = 0;
	st_json_str(j, key, s);
}

/* helpers of the real library, resolved when first needed */
static ncclResult_t (*real_count)(ncclComm_t, int *);
static ncclResult_t (*real_user_rank)(ncclComm_t, int *);
static ncclResult_t (*real_cu_device)(ncclComm_t, int *);
static ncclResult_t (*real_get_version)(int *);

static int query_int(ncclResult_t (*fn)(ncclComm_t, int *), ncclComm_t comm)
{
	int v = -1;
	ncclResult_t r;
	if (!fn || !comm)
		return -1;
	CALL(r, fn, (comm, &v));
	return r == ncclSuccess ? v : -1;
}

/* What every NCCL_COMM_INIT's side JSON starts with: the id, the call, the library version. */
struct init_rec {
	struct st_json j;
	char buf[768];
	uint32_t id;
};

static void init_begin(struct init_rec *r, ncclComm_t comm, uint16_t variant, const char *call)
{
	int is_new = 0;
	r->id = comm ? st_obj_id(comm, &is_new) : 0;
	st_json_begin_object(&r->j, r->buf, sizeof(r->buf));
	st_json_uint(&r->j, "id", r->id);
	st_json_str(&r->j, "call", call);
	st_json_uint(&r->j, "variant", variant);
	ST_REAL(real_get_version, "ncclGetVersion");
	if (real_get_version) {
		int v = 0;
		ncclResult_t gr;
		CALL(gr, real_get_version, (&v));
		if (gr == ncclSuccess)
			st_json_int(&r->j, "nccl_version", v);
	}
}

/* ... its communicator's rank, size and device (asked of NCCL when the call did not give them), and the
 * event: NCCL_COMM_INIT at t0 with the call's duration, result, rank and size. */
static void init_end(struct init_rec *r, uint64_t t0, uint64_t t1, uint16_t variant, ncclComm_t comm,
		     ncclResult_t ret, int rank, int nranks)
{
	ST_REAL(real_count, "ncclCommCount");
	ST_REAL(real_user_rank, "ncclCommUserRank");
	ST_REAL(real_cu_device, "ncclCommCuDevice");
	if (ret == ncclSuccess && comm) {
		if (rank < 0)
			rank = query_int(real_user_rank, comm);
		if (nranks < 0)
			nranks = query_int(real_count, comm);
		st_json_int(&r->j, "cuda_dev", query_int(real_cu_device, comm));
	}
	st_json_int(&r->j, "rank", rank);
	st_json_int(&r->j, "nranks", nranks);
	st_json_int(&r->j, "result", ret);
	st_json_close(&r->j, '}');
	st_ensure_active();
	uint64_t side = r->j.overflow ? 0 : st_side_json(r->j.buf, r->j.len);
	st_ev_ext_at(t0, ST_EV_NCCL_COMM_INIT, variant, r->id, side, t1 - t0, (uint16_t)(ret & 0xffff),
		     (uint32_t)rank, (uint64_t)(uint32_t)nranks);
}

static void comm_created(uint64_t t0, uint16_t variant, const char *call, ncclComm_t *comm_p, ncclResult_t ret,
			 int rank, int nranks, const ncclUniqueId *ids, int nid, const ncclConfig_t *config)
{
	uint64_t t1 = st_tsc();
	int saved = errno;
	ncclComm_t comm = (accepted(ret) && comm_p) ? *comm_p : NULL;
	struct init_rec r;
	init_begin(&r, comm, variant, call);
	if (ids && nid > 0) {
		st_json_int(&r.j, "nid", nid);
		json_hash(&r.j, "unique_id_hash", fnv1a(ids, (size_t)nid * sizeof(ncclUniqueId)));
	}
	if (variant == ST_NCCL_INIT_RANK_CONFIG || variant == ST_NCCL_INIT_RANK_SCALABLE)
		st_json_hex(&r.j, "config", (uintptr_t)config);
	init_end(&r, t0, t1, variant, comm, ret, rank, nranks);
	errno = saved;
}

static void init_rank_done(uint64_t t0, ncclResult_t ret, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	comm_created(t0, ST_NCCL_INIT_RANK, "ncclCommInitRank", comm, ret, rank, nranks, &commId, 1, NULL);
}

static void init_rank_config_done(uint64_t t0, ncclResult_t ret, ncclComm_t *comm, int nranks, ncclUniqueId commId,
				  int rank, ncclConfig_t *config)
{
	comm_created(t0, ST_NCCL_INIT_RANK_CONFIG, "ncclCommInitRankConfig", comm, ret, rank, nranks, &commId, 1, config);
}

static void init_rank_scalable_done(uint64_t t0, ncclResult_t ret, ncclComm_t *newcomm, int nranks, int myrank,
				    int nId, ncclUniqueId *commIds, ncclConfig_t *config)
{
	comm_created(t0, ST_NCCL_INIT_RANK_SCALABLE, "ncclCommInitRankScalable", newcomm, ret, myrank, nranks, commIds,
		     commIds ? nId : 0, config);
}

/* One process, ndev communicators of one clique: an event per communicator, rank = its index; the JSON
 * names the k-th ncclCommInitAll of the process (the clique's key) and the device. */
static void init_all_done(uint64_t t0, ncclResult_t ret, ncclComm_t *comms, int ndev, const int *devlist)
{
	static uint32_t calls;
	uint64_t t1 = st_tsc();
	int saved = errno;
	uint32_t k = __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < (ndev > 0 ? ndev : 1); i++) {
		ncclComm_t c = (accepted(ret) && comms && ndev > 0) ? comms[i] : NULL;
		struct init_rec r;
		init_begin(&r, c, ST_NCCL_INIT_ALL, "ncclCommInitAll");
		st_json_uint(&r.j, "init_all_index", k);
		st_json_int(&r.j, "device", devlist ? devlist[i] : i);
		init_end(&r, t0, t1, ST_NCCL_INIT_ALL, c, ret, ndev > 0 ? i : -1, ndev);
		if (ndev <= 0)
			break;
	}
	errno = saved;
}

/* The new communicator's ranks share the parent's key, the color and the parent's split count (the
 * correlator counts splits per parent, docs/schema.md). */
static void split_done(uint64_t t0, ncclResult_t ret, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
		       ncclConfig_t *config)
{
	uint64_t t1 = st_tsc();
	int saved = errno;
	ncclComm_t c = (accepted(ret) && newcomm) ? *newcomm : NULL;
	uint32_t parent = st_obj_id(comm, NULL);
	struct init_rec r;
	init_begin(&r, c, ST_NCCL_INIT_SPLIT, "ncclCommSplit");
	st_json_uint(&r.j, "parent", parent);
	st_json_int(&r.j, "color", color);
	st_json_int(&r.j, "key", key);
	st_json_hex(&r.j, "config", (uintptr_t)config);
	init_end(&r, t0, t1, ST_NCCL_INIT_SPLIT, c, ret, -1, -1);
	errno = saved;
}

/* A 24-byte event at t0 (communicator ends, group starts), errno kept. */
static void short_event(uint64_t t0, uint16_t type, uint16_t aux, uint32_t obj, ncclResult_t ret)
{
	int saved = errno;
	st_ensure_active();
	struct st_event *e = st_reserve(1);
	if (e) {
		*e = (struct st_event){t0, type, aux, obj, (uint64_t)(uint32_t)ret};
		st_commit();
	}
	errno = saved;
}

static inline void comm_ended(uint64_t t0, uint16_t how, ncclComm_t comm, ncclResult_t ret)
{
	short_event(t0, ST_EV_NCCL_COMM_DESTROY, how, st_obj_id(comm, NULL), ret);
}

static void finalize_done(uint64_t t0, ncclResult_t ret, ncclComm_t comm)
{
	comm_ended(t0, ST_NCCL_END_FINALIZE, comm, ret);
}

static void destroy_done(uint64_t t0, ncclResult_t ret, ncclComm_t comm)
{
	comm_ended(t0, ST_NCCL_END_DESTROY, comm, ret);
}

static void abort_done(uint64_t t0, ncclResult_t ret, ncclComm_t comm)
{
	comm_ended(t0, ST_NCCL_END_ABORT, comm, ret);
}

#define ST_NCCL_COLL(name, kind, params, args, count, datatype, redop, peer, comm, stream)
#define ST_NCCL_CALL(name, params, args, after) \
	NCCL_SHIM(name, params, args, st_tsc(), after(t0, ret, NCCL_ARGS args))
#define ST_NCCL_BY_HAND(name, ret_type, params)
#include "nccl_shims.def"

/* ---- groups ---------------------------------------------------------------------------------------------- */
/* NCCL's group depth is per thread; ours follows it (a start that NCCL refused opens nothing). */
ST_EXPORT ncclResult_t ncclGroupStart(void)
{
	__typeof__(real_ncclGroupStart) real = R(ncclGroupStart);
	if (unlikely(!real))
		return ncclInternalError;
	if (!ON())
		return real();
	uint64_t t0 = st_aggregate() ? 0 : st_tsc();
	ncclResult_t ret;
	CALL(ret, real, ());
	if (ret == ncclSuccess)
		group_depth++;
	if (!st_aggregate())
		short_event(t0, ST_EV_NCCL_GROUP_START, (uint16_t)group_depth, 0, ret);
	return ret;
}

static ncclResult_t group_end(ncclResult_t (*real)(ncclSimInfo_t *), int simulated, ncclSimInfo_t *sim)
{
	uint64_t t0 = st_aggregate() ? 0 : st_tsc();
	int depth = group_depth;
	ncclResult_t ret;
	CALL(ret, real, (sim));
	if (group_depth > 0) /* NCCL leaves the group on errors too */
		group_depth--;
	if (!st_aggregate()) {
		uint64_t t1 = st_tsc();
		int saved = errno;
		st_ensure_active();
		st_ev_ext_at(t0, ST_EV_NCCL_GROUP_END, (uint16_t)depth, 0, (uint64_t)(uint32_t)ret, t1 - t0,
			     (uint16_t)simulated, 0, 0);
		errno = saved;
	}
	return ret;
}

static ncclResult_t group_end_plain(ncclSimInfo_t *unused)
{
	return real_ncclGroupEnd();
}

ST_EXPORT ncclResult_t ncclGroupEnd(void)
{
	if (unlikely(!R(ncclGroupEnd)))
		return ncclInternalError;
	return ON() ? group_end(group_end_plain, 0, NULL) : real_ncclGroupEnd();
}

ST_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
	__typeof__(real_ncclGroupSimulateEnd) real = R(ncclGroupSimulateEnd);
	if (unlikely(!real))
		return ncclInternalError;
	return ON() ? group_end(real, 1, simInfo) : real(simInfo);
}

/* ---- hook table (dlsym injection) ------------------------------------------------------------------------ */
static const struct st_hook nccl_hooks[] = {
#define ST_NCCL_COLL(name, kind, params, args, count, datatype, redop, peer, comm, stream) \
	{#name, (void *)name, (void **)&real_##name, ST_PROV_NCCL},
#define ST_NCCL_CALL(name, params, args, after) {#name, (void *)name, (void **)&real_##name, ST_PROV_NCCL},
#define ST_NCCL_BY_HAND(name, ret_type, params) {#name, (void *)name, (void **)&real_##name, ST_PROV_NCCL},
#include "nccl_shims.def"
};

ST_HOOKS_CONSTRUCTOR(210, nccl_hooks)
