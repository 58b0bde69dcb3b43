/*
 * One table of hooks shared by symbol shims and dlsym injection.  Providers
 * register static arrays from their constructors; lookups (dlsym only, never
 * a hot path) scan them.  No allocation: a fixed number of arrays.
 */
#include <pthread.h>
#include <string.h>

#include "interpose.h"

#define MAX_TABLES 32

static struct {
	const struct st_hook *hooks;
	unsigned n;
} tables[MAX_TABLES];
static unsigned ntables;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

void st_hooks_register(const struct st_hook *hooks, unsigned n)
{
	static int guarded;
	if (!__atomic_exchange_n(&guarded, 1, __ATOMIC_ACQ_REL))
		st_fork_guard(&reg_lock, ST_FORK_RANK_HOOKS); /* a fork while a provider registers: no dead lock */
	pthread_mutex_lock(&reg_lock);
	if (ntables < MAX_TABLES) {
		tables[ntables].hooks = hooks;
		tables[ntables].n = n;
		__atomic_store_n(&ntables, ntables + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&reg_lock);
}

const struct st_hook *st_hook_find(const char *name)
{
	unsigned nt = __atomic_load_n(&ntables, __ATOMIC_ACQUIRE);
	for (unsigned t = 0; t < nt; t++)
		for (unsigned i = 0; i < tables[t].n; i++)
			if (tables[t].hooks[i].name[0] == name[0] && !strcmp(tables[t].hooks[i].name, name))
				return &tables[t].hooks[i];
	return NULL;
}

void st_hooks_each_real(void (*fn)(void **real))
{
	unsigned nt = __atomic_load_n(&ntables, __ATOMIC_ACQUIRE);
	for (unsigned t = 0; t < nt; t++)
		for (unsigned i = 0; i < tables[t].n; i++)
			fn(tables[t].hooks[i].real);
}

unsigned st_hooks_providers(void)
{
	unsigned bits = 0, nt = __atomic_load_n(&ntables, __ATOMIC_ACQUIRE);
	for (unsigned t = 0; t < nt; t++)
		for (unsigned i = 0; i < tables[t].n; i++)
			bits |= tables[t].hooks[i].provider;
	return bits;
}
