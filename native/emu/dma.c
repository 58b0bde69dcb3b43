/* The emulated NIC's DMA engine: every read and write the NIC makes of
 * registered memory (data buffers, SQ/RQ rings, CQ rings, doorbell records)
 * goes through here.
 *
 * Host memory is read and written directly.  GPU memory is not addressable
 * by a CPU thread on a real GPU machine (a cudaMalloc pointer faults when the
 * CPU dereferences it; NVSHMEM's dmabuf fd cannot be mmap'ed there either,
 * errno 524, reference real-libraries.md), so the NIC moves it with the CUDA
 * driver's copies: a registration (MR, dmabuf MR, DevX umem) whose address
 * cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) reports as device
 * memory is entered in a table of device ranges, keyed by the registered
 * address (the iova; the emulator's iova is the VA), and every access inside
 * such a range is a cuMemcpyHtoDAsync/cuMemcpyDtoHAsync on a non-blocking
 * stream of the NIC's own, then cuStreamSynchronize.  A non-blocking stream
 * never waits for the application's kernels on the legacy stream, so a
 * persistent kernel polling a CQ in GPU memory does not stall the NIC.
 *
 * The driver is the process's own libcuda.so.1: it is looked up with
 * dlopen(RTLD_NOLOAD) (a verbs program that never loaded CUDA has no device
 * memory, and the emulator does not load the driver into it) and its entry
 * points are taken with cuGetProcAddress, as cudart does.  On a GPU machine
 * that is the real driver; in CI it is the emulated one (native/emu/cuda),
 * whose EMUCUDA_DEVMEM=opaque mode keeps device memory out of the CPU's
 * reach like the real GPU, so that a direct access by the NIC faults.
 *
 * Atomics on GPU memory are read-modify-write copies made by the NIC thread:
 * atomic with respect to the NIC's other operations (one thread executes
 * them all), not with respect to the GPU's own atomics -- as on hardware,
 * where an HCA's atomics are atomic among the HCA's operations
 * (IBV_ATOMIC_HCA), not with the GPU's. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "emu_internal.h"

#define EMU_MAX_DEVMEM 256

/* ---- the CUDA driver ----------------------------------------------------------- */
typedef int (*cu_gpa2_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*cu_gpa1_fn)(const char *, void **, int, uint64_t);
static struct {
	int (*pointer_get_attribute)(void *data, int attr, uint64_t ptr);
	int (*ctx_set_current)(void *ctx);
	int (*ctx_get_current)(void **ctx);
	int (*stream_create)(void **stream, unsigned flags);
	int (*htod_async)(uint64_t dst, const void *src, size_t n, void *stream);
	int (*dtoh_async)(void *dst, uint64_t src, size_t n, void *stream);
	int (*stream_sync)(void *stream);
	int (*device_get)(int *dev, int ordinal);
	int (*primary_ctx_retain)(void **ctx, int dev);
	int loaded;       /* 1 resolved, -1 no driver in the process */
} cu;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;

/* cuda.h (CUDA 13.0 driver API) values */
enum { CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_MEMORYTYPE_DEVICE = 2,
       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
       CU_STREAM_NON_BLOCKING = 1 };

