/*
 * Fork safety of the GPU doorbell hijack (tests/test_hijack_emu.py), over the
 * emulated CUDA driver.  No HCA needed: the doorbell page is recognised from
 * its IOMEMORY registration.
 *
 *   1. register a "UAR" page (DEVICEMAP | IOMEMORY), ask for the device pointer
 *      of its doorbell register (the tracer hands out its proxy page), ring it
 *      from the "GPU" and wait until the value reaches the real register;
 *   2. fork; the child reports whether the parent's proxy page is mapped in
 *      it and how many threads it has, asks for the doorbell's device pointer
 *      again (it must not get the parent's proxy, whose poller does not exist
 *      here, but one of its own), rings it and waits for the forward, then
 *      leaves with exit() (atexit handlers, the hijack's shutdown included,
 *      must not wait for pollers that only exist in the parent);
 *   3. the parent rings again: its poller still forwards; then unregisters.
 * Prints "CHILD threads=N proxy_mapped=0|1 same_proxy=0|1 forwarded=0|1",
 * "PARENT child_status=S",
 * last line "RESULT OK" / "RESULT FAIL ...".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emucu_client.h"

static int count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	if (!d)
		return -1;
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint8_t *uar = emucu_uar_page();
	volatile uint64_t *reg = (volatile uint64_t *)(uar + 0x800);
	CUdeviceptr db;
	CU(cuMemHostGetDevicePointer_v2(&db, (void *)reg, 0));
	uint8_t *seen = emucu_translate(db, 8);
	int hijacked = seen != (uint8_t *)reg;
	printf("hijacked=%d\n", hijacked);
	/* an mlx5-style doorbell: BE32(pi << 8), BE32(qpn << 8) */
	const uint64_t v1 = 0x0000120000010000ull, v2 = 0x0000120000020000ull, v3 = 0x0000120000030000ull;
	emucu_store64(db, v1);
	CHECK(wait_value(reg, v1, 5.0) == 0, "doorbell 1 not forwarded");

	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		alarm(10); /* a child that waits for a parent's poller at exit dies here instead */
		int mapped = 0;
		if (hijacked) {
			uintptr_t pg = (uintptr_t)seen & ~(uintptr_t)4095;
			mapped = msync((void *)pg, 4096, MS_ASYNC) == 0;
		}
		int threads = count_threads();
		CUdeviceptr db2 = 0;
		int forwarded = 0, same = 0;
		if (cuMemHostGetDevicePointer_v2(&db2, (void *)reg, 0) == 0) {
			same = hijacked && db2 == db;
			if (!same || mapped) { /* storing into an unmapped phantom proxy would fault */
				emucu_store64(db2, v3);
				forwarded = wait_value(reg, v3, 3.0) == 0;
			}
		}
		printf("CHILD threads=%d proxy_mapped=%d same_proxy=%d forwarded=%d\n", threads, mapped, same, forwarded);
		exit(forwarded ? 0 : 3); /* atexit handlers run */
	}
	int st = 0;
	double t0 = now_s();
	pid_t w;
	while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_s() - t0 < 20)
		usleep(1000);
	if (w == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		DIE("child did not exit");
	}
	printf("PARENT child_status=%s%d\n", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
	/* the parent's poller survived the fork */
	emucu_store64(db, v2);
	CHECK(wait_value(reg, v2, 5.0) == 0, "doorbell 2 (after fork) not forwarded");
	CU(cuMemHostUnregister(uar));
	free(uar);
	printf("RESULT OK\n");
	return 0;
}
