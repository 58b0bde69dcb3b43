/*
 * dlsym/dlvsym injection.
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
 * library, i.e. "next after sigmatrace", which is the traced library.
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

static dlsym_fn real_dlsym_p;
static dlvsym_fn real_dlvsym_p;
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

/* A hooked name: the real address for the caller's handle, our wrapper
 * returned in its place when the provider is enabled. */
static void *inject(const struct st_hook *h, void *real)
{
	if (!real || real == h->wrapper)
		return real;
	void *expected = NULL;
	__atomic_compare_exchange_n(h->real, &expected, real, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
	return h->wrapper;
}

/* The body of both exports.  A hooked name is looked up from here, so its
 * RTLD_NEXT means "after sigmatrace", the traced library; any other name
 * ends in a tail call, which keeps the caller's return address and so the
 * caller's RTLD_NEXT. */
#define LOOKUP(real, ...)                                              \
	if (unlikely(!(real)))                                         \
		bootstrap();                                           \
	if (name && !in_dlsym && st_cfg.enabled) {                     \
		const struct st_hook *hook = st_hook_find(name);       \
		if (hook && st_provider_on(hook->provider)) {          \
			in_dlsym = 1;                                  \
			void *found = (real)(__VA_ARGS__);             \
			in_dlsym = 0;                                  \
			return inject(hook, found);                    \
		}                                                      \
	}                                                              \
	return (real)(__VA_ARGS__)

ST_EXPORT void *dlsym(void *handle, const char *name)
{
	LOOKUP(real_dlsym_p, handle, name);
}

ST_EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
	LOOKUP(real_dlvsym_p, handle, name, version);
}
