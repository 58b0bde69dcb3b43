/* load_order_libs -- libfabric and UCP reached from a module dlopen'ed RTLD_LOCAL (tests/test_load_order.py),
 * the way Open MPI's components, Python extensions and plugins reach them: the module links
 * -lfabric / -lucp and the program does not, so both libraries arrive in the module's local scope
 * only, after start.  This file is the program and (-DLO_MODULE -shared, liblo_libs.so) the module.
 *
 *   load_order_libs ofi|ucp [module-dir]
 *
 * ofi: fi_getinfo (udp, FI_EP_DGRAM), fi_fabric, fi_domain, fi_cq_open, 100 fi_cq_read (empty), close.
 * ucp: ucp_init (TAG), a worker, an endpoint to itself, one tag send + receive of 64 bytes progressed
 *      to completion (bounded), teardown.  UCX_TLS=self keeps it on this process.
 * stdout: "OFI reads=100" / "UCP sent=1 received=1 data=ok", then RESULT OK (exit 0) or RESULT FAIL.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "result_fail.h"

#ifdef LO_MODULE
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <ucp/api/ucp.h>

#define LO_EXPORT __attribute__((visibility("default")))

LO_EXPORT int lo_ofi_run(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->fabric_attr->prov_name = strdup("udp");
	hints->ep_attr->type = FI_EP_DGRAM;
	hints->caps = FI_MSG;
	hints->mode = ~0ull;
	int r = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info);
	if (r)
		RESULT_FAIL("fi_getinfo %d", r);
	struct fid_fabric *fab;
	struct fid_domain *dom;
	struct fid_cq *cq;
	struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 16};
	if ((r = fi_fabric(info->fabric_attr, &fab, NULL)))
		RESULT_FAIL("fi_fabric %d", r);
	if (fi_domain(fab, info, &dom, NULL) || fi_cq_open(dom, &attr, &cq, NULL))
		RESULT_FAIL("domain/cq");
	struct fi_cq_entry e;
	int n = 0;
	for (int i = 0; i < 100; i++)
		n += fi_cq_read(cq, &e, 1) == -FI_EAGAIN;
	fi_close(&cq->fid);
	fi_close(&dom->fid);
	fi_close(&fab->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("OFI reads=%d\n", n);
	printf("RESULT OK\n");
	return 0;
}

struct lo_req {
	int done;
};

static void lo_req_init(void *request)
{
	((struct lo_req *)request)->done = 0;
}

static void lo_send_cb(void *request, ucs_status_t status, void *user)
{
	((struct lo_req *)request)->done = 1;
}

static void lo_recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user)
{
	((struct lo_req *)request)->done = 1;
}

static int lo_wait(ucp_worker_h w, void *req)
{
	if (req == NULL)
		return 1;
	if (UCS_PTR_IS_ERR(req))
		return 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!((struct lo_req *)req)->done) {
		ucp_worker_progress(w);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			return 0;
	}
	ucp_request_free(req);
	return 1;
}

LO_EXPORT int lo_ucp_run(void)
{
	ucp_config_t *cfg;
	if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
		RESULT_FAIL("ucp_config_read");
	ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE |
					UCP_PARAM_FIELD_REQUEST_INIT,
			  .features = UCP_FEATURE_TAG,
			  .request_size = sizeof(struct lo_req),
			  .request_init = lo_req_init};
	ucp_context_h ctx;
	ucs_status_t s = ucp_init(&p, cfg, &ctx);
	ucp_config_release(cfg);
	if (s != UCS_OK)
		RESULT_FAIL("ucp_init %d", s);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_worker_h w;
	if ((s = ucp_worker_create(ctx, &wp, &w)) != UCS_OK)
		RESULT_FAIL("ucp_worker_create %d", s);
	ucp_address_t *addr;
	size_t alen;
	if (ucp_worker_get_address(w, &addr, &alen) != UCS_OK)
		RESULT_FAIL("ucp_worker_get_address");
	ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = addr};
	ucp_ep_h ep;
	if ((s = ucp_ep_create(w, &ep_params, &ep)) != UCS_OK)
		RESULT_FAIL("ucp_ep_create %d", s);
	char out[64], in[64];
	memset(out, 0x5a, sizeof(out));
	memset(in, 0, sizeof(in));
	ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.recv = lo_recv_cb};
	void *rreq = ucp_tag_recv_nbx(w, in, sizeof(in), 42, ~0ull, &rp);
	ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = lo_send_cb};
	void *sreq = ucp_tag_send_nbx(ep, out, sizeof(out), 42, &sp);
	int sent = lo_wait(w, sreq), received = lo_wait(w, rreq);
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *creq = ucp_ep_close_nbx(ep, &cp);
	if (creq && !UCS_PTR_IS_ERR(creq)) {
		while (ucp_request_check_status(creq) == UCS_INPROGRESS)
			ucp_worker_progress(w);
		ucp_request_free(creq);
	}
	ucp_worker_release_address(w, addr);
	ucp_worker_destroy(w);
	ucp_cleanup(ctx);
	printf("UCP sent=%d received=%d data=%s\n", sent, received, memcmp(in, out, sizeof(in)) ? "bad" : "ok");
	if (!sent || !received)
		RESULT_FAIL("tag send/recv");
	printf("RESULT OK\n");
	return 0;
}
#else
int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *what = argc > 1 ? argv[1] : "ofi";
	char path[4096];
	snprintf(path, sizeof(path), "%s/liblo_libs.so", argc > 2 ? argv[2] : ".");
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		RESULT_FAIL("dlopen %s: %s", path, dlerror());
	int (*run)(void) = (int (*)(void))dlsym(h, !strcmp(what, "ucp") ? "lo_ucp_run" : "lo_ofi_run");
	if (!run)
		RESULT_FAIL("dlsym: %s", dlerror());
	return run();
}
#endif
