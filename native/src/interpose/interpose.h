/*
 * Interposition: how providers put their wrappers in front of a library.
 *
 *  1. Link-time symbol shims: the provider defines the library's exported
 *     function (same name, ST_EXPORT); being preloaded, ours wins, also for
 *     objects loaded later with RTLD_LOCAL.  The real one is found at first
 *     use in whichever loaded object defines it (ST_REAL, resolve.c): the
 *     library may have been loaded after start and outside the global scope,
 *     where dlsym(RTLD_NEXT) cannot see it.
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

/* The ST_PROV_* bits that registered hooks: the providers in this build. */
unsigned st_hooks_providers(void) ST_HIDDEN;
/* Notes the loaded libraries whose provider is disabled or not built (libraries.c): process header,
 * one stderr line each, the trace file made to exist.  Cheap when nothing was loaded since the last
 * call; any thread, not in a signal handler. */
void st_libraries_check(void) ST_HIDDEN;

/* Calls every hook's `real` slot (resolve.c, after an unload). */
void st_hooks_each_real(void (*fn)(void **real)) ST_HIDDEN;

/* The next definition after this library in the global scope (dlsym(RTLD_NEXT)): for libc's
 * functions (fork, _exit), which are always there. */
void *st_resolve_next(const char *name) ST_HIDDEN;
/* libc's own dlsym/dlvsym, found without calling dlsym. */
void *st_real_dlsym(void *handle, const char *name) ST_HIDDEN;

/* A traced library's real function (resolve.c): the default-version definition in the first loaded
 * object after this library that has one, wherever it was loaded from (linked at start, dlopen'ed
 * by the program or by a library, RTLD_LOCAL or RTLD_GLOBAL); NULL when no loaded object defines
 * it.  Touches no dlerror() state. */
void *st_resolve_real(const char *name) ST_HIDDEN;
/* The same, and `slot` (where the caller caches it) is remembered: it is cleared when a dlclose
 * unloads the object it points into. */
void *st_resolve_slot(void **slot, const char *name) ST_HIDDEN;
void st_real_slot_remember(void **slot) ST_HIDDEN;
/* dlsym.c's dlclose, after a successful close: drops remembered pointers into unloaded objects. */
void st_real_after_dlclose(void) ST_HIDDEN;

/* A traced library's real function, found at first use and again while not found (the library
 * may be loaded later); one load and compare afterwards. */
#define ST_REAL(ptr, name)                                                                           \
	(likely((ptr) != NULL) ? (ptr)                                                               \
			       : ((ptr) = (__typeof__(ptr))st_resolve_slot((void **)&(ptr), name)))

/* Re-entrancy guard around a call into the traced library. */
static inline int st_enter(void)
{
	return st_tls_depth++ == 0;
}
static inline void st_leave(void)
{
	st_tls_depth--;
}
/* Inside a wrapper's call into the library: a wrapper entered now only forwards. */
static inline int st_nested(void)
{
	return st_tls_depth != 0;
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
