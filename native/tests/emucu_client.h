/* emucu_client.h -- what the hijack's test programs over the emulated CUDA
 * driver alone share (hijack_fork.c, hijack_devptr.c): the driver calls they
 * use (declared here, no CUDA headers), the RESULT FAIL exits, and a bounded
 * wait for a value to reach a "real" register.  Static inline, test-only. */
#ifndef SIGMATRACE_TESTS_EMUCU_CLIENT_H
#define SIGMATRACE_TESTS_EMUCU_CLIENT_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "emucuda.h"

#include "cu_driver.h"

#define DIE(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) DIE(__VA_ARGS__); } while (0)
#define CU(x) do { CUresult r_ = (x); CHECK(r_ == 0, "%s = %d", #x, r_); } while (0)

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 0 once *reg holds v, -1 after timeout seconds */
static inline int wait_value(volatile uint64_t *reg, uint64_t v, double timeout)
{
	double t0 = now_s();
	while (__atomic_load_n(reg, __ATOMIC_ACQUIRE) != v)
		if (now_s() - t0 > timeout)
			return -1;
		else
			usleep(50);
	return 0;
}
/* A CUDA context, and a 4 KiB page registered DEVICEMAP | IOMEMORY like a
 * UAR (the hijack recognises its doorbell page from that registration). */
static inline uint8_t *emucu_uar_page(void)
{
	void *ctx;
	int dev;
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, 0));
	CU(cuCtxCreate_v2(&ctx, 0, dev));
	uint8_t *uar;
	CHECK(posix_memalign((void **)&uar, 4096, 4096) == 0, "posix_memalign");
	for (int i = 0; i < 4096; i++)
		uar[i] = 0;
	CU(cuMemHostRegister_v2(uar, 4096, 0x02 | 0x04)); /* DEVICEMAP | IOMEMORY */
	return uar;
}
#endif
