/* The emulated NIC's object tables: QPs (by QPN), CQs (by CQN), MRs (by
 * key) and the UAR pages it samples.  Callers hold the NIC lock. */
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

/* ---- object tables --------------------------------------------------------- */
EXPORT struct emu_mr *emu_mr_lookup(struct emu_nic *nic, uint32_t key)
{
	uint32_t idx = key >> 8;
	if (idx >= EMU_MAX_MR)
		return NULL;
	struct emu_mr *m = nic->mrs[idx];
	if (!m || !m->valid || m->mr.lkey != key)
		return NULL;
	return m;
}

EXPORT struct emu_qp *emu_qp_lookup(struct emu_nic *nic, uint32_t qpn)
{
	if (qpn < EMU_QPN_BASE || qpn >= EMU_QPN_BASE + EMU_MAX_QP)
		return NULL;
	return nic->qps[qpn - EMU_QPN_BASE];
}

EXPORT int emu_qp_register(struct emu_nic *nic, struct emu_qp *qp)
{
	static uint32_t rot;
	for (uint32_t k = 0; k < EMU_MAX_QP; k++) {
		uint32_t i = (rot + k) % EMU_MAX_QP;
		if (!nic->qps[i]) {
			rot = i + 1;
			static uint64_t serials;
			nic->qps[i] = qp;
			qp->qpn = EMU_QPN_BASE + i;
			qp->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
			qp->nic = nic;
			nic->qlist[nic->nq++] = qp;
			qp->in_table = 1;
			return 0;
		}
	}
	return -1;
}

EXPORT void emu_qp_unregister(struct emu_nic *nic, struct emu_qp *qp)
{
	if (!qp->in_table)
		return;
	nic->qps[qp->qpn - EMU_QPN_BASE] = NULL;
	for (int i = 0; i < nic->nq; i++)
		if (nic->qlist[i] == qp) {
			nic->qlist[i] = nic->qlist[--nic->nq];
			break;
		}
	emu_free_pending(qp);
	qp->in_table = 0;
}

EXPORT int emu_cq_register(struct emu_nic *nic, struct emu_cq *cq)
{
	uint32_t i = EMU_FREE_SLOT(nic->cqs, EMU_MAX_CQ);
	if (i == EMU_MAX_CQ)
		return -1;
	nic->cqs[i] = cq;
	cq->cqn = i;
	return 0;
}

EXPORT struct emu_cq *emu_cq_lookup(struct emu_nic *nic, uint32_t cqn)
{
	return cqn < EMU_MAX_CQ ? nic->cqs[cqn] : NULL;
}

EXPORT struct emu_uar *emu_uar_alloc(struct emu_nic *nic, int devx)
{
	struct emu_uar *u = calloc(1, sizeof *u);
	if (!u)
		return NULL;
	u->page = aligned_alloc(4096, ST_MLX5_ADAPTER_PAGE_SIZE);
	if (!u->page) {
		free(u);
		return NULL;
	}
	memset(u->page, 0, ST_MLX5_ADAPTER_PAGE_SIZE);
	u->page_id = ++nic->next_uar_id;
	u->devx = devx;
	u->refs = 1;
	pthread_spin_init(&u->bf_lock, PTHREAD_PROCESS_PRIVATE);
	u->next = nic->uars;
	nic->uars = u;
	if (devx) /* read by the NIC thread without the lock (its idle back-off) */
		__atomic_fetch_add(&nic->have_devx_uars, 1, __ATOMIC_RELAXED);
	return u;
}

EXPORT void emu_uar_free(struct emu_nic *nic, struct emu_uar *u)
{
	for (struct emu_uar **pp = &nic->uars; *pp; pp = &(*pp)->next)
		if (*pp == u) {
			*pp = u->next;
			break;
		}
	if (u->devx || u->cq_page)
		__atomic_fetch_sub(&nic->have_devx_uars, 1, __ATOMIC_RELAXED);
	free(u->page);
	free(u);
}

int emu_check_local(struct emu_nic *nic, uint32_t lkey, uint64_t addr, uint32_t len, int need_write)
{
	if (!len)
		return 0;
	struct emu_mr *m = emu_mr_lookup(nic, lkey);
	if (!m)
		return -1;
	if (addr < m->addr || addr + len > m->addr + m->len || addr + len < addr)
		return -1;
	if (need_write && !(m->access & IBV_ACCESS_LOCAL_WRITE))
		return -1;
	return 0;
}
