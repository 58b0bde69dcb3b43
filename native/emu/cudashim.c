/* libsigmatrace_emu_cudashim.so -- test-only, opt-in (LD_PRELOAD it
 * explicitly; nothing loads it by default): lets a library map the emulated
 * HCA's UAR pages into the GPU the way it maps a real NIC's doorbell BAR.
 *
 * NVSHMEM's GPU NIC handler (and DOCA GPUNetIO) register the UAR with
 *   cudaHostRegister(uar->reg_addr, size, Portable | Mapped | IoMemory)
 * then cudaHostGetDevicePointer (NVSHMEM 3.4.5 ibgda.cpp ibgda_nic_mem_gpu_map).
 * A real UAR is MMIO, an emulated one ordinary RAM, which the real driver
 * refuses as I/O memory (an H200: error 1, CUDA_ERROR_INVALID_VALUE; it
 * accepts the same pages without the flag, reference real-libraries.md).
 * This shim wraps cuMemHostRegister / cuMemHostRegister_v2 and passes an
 * IoMemory registration on without CU_MEMHOSTREGISTER_IOMEMORY when
 *   uar  the range lies inside an emulated UAR page -- it asks the emulator,
 *        emu_uar_contains() exported by the emulated libibverbs.so.1; or
 *   ram  the emulator is in the process and the range is ordinary memory (its
 *        /proc/self/maps entry is not a device file: anonymous, heap, a
 *        regular file, /dev/shm, /dev/zero).  That covers what the sigmatrace
 *        tracer does by default: it hands the application a CPU proxy page
 *        for each UAR's reg_addr (native/src/hijack/cpu_doorbell.c) and
 *        registers the real UAR itself, from the driver it resolved on its
 *        own; the shim only ever sees the proxy page.  With the emulated HCA
 *        in the process no IoMemory registration can be a real NIC's BAR, and
 *        RAM is never I/O memory, so the driver would refuse every such call.
 *        SIGMATRACE_EMU_CUDASHIM=uar keeps to the first rule.
 * Every other call, and every call in a process without the emulator, is
 * passed on unchanged.
 *
 * cudart reaches the driver with dlopen("libcuda.so.1") + dlsym(handle,
 * "cuGetProcAddress_v2") + cuGetProcAddress for every entry point, so the
 * shim covers all three ways in:
 *   - the exported cuMemHostRegister(_v2) symbols (a program linked with -lcuda);
 *   - cuGetProcAddress / cuGetProcAddress_v2, whose result for
 *     "cuMemHostRegister" is swapped for the wrapper of that ABI variant
 *     (v1 below CUDA 6.5, _v2 from it);
 *   - dlsym (dlsym on a handle does not see an LD_PRELOAD'ed definition), for
 *     those four names; every other name is a tail call to the next dlsym,
 *     so RTLD_NEXT keeps meaning "after the caller".
 * With the sigmatrace tracer also preloaded, list this shim FIRST: the
 * tracer's own dlsym resolves handles directly, so a shim after it would not
 * be seen.  The tracer then sees the registration without IOMEMORY; it knows
 * the page as a UAR (or its proxy) from mlx5dv_devx_alloc_uar anyway.
 *
 * SIGMATRACE_EMU_DEBUG (any value) prints one line per IoMemory registration
 * (rewritten or why not); 3 also every cu* name looked up through dlsym. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define IOMEMORY 0x04u /* CU_MEMHOSTREGISTER_IOMEMORY == cudaHostRegisterIoMemory */

typedef int CUresult;
typedef CUresult (*reg_v1_fn)(void *, unsigned, unsigned);
typedef CUresult (*reg_v2_fn)(void *, size_t, unsigned);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, uint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn next_dlsym;
static reg_v1_fn real_reg_v1;
static reg_v2_fn real_reg_v2;
static gpa_v1_fn real_gpa_v1;
static gpa_v2_fn real_gpa_v2;
static int (*uar_contains)(const void *, size_t);
static unsigned long rewrites, rewrites_ram;

/* Whether [p, p + size) is ordinary memory: every /proc/self/maps entry it
 * touches is anonymous or a file that is not a device (a character device
 * mapping under /dev or /sys is MMIO; /dev/shm and /dev/zero are RAM). */
static int is_ram(void *p, size_t size)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return 0;
	uintptr_t a = (uintptr_t)p, e = a + size;
	char line[512];
	int covered = 0, ram = 1;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		int path_at = 0;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &path_at) < 2)
			continue;
		if (hi <= a || lo >= e)
			continue;
		covered = 1;
		const char *path = path_at ? line + path_at : "";
		if ((!strncmp(path, "/dev/", 5) && strncmp(path, "/dev/shm/", 9) && strncmp(path, "/dev/zero", 9)) ||
		    !strncmp(path, "/sys/", 5))
			ram = 0;
	}
	fclose(f);
	return covered && ram;
}

