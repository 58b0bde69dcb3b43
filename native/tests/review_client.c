/* review_client -- drives the review findings (a)-(e) of issue 12 through the
 * tracer's shims, with the stand-ins of review_stubs.c loaded globally:
 *
 *   review_client ucx STUB.so      ucp_ep_create with a remote address of 8
 *                                  bytes that end where the mapping ends (the
 *                                  next page is PROT_NONE), then one of 64
 *   review_client ofi STUB.so      fi_fabric with a 600-character fabric name
 *                                  and a 300-character provider name
 *   review_client cuda             cuPointerGetAttribute for every attribute
 *                                  1..21 into a zeroed 16-byte buffer, and
 *                                  cuPointerGetAttributes for 17..20 (the stub
 *                                  libcuda.so.1 comes through LD_LIBRARY_PATH)
 *   review_client cq-event         ibv_get_cq_event with no libibverbs loaded
 *
 * The entry points are looked up with dlsym(RTLD_DEFAULT), i.e. the tracer's.
 * Prints "OK ..." (exit 0) or "FAIL ..." (exit 1).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ucp/api/ucp.h> /* types only: libucp is the stub */

static void *sym(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);
	if (!p) {
		printf("FAIL no %s\n", name);
		_exit(1);
	}
	return p;
}

static int run_ucx(void)
{
	ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *) = sym("ucp_ep_create");
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	mprotect(m + pg, (size_t)pg, PROT_NONE);
	uint8_t *addr = m + pg - 8; /* an 8-byte address, the last bytes before the guard page */
	for (int i = 0; i < 8; i++)
		addr[i] = (uint8_t)(0xa0 + i);
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
	p.address = (const ucp_address_t *)addr;
	ucp_ep_h ep = NULL;
	ucp_worker_h worker = (ucp_worker_h)(uintptr_t)0x3000;
	if (ep_create(worker, &p, &ep) != UCS_OK || !ep) {
		printf("FAIL ep_create\n");
		return 1;
	}
	static uint8_t longaddr[64];
	for (int i = 0; i < 64; i++)
		longaddr[i] = (uint8_t)i;
	p.address = (const ucp_address_t *)longaddr;
	if (ep_create(worker, &p, &ep) != UCS_OK) {
		printf("FAIL ep_create 2\n");
		return 1;
	}
	printf("OK ucx\n");
	return 0;
}

struct fabric_attr { /* struct fi_fabric_attr (fabric.h) */
	void *fabric;
	char *name, *prov_name;
	uint32_t prov_version, api_version;
};

static int run_ofi(void)
{
	int (*fabric)(struct fabric_attr *, void **, void *) = sym("fi_fabric");
	static char name[601], prov[301];
	memset(name, 'n', 600);
	memset(prov, 'p', 300);
	name[5] = '"'; /* escaped in the JSON: it grows */
	struct fabric_attr a = {NULL, name, prov, 1, 0};
	void *f = NULL;
	if (fabric(&a, &f, NULL) != 0 || !f) {
		printf("FAIL fi_fabric\n");
		return 1;
	}
	printf("OK ofi\n");
	return 0;
}

static int run_cuda(void)
{
	int (*get)(void *, int, unsigned long long) = sym("cuPointerGetAttribute");
	int (*gets)(unsigned, int *, void **, unsigned long long) = sym("cuPointerGetAttributes");
	for (int a = 1; a <= 21; a++) {
		uint64_t data[2] = {0, 0};
		if (get(data, a, 0x1000) != 0) {
			printf("FAIL attribute %d\n", a);
			return 1;
		}
	}
	int attrs[4] = {17, 18, 19, 20};
	uint64_t d[4][2] = {{0}};
	void *dp[4] = {d[0], d[1], d[2], d[3]};
	if (gets(4, attrs, dp, 0x1000) != 0) {
		printf("FAIL attributes\n");
		return 1;
	}
	printf("OK cuda\n");
	return 0;
}

static int run_cq_event(void)
{
	int (*get_cq_event)(void *, void **, void **) = sym("ibv_get_cq_event");
	void *cq = NULL, *ctx = NULL;
	errno = 0;
	int r = get_cq_event(NULL, &cq, &ctx);
	printf("%s cq-event ret=%d errno=%d\n", r == -1 && errno == ENOSYS ? "OK" : "FAIL", r, errno);
	return !(r == -1 && errno == ENOSYS);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL)) {
		printf("FAIL dlopen %s: %s\n", argv[2], dlerror());
		return 1;
	}
	if (argc >= 2 && !strcmp(argv[1], "ucx"))
		return run_ucx();
	if (argc >= 2 && !strcmp(argv[1], "ofi"))
		return run_ofi();
	if (argc >= 2 && !strcmp(argv[1], "cuda"))
		return run_cuda();
	if (argc >= 2 && !strcmp(argv[1], "cq-event"))
		return run_cq_event();
	printf("FAIL usage\n");
	return 1;
}