static void *cu_sym(void *h, const char *name, int version)
{
	void *fn = NULL;
	cu_gpa2_fn gpa2 = (cu_gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
	if (gpa2) {
		int status = 0;
		if (gpa2(name, &fn, 12000, 0, &status) == 0 && fn)
			return fn;
	}
	cu_gpa1_fn gpa1 = (cu_gpa1_fn)dlsym(h, "cuGetProcAddress");
	if (gpa1 && gpa1(name, &fn, version, 0) == 0 && fn)
		return fn;
	return NULL;
}

/* 1 when the process's CUDA driver is usable, else 0 (caller holds cu_lock). */
static int cu_load(void)
{
	if (cu.loaded)
		return cu.loaded > 0;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return 0; /* not loaded yet: no device memory so far; looked up again at the next registration */
	cu.pointer_get_attribute = cu_sym(h, "cuPointerGetAttribute", 4000);
	cu.ctx_set_current = cu_sym(h, "cuCtxSetCurrent", 4000);
	cu.ctx_get_current = cu_sym(h, "cuCtxGetCurrent", 4000);
	cu.stream_create = cu_sym(h, "cuStreamCreate", 2000);
	cu.htod_async = cu_sym(h, "cuMemcpyHtoDAsync", 3020);
	cu.dtoh_async = cu_sym(h, "cuMemcpyDtoHAsync", 3020);
	cu.stream_sync = cu_sym(h, "cuStreamSynchronize", 2000);
	cu.device_get = cu_sym(h, "cuDeviceGet", 2000);              /* optional: memory without a context */
	cu.primary_ctx_retain = cu_sym(h, "cuDevicePrimaryCtxRetain", 7000);
	cu.loaded = cu.pointer_get_attribute && cu.ctx_set_current && cu.ctx_get_current && cu.stream_create && cu.htod_async &&
		    cu.dtoh_async && cu.stream_sync ? 1 : -1;
	if (cu.loaded < 0)
		EMU_PRINT("sigmatrace-emu: libcuda.so.1 is loaded but lacks the entry points the NIC copies with: "
			  "GPU memory is treated as host memory");
	return cu.loaded > 0;
}

/* ---- the device ranges ------------------------------------------------------------ */
struct devmem {
	uint64_t base, len;
	void *ctx;        /* the CUDA context owning the memory */
	int refs;         /* registrations of exactly this range */
};
/* the NIC's stream in each context (created on first use, kept) */
static struct { void *ctx, *stream; } g_streams[16];
static struct devmem g_dev[EMU_MAX_DEVMEM];
static int g_ndev; /* read without the lock on the fast path */
static pthread_rwlock_t g_dev_lock = PTHREAD_RWLOCK_INITIALIZER;
static uint64_t g_dev_copies, g_dev_errors;
/* where the NIC's current GPU copy is (the watchdog's clue): 0 none, 1 queued, 2 waiting for its stream */
static volatile int g_dev_stage;
static volatile uint64_t g_dev_addr;

/* A registration of [addr, addr+len): 1 when it is GPU memory (entered in
 * the table), 0 when it is host memory, -1 when the table is full. */
EXPORT int emu_devmem_register(uint64_t addr, uint64_t len)
{
	if (!len)
		return 0;
	pthread_mutex_lock(&cu_lock);
	int have = cu_load();
	pthread_mutex_unlock(&cu_lock);
	if (!have)
		return 0;
	unsigned type = 0;
	if (cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) != 0 || type != CU_MEMORYTYPE_DEVICE)
		return 0;
	void *ctx = NULL;
	if (cu.pointer_get_attribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, addr) != 0)
		ctx = NULL;
	if (!ctx && cu.device_get && cu.primary_ctx_retain) {
		/* memory mapped with the virtual memory API (cuMemCreate/cuMemMap, as NVSHMEM's heap) belongs to no
		 * context: the NIC copies through the device's primary context */
		int ordinal = -1, dev = 0;
		if (cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr) != 0 ||
		    cu.device_get(&dev, ordinal) != 0 || cu.primary_ctx_retain(&ctx, dev) != 0)
			ctx = NULL;
	}
	pthread_rwlock_wrlock(&g_dev_lock);
	for (int i = 0; i < g_ndev; i++)
		if (g_dev[i].base == addr && g_dev[i].len == len) {
			g_dev[i].refs++;
			pthread_rwlock_unlock(&g_dev_lock);
			return 1;
		}
	if (g_ndev == EMU_MAX_DEVMEM) {
		pthread_rwlock_unlock(&g_dev_lock);
		return -1;
	}
	g_dev[g_ndev] = (struct devmem){ .base = addr, .len = len, .ctx = ctx, .refs = 1 };
	__atomic_store_n(&g_ndev, g_ndev + 1, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&g_dev_lock);
	EMU_LOG("GPU memory registered: 0x%llx + %llu (NIC copies through CUDA)", (unsigned long long)addr,
		(unsigned long long)len);
	return 1;
}

EXPORT void emu_devmem_unregister(uint64_t addr, uint64_t len)
{
	pthread_rwlock_wrlock(&g_dev_lock);
	for (int i = 0; i < g_ndev; i++)
		if (g_dev[i].base == addr && g_dev[i].len == len) {
			if (--g_dev[i].refs == 0) {
				g_dev[i] = g_dev[g_ndev - 1];
				__atomic_store_n(&g_ndev, g_ndev - 1, __ATOMIC_RELEASE);
			}
			break;
		}
	pthread_rwlock_unlock(&g_dev_lock);
}

/* The device range holding [a, a+n), or NULL (rdlock held). */
static struct devmem *dev_find(uint64_t a, size_t n)
{
	for (int i = 0; i < g_ndev; i++)
		if (a >= g_dev[i].base && a - g_dev[i].base < g_dev[i].len)
			return n <= g_dev[i].len - (a - g_dev[i].base) ? &g_dev[i] : NULL;
	return NULL;
}

EXPORT int emu_dma_is_device(uint64_t a, size_t n)
{
	if (!__atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE))
		return 0;
	pthread_rwlock_rdlock(&g_dev_lock);
	int r = dev_find(a, n ? n : 1) != NULL;
	pthread_rwlock_unlock(&g_dev_lock);
	return r;
}

