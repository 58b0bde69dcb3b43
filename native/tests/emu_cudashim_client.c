/* emu_cudashim_client -- registers emulated UAR pages with the CUDA driver
 * the way NVSHMEM's GPU NIC handler does (cuMemHostRegister(Portable |
 * DeviceMap | IoMemory) + cuMemHostGetDevicePointer, reference §5.1 step 6),
 * through each way a library reaches the driver: the exported symbol,
 * dlsym(handle, "cuGetProcAddress_v2") + cuGetProcAddress, and
 * dlsym(handle, "cuMemHostRegister_v2"); then a page of ordinary memory with
 * IoMemory.  Run over the emulated CUDA driver with EMUCUDA_STRICT_IOMEMORY=1
 * (it refuses IoMemory on RAM like the real driver), with and without
 * LD_PRELOAD=libsigmatrace_emu_cudashim.so (native/emu/cudashim.c).
 *
 * The verbs libraries are dlopen'ed, RTLD_GLOBAL by default and RTLD_LOCAL
 * with --local: NVSHMEM's transport opens libibverbs.so.1 RTLD_LOCAL, where
 * dlsym(RTLD_DEFAULT) cannot see the emulator's exports.
 *
 * Output: "REG path=<p> result=<CUresult>" per registration, "STORE path=<p>
 * ok" when a device store through the mapping reached the UAR page, "REWRITES
 * n" / "REWRITES_RAM n" (the shim's counts of emulated UARs and of other
 * RAM, -1 without the shim), "RESULT OK". */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#undef ibv_get_device_list
#undef ibv_open_device

#include "emucuda.h"

#include "cu_driver.h"
typedef CUresult (*reg_fn)(void *, size_t, unsigned);
typedef CUresult (*gpa_fn)(const char *, void **, int, uint64_t, int *);

#define FAIL(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); return 1; } while (0)

static void try_path(const char *path, reg_fn reg, void *addr, size_t size)
{
	CUresult r = reg(addr, size, 0x01 | 0x02 | 0x04);
	printf("REG path=%s result=%d\n", path, r);
	if (r)
		return;
	CUdeviceptr d = 0;
	if (cuMemHostGetDevicePointer_v2(&d, addr, 0) != 0) {
		printf("DEVPTR path=%s failed\n", path);
		return;
	}
	emucu_store64(d, 0x1122334455667788ull); /* the "GPU" rings through its mapping */
	if (*(volatile uint64_t *)addr == 0x1122334455667788ull)
		printf("STORE path=%s ok\n", path);
	*(volatile uint64_t *)addr = 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	int n = 0, dev;
	int scope = argc > 1 && !strcmp(argv[1], "--local") ? RTLD_LOCAL : RTLD_GLOBAL;
	void *verbs = dlopen("libibverbs.so.1", RTLD_NOW | scope), *mlx5 = dlopen("libmlx5.so.1", RTLD_NOW | scope);
	if (!verbs || !mlx5)
		FAIL("dlopen verbs: %s", dlerror());
	struct ibv_device **(*get_list)(int *) = (struct ibv_device **(*)(int *))dlsym(verbs, "ibv_get_device_list");
	struct ibv_context *(*open_dev)(struct ibv_device *) =
		(struct ibv_context * (*)(struct ibv_device *)) dlsym(verbs, "ibv_open_device");
	struct mlx5dv_devx_uar *(*alloc_uar)(struct ibv_context *, uint32_t) =
		(struct mlx5dv_devx_uar * (*)(struct ibv_context *, uint32_t)) dlsym(mlx5, "mlx5dv_devx_alloc_uar");
	if (!get_list || !open_dev || !alloc_uar)
		FAIL("dlsym verbs");
	struct ibv_device **l = get_list(&n);
	if (!l || !n)
		FAIL("no device");
	struct ibv_context *ctx = open_dev(l[0]);
	struct mlx5dv_devx_uar *u[3];
	for (int i = 0; i < 3; i++)
		if (!(u[i] = alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_BF)))
			FAIL("alloc_uar");
	void *pctx;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&pctx, dev) || cuCtxSetCurrent(pctx))
		FAIL("cuda init");
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		FAIL("dlopen libcuda.so.1");
	try_path("direct", cuMemHostRegister_v2, u[0]->reg_addr, 512);
	gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
	void *fn = NULL;
	int st = 0;
	if (!gpa || gpa("cuMemHostRegister", &fn, 12000, 0, &st) || !fn)
		FAIL("cuGetProcAddress(cuMemHostRegister)");
	try_path("getprocaddress", (reg_fn)fn, u[1]->reg_addr, 512);
	reg_fn viadlsym = (reg_fn)dlsym(h, "cuMemHostRegister_v2");
	if (!viadlsym)
		FAIL("dlsym cuMemHostRegister_v2");
	try_path("dlsym", viadlsym, u[2]->reg_addr, 512);
	void *ram;
	if (posix_memalign(&ram, 4096, 4096))
		FAIL("memalign");
	memset(ram, 0, 4096);
	try_path("ram", cuMemHostRegister_v2, ram, 4096);
	unsigned long (*rw)(void) = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "sigmatrace_emu_cudashim_rewrites");
	printf("REWRITES %ld\n", rw ? (long)rw() : -1L);
	unsigned long (*rr)(void) = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "sigmatrace_emu_cudashim_rewrites_ram");
	printf("REWRITES_RAM %ld\n", rr ? (long)rr() : -1L);
	printf("RESULT OK\n");
	return 0;
}
