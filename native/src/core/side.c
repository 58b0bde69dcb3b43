/*
 * The side channel: variable-size records (JSON, PRM commands, strings)
 * that events point to by side_id.  Process-wide, one buffer under a mutex:
 * side records are rare (object creation), so a lock is cheaper than
 * per-thread buffers.  The writer drains the buffer into SIDE chunks.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "writer_internal.h"

pthread_mutex_t st_side_lock = PTHREAD_MUTEX_INITIALIZER;
unsigned char *st_side_buf;
size_t st_side_len;
uint32_t st_side_count;
uint64_t st_next_side_id = 1;
uint64_t st_dropped_side_bytes;

/* The writer's half (io lock held).  blocking = 0 on the signal paths: skip
 * rather than wait for a side lock the interrupted thread may hold. */
void st_drain_side(int blocking)
{
	if (blocking)
		pthread_mutex_lock(&st_side_lock);
	else if (pthread_mutex_trylock(&st_side_lock) != 0)
		return;
	if (st_side_len) {
		st_write_chunk(ST_CHUNK_SIDE, 0, st_side_count, st_side_buf, st_side_len, NULL, 0);
		st_side_len = 0;
		st_side_count = 0;
	}
	pthread_mutex_unlock(&st_side_lock);
}

/* The producers' half: any thread, any provider. */
uint64_t st_side_add(uint16_t kind, const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen)
{
	size_t len = alen + blen + clen;
	size_t need = sizeof(struct st_side_header) + ((len + 7) & ~(size_t)7);
	st_ensure_active();
	if (!st_active || !st_side_buf || need > ST_SIDE_CAP || len > UINT32_MAX) {
		__atomic_fetch_add(&st_dropped_side_bytes, len, __ATOMIC_RELAXED);
		return 0;
	}
	int saved = errno;
	for (int tries = 0;; tries++) {
		pthread_mutex_lock(&st_side_lock);
		if (st_side_len + need <= ST_SIDE_CAP)
			break;
		pthread_mutex_unlock(&st_side_lock);
		if (tries > 1000 || st_trace_closed) {
			__atomic_fetch_add(&st_dropped_side_bytes, len, __ATOMIC_RELAXED);
			errno = saved;
			return 0;
		}
		st_writer_kick();
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	uint64_t id = st_next_side_id++;
	struct st_side_header h = {.side_id = id, .length = (uint32_t)len, .kind = kind, .flags = 0};
	unsigned char *p = st_side_buf + st_side_len;
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	if (alen)
		memcpy(p, a, alen);
	if (blen)
		memcpy(p + alen, b, blen);
	if (clen)
		memcpy(p + alen + blen, c, clen);
	memset(p + len, 0, need - sizeof(h) - len);
	st_side_len += need;
	st_side_count++;
	int kick = st_side_len > ST_SIDE_CAP / 2;
	pthread_mutex_unlock(&st_side_lock);
	if (kick)
		st_writer_kick();
	errno = saved;
	return id;
}
