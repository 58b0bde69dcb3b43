/*
 * dlsym injection check: this program does not link libfabric; it dlopens
 * it and resolves fi_getinfo/fi_fabric by name (as NCCL does with verbs).
 * Traced, the events must be there all the same.  Prints "reads <n>".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>

int main(int argc, char **argv)
{
	void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 2;
	}
	struct fi_info *(*dupinfo)(const struct fi_info *) = (struct fi_info * (*)(const struct fi_info *)) dlsym(h, "fi_dupinfo");
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **) =
		dlsym(h, "fi_getinfo");
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *) =
		dlvsym(h, "fi_fabric", "FABRIC_1.1");
	if (!dupinfo || !getinfo || !fabric) {
		fprintf(stderr, "dlsym failed\n");
		return 2;
	}
	struct fi_info *hints = dupinfo(NULL);
	hints->fabric_attr->prov_name = strdup(argc > 1 ? argv[1] : "udp");
	hints->ep_attr->type = FI_EP_DGRAM;
	hints->caps = FI_MSG;
	hints->mode = ~0ull;
	struct fi_info *info;
	if (getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info))
		return 3;
	struct fid_fabric *fab;
	struct fid_domain *dom;
	struct fid_cq *cq;
	struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 16};
	if (fabric(info->fabric_attr, &fab, NULL) || fi_domain(fab, info, &dom, NULL) || fi_cq_open(dom, &attr, &cq, NULL))
		return 4;
	struct fi_cq_entry e;
	int n = 0;
	for (int i = 0; i < 1000; i++)
		n += fi_cq_read(cq, &e, 1) == -FI_EAGAIN;
	printf("reads %d\n", n);
	fi_close(&cq->fid);
	fi_close(&dom->fid);
	fi_close(&fab->fid);
	return 0;
}
