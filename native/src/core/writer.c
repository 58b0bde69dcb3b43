/*
 * The background writer: the only code that writes the trace file while
 * the program runs.
 *
 *  - the writer sleeps on a futex; application threads wake it only when
 *    they hand over a full chunk; otherwise it wakes every flush_ms to write
 *    partly filled chunks (so SIGKILL loses at most flush_ms of events) and
 *    every calib_ms to record a calibration pair;
 *  - every chunk write happens under io_lock, a spin lock with an owner so
 *    the fatal-signal path can take it with a bounded wait and never
 *    deadlock against itself.
 *
 * Activation, the final pass (exit, fatal signals) and fork are in
 * lifecycle.c; the side channel in side.c; the PROCESS header in process.c.
 */
#include <errno.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "procwriter.h"
#include "writer_internal.h"

int st_trace_fd = -1;
uint64_t st_trace_uid;
pid_t st_owner_pid;
int st_io_owner;
int st_trace_closed;

struct st_thread *st_threads[ST_MAX_THREADS];
uint32_t st_nthreads;
uint32_t st_next_thread_index = 1;
pthread_mutex_t st_thread_reg_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t st_total_events, st_total_dropped_reclaimed, st_chunks_written;
uint32_t st_threads_seen;

/* wake-up */
static uint32_t wseq;
static uint32_t wsleeping;

/* scratch buffer: used only under io_lock */
static struct st_aggregate aggbuf[512];
static __thread int tls_is_writer ST_TLS; /* the writer thread (SIGMATRACE_TEST_WRITER_DELAY_MS) */

