/* The CUDA driver entry points the hijack calls (the types and constants: abi/cuda.h, so that
 * the tracer builds without CUDA headers).  The real functions come from the real libcuda.so.1
 * with dlsym, never through our own wrappers. */
#ifndef ST_CUDRV_H
#define ST_CUDRV_H
#include <stddef.h>
#include <stdint.h>

#include "abi/cuda.h"
#include "core/core.h"

struct st_cudrv {
	void *handle;
	st_CUresult (*MemHostRegister)(void *, size_t, unsigned);            /* _v2 */
	st_CUresult (*MemHostRegister_v1)(void *, unsigned, unsigned);
	st_CUresult (*MemHostUnregister)(void *);
	st_CUresult (*MemHostGetDevicePointer)(st_CUdeviceptr *, void *, unsigned); /* _v2 */
	st_CUresult (*MemHostGetDevicePointer_v1)(unsigned *, void *, unsigned);
	st_CUresult (*PointerGetAttribute)(void *, int, st_CUdeviceptr);
	st_CUresult (*PointerGetAttributes)(unsigned, int *, void **, st_CUdeviceptr);
	st_CUresult (*GetProcAddress)(const char *, void **, int, uint64_t);
	st_CUresult (*GetProcAddress_v2)(const char *, void **, int, uint64_t, int *);
	st_CUresult (*GetExportTable)(const void **, const void *);
	st_CUresult (*CtxGetCurrent)(st_CUcontext *);
	st_CUresult (*CtxSetCurrent)(st_CUcontext);
	st_CUresult (*CtxGetDevice)(int *);
	st_CUresult (*StreamCreate)(st_CUstream *, unsigned);
	st_CUresult (*StreamDestroy)(st_CUstream);
	st_CUresult (*StreamSynchronize)(st_CUstream);
	st_CUresult (*MemcpyDtoHAsync)(void *, st_CUdeviceptr, size_t, st_CUstream);
	st_CUresult (*MemcpyDtoH)(void *, st_CUdeviceptr, size_t);
	st_CUresult (*EventCreate)(st_CUevent *, unsigned);
	st_CUresult (*EventRecord)(st_CUevent, st_CUstream);
	st_CUresult (*EventQuery)(st_CUevent);
	st_CUresult (*EventSynchronize)(st_CUevent);
	st_CUresult (*EventDestroy)(st_CUevent);
};

/* Loaded once (thread-safe); returns NULL when no libcuda can be found. */
const struct st_cudrv *st_cudrv(void) ST_HIDDEN;
/* The real exported symbol of that name in libcuda (NULL if absent). */
void *st_cudrv_sym(const char *name) ST_HIDDEN;

#endif
