/*
 * CUDA driver interception (F7, paper §IV-B).
 *
 * Three ways the application (or cudart, NCCL, NVSHMEM, ...) reaches the
 * driver, all covered:
 *   1. direct calls to libcuda's exported symbols -> our exported shims;
 *   2. dlsym/dlvsym(handle, "cu...")                -> the interposer's injection
 *      (hooks registered below);
 *   3. cuGetProcAddress / cuGetProcAddress_v2 (how cudart resolves every
 *      driver entry point) -> our wrappers of both, which swap the returned
 *      pointer for our wrapper of the same variant when the symbol is in our
 *      table, and return the real pointer untouched otherwise.
 * cuGetExportTable (private driver tables) is recorded and passed through.
 *
 * The wrapped entry points are listed in cuda_shims.def (X-macros); their
 * shims, real pointers and hook rows are generated from it, what each
 * records is a function here.
 *
 * No CUDA headers: the types and constants are declared in abi/cuda.h.
 */
#include <string.h>

#include "hijack/cudrv.h"
#include "hijack/hijack.h"
#include "interpose/interpose.h"

typedef st_CUresult CUresult;
typedef st_CUdeviceptr CUdeviceptr;

/* real entry points (set by dlsym injection, cuGetProcAddress, or lazily) */
#define ST_CUDA_SHIM(name, params, args, translate, prepare, call_args, record) static CUresult(*real_##name) params;
#define ST_CUDA_PASS(name, params, args, record) static CUresult(*real_##name) params;
#include "cuda_shims.def"

static uint64_t gpa_unwrapped; /* symbols we know but could not wrap (variant clash) */

/* the driver the program loaded (however it was loaded: interpose/resolve.c), else the one the
 * hijack opens */
#define RESOLVE(var, name)                                                       \
	do {                                                                     \
		if (unlikely(!(var))) {                                          \
			void *p_ = st_resolve_slot((void **)&(var), name);       \
			if (!p_ && st_cudrv())                                   \
				p_ = st_cudrv_sym(name);                         \
			__atomic_store_n((void **)&(var), p_, __ATOMIC_RELEASE); \
		}                                                                \
	} while (0)

static inline int on(void)
{
	return st_provider_on(ST_PROV_CUDA);
}

/* ---- what the shims record (the `record` column of cuda_shims.def) ---------- */
static void after_register(void *p, size_t size, unsigned flags, CUresult r)
{
	if (r == 0)
		st_hijack_on_register(p, size, flags);
	st_ensure_active();
	st_ev_ext(ST_EV_CU_MEM_HOST_REGISTER, (uint16_t)r, flags, (uint64_t)(uintptr_t)p, size, 0, 0, 0);
}

static void after_unregister(void *p, CUresult r)
{
	st_ensure_active();
	st_ev(ST_EV_CU_MEM_HOST_UNREGISTER, (uint16_t)r, 0, (uint64_t)(uintptr_t)p);
}

/* The hijack: the application gets a proxy device pointer for a doorbell
 * page (hijacked = 1); the event carries both. */
static void devptr_given(CUdeviceptr *devptr, void *p, CUresult r)
{
	int hijacked = 0;
	uint64_t real = (r == 0 && devptr) ? *devptr : 0, given = real;
	if (r == 0 && devptr) {
		given = st_hijack_devptr(p, real, &hijacked);
		*devptr = given;
	}
	st_ensure_active();
	st_ev_ext(ST_EV_CU_MEM_HOST_GET_DEVPTR, (uint16_t)hijacked, (uint32_t)r, (uint64_t)(uintptr_t)p, given, 0, 0, real);
}

static void devptr32_given(unsigned *devptr, void *p, CUresult r)
{
	st_ensure_active();
	st_ev_ext(ST_EV_CU_MEM_HOST_GET_DEVPTR, 0, (uint32_t)r, (uint64_t)(uintptr_t)p, (r == 0 && devptr) ? *devptr : 0, 0,
		  0, (r == 0 && devptr) ? *devptr : 0);
}

static void fix_attr(int attr, void *data, CUdeviceptr asked)
{
	if (attr == ST_CU_POINTER_ATTRIBUTE_DEVICE_POINTER && data)
		*(CUdeviceptr *)data = st_hijack_proxy_of_real(*(CUdeviceptr *)data);
	/* the host address of a proxied UAR is the one the application knows */
	if (attr == ST_CU_POINTER_ATTRIBUTE_HOST_POINTER && data)
		*(CUdeviceptr *)data = st_hijack_cpu_proxy_of_real(*(CUdeviceptr *)data);
}