static pid_t gettid_(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* ---- io lock ------------------------------------------------------------ */

/* Threads in st_io_trylock_bounded (an exit or signal path): st_io_lock
 * gives way to them, so a writer that takes the lock again and again (a
 * slow disk, a flood of records) cannot make them miss every moment it is
 * free until their deadline passes. */
static uint32_t io_bounded_waiters;

void st_io_lock(void)
{
	int me = gettid_(), zero;
	for (unsigned i = 0;; i++) {
		zero = 0;
		if (!__atomic_load_n(&io_bounded_waiters, __ATOMIC_ACQUIRE) &&
		    __atomic_compare_exchange_n(&st_io_owner, &zero, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return;
		if (i > 64) {
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
	}
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Bounded (about a second, by the clock): for signal handlers and _exit.
 * Fails at once when we interrupted ourselves. */
int st_io_trylock_bounded(void)
{
	int me = gettid_(), zero;
	if (__atomic_load_n(&st_io_owner, __ATOMIC_RELAXED) == me)
		return -1;
	uint64_t deadline = mono_ns() + 1000000000ull;
	__atomic_fetch_add(&io_bounded_waiters, 1, __ATOMIC_ACQ_REL);
	int got = -1;
	for (;;) {
		zero = 0;
		if (__atomic_compare_exchange_n(&st_io_owner, &zero, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
			got = 0;
			break;
		}
		if (mono_ns() >= deadline)
			break;
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	__atomic_fetch_sub(&io_bounded_waiters, 1, __ATOMIC_ACQ_REL);
	return got;
}

int st_mutex_take(pthread_mutex_t *m, int how)
{
	if (how == ST_LOCK_WAIT)
		return pthread_mutex_lock(m);
	if (how == ST_LOCK_TRY)
		return pthread_mutex_trylock(m);
	return st_mutex_lock_bounded(m, 200);
}

int st_mutex_lock_bounded(pthread_mutex_t *m, unsigned ms)
{
	uint64_t deadline = mono_ns() + (uint64_t)ms * 1000000ull;
	for (;;) {
		if (pthread_mutex_trylock(m) == 0)
			return 0;
		if (mono_ns() >= deadline)
			return -1;
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
}

void st_io_unlock(void)
{
	__atomic_store_n(&st_io_owner, 0, __ATOMIC_RELEASE);
}

/* ---- raw chunk output (io_lock held) ------------------------------------ */


void st_write_chunk(uint16_t kind, uint32_t thread_index, uint32_t count, const void *p, size_t len,
		    const void *p2, size_t len2)
{
	static const unsigned char zeros[8];
	if (st_trace_fd < 0 || st_trace_closed)
		return;
	size_t pad = (8 - ((len + len2) & 7)) & 7;
	struct st_chunk_header h = {
		.magic = ST_FORMAT_MAGIC,
		.version = ST_FORMAT_VERSION,
		.kind = kind,
		.process_uid = st_trace_uid,
		.thread_index = thread_index,
		.payload_len = (uint32_t)(len + len2 + pad),
		.count = count,
	};
	uint32_t crc = st_crc32(0, &h, 28);
	if (len)
		crc = st_crc32(crc, p, len);
	if (len2)
		crc = st_crc32(crc, p2, len2);
	if (pad)
		crc = st_crc32(crc, zeros, pad);
	h.crc32 = crc;
	struct iovec iov[4] = {{&h, sizeof(h)}, {(void *)p, len}, {(void *)p2, len2}, {(void *)zeros, pad}};
	int saved = errno;
	if (unlikely(st_cfg.test_writer_delay_ms) && tls_is_writer) {
		/* test hook: a slow disk (the writer thread only; never the final pass) */
		struct timespec ts = {(time_t)(st_cfg.test_writer_delay_ms / 1000), (long)(st_cfg.test_writer_delay_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	if (st_writev_all(st_trace_fd, iov, 4) == 0)
		st_chunks_written++;
	errno = saved;
}

void st_write_json_chunk(uint16_t kind, uint32_t thread_index, const struct st_json *j)
{
	st_write_chunk(kind, thread_index, 0, j->buf, j->len, NULL, 0);
}

/* ---- threads -------------------------------------------------------------- */

int st_thread_register(struct st_thread *t)
{
	pthread_mutex_lock(&st_thread_reg_lock);
	uint32_t slot = ST_MAX_THREADS;
	for (uint32_t i = 0; i < st_nthreads; i++)
		if (!__atomic_load_n(&st_threads[i], __ATOMIC_ACQUIRE)) { /* the writer frees slots (reclaim) */
			slot = i;
			break;
		}
	if (slot == ST_MAX_THREADS && st_nthreads < ST_MAX_THREADS)
		slot = st_nthreads;
	if (slot == ST_MAX_THREADS) {
		pthread_mutex_unlock(&st_thread_reg_lock);
		return -1;
	}
	t->index = st_next_thread_index++;
	__atomic_store_n(&st_threads[slot], t, __ATOMIC_RELEASE);
	if (slot == st_nthreads)
		__atomic_store_n(&st_nthreads, st_nthreads + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&st_thread_reg_lock);
	return 0;
}

static uint64_t count_events(const struct st_event *e, uint32_t n)
{
	uint64_t k = 0;
	for (uint32_t i = 0; i < n; i++)
		k += e[i].type != ST_EV_EXT;
	return k;
}

static void describe_thread(struct st_thread *t)
{
	struct st_json j;
	char buf[512];
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "thread_index", t->index);
	st_json_int(&j, "tid", t->tid);
	st_json_str(&j, "name", t->name);
	st_json_str(&j, "role", t->tid == st_owner_pid ? "main" : "app");
	st_json_close(&j, '}');
	st_write_json_chunk(ST_CHUNK_THREAD, t->index, &j);
	t->described = 1;
	st_threads_seen++;
}

static void write_records(struct st_thread *t, struct st_chunk *c, uint32_t from, uint32_t to)
{
	if (to <= from)
		return;
	if (c->kind == ST_CHUNK_AGGREGATE) {
		const struct st_aggregate *a = (const struct st_aggregate *)c->data;
		st_write_chunk(ST_CHUNK_AGGREGATE, t->index, to - from, a + from, (size_t)(to - from) * sizeof(*a), NULL, 0);
	} else {
		const struct st_event *e = (const struct st_event *)c->data;
		st_write_chunk(ST_CHUNK_EVENTS, t->index, to - from, e + from, (size_t)(to - from) * sizeof(*e), NULL, 0);
		st_total_events += count_events(e + from, to - from);
	}
}

/* Write a live thread's counters directly (final pass only; values may be
 * a moment stale for threads still running while the process exits). */
static void write_live_aggregates(struct st_thread *t)
{
	if (!t->agg)
		return;
	uint32_t k = 0;
	for (uint32_t i = 0; i < ST_AGG_SLOTS; i++) {
		if (t->agg[i].a.count) {
			aggbuf[k++] = t->agg[i].a;
			if (k == sizeof(aggbuf) / sizeof(aggbuf[0])) {
				st_write_chunk(ST_CHUNK_AGGREGATE, t->index, k, aggbuf, k * sizeof(aggbuf[0]), NULL, 0);
				k = 0;
			}
		}
	}
	if (k)
		st_write_chunk(ST_CHUNK_AGGREGATE, t->index, k, aggbuf, k * sizeof(aggbuf[0]), NULL, 0);
}

/* One thread's pending output.  partial: also the committed part of the
 * chunk being filled.  Returns 1 when the thread's state was reclaimed. */
int st_drain_thread(uint32_t slot, int partial, int final)
{
	struct st_thread *t = __atomic_load_n(&st_threads[slot], __ATOMIC_ACQUIRE);
	if (!t)
		return 0;
	if (!t->described)
		describe_thread(t);
	int exited = __atomic_load_n(&t->exited, __ATOMIC_ACQUIRE);
	for (uint32_t guard = 0; guard < t->nchunks; guard++) {
		struct st_chunk *c = &t->chunks[t->writer_idx];
		if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != ST_CHUNK_FULL)
			break;
		write_records(t, c, c->flushed, c->count);
		c->flushed = 0;
		__atomic_store_n(&c->committed, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&c->state, ST_CHUNK_FREE, __ATOMIC_RELEASE);
		t->writer_idx = (t->writer_idx + 1) % t->nchunks;
	}
	if (exited) {
		if (!final) {
			/* everything was handed over before `exited`: give the memory back */
			st_total_dropped_reclaimed += t->dropped_total;
			__atomic_store_n(&st_threads[slot], NULL, __ATOMIC_RELEASE);
			munmap(t, t->map_bytes);
			return 1;
		}
		return 0;
	}
	if (partial) {
		/* the chunk the thread is filling: `committed` first (acquire), then its kind — the thread sets
		 * the kind before its first commit, so a kind read after a non-zero commit is this use's (read
		 * first, it could be a previous use's while the thread takes the chunk for aggregates) */
		struct st_chunk *c = &t->chunks[t->writer_idx];
		uint32_t n = __atomic_load_n(&c->committed, __ATOMIC_ACQUIRE) / (uint32_t)sizeof(struct st_event);
		if (n > c->flushed && __atomic_load_n(&c->kind, __ATOMIC_RELAXED) == ST_CHUNK_EVENTS) {
			write_records(t, c, c->flushed, n);
			c->flushed = n;
		}
	}
	if (final)
		write_live_aggregates(t);
	return 0;
}

static void drain_all(int partial, int final)
{
	uint32_t n = __atomic_load_n(&st_nthreads, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n; i++) {
		st_io_lock();
		if (!st_trace_closed)
			st_drain_thread(i, partial, 0);
		st_io_unlock();
	}
	(void)final;
	st_io_lock();
	if (!st_trace_closed) {
		st_drain_lanes(0);
		st_drain_side(ST_LOCK_TRY);
		if (__atomic_load_n(&st_header_dirty, __ATOMIC_ACQUIRE))
			st_write_process_header(ST_LOCK_TRY);
	}
	st_io_unlock();
}

/* ---- the writer thread --------------------------------------------------- */

void st_writer_kick(void)
{
	if (st_shm) {
		st_pw_kick();
		return;
	}
	__atomic_fetch_add(&wseq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&wsleeping, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &wseq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void *st_writer_main(void *arg)
{
	(void)arg;
	tls_is_writer = 1;
	/* TSC frequency: from the load-time calibration to now (at least 2 ms,
	 * so the header is usable for short programs); refined at exit. */
	struct st_calibration now;
	st_calibrate(&now, ST_CALIB_PERIODIC);
	if (now.monotonic_raw_ns < st_calib_start.monotonic_raw_ns + 2000000ull) {
		uint64_t left = st_calib_start.monotonic_raw_ns + 2000000ull - now.monotonic_raw_ns;
		struct timespec ts = {0, (long)(left > 2000000ull ? 2000000ull : left)};
		nanosleep(&ts, NULL);
	}
	st_estimate_tsc_hz();

	st_io_lock();
	st_write_process_header(ST_LOCK_BOUNDED); /* not taken in 200 ms: written on a later round (dirty) */
	if (st_have_calib_start)
		st_write_chunk(ST_CHUNK_CALIBRATION, 0, 1, &st_calib_start, sizeof(st_calib_start), NULL, 0);
	st_io_unlock();

	uint64_t next_flush = st_now_ns() + (uint64_t)st_cfg.flush_ms * 1000000ull;
	uint64_t next_calib = st_now_ns() + (uint64_t)st_cfg.calib_ms * 1000000ull;
	uint32_t seen = __atomic_load_n(&wseq, __ATOMIC_SEQ_CST);
	for (;;) {
		if (__atomic_load_n(&st_trace_closed, __ATOMIC_ACQUIRE))
			break;
		uint64_t now = st_now_ns();
		int partial = now >= next_flush;
		drain_all(partial, 0);
		if (partial)
			next_flush = now + (uint64_t)st_cfg.flush_ms * 1000000ull;
		if (now >= next_calib) {
			st_io_lock();
			if (!st_trace_closed)
				st_write_calibration(ST_CALIB_PERIODIC);
			st_io_unlock();
			next_calib = now + (uint64_t)st_cfg.calib_ms * 1000000ull;
		}
		/* sleep until a hand-over or the next deadline */
		__atomic_store_n(&wsleeping, 1, __ATOMIC_SEQ_CST);
		uint32_t s = __atomic_load_n(&wseq, __ATOMIC_SEQ_CST);
		if (s == seen) {
			now = st_now_ns();
			uint64_t dl = next_flush < next_calib ? next_flush : next_calib;
			uint64_t wait = dl > now ? dl - now : 0;
			if (wait) {
				struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
				syscall(SYS_futex, &wseq, FUTEX_WAIT_PRIVATE, s, &ts, NULL, 0);
			}
		}
		__atomic_store_n(&wsleeping, 0, __ATOMIC_SEQ_CST);
		seen = __atomic_load_n(&wseq, __ATOMIC_SEQ_CST);
	}
	return NULL;
}
