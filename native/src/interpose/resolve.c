/*
 * Where a shim's real function comes from, whatever the order libraries were loaded in.
 *
 * A shim is our exported definition of a traced library's function (ibv_open_device, fi_fabric,
 * ucp_init, cuMemHostRegister, ...).  Being preloaded, the tracer sits in the global scope in front
 * of everything but the program, so every object that calls the function binds to the shim — also
 * an object dlopen'ed RTLD_LOCAL, or loaded as a dependency of one (UCX's libuct_ib.so, loaded by
 * libucs from its module directory, brings libibverbs.so.1 and libmlx5.so.1 with it), because an
 * object's own lookup scope starts with the global one.  The library that defines the real function
 * is then often *not* in the global scope: dlsym(RTLD_NEXT) from the tracer searches only the global
 * scope after it, finds nothing, and a shim that trusted it returned ENOSYS to a program that works
 * untraced.
 *
 * So the real function is looked up the way the loader would have found it without us: the first
 * object after ours in the loader's list of loaded objects (load order, every scope: the global
 * objects first as they were loaded at start, then what dlopen brought, RTLD_LOCAL or not) whose
 * dynamic symbol table defines the name, at its default version.  That is RTLD_NEXT's answer
 * whenever RTLD_NEXT has one, and the library loaded later otherwise.  The walk is
 * dl_iterate_phdr (it holds the loader's lock, so no object goes away under it) with our own hash
 * lookup (elf_lookup.h: no allocation, no call back into the loader, no dlerror() state touched,
 * which dlsym would clobber for the program).  An IFUNC is resolved through dlsym on that object.
 *
 * Lazily, at a shim's first call, and again while not found: a library dlopen'ed after start is
 * found when it is first used.  Found pointers are cached in the shim's real_<name> (ST_REAL) and
 * every such slot is remembered: when a dlclose unloads objects (dlsym.c wraps dlclose), slots that
 * point into an object no longer loaded are cleared, so a library unloaded and loaded again (at
 * another address) is found again instead of called at its old one.
 *
 * Nothing here is on a hot path: the ops-table wrappers (ibv post/poll) call the provider's
 * functions kept in their context entries and never come here.
 *
 * Fork: dl_iterate_phdr holds the loader's dl_load_write_lock, which glibc's fork does not reset
 * in the child (2.36: only dl_load_lock and dl_load_tls_lock are re-initialised), so a child forked
 * while another thread was in one of our walks hung at its own first walk (its first dlclose, or
 * the first call of a shim not yet resolved) — a child the untraced program did not have.  Every
 * walk of ours runs under walk_lock, which the fork handlers hold across fork (st_fork_guard, the
 * last rank: a walk takes no other lock), so no walk of ours is in progress when the child is
 * made.  A thread re-entering a walk from a signal handler walks without it (the loader's lock is
 * recursive, ours is not).
 */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "elf_lookup.h"
#include "interpose.h"

/* ---- walks, never across a fork ---------------------------------------------------------------- */

static pthread_mutex_t walk_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int walking ST_TLS;

__attribute__((constructor(102))) static void guard_walks_across_fork(void)
{
	st_fork_guard(&walk_lock, ST_FORK_RANK_RESOLVER);
}

static int walk(int (*cb)(struct dl_phdr_info *, size_t, void *), void *arg)
{
	if (walking) /* a signal handler on this thread, inside our walk */
		return dl_iterate_phdr(cb, arg);
	pthread_mutex_lock(&walk_lock);
	walking = 1;
	int r = dl_iterate_phdr(cb, arg);
	walking = 0;
	pthread_mutex_unlock(&walk_lock);
	return r;
}

/* ---- the walk --------------------------------------------------------------------------------- */

static int holds(const struct dl_phdr_info *info, uintptr_t addr)
{
	for (unsigned i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD)
			continue;
		uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
		if (addr >= lo && addr - lo < ph->p_memsz)
			return 1;
	}
	return 0;
}

