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
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emucuda.h"

#define EXPORT __attribute__((visibility("default")))

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

/* ---- page table ----------------------------------------------------------- */
enum { MAP_DEV = 1, MAP_HOSTREG = 2 };
struct map {
	uint64_t dva;       /* device address of the first byte of the mapping */
	uint64_t size;      /* bytes mapped (page multiple) */
	int kind;
	unsigned flags;     /* register flags */
	uintptr_t host_pg;  /* HOSTREG: host address behind dva */
	uintptr_t reg_ptr;  /* HOSTREG: registered range as given */
	uint64_t reg_size;
	int device;
	uint64_t buffer_id;
};

static pthread_rwlock_t pt_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct map maps[MAX_MAPS];
static int nmaps;
static uint8_t *window;
static uint64_t window_next;
static uint64_t next_buffer_id = 1;
static int initialized;
static int ndevices = 1;
static uint64_t hostmapped_stores;

struct emu_ctx {
	int device;
	int refs;
};
static struct emu_ctx ctxs[8];
static __thread CUcontext cur_ctx;

static void init_fn(void)
{
	window = mmap(NULL, WINDOW_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (window == MAP_FAILED) {
		fprintf(stderr, "[emucuda] cannot reserve the device window: %s\n", strerror(errno));
		abort();
	}
	window_next = 1ull << 21; /* keep the first 2 MiB unused: no device pointer is near 0 */
	const char *n = getenv("EMUCUDA_DEVICES");
	if (n && atoi(n) > 0 && atoi(n) <= 8)
		ndevices = atoi(n);
	for (int i = 0; i < 8; i++)
		ctxs[i].device = i;
}

static void window_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, init_fn);
}

/* Allocate device VA: bump allocator, 64 KiB aligned (like a GPU's large
 * pages), never reused, so a stale device pointer faults instead of aliasing. */
static uint64_t va_alloc(uint64_t size)
{
	uint64_t a = (window_next + 0xffff) & ~0xffffull;
	if (a + size + 0x10000 > WINDOW_BYTES)
		return 0;
	window_next = a + size + 0x10000; /* guard gap */
	return (uint64_t)(uintptr_t)window + a;
}

static struct map *find_dev(uint64_t d, uint64_t len)
{
	for (int i = 0; i < nmaps; i++)
		if (d >= maps[i].dva && d + len <= maps[i].dva + maps[i].size)
			return &maps[i];
	return NULL;
}

static struct map *find_host(uintptr_t p)
{
	for (int i = 0; i < nmaps; i++)
		if (maps[i].kind == MAP_HOSTREG && p >= maps[i].reg_ptr && p < maps[i].reg_ptr + maps[i].reg_size)
			return &maps[i];
	return NULL;
}

static void *xlate_locked(uint64_t d, uint64_t len, int *hostmapped)
{
	struct map *m = find_dev(d, len ? len : 1);
	if (!m)
		return NULL;
	if (hostmapped)
		*hostmapped = m->kind == MAP_HOSTREG;
	if (m->kind == MAP_DEV)
		return (void *)(uintptr_t)d;
	return (void *)(m->host_pg + (d - m->dva));
}

static int in_window(uint64_t d)
{
	return window && d >= (uint64_t)(uintptr_t)window && d < (uint64_t)(uintptr_t)window + WINDOW_BYTES;
}

/* Any address for the copy engine: a device address is translated, an
 * address outside the window is host memory (unified addressing). */
static void *xlate_any(uint64_t a, uint64_t len)
{
	if (!in_window(a))
		return (void *)(uintptr_t)a;
	pthread_rwlock_rdlock(&pt_lock);
	void *p = xlate_locked(a, len, NULL);
	pthread_rwlock_unlock(&pt_lock);
	return p;
}

EXPORT void *emucu_translate(uint64_t dptr, size_t len)
{
	if (!window)
		return NULL;
	pthread_rwlock_rdlock(&pt_lock);
	void *p = xlate_locked(dptr, len, NULL);
	pthread_rwlock_unlock(&pt_lock);
	return p;
}

