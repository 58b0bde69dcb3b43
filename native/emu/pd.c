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

/* ---- PD numbers ------------------------------------------------------------------ */
/* Atomic, no lock: rdma-core's mlx5 allocates and frees a PD with one kernel command and takes no
 * lock of its own there, so a child forked while another thread was in ibv_alloc_pd can still
 * deallocate a PD; a NIC lock here left such a child hung on a lock it inherited locked
 * (tests/test_trace_verbs_support.py, test_fork_while_threads_hold_the_providers_locks). */
EXPORT uint32_t emu_pd_alloc_num(struct emu_nic *nic)
{
	for (uint32_t k = 0; k < EMU_MAX_PD - 1; k++) {
		uint32_t n = __atomic_fetch_add(&nic->next_pdn, 1, __ATOMIC_RELAXED) % EMU_MAX_PD;
		uint8_t free_slot = 0;
		if (n && __atomic_compare_exchange_n(&nic->pd_live[n], &free_slot, 1, 0, __ATOMIC_ACQ_REL,
						     __ATOMIC_RELAXED))
			return n;
	}
	return 0;
}

EXPORT void emu_pd_free_num(struct emu_nic *nic, uint32_t pdn)
{
	if (pdn && pdn < EMU_MAX_PD)
		__atomic_store_n(&nic->pd_live[pdn], 0, __ATOMIC_RELEASE);
}

EXPORT int emu_pd_alive(struct emu_nic *nic, uint32_t pdn)
{
	return pdn && pdn < EMU_MAX_PD && __atomic_load_n(&nic->pd_live[pdn], __ATOMIC_ACQUIRE);
}

/* ---- PD ------------------------------------------------------------------------ */
EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct emu_pd *p = emu_zalloc(sizeof *p);
	if (!p)
		return NULL;
	p->pdn = emu_pd_alloc_num(to_ectx(c)->nic);
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
	if (__atomic_load_n(&p->refs, __ATOMIC_ACQUIRE)) /* rdma-core: a PD used by a parent domain, or a domain by objects */
		return EBUSY;
	if (p->parent)
		__atomic_fetch_sub(&p->parent->refs, 1, __ATOMIC_ACQ_REL);
	else
		emu_pd_free_num(to_ectx(pd->context)->nic, p->pdn);
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
	__atomic_fetch_add(&base->refs, 1, __ATOMIC_ACQ_REL);
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
			__atomic_fetch_add(&p->refs, 1, __ATOMIC_ACQ_REL);
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
		__atomic_fetch_sub(&b->pd->refs, 1, __ATOMIC_ACQ_REL);
	} else {
		free(b->ptr);
	}
	b->ptr = NULL;
}

/* An object's ring of `bytes` (page-aligned) and its doorbell record: on a parent domain from its
 * allocators (ring and dbr hold them; also when the allocator answers USE_DEFAULT), else the
 * emulator's own ring (returned, ring and dbr left empty: the record is the object's own storage).
 * The ring, or NULL (out of memory). */
EXPORT uint8_t *emu_ring_alloc(struct emu_buf *ring, struct emu_buf *dbr, struct ibv_pd *pd, size_t bytes,
			       uint64_t type)
{
	memset(ring, 0, sizeof *ring);
	memset(dbr, 0, sizeof *dbr);
	if (!pd || emu_pd_of(pd) == (struct emu_pd *)pd)
		return aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
	if (emu_buf_alloc(ring, pd, bytes, 4096, type) || emu_buf_alloc(dbr, pd, ST_MLX5_DBR_SIZE, 8, MLX5DV_RES_TYPE_DBR)) {
		emu_buf_free(ring);
		return NULL;
	}
	return ring->ptr;
}

/* ... and back: own is the ring emu_ring_alloc returned. */
EXPORT void emu_ring_free(struct emu_buf *ring, struct emu_buf *dbr, uint8_t *own)
{
	if (ring->ptr || dbr->ptr) {
		emu_buf_free(ring);
		emu_buf_free(dbr);
	} else {
		free(own);
	}
}
