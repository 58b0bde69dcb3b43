/* libibverbs.so.1 of the emulated HCA: memory regions.  An MR is an entry
 * of the NIC's MR table (keys index it), which the NIC checks every local
 * and remote access against.  An MR of GPU memory (by address or by dmabuf)
 * is also a device range of dma.c: the NIC reaches it through CUDA.
 * Protection and parent domains are in pd.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "emu_internal.h"

/* ---- MR ------------------------------------------------------------------- */
static struct ibv_mr *mr_new(struct ibv_pd *pd, uint64_t iova, size_t len, int access, int gpu, int fd);

static struct ibv_mr *reg_mr_common(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	if (((access & IBV_ACCESS_REMOTE_WRITE) || (access & IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	if (iova != (uint64_t)(uintptr_t)addr) {
		errno = EOPNOTSUPP; /* the emulator uses VA == IOVA */
		return NULL;
	}
	/* GPU memory by address (ibv_reg_mr of a cudaMalloc pointer, as with
	 * nvidia-peermem): the NIC reaches it through CUDA (dma.c) */
	int gpu = emu_devmem_register(iova, len);
	if (gpu < 0) {
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_mr *r = mr_new(pd, iova, len, access, gpu, -1);
	if (!r && gpu)
		emu_devmem_unregister(iova, len);
	return r;
}

/* An MR of [iova, iova+len) in the NIC's table. */
static struct ibv_mr *mr_new(struct ibv_pd *pd, uint64_t iova, size_t len, int access, int gpu, int fd)
{
	struct emu_nic *nic = to_ectx(pd->context)->nic;
	struct emu_mr *m = emu_zalloc(sizeof *m);
	if (!m)
		return NULL;
	void *addr = (void *)(uintptr_t)iova;
	static uint8_t keytag;
	pthread_mutex_lock(&nic->lock);
	uint32_t idx = EMU_FREE_SLOT(nic->mrs, EMU_MAX_MR);
	if (idx == EMU_MAX_MR)
		return emu_table_full(nic, m);
	m->addr = (uint64_t)(uintptr_t)addr;
	m->len = len;
	m->access = access;
	m->pdn = emu_pd_num(pd);
	m->gpu = gpu;
	m->dmabuf_fd = fd;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.handle = idx;
	m->mr.lkey = m->mr.rkey = (idx << 8) | (++keytag);
	m->valid = 1;
	nic->mrs[idx] = m;
	if (nic->mr_log_n < (int)(sizeof nic->mr_log / sizeof nic->mr_log[0]))
		nic->mr_log[nic->mr_log_n++] = (struct emu_mr_log){ m->mr.rkey, gpu, m->addr, len };
	pthread_mutex_unlock(&nic->lock);
	return &m->mr;
}

#undef ibv_reg_mr
EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return reg_mr_common(pd, addr, len, (uintptr_t)addr, access);
}
#undef ibv_reg_mr_iova
EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	return reg_mr_common(pd, addr, len, iova, access);
}
EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned int access)
{
	return reg_mr_common(pd, addr, len, iova, (int)access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct emu_mr *m = (struct emu_mr *)mr;
	struct emu_nic *nic = to_ectx(mr->context)->nic;
	pthread_mutex_lock(&nic->lock);
	if (mr->handle < EMU_MAX_MR && nic->mrs[mr->handle] == m)
		nic->mrs[mr->handle] = NULL;
	m->valid = 0;
	pthread_mutex_unlock(&nic->lock);
	if (m->gpu)
		emu_devmem_unregister(m->addr, m->len);
	free(m);
	return 0;
}

/* The size of a dmabuf fd when the kernel tells it (/proc/self/fdinfo "size:"
 * of a dma-buf; st_size of a memfd, which the emulated CUDA driver hands out),
 * else 0. */
static uint64_t dmabuf_size(int fd)
{
	char path[64], line[128];
	snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
	FILE *f = fopen(path, "r");
	uint64_t size = 0;
	if (f) {
		while (fgets(line, sizeof line, f))
			if (!strncmp(line, "size:", 5)) {
				size = strtoull(line + 5, NULL, 0);
				break;
			}
		fclose(f);
	}
	struct stat st;
	if (!size && fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
		size = (uint64_t)st.st_size;
	return size;
}

/* ibv_reg_dmabuf_mr (SIGMATRACE_EMU_DMABUF=1; else EOPNOTSUPP, a kernel
 * without dma-buf MRs, which NVSHMEM and NCCL answer by registering the
 * address instead).  The emulated NIC cannot read a dma-buf (the H200's
 * cannot even be mmap'ed, errno 524): it takes the iova as the GPU address of
 * the fd's memory, which is what NVSHMEM passes (the device VA the fd was
 * exported from, transport_ib_common.cpp nvshmemt_ib_common_reg_mem_handle),
 * and copies it through CUDA (dma.c).  Checked as the kernel would: a valid
 * fd, offset + length within the dma-buf where its size is known, the same
 * access rules as ibv_reg_mr; and iova must be GPU memory (else EOPNOTSUPP,
 * flagged). */
EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access)
{
	struct emu_nic *nic = to_ectx(pd->context)->nic;
	if (!nic->dmabuf_enabled) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
		errno = EBADF;
		return NULL;
	}
	uint64_t size = dmabuf_size(fd);
	if (!len || (size && (off > size || len > size - off))) {
		errno = EINVAL;
		return NULL;
	}
	if (((access & IBV_ACCESS_REMOTE_WRITE) || (access & IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	int gpu = emu_devmem_register(iova, len);
	if (gpu != 1) {
		if (gpu == 0)
			EMU_ERR("dmabuf ERROR: fd %d registered at iova 0x%llx, which is not GPU memory: the emulated NIC "
				"cannot reach a dma-buf's pages (EOPNOTSUPP)", fd, (unsigned long long)iova);
		errno = gpu < 0 ? ENOMEM : EOPNOTSUPP;
		return NULL;
	}
	struct ibv_mr *r = mr_new(pd, iova, len, access, 1, fd);
	if (!r) {
		emu_devmem_unregister(iova, len);
		return NULL;
	}
	r->addr = (void *)(uintptr_t)off; /* as rdma-core's ibv_cmd_reg_dmabuf_mr reports it */
	EMU_LOG("dmabuf MR lkey 0x%x: fd %d offset %llu + %zu at GPU iova 0x%llx", r->lkey, fd, (unsigned long long)off,
		len, (unsigned long long)iova);
	return r;
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access)
{
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}
