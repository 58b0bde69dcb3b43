/*
 * GPU doorbell hijack (F8) and WQE recovery (F9, F24c).  See docs/hijack.md.
 *
 * Setup facts come from the mlx5dv provider (st_hijack_note_*: UARs, umems,
 * QPs) and from the CUDA provider (host registrations, device-pointer
 * requests).  When the application asks the driver for the device pointer of
 * a doorbell register, it gets a pointer into a pinned host page of ours (the
 * proxy, same offset inside the page).  One poller thread per proxy page sees
 * every 8-byte doorbell, forwards the exact value to the real UAR with one
 * 64-bit store and a store fence, records (TSC, producer index, QPN), and
 * recovers the newly posted WQEBBs from the QP's send queue.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "cudrv.h"
#include "hijack_internal.h"
#include "interpose/interpose.h"

#define MAX_UARS 256
#define MAX_UMEMS 1024
#define MAX_REGS 1024
#define MAX_PAGES 256
#define QP_SLOTS 4096 /* open addressing, power of two */
#define MAX_WATCH 8
#define PAGE_SZ 4096u

/* ---- configuration ------------------------------------------------------ */
enum hj_mode { HJ_OFF = 0, HJ_FORWARD, HJ_BLOCKING, HJ_NONBLOCKING, HJ_SYNC, HJ_GUARDED, HJ_NMODES };
static const char *const mode_names[] = {"off", "forward", "blocking", "nonblocking", "sync", "guarded"};

static struct {
	int loaded;
	int mode;
	int spin_us;          /* busy-spin budget after activity; <0: spin forever */
	int max_sleep_us;     /* back-off cap */
	int double_copy;      /* copy twice and compare (torn-slot detection) */
	int guard_pct;        /* guarded: wait when the uncopied span reaches this % of the SQ */
	uint32_t stage_wqebb; /* staging ring per poller */
	int cpus[64];
	int ncpus;
	int wait_kind;        /* 0 spin, 1 umwait, 2 mwaitx */
	int cpu_doorbells;    /* proxy DevX UARs at allocation (F24d) */
} cfg;

static int has_waitpkg(void), has_monitorx(void);

static void cfg_load(void)
{
	if (cfg.loaded)
		return;
	cfg.mode = HJ_GUARDED;
	const char *v = getenv("SIGMATRACE_HIJACK_MODE");
	if (v && *v) {
		for (int i = 0; i < HJ_NMODES; i++)
			if (!strcmp(v, mode_names[i]))
				cfg.mode = i;
		if (!strcmp(v, "0") || !strcmp(v, "none"))
			cfg.mode = HJ_OFF;
	}
	v = getenv("SIGMATRACE_HIJACK");
	if (v && !strcmp(v, "0"))
		cfg.mode = HJ_OFF;
	cfg.spin_us = 50;
	v = getenv("SIGMATRACE_POLLER_SPIN_US");
	if (v && *v)
		cfg.spin_us = atoi(v);
	cfg.max_sleep_us = 50;
	v = getenv("SIGMATRACE_POLLER_MAX_SLEEP_US");
	if (v && atoi(v) > 0)
		cfg.max_sleep_us = atoi(v);
	cfg.double_copy = 1;
	v = getenv("SIGMATRACE_HIJACK_DOUBLE_COPY");
	if (v && *v)
		cfg.double_copy = atoi(v) != 0;
	cfg.guard_pct = 10;
	v = getenv("SIGMATRACE_HIJACK_GUARD");
	if (v && atoi(v) >= 1 && atoi(v) <= 100)
		cfg.guard_pct = atoi(v);
	cfg.stage_wqebb = 16384;
	v = getenv("SIGMATRACE_HIJACK_STAGE_WQEBB");
	if (v && atoi(v) >= 256)
		cfg.stage_wqebb = (uint32_t)atoi(v);
	v = getenv("SIGMATRACE_POLLER_CPUS");
	if (v) {
		char *s = strdup(v), *save = NULL;
		for (char *t = strtok_r(s, ",", &save); t && cfg.ncpus < 64; t = strtok_r(NULL, ",", &save)) {
			int a, b;
			if (sscanf(t, "%d-%d", &a, &b) == 2)
				for (int c = a; c <= b && cfg.ncpus < 64; c++)
					cfg.cpus[cfg.ncpus++] = c;
			else if (sscanf(t, "%d", &a) == 1)
				cfg.cpus[cfg.ncpus++] = a;
		}
		free(s);
	}
	cfg.cpu_doorbells = 1;
	v = getenv("SIGMATRACE_CPU_DOORBELLS");
	if (v && *v)
		cfg.cpu_doorbells = atoi(v) != 0;
	cfg.wait_kind = has_waitpkg() ? 1 : has_monitorx() ? 2 : 0;
	v = getenv("SIGMATRACE_POLLER_WAIT");
	if (v && !strcmp(v, "spin"))
		cfg.wait_kind = 0;
	cfg.loaded = 1;
}

/* ---- CPU features --------------------------------------------------------- */
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
#if defined(__x86_64__)
	__asm__ __volatile__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
#else
	r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
static int has_waitpkg(void)
{
	unsigned r[4];
	cpuid(0, 0, r);
	if (r[0] < 7)
		return 0;
	cpuid(7, 0, r);
	return (r[2] >> 5) & 1; /* CPUID.7.0:ECX[5] WAITPKG */
}
static int has_monitorx(void)
{
	unsigned r[4];
	cpuid(0x80000000u, 0, r);
	if (r[0] < 0x80000001u)
		return 0;
	cpuid(0x80000001u, 0, r);
	return (r[2] >> 29) & 1; /* CPUID.80000001h:ECX[29] MONITORX */
}
static const char *wait_name(int k)
{
	return k == 1 ? "umwait" : k == 2 ? "mwaitx" : "spin+backoff";
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__asm__ __volatile__("pause" ::: "memory");
#endif
}
static inline void store_fence(void)
{
#if defined(__x86_64__)
	__asm__ __volatile__("sfence" ::: "memory");
#else
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}
#if defined(__x86_64__)
static inline void wait_umwait(const volatile void *addr, uint64_t ticks)
{
	/* umonitor rax ; umwait ecx(0 = C0.2) edx:eax deadline (byte encodings) */
	__asm__ __volatile__(".byte 0xf3, 0x48, 0x0f, 0xae, 0xf0" ::"a"(addr) : "memory"); /* umonitor %rax */
	uint64_t dl = st_tsc() + ticks;
	__asm__ __volatile__(".byte 0xf2, 0x0f, 0xae, 0xf1" /* umwait %ecx */
			     ::"c"(0), "a"((uint32_t)dl), "d"((uint32_t)(dl >> 32))
			     : "memory", "cc");
}
static inline void wait_mwaitx(const volatile void *addr, uint32_t ticks)
{
	__asm__ __volatile__(".byte 0x0f, 0x01, 0xfa" ::"a"(addr), "c"(0), "d"(0) : "memory"); /* monitorx */
	__asm__ __volatile__(".byte 0x0f, 0x01, 0xfb" ::"a"(0xf0), "b"(ticks), "c"(2) : "memory"); /* mwaitx, timer */
}
#endif

/* ---- setup registries ------------------------------------------------------- */
struct uar_rec {
	uintptr_t reg, base;
	uint32_t page_id;
	void *ctx;
	int live;
};
struct umem_rec {
	uint32_t id;
	uintptr_t addr;
	uint64_t size;
	int gpu, live;
};
struct reg_rec {
	uintptr_t p;
	size_t size;
	unsigned flags;
	int live;
};
struct qp_rec {
	uint32_t qpn; /* 0: empty slot */
	int live;
	uint32_t uar_page, wq_umem, dbr_umem, log_sq;
	uint64_t sq_offset, dbr_offset;
	uint64_t gen; /* bumped on (re)creation */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct uar_rec uars[MAX_UARS];
static struct umem_rec umems[MAX_UMEMS];
static struct reg_rec regs[MAX_REGS];
static struct qp_rec qps[QP_SLOTS];

static struct qp_rec *qp_slot(uint32_t qpn, int create)
{
	uint32_t h = (qpn * 2654435761u) & (QP_SLOTS - 1);
	for (uint32_t i = 0; i < QP_SLOTS; i++) {
		struct qp_rec *q = &qps[(h + i) & (QP_SLOTS - 1)];
		uint32_t k = __atomic_load_n(&q->qpn, __ATOMIC_ACQUIRE);
		if (k == qpn)
			return q;
		if (k == 0)
			return create ? q : NULL;
	}
	return NULL;
}

ST_EXPORT void st_hijack_note_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx)
{
	pthread_mutex_lock(&lock);
	int free_i = -1;
	for (int i = 0; i < MAX_UARS; i++) {
		if (uars[i].live && uars[i].reg == (uintptr_t)reg_addr) {
			free_i = i;
			break;
		}
		if (!uars[i].live && free_i < 0)
			free_i = i;
	}
	if (free_i >= 0)
		uars[free_i] = (struct uar_rec){(uintptr_t)reg_addr, (uintptr_t)base_addr, page_id, ctx, 1};
	pthread_mutex_unlock(&lock);
}

