/* load_order_client -- one program, every way a program reaches libibverbs (tests/test_load_order.py).
 *
 *   load_order_client MODE [iters] [module-dir]
 *
 * MODE
 *   linked          linked with -libverbs (build with -DLO_LINKED): direct calls
 *   dlsym-local     dlopen("libibverbs.so.1", RTLD_LOCAL), dlsym on the handle
 *   dlsym-global    the same with RTLD_GLOBAL
 *   default-global  dlopen RTLD_GLOBAL, then dlsym(RTLD_DEFAULT, ...)
 *   nccl            NCCL 2.28's ibvsymbols.cc: dlopen("libibverbs.so", RTLD_NOW), else
 *                   "libibverbs.so.1"; dlvsym(handle, name, "IBVERBS_1.1"), ibv_reg_mr_iova2 at
 *                   "IBVERBS_1.8"
 *   module-local    dlopen(<dir>/liblo_linked.so, RTLD_LOCAL): the module (linked with
 *                   -libverbs) calls libibverbs; libibverbs arrives as its dependency
 *   module-global   the same with RTLD_GLOBAL
 *   module-deepbind the same with RTLD_LOCAL | RTLD_DEEPBIND: the module binds to its own
 *                   dependencies first, past the tracer (works untraced, so must traced; not traced)
 *   module-dlsym    dlopen(<dir>/liblo_loader.so): that module dlopens libibverbs, dlsym on it
 *   module-chain    dlopen(<dir>/liblo_loader.so, RTLD_LOCAL), which dlopens liblo_linked.so
 *                   RTLD_LOCAL and runs it (UCX: libucs -> libuct_ib.so -> libibverbs)
 *   probe           dlsym(RTLD_DEFAULT, "ibv_get_device_list") before libibverbs is loaded and after
 *                   it is loaded RTLD_LOCAL (both NULL untraced), then the dlsym-local work
 *   vcompat         dlvsym(handle, "ibv_get_device_list", "IBVERBS_1.0") and the default version:
 *                   which object each pointer is in (rdma-core keeps 1.0 compat versions)
 *   reload          <dir>/a/libibverbs.so.1 loaded and used, then <dir>/b/libibverbs.so.1 (a copy)
 *                   loaded, the first one closed (unloaded), the copy used
 * stdout: load_order.h's lines, plus the mode's own.  Exit 0 = RESULT OK.
 */
#include "load_order.h"

static const char *dir = ".";

static char *path_in(const char *sub)
{
	static char buf[4][4096];
	static int k;
	char *p = buf[k++ & 3];
	snprintf(p, 4096, "%s/%s", dir, sub);
	return p;
}

static const char *object_of(void *p)
{
	Dl_info info;
	if (!p || !dladdr(p, &info) || !info.dli_fname)
		return "none";
	const char *b = strrchr(info.dli_fname, '/');
	return b ? b + 1 : info.dli_fname;
}

static int run_module(const char *module, int flags, const char *chain, int iters)
{
	void *h = dlopen(path_in(module), RTLD_NOW | flags);
	if (!h)
		RESULT_FAIL("dlopen %s: %s", module, dlerror());
	if (chain) {
		int (*fn)(const char *, int) = (int (*)(const char *, int))dlsym(h, "lo_module_chain");
		if (!fn)
			RESULT_FAIL("dlsym lo_module_chain");
		return fn(path_in(chain), iters);
	}
	int (*fn)(int) = (int (*)(int))dlsym(h, "lo_module_run");
	if (!fn)
		RESULT_FAIL("dlsym lo_module_run");
	return fn(iters);
}

