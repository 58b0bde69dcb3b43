/*
 * What the providers told the hijack about the setup: UARs and umems (mlx5dv
 * DevX wrappers), QPs (DevX CREATE_QP, or verbs QPs through mlx5dv_init_obj)
 * and host registrations (CUDA provider).  The pollers look their QPs up
 * here (lock-free through hijack_qp_slot) to find the SQ to recover from.
 */
#include <string.h>

#include "hijack_private.h"

pthread_mutex_t hijack_lock = PTHREAD_MUTEX_INITIALIZER;
struct uar_rec hijack_uars[MAX_UARS];
struct umem_rec hijack_umems[MAX_UMEMS];
struct reg_rec hijack_regs[MAX_REGS];
static struct qp_rec qps[QP_SLOTS];

/* QP records: open addressing with linear probing, read lock-free (the
 * pollers).  A forgotten QP's slot becomes a tombstone (QP_TOMB: lookups go on
 * past it, a new QP may take it), and tombstones followed by an empty slot
 * become empty again, so that a process that creates and destroys many QPs
 * (QPNs are not reused soon by a real HCA) neither fills the table nor makes
 * every lookup walk it.  Emptying a slot whose successor is empty never cuts
 * a live record's probe path (that path holds no empty slot, and by
 * induction none of its slots is ever emptied while the record lives). */
#define QP_TOMB 0xFFFFFFFFu /* QPNs are 24 bits */

struct qp_rec *hijack_qp_slot(uint32_t qpn, int create)
{
	uint32_t h = (qpn * 2654435761u) & (QP_SLOTS - 1);
	struct qp_rec *tomb = NULL;
	for (uint32_t i = 0; i < QP_SLOTS; i++) {
		struct qp_rec *q = &qps[(h + i) & (QP_SLOTS - 1)];
		uint32_t k = __atomic_load_n(&q->qpn, __ATOMIC_ACQUIRE);
		if (k == qpn)
			return q;
		if (k == QP_TOMB) {
			if (!tomb)
				tomb = q;
			continue;
		}
		if (k == 0)
			return create ? (tomb ? tomb : q) : NULL;
	}
	return create ? tomb : NULL;
}

/* QP record q goes (under hijack_lock). */
void hijack_qp_free(struct qp_rec *q)
{
	__atomic_store_n(&q->live, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&q->qpn, QP_TOMB, __ATOMIC_RELEASE);
	uint32_t i = (uint32_t)(q - qps);
	if (__atomic_load_n(&qps[(i + 1) & (QP_SLOTS - 1)].qpn, __ATOMIC_ACQUIRE) != 0)
		return;
	/* the tombstones that end at an empty slot: empty again, backwards */
	for (uint32_t n = 0; n < QP_SLOTS && __atomic_load_n(&qps[i].qpn, __ATOMIC_ACQUIRE) == QP_TOMB; n++) {
		__atomic_store_n(&qps[i].qpn, 0, __ATOMIC_RELEASE);
		i = (i - 1) & (QP_SLOTS - 1);
	}
}

void st_hijack_note_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx)
{
	pthread_mutex_lock(&hijack_lock);
	int free_i = -1;
	for (int i = 0; i < MAX_UARS; i++) {
		if (hijack_uars[i].live && hijack_uars[i].reg == (uintptr_t)reg_addr) {
			free_i = i;
			break;
		}
		if (!hijack_uars[i].live && free_i < 0)
			free_i = i;
	}
	if (free_i >= 0)
		hijack_uars[free_i] = (struct uar_rec){(uintptr_t)reg_addr, (uintptr_t)base_addr, page_id, ctx, 1};
	pthread_mutex_unlock(&hijack_lock);
}

void st_hijack_note_umem(uint32_t umem_id, void *addr, uint64_t size, int gpu)
{
	pthread_mutex_lock(&hijack_lock);
	int free_i = -1;
	for (int i = 0; i < MAX_UMEMS; i++) {
		if (hijack_umems[i].live && hijack_umems[i].id == umem_id) {
			free_i = i;
			break;
		}
		if (!hijack_umems[i].live && free_i < 0)
			free_i = i;
	}
	if (free_i >= 0)
		hijack_umems[free_i] = (struct umem_rec){umem_id, (uintptr_t)addr, size, gpu, 1};
	pthread_mutex_unlock(&hijack_lock);
}

/* A umem goes (after a successful dereg, before the application can free
 * its memory): the pollers that may hold a QP's SQ or doorbell-record
 * pointer into it look them up again before this returns (the handshake of
 * hijack_sync_pages), so none reads the memory after it is freed. */
