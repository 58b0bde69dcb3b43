/*
 * Recorder core: what providers and the interposition layer may use.
 *
 * Hot path (st_ev / st_ev_ext / st_agg_add) writes 24-byte records into the
 * calling thread's current chunk.  It takes no lock and touches no memory
 * shared with another thread except one release store of the chunk's
 * "committed" count (the writer reads it for periodic flushes of partly
 * filled chunks).  Everything else (file I/O, JSON, CRC) happens in the
 * background writer thread (writer.c).
 */
#ifndef ST_CORE_H
#define ST_CORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sigmatrace/events.h"
#include "sigmatrace/format.h"

#define ST_EXPORT __attribute__((visibility("default")))
#define ST_HIDDEN __attribute__((visibility("hidden")))
#define ST_TLS __attribute__((tls_model("initial-exec")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* ---- configuration (config.c) ---------------------------------------- */
enum st_mode { ST_MODE_AGGREGATE = 0, ST_MODE_SIMPLE = 1, ST_MODE_FULL = 2 };
enum st_drop_policy { ST_DROP_NEWEST = 0, ST_DROP_BLOCK = 1 };

enum st_provider_bit {
	ST_PROV_IBV  = 1u << 0,
	ST_PROV_MLX5 = 1u << 1,
	ST_PROV_CUDA = 1u << 2,
	ST_PROV_UCX  = 1u << 3,
	ST_PROV_OFI  = 1u << 4,
	ST_PROV_NCCL = 1u << 5,
	ST_PROV_ALL  = 0x3f,
};

struct st_config {
	int enabled;              /* 0: SIGMATRACE_DISABLE=1, nothing is recorded */
	int mode;                 /* enum st_mode */
	unsigned providers;       /* enum st_provider_bit mask */
	char output_dir[512];
	uint32_t chunk_bytes;     /* SIGMATRACE_BUFFER_KB * 1024 */
	uint32_t chunks;          /* SIGMATRACE_CHUNKS per thread */
	int drop_policy;
	uint32_t batch_threshold; /* WQE recovery batch (F9), used by hijack/ */
	uint32_t flush_ms;        /* periodic flush of partly filled chunks */
	uint32_t calib_ms;        /* periodic calibration pairs */
	int signals;              /* install fatal-signal handlers */
	int eager;                /* create the file at start even if unused */
	uint32_t side_kb;         /* SIGMATRACE_SIDE_KB: the process side buffer (a poller's side ring: a quarter) */
	uint32_t test_writer_delay_ms; /* test hook SIGMATRACE_TEST_WRITER_DELAY_MS: the writer sleeps before each chunk */
	int writer_process;       /* a consumer process writes the file (procwriter.c): 1 SIGMATRACE_WRITER=process, 2 default; 0 thread */
	int idle_polls_each;      /* SIGMATRACE_IDLE_POLLS=each: every idle poll is a record (default coalesce, st_idle_poll) */
	char node_id[256];
	char launcher[32];
};

extern struct st_config st_cfg ST_HIDDEN;
void st_config_load(void) ST_HIDDEN;
const char *st_mode_name(int mode) ST_HIDDEN;
const char *st_provider_name(unsigned bit) ST_HIDDEN;
void st_warn(const char *fmt, ...) ST_HIDDEN __attribute__((format(printf, 1, 2)));

static inline int st_provider_on(unsigned bit) { return st_cfg.enabled && (st_cfg.providers & bit); }
static inline int st_full(void) { return st_cfg.mode == ST_MODE_FULL; }
static inline int st_aggregate(void) { return st_cfg.mode == ST_MODE_AGGREGATE; }

/* ---- clock (clock.c) --------------------------------------------------- */
static inline uint64_t st_tsc(void)
{
#if defined(__x86_64__) || defined(__i386__)
	uint32_t lo, hi;
	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
#else
	extern uint64_t st_tsc_fallback(void) ST_HIDDEN;
	return st_tsc_fallback();
#endif
}
void st_calibrate(struct st_calibration *c, uint32_t point) ST_HIDDEN;
double st_tsc_hz_estimate(const struct st_calibration *a, const struct st_calibration *b) ST_HIDDEN;
int st_tsc_invariant(void) ST_HIDDEN;
uint64_t st_now_ns(void) ST_HIDDEN; /* CLOCK_MONOTONIC */

