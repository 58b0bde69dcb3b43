/* load_order_module -- the "module" of tests/test_load_order.py: a shared object that a program
 * (or another module) dlopens, the way UCX's libucs loads libuct_ib.so and libfabric loads its
 * provider DSOs.  Built twice from this file:
 *
 *   liblo_linked.so  (-DLO_LINKED, -libverbs): libibverbs is this module's dependency; its calls
 *                    are plain calls through its PLT, bound when the module is loaded.
 *   liblo_loader.so  (-ldl only): the module dlopens libibverbs.so.1 by name (RTLD_LOCAL) and
 *                    looks the functions up on that handle; or (lo_module_chain) dlopens another
 *                    module (RTLD_LOCAL) and runs that one: a library loaded by a library that was
 *                    itself loaded later.
 *
 *   int lo_module_run(int iters);                      the work of load_order.h
 *   int lo_module_chain(const char *module, int iters);
 */
#include "load_order.h"

#define LO_EXPORT __attribute__((visibility("default")))

LO_EXPORT int lo_module_run(int iters)
{
	struct lo_fns f;
#ifdef LO_LINKED
	LO_FNS_LINKED(f);
#else
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		RESULT_FAIL("module dlopen libibverbs.so.1: %s", dlerror());
	if (lo_fns_from_handle(&f, h, NULL))
		return 1;
#endif
	return lo_work(&f, iters);
}

LO_EXPORT int lo_module_chain(const char *module, int iters)
{
	void *h = dlopen(module, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		RESULT_FAIL("module dlopen %s: %s", module, dlerror());
	int (*run)(int) = (int (*)(int))dlsym(h, "lo_module_run");
	if (!run)
		RESULT_FAIL("dlsym lo_module_run: %s", dlerror());
	return run(iters);
}
