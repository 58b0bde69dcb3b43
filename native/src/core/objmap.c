/*
 * Small ids for library objects (PDs, CQs, contexts, UCX endpoints and
 * workers, ...).
 *
 * Events carry a 32-bit obj field; pointers are 64-bit and get reused after
 * free, so objects get ids from a counter, remembered in an open-addressing
 * table keyed by pointer.
 *
 *  - Lookups take no lock: entries are published with a release store and
 *    never moved; a lookup probes until an empty slot.
 *  - Inserts (object creation, or the first use of an object created before
 *    tracing or through an untraced path) and removals take a mutex.
 *  - Destroy/close wrappers remove their object (st_obj_forget): its slot
 *    becomes a tombstone, which a later insert reuses, and tombstones that
 *    end at an empty slot become empty again, so a process may create and
 *    destroy any number of objects.  An object created again at the address
 *    of one whose destroy was not seen gets a fresh id in place.
 *  - A thread-local one-entry cache remembers the slot of the last object
 *    looked up; it is trusted only while that slot still holds the object,
 *    so it never returns a destroyed object's id after its address was
 *    reused.
 *  - The table holds up to ST_OBJ_LIMIT live objects.  Beyond, an object is
 *    not remembered: it gets id 0 ("unknown object", the same for every
 *    event of it, no lock taken on later lookups) and is counted
 *    (object_ids.unmapped in the END footer).
 */
#include <pthread.h>
#include <stdlib.h>

#include "core.h"

#define MAP_SLOTS 65536 /* power of two */
#define ST_OBJ_LIMIT (MAP_SLOTS * 3 / 4)
#define TOMB ((const void *)1)

struct slot {
	const void *key; /* atomic; NULL = empty, TOMB = removed */
	uint32_t id;     /* atomic */
};

static struct slot map[MAP_SLOTS];
pthread_mutex_t st_objmap_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_id = 1;
static unsigned live, peak, limit = ST_OBJ_LIMIT; /* under st_objmap_lock (read racily for the END footer) */
static int full;                                   /* atomic: live >= limit */
static uint64_t unmapped;                          /* atomic */
static uint64_t first_seen_on_use;                 /* under st_objmap_lock */
static __thread const void *cache_key ST_TLS;
static __thread struct slot *cache_slot ST_TLS;

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

/* The slot of ptr, NULL if not in the table (lock-free). */
static struct slot *find(const void *ptr)
{
	unsigned h = hash(ptr);
	for (unsigned i = 0; i < MAP_SLOTS; i++) {
		struct slot *s = &map[(h + i) & (MAP_SLOTS - 1)];
		const void *k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
		if (k == ptr)
			return s;
		if (!k)
			return NULL;
	}
	return NULL;
}

/* Under the lock: ptr's slot with a fresh id (replace: ptr was created anew),
 * or its current one; NULL when the table is full. */
