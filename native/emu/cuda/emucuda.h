/* sigmatrace emulated CUDA driver (test-only): the "GPU thread" API.
 *
 * libcuda.so.1 from native/emu/cuda implements, on the CPU, the subset of the
 * CUDA driver API the hijack tests need.  CPU threads play the GPU: they call
 * these functions with *device* pointers, which go through the driver's page
 * table exactly like a GPU's MMU.  Device pointers live in a reserved virtual
 * window distinct from every host pointer:
 *   - cuMemAlloc memory is GPU memory: backed at its device address (a NIC
 *     reaches it there directly, like GPUDirect RDMA peer access);
 *   - host memory registered with cuMemHostRegister gets a device alias that
 *     is NOT mapped for the CPU (PROT_NONE): only the MMU path below reaches
 *     it, so a host access through a device pointer faults, and a device
 *     pointer replaced by a tracer is observable.
 * Clients resolve these with dlsym(RTLD_DEFAULT, ...) or link -lcuda.
 */
#ifndef SIGMATRACE_EMUCUDA_H
#define SIGMATRACE_EMUCUDA_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Translate [dptr, dptr+len) through the page table; NULL if unmapped. */
void *emucu_translate(uint64_t dptr, size_t len);
/* GPU-side accesses (abort with an "illegal address" report when unmapped). */
void emucu_store64(uint64_t dptr, uint64_t v);          /* release store */
void emucu_store32(uint64_t dptr, uint32_t v);          /* release store */
uint64_t emucu_load64(uint64_t dptr);                   /* acquire load */
uint32_t emucu_load32(uint64_t dptr);                   /* acquire load */
void emucu_memcpy_to_dev(uint64_t dptr, const void *src, size_t n);
void emucu_memcpy_from_dev(void *dst, uint64_t dptr, size_t n);
void emucu_fence_system(void);                          /* __threadfence_system */
/* Statistics: device accesses that went through a host-mapped alias. */
uint64_t emucu_stat_hostmapped_stores(void);
#ifdef __cplusplus
}
#endif
#endif