/* ---- crc (crc32.c) ------------------------------------------------------ */
uint32_t st_crc32(uint32_t crc, const void *buf, size_t len) ST_HIDDEN;
int st_crc32_accelerated(void) ST_HIDDEN; /* 1: the carry-less multiply path is in use */

/* ---- per-thread buffers (buffer.c) ------------------------------------ */
enum st_chunk_state { ST_CHUNK_FREE = 0, ST_CHUNK_FULL = 1 };

struct st_chunk {
	uint32_t state;     /* atomic: FREE (thread fills it) or FULL (writer owns it) */
	uint32_t kind;      /* ST_CHUNK_EVENTS or ST_CHUNK_AGGREGATE */
	uint32_t count;     /* records, set before state becomes FULL */
	uint32_t committed; /* atomic: bytes of EVENTS records published so far (partial flush; bytes, not
			     * records: the hot path then needs no division by the record size) */
	uint32_t flushed;   /* writer only: records already written by partial flushes */
	uint32_t pad;
	unsigned char *data;
};

struct st_agg_entry {
	struct st_aggregate a; /* a.count == 0 means empty slot */
};
#define ST_AGG_SLOTS 2048 /* power of two; spilled to the writer at 3/4 full */

/* A run of idle polls of one key (type, object, requested count) on one thread (st_idle_poll). */
struct st_idle_run {
	uint64_t last_tsc;           /* its last call */
	uint32_t polls;              /* atomic (the END record reads it): its calls after the first */
	uint32_t obj, arg;
	uint16_t type;
};
/* Runs open at once on a thread: the empty polls nested in one progress call (ucp_worker_progress over
 * ibv_poll_cq of two CQs) interleave, and each key keeps its own run while they do. */
#define ST_IDLE_RUNS 4

struct st_thread {
	/* hot: the window of the current EVENTS chunk */
	struct st_event *pos, *lim;
	struct st_event *base;
	struct st_chunk *cur;        /* NULL while dropping */
	struct st_agg_entry *agg_last;
	uint32_t idle_open;          /* runs of idle polls open (idle[]): the next other record ends them */
	struct st_idle_run idle[ST_IDLE_RUNS];
	uint64_t dropped_pending;    /* dropped since the last DROPS record */
	/* cold */
	uint64_t dropped_total;
	uint64_t events_total;       /* records handed to chunks (incl. EXT/DROPS) */
	uint32_t cur_idx;            /* ring index of cur (or of the chunk we wait for) */
	uint32_t index;              /* thread_index in the trace, from 1 */
	pid_t tid;
	uint32_t exited;             /* atomic: the thread is gone, writer may reclaim */
	uint32_t writer_idx;         /* writer only: next ring index to write */
	uint32_t described;          /* writer only: THREAD chunk written */
	uint32_t agg_used;
	uint32_t nchunks;
	size_t map_bytes;
	uint32_t data_off;           /* chunk 0's data, from the start of this struct (the consumer process's view) */
	uint32_t agg_off;            /* the aggregate table, likewise (0: none) */
	char name[16];
	struct st_agg_entry *agg;    /* ST_AGG_SLOTS entries (aggregate mode) */
	struct st_chunk chunks[];
};

extern __thread struct st_thread *st_tls_self ST_TLS ST_HIDDEN;
extern __thread int st_tls_depth ST_TLS ST_HIDDEN; /* re-entrancy guard, see interpose.h */

struct st_event *st_reserve_slow(unsigned n) ST_HIDDEN;
void st_agg_slow(uint16_t type, uint16_t aux, uint32_t obj, uint64_t peer, uint64_t bytes) ST_HIDDEN;
void st_thread_exit_current(void) ST_HIDDEN;

/* Reserve n consecutive records of the current chunk (n <= 4).  The record
 * paths (st_reserve, st_commit, st_ev*, st_agg_add) leave errno as it was:
 * only their slow paths make system calls, and those restore it. */
