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
 *
 * This is the hijack's one private header: what its files share and nothing
 * else includes (the rest of the tracer sees hijack.h).
 *
 *   config.c        configuration (SIGMATRACE_HIJACK_*, SIGMATRACE_POLLER_*),
 *                   CPU feature probes for the poller's wait (WAITPKG, MONITORX)
 *   arch.h          per-architecture barriers and spin/wait instructions
 *   registry.c      what the providers told us: UARs, umems, QPs, host
 *                   registrations
 *   recovery.c      WQE recovery: the poller's view of a QP, the staging
 *                   ring, copies (memcpy or CUDA), parsing and verification
 *   poller.c        the poller thread: scan, forward, record, recover
 *   page.c          proxy page lifecycle: the GPU path (device pointer
 *                   requests), GPU attach/detach of CPU pages, stop, exit, fork
 *   cpu_doorbell.c  CPU doorbells (F24d): proxies for DevX UARs and verbs QPs
 *
 * Names: st_hijack_* is the interface (hijack.h); hijack_* is shared by the
 * files of this folder only.  One lock (hijack_lock) guards every table;
 * the poller reads a few fields lock-free, marked atomic below.
 */
#ifndef ST_HIJACK_PRIVATE_H
#define ST_HIJACK_PRIVATE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "hijack/cudrv.h"
#include "hijack/hijack.h"

#define MAX_UARS 256
#define MAX_UMEMS 1024
#define MAX_REGS 1024
#define MAX_PAGES 256
#define QP_SLOTS 4096 /* open addressing, power of two */
#define MAX_WATCH 8
#define PAGE_SZ 4096u

/* ---- configuration (config.c) ------------------------------------------- */
enum hijack_mode { HIJACK_OFF = 0, HIJACK_FORWARD, HIJACK_BLOCKING, HIJACK_NONBLOCKING, HIJACK_SYNC, HIJACK_GUARDED, HIJACK_NMODES };
extern const char *const hijack_mode_names[] ST_HIDDEN;

struct hijack_config {
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
	int test_stuck;       /* test hook SIGMATRACE_HIJACK_TEST_STUCK: a stopping poller blocks for good */
	int stop_timeout_ms;  /* longest wait for a poller to stop, drain or quiesce */
};
extern struct hijack_config hijack_cfg ST_HIDDEN;

void hijack_cfg_load(void) ST_HIDDEN;
const char *hijack_wait_name(int k) ST_HIDDEN;

/* ---- setup registries (registry.c) ---------------------------------------- */
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

extern pthread_mutex_t hijack_lock ST_HIDDEN;
extern struct uar_rec hijack_uars[MAX_UARS] ST_HIDDEN;
extern struct umem_rec hijack_umems[MAX_UMEMS] ST_HIDDEN;
extern struct reg_rec hijack_regs[MAX_REGS] ST_HIDDEN;

/* The record of QP qpn (lock-free readers); with create, the empty slot
 * where it goes.  NULL: not found / table full. */
struct qp_rec *hijack_qp_slot(uint32_t qpn, int create) ST_HIDDEN;
/* Record q goes (QP forgotten); its slot is reused.  Under hijack_lock. */
void hijack_qp_free(struct qp_rec *q) ST_HIDDEN;
extern uint64_t hijack_qp_table_full ST_HIDDEN; /* QPs not recorded for want of a slot */
/* The SQ of a QP as (address, is-GPU); under hijack_lock. */
int hijack_qp_sq(const struct qp_rec *q, uintptr_t *sq, int *gpu) ST_HIDDEN;
/* The doorbell record of a QP in host memory (0: none known, or in GPU memory); under hijack_lock. */
uintptr_t hijack_qp_dbr(const struct qp_rec *q) ST_HIDDEN;

