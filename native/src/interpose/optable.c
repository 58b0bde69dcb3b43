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
#include <stdlib.h>
#include <string.h>

#include "interpose.h"

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
	return h + 1;
}

int st_optable_ours(const void *table)
{
	/* Only called for tables we may have installed ourselves (the caller
	 * keeps the pointer it installed); the magic is a cross-check. */
	return table && ((const struct st_optable_hdr *)table - 1)->magic == ST_OPTABLE_MAGIC;
}
