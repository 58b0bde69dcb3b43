/*
 * Architecture-specific instructions of the hijack: the spin hint, the
 * flush after forwarding a doorbell, and the x86 monitor/wait pairs an idle
 * poller may use.
 */
#ifndef ST_HIJACK_ARCH_H
#define ST_HIJACK_ARCH_H
#include <stdint.h>

#include "core/core.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__asm__ __volatile__("pause" ::: "memory");
#endif
}
static inline void store_fence(void)
{
#if defined(__x86_64__)
	__asm__ __volatile__("sfence" ::: "memory");
#else
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}
#if defined(__x86_64__)
static inline void wait_umwait(const volatile void *addr, uint64_t ticks)
{
	/* umonitor rax ; umwait ecx(0 = C0.2) edx:eax deadline (byte encodings) */
	__asm__ __volatile__(".byte 0xf3, 0x48, 0x0f, 0xae, 0xf0" ::"a"(addr) : "memory"); /* umonitor %rax */
	uint64_t dl = st_tsc() + ticks;
	__asm__ __volatile__(".byte 0xf2, 0x0f, 0xae, 0xf1" /* umwait %ecx */
			     ::"c"(0), "a"((uint32_t)dl), "d"((uint32_t)(dl >> 32))
			     : "memory", "cc");
}
static inline void wait_mwaitx(const volatile void *addr, uint32_t ticks)
{
	__asm__ __volatile__(".byte 0x0f, 0x01, 0xfa" ::"a"(addr), "c"(0), "d"(0) : "memory"); /* monitorx */
	__asm__ __volatile__(".byte 0x0f, 0x01, 0xfb" ::"a"(0xf0), "b"(ticks), "c"(2) : "memory"); /* mwaitx, timer */
}
#endif

#endif