/* ---- proxy pages and pollers ---------------------------------------------- */
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
	int used;             /* this entry of pg->qs holds a QP (else free for another) */
	uintptr_t dbr;        /* its doorbell record (host memory; 0 unknown): shared words catch up from it */
	int known;            /* a QP record was found: log_sq is its ring size */
	int rung;             /* pi and word hold the last doorbell forwarded */
	int word;             /* where that came from (watched offset | 0x100 for the GPU proxy) */
	uint64_t stale;       /* older doorbells seen after a newer one of another word (not forwarded) */
	int bfmode;           /* BlueFlame words: +1 the writer copies WQEs (bf_post); 0, -1, ..: probes that found no copy, -BF_PROBES: 8-byte doorbells (db) */
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
#define MAX_SHARERS 64 /* per page: verbs QPs ringing a register word another QP owns */
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
	uint64_t unknown_qp, copies, sync_waits, guard_waits, stale;
	uint64_t untracked;                  /* doorbells of QPs the full qs[] could not take */
	uint64_t gone_ok, gone_lost, gone_wqes; /* counters of QP states freed (QP destroyed) */
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
	uint16_t bfsz[MAX_WATCH];  /* verbs: BlueFlame register size of each watched word (mlx5dv bf.size; 0: doorbell only) */
	uint64_t bf_forwarded, bf_db, bf_torn; /* poller: BlueFlame copies forwarded whole; 8-byte doorbells on a BF word; copies never completed */
	/* verbs: one lock per 512-byte bfreg of the real page (index (off >> 9) & 7), held by the poller
	 * around every forward to it and by the ibv provider around rdma-core's own posts of QPs whose
	 * real register is in it (cpu_doorbell.c, st_hijack_ring_lock) */
	uint32_t ring_lock[8];
	/* verbs QPs on a word another QP owns (shared bfregs): their register is
	 * proxied too, the poller is the only writer of the real word, and it
	 * catches up from the sharers' doorbell records (under hijack_lock;
	 * sh_gen, atomic, bumped on every change; the poller copies them) */
	struct { uint32_t qpn; uint16_t off; } sh[MAX_SHARERS];
	int nsh;
	uint32_t sh_gen;
	struct { uint32_t qpn; uint16_t off; } psh[MAX_SHARERS]; /* poller-private copy */
	int npsh;
	uint32_t psh_gen;
	uint64_t dbr_recovered, dbr_dups; /* doorbells forwarded from a doorbell record; rung again after that */
	uint32_t sync_seq, sync_ack; /* a full scan + drain requested / done (atomic; QP or umem forgotten) */
	uint32_t incarnation;        /* which page this slot holds (a waiter notices the slot reused) */
	uint8_t *gproxy;
	int gwatch;                /* poller scans gproxy (atomic) */
	uint64_t glast[MAX_WATCH];
	int gpu_want;              /* atomic: 1 attach CUDA, 0 detach */
	uint32_t gpu_seq, gpu_ack; /* requests posted / done (atomic) */
	uint32_t gpu_seen;         /* poller-private */
	int cuda_on;               /* poller-private: stream/events/pinned stage set up */
	int installed;             /* poller-private: DB_HIJACK_INSTALL emitted */
	int quiesce, quiesced;     /* process exit: summary out, then forward only (atomic) */
	int exited;                /* the poller thread is about to return (atomic) */
	int stuck;                 /* a stop/quiesce/detach gave up waiting for the poller (under hijack_lock) */
};

/* The lock of the bfreg (512 bytes: both BlueFlame halves) that holds offset off of a verbs page. */
static inline uint32_t *hijack_ring_lock_of(struct page *pg, uint16_t off)
{
	return &pg->ring_lock[(off >> 9) & 7];
}

static inline const struct st_cudrv *drv(void)
{
	return st_cudrv();
}

/* ---- WQE recovery (recovery.c) -------------------------------------------- */
/* The poller's state of QP qpn on page pg (new, or refreshed when the QP was
 * recreated or forgotten); NULL when the page tracks too many QPs. */