static void init_next_dlsym(void)
{
	if (__atomic_load_n(&next_dlsym, __ATOMIC_ACQUIRE))
		return;
	dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!f)
		f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	__atomic_store_n(&next_dlsym, f, __ATOMIC_RELEASE);
}

/* Keep the first real pointer seen for a slot. */
static void keep(void **slot, void *real)
{
	void *expected = NULL;
	if (real)
		__atomic_compare_exchange_n(slot, &expected, real, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* The flags to pass on for a registration of [p, p + size). */
static unsigned fix_flags(void *p, size_t size, unsigned flags)
{
	if (!(flags & IOMEMORY))
		return flags;
	if (!uar_contains) {
		init_next_dlsym();
		void *verbs = NULL;
		if (next_dlsym)
			uar_contains = (int (*)(const void *, size_t))next_dlsym(RTLD_DEFAULT, "emu_uar_contains");
		/* NVSHMEM's transport opens libibverbs.so.1 RTLD_LOCAL: RTLD_DEFAULT
		 * does not see it, the library's own handle does */
		if (!uar_contains && next_dlsym && (verbs = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD))) {
			uar_contains = (int (*)(const void *, size_t))next_dlsym(verbs, "emu_uar_contains");
			dlclose(verbs); /* NOLOAD took a reference; the library stays loaded by its opener */
		}
	}
	if (!uar_contains) {
		if (getenv("SIGMATRACE_EMU_DEBUG"))
			fprintf(stderr, "[st-emu-cudashim %d] cuMemHostRegister(%p, %zu, 0x%x): no emulated HCA found, "
				"passed on unchanged\n", (int)getpid(), p, size, flags);
		return flags; /* no emulated HCA in this process */
	}
	const char *mode = getenv("SIGMATRACE_EMU_CUDASHIM");
	int uar = uar_contains(p, size);
	int ram = !uar && !(mode && !strcmp(mode, "uar")) && is_ram(p, size);
	if (!uar && !ram) {
		if (getenv("SIGMATRACE_EMU_DEBUG"))
			fprintf(stderr, "[st-emu-cudashim %d] cuMemHostRegister(%p, %zu, 0x%x): neither an emulated UAR nor "
				"ordinary memory, passed on unchanged\n", (int)getpid(), p, size, flags);
		return flags;
	}
	__atomic_fetch_add(uar ? &rewrites : &rewrites_ram, 1, __ATOMIC_RELAXED);
	if (getenv("SIGMATRACE_EMU_DEBUG"))
		fprintf(stderr, "[st-emu-cudashim %d] cuMemHostRegister(%p, %zu, 0x%x): %s, registered without IOMEMORY\n",
			(int)getpid(), p, size, flags, uar ? "an emulated UAR" : "ordinary memory (emulated HCA)");
	return flags & ~IOMEMORY;
}

/* ---- the wrappers -------------------------------------------------------------- */
static CUresult shim_reg_v2(void *p, size_t size, unsigned flags)
{
	if (!real_reg_v2) {
		init_next_dlsym();
		keep((void **)&real_reg_v2, next_dlsym ? next_dlsym(RTLD_NEXT, "cuMemHostRegister_v2") : NULL);
		if (!real_reg_v2)
			return 3; /* CUDA_ERROR_NOT_INITIALIZED: no driver below */
	}
	return real_reg_v2(p, size, fix_flags(p, size, flags));
}

static CUresult shim_reg_v1(void *p, unsigned size, unsigned flags)
{
	if (!real_reg_v1) {
		init_next_dlsym();
		keep((void **)&real_reg_v1, next_dlsym ? next_dlsym(RTLD_NEXT, "cuMemHostRegister") : NULL);
		if (!real_reg_v1)
			return 3;
	}
	return real_reg_v1(p, size, fix_flags(p, size, flags));
}

/* A driver entry point just resolved for `sym` at CUDA version `ver`: our
 * wrapper in its place where it is one we wrap. */
static void swap_result(const char *sym, int ver, void **pfn);

/* SIGMATRACE_EMU_DEBUG=3: every cu* name looked up, to find the way a library reaches the driver. */
static int debug_names(void)
{
	const char *d = getenv("SIGMATRACE_EMU_DEBUG");
	return d && atoi(d) >= 3;
}

static CUresult shim_gpa_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status)
{
	if (sym && debug_names() && strstr(sym, "HostRegister"))
		fprintf(stderr, "[st-emu-cudashim %d] cuGetProcAddress_v2(%s, %d)\n", (int)getpid(), sym, ver);
	if (!real_gpa_v2)
		return 500; /* CUDA_ERROR_NOT_FOUND */
	CUresult r = real_gpa_v2(sym, pfn, ver, flags, status);
	if (r == 0)
		swap_result(sym, ver, pfn);
	return r;
}

static CUresult shim_gpa_v1(const char *sym, void **pfn, int ver, uint64_t flags)
{
	if (!real_gpa_v1)
		return 500;
	CUresult r = real_gpa_v1(sym, pfn, ver, flags);
	if (r == 0)
		swap_result(sym, ver, pfn);
	return r;
}