static inline struct st_event *st_reserve(unsigned n)
{
	struct st_thread *t = st_tls_self;
	if (likely(t != NULL && t->pos + n <= t->lim && !t->idle_open)) {
		struct st_event *e = t->pos;
		t->pos = e + n;
		return e;
	}
	return st_reserve_slow(n); /* also ends an open run of idle polls, recording its last call first */
}

/* Publish what was reserved (one release store to thread-owned memory). */
static inline void st_commit(void)
{
	struct st_thread *t = st_tls_self;
	__atomic_store_n(&t->cur->committed, (uint32_t)((char *)t->pos - (char *)t->base), __ATOMIC_RELEASE);
}

static inline void st_ev(uint16_t type, uint16_t aux, uint32_t obj, uint64_t arg)
{
	struct st_event *e = st_reserve(1);
	if (unlikely(!e))
		return;
	e->tsc = st_tsc();
	e->type = type;
	e->aux = aux;
	e->obj = obj;
	e->arg = arg;
	st_commit();
}

/* A record and its EXT continuation, stamped with a time taken earlier (post
 * wrappers stamp the application's call but write after it returns, when the
 * return value and the bad work request are known). */
static inline void st_ev_ext_at(uint64_t tsc, uint16_t type, uint16_t aux, uint32_t obj, uint64_t arg,
				uint64_t x0, uint16_t x1, uint32_t x2, uint64_t x3)
{
	struct st_event *e = st_reserve(2);
	if (unlikely(!e))
		return;
	e[0].tsc = tsc;
	e[0].type = type;
	e[0].aux = aux;
	e[0].obj = obj;
	e[0].arg = arg;
	e[1].tsc = x0;
	e[1].type = ST_EV_EXT;
	e[1].aux = x1;
	e[1].obj = x2;
	e[1].arg = x3;
	st_commit();
}

static inline void st_ev_ext(uint16_t type, uint16_t aux, uint32_t obj, uint64_t arg,
			     uint64_t x0, uint16_t x1, uint32_t x2, uint64_t x3)
{
	st_ev_ext_at(st_tsc(), type, aux, obj, arg, x0, x1, x2, x3);
}

/* Full mode: a poll that found nothing (UCP_WORKER_PROGRESS, OFI_CQ_READ, IBV_POLL_CQ with aux 0),
 * started at tsc.  The first call of a key (type, obj, arg) is recorded and opens a run; the next ones of
 * that key only move the run's end, while the thread records nothing but idle polls (of any key: the
 * polls nested in one progress call interleave).  Any other record of the thread ends every open run
 * (st_reserve -> reserve_slow writes each run's last call, with the calls it stands for at
 * ST_IDLE_POLLS_SHIFT), as do the thread's end and a key beyond ST_IDLE_RUNS.  Two stores per coalesced
 * call. */
struct st_event *st_reserve_idle_slow(void) ST_HIDDEN; /* one record, the open runs left open */
void st_idle_runs_end(struct st_thread *t) ST_HIDDEN;
static inline void st_idle_poll(uint64_t tsc, uint16_t type, uint32_t obj, uint32_t arg)
{
	struct st_thread *t = st_tls_self;
	if (likely(t != NULL)) {
		int end = t->idle_open == ST_IDLE_RUNS; /* no room for another key */
		for (uint32_t i = 0; i < t->idle_open; i++) {
			struct st_idle_run *r = &t->idle[i];
			if (r->type == type && r->obj == obj && r->arg == arg) {
				if (likely(r->polls < ST_IDLE_POLLS_MAX)) {
					r->last_tsc = tsc;
					__atomic_store_n(&r->polls, r->polls + 1, __ATOMIC_RELAXED);
					return;
				}
				end = 1; /* its count is full: this call opens a new run */
				break;
			}
		}
		if (unlikely(end))
			st_idle_runs_end(t);
	}
	/* the first call of a run: recorded, the other open runs stay open */
	struct st_event *e;
	if (likely(t != NULL && t->pos + 1 <= t->lim)) {
		e = t->pos++;
	} else {
		e = st_reserve_idle_slow();
		if (unlikely(!e))
			return;
		t = st_tls_self;
	}
	*e = (struct st_event){tsc, type, 0, obj, arg};
	st_commit();
	if (likely(!st_cfg.idle_polls_each)) {
		struct st_idle_run *r = &t->idle[t->idle_open];
		r->type = type;
		r->obj = obj;
		r->arg = arg;
		r->last_tsc = tsc;
		__atomic_store_n(&r->polls, 0, __ATOMIC_RELAXED);
		t->idle_open++;
	}
}

