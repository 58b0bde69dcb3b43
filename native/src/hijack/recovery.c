/*
 * WQE recovery (F9, F24c): after a doorbell announces WQEBBs [pi, new pi) of
 * a QP, the poller copies them out of the QP's SQ into its staging ring
 * (memcpy for host SQs, a CUDA stream for device-memory SQs, twice when
 * double_copy asks for torn-slot detection), closes batches of copies with
 * CUDA events, and parses each range once its batch completed: a WQE is
 * recorded only if its control segment carries the expected index and QPN.
 * Ranges that cannot be verified are recorded as lost, with the reason.
 */
#include <string.h>
#include <sys/mman.h>

#include "arch.h"
#include "hijack_private.h"

/* s follows record q (its SQ looked up under hijack_lock: umems change; the
 * slot may have gone to another QP since the lock-free lookup). */
static void qpstate_load(struct qpstate *s, const struct qp_rec *q)
{
	pthread_mutex_lock(&hijack_lock);
	if (q->qpn == s->qpn && q->live) {
		s->gen = q->gen;
		s->log_sq = q->log_sq;
		s->known = 1;
		s->have_sq = hijack_qp_sq(q, &s->sq, &s->gpu) == 0;
		s->dbr = hijack_qp_dbr(q);
	} else
		s->have_sq = 0, s->dbr = 0;
	pthread_mutex_unlock(&hijack_lock);
}

/* Is s a QP that no longer exists (record gone, dead, or made again) and
 * has nothing pending?  Then its entry can go. */
static int qpstate_dead(const struct qpstate *s)
{
	if (s->npend)
		return 0;
	struct qp_rec *q = hijack_qp_slot(s->qpn, 0);
	return !q || !__atomic_load_n(&q->live, __ATOMIC_ACQUIRE) || (s->known && __atomic_load_n(&q->gen, __ATOMIC_ACQUIRE) != s->gen);
}

static void qpstate_free(struct page *pg, struct qpstate *s)
{
	pg->gone_ok += s->wqebb_ok;
	pg->gone_lost += s->wqebb_lost;
	pg->gone_wqes += s->wqe_ok;
	s->used = 0;
	if (s == &pg->qs[pg->nqs - 1])
		while (pg->nqs && !pg->qs[pg->nqs - 1].used)
			pg->nqs--;
}

void hijack_page_qp_gc(struct page *pg)
{
	for (int i = 0; i < pg->nqs; i++)
		if (pg->qs[i].used && qpstate_dead(&pg->qs[i]))
			qpstate_free(pg, &pg->qs[i]);
}

void hijack_page_qp_refresh(struct page *pg)
{
	hijack_page_qp_gc(pg);
	for (int i = 0; i < pg->nqs; i++) {
		struct qpstate *s = &pg->qs[i];
		if (!s->used || (!s->have_sq && !s->dbr))
			continue;
		struct qp_rec *q = hijack_qp_slot(s->qpn, 0);
		if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && __atomic_load_n(&q->gen, __ATOMIC_ACQUIRE) == s->gen)
			qpstate_load(s, q); /* its umems may be gone: have_sq / dbr follow */
		else
			s->have_sq = 0, s->dbr = 0; /* recreated or gone: hijack_page_qp starts it over */
	}
}