/* The NIC's non-blocking stream in ctx (the context is current), or NULL. */
static void *nic_stream(void *ctx)
{
	void *s = NULL;
	pthread_mutex_lock(&cu_lock);
	int i = 0;
	for (; i < 16 && g_streams[i].ctx; i++)
		if (g_streams[i].ctx == ctx) {
			s = g_streams[i].stream;
			break;
		}
	if (!s && i < 16 && cu.stream_create(&s, CU_STREAM_NON_BLOCKING) == 0) {
		g_streams[i].ctx = ctx;
		g_streams[i].stream = s;
	}
	pthread_mutex_unlock(&cu_lock);
	return s;
}

/* One copy through CUDA in the memory's context (the calling thread's
 * current context is put back); 0 or -1. */
static int dev_copy(void *ctx, void *host, uint64_t dev, size_t n, int to_device)
{
	void *prev = NULL, *s;
	int r = -1, cr = -1;
	if (cu.ctx_get_current(&prev) != 0)
		prev = NULL;
	if (!ctx)
		ctx = prev; /* no context reported for the memory: the caller's */
	if (prev == ctx || cu.ctx_set_current(ctx) == 0) {
		g_dev_addr = dev;
		g_dev_stage = 1;
		if ((s = nic_stream(ctx)) &&
		    (cr = to_device ? cu.htod_async(dev, host, n, s) : cu.dtoh_async(host, dev, n, s)) == 0 &&
		    (g_dev_stage = 2, cr = cu.stream_sync(s)) == 0)
			r = 0;
		g_dev_stage = 0;
		if (prev != ctx)
			cu.ctx_set_current(prev);
	}
	if (r) {
		__atomic_fetch_add(&g_dev_errors, 1, __ATOMIC_RELAXED);
		EMU_ERR("DMA ERROR: CUDA copy of %zu bytes %s device address 0x%llx failed (context %p, CUresult %d)", n,
			to_device ? "to" : "from", (unsigned long long)dev, ctx, cr);
	} else {
		__atomic_fetch_add(&g_dev_copies, 1, __ATOMIC_RELAXED);
	}
	return r;
}

/* The context of the device range holding [a, a+n): 1 and *ctx, or 0 when
 * the range is host memory. */
static int dev_lookup(uint64_t a, size_t n, void **ctx)
{
	if (!__atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE))
		return 0;
	pthread_rwlock_rdlock(&g_dev_lock);
	struct devmem *d = dev_find(a, n);
	if (d)
		*ctx = d->ctx;
	pthread_rwlock_unlock(&g_dev_lock);
	return d != NULL;
}

/* Read n bytes at NIC address src into dst (host): 0, or -1 when a GPU copy failed. */
EXPORT int emu_dma_read(void *dst, uint64_t src, size_t n)
{
	void *ctx;
	if (!n)
		return 0;
	if (dev_lookup(src, n, &ctx))
		return dev_copy(ctx, dst, src, n, 0);
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return 0;
}

/* Write n bytes from src (host) at NIC address dst: 0, or -1 when a GPU copy failed. */
EXPORT int emu_dma_write(uint64_t dst, const void *src, size_t n)
{
	void *ctx;
	if (!n)
		return 0;
	if (dev_lookup(dst, n, &ctx))
		return dev_copy(ctx, (void *)src, dst, n, 1);
	memcpy((void *)(uintptr_t)dst, src, n);
	return 0;
}

/* A big-endian 32-bit counter (doorbell records): host memory is loaded
 * atomically, GPU memory copied. */
EXPORT uint32_t emu_dma_load_be32(const volatile uint32_t *p)
{
	uint64_t a = (uint64_t)(uintptr_t)p;
	if (emu_dma_is_device(a, 4)) {
		uint32_t v = 0;
		emu_dma_read(&v, a, 4);
		return be32toh(v);
	}
	return be32toh(__atomic_load_n(p, __ATOMIC_ACQUIRE));
}

/* GPU copies made and failed (SIGMATRACE_EMU_STATS dma_gpu_copies / dma_gpu_errors). */
EXPORT void emu_dma_counts(uint64_t *copies, uint64_t *errors)
{
	*copies = __atomic_load_n(&g_dev_copies, __ATOMIC_RELAXED);
	*errors = __atomic_load_n(&g_dev_errors, __ATOMIC_RELAXED);
}

/* The GPU copy in progress, for the watchdog: its stage (0 none) and device address. */
EXPORT int emu_dma_in_progress(uint64_t *addr)
{
	*addr = g_dev_addr;
	return g_dev_stage;
}
