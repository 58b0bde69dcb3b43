/*
 * Per-architecture instructions of the hijack: barriers named by what they
 * order (the names and meanings of rdma-core's util/udma_barrier.h), the
 * spin-wait hint, and the x86 monitor/wait pairs an idle poller may use.
 *
 * The poller is the one place where the tracer itself talks to a device: it
 * forwards every doorbell value it sees in a proxy page to the real UAR
 * register, an MMIO store that makes the NIC fetch WQEs by DMA.  These
 * barriers are for that store and nothing else; ordering between the
 * tracer's own threads uses C11 atomics (__atomic_*), as rdma-core advises.
 *
 * x86_64 keeps the instructions the poller always used (sfence after the
 * forward, pause when spinning); aarch64 follows rdma-core's choices (dmb
 * with the outer-shareable domain, where devices observe memory, and dsb st
 * to push MMIO writes out).  Other architectures are refused at compile
 * time rather than left without barriers.
 */
#ifndef ST_HIJACK_ARCH_H
#define ST_HIJACK_ARCH_H
#include <stdint.h>

#include "core/core.h"

/* The instruction behind each barrier, per architecture. */
#if defined(__x86_64__)
#define ARCH_TO_DEVICE ""         /* see udma_to_device_barrier */
#define ARCH_FROM_DEVICE "lfence"
#define ARCH_MMIO_FLUSH "sfence"
#define ARCH_SPIN_HINT "pause"
#elif defined(__aarch64__)
#define ARCH_TO_DEVICE "dmb oshst" /* outer shareable: the domain devices observe */
#define ARCH_FROM_DEVICE "dmb oshld"
#define ARCH_MMIO_FLUSH "dsb st"   /* dsb, not dmb: see mmio_flush_writes */
#define ARCH_SPIN_HINT "yield"
#else
#error "hijack/arch.h: no barriers for this architecture (x86_64 and aarch64 are known); add them from rdma-core's util/udma_barrier.h"
#endif

/* Before an MMIO store that starts DMA (a doorbell): the device sees every
 * store to memory made before it.  x86 keeps ordinary stores in order, ahead
 * of a later UC or WC store too, so only the compiler must not move them
 * (non-temporal stores would need an sfence; the hijack makes none). */
static inline void udma_to_device_barrier(void)
{
	__asm__ __volatile__(ARCH_TO_DEVICE ::: "memory");
}

/* After seeing a device's ordered store (a flag it wrote): later reads see
 * what it wrote before that store. */
static inline void udma_from_device_barrier(void)
{
	__asm__ __volatile__(ARCH_FROM_DEVICE ::: "memory");
}

/* After a store to MMIO (write-combining or not): send it now, and never
 * merge it with a later one (two doorbells must be two writes).  On aarch64
 * a dsb: the write must have left the core, not merely be ordered. */
static inline void mmio_flush_writes(void)
{
	__asm__ __volatile__(ARCH_MMIO_FLUSH ::: "memory");
}

/* Before a burst of writes to write-combining MMIO: they are ordered after
 * earlier MMIO writes and after memory (implies udma_to_device_barrier). */
static inline void mmio_wc_start(void)
{
	mmio_flush_writes();
}

/* Spin-wait hint in a polling loop: the core's sibling thread gets the
 * resources, and leaving the loop costs less. */
static inline void cpu_relax(void)
{
	__asm__ __volatile__(ARCH_SPIN_HINT ::: "memory");
}

/* An idle wait on one watched word with a monitor/wait pair: arm() starts
 * monitoring the word's cache line, wait(ticks) sleeps until that line is
 * written (or the timeout passes).  A write that lands before the monitor is
 * armed does not end the wait, so the word is read again *after* arming and
 * the wait skipped if it changed since the poller's last scan (finding 7:
 * without the re-check, a doorbell rung between the scan and the arm waited
 * out the whole timeout).  The pair is passed in so that the order can be
 * tested without the instructions (native/tests/hijack_wait_test.c).
 * Returns 1 if the word had changed (no wait), else 0 after the wait. */
struct monitor_ops {
	void (*arm)(const volatile void *addr);
	void (*wait)(uint64_t ticks);
};
static inline int monitor_wait(const struct monitor_ops *op, const volatile uint64_t *w, uint64_t seen, uint64_t ticks)
{
	op->arm(w);
	if (__atomic_load_n(w, __ATOMIC_ACQUIRE) != seen)
		return 1;
	op->wait(ticks);
	return 0;
}

#if defined(__x86_64__)
/* The pairs of WAITPKG (umonitor/umwait) and MONITORX (monitorx/mwaitx),
 * probed in config.c.  Encoded as bytes: older assemblers lack them. */
static inline void arm_umonitor(const volatile void *addr)
{
	__asm__ __volatile__(".byte 0xf3, 0x48, 0x0f, 0xae, 0xf0" ::"a"(addr) : "memory"); /* umonitor %rax */
}
static inline void wait_umwait(uint64_t ticks)
{
	/* umwait ecx(0 = C0.2) until the TSC deadline edx:eax */
	uint64_t dl = st_tsc() + ticks;
	__asm__ __volatile__(".byte 0xf2, 0x0f, 0xae, 0xf1" /* umwait %ecx */
			     ::"c"(0), "a"((uint32_t)dl), "d"((uint32_t)(dl >> 32))
			     : "memory", "cc");
}
static inline void arm_monitorx(const volatile void *addr)
{
	__asm__ __volatile__(".byte 0x0f, 0x01, 0xfa" ::"a"(addr), "c"(0), "d"(0) : "memory"); /* monitorx */
}
static inline void wait_mwaitx(uint64_t ticks)
{
	__asm__ __volatile__(".byte 0x0f, 0x01, 0xfb" ::"a"(0xf0), "b"((uint32_t)ticks), "c"(2) : "memory"); /* mwaitx, timer */
}
#endif

/* A read that races with the application by design (the recovery copy of a ring the application keeps
 * writing; what it copies is validated).  ThreadSanitizer ignores the accesses in between. */
#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define racy_read_begin() __tsan_ignore_thread_begin()
#define racy_read_end() __tsan_ignore_thread_end()
#else
#define racy_read_begin() ((void)0)
#define racy_read_end() ((void)0)
#endif

#endif