ST_EXPORT void st_hijack_note_umem(uint32_t umem_id, void *addr, uint64_t size, int gpu)
{
	pthread_mutex_lock(&lock);
	int free_i = -1;
	for (int i = 0; i < MAX_UMEMS; i++) {
		if (umems[i].live && umems[i].id == umem_id) {
			free_i = i;
			break;
		}
		if (!umems[i].live && free_i < 0)
			free_i = i;
	}
	if (free_i >= 0)
		umems[free_i] = (struct umem_rec){umem_id, (uintptr_t)addr, size, gpu, 1};
	pthread_mutex_unlock(&lock);
}

ST_EXPORT void st_hijack_forget_umem(uint32_t umem_id)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_UMEMS; i++)
		if (umems[i].live && umems[i].id == umem_id)
			umems[i].live = 0;
	pthread_mutex_unlock(&lock);
}

static uint64_t qp_gen;
ST_EXPORT void st_hijack_note_qp(uint32_t qpn, uint32_t uar_page, uint32_t wq_umem_id, uint64_t sq_offset,
				 uint32_t log_sq_size, uint32_t dbr_umem_id, uint64_t dbr_offset)
{
	if (!qpn || log_sq_size > 15)
		return;
	pthread_mutex_lock(&lock);
	struct qp_rec *q = qp_slot(qpn, 1);
	if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && q->uar_page == uar_page && q->wq_umem == wq_umem_id &&
	    q->sq_offset == sq_offset && q->log_sq == log_sq_size && q->dbr_umem == dbr_umem_id &&
	    q->dbr_offset == dbr_offset) {
		/* told again about the same live QP (mlx5dv_init_obj called twice):
		 * its pollers keep their producer index */
		pthread_mutex_unlock(&lock);
		return;
	}
	if (q) {
		q->live = 0;
		__atomic_thread_fence(__ATOMIC_RELEASE);
		q->uar_page = uar_page;
		q->wq_umem = wq_umem_id;
		q->sq_offset = sq_offset;
		q->log_sq = log_sq_size;
		q->dbr_umem = dbr_umem_id;
		q->dbr_offset = dbr_offset;
		q->gen = ++qp_gen;
		__atomic_store_n(&q->qpn, qpn, __ATOMIC_RELEASE);
		__atomic_store_n(&q->live, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
}

ST_EXPORT void st_hijack_forget_qp(uint32_t qpn)
{
	pthread_mutex_lock(&lock);
	struct qp_rec *q = qp_slot(qpn, 0);
	if (q)
		__atomic_store_n(&q->live, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&lock);
}

/* The SQ of a QP as (address, is-GPU); under lock. */
static int qp_sq(const struct qp_rec *q, uintptr_t *sq, int *gpu)
{
	for (int i = 0; i < MAX_UMEMS; i++)
		if (umems[i].live && umems[i].id == q->wq_umem) {
			uint64_t bytes = 64ull << q->log_sq;
			if (q->sq_offset + bytes > umems[i].size)
				return -1;
			*sq = umems[i].addr + q->sq_offset;
			*gpu = umems[i].gpu;
			return 0;
		}
	return -1;
}

/* ---- proxy pages and pollers ---------------------------------------------------- */
struct qpstate {
	uint32_t qpn;
	uint64_t gen;
	uint32_t pi;        /* last producer counter (WQEBBs, 32-bit extended) */
	int have_sq;
	uintptr_t sq;
	int gpu;
	uint32_t log_sq;
	uint64_t doorbells, wqebb_ok, wqebb_lost, wqe_ok;
	uint32_t npend;       /* copied ranges of this QP not parsed yet */
	uint32_t pend_oldest; /* producer counter of the oldest of them */
	uint64_t guard_waits; /* guarded mode: doorbells held until the copies landed */
};

struct pend { /* one doorbell's copied range, waiting for its batch */
	struct qpstate *qs;
	uint32_t first;     /* producer counter of the first WQEBB */
	uint32_t cnt;       /* WQEBBs */
	uint32_t stage;     /* offset in staging ring (WQEBBs); copy 2 at +cnt */
	uint32_t batch;
	int copy_failed;
};

#define MAX_QPS_PER_PAGE 256
#define OWNER_FREE 0xFFFFFFFFu /* a verbs word whose QP was destroyed: the next QP may take it */
#define MAX_PEND 4096
#define MAX_BATCH 64

struct page {
	int live;
	uintptr_t page;            /* application (real UAR) page */
	uint8_t *proxy;            /* our page */
	uint64_t proxy_dev;        /* its device pointer */
	uint64_t real_dev;         /* the device pointer the driver gave for the real page base */
	uint32_t page_id;
	int gpu;
	uint16_t offs[MAX_WATCH];
	int noffs;
	void *cuctx;
	int cpu;
	pthread_t thr;
	int thr_started;
	volatile int stop;
	/* poller-private */
	uint64_t last[MAX_WATCH];
	uint64_t seen;
	struct qpstate qs[MAX_QPS_PER_PAGE];
	int nqs;
	st_CUstream stream;
	st_CUevent ev[MAX_BATCH];
	uint8_t *stage;            /* pinned staging ring */
	int stage_pinned;
	uint32_t stage_head, stage_tail; /* WQEBB offsets; tail = oldest pending */
	struct pend pend[MAX_PEND];
	uint32_t pend_head, pend_tail;   /* ring indexes (mod MAX_PEND) */
	uint32_t batch_open, batch_done; /* batches: open id, completed up to */
	uint32_t batch_wqebb;            /* WQEBBs in the open batch */
	uint64_t unknown_qp, copies, sync_waits, guard_waits;
	uint64_t fwd_ns_sum;
	/* CPU doorbells (F24d): proxy is the page the application's reg_addr
	 * points into since mlx5dv_devx_alloc_uar; the GPU, if it asks for a
	 * device pointer, gets one to gproxy (registered by us); one poller
	 * watches both. */
	int cpuproxy;
	uintptr_t cpu_reg;         /* the real reg_addr */
	void *ctx;                 /* the ibv_context it belongs to (verbs QPs: released at close) */
	int verbs;                 /* proxies verbs QPs' BlueFlame registers (shared by QPs of ctx) */
	uint32_t owner[MAX_WATCH]; /* verbs: the QPN that rings each watched word (0: DevX UAR, OWNER_FREE) */
	uint32_t sync_seq, sync_ack; /* a full scan + drain requested / done (atomic; QP forgotten) */
	uint8_t *gproxy;
	int gwatch;                /* poller scans gproxy (atomic) */
	uint64_t glast[MAX_WATCH];
	int gpu_want;              /* atomic: 1 attach CUDA, 0 detach */
	uint32_t gpu_seq, gpu_ack; /* requests posted / done (atomic) */
	uint32_t gpu_seen;         /* poller-private */
	int cuda_on;               /* poller-private: stream/events/pinned stage set up */
	int installed;             /* poller-private: DB_HIJACK_INSTALL emitted */
	int quiesce, quiesced;     /* process exit: summary out, then forward only (atomic) */
};

static struct page pages[MAX_PAGES];
static int exit_hook;
static int poller_seq;
static uint64_t cpu_proxy_failed; /* CPU-doorbell proxies not installed (the real UAR was left alone) */

/* proxy page -> real UAR page, for the CUDA wrappers (lock-free readers) and
 * for putting reg_addr back at free, even after the poller stopped */
struct cpumap_ent {
	uintptr_t proxy, real; /* page addresses; proxy 0 = free */
};
static struct cpumap_ent cpumap[MAX_PAGES];
static int cpumap_n; /* entries ever used (high-water mark) */

static void poller_sync(struct page *pg);
static void poller_install(struct page *pg);
static int watch_offset(struct page *pg, uint16_t off, uint32_t owner);
static long word_owner(const struct page *pg, uint16_t off);

static const struct st_cudrv *drv(void)
{
	return st_cudrv();
}

static struct qpstate *page_qp(struct page *pg, uint32_t qpn)
{
	for (int i = 0; i < pg->nqs; i++)
		if (pg->qs[i].qpn == qpn) {
			struct qpstate *s = &pg->qs[i];
			struct qp_rec *q = qp_slot(qpn, 0);
			if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && q->gen != s->gen) {
				/* QP recreated with the same number: start over */
				pthread_mutex_lock(&lock);
				s->gen = q->gen;
				s->pi = 0;
				s->log_sq = q->log_sq;
				s->have_sq = qp_sq(q, &s->sq, &s->gpu) == 0;
				pthread_mutex_unlock(&lock);
			} else if (s->have_sq && (!q || !__atomic_load_n(&q->live, __ATOMIC_ACQUIRE))) {
				s->have_sq = 0; /* forgotten (QP destroyed): its SQ may be freed */
			} else if (!s->have_sq && q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE)) {
				pthread_mutex_lock(&lock);
				s->gen = q->gen;
				s->log_sq = q->log_sq;
				s->have_sq = qp_sq(q, &s->sq, &s->gpu) == 0;
				pthread_mutex_unlock(&lock);
			}
			return s;
		}
	if (pg->nqs == MAX_QPS_PER_PAGE)
		return NULL;
	struct qpstate *s = &pg->qs[pg->nqs++];
	memset(s, 0, sizeof *s);
	s->qpn = qpn;
	struct qp_rec *q = qp_slot(qpn, 0);
	if (q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&lock);
		s->gen = q->gen;
		s->log_sq = q->log_sq;
		s->have_sq = qp_sq(q, &s->sq, &s->gpu) == 0;
		pthread_mutex_unlock(&lock);
	}
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
	const uint8_t *b2 = cfg.double_copy ? b + (size_t)p->cnt * 64 : NULL;
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
		st_ev(ST_EV_DB_WQE, (uint16_t)p->first, s->qpn, id);
		s->wqebb_ok += i;
	}
	if (i < p->cnt) {
		st_ev_ext(ST_EV_DB_WQE_LOST, (uint16_t)(p->first + i), s->qpn, p->cnt - i, 0, 0, reason, 0);
		s->wqebb_lost += p->cnt - i;
	}
}

