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
#include <stdlib.h>
#include <string.h>

#include "interpose.h"

/* Every copy made, in an open-addressing set of pointers (inserted with a
 * compare-and-swap, looked up without a lock; copies are never freed, so
 * entries never go): st_optable_ours must not read in front of a table that
 * is not ours -- a provider's table may be a heap object of its own or sit
 * at the start of a page. */
#define COPY_SLOTS 16384 /* power of two; beyond 3/4 of it no table is patched any more */
static const void *copies[COPY_SLOTS];
static unsigned ncopies;

static unsigned slot_of(const void *p)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
	return (unsigned)(h >> 50) & (COPY_SLOTS - 1);
}

static int remember(const void *copy)
{
	if (__atomic_add_fetch(&ncopies, 1, __ATOMIC_RELAXED) > COPY_SLOTS * 3 / 4)
		return -1;
	for (unsigned i = slot_of(copy);; i = (i + 1) & (COPY_SLOTS - 1)) {
		const void *none = NULL;
		if (__atomic_compare_exchange_n(&copies[i], &none, copy, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			return 0;
	}
}

void *st_optable_copy(const void *orig, size_t size, void *owner)
{
	struct st_optable_hdr *h = calloc(1, sizeof(*h) + size);
	if (!h)
		return NULL;
	h->magic = ST_OPTABLE_MAGIC;
	h->orig = orig;
	h->owner = owner;
	h->size = size;
	memcpy(h + 1, orig, size);
	if (remember(h + 1) != 0) {
		free(h); /* the set is full: this object stays unpatched (its calls go untraced, unchanged) */
		return NULL;
	}
	return h + 1;
}

int st_optable_ours(const void *table)
{
	if (!table)
		return 0;
	for (unsigned i = slot_of(table);; i = (i + 1) & (COPY_SLOTS - 1)) {
		const void *c = __atomic_load_n(&copies[i], __ATOMIC_ACQUIRE);
		if (!c)
			return 0;
		if (c == table)
			return ((const struct st_optable_hdr *)table - 1)->magic == ST_OPTABLE_MAGIC;
	}
}
