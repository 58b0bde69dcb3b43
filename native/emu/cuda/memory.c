/* Emulated CUDA driver: the GPU virtual address window and its page table
 * (emucuda.c's top comment has the model), the GPU-side accesses of
 * emucuda.h, device memory, host registration and pointer attributes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emucuda_internal.h"

/* ---- page table ----------------------------------------------------------- */
enum { MAP_DEV = 1, MAP_HOSTREG = 2 };
struct map {
	uint64_t dva;       /* device address of the first byte of the mapping */
	uint64_t size;      /* bytes mapped (page multiple) */
	int kind;
	unsigned flags;     /* register flags */
	uintptr_t host_pg;  /* HOSTREG: host address behind dva; DEV in opaque mode: the backing pages */
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

static uint64_t hostmapped_stores;
/* EMUCUDA_DEVMEM=opaque: device memory is not mapped for the CPU at its
 * device address (the window stays PROT_NONE), like cudaMalloc memory on a
 * real GPU: only the MMU path (emucu_*, the copy engine) reaches it, so a
 * third party (the emulated NIC) that dereferences a device pointer faults
 * instead of working by accident.  Default: mapped (GPUDirect-style peer
 * access by address, what the hijack tests use). */
static int devmem_opaque;
/* EMUCUDA_STRICT_IOMEMORY=1: cuMemHostRegister with IOMEMORY fails with
 * CUDA_ERROR_INVALID_VALUE, as the real driver does for ordinary RAM (an
 * H200, reference real-libraries.md): every page here is RAM. */
static int strict_iomemory;

static void init_fn(void)
{
	window = mmap(NULL, WINDOW_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (window == MAP_FAILED) {
		fprintf(stderr, "[emucuda] cannot reserve the device window: %s\n", strerror(errno));
		abort();
	}
	window_next = 1ull << 21; /* keep the first 2 MiB unused: no device pointer is near 0 */
	const char *dm = getenv("EMUCUDA_DEVMEM");
	devmem_opaque = dm && !strcmp(dm, "opaque");
	const char *si = getenv("EMUCUDA_STRICT_IOMEMORY");
	strict_iomemory = si && *si && *si != '0';
	const char *n = getenv("EMUCUDA_DEVICES");
	if (n && atoi(n) > 0 && atoi(n) <= 8)
		device_count = atoi(n);
	for (int i = 0; i < 8; i++)
		primary_ctxs[i].device = i;
}

void emucu_window_init(void)
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
	if (m->kind == MAP_DEV && !m->host_pg)
		return (void *)(uintptr_t)d;
	return (void *)(m->host_pg + (d - m->dva));
}

static int in_window(uint64_t d)
{
	return window && d >= (uint64_t)(uintptr_t)window && d < (uint64_t)(uintptr_t)window + WINDOW_BYTES;
}

/* Any address for the copy engine: a device address is translated, an
 * address outside the window is host memory (unified addressing). */
void *emucu_xlate_any(uint64_t a, uint64_t len)
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
	int hostmapped = 0;
	void *p = NULL;
	if (window) {
		pthread_rwlock_rdlock(&pt_lock);
		p = xlate_locked(dptr, len, &hostmapped);
		pthread_rwlock_unlock(&pt_lock);
	}
	if (!p) {
		fprintf(stderr, "[emucuda] illegal address: %s of %zu bytes at device address 0x%llx\n", what, len,
			(unsigned long long)dptr);
		abort();
	}
	if (hostmapped && count_store)
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
	uintptr_t backing = 0;
	if (d && devmem_opaque) { /* the window stays PROT_NONE; the bytes live elsewhere */
		void *b = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		backing = b == MAP_FAILED ? 0 : (uintptr_t)b;
	}
	if (!d || (devmem_opaque ? !backing : mprotect((void *)(uintptr_t)d, sz, PROT_READ | PROT_WRITE) != 0)) {
		pthread_rwlock_unlock(&pt_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	maps[nmaps++] = (struct map){.dva = d, .size = sz, .kind = MAP_DEV, .host_pg = backing,
				     .device = current_ctx->device, .buffer_id = next_buffer_id++};
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
			if (maps[i].host_pg) {
				munmap((void *)maps[i].host_pg, maps[i].size);
			} else {
				madvise((void *)(uintptr_t)d, maps[i].size, MADV_DONTNEED);
				mprotect((void *)(uintptr_t)d, maps[i].size, PROT_NONE);
			}
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
	if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) && strict_iomemory)
		return CUDA_ERROR_INVALID_VALUE; /* not I/O memory (EMUCUDA_STRICT_IOMEMORY) */
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
				     .reg_ptr = (uintptr_t)p, .reg_size = size, .device = current_ctx->device,
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
	case 1: *(CUcontext *)data = &primary_ctxs[m->device]; break;
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
	NEED_OUT(data);
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

/* ---- dma-buf export ------------------------------------------------------------------ */
/* cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD): an fd
 * standing for [dptr, dptr + size) of one allocation (page-aligned, as the
 * driver requires).  The fd is a memfd of that size that does NOT alias the
 * memory -- as on an H200, where the dma-buf cannot be mmap'ed by the CPU
 * (errno 524) -- so an importer must reach the memory by its device address
 * (the emulated NIC does, dma.c). */
EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int type,
					      unsigned long long flags)
{
	NEED_CTX();
	if (!handle || !size || type != 1 /* DMA_BUF_FD */ || flags > 1 || (dptr & (PAGE - 1)) || (size & (PAGE - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_rdlock(&pt_lock);
	struct map *m = find_dev(dptr, size);
	int ok = m && m->kind == MAP_DEV;
	pthread_rwlock_unlock(&pt_lock);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = memfd_create("emucuda-dmabuf", MFD_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*(int *)handle = fd;
	return CUDA_SUCCESS;
}