struct qpstate *hijack_page_qp(struct page *pg, uint32_t qpn) ST_HIDDEN;
/* Free the states of pg's QPs that were destroyed and have no copy pending (poller). */
void hijack_page_qp_gc(struct page *pg) ST_HIDDEN;
/* After a sync request (QP or umem forgotten; every copy drained): free the
 * dead QPs' states and look every other QP's SQ and doorbell record up again,
 * so no pointer into a deregistered umem survives (poller). */
void hijack_page_qp_refresh(struct page *pg) ST_HIDDEN;
/* Parse every pending range whose batch has completed (wait: every range). */
void hijack_drain(struct page *pg, int wait) ST_HIDDEN;
void hijack_close_batch(struct page *pg) ST_HIDDEN;
/* Start copying WQEBBs [first, first + cnt) of the QP's SQ into the staging ring. */
void hijack_issue_copy(struct page *pg, struct qpstate *s, uint32_t first, uint32_t cnt) ST_HIDDEN;
/* The staging ring (every poller; host SQs are copied with memcpy). */
void hijack_poller_stage_alloc(struct page *pg) ST_HIDDEN;
/* CUDA for device-memory SQs (pinned staging ring, stream, events) and its undoing. */
void hijack_poller_attach_cuda(struct page *pg) ST_HIDDEN;
void hijack_poller_detach_cuda(struct page *pg) ST_HIDDEN;
void hijack_poller_teardown_cuda(struct page *pg) ST_HIDDEN;

/* ---- the poller thread (poller.c) ----------------------------------------- */
void *hijack_poller(void *arg) ST_HIDDEN;
/* pthread_create(pg->thr, hijack_poller) with every signal blocked in the new thread; 0 on success. */
int hijack_start_poller(struct page *pg) ST_HIDDEN;
/* The core of SIGMATRACE_POLLER_CPUS for the next poller (round robin), -1: none. */
int hijack_next_poller_cpu(void) ST_HIDDEN;

/* ---- proxy pages (page.c) ------------------------------------------------- */
extern struct page hijack_pages[MAX_PAGES] ST_HIDDEN;
/* Process exit stops the pollers (atexit, once; caller holds hijack_lock). */
void hijack_hook_exit(void) ST_HIDDEN;
/* A forked child forgets the parent's pages (pthread_atfork, once). */
void hijack_hook_fork(void) ST_HIDDEN;
/* Stop pg's poller (a last scan, joined) and unmap its proxy; caller holds
 * hijack_lock, which is dropped while joining. */
void hijack_stop_page(struct page *pg) ST_HIDDEN;
/* CLOCK_MONOTONIC deadline (ns) of a wait for a poller that starts now. */
uint64_t hijack_stop_deadline(void) ST_HIDDEN;
/* A new page's incarnation number (set after its memset, under hijack_lock). */
uint32_t hijack_page_incarnation(void) ST_HIDDEN;
/* The teardown handshake (QP, umem forgotten): the pollers of the pages
 * marked in want[MAX_PAGES] scan once more, finish every copy and refresh
 * their QPs' SQ pointers; waits for all of them against one deadline
 * (SIGMATRACE_HIJACK_STOP_TIMEOUT_MS; one that does not answer is reported
 * stuck).  Caller holds hijack_lock, which is dropped while waiting. */
void hijack_sync_pages(const unsigned char *want) ST_HIDDEN;
/* Mark in want[] the pages a DevX QP on UAR page uar_page may be rung on
 * (that UAR's pages, and pages whose UAR index is unknown); under hijack_lock. */
void hijack_pages_of_uar(uint32_t uar_page, unsigned char *want) ST_HIDDEN;

/* ---- CPU doorbells (cpu_doorbell.c) --------------------------------------- */
extern uint64_t hijack_cpu_proxy_failed ST_HIDDEN; /* CPU-doorbell proxies not installed (the real UAR was left alone) */
int hijack_watch_offset(struct page *pg, uint16_t off, uint32_t owner) ST_HIDDEN;
long hijack_word_owner(const struct page *pg, uint16_t off) ST_HIDDEN;

#endif
