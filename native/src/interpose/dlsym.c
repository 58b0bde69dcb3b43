/*
 * dlsym/dlvsym injection, and dlclose.
 *
 * We export dlsym and dlvsym ourselves, so we cannot ask dlsym for the real
 * ones (we would find ourselves).  Instead the real functions are looked up
 * in libc's (glibc >= 2.34) or libdl's dynamic symbol table directly, with
 * its GNU hash table: no allocation, no call into the dynamic linker's
 * lookup, safe at any time (even from inside a malloc that calls dlsym).
 *
 * RTLD_NEXT is relative to the *caller*: glibc takes it from the return
 * address.  For names we do not hook, our dlsym ends in a tail call to the
 * real one, so the caller's return address is preserved and RTLD_NEXT keeps
 * its meaning.  For hooked names the real lookup happens from inside this
 * library, i.e. "next after sigmatrace", which is the traced library; what
 * the program then gets (our wrapper, or the untraced answer) is inject()'s
 * rule below.
 *
 * dlopen is deliberately not wrapped: it is caller-sensitive too (the
 * caller's RUNPATH/RPATH and $ORIGIN choose the file, the caller's namespace
 * the scope), so a wrapper that calls the real dlopen from here would load
 * other files than the program does.  Nothing needs to see a library
 * arrive: shims find their real functions at first use (resolve.c).
 * dlclose is not caller-sensitive; it is wrapped so that real pointers into
 * an unloaded library are dropped.
 */
#include <dlfcn.h>
#pragma GCC diagnostic ignored "-Wnonnull-compare"
#include <elf.h>
#include <link.h>
#include <string.h>

#include "elf_lookup.h"
#include "interpose.h"

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef int (*dlclose_fn)(void *);

static dlsym_fn real_dlsym_p;
static dlvsym_fn real_dlvsym_p;
static dlclose_fn real_dlclose_p;
static __thread int in_dlsym ST_TLS;

/* No libc string calls on this path: a sanitizer runtime intercepts them and is not ready yet when it
 * calls our dlsym during its own initialisation. */
static int contains(const char *hay, const char *needle)
{
	for (; *hay; hay++) {
		const char *h = hay, *n = needle;
		while (*n && *h == *n)
			h++, n++;
		if (!*n)
			return 1;
	}
	return 0;
}

/* The dynamic linker's list of loaded objects, walked directly rather than with dl_iterate_phdr: a
 * sanitizer runtime preloaded before us intercepts dl_iterate_phdr and resolves what it intercepts through
 * dlsym — ours — while it initialises, so that path would call an interceptor not yet set up. */
extern struct r_debug _r_debug;

static void *libc_symbol(const char *sym)
{
	static const char *const libs[] = {"libc.so", "libdl.so"};
	for (unsigned i = 0; i < 2; i++) {
		struct st_elf_want want = {sym, NULL, 0};
		for (struct link_map *m = _r_debug.r_map; m; m = m->l_next)
			if (m->l_name && contains(m->l_name, libs[i]) && st_elf_lookup(m->l_ld, m->l_addr, &want) &&
			    !want.ifunc)
				return want.result;
	}
	return NULL;
}

static void bootstrap(void)
{
	if (!real_dlsym_p)
		__atomic_store_n(&real_dlsym_p, (dlsym_fn)libc_symbol("dlsym"), __ATOMIC_RELEASE);
	if (!real_dlvsym_p)
		__atomic_store_n(&real_dlvsym_p, (dlvsym_fn)libc_symbol("dlvsym"), __ATOMIC_RELEASE);
	if (!real_dlclose_p)
		__atomic_store_n(&real_dlclose_p, (dlclose_fn)libc_symbol("dlclose"), __ATOMIC_RELEASE);
}

void st_interpose_init(void)
{
	bootstrap();
}

void *st_real_dlsym(void *handle, const char *name)
{
	if (unlikely(!real_dlsym_p))
		bootstrap();
	return real_dlsym_p ? real_dlsym_p(handle, name) : NULL;
}

void *st_resolve_next(const char *name)
{
	return st_real_dlsym(RTLD_NEXT, name);
}

/* Is `found` the default version of `name` in the object that holds it (what an unversioned
 * dlsym, and so our shim, would use)?  dladdr1 touches no dlerror state. */
static int default_version(void *found, const char *name)
{
	Dl_info info;
	struct link_map *lm = NULL;
	if (!dladdr1(found, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
		return 0;
	struct st_elf_want want = {name, NULL, 0};
	return st_elf_lookup(lm->l_ld, lm->l_addr, &want) && want.result == found;
}

/*
 * A hooked name the program asked for: what it gets.  `found` is what the real lookup gave for the
 * program's handle (and version).  The wrapper is handed out only when it forwards to exactly that
 * function; everything else gets the untraced answer, never a different function:
 *   - the lookup found our own shim (RTLD_DEFAULT, or a handle of the global scope, where the
 *     preloaded tracer comes first): untraced the program would get the next definition in that
 *     scope, so that is the real function, and NULL stays NULL (a program probing with
 *     dlsym(RTLD_DEFAULT) for a library it has not loaded sees what it sees untraced);
 *   - dlvsym of an older version (name@V, not the default name@@V the shim forwards to): the real
 *     pointer, untraced;
 *   - the shim already forwards to another copy of the library (a second libibverbs loaded from
 *     elsewhere): the real pointer, untraced.
 */
static void *inject(const struct st_hook *h, void *found, const char *version)
{
	if (found == h->wrapper) {
		found = version ? real_dlvsym_p(RTLD_NEXT, h->name, version) : real_dlsym_p(RTLD_NEXT, h->name);
	}
	if (!found)
		return NULL;
	if (version && !default_version(found, h->name))
		return found;
	void *expected = NULL;
	if (!__atomic_compare_exchange_n(h->real, &expected, found, 0, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE) &&
	    expected != found)
		return found;
	st_real_slot_remember(h->real);
	return h->wrapper;
}

/* The body of both exports.  A hooked name is looked up from here, so its
 * RTLD_NEXT means "after sigmatrace", the traced library; any other name
 * ends in a tail call, which keeps the caller's return address and so the
 * caller's RTLD_NEXT. */
#define LOOKUP(real, version, ...)                                     \
	if (unlikely(!(real)))                                         \
		bootstrap();                                           \
	if (name && !in_dlsym && st_cfg.enabled) {                     \
		const struct st_hook *hook = st_hook_find(name);       \
		if (hook && st_provider_on(hook->provider)) {          \
			in_dlsym = 1;                                  \
			void *found = (real)(__VA_ARGS__);             \
			found = inject(hook, found, version);          \
			in_dlsym = 0;                                  \
			return found;                                  \
		}                                                      \
		if (hook && st_initialized)                            \
			st_libraries_check(); /* disabled: say so */  \
	}                                                              \
	return (real)(__VA_ARGS__)

ST_EXPORT void *dlsym(void *handle, const char *name)
{
	LOOKUP(real_dlsym_p, NULL, handle, name);
}

ST_EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
	LOOKUP(real_dlvsym_p, version, handle, name, version);
}

/* dlclose: caller-independent, so wrapping it changes nothing; after a close that unloaded objects,
 * real pointers into them are dropped (resolve.c) and found again when a shim next needs them. */
ST_EXPORT int dlclose(void *handle)
{
	if (unlikely(!real_dlclose_p))
		bootstrap();
	if (unlikely(!real_dlclose_p))
		return -1;
	int ret = real_dlclose_p(handle);
	if (ret == 0 && st_initialized)
		st_real_after_dlclose();
	return ret;
}