/* Parse every pending range whose batch has completed. */
static void drain(struct page *pg, int wait)
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
		pg->stage_tail = p->stage + p->cnt * (cfg.double_copy ? 2 : 1);
		pg->pend_tail++;
		if (pg->pend_tail == pg->pend_head)
			pg->stage_head = pg->stage_tail = 0; /* empty: restart the ring at 0 */
	}
}

static void close_batch(struct page *pg)
{
	if (!pg->batch_wqebb)
		return;
	if (pg->stream && pg->batch_open - pg->batch_done + 1 >= MAX_BATCH)
		drain(pg, 1);
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
		uint32_t cap = cfg.stage_wqebb;
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
		close_batch(pg);
		drain(pg, 1);
	}
	return -1;
}

/* Start copying [s->pi, newpi) of the QP's SQ into the staging ring. */
static void issue_copy(struct page *pg, struct qpstate *s, uint32_t first, uint32_t cnt)
{
	const struct st_cudrv *d = drv();
	uint32_t n = 1u << s->log_sq;
	if (pg->pend_head - pg->pend_tail >= MAX_PEND - 1) {
		close_batch(pg);
		drain(pg, 1);
	}
	int copies = cfg.double_copy ? 2 : 1;
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
			memcpy(dst, (const void *)(s->sq + (uint64_t)s0 * 64), (size_t)c1 * 64);
			if (c2)
				memcpy(dst + (size_t)c1 * 64, (const void *)s->sq, (size_t)c2 * 64);
		} else {
			p->copy_failed = 1;
		}
	}
	pg->copies++;
	pg->pend_head++;
	pg->batch_wqebb += cnt;
}

/* guarded mode: the uncopied span (WQEBBs) at which a doorbell waits for the copies */
static inline uint32_t guard_wqebb(const struct qpstate *s)
{
	uint32_t g = (uint32_t)(((uint64_t)cfg.guard_pct << s->log_sq) / 100);
	return g ? g : 1;
}

/* A new doorbell value v at watched offset k. */
static void on_doorbell(struct page *pg, int k, uint64_t v)
{
	uint64_t t_obs = st_tsc();
	uint8_t b[8];
	memcpy(b, &v, 8);
	uint16_t pi16 = (uint16_t)((b[1] << 8) | b[2]); /* ref §3.3: bytes 1-2 */
	if (b[7] & 0x3f) /* rdma-core convention: last WQE's ctrl, PI = index + WQEBBs(DS) */
		pi16 = (uint16_t)(pi16 + ((b[7] & 0x3f) * 16 + 63) / 64);
	uint32_t qpn = ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 8) | b[6];
	volatile uint64_t *real = (volatile uint64_t *)(pg->page + pg->offs[k]);
	/* a GPU write is seen only after its device pointer was handed out, i.e.
	 * after the attach request was posted: take it before anything else */
	if (__atomic_load_n(&pg->gpu_seq, __ATOMIC_ACQUIRE) != pg->gpu_seen)
		poller_sync(pg);
	if (!pg->installed)
		poller_install(pg);
	int mode = cfg.mode;
	struct qpstate *s = mode == HJ_FORWARD ? NULL : page_qp(pg, qpn);
	uint32_t delta = 0, first = 0;
	int recover = 0;
	if (s) {
		s->doorbells++;
		delta = (uint16_t)(pi16 - (uint16_t)s->pi);
		first = s->pi;
		if (s->have_sq && delta) {
			if (delta > (1u << s->log_sq)) {
				st_ev_ext(ST_EV_DB_WQE_LOST, (uint16_t)first, qpn, delta, 0, 0, ST_WQE_LOST_CORRUPT, 0);
				s->wqebb_lost += delta;
			} else
				recover = 1;
		} else if (!s->have_sq)
			pg->unknown_qp++;
		s->pi += delta;
	}
	if (recover && (mode == HJ_SYNC || mode == HJ_BLOCKING)) {
		issue_copy(pg, s, first, delta);
		if (mode == HJ_SYNC || pg->batch_wqebb >= st_cfg.batch_threshold) {
			/* paper's mode: a threshold-crossing doorbell waits for the copy */
			close_batch(pg);
			drain(pg, 1);
		}
	}
	/* A host-memory SQ (CPU writers, F24d) is copied with a plain memcpy:
	 * done before the forward in every recovering mode, so the NIC cannot
	 * complete, nor the application reuse, a slot before it is copied. */
	int pre = recover && !s->gpu && (mode == HJ_NONBLOCKING || mode == HJ_GUARDED);
	if (pre)
		issue_copy(pg, s, first, delta);
	int held = 0;
	if (recover && mode == HJ_GUARDED && !pre) {
		/* Forward first, as nonblocking, unless the WQEBBs announced but not
		 * yet copied span a large part of the SQ: only then can the
		 * application lap the ring before the copy lands (a slot is reused
		 * n WQEBBs later).  Then copy this range too and wait for all of it
		 * before the NIC (and with it the application) may go on. */
		uint32_t from = s->npend ? s->pend_oldest : first;
		uint32_t span = first + delta - from;
		if (span > (2u << s->log_sq))
			span = delta; /* stale bookkeeping (QP recreated): this range only */
		if (span >= guard_wqebb(s)) {
			issue_copy(pg, s, first, delta);
			close_batch(pg);
			drain(pg, 1);
			s->guard_waits++;
			pg->guard_waits++;
			held = 1;
		}
	}
	/* forward the exact value: one 64-bit store, then flush it out */
	*real = v;
	store_fence();
	/* record at the observation time */
	struct st_event *e = st_reserve(1);
	if (e) {
		e->tsc = t_obs;
		e->type = ST_EV_DB_DOORBELL;
		e->aux = pi16;
		e->obj = qpn;
		e->arg = v;
		st_commit();
	}
	if (st_full())
		st_ev(ST_EV_DB_FORWARD, pi16, qpn, t_obs);
	pg->seen++;
	if (recover && mode == HJ_NONBLOCKING) {
		if (!pre)
			issue_copy(pg, s, first, delta);
		if (pg->batch_wqebb >= st_cfg.batch_threshold)
			close_batch(pg);
		drain(pg, 0);
	} else if (recover && mode == HJ_GUARDED && !held) {
		if (!pre)
			issue_copy(pg, s, first, delta);
		/* close batches early enough that completions are known well before
		 * the span reaches the guard */
		uint32_t g = guard_wqebb(s) / 2;
		if (pg->batch_wqebb >= st_cfg.batch_threshold || pg->batch_wqebb >= (g ? g : 1))
			close_batch(pg);
		drain(pg, 0);
	}
}