/* Aggregate mode: count one operation under (type, aux, obj, peer). */
static inline void st_agg_add(uint16_t type, uint16_t aux, uint32_t obj, uint64_t peer, uint64_t bytes)
{
	struct st_thread *t = st_tls_self;
	struct st_agg_entry *h = t ? t->agg_last : NULL;
	if (likely(h != NULL && h->a.type == type && h->a.aux == aux && h->a.obj == obj && h->a.peer == peer)) {
		h->a.count++;
		h->a.bytes += bytes;
		return;
	}
	st_agg_slow(type, aux, obj, peer, bytes);
}

/* ---- process-level services (writer.c, side.c, process.c, lifecycle.c) -- */
/* Start recording (file + writer thread) on first use; cheap when running
 * (lifecycle.c). */
extern int st_active ST_HIDDEN; /* 1 once the writer runs in this process */
void st_activate(void) ST_HIDDEN;
static inline void st_ensure_active(void)
{
	if (unlikely(!__atomic_load_n(&st_active, __ATOMIC_ACQUIRE)))
		st_activate();
}
void st_writer_kick(void) ST_HIDDEN;                     /* writer.c */
int st_thread_register(struct st_thread *t) ST_HIDDEN;   /* writer.c */
uint64_t st_process_uid(void) ST_HIDDEN;                 /* process.c */

/* Side channel (side.c): variable-size records.  Returns the side_id (> 0)
 * or 0 when dropped (counted in the END footer).  Application threads share
 * a mutex-protected buffer (bounded wait when full); a thread that must never
 * wait (a hijack poller) opens a private lane first: its records then never
 * take a lock or wait, and its events never wait for the writer either
 * (SIGMATRACE_DROP_POLICY=block does not apply to it).  0 on success; on
 * failure the thread still never waits (one try of the shared buffer). */
uint64_t st_side_add(uint16_t kind, const void *a, size_t alen, const void *b, size_t blen,
		     const void *c, size_t clen) ST_HIDDEN;
int st_side_lane_open(void) ST_HIDDEN;
void st_side_lane_close(void) ST_HIDDEN; /* the writer drains what is left, then frees it */
extern __thread int st_tls_never_block ST_TLS ST_HIDDEN;
/* Around a record made while holding a lock the pollers take. */
static inline int st_never_block_begin(void)
{
	int old = st_tls_never_block;
	st_tls_never_block = 1;
	return old;
}
static inline void st_never_block_end(int old)
{
	st_tls_never_block = old;
}
static inline uint64_t st_side_json(const char *json, size_t len)
{
	return st_side_add(ST_SIDE_JSON, json, len, NULL, 0, NULL, 0);
}

/* Identity lists for the process header (JSON array text, e.g. "[{...}]";
 * process.c). */
void st_process_set_nics(const char *json_array) ST_HIDDEN;
void st_process_set_gpus(const char *json_array) ST_HIDDEN;
void st_process_set_untraced(const char *json_array) ST_HIDDEN; /* ST_HEADER_UNTRACED_LIBRARIES */

