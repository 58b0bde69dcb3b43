/*
 * Copy-on-write of dispatch tables.
 *
 * Libraries hand out objects whose hot calls are inline dispatches through
 * a table pointer in the object (libfabric: ep->msg->send, cq->ops->read).
 * The table is usually a static const shared by every object of a provider,
 * so it is never written: the object gets a private copy with our wrappers
 * in some slots, installed with one atomic pointer store.  A header in front
 * of the copy remembers the original table (the wrapper calls through it)
 * and an owner pointer (per-object state: id, CQ format, ...), so wrappers
 * find both in O(1) from the object they are called with.
 *
 * Copies are never freed: a call may still be running through a table when
 * the object is closed, and objects with dispatch tables are few.
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "interpose.h"

/* Copies live in arenas of our own (anonymous mappings, never unmapped:
 * copies are never freed), so st_optable_ours tells one of ours by its
 * address alone: it must not read in front of a table that is not ours -- a
 * provider's table may be a heap object of its own or sit at the start of a
 * page.  Lock-free, and every state is one any thread can go on from (a fork
 * child too): a copy takes its bytes from the current arena with one
 * fetch-and-add; when that arena is full, whoever sees it moves `current` on,
 * and whoever finds the next slot empty maps an arena into it (one
 * compare-and-swap wins, the others unmap theirs). */
#define ARENA_BYTES (1u << 20)
#define MAX_ARENAS 4096 /* 4 GiB of tables */
static uintptr_t arena_lo[MAX_ARENAS]; /* mapped arenas: a prefix of the array */
static uint64_t arena_used[MAX_ARENAS];
static unsigned current;

static void *arena_alloc(size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (n > ARENA_BYTES)
		return NULL;
	for (;;) {
		unsigned k = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
		uintptr_t lo = __atomic_load_n(&arena_lo[k], __ATOMIC_ACQUIRE);
		if (lo) {
			uint64_t off = __atomic_fetch_add(&arena_used[k], n, __ATOMIC_RELAXED);
			if (off + n <= ARENA_BYTES)
				return (void *)(lo + off); /* fresh zero pages */
			if (k + 1 == MAX_ARENAS)
				return NULL;
			__atomic_compare_exchange_n(&current, &k, k + 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
			continue;
		}
		void *m = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		uintptr_t none = 0;
		if (!__atomic_compare_exchange_n(&arena_lo[k], &none, (uintptr_t)m, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			munmap(m, ARENA_BYTES); /* another thread mapped arena k first: use that one */
	}
}

void *st_optable_copy(const void *orig, size_t size, void *owner)
{
	struct st_optable_hdr *h = arena_alloc(sizeof(*h) + size);
	if (!h)
		return NULL;
	h->magic = ST_OPTABLE_MAGIC;
	h->orig = orig;
	h->owner = owner;
	h->size = size;
	memcpy(h + 1, orig, size);
	return h + 1;
}

int st_optable_ours(const void *table)
{
	uintptr_t t = (uintptr_t)table, lo;
	for (unsigned i = 0; table && i < MAX_ARENAS && (lo = __atomic_load_n(&arena_lo[i], __ATOMIC_ACQUIRE)); i++)
		if (t - lo < ARENA_BYTES)
			return ((const struct st_optable_hdr *)table - 1)->magic == ST_OPTABLE_MAGIC;
	return 0;
}