/* The staging ring (every poller; host SQs are copied with memcpy). */
static void poller_stage_alloc(struct page *pg)
{
	size_t bytes = (size_t)cfg.stage_wqebb * 64;
	pg->stage = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (pg->stage == MAP_FAILED) {
		pg->stage = NULL;
		return;
	}
	madvise(pg->stage, bytes, MADV_DONTFORK); /* pinned: a fork must not make it copy-on-write */
}

/* CUDA for device-memory SQs: pinned staging ring, a non-blocking stream and
 * its events, in the context of the application's doorbell request. */
static void poller_attach_cuda(struct page *pg)
{
	const struct st_cudrv *d = drv();
	if (pg->cuda_on || !pg->stage || !d || !pg->cuctx || cfg.mode == HJ_FORWARD)
		return;
	pg->cuda_on = 1;
	if (d->CtxSetCurrent(pg->cuctx) != 0)
		return;
	if (d->MemHostRegister(pg->stage, (size_t)cfg.stage_wqebb * 64, ST_CU_MEMHOSTREGISTER_PORTABLE) == 0)
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

/* Undo poller_attach_cuda; every copy must have been drained. */
static void poller_detach_cuda(struct page *pg)
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

static void poller_teardown_cuda(struct page *pg)
{
	poller_detach_cuda(pg);
	if (pg->stage) {
		munmap(pg->stage, (size_t)cfg.stage_wqebb * 64);
		pg->stage = NULL;
	}
}

/* Pin the calling poller thread to its page's core, if it has one. */
static void pin_self(const struct page *pg)
{
	if (pg->cpu < 0)
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(pg->cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* First use of the page (GPU pages: at start; CPU-doorbell pages: at their
 * first doorbell or device-pointer request, so unused UARs, e.g. CQ ones,
 * leave no trace). */
static void poller_install(struct page *pg)
{
	if (pg->installed)
		return;
	pg->installed = 1;
	if (pg->cpuproxy) { /* always on the poller thread: take a core now that the page is used */
		pg->cpu = cfg.ncpus ? cfg.cpus[__atomic_fetch_add(&poller_seq, 1, __ATOMIC_RELAXED) % cfg.ncpus] : -1;
		pin_self(pg);
	}
	st_ensure_active();
	char buf[768];
	struct st_json j;
	st_json_init(&j, buf, sizeof buf);
	st_json_open(&j, NULL, '{');
	st_json_hex(&j, "uar_page", pg->page);
	st_json_hex(&j, "reg_offset", pg->offs[0]);
	st_json_hex(&j, "proxy_host", (uintptr_t)(pg->cpuproxy && pg->gproxy && pg->proxy_dev ? pg->gproxy : pg->proxy));
	st_json_hex(&j, "proxy_dev", pg->proxy_dev);
	st_json_hex(&j, "real_dev", pg->real_dev);
	st_json_uint(&j, "page_id", pg->page_id);
	st_json_str(&j, "mode", mode_names[cfg.mode]);
	st_json_str(&j, "wait", wait_name(cfg.wait_kind));
	st_json_int(&j, "cpu", pg->cpu);
	st_json_uint(&j, "batch_threshold", st_cfg.batch_threshold);
	st_json_bool(&j, "async_copy", pg->stream != NULL);
	st_json_bool(&j, "double_copy", cfg.double_copy);
	if (cfg.mode == HJ_GUARDED)
		st_json_uint(&j, "guard_pct", (uint64_t)cfg.guard_pct);
	if (pg->cpuproxy) {
		st_json_bool(&j, "cpu_doorbells", 1);
		st_json_hex(&j, "cpu_proxy", (uintptr_t)pg->proxy);
		st_json_int(&j, "gpu", pg->proxy_dev ? pg->gpu : -1);
	}
	st_json_close(&j, '}');
	uint64_t id = st_side_json(buf, j.len);
	st_ev(ST_EV_DB_HIJACK_INSTALL, (uint16_t)pg->gpu, pg->page_id, id);
}

static int scan_words(struct page *pg, const uint8_t *base, uint64_t *last)
{
	int n = 0;
	int noffs = __atomic_load_n(&pg->noffs, __ATOMIC_ACQUIRE); /* grows when a verbs QP shares the page */
	for (int k = 0; k < noffs; k++) {
		uint64_t v = __atomic_load_n((const volatile uint64_t *)(base + pg->offs[k]), __ATOMIC_ACQUIRE);
		if (v != last[k]) {
			last[k] = v;
			on_doorbell(pg, k, v);
			n++;
		}
	}
	return n;
}

/* CPU-doorbell pages: a GPU attach/detach request from the application's
 * thread (st_hijack_devptr / st_hijack_on_unregister). */
static void poller_sync(struct page *pg)
{
	uint32_t seq = __atomic_load_n(&pg->gpu_seq, __ATOMIC_ACQUIRE);
	if (seq == pg->gpu_seen)
		return;
	pg->gpu_seen = seq;
	if (__atomic_load_n(&pg->gpu_want, __ATOMIC_ACQUIRE)) {
		close_batch(pg);
		drain(pg, 1);
		poller_attach_cuda(pg);
		if (!pg->installed)
			poller_install(pg);
	} else {
		/* the GPU lets go: its last values first, then no more copies */
		if (__atomic_load_n(&pg->gwatch, __ATOMIC_ACQUIRE) && pg->gproxy) {
			scan_words(pg, pg->gproxy, pg->glast);
			__atomic_store_n(&pg->gwatch, 0, __ATOMIC_RELEASE);
			for (int k = 0; k < pg->noffs; k++)
				__atomic_store_n((uint64_t *)(pg->gproxy + pg->offs[k]), 0, __ATOMIC_RELAXED);
			memset(pg->glast, 0, sizeof pg->glast);
		}
		close_batch(pg);
		drain(pg, 1);
		poller_detach_cuda(pg);
	}
	__atomic_store_n(&pg->gpu_ack, seq, __ATOMIC_RELEASE);
}

static int scan(struct page *pg)
{
	if (__atomic_load_n(&pg->gpu_seq, __ATOMIC_ACQUIRE) != pg->gpu_seen)
		poller_sync(pg);
	int n = scan_words(pg, pg->proxy, pg->last);
	if (pg->gproxy && __atomic_load_n(&pg->gwatch, __ATOMIC_ACQUIRE))
		n += scan_words(pg, pg->gproxy, pg->glast);
	return n;
}

/* After the summary at process exit: CPU-doorbell pages keep forwarding (the
 * application may still ring from a later exit handler), recording nothing. */
static void forward_only(struct page *pg)
{
	unsigned idle = 0;
	for (;;) {
		int stop = __atomic_load_n(&pg->stop, __ATOMIC_ACQUIRE), n = 0;
		for (int src = 0; src < 2; src++) {
			const uint8_t *base = src ? pg->gproxy : pg->proxy;
			uint64_t *last = src ? pg->glast : pg->last;
			if (!base || (src && !__atomic_load_n(&pg->gwatch, __ATOMIC_ACQUIRE)))
				continue;
			int noffs = __atomic_load_n(&pg->noffs, __ATOMIC_ACQUIRE);
			for (int k = 0; k < noffs; k++) {
				uint64_t v = __atomic_load_n((const volatile uint64_t *)(base + pg->offs[k]), __ATOMIC_ACQUIRE);
				if (v != last[k]) {
					last[k] = v;
					*(volatile uint64_t *)(pg->page + pg->offs[k]) = v;
					store_fence();
					n++;
				}
			}
		}
		if (stop)
			return;
		if (n) {
			idle = 0;
			continue;
		}
		if (++idle < 64) {
			cpu_relax();
			continue;
		}
		struct timespec ts = {0, 50000};
		nanosleep(&ts, NULL);
	}
}

static void *poller(void *arg)
{
	struct page *pg = arg;
	st_tls_depth++; /* nothing this thread calls is the application's */
	char name[16];
	snprintf(name, sizeof name, "st-poll-%u", pg->page_id);
	pthread_setname_np(pthread_self(), name);
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* back-off sleeps of ~1 us, not the default 50 us slack */
	pin_self(pg);
	poller_stage_alloc(pg);
	if (!pg->cpuproxy) {
		poller_attach_cuda(pg);
		poller_install(pg);
	}
	uint64_t idle_since = st_now_ns();
	unsigned sleep_us = 1;
	unsigned spins = 0;
	int quiesce = 0;
	for (;;) {
		uint32_t sync = __atomic_load_n(&pg->sync_seq, __ATOMIC_ACQUIRE);
		if (sync != __atomic_load_n(&pg->sync_ack, __ATOMIC_RELAXED)) {
			/* a QP of this page is being forgotten: take what was rung, finish
			 * every copy, then nothing reads its SQ any more */
			scan(pg);
			close_batch(pg);
			drain(pg, 1);
			__atomic_store_n(&pg->sync_ack, sync, __ATOMIC_RELEASE);
			idle_since = 0;
			sleep_us = 1;
		}
		if (scan(pg)) {
			idle_since = 0;
			sleep_us = 1;
			spins = 0;
			continue;
		}
		if (__atomic_load_n(&pg->stop, __ATOMIC_ACQUIRE) ||
		    (quiesce = __atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE))) {
			scan(pg); /* the last values, forwarded before we go */
			break;
		}
		/* idle: finish completed copies first (never blocks) */
		if (pg->pend_head != pg->pend_tail) {
			if (pg->batch_wqebb && (cfg.mode == HJ_NONBLOCKING || cfg.mode == HJ_GUARDED))
				close_batch(pg);
			drain(pg, 0);
		}
		if (++spins < 64) {
			cpu_relax();
			continue;
		}
		spins = 0;
		uint64_t now = st_now_ns();
		if (!idle_since)
			idle_since = now;
		/* spin forever (SIGMATRACE_POLLER_SPIN_US<0) only on a page that is in
		 * use: a never-rung CPU-doorbell page always backs off */
		int in_use = !pg->cpuproxy || pg->installed;
		if (cfg.spin_us < 0 ? in_use : now - idle_since < (uint64_t)cfg.spin_us * 1000)
			continue;
#if defined(__x86_64__)
		if (cfg.wait_kind == 1 && pg->noffs == 1 && !pg->cpuproxy) {
			wait_umwait(pg->proxy + pg->offs[0], 200000);
			continue;
		}
		if (cfg.wait_kind == 2 && pg->noffs == 1 && !pg->cpuproxy) {
			wait_mwaitx(pg->proxy + pg->offs[0], 200000);
			continue;
		}
#endif
		struct timespec ts = {0, (long)sleep_us * 1000};
		nanosleep(&ts, NULL);
		/* a CPU-doorbell page nobody has rung yet (a CQ's UAR, say) idles cheaply */
		unsigned cap = (unsigned)cfg.max_sleep_us;
		if (pg->cpuproxy && !pg->installed && cap < 1000)
			cap = 1000;
		if (sleep_us < cap)
			sleep_us = sleep_us * 2 > cap ? cap : sleep_us * 2;
	}
	close_batch(pg);
	drain(pg, 1);
	if (pg->installed) {
		uint64_t ok = 0, lost = 0, wqes = 0;
		for (int i = 0; i < pg->nqs; i++) {
			ok += pg->qs[i].wqebb_ok;
			lost += pg->qs[i].wqebb_lost;
			wqes += pg->qs[i].wqe_ok;
		}
		char buf[512];
		struct st_json j;
		st_json_init(&j, buf, sizeof buf);
		st_json_open(&j, NULL, '{');
		st_json_uint(&j, "doorbells", pg->seen);
		st_json_uint(&j, "wqes_verified", wqes);
		st_json_uint(&j, "wqebb_verified", ok);
		st_json_uint(&j, "wqebb_lost", lost);
		st_json_uint(&j, "unknown_qp_doorbells", pg->unknown_qp);
		st_json_uint(&j, "copies", pg->copies);
		st_json_uint(&j, "sync_waits", pg->sync_waits);
		st_json_uint(&j, "guard_waits", pg->guard_waits);
		if (pg->cpuproxy)
			st_json_bool(&j, "cpu_doorbells", 1);
		st_json_close(&j, '}');
		st_side_json(buf, j.len);
		st_ev(ST_EV_DB_HIJACK_REMOVE, 0, pg->page_id, pg->seen);
	}
	poller_teardown_cuda(pg);
	st_thread_exit_current();
	if (quiesce) {
		__atomic_store_n(&pg->quiesced, 1, __ATOMIC_RELEASE);
		forward_only(pg);
	}
	st_tls_depth--;
	return NULL;
}

static void stop_page(struct page *pg)
{
	/* caller holds lock */
	if (!pg->live)
		return;
	pg->live = 0;
	__atomic_store_n(&pg->stop, 1, __ATOMIC_RELEASE);
	pthread_t t = pg->thr;
	int started = pg->thr_started;
	pthread_mutex_unlock(&lock);
	if (started)
		pthread_join(t, NULL);
	const struct st_cudrv *d = drv();
	if (pg->cpuproxy) {
		/* after process exit (quiesced) the driver may be gone: leave it be */
		if (d && pg->proxy_dev && pg->gproxy && !__atomic_load_n(&pg->quiesced, __ATOMIC_ACQUIRE))
			d->MemHostUnregister(pg->gproxy);
		if (pg->gproxy)
			munmap(pg->gproxy, PAGE_SZ);
		pg->gproxy = NULL;
		pg->proxy_dev = pg->real_dev = 0;
	} else if (d && pg->proxy_dev)
		d->MemHostUnregister(pg->proxy);
	munmap(pg->proxy, PAGE_SZ);
	pg->proxy = NULL;
	pthread_mutex_lock(&lock);
}

/* Process exit, CPU-doorbell page: summary and flush now, but keep
 * forwarding until the process is gone (caller holds lock). */
static void quiesce_page(struct page *pg)
{
	if (!pg->live || !pg->thr_started || __atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&pg->quiesce, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&lock);
	while (!__atomic_load_n(&pg->quiesced, __ATOMIC_ACQUIRE)) {
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	pthread_mutex_lock(&lock);
}

/* A device pointer for a CPU-doorbell page: register a second proxy page
 * (the GPU's) with the driver; the page's poller watches it too (caller
 * holds lock).  0 on success. */
static int gpu_attach(struct page *pg, const struct st_cudrv *d)
{
	if (pg->proxy_dev)
		return 0;
	if (__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE))
		return -1;
	if (!pg->gproxy) {
		void *m = mmap(NULL, PAGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (m == MAP_FAILED)
			return -1;
		madvise(m, PAGE_SZ, MADV_DONTFORK); /* as the GPU proxy page, see st_hijack_devptr */
		pg->gproxy = m;
	}
	st_CUdeviceptr pd = 0;
	if (d->MemHostRegister(pg->gproxy, PAGE_SZ, ST_CU_MEMHOSTREGISTER_PORTABLE | ST_CU_MEMHOSTREGISTER_DEVICEMAP))
		return -1;
	if (d->MemHostGetDevicePointer(&pd, pg->gproxy, 0) || !pd) {
		d->MemHostUnregister(pg->gproxy);
		return -1;
	}
	pg->proxy_dev = pd;
	st_CUcontext c = NULL;
	if (d->CtxGetCurrent && d->CtxGetCurrent(&c) == 0 && c)
		pg->cuctx = c;
	int dev = 0;
	if (d->CtxGetDevice && d->CtxGetDevice(&dev) == 0)
		pg->gpu = dev;
	__atomic_store_n(&pg->gwatch, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&pg->gpu_want, 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&pg->gpu_seq, 1, __ATOMIC_RELEASE);
	return 0;
}

/* The application unregisters the UAR from the driver: the GPU part of a
 * CPU-doorbell page goes (last values forwarded, copies drained, CUDA
 * objects released), the CPU part stays (caller holds lock). */
static void gpu_detach(struct page *pg)
{
	if (!pg->proxy_dev)
		return;
	__atomic_store_n(&pg->gpu_want, 0, __ATOMIC_RELEASE);
	uint32_t seq = __atomic_add_fetch(&pg->gpu_seq, 1, __ATOMIC_RELEASE);
	if (pg->thr_started && !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE)) {
		pthread_mutex_unlock(&lock);
		while (__atomic_load_n(&pg->gpu_ack, __ATOMIC_ACQUIRE) != seq && pg->live &&
		       !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE)) {
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&lock);
	}
	if (!pg->live || !pg->proxy_dev)
		return;
	const struct st_cudrv *d = drv();
	if (d && !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE))
		d->MemHostUnregister(pg->gproxy);
	pg->proxy_dev = pg->real_dev = 0;
}
void st_hijack_shutdown(void)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_PAGES; i++) {
		if (pages[i].live && pages[i].cpuproxy)
			quiesce_page(&pages[i]);
		else
			stop_page(&pages[i]);
	}
	if (cpu_proxy_failed)
		st_warn("hijack: %llu UAR register(s) left unproxied (CPU doorbells not traced there)",
			(unsigned long long)cpu_proxy_failed);
	pthread_mutex_unlock(&lock);
}