static struct slot *insert_locked(const void *ptr, int replace)
{
	unsigned h = hash(ptr);
	struct slot *tomb = NULL;
	for (unsigned i = 0; i < MAP_SLOTS; i++) {
		struct slot *s = &map[(h + i) & (MAP_SLOTS - 1)];
		const void *k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
		if (k == ptr) {
			if (replace)
				__atomic_store_n(&s->id, st_obj_next_id(), __ATOMIC_RELEASE);
			return s;
		}
		if (k == TOMB) {
			if (!tomb)
				tomb = s;
			continue;
		}
		if (!k) {
			if (!tomb)
				tomb = s;
			break;
		}
	}
	if (!tomb || live >= limit) {
		__atomic_store_n(&full, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&unmapped, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	__atomic_store_n(&tomb->id, st_obj_next_id(), __ATOMIC_RELEASE);
	__atomic_store_n(&tomb->key, ptr, __ATOMIC_RELEASE);
	if (++live > peak)
		peak = live;
	if (live >= limit)
		__atomic_store_n(&full, 1, __ATOMIC_RELAXED);
	return tomb;
}

static inline uint32_t cached(const void *ptr, struct slot *s)
{
	cache_key = ptr;
	cache_slot = s;
	return __atomic_load_n(&s->id, __ATOMIC_ACQUIRE);
}

/* is_new != NULL: the caller just created the object, give it a new id. */
uint32_t st_obj_id(const void *ptr, int *is_new)
{
	if (!ptr)
		return 0;
	if (is_new) {
		*is_new = 1;
		pthread_mutex_lock(&st_objmap_lock);
		struct slot *s = insert_locked(ptr, 1);
		pthread_mutex_unlock(&st_objmap_lock);
		if (!s) {
			cache_key = NULL;
			return 0;
		}
		return cached(ptr, s);
	}
	if (likely(cache_key == ptr)) {
		struct slot *s = cache_slot;
		if (likely(__atomic_load_n(&s->key, __ATOMIC_ACQUIRE) == ptr))
			return __atomic_load_n(&s->id, __ATOMIC_ACQUIRE);
	}
	struct slot *s = find(ptr);
	if (s)
		return cached(ptr, s);
	/* first seen on a use (created before tracing, or by an untraced path);
	 * a full table answers 0 without the lock */
	if (__atomic_load_n(&full, __ATOMIC_RELAXED))
		return 0;
	pthread_mutex_lock(&st_objmap_lock);
	s = insert_locked(ptr, 0);
	if (s)
		first_seen_on_use++;
	pthread_mutex_unlock(&st_objmap_lock);
	return s ? cached(ptr, s) : 0;
}

/* A destroy/close wrapper: the object is gone, its slot may be reused. */
void st_obj_forget(const void *ptr)
{
	if (!ptr)
		return;
	if (cache_key == ptr)
		cache_key = NULL;
	pthread_mutex_lock(&st_objmap_lock);
	struct slot *s = find(ptr);
	if (s) {
		__atomic_store_n(&s->key, TOMB, __ATOMIC_RELEASE);
		live--;
		if (live < limit)
			__atomic_store_n(&full, 0, __ATOMIC_RELAXED);
		/* tombstones that end at an empty slot: empty again, backwards (no
		 * probe path of a live entry crosses an empty slot, so none is cut) */
		unsigned i = (unsigned)(s - map);
		if (!__atomic_load_n(&map[(i + 1) & (MAP_SLOTS - 1)].key, __ATOMIC_ACQUIRE))
			for (unsigned n = 0; n < MAP_SLOTS && __atomic_load_n(&map[i].key, __ATOMIC_ACQUIRE) == TOMB; n++) {
				__atomic_store_n(&map[i].key, NULL, __ATOMIC_RELEASE);
				i = (i - 1) & (MAP_SLOTS - 1);
			}
	}
	pthread_mutex_unlock(&st_objmap_lock);
}

void st_obj_stats(struct st_obj_stats *out)
{
	out->live = __atomic_load_n(&live, __ATOMIC_RELAXED);
	out->peak = __atomic_load_n(&peak, __ATOMIC_RELAXED);
	out->capacity = limit;
	out->unmapped = __atomic_load_n(&unmapped, __ATOMIC_RELAXED);
	out->first_seen_on_use = __atomic_load_n(&first_seen_on_use, __ATOMIC_RELAXED);
}

/* Test hook SIGMATRACE_TEST_OBJ_LIMIT: a smaller table, to see overflow
 * reported without creating 49,152 objects. */
__attribute__((constructor(102))) static void objmap_init(void)
{
	const char *v = getenv("SIGMATRACE_TEST_OBJ_LIMIT");
	if (v && *v) {
		long x = strtol(v, NULL, 10);
		if (x > 0 && x < ST_OBJ_LIMIT)
			limit = (unsigned)x;
	}
}

/* fork child: the map is the parent's copy (ids stay valid: the child's
 * events name the objects it inherited the same way), the lock is made new. */
void st_objmap_atfork_child(void)
{
	pthread_mutex_init(&st_objmap_lock, NULL);
	cache_key = NULL;
}
