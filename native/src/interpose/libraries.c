/*
 * Libraries the program loaded that the tracer does not trace (issue 17, F27): never silent.
 *
 * A traced library whose provider is disabled (SIGMATRACE_PROVIDERS / --providers leaves it out)
 * or missing from this build leaves no events; a trace without them looks like a program that
 * never used the library.  So whenever such a library is found loaded, the process file says so
 * (the PROCESS header's ST_HEADER_UNTRACED_LIBRARIES list, docs/format.md, which the report
 * prints with what to do), the trace file is made to exist even if nothing else is recorded, and
 * one line goes to stderr (once per library, only in rank 0 or an unranked process, so that a
 * 128-rank job prints it once).
 *
 * When it looks: at load (after the providers registered their hooks), at the first resolution
 * of every shim (a library dlopen'ed later and called through a shim, also a disabled one: its
 * shim still resolves the real function to forward to), when the program dlsym's a hooked name
 * whose provider is off (dlsym.c), and at exit.  A look is one dl_iterate_phdr that stops at the
 * first object unless the loader's count of loaded objects moved since the last one.
 */
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "interpose.h"

extern int st_rank ST_HIDDEN; /* core/process.c: -1 when not launched as a rank */

/* soname prefix -> the provider that traces it */
static const struct {
	const char *soname;
	unsigned provider;
} traced_libraries[] = {
	{"libibverbs.so", ST_PROV_IBV}, {"libmlx5.so", ST_PROV_MLX5}, {"libcuda.so", ST_PROV_CUDA},
	{"libucp.so", ST_PROV_UCX},     {"libfabric.so", ST_PROV_OFI}, {"libnccl.so", ST_PROV_NCCL},
};
#define N_TRACED (sizeof(traced_libraries) / sizeof(traced_libraries[0]))

struct untraced {
	char path[512];
	const char *reason;
};
static struct untraced found[N_TRACED]; /* by traced_libraries index; reason NULL = not seen */
static int busy;                         /* one look at a time; a second caller skips */
static unsigned long long seen_adds;

static const char *base_name(const char *path)
{
	const char *b = strrchr(path, '/');
	return b ? b + 1 : path;
}

static int adds_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
		*(unsigned long long *)arg = info->dlpi_adds;
	return 1; /* the counter is the same in every entry: one is enough */
}

struct scan {
	unsigned built; /* providers in this build */
	int fresh;      /* a library noted for the first time */
};

static int scan_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct scan *sc = arg;
	const char *path = info->dlpi_name;
	if (!path || !*path)
		return 0;
	const char *name = base_name(path);
	for (unsigned i = 0; i < N_TRACED; i++) {
		size_t n = strlen(traced_libraries[i].soname);
		unsigned bit = traced_libraries[i].provider;
		if (strncmp(name, traced_libraries[i].soname, n) != 0 || found[i].reason)
			continue;
		const char *reason = !(sc->built & bit) ? ST_UNTRACED_NOT_BUILT
				     : !st_provider_on(bit)  ? ST_UNTRACED_DISABLED
							      : NULL;
		if (!reason)
			continue;
		size_t len = strlen(path);
		if (len >= sizeof(found[i].path))
			len = sizeof(found[i].path) - 1;
		memcpy(found[i].path, path, len);
		found[i].path[len] = 0;
		__atomic_store_n(&found[i].reason, reason, __ATOMIC_RELEASE);
		sc->fresh = 1;
	}
	return 0;
}

/* One stderr line: which library, why it is not traced, what to do. */
static void tell(const struct untraced *u, unsigned bit)
{
	const char *lib = base_name(u->path), *prov = st_provider_name(bit);
	if (!strcmp(u->reason, ST_UNTRACED_NOT_BUILT))
		st_warn("%s is loaded but this libsigmatrace.so was built without the %s provider: its calls are not "
			"traced; rebuild the tracer (pip install ., or bash .ci/install in a checkout)", lib, prov);
	else {
		char on[64] = "";
		for (unsigned b = 1; b < ST_PROV_ALL; b <<= 1)
			if (st_cfg.providers & b) {
				size_t n = strlen(on);
				snprintf(on + n, sizeof(on) - n, "%s%s", n ? "," : "", st_provider_name(b));
			}
		st_warn("%s is loaded but the %s provider is disabled (--providers %s): its calls are not traced; "
			"add %s to --providers (or use --providers all) to trace them", lib, prov, on[0] ? on : "none",
			prov);
	}
}

static void publish(void)
{
	char buf[4096];
	struct st_json j;
	st_json_init(&j, buf, sizeof(buf));
	st_json_open(&j, NULL, '[');
	for (unsigned i = 0; i < N_TRACED; i++) {
		if (!found[i].reason)
			continue;
		st_json_open(&j, NULL, '{');
		st_json_str(&j, "library", base_name(found[i].path));
		st_json_str(&j, "path", found[i].path);
		st_json_str(&j, "provider", st_provider_name(traced_libraries[i].provider));
		st_json_str(&j, "reason", found[i].reason);
		st_json_close(&j, '}');
	}
	st_json_close(&j, ']');
	if (!j.overflow)
		st_process_set_untraced(buf);
}

void st_libraries_check(void)
{
	if (!st_cfg.enabled || !st_initialized || __atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE))
		return;
	int saved = errno;
	unsigned long long adds = 0;
	dl_iterate_phdr(adds_cb, &adds);
	int any = 0;
	if (adds != seen_adds || !adds) {
		seen_adds = adds;
		int told[N_TRACED];
		for (unsigned i = 0; i < N_TRACED; i++)
			told[i] = found[i].reason != NULL;
		struct scan sc = {st_hooks_providers(), 0};
		dl_iterate_phdr(scan_cb, &sc);
		if (sc.fresh) {
			publish();
			for (unsigned i = 0; i < N_TRACED; i++)
				if (found[i].reason && !told[i] && st_rank <= 0)
					tell(&found[i], traced_libraries[i].provider);
		}
	}
	for (unsigned i = 0; i < N_TRACED; i++)
		any |= found[i].reason != NULL;
	__atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
	/* the file must exist to say it, even when nothing else is ever recorded (--providers none) */
	if (any)
		st_ensure_active();
	errno = saved;
}

/* A fork child may inherit `busy` from a look in another thread; the list itself stays (the
 * child's libraries are the parent's, and its header says so if it writes a file). */
static void libraries_atfork_child(void)
{
	__atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
}

/* After every provider registered its hooks (constructors 110..200): what was loaded at start. */
__attribute__((constructor(250))) static void libraries_at_load(void)
{
	pthread_atfork(NULL, NULL, libraries_atfork_child);
	st_libraries_check();
}
