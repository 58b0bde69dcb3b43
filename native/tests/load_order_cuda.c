/* load_order_cuda -- the CUDA driver reached every way a program reaches it (tests/test_load_order.py),
 * on the emulated driver (native/emu/cuda: LD_LIBRARY_PATH=<build>/emu/cuda).
 *
 *   load_order_cuda MODE [module-dir]
 *
 * MODE
 *   linked        linked with -lcuda (build with -DLO_LINKED): direct calls
 *   dlsym-local   dlopen("libcuda.so.1", RTLD_LOCAL), dlsym on the handle (NCCL, cudart's loader)
 *   gpa           the same handle, then every entry point through cuGetProcAddress_v2 (cudart's way)
 *   module-local  dlopen(<dir>/liblo_cuda.so, RTLD_LOCAL): a module linked with -lcuda calls the driver
 *                 (this file built with -DLO_MODULE -DLO_LINKED -shared)
 * Work: cuInit, a context, cuMemHostRegister_v2 of a 64 KiB buffer, cuMemHostGetDevicePointer_v2,
 * cuPointerGetAttribute, cuMemHostUnregister.  stdout: "CUDA r=... " with every result code, then
 * "RESULT OK" (exit 0) or "RESULT FAIL ..." (exit 1): the same traced and untraced.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

struct cu_fns {
	CUresult (*init)(unsigned);
	CUresult (*device_get)(int *, int);
	CUresult (*ctx_create)(void **, unsigned, int);
	CUresult (*host_register)(void *, size_t, unsigned);
	CUresult (*host_get_devptr)(CUdeviceptr *, void *, unsigned);
	CUresult (*pointer_get_attribute)(void *, int, CUdeviceptr);
	CUresult (*host_unregister)(void *);
};

#include "result_fail.h"

static int cu_work(const struct cu_fns *f)
{
	int dev = -1;
	void *ctx = NULL;
	CUresult r_init = f->init(0);
	CUresult r_dev = f->device_get(&dev, 0);
	CUresult r_ctx = f->ctx_create(&ctx, 0, dev);
	void *buf = aligned_alloc(65536, 65536);
	memset(buf, 0, 65536);
	CUresult r_reg = f->host_register(buf, 65536, 0x01 | 0x02); /* PORTABLE | DEVICEMAP */
	CUdeviceptr d = 0;
	CUresult r_gdp = f->host_get_devptr(&d, buf, 0);
	unsigned memtype = 0;
	CUresult r_attr = f->pointer_get_attribute(&memtype, 2 /* MEMORY_TYPE */, d);
	CUresult r_unreg = f->host_unregister(buf);
	printf("CUDA init=%d dev=%d ctx=%d register=%d devptr=%d(%s) attr=%d memtype=%u unregister=%d\n", r_init, r_dev,
	       r_ctx, r_reg, r_gdp, d ? "set" : "0", r_attr, memtype, r_unreg);
	free(buf);
	if (r_init || r_dev || r_ctx || r_reg || r_gdp || r_unreg)
		RESULT_FAIL("a driver call failed");
	printf("RESULT OK\n");
	return 0;
}

#ifdef LO_LINKED
CUresult cuInit(unsigned);
CUresult cuDeviceGet(int *, int);
CUresult cuCtxCreate_v2(void **, unsigned, int);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuMemHostUnregister(void *);

static int linked(void)
{
	struct cu_fns f = {cuInit, cuDeviceGet, cuCtxCreate_v2, cuMemHostRegister_v2, cuMemHostGetDevicePointer_v2,
			   cuPointerGetAttribute, cuMemHostUnregister};
	return cu_work(&f);
}
#endif

#ifdef LO_MODULE
__attribute__((visibility("default"))) int lo_cuda_run(void)
{
	return linked();
}
#else
static const char *const names[] = {"cuInit", "cuDeviceGet", "cuCtxCreate", "cuMemHostRegister",
				    "cuMemHostGetDevicePointer", "cuPointerGetAttribute", "cuMemHostUnregister"};
static const char *const symbols[] = {"cuInit", "cuDeviceGet", "cuCtxCreate_v2", "cuMemHostRegister_v2",
				      "cuMemHostGetDevicePointer_v2", "cuPointerGetAttribute", "cuMemHostUnregister"};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *mode = argc > 1 ? argv[1] : "dlsym-local";
	const char *dir = argc > 2 ? argv[2] : ".";
	struct cu_fns f;
	void **slot = (void **)&f;
	if (!strcmp(mode, "linked")) {
#ifdef LO_LINKED
		return linked();
#else
		RESULT_FAIL("built without -DLO_LINKED");
#endif
	}
	if (!strcmp(mode, "module-local")) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/liblo_cuda.so", dir);
		void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!h)
			RESULT_FAIL("dlopen %s: %s", path, dlerror());
		int (*run)(void) = (int (*)(void))dlsym(h, "lo_cuda_run");
		if (!run)
			RESULT_FAIL("dlsym lo_cuda_run");
		return run();
	}
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		RESULT_FAIL("dlopen libcuda.so.1: %s", dlerror());
	if (!strcmp(mode, "dlsym-local")) {
		for (unsigned i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++)
			if (!(slot[i] = dlsym(h, symbols[i])))
				RESULT_FAIL("dlsym %s", symbols[i]);
		return cu_work(&f);
	}
	if (!strcmp(mode, "gpa")) {
		CUresult (*gpa)(const char *, void **, int, uint64_t, int *) =
			(CUresult(*)(const char *, void **, int, uint64_t, int *))dlsym(h, "cuGetProcAddress_v2");
		if (!gpa)
			RESULT_FAIL("dlsym cuGetProcAddress_v2");
		for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			int st = -1;
			/* cuCtxCreate at 12000 would be _v4, another signature */
			if (gpa(names[i], &slot[i], i == 2 ? 3020 : 12000, 0, &st) || !slot[i])
				RESULT_FAIL("cuGetProcAddress %s", names[i]);
		}
		return cu_work(&f);
	}
	RESULT_FAIL("unknown mode %s", mode);
}
#endif
