/*
 * sigmatrace emulated CUDA driver (test-only libcuda.so.1).
 *
 * CPU threads play the GPU.  The driver owns a reserved virtual window (the
 * "GPU virtual address space"); every device pointer it hands out lies in it
 * and is translated by a page table (struct map below), like a GPU MMU:
 *
 *   kind DEV   cuMemAlloc: the window range is made readable/writable and IS
 *              the GPU memory.  Third parties (the emulated NIC) reach it at
 *              its device address directly, as a NIC reaches GPU memory by
 *              PCIe peer-to-peer (GPUDirect RDMA).
 *   kind HOST  cuMemHostRegister(DEVICEMAP): the window range stays PROT_NONE;
 *              only the MMU path (emucu_* and the copy engine) reaches the
 *              host pages behind it.  Device pointers of registered host
 *              memory are therefore distinct from the host pointers and a
 *              host dereference of one faults.
 *
 * Streams are worker threads executing copies and event records in order
 * (the "copy engine"); the NULL stream executes synchronously.  Values of
 * enums and error codes are those of cuda.h (facts, see reference §5.1).
 *
 * This file: initialisation, devices, contexts, errors and cuGetProcAddress.
 * memory.c: the page table, GPU-side accesses, allocation, host
 * registration, pointer attributes.  stream.c: streams, events, copies.
 */

#include <stdio.h>
#include <string.h>

#include "emucuda_internal.h"

int driver_initialized;
int device_count = 1;

struct emu_ctx primary_ctxs[8];
__thread CUcontext current_ctx;

