/*
 * The side channel: variable-size records (JSON, PRM commands, strings,
 * WQE bytes) that events point to by side_id.  The writer drains them into
 * SIDE chunks.
 *
 *  - Application threads share one process buffer (SIGMATRACE_SIDE_KB) under
 *    a mutex: their side records are rare (object creation), so a lock is
 *    cheaper than per-thread buffers.  When the buffer is full they wait for
 *    the writer, bounded (~1 s), then drop the record.
 *  - Tracer threads that must never wait (the hijack's pollers: a poller
 *    that waits holds back the doorbells it forwards) open a private lane
 *    (st_side_lane_open): a single-producer ring that only they write and
 *    that the writer drains under the io lock, no mutex on either side.  A
 *    record that does not fit is dropped at once.
 *
 * Every dropped record is counted (records and bytes, END footer:
 * dropped_side_records, dropped_side_bytes); the caller gets side_id 0 and
 * says what that means in its own events (a WQE range without its bytes is
 * recorded as lost, reason TRACE_DROPPED).  Side ids are unique in the
 * process (one atomic counter for both paths).
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "procwriter.h"
#include "writer_internal.h"

pthread_mutex_t st_side_lock = PTHREAD_MUTEX_INITIALIZER;
unsigned char *st_side_buf;
unsigned char *st_side_spare;
size_t st_side_cap;
size_t st_side_len;
uint32_t st_side_count;
uint64_t st_next_side_id = 1;
uint64_t st_dropped_side_bytes;
uint64_t st_dropped_side_records;

static void count_drop(size_t len)
{
	__atomic_fetch_add(&st_dropped_side_bytes, len, __ATOMIC_RELAXED);
	__atomic_fetch_add(&st_dropped_side_records, 1, __ATOMIC_RELAXED);
}

/* Write one record (header + data + zero padding) at p; need bytes in all. */
static void put_record(unsigned char *p, size_t need, uint64_t id, uint16_t kind, const void *a, size_t alen,
		       const void *b, size_t blen, const void *c, size_t clen)
{
	size_t len = alen + blen + clen;
	struct st_side_header h = {.side_id = id, .length = (uint32_t)len, .kind = kind, .flags = 0};
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	if (alen)
		memcpy(p, a, alen);
	if (blen)
		memcpy(p + alen, b, blen);
	if (clen)
		memcpy(p + alen + blen, c, clen);
	memset(p + len, 0, need - sizeof(h) - len);
}

/* ---- private lanes (tracer threads that never wait) ------------------------ */

/* One producer (the lane's thread), one consumer (the io lock holder, or
 * the consumer process): struct st_side_lane, shm.h. */
enum { LANE_FREE = 0, LANE_OPEN = 1, LANE_EXITED = 2, LANE_CLAIMED = 3 };
#define ST_MAX_LANES ST_SHM_MAX_LANES
static struct st_side_lane own_lanes[ST_MAX_LANES];
static uint32_t own_nlanes;
/* the writer thread's lanes here; the consumer process's in the shared block */
static struct st_side_lane *lanes = own_lanes;
static uint32_t *nlanes_p = &own_nlanes; /* high-water mark (atomic) */
#define lanes_hw (*nlanes_p)
static __thread struct st_side_lane *tls_lane ST_TLS;
__thread int st_tls_never_block ST_TLS;

/* Activation with the consumer process's writer, before st_active is
 * published (whoever sees st_active sees the shared lanes). */
void st_side_use_shared(struct st_side_lane *shared, uint32_t *n)
{
	lanes = shared;
	nlanes_p = n;
}