struct qpstate *hijack_page_qp(struct page *pg, uint32_t qpn)
{
	struct qpstate *fresh = NULL;
	for (int i = 0; i < pg->nqs; i++) {
		if (!pg->qs[i].used) {
			if (!fresh)
				fresh = &pg->qs[i];
			continue;
		}
		if (pg->qs[i].qpn == qpn) {
			struct qpstate *s = &pg->qs[i];
			struct qp_rec *q = hijack_qp_slot(qpn, 0);
			if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && __atomic_load_n(&q->gen, __ATOMIC_ACQUIRE) != s->gen) {
				/* QP recreated with the same number: start over */
				s->pi = 0;
				s->rung = 0;
				qpstate_load(s, q);
			} else if ((s->have_sq || s->dbr) && (!q || !__atomic_load_n(&q->live, __ATOMIC_ACQUIRE))) {
				s->have_sq = 0; /* forgotten (QP destroyed): its SQ and doorbell record may be freed */
				s->dbr = 0;
			} else if (!s->have_sq && q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE)) {
				qpstate_load(s, q);
			}
			return s;
		}
	}
	if (!fresh && pg->nqs < MAX_QPS_PER_PAGE)
		fresh = &pg->qs[pg->nqs++];
	if (!fresh) {
		/* full: the entries of destroyed QPs go (their counters stay in the page's totals) */
		hijack_page_qp_gc(pg);
		for (int i = 0; i < pg->nqs && !fresh; i++)
			if (!pg->qs[i].used)
				fresh = &pg->qs[i];
		if (!fresh && pg->nqs < MAX_QPS_PER_PAGE)
			fresh = &pg->qs[pg->nqs++];
		if (!fresh)
			return NULL;
	}
	struct qpstate *s = fresh;
	memset(s, 0, sizeof *s);
	s->used = 1;
	s->qpn = qpn;
	struct qp_rec *q = hijack_qp_slot(qpn, 0);
	if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE))
		qpstate_load(s, q);
	return s;
}