/* ---- small JSON builder (json.c): never allocates ---------------------- */
struct st_json {
	char *buf;
	size_t cap, len;
	int need_comma;
	int overflow;
};
void st_json_init(struct st_json *j, char *buf, size_t cap) ST_HIDDEN;
void st_json_raw(struct st_json *j, const char *s) ST_HIDDEN;
void st_json_open(struct st_json *j, const char *key, char bracket) ST_HIDDEN; /* key may be NULL */
void st_json_close(struct st_json *j, char bracket) ST_HIDDEN;
void st_json_str(struct st_json *j, const char *key, const char *val) ST_HIDDEN; /* NULL -> null */
void st_json_int(struct st_json *j, const char *key, long long v) ST_HIDDEN;
void st_json_uint(struct st_json *j, const char *key, unsigned long long v) ST_HIDDEN;
void st_json_hex(struct st_json *j, const char *key, unsigned long long v) ST_HIDDEN;
void st_json_double(struct st_json *j, const char *key, double v) ST_HIDDEN;
void st_json_null(struct st_json *j, const char *key) ST_HIDDEN;
void st_json_bool(struct st_json *j, const char *key, int v) ST_HIDDEN;
void st_json_bytes_hex(struct st_json *j, const char *key, const void *p, size_t n) ST_HIDDEN;
void st_json_sockaddr(struct st_json *j, const char *key, const void *sa, size_t len) ST_HIDDEN;
/* The start of nearly every side JSON: an object in buf. */
static inline void st_json_begin_object(struct st_json *j, char *buf, size_t cap)
{
	st_json_init(j, buf, cap);
	st_json_open(j, NULL, '{');
}

/* ---- object ids (objmap.c): pointer -> small id, lock-free lookups ----- */
/* is_new != NULL: the object was just created (a fresh id).  0: NULL, or an
 * object the full table could not take (counted; see objmap.c). */
uint32_t st_obj_id(const void *ptr, int *is_new) ST_HIDDEN;
uint32_t st_obj_next_id(void) ST_HIDDEN;
/* Destroy/close wrappers, after the object went: its entry is freed. */
void st_obj_forget(const void *ptr) ST_HIDDEN;
struct st_obj_stats {
	unsigned live, peak, capacity;
	uint64_t unmapped, first_seen_on_use;
};
void st_obj_stats(struct st_obj_stats *out) ST_HIDDEN;

/* ---- what both writers write (io.c) -------------------------------------- */
struct iovec;
#define ST_WRITEV_MAX 8
int st_writev_all(int fd, const struct iovec *iov, int n) ST_HIDDEN; /* 0, or -1 with errno */
/* The END record (docs/format.md): the facts, then the drops of threads 0..nthreads-1 (thread_at: NULL for a
 * free slot).  Into an open object; the caller closes it. */
struct st_end_facts {
	const char *reason;
	int signal;
	uint64_t events, dropped_events, dropped_side_bytes, dropped_side_records, chunks_written;
	uint32_t threads;
	struct st_obj_stats obj;
};
void st_end_record_json(struct st_json *j, const struct st_end_facts *f, struct st_thread *(*thread_at)(uint32_t),
			uint32_t nthreads) ST_HIDDEN;
void st_objmap_atfork_child(void) ST_HIDDEN;

/* ---- fork (lifecycle.c) -------------------------------------------------- */
/* A mutex held across fork (taken by the prepare handler in rank order,
 * released in the parent, made new in the child), so that no fork child
 * inherits it locked by another thread.  Ranks: the order the code nests
 * them in (outer first); a lock is never taken while one of a higher rank
 * is held.  Providers register theirs from their constructors. */
enum st_fork_rank {
	ST_FORK_RANK_ACTIVATION = 10, /* lifecycle.c act_lock */
	ST_FORK_RANK_IBV = 20,        /* st_ibv_lock (takes identity, objmap inside) */
	ST_FORK_RANK_MLX5 = 30,       /* the mlx5 provider's DevX object table */
	ST_FORK_RANK_SIDE = 40,       /* st_side_lock */
	ST_FORK_RANK_THREADS = 50,    /* st_thread_reg_lock */
	ST_FORK_RANK_IDENTITY = 60,   /* st_ident_lock */
	ST_FORK_RANK_OBJMAP = 70,     /* st_objmap_lock */
	ST_FORK_RANK_HOOKS = 80,      /* the interposer's hook registry */
	ST_FORK_RANK_RESOLVER = 90,   /* interpose/resolve.c: our walks of the loaded objects */
};
void st_fork_guard(pthread_mutex_t *m, unsigned rank) ST_HIDDEN;
extern pthread_mutex_t st_objmap_lock ST_HIDDEN;

/* ---- initialisation (init.c) ------------------------------------------- */
void st_init(void) ST_HIDDEN;
extern int st_initialized ST_HIDDEN;

#endif /* ST_CORE_H */
