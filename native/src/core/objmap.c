/*
 * Small ids for library objects (UCX endpoints and workers, ...).
 *
 * Events carry a 32-bit obj field; pointers are 64-bit and get reused after
 * free, so objects get ids from a counter, remembered in an open-addressing
 * table keyed by pointer.  Lookups take no lock (entries are published with
 * a release store and never moved); inserts take a mutex (rare: object
 * creation).  A thread-local one-entry cache makes the common case of
 * "same endpoint as last time" a compare.  When the table fills, new objects
 * still get fresh ids (just not remembered).
 */
#include <pthread.h>

#include "core.h"

#define MAP_SLOTS 8192 /* power of two */

struct slot {
	const void *key; /* atomic; NULL = empty */
	uint32_t id;
};

static struct slot map[MAP_SLOTS];
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_id = 1;
static unsigned used;
static __thread const void *cache_key ST_TLS;
static __thread uint32_t cache_id ST_TLS;

uint32_t st_obj_next_id(void)
{
	return __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
}

static inline unsigned hash(const void *p)
{
	uint64_t x = (uint64_t)(uintptr_t)p;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (unsigned)x & (MAP_SLOTS - 1);
}

/* Replace the id of ptr with a fresh one (object created at a reused address). */
static uint32_t insert(const void *ptr, int replace)
{
	pthread_mutex_lock(&map_lock);
	unsigned h = hash(ptr);
	uint32_t id = 0;
	for (unsigned i = 0; i < MAP_SLOTS; i++) {
		struct slot *s = &map[(h + i) & (MAP_SLOTS - 1)];
		const void *k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
		if (k == ptr) {
			if (replace)
				__atomic_store_n(&s->id, st_obj_next_id(), __ATOMIC_RELEASE);
			id = s->id;
			break;
		}
		if (!k) {
			if (used >= MAP_SLOTS * 3 / 4)
				break;
			s->id = st_obj_next_id();
			__atomic_store_n(&s->key, ptr, __ATOMIC_RELEASE);
			used++;
			id = s->id;
			break;
		}
	}
	if (!id)
		id = st_obj_next_id();
	pthread_mutex_unlock(&map_lock);
	return id;
}

/* is_new != NULL: the caller just created the object, give it a new id. */
uint32_t st_obj_id(const void *ptr, int *is_new)
{
	if (!ptr)
		return 0;
	if (is_new) {
		uint32_t id = insert(ptr, 1);
		cache_key = ptr;
		cache_id = id;
		*is_new = 1;
		return id;
	}
	if (likely(cache_key == ptr))
		return cache_id;
	unsigned h = hash(ptr);
	for (unsigned i = 0; i < 16; i++) {
		struct slot *s = &map[(h + i) & (MAP_SLOTS - 1)];
		const void *k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
		if (k == ptr) {
			cache_key = ptr;
			cache_id = __atomic_load_n(&s->id, __ATOMIC_ACQUIRE);
			return cache_id;
		}
		if (!k)
			break;
	}
	uint32_t id = insert(ptr, 0);
	cache_key = ptr;
	cache_id = id;
	return id;
}
