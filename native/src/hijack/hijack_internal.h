/* Hijack internals shared with the CUDA provider (providers/cuda/). */
#ifndef ST_HIJACK_INTERNAL_H
#define ST_HIJACK_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "hijack/hijack.h"

/* A host range was registered with the driver (after the real call succeeded). */
void st_hijack_on_register(void *p, size_t size, unsigned flags) ST_HIDDEN;
/* The application unregisters a range: pollers of doorbells inside it stop
 * (forwarding what they hold) before the real unregister. */
void st_hijack_on_unregister(void *p) ST_HIDDEN;
/* The application asks for the device pointer of host pointer p; the driver
 * gave real_dptr.  Returns the pointer to hand out (a proxy page's device
 * pointer when p is a doorbell register), *hijacked set accordingly. */
uint64_t st_hijack_devptr(void *p, uint64_t real_dptr, int *hijacked) ST_HIDDEN;
/* Pointer-attribute consistency: if d lies in a proxy page handed out by the
 * hijack, return the real device pointer it stands for (else d). */
uint64_t st_hijack_real_of_proxy(uint64_t d) ST_HIDDEN;
/* ... and the other way round (a real doorbell device pointer -> proxy). */
uint64_t st_hijack_proxy_of_real(uint64_t d) ST_HIDDEN;
/* CPU-doorbell proxies (F24d): an address inside a proxy page handed out as
 * a UAR's reg_addr stands, for the driver, for the same offset of the real
 * UAR page; anything else is returned unchanged.  Lock-free, cheap when no
 * proxy exists. */
void *st_hijack_cpu_real(void *p) ST_HIDDEN;
/* ... and the other way round (real UAR page -> proxy) for host pointers the
 * driver reports. */
uint64_t st_hijack_cpu_proxy_of_real(uint64_t host) ST_HIDDEN;
/* Stop every poller (process exit). */
void st_hijack_shutdown(void) ST_HIDDEN;
#endif
