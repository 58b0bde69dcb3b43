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
 * No CUDA headers: the types and constants live in hijack/cudrv.h.
 */
#include <string.h>

#include "hijack/cudrv.h"
#include "hijack/hijack.h"
#include "interpose/interpose.h"

typedef st_CUresult CUresult;
typedef st_CUdeviceptr CUdeviceptr;

/* real entry points (set by dlsym injection, cuGetProcAddress, or lazily) */
static CUresult (*real_reg_v1)(void *, unsigned, unsigned);
static CUresult (*real_reg_v2)(void *, size_t, unsigned);
static CUresult (*real_unreg)(void *);
static CUresult (*real_gdp_v1)(unsigned *, void *, unsigned);
static CUresult (*real_gdp_v2)(CUdeviceptr *, void *, unsigned);
static CUresult (*real_pga)(void *, int, CUdeviceptr);
static CUresult (*real_pgas)(unsigned, int *, void **, CUdeviceptr);
static CUresult (*real_gpa_v1)(const char *, void **, int, uint64_t);
static CUresult (*real_gpa_v2)(const char *, void **, int, uint64_t, int *);
static CUresult (*real_get)(const void **, const void *);

static uint64_t gpa_unwrapped; /* symbols we know but could not wrap (variant clash) */

#define CUDA_ERROR_NOT_INITIALIZED 3
#define RESOLVE(var, name)                                                    \
	do {                                                                  \
		if (unlikely(!(var))) {                                       \
			void *p_ = st_cudrv() ? st_cudrv_sym(name) : NULL;    \
			__atomic_store_n((void **)&(var), p_, __ATOMIC_RELEASE); \
		}                                                             \
	} while (0)

static inline int on(void)
{
	return st_provider_on(ST_PROV_CUDA);
}

/* ---- host registration ------------------------------------------------------- */
static void after_register(void *p, size_t size, unsigned flags, CUresult r)
{
	if (r == 0)
		st_hijack_on_register(p, size, flags);
	st_ensure_active();
	st_ev_ext(ST_EV_CU_MEM_HOST_REGISTER, (uint16_t)r, flags, (uint64_t)(uintptr_t)p, size, 0, 0, 0);
}

ST_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags)
{
	RESOLVE(real_reg_v2, "cuMemHostRegister_v2");
	if (!real_reg_v2)
		return CUDA_ERROR_NOT_INITIALIZED;
	p = st_hijack_cpu_real(p); /* a CPU-doorbell proxy stands for the real UAR (F24d) */
	if (!on() || st_tls_depth)
		return real_reg_v2(p, size, flags);
	st_enter();
	CUresult r = real_reg_v2(p, size, flags);
	st_leave();
	after_register(p, size, flags, r);
	return r;
}

ST_EXPORT CUresult cuMemHostRegister(void *p, unsigned size, unsigned flags)
{
	RESOLVE(real_reg_v1, "cuMemHostRegister");
	if (!real_reg_v1)
		return CUDA_ERROR_NOT_INITIALIZED;
	p = st_hijack_cpu_real(p);
	if (!on() || st_tls_depth)
		return real_reg_v1(p, size, flags);
	st_enter();
	CUresult r = real_reg_v1(p, size, flags);
	st_leave();
	after_register(p, size, flags, r);
	return r;
}

ST_EXPORT CUresult cuMemHostUnregister(void *p)
{
	RESOLVE(real_unreg, "cuMemHostUnregister");
	if (!real_unreg)
		return CUDA_ERROR_NOT_INITIALIZED;
	p = st_hijack_cpu_real(p);
	if (!on() || st_tls_depth)
		return real_unreg(p);
	/* pollers of doorbells in this range stop first (they forward what they hold) */
	st_hijack_on_unregister(p);
	st_enter();
	CUresult r = real_unreg(p);
	st_leave();
	st_ensure_active();
	st_ev(ST_EV_CU_MEM_HOST_UNREGISTER, (uint16_t)r, 0, (uint64_t)(uintptr_t)p);
	return r;
}

/* ---- device pointers of host memory: where the hijack happens ------------------ */
ST_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pd, void *p, unsigned flags)
{
	RESOLVE(real_gdp_v2, "cuMemHostGetDevicePointer_v2");
	if (!real_gdp_v2)
		return CUDA_ERROR_NOT_INITIALIZED;
	p = st_hijack_cpu_real(p);
	if (!on() || st_tls_depth)
		return real_gdp_v2(pd, p, flags);
	st_enter();
	CUresult r = real_gdp_v2(pd, p, flags);
	st_leave();
	int hij = 0;
	uint64_t real = (r == 0 && pd) ? *pd : 0, given = real;
	if (r == 0 && pd) {
		given = st_hijack_devptr(p, real, &hij);
		*pd = given;
	}
	st_ensure_active();
	st_ev_ext(ST_EV_CU_MEM_HOST_GET_DEVPTR, (uint16_t)hij, (uint32_t)r, (uint64_t)(uintptr_t)p, given, 0, 0, real);
	return r;
}