static void at_exit_hook(void)
{
	st_hijack_shutdown();
}

ST_EXPORT void st_hijack_forget_uar(void *reg_addr)
{
	uintptr_t pgaddr = (uintptr_t)reg_addr & ~(uintptr_t)(PAGE_SZ - 1);
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_UARS; i++)
		if (uars[i].live && uars[i].reg == (uintptr_t)reg_addr)
			uars[i].live = 0;
	/* a GPU-path page of this UAR stops here; a CPU-proxy page in the same real
	 * page belongs to another UAR or to verbs QPs and stops at their release
	 * (st_hijack_cpu_uar_release, st_hijack_cpu_release_ctx) */
	for (int i = 0; i < MAX_PAGES; i++)
		if (pages[i].live && pages[i].page == pgaddr && !pages[i].cpuproxy)
			stop_page(&pages[i]);
	pthread_mutex_unlock(&lock);
}

/* ---- CUDA provider hooks ------------------------------------------------------------ */
void st_hijack_on_register(void *p, size_t size, unsigned flags)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_REGS; i++)
		if (!regs[i].live) {
			regs[i] = (struct reg_rec){(uintptr_t)p, size, flags, 1};
			break;
		}
	pthread_mutex_unlock(&lock);
}

void st_hijack_on_unregister(void *p)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_REGS; i++)
		if (regs[i].live && regs[i].p == (uintptr_t)p) {
			regs[i].live = 0;
			for (int k = 0; k < MAX_PAGES; k++)
				if (pages[k].live && pages[k].page + PAGE_SZ > regs[i].p &&
				    pages[k].page < regs[i].p + regs[i].size) {
					if (pages[k].cpuproxy)
						gpu_detach(&pages[k]); /* the CPU may still ring */
					else
						stop_page(&pages[k]);
				}
		}
	pthread_mutex_unlock(&lock);
}