static void *gpu_xlate(uint64_t dptr, size_t len, const char *what, int count_store)
{
	int hm = 0;
	void *p = NULL;
	if (window) {
		pthread_rwlock_rdlock(&pt_lock);
		p = xlate_locked(dptr, len, &hm);
		pthread_rwlock_unlock(&pt_lock);
	}
	if (!p) {
		fprintf(stderr, "[emucuda] illegal address: %s of %zu bytes at device address 0x%llx\n", what, len,
			(unsigned long long)dptr);
		abort();
	}
	if (hm && count_store)
		__atomic_fetch_add(&hostmapped_stores, 1, __ATOMIC_RELAXED);
	return p;
}

EXPORT void emucu_store64(uint64_t dptr, uint64_t v)
{
	uint64_t *p = gpu_xlate(dptr, 8, "st.b64", 1);
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}
EXPORT void emucu_store32(uint64_t dptr, uint32_t v)
{
	uint32_t *p = gpu_xlate(dptr, 4, "st.b32", 1);
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}
EXPORT uint64_t emucu_load64(uint64_t dptr)
{
	return __atomic_load_n((uint64_t *)gpu_xlate(dptr, 8, "ld.b64", 0), __ATOMIC_ACQUIRE);
}
EXPORT uint32_t emucu_load32(uint64_t dptr)
{
	return __atomic_load_n((uint32_t *)gpu_xlate(dptr, 4, "ld.b32", 0), __ATOMIC_ACQUIRE);
}
EXPORT void emucu_memcpy_to_dev(uint64_t dptr, const void *src, size_t n)
{
	memcpy(gpu_xlate(dptr, n, "st (block)", 0), src, n);
}
EXPORT void emucu_memcpy_from_dev(void *dst, uint64_t dptr, size_t n)
{
	memcpy(dst, gpu_xlate(dptr, n, "ld (block)", 0), n);
}
EXPORT void emucu_fence_system(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}
EXPORT uint64_t emucu_stat_hostmapped_stores(void)
{
	return __atomic_load_n(&hostmapped_stores, __ATOMIC_RELAXED);
}

