/*
 * Interposition: how providers put their wrappers in front of a library.
 *
 *  1. Link-time symbol shims: the provider defines the library's exported
 *     function (same name, ST_EXPORT); being preloaded, ours wins.  The real
 *     one comes from st_resolve_next() (dlsym(RTLD_NEXT)).
 *  2. dlsym/dlvsym injection: programs (NCCL, MPI, Python ctypes) that
 *     dlopen a library and look functions up by name get the wrapper too —
 *     for every hook registered here whose provider is enabled.
 *  3. Ops tables: calls that are inline dispatches through a table the
 *     library hands out (libfabric fid ops, verbs context ops) are wrapped by
 *     giving the object a patched private copy of its table (optable.c).
 *
 * Re-entrancy: a wrapper that calls into the library raises st_tls_depth;
 * wrappers entered while it is raised (the library calling itself through
 * a wrapped symbol or table) just forward, so one application call is one
 * event.
 */
#ifndef ST_INTERPOSE_H
#define ST_INTERPOSE_H

#include <stddef.h>

#include "core/core.h"

struct st_hook {
	const char *name;  /* exported symbol */
	void *wrapper;     /* our function */
	void **real;       /* where the real function pointer lives */
	unsigned provider; /* ST_PROV_* bit: injected only when enabled */
};

void st_interpose_init(void) ST_HIDDEN;
/* Providers call this from their constructors (priority > 101). */
void st_hooks_register(const struct st_hook *hooks, unsigned n) ST_HIDDEN;
const struct st_hook *st_hook_find(const char *name) ST_HIDDEN;
/* The constructor that registers a provider's static hook table. */
#define ST_HOOKS_CONSTRUCTOR(priority, table)                                      \
	__attribute__((constructor(priority))) static void register_##table(void)  \
	{                                                                          \
		st_hooks_register(table, sizeof(table) / sizeof(table[0]));        \
	}

/* The next definition after this library (the real function), or NULL. */
void *st_resolve_next(const char *name) ST_HIDDEN;
/* libc's own dlsym/dlvsym, found without calling dlsym. */
void *st_real_dlsym(void *handle, const char *name) ST_HIDDEN;

/* Resolve a real function once; cheap afterwards. */
#define ST_REAL(ptr, name)                                                             \
	(likely((ptr) != NULL) ? (ptr)                                                 \
			       : ((ptr) = (__typeof__(ptr))st_resolve_next(name)))

/* Re-entrancy guard around a call into the traced library. */
static inline int st_enter(void)
{
	return st_tls_depth++ == 0;
}
static inline void st_leave(void)
{
	st_tls_depth--;
}

/* ---- ops tables (optable.c) ---------------------------------------------- */
/* A private copy of `size` bytes of table `orig`, remembering orig and an
 * owner pointer (per-object state) in a header in front of the copy. */
void *st_optable_copy(const void *orig, size_t size, void *owner) ST_HIDDEN;
int st_optable_ours(const void *table) ST_HIDDEN;

struct st_optable_hdr {
	uint64_t magic;
	const void *orig;
	void *owner;
	size_t size;
};
#define ST_OPTABLE_MAGIC 0x53544f505441424cull

static inline const void *st_optable_orig(const void *copy)
{
	return ((const struct st_optable_hdr *)copy - 1)->orig;
}
static inline void *st_optable_owner(const void *copy)
{
	return ((const struct st_optable_hdr *)copy - 1)->owner;
}
/* Publish the copy in the object: one atomic pointer store, so a thread
 * calling through the slot sees either the old or the new table. */
static inline void st_optable_install(void *slot_addr, void *copy)
{
	__atomic_store_n((void **)slot_addr, copy, __ATOMIC_RELEASE);
}

#endif /* ST_INTERPOSE_H */
