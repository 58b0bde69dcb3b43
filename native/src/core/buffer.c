/*
 * Per-thread chunk rings.
 *
 * Each recording thread owns a ring of st_cfg.chunks chunks of
 * st_cfg.chunk_bytes each, mapped with mmap (never malloc: we may be called
 * from inside malloc-using code or early in process start).  The thread
 * fills its current chunk; when it is full it is handed to the writer
 * (state FREE -> FULL with a release store, then one cheap wake-up) and the
 * thread moves to the next chunk of the ring.  If that chunk has not been
 * written yet the thread drops events (counting them) until it is free
 * again, or waits for it under SIGMATRACE_DROP_POLICY=block.  When recording
 * resumes after drops, a DROPS record carries the number lost.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "procwriter.h"

void st_pw_thread_publish(void *region) ST_HIDDEN;

__thread struct st_thread *st_tls_self ST_TLS;
__thread int st_tls_depth ST_TLS;
static __thread int tls_state ST_TLS; /* 0 none, 1 live, 2 exiting/gone (never re-create) */

static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void thread_key_destructor(void *arg);
static void make_key(void)
{
	pthread_key_create(&exit_key, thread_key_destructor);
}

static inline uint32_t chunk_capacity(uint32_t kind)
{
	return st_cfg.chunk_bytes / (kind == ST_CHUNK_AGGREGATE ? sizeof(struct st_aggregate) : sizeof(struct st_event));
}

/* A record the ring writes itself (thread start and end, drops), in the
 * current chunk; the caller has checked there is room. */
static inline void put_own_record(struct st_thread *t, uint16_t type, uint32_t obj, uint64_t arg)
{
	struct st_event *e = t->pos++;
	e->tsc = st_tsc();
	e->type = type;
	e->aux = 0;
	e->obj = obj;
	e->arg = arg;
}

static struct st_thread *thread_create(void)
{
	if (tls_state == 2 || !st_cfg.enabled)
		return NULL;
	st_ensure_active();
	if (!__atomic_load_n(&st_active, __ATOMIC_ACQUIRE))
		return NULL;
	uint32_t n = st_cfg.chunks;
	size_t head = sizeof(struct st_thread) + n * sizeof(struct st_chunk);
	head = (head + 4095) & ~(size_t)4095;
	size_t aggb = st_aggregate() ? ST_AGG_SLOTS * sizeof(struct st_agg_entry) : 0;
	size_t total = head + aggb + (size_t)n * st_cfg.chunk_bytes;
	uint32_t pw_index = 0;
	void *m;
	if (st_shm) {
		/* the consumer process's writer: the ring is a region of the shared memfd */
		m = st_pw_thread_region(total, &pw_index);
		if (!m) {
			tls_state = 2;
			return NULL;
		}
	} else {
		m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED) {
			tls_state = 2;
			return NULL;
		}
	}
	struct st_thread *t = m;
	t->data_off = (uint32_t)(head + aggb);
	t->agg_off = aggb ? (uint32_t)head : 0;
	t->map_bytes = total;
	t->nchunks = n;
	t->tid = (pid_t)syscall(SYS_gettid);
	pthread_getname_np(pthread_self(), t->name, sizeof(t->name));
	t->agg = aggb ? (struct st_agg_entry *)((char *)m + head) : NULL;
	unsigned char *data = (unsigned char *)m + head + aggb;
	for (uint32_t i = 0; i < n; i++) {
		t->chunks[i].data = data + (size_t)i * st_cfg.chunk_bytes;
		t->chunks[i].kind = ST_CHUNK_EVENTS;
	}
	t->idle_open = 0;
	t->cur_idx = 0;
	t->cur = &t->chunks[0];
	t->base = t->pos = (struct st_event *)t->cur->data;
	t->lim = t->base + chunk_capacity(ST_CHUNK_EVENTS);
	if (st_shm) {
		t->index = pw_index;
	} else if (st_thread_register(t) != 0) {
		munmap(m, total);
		tls_state = 2;
		return NULL;
	}
	pthread_once(&key_once, make_key);
	pthread_setspecific(exit_key, t);
	tls_state = 1;
	st_tls_self = t;
	put_own_record(t, ST_EV_THREAD_START, (uint32_t)t->tid, 0); /* first record of every thread */
	__atomic_store_n(&t->cur->committed, (uint32_t)sizeof(struct st_event), __ATOMIC_RELEASE);
	if (st_shm)
		st_pw_thread_publish(t); /* now the consumer may read it */
	return t;
}