uint64_t st_hijack_real_of_proxy(uint64_t d)
{
	for (int i = 0; i < MAX_PAGES; i++)
		if (pages[i].live && pages[i].proxy_dev && pages[i].real_dev && d >= pages[i].proxy_dev &&
		    d < pages[i].proxy_dev + PAGE_SZ)
			return pages[i].real_dev + (d - pages[i].proxy_dev);
	return d;
}

uint64_t st_hijack_proxy_of_real(uint64_t d)
{
	for (int i = 0; i < MAX_PAGES; i++)
		if (pages[i].live && pages[i].real_dev && pages[i].proxy_dev && d >= pages[i].real_dev &&
		    d < pages[i].real_dev + PAGE_SZ)
			return pages[i].proxy_dev + (d - pages[i].real_dev);
	return d;
}

/* ---- fork ----------------------------------------------------------------------------
 * Pollers are threads: a forked child has none.  Its copy of the page table
 * must not make it believe otherwise: it would hand out the parent's proxy
 * pointer (a phantom poller nobody runs), or, at exit, join threads that do
 * not exist and unregister the parent's proxy pages with the driver.  The
 * child forgets every page (the proxy and staging mappings are MADV_DONTFORK:
 * not mapped in the child at all); what it learned about UARs, umems, QPs
 * and registrations stays (that memory is the child's too), so a child that
 * uses the driver itself gets pollers of its own. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&lock); /* the table is consistent when copied */
}
static void fork_parent(void)
{
	pthread_mutex_unlock(&lock);
}
static void fork_child(void)
{
	pthread_mutex_init(&lock, NULL);
	for (int i = 0; i < MAX_PAGES; i++) {
		struct page *pg = &pages[i];
		if (!pg->live && !pg->proxy && !pg->thr_started)
			continue; /* untouched slot: do not dirty its copy-on-write pages */
		pg->live = 0;
		pg->thr_started = 0;
		pg->proxy = NULL; /* not mapped here (MADV_DONTFORK); never unmapped or unregistered by the child */
		pg->proxy_dev = pg->real_dev = 0;
		pg->stage = NULL;
		pg->stream = NULL;
		pg->gproxy = NULL; /* MADV_DONTFORK as well */
		pg->cpuproxy = 0;
	}
	/* the child's reg_addr still points into the (unmapped) CPU proxy, as it
	 * would into the real UAR (VM_DONTCOPY); cpumap stays, so that a free
	 * there puts the real reg_addr back */
}
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void fork_register(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

uint64_t st_hijack_devptr(void *p, uint64_t real_dptr, int *hijacked)
{
	*hijacked = 0;
	cfg_load();
	if (cfg.mode == HJ_OFF)
		return real_dptr;
	pthread_once(&fork_once, fork_register); /* before the first poller; outside the lock */
	uintptr_t a = (uintptr_t)p, pgaddr = a & ~(uintptr_t)(PAGE_SZ - 1);
	const struct st_cudrv *d = drv();
	if (!d || !d->MemHostRegister || !d->MemHostGetDevicePointer)
		return real_dptr;
	pthread_mutex_lock(&lock);
	/* the registration that holds p */
	struct reg_rec *r = NULL;
	for (int i = 0; i < MAX_REGS; i++)
		if (regs[i].live && a >= regs[i].p && a < regs[i].p + (regs[i].size ? regs[i].size : 1)) {
			r = &regs[i];
			break;
		}
	/* doorbell registers in p's page: noted UARs, else an IOMEMORY registration */
	uint16_t offs[MAX_WATCH];
	int noffs = 0;
	uint32_t page_id = 0;
	for (int i = 0; i < MAX_UARS && noffs < MAX_WATCH; i++)
		if (uars[i].live && (uars[i].reg & ~(uintptr_t)(PAGE_SZ - 1)) == pgaddr) {
			offs[noffs++] = (uint16_t)(uars[i].reg & (PAGE_SZ - 1));
			page_id = uars[i].page_id;
		}
	if (!noffs && r && (r->flags & ST_CU_MEMHOSTREGISTER_IOMEMORY) && !(a & 7))
		offs[noffs++] = (uint16_t)(a & (PAGE_SZ - 1));
	if (!noffs) {
		pthread_mutex_unlock(&lock);
		return real_dptr;
	}
	struct page *pg = NULL, *freep = NULL;
	for (int i = 0; i < MAX_PAGES; i++) {
		if (pages[i].live && pages[i].page == pgaddr) {
			pg = &pages[i];
			break;
		}
		if (!pages[i].live && !pages[i].proxy && !freep)
			freep = &pages[i];
	}
	if (pg && pg->cpuproxy) {
		/* a CPU-doorbell page: the GPU gets a proxy of its own, same poller,
		 * which also watches the page's other noted registers (a DevX UAR the
		 * CPU side left real may be the one the GPU rings) */
		for (int k = 0; k < noffs; k++)
			if (word_owner(pg, offs[k]) < 0)
				watch_offset(pg, offs[k], 0);
		if (gpu_attach(pg, d) != 0) {
			pthread_mutex_unlock(&lock);
			st_warn("hijack: cannot register a GPU proxy page; doorbell at %p not traced from the GPU", p);
			return real_dptr;
		}
		if (!pg->real_dev)
			pg->real_dev = real_dptr - (a - pgaddr);
		uint64_t out = pg->proxy_dev + (a - pgaddr);
		pthread_mutex_unlock(&lock);
		*hijacked = 1;
		return out;
	}
	if (pg) {
		uint64_t out = pg->proxy_dev + (a - pgaddr);
		if (!pg->real_dev)
			pg->real_dev = real_dptr - (a - pgaddr);
		pthread_mutex_unlock(&lock);
		*hijacked = 1;
		return out;
	}
	if (!freep) {
		pthread_mutex_unlock(&lock);
		return real_dptr;
	}
	pg = freep;
	memset(pg, 0, sizeof *pg);
	pg->proxy = mmap(NULL, PAGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (pg->proxy == MAP_FAILED) {
		pg->proxy = NULL;
		pthread_mutex_unlock(&lock);
		return real_dptr;
	}
	/* The GPU writes this page through its pinned mapping: after a fork a
	 * copy-on-write fault in the parent would move the parent's virtual page
	 * away from the physical page the GPU writes (the classic RDMA fork
	 * problem).  Not inherited, it stays the parent's alone, and a child
	 * cannot write into it. */
	madvise(pg->proxy, PAGE_SZ, MADV_DONTFORK);
	st_CUdeviceptr pd = 0;
	if (d->MemHostRegister(pg->proxy, PAGE_SZ, ST_CU_MEMHOSTREGISTER_PORTABLE | ST_CU_MEMHOSTREGISTER_DEVICEMAP) ||
	    d->MemHostGetDevicePointer(&pd, pg->proxy, 0) || !pd) {
		if (pd == 0)
			d->MemHostUnregister(pg->proxy);
		munmap(pg->proxy, PAGE_SZ);
		pg->proxy = NULL;
		pthread_mutex_unlock(&lock);
		st_warn("hijack: cannot register a proxy page with the driver; doorbell at %p not traced", p);
		return real_dptr;
	}
	pg->page = pgaddr;
	pg->proxy_dev = pd;
	pg->real_dev = real_dptr - (a - pgaddr);
	pg->page_id = page_id;
	memcpy(pg->offs, offs, sizeof offs[0] * (size_t)noffs);
	pg->noffs = noffs;
	if (d->CtxGetCurrent)
		d->CtxGetCurrent(&pg->cuctx);
	int dev = 0;
	if (d->CtxGetDevice && d->CtxGetDevice(&dev) == 0)
		pg->gpu = dev;
	pg->cpu = cfg.ncpus ? cfg.cpus[__atomic_fetch_add(&poller_seq, 1, __ATOMIC_RELAXED) % cfg.ncpus] : -1;
	pg->live = 1;
	if (!exit_hook) {
		exit_hook = 1;
		atexit(at_exit_hook); /* registered after the core's: runs before it */
	}
	if (pthread_create(&pg->thr, NULL, poller, pg) == 0)
		pg->thr_started = 1;
	else {
		pg->live = 0;
		d->MemHostUnregister(pg->proxy);
		munmap(pg->proxy, PAGE_SZ);
		pg->proxy = NULL;
		pthread_mutex_unlock(&lock);
		return real_dptr;
	}
	uint64_t out = pg->proxy_dev + (a - pgaddr);
	pthread_mutex_unlock(&lock);
	*hijacked = 1;
	return out;
}


/* ---- CPU doorbells (F24d) -------------------------------------------------------------
 * At mlx5dv_devx_alloc_uar the application gets reg_addr in a proxy page of
 * ours; base_addr and page_id stay real.  The page's poller starts at once
 * (it idles cheaply until the first doorbell) and forwards, records and
 * recovers exactly as for GPU doorbells.  See docs/hijack.md. */
static int cpumap_find(uintptr_t pg, int proxy_side)
{
	int n = __atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE);
	for (int i = 0; i < n; i++) {
		uintptr_t k = __atomic_load_n(proxy_side ? &cpumap[i].proxy : &cpumap[i].real, __ATOMIC_ACQUIRE);
		if (k && k == pg && __atomic_load_n(&cpumap[i].proxy, __ATOMIC_ACQUIRE))
			return i;
	}
	return -1;
}

void *st_hijack_cpu_real(void *p)
{
	if (!__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE) || !p)
		return p;
	uintptr_t a = (uintptr_t)p, pg = a & ~(uintptr_t)(PAGE_SZ - 1);
	int i = cpumap_find(pg, 1);
	return i < 0 ? p : (void *)(__atomic_load_n(&cpumap[i].real, __ATOMIC_ACQUIRE) + (a - pg));
}