static void swap_result(const char *sym, int ver, void **pfn)
{
	if (!sym || !pfn || !*pfn)
		return;
	if (!strcmp(sym, "cuMemHostRegister")) {
		if (ver >= 6050) {
			if (*pfn != (void *)shim_reg_v2) {
				keep((void **)&real_reg_v2, *pfn);
				*pfn = (void *)shim_reg_v2;
			}
		} else if (*pfn != (void *)shim_reg_v1) {
			keep((void **)&real_reg_v1, *pfn);
			*pfn = (void *)shim_reg_v1;
		}
	} else if (!strcmp(sym, "cuGetProcAddress")) {
		if (ver >= 12000 && *pfn != (void *)shim_gpa_v2) {
			keep((void **)&real_gpa_v2, *pfn);
			*pfn = (void *)shim_gpa_v2;
		} else if (ver < 12000 && *pfn != (void *)shim_gpa_v1) {
			keep((void **)&real_gpa_v1, *pfn);
			*pfn = (void *)shim_gpa_v1;
		}
	}
}

/* ---- the exported symbols --------------------------------------------------------- */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) { return shim_reg_v2(p, size, flags); }
EXPORT CUresult cuMemHostRegister(void *p, unsigned size, unsigned flags) { return shim_reg_v1(p, size, flags); }

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status)
{
	if (!real_gpa_v2) {
		init_next_dlsym();
		keep((void **)&real_gpa_v2, next_dlsym ? next_dlsym(RTLD_NEXT, "cuGetProcAddress_v2") : NULL);
	}
	return shim_gpa_v2(sym, pfn, ver, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags)
{
	if (!real_gpa_v1) {
		init_next_dlsym();
		keep((void **)&real_gpa_v1, next_dlsym ? next_dlsym(RTLD_NEXT, "cuGetProcAddress") : NULL);
	}
	return shim_gpa_v1(sym, pfn, ver, flags);
}

/* A program or library linked with the shared libcudart reaches the driver
 * from inside libcudart, whichever way; wrapping the runtime's entry point as
 * well covers a libcudart that binds its driver calls so that none of the
 * ways above sees them.  (A statically linked cudart is covered only by
 * those.)  cudaHostRegisterIoMemory has the driver flag's value. */
EXPORT int cudaHostRegister(void *p, size_t size, unsigned flags)
{
	static int (*real)(void *, size_t, unsigned);
	if (!real) {
		init_next_dlsym();
		keep((void **)&real, next_dlsym ? next_dlsym(RTLD_NEXT, "cudaHostRegister") : NULL);
		if (!real)
			return 3; /* cudaErrorInitializationError: no runtime below */
	}
	return real(p, size, fix_flags(p, size, flags));
}

/* How many registrations were rewritten (tests): of emulated UARs, of other RAM. */
EXPORT unsigned long sigmatrace_emu_cudashim_rewrites(void) { return __atomic_load_n(&rewrites, __ATOMIC_RELAXED); }
EXPORT unsigned long sigmatrace_emu_cudashim_rewrites_ram(void) { return __atomic_load_n(&rewrites_ram, __ATOMIC_RELAXED); }

static void *wrap_name(const char *name, void *real)
{
	if (!real)
		return NULL;
	if (!strcmp(name, "cuMemHostRegister_v2")) {
		keep((void **)&real_reg_v2, real);
		return (void *)shim_reg_v2;
	}
	if (!strcmp(name, "cuMemHostRegister")) {
		keep((void **)&real_reg_v1, real);
		return (void *)shim_reg_v1;
	}
	if (!strcmp(name, "cuGetProcAddress_v2")) {
		keep((void **)&real_gpa_v2, real);
		return (void *)shim_gpa_v2;
	}
	keep((void **)&real_gpa_v1, real);
	return (void *)shim_gpa_v1;
}

static int wrapped_name(const char *n)
{
	return n && n[0] == 'c' && n[1] == 'u' &&
	       (!strcmp(n, "cuMemHostRegister") || !strcmp(n, "cuMemHostRegister_v2") || !strcmp(n, "cuGetProcAddress") ||
		!strcmp(n, "cuGetProcAddress_v2"));
}

EXPORT void *dlsym(void *handle, const char *name)
{
	init_next_dlsym();
	if (name[0] == 'c' && name[1] == 'u' && debug_names())
		fprintf(stderr, "[st-emu-cudashim %d] dlsym(%p, %s)\n", (int)getpid(), handle, name);
	if (wrapped_name(name) && handle != RTLD_NEXT) {
		void *real = next_dlsym(handle, name);
		/* RTLD_DEFAULT finds our own exports: those are the wrappers already */
		if (real == (void *)cuMemHostRegister_v2 || real == (void *)cuMemHostRegister ||
		    real == (void *)cuGetProcAddress_v2 || real == (void *)cuGetProcAddress)
			return real;
		return wrap_name(name, real);
	}
	return next_dlsym(handle, name); /* a tail call: the caller's RTLD_NEXT stays the caller's */
}