/* Hand the current chunk (count records of its kind) to the writer. */
static void handover(struct st_thread *t, uint32_t count)
{
	struct st_chunk *c = t->cur;
	c->count = count;
	__atomic_store_n(&c->state, ST_CHUNK_FULL, __ATOMIC_RELEASE);
	st_writer_kick();
	t->cur = NULL;
	t->pos = t->lim = t->base = NULL;
	t->cur_idx = (t->cur_idx + 1) % t->nchunks;
}

/* Try to make the next ring chunk current; 0 on success. */
static int take_next(struct st_thread *t)
{
	struct st_chunk *c = &t->chunks[t->cur_idx];
	if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != ST_CHUNK_FREE) {
		if (st_cfg.drop_policy != ST_DROP_BLOCK || st_tls_never_block)
			return -1; /* a thread that must never wait (a poller) drops even under block */
		if (st_shm && st_pw_consumer_gone())
			return -1; /* no consumer to wait for */
		/* block: wait for the writer, but never forever (a dead writer
		 * or a handler running on the writer's behalf must not hang us) */
		for (int i = 0; i < 20000; i++) {
			st_writer_kick();
			struct timespec ts = {0, 50000};
			nanosleep(&ts, NULL);
			if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == ST_CHUNK_FREE)
				goto free_now;
			if (st_shm && (i & 255) == 255 && st_pw_consumer_gone())
				break;
		}
		return -1;
	}
free_now:
	__atomic_store_n(&c->kind, ST_CHUNK_EVENTS, __ATOMIC_RELAXED); /* read by the writer: see drain_thread */
	t->cur = c;
	t->base = t->pos = (struct st_event *)c->data;
	t->lim = t->base + chunk_capacity(ST_CHUNK_EVENTS);
	return 0;
}

static struct st_event *reserve_slow(unsigned n, int end_runs);

/* End the thread's open runs of idle polls (st_idle_poll): the last call of each is recorded now, at its
 * own time, standing for the calls not recorded since its first (none: the first was the whole run). */
void st_idle_runs_end(struct st_thread *t)
{
	uint32_t open = t->idle_open;
	t->idle_open = 0;
	for (uint32_t i = 0; i < open; i++) {
		struct st_idle_run *r = &t->idle[i];
		uint32_t polls = r->polls;
		if (!polls)
			continue;
		struct st_event *e = t->pos + 1 <= t->lim ? t->pos++ : reserve_slow(1, 0);
		__atomic_store_n(&r->polls, 0, __ATOMIC_RELAXED);
		if (!e)
			continue; /* counted as one dropped record by reserve_slow */
		*e = (struct st_event){r->last_tsc, r->type, 0, r->obj, r->arg | ((uint64_t)polls << ST_IDLE_POLLS_SHIFT)};
		__atomic_store_n(&t->cur->committed, (uint32_t)((char *)t->pos - (char *)t->base), __ATOMIC_RELEASE);
	}
}

/* end_runs: a record other than an idle poll's (which ends the open runs first) */
static struct st_event *reserve_slow(unsigned n, int end_runs)
{
	struct st_thread *t = st_tls_self;
	if (t && t->idle_open && end_runs) {
		st_idle_runs_end(t);
		if (t->pos + n <= t->lim) {
			struct st_event *e = t->pos;
			t->pos += n;
			return e;
		}
	}
	if (!t) {
		t = thread_create();
		if (!t)
			return NULL;
		if (t->pos + n <= t->lim) {
			struct st_event *e = t->pos;
			t->pos += n;
			return e;
		}
	}
	if (t->cur) {
		/* current chunk cannot hold n more records: hand it over as is */
		uint32_t used = (uint32_t)(t->pos - t->base);
		t->events_total += used;
		handover(t, used);
	}
	if (take_next(t) != 0) {
		t->dropped_pending++;
		t->dropped_total++;
		return NULL;
	}
	if (t->dropped_pending) {
		/* tell the reader how many records are missing right here */
		put_own_record(t, ST_EV_DROPS, 0, t->dropped_pending);
		t->dropped_pending = 0;
	}
	struct st_event *e = t->pos;
	t->pos += n;
	return e;
}

/* errno is kept here, not by every wrapper around its fast path: the
 * record paths touch errno only when they reach the slow path (mmap, futex). */
struct st_event *st_reserve_slow(unsigned n)
{
	int saved = errno;
	struct st_event *e = reserve_slow(n, 1);
	errno = saved;
	return e;
}

struct st_event *st_reserve_idle_slow(void)
{
	int saved = errno;
	struct st_event *e = reserve_slow(1, 0);
	errno = saved;
	return e;
}

/* ---- aggregate mode ---------------------------------------------------- */