/* How many bytes the driver writes for a pointer attribute (cuda.h, CUDA 13.0,
 * CUpointer_attribute and cuPointerGetAttribute's documentation): CONTEXT (1,
 * CUcontext), DEVICE_POINTER (3, CUdeviceptr), HOST_POINTER (4, void *),
 * BUFFER_ID (7, unsigned long long), RANGE_START_ADDR (11), RANGE_SIZE (12),
 * MEMPOOL_HANDLE (17, CUmemoryPool), MAPPING_SIZE (18), MAPPING_BASE_ADDR
 * (19), MEMORY_BLOCK_ID (20): 8; P2P_TOKENS (5): a struct whose first member
 * is the 8-byte p2pToken (the 4-byte vaSpaceToken follows); the others are
 * int, unsigned int, an enum or a boolean: 4.  ALLOWED_HANDLE_TYPES (14) has
 * no documented type: 4 bytes are read (the bitmask fits; reading 8 could
 * run past a 4-byte variable).  Unknown (newer) attributes: 4, never more. */
static size_t attr_bytes(int attr)
{
	switch (attr) {
	case 1: case 3: case 4: case 5: case 7: case 11: case 12: case 17: case 18: case 19: case 20:
		return 8;
	default:
		return 4;
	}
}

static uint64_t attr_value(const void *data, int attr)
{
	uint64_t v = 0;
	if (data)
		memcpy(&v, data, attr_bytes(attr));
	return v;
}

static void attribute_read(void *data, int attr, CUdeviceptr ptr, CUresult r)
{
	if (r == 0)
		fix_attr(attr, data, ptr);
	if (st_full()) {
		st_ensure_active();
		uint64_t v = r == 0 ? attr_value(data, attr) : 0;
		st_ev_ext(ST_EV_CU_POINTER_GET_ATTRIBUTE, (uint16_t)r, (uint32_t)attr, ptr, v, 0, 0, 0);
	}
}

static void attributes_read(unsigned n, int *attrs, void **data, CUdeviceptr ptr, CUresult r)
{
	if (r == 0 && attrs && data)
		for (unsigned i = 0; i < n; i++)
			fix_attr(attrs[i], data[i], ptr);
	if (st_full()) {
		st_ensure_active();
		for (unsigned i = 0; attrs && i < n; i++) {
			uint64_t v = r == 0 && data ? attr_value(data[i], attrs[i]) : 0;
			st_ev_ext(ST_EV_CU_POINTER_GET_ATTRIBUTE, (uint16_t)r, (uint32_t)attrs[i], ptr, v, 0, 0, 0);
		}
	}
}

static void export_table_got(const void *uuid, CUresult r)
{
	if (on() && !st_tls_depth) {
		st_ensure_active();
		uint64_t id = uuid ? st_side_add(ST_SIDE_BLOB, uuid, 16, NULL, 0, NULL, 0) : 0;
		st_ev(ST_EV_CU_GET_EXPORT_TABLE, (uint16_t)r, 0, id);
	}
}

/* ---- cuGetProcAddress ------------------------------------------------------------ */
#define ST_CUDA_SHIM(name, params, args, translate, prepare, call_args, record) CUresult name params;
#define ST_CUDA_PASS(name, params, args, record) CUresult name params;
#include "cuda_shims.def"

/* Claim a variant slot for the pointer the driver returned; our wrapper of
 * that variant then calls exactly that pointer.  A pointer that differs from
 * the one the slot already holds is returned unwrapped (and counted). */
static void *claim(void **slot, void *real, void *wrapper)
{
	void *expected = NULL;
	if (real == wrapper)
		return wrapper;
	if (__atomic_compare_exchange_n(slot, &expected, real, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) || expected == real)
		return wrapper;
	__atomic_fetch_add(&gpa_unwrapped, 1, __ATOMIC_RELAXED);
	return real;
}

static int is(const char *a, const char *b)
{
	return a[0] == b[0] && !strcmp(a, b);
}

/* Our wrapper for symbol `sym` as resolved for CUDA version `ver`, given the
 * real pointer the driver returned; NULL when the symbol is not ours. */
