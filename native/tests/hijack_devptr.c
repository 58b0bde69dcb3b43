/*
 * The GPU path of the doorbell hijack on a page it already proxies
 * (tests/test_hijack_emu.py), over the emulated CUDA driver; no HCA needed:
 * the doorbell page is recognised from its IOMEMORY registration.
 *
 *   1. register a "UAR" page (DEVICEMAP | IOMEMORY), ask for the device pointer
 *      of its register at 0x800 (the tracer hands out its proxy page), ring it
 *      from the "GPU" and wait until the value reaches the real register;
 *   2. ask for the device pointer of a second register of the same page
 *      (0xa00, another doorbell register of a UAR): it lies in the same
 *      proxy page, and a doorbell rung there must reach the real 0xa00 too;
 *   3. ring the first register again, unregister.
 * Prints "hijacked=0|1", "SECOND same_proxy_page=0|1 forwarded=0|1", last line
 * "RESULT OK" / "RESULT FAIL ...".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emucu_client.h"

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint8_t *uar = emucu_uar_page();
	volatile uint64_t *reg = (volatile uint64_t *)(uar + 0x800), *reg2 = (volatile uint64_t *)(uar + 0xa00);
	CUdeviceptr db, db2;
	CU(cuMemHostGetDevicePointer_v2(&db, (void *)reg, 0));
	uint8_t *seen = emucu_translate(db, 8);
	printf("hijacked=%d\n", seen != (uint8_t *)reg);
	/* mlx5-style doorbells: BE32(pi << 8), BE32(qpn << 8) */
	const uint64_t v1 = 0x0000120000010000ull, v2 = 0x0000340000010000ull, v3 = 0x0000120000020000ull;
	emucu_store64(db, v1);
	CHECK(wait_value(reg, v1, 5.0) == 0, "doorbell 1 not forwarded");
	CU(cuMemHostGetDevicePointer_v2(&db2, (void *)reg2, 0));
	uint8_t *seen2 = emucu_translate(db2, 8);
	int same = ((uintptr_t)seen2 & ~(uintptr_t)4095) == ((uintptr_t)seen & ~(uintptr_t)4095);
	emucu_store64(db2, v2);
	int fwd = wait_value(reg2, v2, 3.0) == 0;
	printf("SECOND same_proxy_page=%d forwarded=%d\n", same, fwd);
	emucu_store64(db, v3);
	CHECK(wait_value(reg, v3, 5.0) == 0, "doorbell 3 not forwarded");
	CU(cuMemHostUnregister(uar));
	free(uar);
	CHECK(fwd, "the second register's doorbell never reached the real page");
	printf("RESULT OK\n");
	return 0;
}
