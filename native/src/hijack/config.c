/*
 * The hijack's configuration (environment, read once) and the CPU feature
 * probes that choose how an idle poller waits (umwait, mwaitx or spinning
 * with back-off).  See docs/hijack.md for the variables.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hijack_private.h"

const char *const hijack_mode_names[] = {"off", "forward", "blocking", "nonblocking", "sync", "guarded"};

struct hijack_config hijack_cfg;

static int has_waitpkg(void), has_monitorx(void);

/* Once per process (pthread_once): the first callers of the hijack's entry
 * points may be several application threads at once, and two loads would
 * each append SIGMATRACE_POLLER_CPUS to the list (and race on every field). */
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static void cfg_load_once(void)
{
	hijack_cfg.mode = HIJACK_GUARDED;
	const char *v = getenv("SIGMATRACE_HIJACK_MODE");
	if (v && *v) {
		for (int i = 0; i < HIJACK_NMODES; i++)
			if (!strcmp(v, hijack_mode_names[i]))
				hijack_cfg.mode = i;
		if (!strcmp(v, "0") || !strcmp(v, "none"))
			hijack_cfg.mode = HIJACK_OFF;
	}
	v = getenv("SIGMATRACE_HIJACK");
	if (v && !strcmp(v, "0"))
		hijack_cfg.mode = HIJACK_OFF;
	hijack_cfg.spin_us = 50;
	v = getenv("SIGMATRACE_POLLER_SPIN_US");
	if (v && *v)
		hijack_cfg.spin_us = atoi(v);
	hijack_cfg.max_sleep_us = 50;
	v = getenv("SIGMATRACE_POLLER_MAX_SLEEP_US");
	if (v && atoi(v) > 0)
		hijack_cfg.max_sleep_us = atoi(v);
	hijack_cfg.double_copy = 1;
	v = getenv("SIGMATRACE_HIJACK_DOUBLE_COPY");
	if (v && *v)
		hijack_cfg.double_copy = atoi(v) != 0;
	hijack_cfg.guard_pct = 10;
	v = getenv("SIGMATRACE_HIJACK_GUARD");
	if (v && atoi(v) >= 1 && atoi(v) <= 100)
		hijack_cfg.guard_pct = atoi(v);
	hijack_cfg.stage_wqebb = 16384;
	v = getenv("SIGMATRACE_HIJACK_STAGE_WQEBB");
	if (v && atoi(v) >= 256)
		hijack_cfg.stage_wqebb = (uint32_t)atoi(v);
	v = getenv("SIGMATRACE_POLLER_CPUS");
	if (v) {
		char *s = strdup(v), *save = NULL;
		for (char *t = strtok_r(s, ",", &save); t && hijack_cfg.ncpus < 64; t = strtok_r(NULL, ",", &save)) {
			int a, b;
			if (sscanf(t, "%d-%d", &a, &b) == 2)
				for (int c = a; c <= b && hijack_cfg.ncpus < 64; c++)
					hijack_cfg.cpus[hijack_cfg.ncpus++] = c;
			else if (sscanf(t, "%d", &a) == 1)
				hijack_cfg.cpus[hijack_cfg.ncpus++] = a;
		}
		free(s);
	}
	hijack_cfg.cpu_doorbells = 1;
	v = getenv("SIGMATRACE_CPU_DOORBELLS");
	if (v && *v)
		hijack_cfg.cpu_doorbells = atoi(v) != 0;
	hijack_cfg.stop_timeout_ms = 2000;
	v = getenv("SIGMATRACE_HIJACK_STOP_TIMEOUT_MS");
	if (v && *v && atoi(v) >= 0)
		hijack_cfg.stop_timeout_ms = atoi(v);
	v = getenv("SIGMATRACE_HIJACK_TEST_STUCK"); /* test hook, see docs/hijack.md */
	hijack_cfg.test_stuck = v && atoi(v) > 0;
	hijack_cfg.wait_kind = has_waitpkg() ? 1 : has_monitorx() ? 2 : 0;
	v = getenv("SIGMATRACE_POLLER_WAIT");
	if (v && !strcmp(v, "spin"))
		hijack_cfg.wait_kind = 0;
	hijack_cfg.loaded = 1;
}

void hijack_cfg_load(void)
{
	pthread_once(&cfg_once, cfg_load_once);
}

/* ---- CPU features --------------------------------------------------------- */
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
#if defined(__x86_64__)
	__asm__ __volatile__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
#else
	r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
static int has_waitpkg(void)
{
	unsigned r[4];
	cpuid(0, 0, r);
	if (r[0] < 7)
		return 0;
	cpuid(7, 0, r);
	return (r[2] >> 5) & 1; /* CPUID.7.0:ECX[5] WAITPKG */
}
static int has_monitorx(void)
{
	unsigned r[4];
	cpuid(0x80000000u, 0, r);
	if (r[0] < 0x80000001u)
		return 0;
	cpuid(0x80000001u, 0, r);
	return (r[2] >> 29) & 1; /* CPUID.80000001h:ECX[29] MONITORX */
}
const char *hijack_wait_name(int k)
{
	return k == 1 ? "umwait" : k == 2 ? "mwaitx" : "spin+backoff";
}