/* 32-bit CUdeviceptr ABI (CUDA < 3.2): a proxy pointer would not fit; recorded, not hijacked. */
ST_EXPORT CUresult cuMemHostGetDevicePointer(unsigned *pd, void *p, unsigned flags)
{
	RESOLVE(real_gdp_v1, "cuMemHostGetDevicePointer");
	if (!real_gdp_v1)
		return CUDA_ERROR_NOT_INITIALIZED;
	p = st_hijack_cpu_real(p);
	if (!on() || st_tls_depth)
		return real_gdp_v1(pd, p, flags);
	st_enter();
	CUresult r = real_gdp_v1(pd, p, flags);
	st_leave();
	st_ensure_active();
	st_ev_ext(ST_EV_CU_MEM_HOST_GET_DEVPTR, 0, (uint32_t)r, (uint64_t)(uintptr_t)p, (r == 0 && pd) ? *pd : 0, 0, 0,
		  (r == 0 && pd) ? *pd : 0);
	return r;
}

/* ---- pointer attributes: residency queries, kept consistent with the proxy ---- */
static void fix_attr(int attr, void *data, CUdeviceptr asked)
{
	if (attr == ST_CU_POINTER_ATTRIBUTE_DEVICE_POINTER && data)
		*(CUdeviceptr *)data = st_hijack_proxy_of_real(*(CUdeviceptr *)data);
	/* the host address of a proxied UAR is the one the application knows */
	if (attr == ST_CU_POINTER_ATTRIBUTE_HOST_POINTER && data)
		*(CUdeviceptr *)data = st_hijack_cpu_proxy_of_real(*(CUdeviceptr *)data);
}

ST_EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr)
{
	RESOLVE(real_pga, "cuPointerGetAttribute");
	if (!real_pga)
		return CUDA_ERROR_NOT_INITIALIZED;
	ptr = (CUdeviceptr)(uintptr_t)st_hijack_cpu_real((void *)(uintptr_t)ptr); /* UVA: a host pointer in a proxy */
	if (!on() || st_tls_depth)
		return real_pga(data, attr, ptr);
	CUdeviceptr q = st_hijack_real_of_proxy(ptr); /* a proxy pointer answers as the doorbell it stands for */
	st_enter();
	CUresult r = real_pga(data, attr, q);
	st_leave();
	if (r == 0)
		fix_attr(attr, data, ptr);
	if (st_full()) {
		st_ensure_active();
		uint64_t v = 0;
		if (r == 0 && data)
			memcpy(&v, data, attr == 1 || attr == 3 || attr == 4 || attr == 7 || attr == 11 || attr == 12 ? 8 : 4);
		st_ev_ext(ST_EV_CU_POINTER_GET_ATTRIBUTE, (uint16_t)r, (uint32_t)attr, ptr, v, 0, 0, 0);
	}
	return r;
}

ST_EXPORT CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr)
{
	RESOLVE(real_pgas, "cuPointerGetAttributes");
	if (!real_pgas)
		return CUDA_ERROR_NOT_INITIALIZED;
	ptr = (CUdeviceptr)(uintptr_t)st_hijack_cpu_real((void *)(uintptr_t)ptr);
	if (!on() || st_tls_depth)
		return real_pgas(n, attrs, data, ptr);
	CUdeviceptr q = st_hijack_real_of_proxy(ptr);
	st_enter();
	CUresult r = real_pgas(n, attrs, data, q);
	st_leave();
	if (r == 0 && attrs && data)
		for (unsigned i = 0; i < n; i++)
			fix_attr(attrs[i], data[i], ptr);
	if (st_full()) {
		st_ensure_active();
		for (unsigned i = 0; attrs && i < n; i++)
			st_ev_ext(ST_EV_CU_POINTER_GET_ATTRIBUTE, (uint16_t)r, (uint32_t)attrs[i], ptr, 0, 0, 0, 0);
	}
	return r;
}

