/* Resolve the real CUDA driver (libcuda.so.1) without CUDA headers. */
#include <dlfcn.h>
#include <pthread.h>

#include "cudrv.h"
#include "interpose/interpose.h"

static struct st_cudrv drv;
static int loaded;
static pthread_once_t once = PTHREAD_ONCE_INIT;

void *st_cudrv_sym(const char *name)
{
	return drv.handle ? st_real_dlsym(drv.handle, name) : NULL;
}

static void load(void)
{
	/* the driver the application already uses, else load it (local scope) */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return;
	drv.handle = h;
#define R(field, name) *(void **)&drv.field = st_real_dlsym(h, name)
	R(MemHostRegister, "cuMemHostRegister_v2");
	R(MemHostRegister_v1, "cuMemHostRegister");
	R(MemHostUnregister, "cuMemHostUnregister");
	R(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
	R(MemHostGetDevicePointer_v1, "cuMemHostGetDevicePointer");
	R(PointerGetAttribute, "cuPointerGetAttribute");
	R(PointerGetAttributes, "cuPointerGetAttributes");
	R(GetProcAddress, "cuGetProcAddress");
	R(GetProcAddress_v2, "cuGetProcAddress_v2");
	R(GetExportTable, "cuGetExportTable");
	R(CtxGetCurrent, "cuCtxGetCurrent");
	R(CtxSetCurrent, "cuCtxSetCurrent");
	R(CtxGetDevice, "cuCtxGetDevice");
	R(StreamCreate, "cuStreamCreate");
	R(StreamDestroy, "cuStreamDestroy_v2");
	R(StreamSynchronize, "cuStreamSynchronize");
	R(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	R(MemcpyDtoH, "cuMemcpyDtoH_v2");
	R(EventCreate, "cuEventCreate");
	R(EventRecord, "cuEventRecord");
	R(EventQuery, "cuEventQuery");
	R(EventSynchronize, "cuEventSynchronize");
	R(EventDestroy, "cuEventDestroy_v2");
#undef R
	__atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
}

const struct st_cudrv *st_cudrv(void)
{
	pthread_once(&once, load);
	return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE) ? &drv : NULL;
}