uint64_t st_hijack_cpu_proxy_of_real(uint64_t host)
{
	if (!__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE) || !host)
		return host;
	uintptr_t pg = (uintptr_t)host & ~(uintptr_t)(PAGE_SZ - 1);
	int i = cpumap_find(pg, 0);
	return i < 0 ? host : (uint64_t)(__atomic_load_n(&cpumap[i].proxy, __ATOMIC_ACQUIRE) + (host - pg));
}

/* Watch register offset off of a CPU-proxy page, and the other half of its
 * BlueFlame pair (writers that alternate -- rdma-core, UCX -- ring reg and
 * reg ^ 0x100), both rung by owner (a verbs QPN, 0 for a DevX UAR).  Under
 * lock; the poller picks new offsets up at its next scan (noffs is published
 * last).  0 if the watch list cannot take the register itself. */
static int watch_offset(struct page *pg, uint16_t off, uint32_t owner)
{
	uint16_t want[2] = {off, (uint16_t)(off ^ 0x100)};
	int nwant = ((off ^ 0x100) >= 0x800 && (off ^ 0x100) < 0xc00) ? 2 : 1;
	int n = pg->noffs, ok = 1;
	for (int w = 0; w < nwant; w++) {
		int have = 0;
		for (int k = 0; k < n; k++)
			if (pg->offs[k] == want[w]) {
				pg->owner[k] = owner; /* a freed verbs word taken over */
				have = 1;
			}
		if (have)
			continue;
		if (n == MAX_WATCH) {
			ok = w > 0; /* the register itself is watched; only its twin is not */
			break;
		}
		pg->offs[n] = want[w];
		pg->owner[n] = owner;
		pg->last[n] = 0;
		n++;
	}
	__atomic_store_n(&pg->noffs, n, __ATOMIC_RELEASE);
	return ok;
}

/* The QPN that rings watched word off of pg, -1 if the word is not watched. */
static long word_owner(const struct page *pg, uint16_t off)
{
	for (int k = 0; k < pg->noffs; k++)
		if (pg->offs[k] == off)
			return pg->owner[k];
	return -1;
}

/* Gate shared by the CPU-doorbell entry points. */
static int cpu_doorbells_on(void)
{
	cfg_load();
	/* The GPU side needs the CUDA wrappers (they translate the proxy address);
	 * without them an IOMEMORY registration of the proxy would fail. */
	return cfg.cpu_doorbells && cfg.mode != HJ_OFF && st_provider_on(ST_PROV_CUDA);
}

/* A new CPU-proxy page for real page pgaddr with register off watched and its
 * poller started; the register's proxy address, NULL on failure (lock held). */