/* ---- init, devices, contexts -------------------------------------------- */
EXPORT CUresult cuInit(unsigned flags)
{
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	emucu_window_init();
	driver_initialized = 1;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = EMU_DRIVER_VERSION;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n)
{
	NEED_OUT(n);
	*n = device_count;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	NEED_OUT(d);
	if (ordinal < 0 || ordinal >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}
/* a device's string (name, bus id) into the caller's buffer of len bytes */
static CUresult device_string(char *out, int len, const char *fmt, int v)
{
	NEED_INIT();
	if (!out || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(out, (size_t)len, fmt, v);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	return device_string(name, len, "sigmatrace emulated GPU %d", d);
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
	NEED_OUT(v);
	NEED_DEVICE(d);
	switch (attr) {
	case 16: *v = 4; break;                   /* MULTIPROCESSOR_COUNT */
	case 19: *v = 1; break;                   /* CAN_MAP_HOST_MEMORY */
	case 33: *v = 0x10 + d; break;            /* PCI_BUS_ID */
	case 34: *v = 0; break;                   /* PCI_DEVICE_ID */
	case 41: *v = 1; break;                   /* UNIFIED_ADDRESSING */
	case 50: *v = 0; break;                   /* PCI_DOMAIN_ID */
	case 75: *v = 9; break;                   /* COMPUTE_CAPABILITY_MAJOR */
	case 76: *v = 0; break;                   /* COMPUTE_CAPABILITY_MINOR */
	case 91: *v = 0; break;                   /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: no */
	case 99: *v = 1; break;                   /* HOST_REGISTER_SUPPORTED */
	case 116: *v = 1; break;                  /* GPU_DIRECT_RDMA_SUPPORTED */
	case 118: *v = 100; break;                /* GPU_DIRECT_RDMA_WRITES_ORDERING: TO_OWNER, as an H200 */
	case 124: *v = 1; break;                  /* DMA_BUF_SUPPORTED */
	default: *v = 0; break;
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
	NEED_OUT(u);
	NEED_DEVICE(d);
	static const char base[16] = {'s', 'i', 'g', 'm', 'a', 't', 'r', 'a', 'c', 'e', '-', 'e', 'm', 'u', 0, 0};
	memcpy(u->bytes, base, 16);
	u->bytes[15] = (char)d;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceGetPCIBusId(char *s, int len, CUdevice d)
{
	return device_string(s, len, "0000:%02x:00.0", 0x10 + d);
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
	NEED_OUT(b);
	*b = 16ull << 30;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(unsigned *b, CUdevice d)
{
	size_t s;
	CUresult r = cuDeviceTotalMem_v2(&s, d);
	if (!r)
		*b = 0xffffffffu;
	return r;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	NEED_OUT(c);
	NEED_DEVICE(d);
	__atomic_fetch_add(&primary_ctxs[d].refs, 1, __ATOMIC_RELAXED);
	*c = &primary_ctxs[d];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { NEED_INIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d)
{
	CUresult r = cuDevicePrimaryCtxRetain(c, d);
	if (!r)
		current_ctx = *c;
	return r;
}
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned flags, CUdevice d) { return cuCtxCreate_v2(c, flags, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *c, void *p, int n, unsigned flags, CUdevice d) { return cuCtxCreate_v2(c, flags, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, void *p, unsigned flags, CUdevice d) { return cuCtxCreate_v2(c, flags, d); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { NEED_INIT(); if (current_ctx == c) current_ctx = NULL; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { NEED_INIT(); current_ctx = c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
	NEED_OUT(c);
	*c = current_ctx;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	NEED_INIT();
	if (c)
		*c = current_ctx;
	current_ctx = NULL;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
	NEED_INIT();
	if (!current_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = current_ctx->device;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) { NEED_CTX(); return CUDA_SUCCESS; }

/* ---- errors --------------------------------------------------------------------------- */
EXPORT CUresult cuGetErrorString(CUresult r, const char **s)
{
	static char buf[64];
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(buf, sizeof buf, "emulated CUDA error %d", r);
	*s = r ? buf : "no error";
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult r, const char **s) { return cuGetErrorString(r, s); }

/* cuGetExportTable hands out private driver tables (used by cudart); the
 * emulated driver has none and says so. */
EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
	if (table)
		*table = NULL;
	return CUDA_ERROR_NOT_FOUND;
}

/* ---- cuGetProcAddress ------------------------------------------------------------------ */
struct proc {
	const char *name;  /* base name as cudart asks for it */
	int min_version;   /* first CUDA version this variant serves */
	void *fn;
};
/* A row: the name cudart asks for, the first version the function serves,
 * the function (PROC_AS when it is not the one of that name). */
#define PROC(name, version) {#name, version, (void *)(name)}
#define PROC_AS(name, version, fn) {#name, version, (void *)(fn)}

static CUresult gpa_v1(const char *sym, void **pfn, int ver, uint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status);
static const struct proc procs[] = {
	PROC(cuInit, 2000),
	PROC(cuDriverGetVersion, 2020),
	PROC(cuDeviceGet, 2000),
	PROC(cuDeviceGetCount, 2000),
	PROC(cuDeviceGetName, 2000),
	PROC(cuDeviceGetAttribute, 2000),
	PROC(cuDeviceGetUuid, 9020),
	PROC_AS(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
	PROC(cuDeviceGetPCIBusId, 4010),
	PROC(cuDeviceTotalMem, 2000),
	PROC_AS(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
	PROC(cuDevicePrimaryCtxRetain, 7000),
	PROC(cuDevicePrimaryCtxRelease, 7000),
	PROC_AS(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
	PROC(cuCtxCreate, 2000),
	PROC_AS(cuCtxCreate, 3020, cuCtxCreate_v2),
	PROC_AS(cuCtxCreate, 11040, cuCtxCreate_v3),
	PROC_AS(cuCtxCreate, 12050, cuCtxCreate_v4),
	PROC_AS(cuCtxDestroy, 4000, cuCtxDestroy_v2),
	PROC(cuCtxSetCurrent, 4000),
	PROC(cuCtxGetCurrent, 4000),
	PROC(cuCtxGetDevice, 2000),
	PROC(cuCtxSynchronize, 2000),
	PROC_AS(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
	PROC_AS(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
	PROC(cuMemAlloc, 2000),
	PROC_AS(cuMemAlloc, 3020, cuMemAlloc_v2),
	PROC(cuMemFree, 2000),
	PROC_AS(cuMemFree, 3020, cuMemFree_v2),
	PROC_AS(cuMemGetInfo, 3020, cuMemGetInfo_v2),
	PROC_AS(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
	PROC_AS(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
	PROC_AS(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
	PROC(cuMemcpy, 4000),
	PROC_AS(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2),
	PROC_AS(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2),
	PROC_AS(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2),
	PROC(cuMemcpyAsync, 4000),
	PROC_AS(cuMemsetD8, 3020, cuMemsetD8_v2),
	PROC(cuStreamCreate, 2000),
	PROC(cuStreamCreateWithPriority, 5050),
	PROC(cuStreamSynchronize, 2000),
	PROC(cuStreamQuery, 2000),
	PROC_AS(cuStreamDestroy, 4000, cuStreamDestroy_v2),
	PROC(cuEventCreate, 2000),
	PROC(cuEventRecord, 2000),
	PROC(cuEventQuery, 2000),
	PROC(cuEventSynchronize, 2000),
	PROC_AS(cuEventDestroy, 4000, cuEventDestroy_v2),
	PROC(cuMemHostRegister, 4000),
	PROC_AS(cuMemHostRegister, 6050, cuMemHostRegister_v2),
	PROC(cuMemHostUnregister, 4000),
	PROC(cuMemHostGetDevicePointer, 2020),
	PROC_AS(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2),
	PROC(cuMemHostGetFlags, 2030),
	PROC(cuPointerGetAttribute, 4000),
	PROC(cuPointerGetAttributes, 7000),
	PROC(cuMemGetHandleForAddressRange, 11070),
	PROC(cuGetErrorString, 6000),
	PROC(cuGetErrorName, 6000),
	PROC(cuGetExportTable, 3000),
	PROC_AS(cuGetProcAddress, 11030, gpa_v1),
	PROC_AS(cuGetProcAddress, 12000, cuGetProcAddress_v2),
};

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status)
{
	if (!sym || !pfn || (flags & ~3ull))
		return CUDA_ERROR_INVALID_VALUE;
	const struct proc *best = NULL;
	int found = 0;
	for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
		if (strcmp(procs[i].name, sym))
			continue;
		found = 1;
		if (procs[i].min_version <= ver && (!best || procs[i].min_version > best->min_version))
			best = &procs[i];
	}
	*pfn = best ? best->fn : NULL;
	if (status)
		*status = best ? 0 : found ? 2 : 1;
	return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
static CUresult gpa_v1(const char *sym, void **pfn, int ver, uint64_t flags)
{
	return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
/* The 4-argument ABI that the symbol "cuGetProcAddress" has kept. */
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags)
{
	return gpa_v1(sym, pfn, ver, flags);
}
