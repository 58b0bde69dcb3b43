/* review_stubs.c -- stand-ins for library entry points, for the review
 * findings of issue 12 that need a call to *succeed* with arguments a real
 * library would refuse (tests/test_tracer_robustness.py compiles one shared
 * object per -D):
 *
 *   -DSTUB_UCX    ucp_ep_create: UCS_OK and a made-up endpoint, whatever the
 *                 address (the tracer records its first bytes)
 *   -DSTUB_OFI    fi_fabric: a fabric object with an ops table, whatever the
 *                 names in the attributes (the tracer records them)
 *   -DSTUB_CUDA   libcuda.so.1 with cuPointerGetAttribute(s): every attribute
 *                 is answered with a 64-bit pattern written at its documented
 *                 width (cuda.h), so the tracer's record shows how many bytes
 *                 it read
 * No library headers needed except libfabric's (for the fabric object).
 */
#include <stdint.h>
#include <string.h>

#ifdef STUB_UCX
int ucp_ep_create(void *worker, const void *params, void **ep_p)
{
	(void)worker;
	(void)params;
	*ep_p = (void *)(uintptr_t)0x5ee0;
	return 0; /* UCS_OK */
}
#endif

#ifdef STUB_OFI
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

static int stub_domain(struct fid_fabric *f, struct fi_info *info, struct fid_domain **d, void *ctx)
{
	(void)f, (void)info, (void)d, (void)ctx;
	return -FI_ENOSYS;
}
static struct fi_ops_fabric stub_fabric_ops = {.size = sizeof(struct fi_ops_fabric), .domain = stub_domain};
static struct fid_fabric stub_fabric = {.ops = &stub_fabric_ops};

int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
	(void)attr;
	(void)context;
	*fabric = &stub_fabric;
	return 0;
}
#endif

#ifdef STUB_CUDA
/* widths from cuda.h (CUDA 13.0): CUcontext, CUdeviceptr, void *, unsigned
 * long long, sizes, addresses, the mempool handle, the block id: 8 bytes;
 * P2P_TOKENS: a struct {unsigned long long p2pToken; unsigned int
 * vaSpaceToken;}; the rest (int, unsigned int, enum, bool-like) 4 bytes */
static size_t width(int attr)
{
	switch (attr) {
	case 1: case 3: case 4: case 7: case 11: case 12: case 17: case 18: case 19: case 20:
		return 8;
	case 5:
		return 16;
	default:
		return 4;
	}
}

static void answer(void *data, int attr)
{
	static const uint64_t pattern[2] = {0x1122334455667788ull, 0x00000000a5a5a5a5ull};
	memcpy(data, pattern, width(attr));
}

int cuPointerGetAttribute(void *data, int attr, unsigned long long ptr)
{
	(void)ptr;
	answer(data, attr);
	return 0;
}

int cuPointerGetAttributes(unsigned n, int *attrs, void **data, unsigned long long ptr)
{
	(void)ptr;
	for (unsigned i = 0; i < n; i++)
		answer(data[i], attrs[i]);
	return 0;
}
#endif