int st_side_lane_open(void)
{
	st_tls_never_block = 1; /* also when no lane can be had: the shared buffer is then tried once, never waited for */
	if (tls_lane)
		return 0;
	st_ensure_active(); /* the lanes live where the writer can read them (st_side_use_shared) */
	size_t cap = ((size_t)st_cfg.side_kb * 1024 / 4) & ~(size_t)7;
	if (cap < 4096)
		cap = 4096;
	for (uint32_t i = 0; i < ST_MAX_LANES; i++) {
		uint32_t free_ = LANE_FREE;
		if (!__atomic_compare_exchange_n(&lanes[i].state, &free_, LANE_CLAIMED, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		struct st_side_lane *l = &lanes[i];
		void *m;
		if (st_shm) {
			uint64_t off;
			m = st_pw_region(cap, &off); /* not inherited by a fork child either */
			if (!m) {
				__atomic_store_n(&l->state, LANE_FREE, __ATOMIC_RELEASE);
				return -1;
			}
			l->off = off;
		} else {
			m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (m == MAP_FAILED) {
				__atomic_store_n(&l->state, LANE_FREE, __ATOMIC_RELEASE);
				return -1;
			}
			madvise(m, cap, MADV_DONTFORK); /* the parent's: a fork child has no pollers */
		}
		l->buf = m;
		l->cap = (uint32_t)cap;
		__atomic_store_n(&l->head, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&l->tail, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&l->state, LANE_OPEN, __ATOMIC_RELEASE);
		uint32_t n = __atomic_load_n(&lanes_hw, __ATOMIC_ACQUIRE);
		while (n < i + 1 && !__atomic_compare_exchange_n(&lanes_hw, &n, i + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		tls_lane = l;
		return 0;
	}
	return -1;
}

void st_side_lane_close(void)
{
	struct st_side_lane *l = tls_lane;
	st_tls_never_block = 0;
	if (!l)
		return;
	tls_lane = NULL;
	__atomic_store_n(&l->state, LANE_EXITED, __ATOMIC_RELEASE); /* the writer drains it, then frees it */
	st_writer_kick();
}

static uint64_t lane_put(struct st_side_lane *l, int count, uint16_t kind, const void *a, size_t alen, const void *b,
			 size_t blen, const void *c, size_t clen);
static uint64_t lane_add(struct st_side_lane *l, uint16_t kind, const void *a, size_t alen, const void *b, size_t blen,
			 const void *c, size_t clen)
{
	return lane_put(l, 1, kind, a, alen, b, blen, c, clen);
}

/* count: a record that does not fit is counted as dropped (0: the caller
 * waits and tries again). */
static uint64_t lane_put(struct st_side_lane *l, int count, uint16_t kind, const void *a, size_t alen, const void *b,
			 size_t blen, const void *c, size_t clen)
{
	size_t len = alen + blen + clen;
	size_t need = sizeof(struct st_side_header) + ((len + 7) & ~(size_t)7);
	uint64_t head = l->head, tail = __atomic_load_n(&l->tail, __ATOMIC_ACQUIRE);
	uint32_t off = (uint32_t)(head % l->cap);
	size_t skip = off + need > l->cap ? l->cap - off : 0;
	if (need > l->cap || head + skip + need - tail > l->cap) {
		if (count || need > l->cap)
			count_drop(len);
		return 0;
	}
	if (skip >= sizeof(struct st_side_header)) {
		struct st_side_header pad = {0};
		memcpy(l->buf + off, &pad, sizeof(pad));
	}
	head += skip;
	uint64_t id = __atomic_fetch_add(&st_next_side_id, 1, __ATOMIC_RELAXED);
	put_record(l->buf + head % l->cap, need, id, kind, a, alen, b, blen, c, clen);
	__atomic_store_n(&l->head, head + need, __ATOMIC_RELEASE);
	if (head + need - tail > l->cap / 2)
		st_writer_kick(); /* a futex wake at most: never waits */
	return id;
}

/* The consumer's half (io lock held): every lane's records into SIDE chunks;
 * lanes whose thread is gone are freed once empty (never in the final pass,
 * which may run in a signal handler). */
static void write_side_run(uint32_t count, const unsigned char *p, uint32_t bytes)
{
	st_write_chunk(ST_CHUNK_SIDE, 0, count, p, bytes, NULL, 0);
}

void st_drain_lanes(int final)
{
	uint32_t n = __atomic_load_n(&lanes_hw, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n; i++) {
		struct st_side_lane *l = &lanes[i];
		uint32_t state = __atomic_load_n(&l->state, __ATOMIC_ACQUIRE);
		if (state != LANE_OPEN && state != LANE_EXITED)
			continue;
		uint64_t tail = st_lane_read(l, l->buf, l->tail, __atomic_load_n(&l->head, __ATOMIC_ACQUIRE), write_side_run);
		__atomic_store_n(&l->tail, tail, __ATOMIC_RELEASE);
		if (!final && state == LANE_EXITED && tail == __atomic_load_n(&l->head, __ATOMIC_ACQUIRE)) {
			munmap(l->buf, l->cap);
			l->buf = NULL;
			__atomic_store_n(&l->state, LANE_FREE, __ATOMIC_RELEASE);
		}
	}
}

/* fork child: the lanes were the parent's pollers' (not mapped here: MADV_DONTFORK). */
void st_side_atfork_child(void)
{
	lanes = own_lanes;
	nlanes_p = &own_nlanes;
	for (uint32_t i = 0; i < ST_MAX_LANES; i++) {
		lanes[i].buf = NULL;
		lanes[i].state = LANE_FREE;
	}
	lanes_hw = 0;
	tls_lane = NULL;
	st_tls_never_block = 0;
}

/* ---- the shared buffer ------------------------------------------------------ */

/* The writer's half (io lock held).  The side lock is held only to swap the
 * two halves of the buffer: producers never wait for the disk, and the half
 * being written is the io lock holder's alone.  how (enum st_lock_how): the
 * writer only tries (it retries on its next round), the signal and _exit
 * paths try for a bounded time (the interrupted thread may hold the lock);
 * 0 if it was not taken (the records stay for a later drain, or are counted
 * lost by the final pass). */
int st_drain_side(int how)
{
	if (st_mutex_take(&st_side_lock, how) != 0)
		return 0;
	unsigned char *full = st_side_buf;
	size_t len = st_side_len;
	uint32_t count = st_side_count;
	if (len && st_side_spare) {
		st_side_buf = st_side_spare;
		st_side_spare = full;
		st_side_len = 0;
		st_side_count = 0;
	}
	pthread_mutex_unlock(&st_side_lock);
	if (len && st_side_spare == full)
		st_write_chunk(ST_CHUNK_SIDE, 0, count, full, len, NULL, 0);
	else if (len) {
		/* no second half (mmap failed): written under the lock, as before */
		if (st_mutex_take(&st_side_lock, how) != 0)
			return 0;
		st_write_chunk(ST_CHUNK_SIDE, 0, st_side_count, st_side_buf, st_side_len, NULL, 0);
		st_side_len = 0;
		st_side_count = 0;
		pthread_mutex_unlock(&st_side_lock);
	}
	return 1;
}

/* The producers' half: any thread, any provider. */
uint64_t st_side_add(uint16_t kind, const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen)
{
	size_t len = alen + blen + clen;
	size_t need = sizeof(struct st_side_header) + ((len + 7) & ~(size_t)7);
	st_ensure_active();
	int saved = errno;
	if (tls_lane && st_active && len <= UINT32_MAX) {
		uint64_t id = lane_add(tls_lane, kind, a, alen, b, blen, c, clen);
		errno = saved;
		return id;
	}
	if (st_shm && st_active && len <= UINT32_MAX) {
		/* the consumer process's writer: the application threads' ring in the shared block, one producer
		 * at a time (the side lock); full: wait for the consumer, bounded, never for a dead one */
		struct st_side_lane *l = &st_shm->side;
		if (need > l->cap) {
			count_drop(len);
			errno = saved;
			return 0;
		}
		uint64_t id = 0;
		for (int tries = 0;; tries++) {
			if (st_tls_never_block) {
				if (pthread_mutex_trylock(&st_side_lock) != 0)
					break;
			} else
				pthread_mutex_lock(&st_side_lock);
			id = lane_put(l, 0, kind, a, alen, b, blen, c, clen);
			pthread_mutex_unlock(&st_side_lock);
			if (id || st_tls_never_block || tries > 1000 || st_trace_closed || st_pw_consumer_gone())
				break;
			st_writer_kick();
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
		}
		if (!id)
			count_drop(len);
		errno = saved;
		return id;
	}
	if (!st_active || !st_side_cap || need > st_side_cap || len > UINT32_MAX) { /* cap: set once at activation */
		count_drop(len);
		return 0;
	}
	for (int tries = 0;; tries++) {
		if (st_tls_never_block) {
			/* a thread that must not wait and has no lane: one try */
			if (pthread_mutex_trylock(&st_side_lock) != 0) {
				count_drop(len);
				errno = saved;
				return 0;
			}
		} else
			pthread_mutex_lock(&st_side_lock);
		if (st_side_len + need <= st_side_cap)
			break;
		pthread_mutex_unlock(&st_side_lock);
		if (st_tls_never_block || tries > 1000 || st_trace_closed) {
			count_drop(len);
			errno = saved;
			return 0;
		}
		st_writer_kick();
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	uint64_t id = __atomic_fetch_add(&st_next_side_id, 1, __ATOMIC_RELAXED);
	put_record(st_side_buf + st_side_len, need, id, kind, a, alen, b, blen, c, clen);
	st_side_len += need;
	st_side_count++;
	int kick = st_side_len > st_side_cap / 2;
	pthread_mutex_unlock(&st_side_lock);
	if (kick)
		st_writer_kick();
	errno = saved;
	return id;
}