/* ---- cuGetExportTable ------------------------------------------------------------ */
ST_EXPORT CUresult cuGetExportTable(const void **table, const void *uuid)
{
	RESOLVE(real_get, "cuGetExportTable");
	if (!real_get)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult r = real_get(table, uuid);
	if (on() && !st_tls_depth) {
		st_ensure_active();
		uint64_t id = uuid ? st_side_add(ST_SIDE_BLOB, uuid, 16, NULL, 0, NULL, 0) : 0;
		st_ev(ST_EV_CU_GET_EXPORT_TABLE, (uint16_t)r, 0, id);
	}
	return r;
}

/* ---- cuGetProcAddress ------------------------------------------------------------ */
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags);
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status);

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
		return use_v2 ? claim((void **)&real_reg_v2, real, (void *)cuMemHostRegister_v2)
			      : claim((void **)&real_reg_v1, real, (void *)cuMemHostRegister);
	}
	if (is(sym, "cuMemHostGetDevicePointer") || is(sym, "cuMemHostGetDevicePointer_v2")) {
		void *v1 = st_cudrv_sym("cuMemHostGetDevicePointer"), *v2 = st_cudrv_sym("cuMemHostGetDevicePointer_v2");
		int use_v2 = real == v2 ? 1 : real == v1 ? 0 : (ver >= 3020 || sym[25] == '_');
		return use_v2 ? claim((void **)&real_gdp_v2, real, (void *)cuMemHostGetDevicePointer_v2)
			      : claim((void **)&real_gdp_v1, real, (void *)cuMemHostGetDevicePointer);
	}
	if (is(sym, "cuMemHostUnregister"))
		return claim((void **)&real_unreg, real, (void *)cuMemHostUnregister);
	if (is(sym, "cuPointerGetAttribute"))
		return claim((void **)&real_pga, real, (void *)cuPointerGetAttribute);
	if (is(sym, "cuPointerGetAttributes"))
		return claim((void **)&real_pgas, real, (void *)cuPointerGetAttributes);
	if (is(sym, "cuGetExportTable"))
		return claim((void **)&real_get, real, (void *)cuGetExportTable);
	if (is(sym, "cuGetProcAddress") || is(sym, "cuGetProcAddress_v2")) {
		void *v1 = st_cudrv_sym("cuGetProcAddress"), *v2 = st_cudrv_sym("cuGetProcAddress_v2");
		int use_v2 = real == v2 ? 1 : real == v1 ? 0 : (ver >= 12000 || sym[16] == '_');
		return use_v2 ? claim((void **)&real_gpa_v2, real, (void *)cuGetProcAddress_v2)
			      : claim((void **)&real_gpa_v1, real, (void *)cuGetProcAddress);
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

ST_EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags)
{
	RESOLVE(real_gpa_v1, "cuGetProcAddress");
	if (!real_gpa_v1)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult r = real_gpa_v1(sym, pfn, ver, flags);
	after_gpa(sym, pfn, ver, flags, r);
	return r;
}

ST_EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status)
{
	RESOLVE(real_gpa_v2, "cuGetProcAddress_v2");
	if (!real_gpa_v2)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult r = real_gpa_v2(sym, pfn, ver, flags, status);
	after_gpa(sym, pfn, ver, flags, r);
	return r;
}

/* ---- dlsym / dlvsym injection ------------------------------------------------------ */
static const struct st_hook hooks[] = {
	{"cuMemHostRegister", (void *)cuMemHostRegister, (void **)&real_reg_v1, ST_PROV_CUDA},
	{"cuMemHostRegister_v2", (void *)cuMemHostRegister_v2, (void **)&real_reg_v2, ST_PROV_CUDA},
	{"cuMemHostUnregister", (void *)cuMemHostUnregister, (void **)&real_unreg, ST_PROV_CUDA},
	{"cuMemHostGetDevicePointer", (void *)cuMemHostGetDevicePointer, (void **)&real_gdp_v1, ST_PROV_CUDA},
	{"cuMemHostGetDevicePointer_v2", (void *)cuMemHostGetDevicePointer_v2, (void **)&real_gdp_v2, ST_PROV_CUDA},
	{"cuPointerGetAttribute", (void *)cuPointerGetAttribute, (void **)&real_pga, ST_PROV_CUDA},
	{"cuPointerGetAttributes", (void *)cuPointerGetAttributes, (void **)&real_pgas, ST_PROV_CUDA},
	{"cuGetProcAddress", (void *)cuGetProcAddress, (void **)&real_gpa_v1, ST_PROV_CUDA},
	{"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, (void **)&real_gpa_v2, ST_PROV_CUDA},
	{"cuGetExportTable", (void *)cuGetExportTable, (void **)&real_get, ST_PROV_CUDA},
};

__attribute__((constructor(150))) static void cuda_provider_init(void)
{
	st_hooks_register(hooks, sizeof hooks / sizeof hooks[0]);
}
