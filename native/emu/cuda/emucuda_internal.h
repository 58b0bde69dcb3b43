/* Internal definitions of the sigmatrace emulated CUDA driver (test-only
 * libcuda.so.1): shared by emucuda.c, memory.c and stream.c.  Nothing here is
 * exported: the driver's API is what the EXPORT definitions and emucuda.h
 * name. */
#ifndef SIGMATRACE_EMUCUDA_INTERNAL_H
#define SIGMATRACE_EMUCUDA_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "emucuda.h"

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct emu_ctx *CUcontext;
typedef struct emu_stream *CUstream;
typedef struct emu_event *CUevent;
typedef struct { char bytes[16]; } CUuuid;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08

#define EMU_DRIVER_VERSION 13000
#define WINDOW_BYTES (1ull << 36)  /* 64 GiB of GPU virtual address space */
#define PAGE 4096ull
#define MAX_MAPS 8192

/* ---- init, devices, contexts (emucuda.c) ----------------------------------- */
struct emu_ctx {
	int device;
	int refs;
};
extern HIDDEN int driver_initialized;
extern HIDDEN int device_count;
extern HIDDEN struct emu_ctx primary_ctxs[8];
extern HIDDEN __thread CUcontext current_ctx;

/* The checks every entry point starts with, as the driver makes them. */
#define NEED_INIT()                                        \
	do {                                               \
		if (!driver_initialized)                   \
			return CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

/* an out-pointer given (else CUDA_ERROR_INVALID_VALUE): after NEED_INIT, after NEED_CTX */
#define NEED_PTR(p) do { if (!(p)) return CUDA_ERROR_INVALID_VALUE; } while (0)
#define NEED_OUT(p) do { NEED_INIT(); NEED_PTR(p); } while (0)
#define NEED_CTX_OUT(p) do { NEED_CTX(); NEED_PTR(p); } while (0)
/* x = a zeroed object of its type, or CUDA_ERROR_OUT_OF_MEMORY */
#define NEW_OR_OOM(x) do { (x) = calloc(1, sizeof *(x)); if (!(x)) return CUDA_ERROR_OUT_OF_MEMORY; } while (0)
/* device d exists */
#define NEED_DEVICE(d) do { if ((d) < 0 || (d) >= device_count) return CUDA_ERROR_INVALID_DEVICE; } while (0)

#define NEED_CTX()                                         \
	do {                                               \
		NEED_INIT();                               \
		if (!current_ctx)                          \
			return CUDA_ERROR_INVALID_CONTEXT; \
	} while (0)

/* ---- memory.c --------------------------------------------------------------- */
HIDDEN void emucu_window_init(void);
/* Any address for the copy engine: a device address is translated, an
 * address outside the window is host memory (unified addressing). */
HIDDEN void *emucu_xlate_any(uint64_t a, uint64_t len);
CUresult cuMemAlloc_v2(CUdeviceptr *dp, size_t size);
CUresult cuMemAlloc(unsigned *dp, unsigned size);
CUresult cuMemFree_v2(CUdeviceptr d);
CUresult cuMemFree(unsigned d);
CUresult cuMemGetInfo_v2(size_t *f, size_t *t);
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags);
CUresult cuMemHostRegister(void *p, unsigned size, unsigned flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dp, void *p, unsigned flags);
CUresult cuMemHostGetDevicePointer(unsigned *dp, void *p, unsigned flags);
CUresult cuMemHostGetFlags(unsigned *f, void *p);
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr);
CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr);
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int type, unsigned long long flags);

/* ---- stream.c --------------------------------------------------------------- */
CUresult cuStreamCreate(CUstream *ps, unsigned flags);
CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned flags, int prio);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamQuery(CUstream s);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n);
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n);
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n);
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream);
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n);
CUresult cuEventCreate(CUevent *pe, unsigned flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventQuery(CUevent e);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventDestroy_v2(CUevent e);
#endif
