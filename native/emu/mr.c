/* libibverbs.so.1 of the emulated HCA: protection domains and memory
 * regions.  An MR is an entry of the NIC's MR table (keys index it), which
 * the NIC checks every local and remote access against. */
#include <errno.h>
#include <stdlib.h>

#include "emu_internal.h"

/* ---- PD / MR ------------------------------------------------------------- */
EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct emu_pd *p = emu_zalloc(sizeof *p);
	if (!p)
		return NULL;
	struct emu_nic *nic = to_ectx(c)->nic;
	pthread_mutex_lock(&nic->lock);
	p->pdn = nic->next_pdn++;
	pthread_mutex_unlock(&nic->lock);
	p->pd.context = c;
	p->pd.handle = p->pdn;
	return &p->pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

EXPORT uint32_t emu_pd_num(struct ibv_pd *pd) { return ((struct emu_pd *)pd)->pdn; }

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
	struct emu_nic *nic = to_ectx(pd->context)->nic;
	struct emu_mr *m = emu_zalloc(sizeof *m);
	if (!m)
		return NULL;
	static uint8_t keytag;
	pthread_mutex_lock(&nic->lock);
	uint32_t idx = EMU_FREE_SLOT(nic->mrs, EMU_MAX_MR);
	if (idx == EMU_MAX_MR)
		return emu_table_full(nic, m);
	m->addr = (uint64_t)(uintptr_t)addr;
	m->len = len;
	m->access = access;
	m->pdn = ((struct emu_pd *)pd)->pdn;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.handle = idx;
	m->mr.lkey = m->mr.rkey = (idx << 8) | (++keytag);
	m->valid = 1;
	nic->mrs[idx] = m;
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
	free(m);
	return 0;
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access)
{
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}