static const ElfW(Dyn) *dynamic_of(const struct dl_phdr_info *info)
{
	for (unsigned i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			return (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
	return NULL;
}

struct find {
	const char *name;
	int past_self;     /* our own object seen: the ones after it are candidates */
	void *result;
	int ifunc;
	char path[PATH_MAX]; /* the defining object (for an IFUNC) */
};

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct find *f = arg;
	if (!f->past_self) {
		f->past_self = holds(info, (uintptr_t)&find_cb);
		return 0;
	}
	struct st_elf_want want = {f->name, NULL, 0};
	if (!st_elf_lookup(dynamic_of(info), info->dlpi_addr, &want))
		return 0;
	f->result = want.result;
	f->ifunc = want.ifunc;
	if (want.ifunc) {
		const char *p = info->dlpi_name ? info->dlpi_name : "";
		size_t n = 0;
		while (p[n] && n + 1 < sizeof(f->path))
			n++;
		memcpy(f->path, p, n);
		f->path[n] = 0;
	}
	return 1;
}

void *st_resolve_real(const char *name)
{
	struct find f;
	f.name = name;
	f.past_self = 0;
	f.result = NULL;
	f.ifunc = 0;
	f.path[0] = 0;
	if (!walk(find_cb, &f) || !f.result)
		return NULL;
	if (!f.ifunc)
		return f.result;
	/* the loader runs the resolver: ask it, on that object only (outside the walk's lock) */
	void *h = f.path[0] ? dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
	if (!h)
		return NULL;
	void *p = st_real_dlsym(h, name);
	dlclose(h); /* drops only the reference RTLD_NOLOAD took */
	return p;
}

/* ---- remembered slots, dropped when their object is unloaded ---------------------------------- */

/* Slots are static pointers of the providers (a few hundred at most); appended without a lock (a
 * resolution may run in any thread, also in a child after fork), never removed.  A slot appended
 * twice by racing threads is checked twice, which is harmless. */
#define MAX_SLOTS 1024
static void **slots[MAX_SLOTS];
static unsigned nslots;

void st_real_slot_remember(void **slot)
{
	unsigned n = __atomic_load_n(&nslots, __ATOMIC_ACQUIRE);
	for (unsigned i = 0; i < n && i < MAX_SLOTS; i++)
		if (__atomic_load_n(&slots[i], __ATOMIC_ACQUIRE) == slot)
			return;
	unsigned i = __atomic_fetch_add(&nslots, 1, __ATOMIC_ACQ_REL);
	if (i < MAX_SLOTS)
		__atomic_store_n(&slots[i], slot, __ATOMIC_RELEASE);
}

void *st_resolve_slot(void **slot, const char *name)
{
	void *p = st_resolve_real(name);
	if (p)
		st_real_slot_remember(slot);
	st_libraries_check(); /* a shim's first call: its library may have been loaded since the last look */
	return p;
}

struct probe {
	uintptr_t addr;
	unsigned long long subs;
	int found;
};

static int loaded_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct probe *pr = arg;
	if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
		pr->subs = info->dlpi_subs;
	if (!pr->addr)
		return 1; /* only the counter was wanted */
	if (holds(info, pr->addr)) {
		pr->found = 1;
		return 1;
	}
	return 0;
}

static void drop_if_unloaded(void **slot)
{
	void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (!p)
		return;
	struct probe pr = {(uintptr_t)p, 0, 0};
	walk(loaded_cb, &pr);
	if (!pr.found)
		__atomic_compare_exchange_n(slot, &p, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

void st_real_after_dlclose(void)
{
	static unsigned long long seen_subs;
	struct probe pr = {0, 0, 0};
	walk(loaded_cb, &pr);
	unsigned long long last = __atomic_load_n(&seen_subs, __ATOMIC_ACQUIRE);
	if (pr.subs == last)
		return; /* nothing was unloaded since we last looked: the usual dlclose */
	__atomic_store_n(&seen_subs, pr.subs, __ATOMIC_RELEASE);
	unsigned n = __atomic_load_n(&nslots, __ATOMIC_ACQUIRE);
	for (unsigned i = 0; i < n && i < MAX_SLOTS; i++) {
		void **slot = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
		if (slot)
			drop_if_unloaded(slot);
	}
	st_hooks_each_real(drop_if_unloaded);
}