static void *wrap_for(const char *sym, void *real, int ver)
{
	if (sym[0] != 'c' || sym[1] != 'u')
		return NULL;
	if (is(sym, "cuMemHostRegister") || is(sym, "cuMemHostRegister_v2")) {
		void *v1 = st_cudrv_sym("cuMemHostRegister"), *v2 = st_cudrv_sym("cuMemHostRegister_v2");
		int use_v2 = real == v2 ? 1 : real == v1 ? 0 : (ver >= 6050 || sym[17] == '_');
		return use_v2 ? claim((void **)&real_cuMemHostRegister_v2, real, (void *)cuMemHostRegister_v2)
			      : claim((void **)&real_cuMemHostRegister, real, (void *)cuMemHostRegister);
	}
	if (is(sym, "cuMemHostGetDevicePointer") || is(sym, "cuMemHostGetDevicePointer_v2")) {
		void *v1 = st_cudrv_sym("cuMemHostGetDevicePointer"), *v2 = st_cudrv_sym("cuMemHostGetDevicePointer_v2");
		int use_v2 = real == v2 ? 1 : real == v1 ? 0 : (ver >= 3020 || sym[25] == '_');
		return use_v2 ? claim((void **)&real_cuMemHostGetDevicePointer_v2, real, (void *)cuMemHostGetDevicePointer_v2)
			      : claim((void **)&real_cuMemHostGetDevicePointer, real, (void *)cuMemHostGetDevicePointer);
	}
	if (is(sym, "cuMemHostUnregister"))
		return claim((void **)&real_cuMemHostUnregister, real, (void *)cuMemHostUnregister);
	if (is(sym, "cuPointerGetAttribute"))
		return claim((void **)&real_cuPointerGetAttribute, real, (void *)cuPointerGetAttribute);
	if (is(sym, "cuPointerGetAttributes"))
		return claim((void **)&real_cuPointerGetAttributes, real, (void *)cuPointerGetAttributes);
	if (is(sym, "cuGetExportTable"))
		return claim((void **)&real_cuGetExportTable, real, (void *)cuGetExportTable);
	if (is(sym, "cuGetProcAddress") || is(sym, "cuGetProcAddress_v2")) {
		void *v1 = st_cudrv_sym("cuGetProcAddress"), *v2 = st_cudrv_sym("cuGetProcAddress_v2");
		int use_v2 = real == v2 ? 1 : real == v1 ? 0 : (ver >= 12000 || sym[16] == '_');
		return use_v2 ? claim((void **)&real_cuGetProcAddress_v2, real, (void *)cuGetProcAddress_v2)
			      : claim((void **)&real_cuGetProcAddress, real, (void *)cuGetProcAddress);
	}
	return NULL;
}

static void after_gpa(const char *sym, void **pfn, int ver, uint64_t flags, CUresult r)
{
	if (r != 0 || !pfn || !*pfn || !sym || !on())
		return;
	void *w = wrap_for(sym, *pfn, ver);
	int wrapped = w && w != *pfn;
	if (w)
		*pfn = w;
	if (wrapped || st_full()) {
		st_ensure_active();
		uint64_t id = st_side_add(ST_SIDE_STRING, sym, strlen(sym), NULL, 0, NULL, 0);
		st_ev_ext(ST_EV_CU_GET_PROC_ADDRESS, (uint16_t)wrapped, (uint32_t)ver, id, flags, 0, 0, 0);
	}
}

/* ---- the shims of cuda_shims.def ---------------------------------------------------- */
#define ST_CUDA_SHIM(name, params, args, translate, prepare, call_args, record) \
	ST_EXPORT CUresult name params                                          \
	{                                                                       \
		RESOLVE(real_##name, #name);                                    \
		if (!real_##name)                                               \
			return ST_CUDA_ERROR_NOT_INITIALIZED;                      \
		translate;                                                      \
		if (!on() || st_tls_depth)                                      \
			return real_##name args;                                \
		prepare;                                                        \
		st_enter();                                                     \
		CUresult ret = real_##name call_args;                           \
		st_leave();                                                     \
		record;                                                         \
		return ret;                                                     \
	}
#define ST_CUDA_PASS(name, params, args, record)               \
	ST_EXPORT CUresult name params                         \
	{                                                      \
		RESOLVE(real_##name, #name);                   \
		if (!real_##name)                              \
			return ST_CUDA_ERROR_NOT_INITIALIZED;     \
		CUresult ret = real_##name args;               \
		record;                                        \
		return ret;                                    \
	}
#include "cuda_shims.def"

/* ---- dlsym / dlvsym injection ------------------------------------------------------ */
static const struct st_hook hooks[] = {
#define ST_CUDA_SHIM(name, params, args, translate, prepare, call_args, record) \
	{#name, (void *)name, (void **)&real_##name, ST_PROV_CUDA},
#define ST_CUDA_PASS(name, params, args, record) {#name, (void *)name, (void **)&real_##name, ST_PROV_CUDA},
#include "cuda_shims.def"
};

ST_HOOKS_CONSTRUCTOR(150, hooks)