static inline uint32_t be32(const uint8_t *b)
{
	return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

/* Verify and record one copied range (ref §1.2, §3.4: ctrl wqe_index is the
 * WQEBB counter mod 2^16; DS counts 16-byte units incl. ctrl). */
static void parse_pend(struct page *pg, struct pend *p)
{
	struct qpstate *s = p->qs;
	const uint8_t *b = pg->stage + (size_t)p->stage * 64;
	const uint8_t *b2 = hijack_cfg.double_copy ? b + (size_t)p->cnt * 64 : NULL;
	uint32_t n = 1u << s->log_sq;
	uint32_t i = 0, reason = 0;
	if (p->copy_failed)
		reason = ST_WQE_LOST_COPY_FAILED;
	while (!reason && i < p->cnt) {
		const uint8_t *c = b + (size_t)i * 64;
		uint32_t w0 = be32(c), w1 = be32(c + 4);
		uint16_t idx = (uint16_t)(w0 >> 8);
		uint16_t want = (uint16_t)(p->first + i);
		uint32_t ds = w1 & 0x3f, nbb = (ds + 3) / 4;
		if (idx != want) {
			/* the slot holds another lap's WQE: overwritten before the copy */
			reason = ((uint16_t)(idx - want) & (n - 1)) == 0 ? ST_WQE_LOST_OVERWRITTEN : ST_WQE_LOST_CORRUPT;
			break;
		}
		if ((w1 >> 8) != s->qpn || ds == 0 || i + nbb > p->cnt) {
			reason = ST_WQE_LOST_CORRUPT;
			break;
		}
		if (b2 && memcmp(c, b2 + (size_t)i * 64, (size_t)nbb * 64)) {
			reason = ST_WQE_LOST_OVERWRITTEN; /* changed while being copied */
			break;
		}
		s->wqe_ok++;
		i += nbb;
	}
	if (i) {
		struct st_side_wqe h = {s->qpn, (uint16_t)p->first, (uint16_t)i, s->log_sq, ST_WQE_F_VERIFIED};
		uint64_t id = st_side_add(ST_SIDE_WQE_BYTES, &h, sizeof h, b, (size_t)i * 64, NULL, 0);
		if (id) {
			st_ev(ST_EV_DB_WQE, (uint16_t)p->first, s->qpn, id);
			s->wqebb_ok += i;
		} else {
			/* the poller's side ring was full (the writer is behind): never wait, say so */
			st_ev_ext(ST_EV_DB_WQE_LOST, (uint16_t)p->first, s->qpn, i, 0, 0, ST_WQE_LOST_TRACE_DROPPED, 0);
			s->wqebb_lost += i;
		}
	}
	if (i < p->cnt) {
		st_ev_ext(ST_EV_DB_WQE_LOST, (uint16_t)(p->first + i), s->qpn, p->cnt - i, 0, 0, reason, 0);
		s->wqebb_lost += p->cnt - i;
	}
}

/* Parse every pending range whose batch has completed. */
void hijack_drain(struct page *pg, int wait)
{
	const struct st_cudrv *d = drv();
	while (pg->pend_tail != pg->pend_head) {
		struct pend *p = &pg->pend[pg->pend_tail % MAX_PEND];
		if (p->batch >= pg->batch_done) {
			/* its batch: closed with an event, or still open */
			if (p->batch == pg->batch_open) {
				if (!wait)
					return;
				if (pg->stream)
					d->StreamSynchronize(pg->stream), pg->sync_waits++;
				pg->batch_done = pg->batch_open + 1;
				pg->batch_open++;
				pg->batch_wqebb = 0;
			} else {
				st_CUevent e = pg->ev[p->batch % MAX_BATCH];
				if (wait) {
					d->EventSynchronize(e);
					pg->sync_waits++;
				} else if (d->EventQuery(e) == ST_CUDA_ERROR_NOT_READY)
					return;
				pg->batch_done = p->batch + 1;
			}
		}
		parse_pend(pg, p);
		if (p->qs->npend && --p->qs->npend)
			p->qs->pend_oldest = p->first + p->cnt; /* its next range starts here (or later) */
		pg->stage_tail = p->stage + p->cnt * (hijack_cfg.double_copy ? 2 : 1);
		pg->pend_tail++;
		if (pg->pend_tail == pg->pend_head)
			pg->stage_head = pg->stage_tail = 0; /* empty: restart the ring at 0 */
	}
}

void hijack_close_batch(struct page *pg)
{
	if (!pg->batch_wqebb)
		return;
	if (pg->stream && pg->batch_open - pg->batch_done + 1 >= MAX_BATCH)
		hijack_drain(pg, 1);
	if (pg->stream) {
		drv()->EventRecord(pg->ev[pg->batch_open % MAX_BATCH], pg->stream);
		pg->batch_open++;
	} else {
		pg->batch_open++;
		pg->batch_done = pg->batch_open; /* memcpy path: complete already */
	}
	pg->batch_wqebb = 0;
}

/* Reserve a contiguous staging area of w WQEBBs. */
static int stage_alloc(struct page *pg, uint32_t w, uint32_t *off)
{
	for (int attempt = 0; attempt < 3; attempt++) {
		uint32_t cap = hijack_cfg.stage_wqebb;
		if (pg->pend_tail == pg->pend_head)
			pg->stage_head = pg->stage_tail = 0;
		if (pg->stage_head >= pg->stage_tail) {
			if (pg->stage_head + w <= cap) {
				*off = pg->stage_head;
				pg->stage_head += w;
				return 0;
			}
			if (w < pg->stage_tail) { /* wrap to 0 */
				*off = 0;
				pg->stage_head = w;
				return 0;
			}
		} else if (pg->stage_head + w < pg->stage_tail) {
			*off = pg->stage_head;
			pg->stage_head += w;
			return 0;
		}
		if ((pg->pend_head - pg->pend_tail) == 0)
			return -1;
		hijack_close_batch(pg);
		hijack_drain(pg, 1);
	}
	return -1;
}

/* Start copying [s->pi, newpi) of the QP's SQ into the staging ring. */
void hijack_issue_copy(struct page *pg, struct qpstate *s, uint32_t first, uint32_t cnt)
{
	const struct st_cudrv *d = drv();
	uint32_t n = 1u << s->log_sq;
	if (pg->pend_head - pg->pend_tail >= MAX_PEND - 1) {
		hijack_close_batch(pg);
		hijack_drain(pg, 1);
	}
	int copies = hijack_cfg.double_copy ? 2 : 1;
	uint32_t off;
	if (stage_alloc(pg, cnt * copies, &off) != 0) {
		st_ev_ext(ST_EV_DB_WQE_LOST, (uint16_t)first, s->qpn, cnt, 0, 0, ST_WQE_LOST_RING_FULL, 0);
		s->wqebb_lost += cnt;
		return;
	}
	struct pend *p = &pg->pend[pg->pend_head % MAX_PEND];
	*p = (struct pend){s, first, cnt, off, pg->batch_open, 0};
	if (!s->npend++)
		s->pend_oldest = first;
	uint32_t s0 = first & (n - 1);
	uint32_t c1 = cnt < n - s0 ? cnt : n - s0, c2 = cnt - c1; /* wrap-around: two pieces */
	for (int k = 0; k < copies; k++) {
		uint8_t *dst = pg->stage + (size_t)(off + (uint32_t)k * cnt) * 64;
		if (s->gpu && pg->stream) {
			int r = d->MemcpyDtoHAsync(dst, (uint64_t)(s->sq + (uint64_t)s0 * 64), (size_t)c1 * 64, pg->stream);
			if (!r && c2)
				r = d->MemcpyDtoHAsync(dst + (size_t)c1 * 64, (uint64_t)s->sq, (size_t)c2 * 64, pg->stream);
			if (r)
				p->copy_failed = 1;
		} else if (!s->gpu) {
			/* a racy read by design: the application may be writing the next WQEs into the ring
			 * while it is copied; every copied WQE is checked (parse, index, guard) before use */
			racy_read_begin();
			memcpy(dst, (const void *)(s->sq + (uint64_t)s0 * 64), (size_t)c1 * 64);
			if (c2)
				memcpy(dst + (size_t)c1 * 64, (const void *)s->sq, (size_t)c2 * 64);
			racy_read_end();
		} else {
			p->copy_failed = 1;
		}
	}
	pg->copies++;
	pg->pend_head++;
	pg->batch_wqebb += cnt;
}

/* The staging ring (every poller; host SQs are copied with memcpy). */
void hijack_poller_stage_alloc(struct page *pg)
{
	size_t bytes = (size_t)hijack_cfg.stage_wqebb * 64;
	pg->stage = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (pg->stage == MAP_FAILED) {
		pg->stage = NULL;
		return;
	}
	madvise(pg->stage, bytes, MADV_DONTFORK); /* pinned: a fork must not make it copy-on-write */
}

/* CUDA for device-memory SQs: pinned staging ring, a non-blocking stream and
 * its events, in the context of the application's doorbell request. */
void hijack_poller_attach_cuda(struct page *pg)
{
	const struct st_cudrv *d = drv();
	if (pg->cuda_on || !pg->stage || !d || !pg->cuctx || hijack_cfg.mode == HIJACK_FORWARD)
		return;
	pg->cuda_on = 1;
	if (d->CtxSetCurrent(pg->cuctx) != 0)
		return;
	if (d->MemHostRegister(pg->stage, (size_t)hijack_cfg.stage_wqebb * 64, ST_CU_MEMHOSTREGISTER_PORTABLE) == 0)
		pg->stage_pinned = 1;
	if (d->StreamCreate(&pg->stream, ST_CU_STREAM_NON_BLOCKING) != 0) {
		pg->stream = NULL;
		return;
	}
	for (int i = 0; i < MAX_BATCH; i++)
		if (d->EventCreate(&pg->ev[i], ST_CU_EVENT_DISABLE_TIMING) != 0) {
			for (int k = 0; k < i; k++)
				d->EventDestroy(pg->ev[k]);
			memset(pg->ev, 0, sizeof pg->ev);
			d->StreamDestroy(pg->stream);
			pg->stream = NULL;
			return;
		}
}

/* Undo hijack_poller_attach_cuda; every copy must have been drained. */
void hijack_poller_detach_cuda(struct page *pg)
{
	const struct st_cudrv *d = drv();
	if (!pg->cuda_on)
		return;
	pg->cuda_on = 0;
	if (pg->stream) {
		d->StreamSynchronize(pg->stream);
		for (int i = 0; i < MAX_BATCH; i++)
			if (pg->ev[i])
				d->EventDestroy(pg->ev[i]);
		memset(pg->ev, 0, sizeof pg->ev);
		d->StreamDestroy(pg->stream);
		pg->stream = NULL;
	}
	if (pg->stage_pinned) {
		d->MemHostUnregister(pg->stage);
		pg->stage_pinned = 0;
	}
}

void hijack_poller_teardown_cuda(struct page *pg)
{
	hijack_poller_detach_cuda(pg);
	if (pg->stage) {
		munmap(pg->stage, (size_t)hijack_cfg.stage_wqebb * 64);
		pg->stage = NULL;
	}
}