void st_hijack_forget_umem(uint32_t umem_id)
{
	pthread_mutex_lock(&hijack_lock);
	int found = 0;
	for (int i = 0; i < MAX_UMEMS; i++)
		if (hijack_umems[i].live && hijack_umems[i].id == umem_id) {
			hijack_umems[i].live = 0;
			found = 1;
		}
	if (found) {
		unsigned char want[MAX_PAGES] = {0};
		int any = 0;
		for (uint32_t i = 0; i < QP_SLOTS; i++) {
			const struct qp_rec *q = &qps[i];
			uint32_t k = __atomic_load_n(&q->qpn, __ATOMIC_ACQUIRE);
			if (k && k != QP_TOMB && q->live && (q->wq_umem == umem_id || q->dbr_umem == umem_id)) {
				hijack_pages_of_uar(q->uar_page, want);
				any = 1;
			}
		}
		if (any)
			hijack_sync_pages(want);
	}
	pthread_mutex_unlock(&hijack_lock);
}

static uint64_t qp_gen;
uint64_t hijack_qp_table_full; /* QPs not recorded: no free slot (their WQEs are not recovered) */
void st_hijack_note_qp(uint32_t qpn, uint32_t uar_page, uint32_t wq_umem_id, uint64_t sq_offset,
		       uint32_t log_sq_size, uint32_t dbr_umem_id, uint64_t dbr_offset)
{
	if (!qpn || log_sq_size > 15)
		return;
	pthread_mutex_lock(&hijack_lock);
	struct qp_rec *q = hijack_qp_slot(qpn, 1);
	if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && q->uar_page == uar_page && q->wq_umem == wq_umem_id &&
	    q->sq_offset == sq_offset && q->log_sq == log_sq_size && q->dbr_umem == dbr_umem_id &&
	    q->dbr_offset == dbr_offset) {
		/* told again about the same live QP (mlx5dv_init_obj called twice):
		 * its pollers keep their producer index */
		pthread_mutex_unlock(&hijack_lock);
		return;
	}
	if (!q)
		hijack_qp_table_full++;
	if (q) {
		__atomic_store_n(&q->live, 0, __ATOMIC_RELEASE);
		__atomic_thread_fence(__ATOMIC_RELEASE);
		q->uar_page = uar_page;
		q->wq_umem = wq_umem_id;
		q->sq_offset = sq_offset;
		q->log_sq = log_sq_size;
		q->dbr_umem = dbr_umem_id;
		q->dbr_offset = dbr_offset;
		__atomic_store_n(&q->gen, ++qp_gen, __ATOMIC_RELAXED); /* published by the release store of live below */
		__atomic_store_n(&q->qpn, qpn, __ATOMIC_RELEASE);
		__atomic_store_n(&q->live, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&hijack_lock);
}

/* A DevX QP goes (before the destroy): its record is freed and the pollers
 * of its UAR's pages scan once more, finish every copy and drop its state
 * before this returns (the handshake the verbs path has), so none reads its
 * SQ after the destroy. */
void st_hijack_forget_qp(uint32_t qpn)
{
	pthread_mutex_lock(&hijack_lock);
	struct qp_rec *q = hijack_qp_slot(qpn, 0);
	if (q) {
		uint32_t uar_page = q->uar_page;
		hijack_qp_free(q);
		unsigned char want[MAX_PAGES] = {0};
		hijack_pages_of_uar(uar_page, want);
		hijack_sync_pages(want);
	}
	pthread_mutex_unlock(&hijack_lock);
}

/* The SQ of a QP as (address, is-GPU); under hijack_lock. */
int hijack_qp_sq(const struct qp_rec *q, uintptr_t *sq, int *gpu)
{
	for (int i = 0; i < MAX_UMEMS; i++)
		if (hijack_umems[i].live && hijack_umems[i].id == q->wq_umem) {
			uint64_t bytes = 64ull << q->log_sq;
			if (q->sq_offset + bytes > hijack_umems[i].size)
				return -1;
			*sq = hijack_umems[i].addr + q->sq_offset;
			*gpu = hijack_umems[i].gpu;
			return 0;
		}
	return -1;
}

uintptr_t hijack_qp_dbr(const struct qp_rec *q)
{
	for (int i = 0; i < MAX_UMEMS; i++)
		if (hijack_umems[i].live && hijack_umems[i].id == q->dbr_umem)
			return hijack_umems[i].gpu || q->dbr_offset + 8 > hijack_umems[i].size ? 0 : hijack_umems[i].addr + q->dbr_offset;
	return 0;
}

/* ---- CUDA provider hooks ------------------------------------------------------------ */
void st_hijack_on_register(void *p, size_t size, unsigned flags)
{
	pthread_mutex_lock(&hijack_lock);
	for (int i = 0; i < MAX_REGS; i++)
		if (!hijack_regs[i].live) {
			hijack_regs[i] = (struct reg_rec){(uintptr_t)p, size, flags, 1};
			break;
		}
	pthread_mutex_unlock(&hijack_lock);
}