/* ---- init, devices, contexts -------------------------------------------- */
#define NEED_INIT()                                  \
	do {                                         \
		if (!initialized)                    \
			return CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

EXPORT CUresult cuInit(unsigned flags)
{
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	window_init();
	initialized = 1;
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
	NEED_INIT();
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = ndevices;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	NEED_INIT();
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	NEED_INIT();
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "sigmatrace emulated GPU %d", d);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
	NEED_INIT();
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
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
	default: *v = 0; break;
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
	NEED_INIT();
	if (!u)
		return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	static const char base[16] = {'s', 'i', 'g', 'm', 'a', 't', 'r', 'a', 'c', 'e', '-', 'e', 'm', 'u', 0, 0};
	memcpy(u->bytes, base, 16);
	u->bytes[15] = (char)d;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceGetPCIBusId(char *s, int len, CUdevice d)
{
	NEED_INIT();
	if (!s || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(s, (size_t)len, "0000:%02x:00.0", 0x10 + d);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
	NEED_INIT();
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
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
	NEED_INIT();
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	__atomic_fetch_add(&ctxs[d].refs, 1, __ATOMIC_RELAXED);
	*c = &ctxs[d];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { NEED_INIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d)
{
	CUresult r = cuDevicePrimaryCtxRetain(c, d);
	if (!r)
		cur_ctx = *c;
	return r;
}
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned flags, CUdevice d) { return cuCtxCreate_v2(c, flags, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *c, void *p, int n, unsigned flags, CUdevice d) { return cuCtxCreate_v2(c, flags, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, void *p, unsigned flags, CUdevice d) { return cuCtxCreate_v2(c, flags, d); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { NEED_INIT(); if (cur_ctx == c) cur_ctx = NULL; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { NEED_INIT(); cur_ctx = c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
	NEED_INIT();
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	*c = cur_ctx;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	NEED_INIT();
	if (c)
		*c = cur_ctx;
	cur_ctx = NULL;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
	NEED_INIT();
	if (!cur_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = cur_ctx->device;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void);

#define NEED_CTX()                                   \
	do {                                         \
		NEED_INIT();                         \
		if (!cur_ctx)                        \
			return CUDA_ERROR_INVALID_CONTEXT; \
	} while (0)

/* ---- device memory ----------------------------------------------------------- */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dp, size_t size)
{
	NEED_CTX();
	if (!dp || !size)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t sz = (size + PAGE - 1) & ~(PAGE - 1);
	pthread_rwlock_wrlock(&pt_lock);
	if (nmaps == MAX_MAPS) {
		pthread_rwlock_unlock(&pt_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	uint64_t d = va_alloc(sz);
	if (!d || mprotect((void *)(uintptr_t)d, sz, PROT_READ | PROT_WRITE) != 0) {
		pthread_rwlock_unlock(&pt_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	maps[nmaps++] = (struct map){.dva = d, .size = sz, .kind = MAP_DEV, .device = cur_ctx->device,
				     .buffer_id = next_buffer_id++};
	pthread_rwlock_unlock(&pt_lock);
	*dp = d;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc(unsigned *dp, unsigned size) { return CUDA_ERROR_NOT_SUPPORTED; /* 32-bit ABI */ }

static void map_remove(int i)
{
	maps[i] = maps[--nmaps];
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr d)
{
	NEED_INIT();
	if (!d)
		return CUDA_SUCCESS;
	pthread_rwlock_wrlock(&pt_lock);
	for (int i = 0; i < nmaps; i++)
		if (maps[i].kind == MAP_DEV && maps[i].dva == d) {
			madvise((void *)(uintptr_t)d, maps[i].size, MADV_DONTNEED);
			mprotect((void *)(uintptr_t)d, maps[i].size, PROT_NONE);
			map_remove(i);
			pthread_rwlock_unlock(&pt_lock);
			return CUDA_SUCCESS;
		}
	pthread_rwlock_unlock(&pt_lock);
	return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemFree(unsigned d) { return CUDA_ERROR_NOT_SUPPORTED; }
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
	NEED_CTX();
	if (f)
		*f = 15ull << 30;
	if (t)
		*t = 16ull << 30;
	return CUDA_SUCCESS;
}

/* ---- host registration -------------------------------------------------------- */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags)
{
	NEED_CTX();
	if (!p || !size || (flags & ~0x0fu))
		return CUDA_ERROR_INVALID_VALUE;
	uintptr_t start = (uintptr_t)p & ~(uintptr_t)(PAGE - 1);
	uint64_t sz = (((uintptr_t)p + size + PAGE - 1) & ~(uintptr_t)(PAGE - 1)) - start;
	pthread_rwlock_wrlock(&pt_lock);
	for (int i = 0; i < nmaps; i++)
		if (maps[i].kind == MAP_HOSTREG && (uintptr_t)p < maps[i].reg_ptr + maps[i].reg_size &&
		    maps[i].reg_ptr < (uintptr_t)p + size) {
			pthread_rwlock_unlock(&pt_lock);
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	if (nmaps == MAX_MAPS) {
		pthread_rwlock_unlock(&pt_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	uint64_t d = va_alloc(sz); /* stays PROT_NONE: only the MMU path reaches it */
	if (!d) {
		pthread_rwlock_unlock(&pt_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	maps[nmaps++] = (struct map){.dva = d, .size = sz, .kind = MAP_HOSTREG, .flags = flags, .host_pg = start,
				     .reg_ptr = (uintptr_t)p, .reg_size = size, .device = cur_ctx->device,
				     .buffer_id = next_buffer_id++};
	pthread_rwlock_unlock(&pt_lock);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostRegister(void *p, unsigned size, unsigned flags)
{
	return cuMemHostRegister_v2(p, size, flags);
}
EXPORT CUresult cuMemHostUnregister(void *p)
{
	NEED_INIT();
	pthread_rwlock_wrlock(&pt_lock);
	for (int i = 0; i < nmaps; i++)
		if (maps[i].kind == MAP_HOSTREG && maps[i].reg_ptr == (uintptr_t)p) {
			map_remove(i);
			pthread_rwlock_unlock(&pt_lock);
			return CUDA_SUCCESS;
		}
	pthread_rwlock_unlock(&pt_lock);
	return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dp, void *p, unsigned flags)
{
	NEED_CTX();
	if (!dp || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_rdlock(&pt_lock);
	struct map *m = find_host((uintptr_t)p);
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	if (m && (m->flags & CU_MEMHOSTREGISTER_DEVICEMAP)) {
		*dp = m->dva + ((uintptr_t)p - m->host_pg);
		r = CUDA_SUCCESS;
	}
	pthread_rwlock_unlock(&pt_lock);
	return r;
}
EXPORT CUresult cuMemHostGetDevicePointer(unsigned *dp, void *p, unsigned flags)
{
	return CUDA_ERROR_NOT_SUPPORTED; /* 32-bit CUdeviceptr ABI: not emulated */
}
EXPORT CUresult cuMemHostGetFlags(unsigned *f, void *p)
{
	NEED_INIT();
	pthread_rwlock_rdlock(&pt_lock);
	struct map *m = find_host((uintptr_t)p);
	if (m && f)
		*f = m->flags;
	pthread_rwlock_unlock(&pt_lock);
	return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- pointer attributes ----------------------------------------------------------- */
static CUresult ptr_attr(void *data, int attr, CUdeviceptr ptr)
{
	struct map *m = NULL;
	uint64_t dev = 0;
	uintptr_t host = 0;
	int isdev = 0;
	if (in_window(ptr)) {
		m = find_dev(ptr, 1);
		if (m) {
			isdev = 1;
			dev = ptr;
			host = m->kind == MAP_HOSTREG ? m->host_pg + (ptr - m->dva) : 0;
		}
	} else {
		m = find_host((uintptr_t)ptr);
		if (m) {
			host = (uintptr_t)ptr;
			dev = m->dva + ((uintptr_t)ptr - m->host_pg);
		}
	}
	if (!m) {
		if (attr == 13) { /* MAPPED */
			*(int *)data = 0;
			return CUDA_SUCCESS;
		}
		if (attr == 2) { /* MEMORY_TYPE of unregistered memory */
			*(unsigned *)data = 0;
			return CUDA_ERROR_INVALID_VALUE;
		}
		return CUDA_ERROR_INVALID_VALUE;
	}
	switch (attr) {
	case 1: *(CUcontext *)data = &ctxs[m->device]; break;
	case 2: *(unsigned *)data = m->kind == MAP_DEV ? 2u : 1u; break;
	case 3: *(CUdeviceptr *)data = dev; break;
	case 4:
		if (!host)
			return CUDA_ERROR_INVALID_VALUE;
		*(void **)data = (void *)host;
		break;
	case 6: *(int *)data = 1; break;
	case 7: *(unsigned long long *)data = m->buffer_id; break;
	case 8: *(int *)data = 0; break;
	case 9: *(int *)data = m->device; break;
	case 11: *(CUdeviceptr *)data = isdev ? m->dva : (CUdeviceptr)m->reg_ptr; break;
	case 12: *(size_t *)data = m->kind == MAP_DEV ? m->size : m->reg_size; break;
	case 13: *(int *)data = 1; break;
	case 15: *(int *)data = m->kind == MAP_DEV; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr)
{
	NEED_INIT();
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_rdlock(&pt_lock);
	CUresult r = ptr_attr(data, attr, ptr);
	pthread_rwlock_unlock(&pt_lock);
	return r;
}
EXPORT CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr)
{
	NEED_INIT();
	if (!attrs || !data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_rdlock(&pt_lock);
	for (unsigned i = 0; i < n; i++) {
		/* like the driver: unknown pointers give zeroed values, not an error */
		if (ptr_attr(data[i], attrs[i], ptr) != CUDA_SUCCESS) {
			size_t sz = (attrs[i] == 1 || attrs[i] == 3 || attrs[i] == 4 || attrs[i] == 7 || attrs[i] == 11 ||
				     attrs[i] == 12) ? 8 : 4;
			memset(data[i], 0, sz);
		}
	}
	pthread_rwlock_unlock(&pt_lock);
	return CUDA_SUCCESS;
}

/* ---- streams, events, copies ----------------------------------------------------------- */
enum { OP_COPY = 1, OP_EVENT = 2, OP_SET = 3 };
struct op {
	struct op *next;
	int kind;
	uint64_t dst, src;
	size_t n;
	uint8_t val;
	struct emu_event *ev;
	uint64_t ticket;
};
struct emu_stream {
	pthread_mutex_t lock;
	pthread_cond_t cond, done_cond;
	struct op *head, *tail;
	uint64_t submitted, completed;
	int stop;
	pthread_t thr;
	unsigned flags;
	int copy_errors;
};
struct emu_event {
	struct emu_stream *s; /* NULL: complete */
	uint64_t ticket;
	unsigned flags;
};

static int exec_op(struct op *o)
{
	if (o->kind == OP_COPY) {
		void *d = xlate_any(o->dst, o->n), *s = xlate_any(o->src, o->n);
		if (!d || !s)
			return -1;
		memmove(d, s, o->n);
	} else if (o->kind == OP_SET) {
		void *d = xlate_any(o->dst, o->n);
		if (!d)
			return -1;
		memset(d, o->val, o->n);
	}
	return 0;
}

static void *copy_engine(void *arg)
{
	struct emu_stream *s = arg;
	pthread_setname_np(pthread_self(), "emucu-stream");
	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cond, &s->lock);
		if (!s->head && s->stop)
			break;
		struct op *o = s->head;
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->lock);
		if (exec_op(o) != 0)
			__atomic_fetch_add(&s->copy_errors, 1, __ATOMIC_RELAXED);
		pthread_mutex_lock(&s->lock);
		s->completed = o->ticket;
		pthread_cond_broadcast(&s->done_cond);
		free(o);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned flags)
{
	NEED_CTX();
	if (!ps)
		return CUDA_ERROR_INVALID_VALUE;
	struct emu_stream *s = calloc(1, sizeof *s);
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_cond_init(&s->done_cond, NULL);
	s->flags = flags;
	if (pthread_create(&s->thr, NULL, copy_engine, s) != 0) {
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*ps = s;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned flags, int prio) { return cuStreamCreate(ps, flags); }

static uint64_t enqueue(struct emu_stream *s, struct op *o)
{
	pthread_mutex_lock(&s->lock);
	o->ticket = ++s->submitted;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return o->ticket;
}

static CUresult stream_sync(struct emu_stream *s)
{
	if (!s)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&s->lock);
	while (s->completed < s->submitted)
		pthread_cond_wait(&s->done_cond, &s->lock);
	int err = __atomic_exchange_n(&s->copy_errors, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
	return err ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) { NEED_INIT(); return stream_sync(s); }
EXPORT CUresult cuStreamQuery(CUstream s)
{
	NEED_INIT();
	if (!s)
		return CUDA_SUCCESS;
	return __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE) >= __atomic_load_n(&s->submitted, __ATOMIC_ACQUIRE)
		       ? CUDA_SUCCESS
		       : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	NEED_INIT();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	stream_sync(s);
	pthread_mutex_lock(&s->lock);
	s->stop = 1;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thr, NULL);
	free(s);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }
EXPORT CUresult cuCtxSynchronize(void) { NEED_CTX(); return CUDA_SUCCESS; }

static CUresult copy(uint64_t dst, uint64_t src, size_t n, CUstream s, int check_dst, int check_src)
{
	NEED_CTX();
	if (!n)
		return CUDA_SUCCESS;
	/* device operands must be mapped device addresses */
	if ((check_dst && !emucu_translate(dst, n)) || (check_src && !emucu_translate(src, n)))
		return CUDA_ERROR_INVALID_VALUE;
	if (!s) {
		struct op o = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
		return exec_op(&o) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	}
	struct op *o = calloc(1, sizeof *o);
	if (!o)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*o = (struct op){.kind = OP_COPY, .dst = dst, .src = src, .n = n};
	enqueue(s, o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return copy(d, (uintptr_t)h, n, NULL, 1, 0); }
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return copy((uintptr_t)h, d, n, NULL, 0, 1); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n, NULL, 1, 1); }
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n, NULL, 0, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s)
{
	return copy(d, (uintptr_t)h, n, s, 1, 0);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s)
{
	return copy((uintptr_t)h, d, n, s, 0, 1);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s)
{
	return copy(d, src, n, s, 1, 1);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(d, s, n, st, 0, 0); }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
	NEED_CTX();
	void *p = emucu_translate(d, n);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	memset(p, v, n);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned flags)
{
	NEED_CTX();
	if (!pe)
		return CUDA_ERROR_INVALID_VALUE;
	struct emu_event *e = calloc(1, sizeof *e);
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->flags = flags;
	*pe = e;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!s) {
		e->s = NULL;
		return CUDA_SUCCESS;
	}
	struct op *o = calloc(1, sizeof *o);
	if (!o)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->kind = OP_EVENT;
	uint64_t t = enqueue(s, o);
	e->ticket = t;
	__atomic_store_n(&e->s, s, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct emu_stream *s = __atomic_load_n(&e->s, __ATOMIC_ACQUIRE);
	if (!s)
		return CUDA_SUCCESS;
	return __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE) >= e->ticket ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventSynchronize(CUevent e)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct emu_stream *s = e->s;
	if (!s)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&s->lock);
	while (s->completed < e->ticket)
		pthread_cond_wait(&s->done_cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	free(e);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

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
#define P(n, v, f) {n, v, (void *)(f)}
static CUresult gpa_v1(const char *sym, void **pfn, int ver, uint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status);
static const struct proc procs[] = {
	P("cuInit", 2000, cuInit), P("cuDriverGetVersion", 2020, cuDriverGetVersion),
	P("cuDeviceGet", 2000, cuDeviceGet), P("cuDeviceGetCount", 2000, cuDeviceGetCount),
	P("cuDeviceGetName", 2000, cuDeviceGetName), P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	P("cuDeviceGetUuid", 9020, cuDeviceGetUuid), P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId), P("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
	P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2), P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
	P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2), P("cuCtxCreate", 2000, cuCtxCreate),
	P("cuCtxCreate", 3020, cuCtxCreate_v2), P("cuCtxCreate", 11040, cuCtxCreate_v3),
	P("cuCtxCreate", 12050, cuCtxCreate_v4), P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	P("cuCtxSetCurrent", 4000, cuCtxSetCurrent), P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	P("cuCtxGetDevice", 2000, cuCtxGetDevice), P("cuCtxSynchronize", 2000, cuCtxSynchronize),
	P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2), P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	P("cuMemAlloc", 2000, cuMemAlloc), P("cuMemAlloc", 3020, cuMemAlloc_v2), P("cuMemFree", 2000, cuMemFree),
	P("cuMemFree", 3020, cuMemFree_v2), P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2), P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
	P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2), P("cuMemcpy", 4000, cuMemcpy),
	P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2), P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
	P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2), P("cuMemcpyAsync", 4000, cuMemcpyAsync),
	P("cuMemsetD8", 3020, cuMemsetD8_v2), P("cuStreamCreate", 2000, cuStreamCreate),
	P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
	P("cuStreamSynchronize", 2000, cuStreamSynchronize), P("cuStreamQuery", 2000, cuStreamQuery),
	P("cuStreamDestroy", 4000, cuStreamDestroy_v2), P("cuEventCreate", 2000, cuEventCreate),
	P("cuEventRecord", 2000, cuEventRecord), P("cuEventQuery", 2000, cuEventQuery),
	P("cuEventSynchronize", 2000, cuEventSynchronize), P("cuEventDestroy", 4000, cuEventDestroy_v2),
	P("cuMemHostRegister", 4000, cuMemHostRegister), P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
	P("cuMemHostUnregister", 4000, cuMemHostUnregister),
	P("cuMemHostGetDevicePointer", 2020, cuMemHostGetDevicePointer),
	P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
	P("cuMemHostGetFlags", 2030, cuMemHostGetFlags), P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
	P("cuPointerGetAttributes", 7000, cuPointerGetAttributes), P("cuGetErrorString", 6000, cuGetErrorString),
	P("cuGetErrorName", 6000, cuGetErrorName), P("cuGetExportTable", 3000, cuGetExportTable),
	P("cuGetProcAddress", 11030, gpa_v1), P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
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