/* h: a dlopen handle, or RTLD_DEFAULT (which is NULL) when pseudo is set */
static int run_handle(void *h, int pseudo, const char *version, int iters)
{
	struct lo_fns f;
	if (!h && !pseudo)
		RESULT_FAIL("dlopen: %s", dlerror());
	if (lo_fns_from_handle(&f, h, version))
		return 1;
	return lo_work(&f, iters);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *mode = argc > 1 ? argv[1] : "dlsym-local";
	int iters = argc > 2 ? atoi(argv[2]) : 20;
	if (argc > 3)
		dir = argv[3];
	int rc;
	if (!strcmp(mode, "linked")) {
#ifdef LO_LINKED
		struct lo_fns f;
		LO_FNS_LINKED(f);
		rc = lo_work(&f, iters);
#else
		RESULT_FAIL("built without -DLO_LINKED");
#endif
	} else if (!strcmp(mode, "dlsym-local")) {
		rc = run_handle(dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL), 0, NULL, iters);
	} else if (!strcmp(mode, "dlsym-global")) {
		rc = run_handle(dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL), 0, NULL, iters);
	} else if (!strcmp(mode, "default-global")) {
		if (!dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL))
			RESULT_FAIL("dlopen: %s", dlerror());
		rc = run_handle(RTLD_DEFAULT, 1, NULL, iters);
	} else if (!strcmp(mode, "nccl")) {
		void *h = dlopen("libibverbs.so", RTLD_NOW);
		if (!h)
			h = dlopen("libibverbs.so.1", RTLD_NOW);
		rc = run_handle(h, 0, "IBVERBS_1.1", iters);
	} else if (!strcmp(mode, "module-local")) {
		rc = run_module("liblo_linked.so", RTLD_LOCAL, NULL, iters);
	} else if (!strcmp(mode, "module-global")) {
		rc = run_module("liblo_linked.so", RTLD_GLOBAL, NULL, iters);
	} else if (!strcmp(mode, "module-deepbind")) {
		rc = run_module("liblo_linked.so", RTLD_LOCAL | RTLD_DEEPBIND, NULL, iters);
	} else if (!strcmp(mode, "module-dlsym")) {
		rc = run_module("liblo_loader.so", RTLD_LOCAL, NULL, iters);
	} else if (!strcmp(mode, "module-chain")) {
		rc = run_module("liblo_loader.so", RTLD_LOCAL, "liblo_linked.so", iters);
	} else if (!strcmp(mode, "probe")) {
		void *before = dlsym(RTLD_DEFAULT, "ibv_get_device_list");
		void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
		void *after = dlsym(RTLD_DEFAULT, "ibv_get_device_list");
		printf("PROBE before=%s after_local=%s\n", object_of(before), object_of(after));
		rc = run_handle(h, 0, NULL, iters);
	} else if (!strcmp(mode, "vcompat")) {
		void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
		if (!h)
			RESULT_FAIL("dlopen: %s", dlerror());
		void *old = dlvsym(h, "ibv_get_device_list", "IBVERBS_1.0");
		void *cur = dlsym(h, "ibv_get_device_list");
		/* the 1.0 list is an array of 1.0 device structs: only its length is compared */
		int n_old = -1, n_cur = -1;
		void **l_old = old ? ((void **(*)(int *))old)(&n_old) : NULL;
		struct ibv_device **l_cur = cur ? ((struct ibv_device **(*)(int *))cur)(&n_cur) : NULL;
		printf("VCOMPAT v1_0=%s n=%d default=%s n=%d\n", old ? object_of(old) : "none", l_old ? n_old : -1,
		       object_of(cur), l_cur ? n_cur : -1);
		void (*fr)(void *) = (void (*)(void *))dlsym(h, "ibv_free_device_list");
		void (*fr_old)(void *) = (void (*)(void *))dlvsym(h, "ibv_free_device_list", "IBVERBS_1.0");
		if (l_old && (fr_old || fr))
			(fr_old ? fr_old : fr)(l_old);
		if (l_cur && fr)
			fr(l_cur);
		rc = 0;
		printf("RESULT OK iters=0 completions=0\n");
	} else if (!strcmp(mode, "reload")) {
		void *a = dlopen(path_in("a/libibverbs.so.1"), RTLD_NOW | RTLD_LOCAL);
		rc = run_handle(a, 0, NULL, iters);
		void *b = dlopen(path_in("b/libibverbs.so.1"), RTLD_NOW | RTLD_LOCAL);
		if (!b)
			RESULT_FAIL("dlopen b: %s", dlerror());
		if (dlclose(a))
			RESULT_FAIL("dlclose a: %s", dlerror());
		printf("RELOAD a_unloaded=%d\n", dlopen(path_in("a/libibverbs.so.1"), RTLD_NOW | RTLD_NOLOAD) == NULL);
		rc |= run_handle(b, 0, NULL, iters);
	} else {
		RESULT_FAIL("unknown mode %s", mode);
	}
	lo_print_loaded();
	return rc;
}
