/* libibverbs.so.1 of the emulated HCA: protection domains and parent
 * domains (ibv_alloc_parent_domain), and the buffers of objects created on
 * a parent domain.
 *
 * A parent domain (rdma-core verbs.h, man ibv_alloc_parent_domain) stands
 * for its protection domain wherever a PD is taken: QPs, SRQs, MRs, AHs,
 * mlx5dv_create_cq (IBV_CQ_INIT_ATTR_MASK_PD) and mlx5dv_init_obj(PD), which
 * reports the protection domain's number.  With
 * IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS the objects' rings and doorbell
 * records come from the application's alloc callback, as rdma-core's mlx5
 * provider asks for them: resource type MLX5DV_RES_TYPE_QP/SRQ/CQ for a
 * ring (page-aligned), MLX5DV_RES_TYPE_DBR for an 8-byte doorbell record
 * (8-aligned); IBV_ALLOCATOR_USE_DEFAULT means the emulator's own memory.
 * The buffers go back through the free callback when the object is
 * destroyed.  Thread domains are not emulated: ibv_alloc_td fails, so a
 * parent domain with a td is refused (EOPNOTSUPP).
 *
 * PD numbers are allocated from the NIC's table (pd_live), which DevX
 * ALLOC_PD shares and DevX CREATE_QP/CREATE_DCT check their pd field
 * against. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

/* ---- PD numbers (NIC lock held) ------------------------------------------------ */
EXPORT uint32_t emu_pd_alloc_num(struct emu_nic *nic)
{
	for (uint32_t k = 0; k < EMU_MAX_PD - 1; k++) {
		uint32_t n = nic->next_pdn;
		nic->next_pdn = n + 1 >= EMU_MAX_PD ? 1 : n + 1;
		if (n && n < EMU_MAX_PD && !nic->pd_live[n]) {
			nic->pd_live[n] = 1;
			return n;
		}
	}
	return 0;
}

EXPORT void emu_pd_free_num(struct emu_nic *nic, uint32_t pdn)
{
	if (pdn && pdn < EMU_MAX_PD)
		nic->pd_live[pdn] = 0;
}

EXPORT int emu_pd_alive(struct emu_nic *nic, uint32_t pdn)
{
	return pdn && pdn < EMU_MAX_PD && nic->pd_live[pdn];
}

/* ---- PD ------------------------------------------------------------------------ */
EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct emu_pd *p = emu_zalloc(sizeof *p);
	if (!p)
		return NULL;
	struct emu_nic *nic = to_ectx(c)->nic;
	pthread_mutex_lock(&nic->lock);
	p->pdn = emu_pd_alloc_num(nic);
	pthread_mutex_unlock(&nic->lock);
	if (!p->pdn) {
		free(p);
		errno = ENOMEM;
		return NULL;
	}
	p->pd.context = c;
	p->pd.handle = p->pdn;
	return &p->pd;
}

EXPORT struct emu_pd *emu_pd_of(struct ibv_pd *pd)
{
	struct emu_pd *p = (struct emu_pd *)pd;
	return p && p->parent ? p->parent : p;
}

/* The PD number of a PD or parent domain (mlx5dv_init_obj(PD) for libmlx5.so.1). */
EXPORT uint32_t emu_pd_num(struct ibv_pd *pd) { return emu_pd_of(pd)->pdn; }

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct emu_pd *p = (struct emu_pd *)pd;
	struct emu_nic *nic = to_ectx(pd->context)->nic;
	pthread_mutex_lock(&nic->lock);
	if (p->refs) { /* rdma-core: a PD still used by a parent domain, or a domain by objects */
		pthread_mutex_unlock(&nic->lock);
		return EBUSY;
	}
	if (p->parent)
		p->parent->refs--;
	else
		emu_pd_free_num(nic, p->pdn);
	pthread_mutex_unlock(&nic->lock);
	free(p);
	return 0;
}

/* ---- parent domains ------------------------------------------------------------ */
struct ibv_pd *emu_alloc_parent_domain(struct ibv_context *c, struct ibv_parent_domain_init_attr *a)
{
	const uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	struct emu_pd *base = a ? (struct emu_pd *)a->pd : NULL;
	if (!a || !base || base->parent || base->pd.context != c || (a->comp_mask & ~known)) {
		errno = EINVAL;
		return NULL;
	}
	if (a->td) {
		errno = EOPNOTSUPP; /* thread domains are not emulated */
		return NULL;
	}
	if ((a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (!a->alloc || !a->free)) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_pd *p = emu_zalloc(sizeof *p);
	if (!p)
		return NULL;
	struct emu_nic *nic = to_ectx(c)->nic;
	p->parent = base;
	p->pdn = base->pdn;
	p->pd.context = c;
	p->pd.handle = base->pd.handle;
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		p->alloc = a->alloc;
		p->free = a->free;
	}
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		p->pd_context = a->pd_context;
	pthread_mutex_lock(&nic->lock);
	base->refs++;
	pthread_mutex_unlock(&nic->lock);
	EMU_LOG("parent domain of pd %u%s", base->pdn, p->alloc ? " with allocators" : "");
	return &p->pd;
}

/* ---- object buffers ------------------------------------------------------------- */
/* A zeroed buffer of `size` bytes for an object created on pd: from the
 * parent domain's allocator when it has one (and does not answer
 * IBV_ALLOCATOR_USE_DEFAULT), else the emulator's own.  0, or ENOMEM. */
EXPORT int emu_buf_alloc(struct emu_buf *b, struct ibv_pd *pd, size_t size, size_t align, uint64_t type)
{
	struct emu_pd *p = (struct emu_pd *)pd;
	memset(b, 0, sizeof *b);
	b->size = size;
	b->type = type;
	if (p && p->parent && p->alloc) {
		void *r = p->alloc(pd, p->pd_context, size, align, type);
		if (!r)
			return ENOMEM;
		if (r != IBV_ALLOCATOR_USE_DEFAULT) {
			b->ptr = r;
			b->pd = p;
			memset(r, 0, size);
			pthread_mutex_lock(&to_ectx(pd->context)->nic->lock);
			p->refs++;
			pthread_mutex_unlock(&to_ectx(pd->context)->nic->lock);
			return 0;
		}
	}
	b->ptr = aligned_alloc(align, (size + align - 1) & ~(align - 1));
	if (!b->ptr)
		return ENOMEM;
	memset(b->ptr, 0, size);
	return 0;
}

EXPORT void emu_buf_free(struct emu_buf *b)
{
	if (!b->ptr)
		return;
	if (b->pd) {
		b->pd->free(&b->pd->pd, b->pd->pd_context, b->ptr, b->type);
		pthread_mutex_lock(&to_ectx(b->pd->pd.context)->nic->lock);
		b->pd->refs--;
		pthread_mutex_unlock(&to_ectx(b->pd->pd.context)->nic->lock);
	} else {
		free(b->ptr);
	}
	b->ptr = NULL;
}