static void *cpu_page_new(uintptr_t pgaddr, uint16_t off, uint32_t page_id, void *ctx, int verbs, uint32_t owner)
{
	struct page *pg = NULL;
	int slot = -1;
	for (int i = 0; i < MAX_PAGES && !pg; i++)
		if (!pages[i].live && !pages[i].proxy)
			pg = &pages[i];
	for (int i = 0; i < MAX_PAGES && slot < 0; i++)
		if (!cpumap[i].proxy)
			slot = i;
	if (!pg || slot < 0)
		return NULL;
	memset(pg, 0, sizeof *pg);
	pg->proxy = mmap(NULL, PAGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (pg->proxy == MAP_FAILED) {
		pg->proxy = NULL;
		return NULL;
	}
	/* like the real UAR mapping (VM_DONTCOPY), and the GPU path's proxy */
	madvise(pg->proxy, PAGE_SZ, MADV_DONTFORK);
	pg->cpuproxy = 1;
	pg->cpu_reg = pgaddr + off;
	pg->page = pgaddr;
	pg->page_id = page_id;
	pg->ctx = ctx;
	pg->verbs = verbs;
	pg->gpu = -1;
	watch_offset(pg, off, owner);
	/* A core from SIGMATRACE_POLLER_CPUS only once the page is rung (see
	 * poller_main): unused UARs (a CQ's, an idle peer's) must not take the
	 * cores meant for the doorbells that are. */
	pg->cpu = -1;
	pg->live = 1;
	if (!exit_hook) {
		exit_hook = 1;
		atexit(at_exit_hook);
	}
	if (pthread_create(&pg->thr, NULL, poller, pg) != 0) {
		pg->live = 0;
		munmap(pg->proxy, PAGE_SZ);
		pg->proxy = NULL;
		pg->cpuproxy = 0;
		return NULL;
	}
	pg->thr_started = 1;
	cpumap[slot].real = pgaddr;
	__atomic_store_n(&cpumap[slot].proxy, (uintptr_t)pg->proxy, __ATOMIC_RELEASE);
	if (slot + 1 > cpumap_n)
		__atomic_store_n(&cpumap_n, slot + 1, __ATOMIC_RELEASE);
	return pg->proxy + off;
}

static void *cpu_proxy_failed_for(const char *what, uint32_t id)
{
	pthread_mutex_lock(&lock);
	cpu_proxy_failed++;
	pthread_mutex_unlock(&lock);
	st_warn("hijack: %s %#x left unproxied; its CPU doorbells are not traced", what, id);
	return NULL;
}

ST_EXPORT void *st_hijack_cpu_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx, uint32_t flags)
{
	(void)base_addr;
	(void)flags; /* every type: a BlueFlame write arrives as its first 8 bytes, see docs/hijack.md */
	uintptr_t reg = (uintptr_t)reg_addr, pgaddr = reg & ~(uintptr_t)(PAGE_SZ - 1);
	if (!cpu_doorbells_on() || !reg_addr || (reg & 7))
		return NULL;
	pthread_once(&fork_once, fork_register);
	pthread_mutex_lock(&lock);
	void *out = NULL;
	int watched = 0;
	for (int i = 0; i < MAX_PAGES && !watched; i++)
		watched = pages[i].live && pages[i].page == pgaddr;
	/* a page watched already (another DevX UAR in it, verbs QPs, the GPU
	 * path): this UAR stays real -- its free must not stop the others' poller */
	if (!watched)
		out = cpu_page_new(pgaddr, (uint16_t)(reg & (PAGE_SZ - 1)), page_id, ctx, 0, 0);
	pthread_mutex_unlock(&lock);
	return out ? out : cpu_proxy_failed_for("DevX UAR page", page_id);
}

/* F24d on verbs QPs (mlx5dv_init_obj): the proxy for QP qpn's BlueFlame
 * register, or NULL (the QP keeps the real one).  QPs of one context whose
 * registers share a UAR page share its proxy and poller (released at
 * ibv_close_device), but never a register word: a polled word that two QPs
 * ring could lose one QP's doorbell (the later value hides the earlier), so
 * a second QP on a word another QP owns keeps the real register. */
ST_EXPORT void *st_hijack_cpu_verbs_reg(void *reg_addr, void *ctx, uint32_t qpn)
{
	uintptr_t reg = (uintptr_t)reg_addr, pgaddr = reg & ~(uintptr_t)(PAGE_SZ - 1);
	uint16_t off = (uint16_t)(reg & (PAGE_SZ - 1));
	if (!cpu_doorbells_on() || !reg_addr || (reg & 7) || !ctx || !qpn)
		return NULL;
	pthread_once(&fork_once, fork_register);
	pthread_mutex_lock(&lock);
	void *out = NULL;
	struct page *pg = NULL;
	for (int i = 0; i < MAX_PAGES && !pg; i++)
		if (pages[i].live && pages[i].page == pgaddr)
			pg = &pages[i];
	if (!pg) {
		out = cpu_page_new(pgaddr, off, ST_HIJACK_VERBS_UAR_PAGE, ctx, 1, qpn);
	} else if (pg->cpuproxy && pg->verbs && pg->ctx == ctx) {
		long who = word_owner(pg, off), twin = word_owner(pg, (uint16_t)(off ^ 0x100));
		if (who == (long)qpn) /* the same QP asks again */
			out = pg->proxy + off;
		else if ((who < 0 || who == OWNER_FREE) && (twin < 0 || twin == OWNER_FREE) && watch_offset(pg, off, qpn))
			out = pg->proxy + off;
	}
	pthread_mutex_unlock(&lock);
	return out ? out : cpu_proxy_failed_for("verbs QP", qpn);
}

/* ibv_close_device: the context's UAR pages go away with it; stop the pollers
 * of the proxies handed out for its verbs QPs first (a last forward each). */
ST_EXPORT void st_hijack_cpu_release_ctx(void *ctx)
{
	if (!ctx || !__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&lock);
	for (int k = 0; k < MAX_PAGES; k++) {
		struct page *pg = &pages[k];
		if (!pg->live || !pg->cpuproxy || !pg->verbs || pg->ctx != ctx)
			continue;
		int i = cpumap_find((uintptr_t)pg->proxy, 1); /* before the proxy is unmapped (and reusable) */
		stop_page(pg); /* last values forwarded, poller joined, proxy unmapped */
		if (i >= 0)
			__atomic_store_n(&cpumap[i].proxy, 0, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
}

ST_EXPORT void *st_hijack_cpu_uar_release(void *app_reg)
{
	if (!app_reg || !__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE))
		return NULL;
	uintptr_t a = (uintptr_t)app_reg, ppg = a & ~(uintptr_t)(PAGE_SZ - 1);
	pthread_mutex_lock(&lock);
	int i = cpumap_find(ppg, 1);
	if (i < 0) {
		pthread_mutex_unlock(&lock);
		return NULL;
	}
	uintptr_t real = cpumap[i].real;
	for (int k = 0; k < MAX_PAGES; k++)
		if (pages[k].live && pages[k].cpuproxy && (uintptr_t)pages[k].proxy == ppg) {
			stop_page(&pages[k]); /* last values forwarded, poller joined, proxy unmapped */
			break;
		}
	__atomic_store_n(&cpumap[i].proxy, 0, __ATOMIC_RELEASE); /* real stays: a racing reader never sees 0 */
	pthread_mutex_unlock(&lock);
	return (void *)(real + (a - ppg));
}

/* ibv_destroy_qp: forget QP qpn and its SQ/doorbell-record umems, if they are
 * the ones registered for it as a verbs QP (a DevX QP's record is left alone). */
ST_EXPORT void st_hijack_forget_verbs_qp(uint32_t qpn, uint32_t sq_umem_id, uint32_t dbr_umem_id)
{
	pthread_mutex_lock(&lock);
	struct qp_rec *q = qp_slot(qpn, 0);
	if (!q || q->wq_umem != sq_umem_id || !__atomic_load_n(&q->live, __ATOMIC_ACQUIRE)) {
		pthread_mutex_unlock(&lock);
		return;
	}
	__atomic_store_n(&q->live, 0, __ATOMIC_RELEASE);
	for (int i = 0; i < MAX_UMEMS; i++)
		if (umems[i].live && (umems[i].id == sq_umem_id || umems[i].id == dbr_umem_id))
			umems[i].live = 0;
	/* its words become free for the QP that gets its bfreg next, and its
	 * page's poller finishes with it before the SQ is freed (the caller
	 * destroys the QP after this returns) */
	for (int k = 0; k < MAX_PAGES; k++) {
		struct page *pg = &pages[k];
		if (!pg->live || !pg->verbs || !pg->thr_started)
			continue;
		int mine = 0;
		for (int w = 0; w < pg->noffs; w++)
			if (pg->owner[w] == qpn) {
				pg->owner[w] = OWNER_FREE;
				mine = 1;
			}
		if (!mine || __atomic_load_n(&pg->quiesced, __ATOMIC_ACQUIRE))
			continue;
		uint32_t want = __atomic_add_fetch(&pg->sync_seq, 1, __ATOMIC_ACQ_REL);
		pthread_mutex_unlock(&lock);
		/* bounded: a poller sleeps at most ~1 ms between scans */
		for (int t = 0; t < 20000 && (int32_t)(__atomic_load_n(&pg->sync_ack, __ATOMIC_ACQUIRE) - want) < 0 &&
				!__atomic_load_n(&pg->quiesced, __ATOMIC_ACQUIRE) && !__atomic_load_n(&pg->stop, __ATOMIC_ACQUIRE);
		     t++) {
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&lock);
	}
	pthread_mutex_unlock(&lock);
}