static inline unsigned agg_hash(uint16_t type, uint16_t aux, uint32_t obj, uint64_t peer)
{
	uint64_t x = ((uint64_t)type << 48) ^ ((uint64_t)aux << 32) ^ obj ^ (peer * 0x9e3779b97f4a7c15ull);
	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 32;
	return (unsigned)x & (ST_AGG_SLOTS - 1);
}

/* Move the counters into AGGREGATE chunks for the writer; records with the
 * same key add up in the reader, so spilling early loses nothing. */
static void agg_spill(struct st_thread *t)
{
	if (!t->agg || !t->agg_used)
		return;
	/* close the current events chunk first so the ring order stays simple */
	if (t->cur) {
		uint32_t used = (uint32_t)(t->pos - t->base);
		t->events_total += used;
		handover(t, used);
	}
	uint32_t cap = chunk_capacity(ST_CHUNK_AGGREGATE);
	uint32_t i = 0;
	while (i < ST_AGG_SLOTS) {
		if (take_next(t) != 0) {
			/* writer is behind: keep the table, try again next time */
			return;
		}
		struct st_chunk *c = t->cur;
		__atomic_store_n(&c->kind, ST_CHUNK_AGGREGATE, __ATOMIC_RELAXED);
		struct st_aggregate *out = (struct st_aggregate *)c->data;
		uint32_t k = 0;
		for (; i < ST_AGG_SLOTS && k < cap; i++) {
			if (t->agg[i].a.count) {
				out[k++] = t->agg[i].a;
				memset(&t->agg[i], 0, sizeof(t->agg[i]));
			}
		}
		handover(t, k);
	}
	t->agg_used = 0;
	t->agg_last = NULL;
	take_next(t);
}

static void agg_slow(uint16_t type, uint16_t aux, uint32_t obj, uint64_t peer, uint64_t bytes)
{
	struct st_thread *t = st_tls_self;
	if (!t) {
		t = thread_create();
		if (!t)
			return;
	}
	if (!t->agg)
		return;
	unsigned h = agg_hash(type, aux, obj, peer);
	for (unsigned i = 0; i < ST_AGG_SLOTS; i++) {
		struct st_agg_entry *s = &t->agg[(h + i) & (ST_AGG_SLOTS - 1)];
		if (s->a.count == 0) {
			if (t->agg_used >= ST_AGG_SLOTS * 3 / 4) {
				agg_spill(t);
				if (t->agg_used) { /* could not spill: count as dropped */
					t->dropped_total++;
					return;
				}
				agg_slow(type, aux, obj, peer, bytes);
				return;
			}
			s->a.type = type;
			s->a.aux = aux;
			s->a.obj = obj;
			s->a.peer = peer;
			s->a.count = 1;
			s->a.bytes = bytes;
			t->agg_used++;
			t->agg_last = s;
			return;
		}
		if (s->a.type == type && s->a.aux == aux && s->a.obj == obj && s->a.peer == peer) {
			s->a.count++;
			s->a.bytes += bytes;
			t->agg_last = s;
			return;
		}
	}
}

void st_agg_slow(uint16_t type, uint16_t aux, uint32_t obj, uint64_t peer, uint64_t bytes)
{
	int saved = errno;
	agg_slow(type, aux, obj, peer, bytes);
	errno = saved;
}

/* ---- thread exit ------------------------------------------------------- */

/* Called on the exiting thread (pthread key destructor) or for the calling
 * thread at process exit: everything it has goes to the writer. */
void st_thread_exit_current(void)
{
	struct st_thread *t = st_tls_self;
	if (!t || tls_state != 1)
		return;
	tls_state = 2;
	if (t->idle_open)
		st_idle_runs_end(t);
	/* THREAD_END goes into the current chunk if there is room */
	if (t->cur && t->pos < t->lim)
		put_own_record(t, ST_EV_THREAD_END, (uint32_t)t->tid, 0);
	agg_spill(t);
	if (t->cur) {
		uint32_t used = (uint32_t)(t->pos - t->base);
		t->events_total += used;
		if (used)
			handover(t, used);
	}
	st_tls_self = NULL;
	__atomic_store_n(&t->exited, 1, __ATOMIC_RELEASE);
	st_writer_kick();
	if (st_shm)
		st_pw_thread_gone(t, t->map_bytes); /* the consumer has its own mapping */
}

static void thread_key_destructor(void *arg)
{
	(void)arg;
	int saved = errno;
	st_thread_exit_current();
	errno = saved;
}

/* fork child: this thread's state belongs to the parent's trace. */
void st_buffer_atfork_child(void)
{
	st_tls_self = NULL;
	tls_state = 0;
	st_tls_depth = 0;
}
