/*
 * The poller thread of a proxy page: it scans the watched doorbell words,
 * forwards every new value to the real UAR register (one 64-bit store and a
 * flush), records it, and drives WQE recovery (recovery.c) in the configured
 * mode.  Idle, it spins, then waits (umwait/mwaitx on a single GPU word) or
 * sleeps with back-off.  At process exit a CPU-doorbell page keeps
 * forwarding (forward_only) after its summary.
 *
 * Over 600 lines: the poller thread and everything private to it (scan, ordering, BlueFlame
 * capture, forward, idle wait, summary); its state is the page's, shared with no other file.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "arch.h"
#include "hijack_private.h"

#if defined(__x86_64__)
static void umon(const volatile void *a) { arm_umonitor(a); }
static void umw(uint64_t t) { wait_umwait(t); }
static void mon(const volatile void *a) { arm_monitorx(a); }
static void mw(uint64_t t) { wait_mwaitx(t); }
static const struct monitor_ops umwait_ops = {umon, umw}, mwaitx_ops = {mon, mw};
#endif

static void poller_sync(struct page *pg);
static void poller_install(struct page *pg);

static int poller_seq; /* pollers given a core so far */

int hijack_next_poller_cpu(void)
{
	return hijack_cfg.ncpus ? hijack_cfg.cpus[__atomic_fetch_add(&poller_seq, 1, __ATOMIC_RELAXED) % hijack_cfg.ncpus] : -1;
}

/* Forward doorbell value v to the real UAR register: the exact value in one
 * 64-bit store, as the writer made it, then flushed out so that it reaches
 * the NIC now and as a write of its own (never merged with the next one on
 * a write-combining BlueFlame mapping).  The barrier before it keeps
 * whatever the WQEs' writers published ahead of the doorbell, as rdma-core
 * does before every doorbell. */
static inline void forward_doorbell(volatile uint64_t *real, uint64_t v)
{
	udma_to_device_barrier();
	*real = v;
	mmio_flush_writes();
}

/* Forward a BlueFlame copy: the n bytes (a multiple of 64, up to bf.size)
 * the writer stored into the proxy register, to the real register in the
 * same 64-bit stores and order, inside a write-combining burst as rdma-core's
 * mlx5_bf_copy and UCX's uct_ib_mlx5_bf_copy make it: mmio_wc_start before
 * (every store to memory, the SQ and the doorbell record, ahead of it),
 * mmio_flush_writes after (the burst leaves the write-combining buffer now,
 * whole, and is never merged with the next doorbell's). */
static inline void forward_bf(volatile uint64_t *real, const uint64_t *src, size_t n)
{
	mmio_wc_start();
	for (size_t i = 0; i < n / 8; i++)
		real[i] = src[i];
	mmio_flush_writes();
}

/* The forward of word k: a BlueFlame copy (bfn bytes of bf) or the 8-byte
 * doorbell v.  On a verbs page, inside the bfreg's ring lock: rdma-core's
 * own posts of QPs on that real register hold it too (ibv provider), so this
 * store never lands inside their BlueFlame burst (finding 9). */
static void forward_word(struct page *pg, int k, const uint64_t *bf, size_t bfn, uint64_t v)
{
	volatile uint64_t *real = (volatile uint64_t *)(pg->page + pg->offs[k]);
	uint32_t *lock = pg->verbs ? hijack_ring_lock_of(pg, pg->offs[k]) : NULL;
	if (lock)
		st_hijack_ring_enter(lock);
	if (bfn)
		forward_bf(real, bf, bfn);
	else
		forward_doorbell(real, v);
	if (lock)
		st_hijack_ring_leave(lock);
}

/* Longest wait for a BlueFlame copy the writer has begun (its first 8 bytes
 * seen) to be complete in the proxy register.  The writer stores the copy
 * right after the ctrl word; a longer wait means it was preempted mid-copy. */
#define BF_WAIT_NS 100000000ull
/* How long each of a QP's first doorbells on a BlueFlame word waits for a
 * copy, and how many of them must find none before the QP is taken for an
 * 8-byte (db mode) writer: one probe alone misjudged a bf_post writer that
 * was preempted between its ctrl word and the rest of its copy (2 cores under
 * load), and every later copy of that QP went out as 8 bytes. */
#define BF_PROBE_NS 200000ull
#define BF_PROBES 3

/* The WQE a doorbell value v announces, from QP s's SQ (host memory): nbb
 * WQEBBs from the ctrl's wqe_index, wrapping the ring as the writer's copy
 * does. */
static void sq_wqe(const struct qpstate *s, uint16_t idx, unsigned nbb, uint64_t *out)
{
	uint32_t mask = (1u << s->log_sq) - 1;
	racy_read_begin();
	for (unsigned i = 0; i < nbb; i++)
		memcpy((uint8_t *)out + i * 64, (const uint8_t *)s->sq + (size_t)((idx + i) & mask) * 64, 64);
	racy_read_end();
}

/* Doorbell value v on BlueFlame word k (CPU proxy) of QP s: the number of
 * bytes of a whole BlueFlame copy now in buf (then forwarded as such), or 0
 * (an 8-byte doorbell: forward v alone).  A copy is whole when the proxy
 * register's bytes equal the SQ's WQE at the ctrl's index for min(WQEBBs(DS),
 * bf.size / 64) WQEBBs -- what every mlx5 writer copies, from the SQ.  A QP
 * known to copy (bf_post) waits for the rest of its copy; one known to ring
 * 8 bytes (db) is checked once; a QP's first doorbell decides which it is. */
static size_t bf_capture(struct page *pg, int k, struct qpstate *s, uint64_t v, uint64_t *buf)
{
	uint8_t b[8];
	memcpy(b, &v, 8);
	unsigned ds = b[7] & 0x3f, nbb = (ds * 16 + 63) / 64, cap = __atomic_load_n(&pg->bfsz[k], __ATOMIC_ACQUIRE) / 64u;
	if (!ds || !s || !s->have_sq || s->gpu || s->log_sq > 16)
		return 0;
	if (nbb > cap)
		nbb = cap;
	if (nbb > 1u << s->log_sq)
		return 0;
	uint64_t want[32];
	sq_wqe(s, (uint16_t)((b[1] << 8) | b[2]), nbb, want);
	size_t n = (size_t)nbb * 64;
	if (want[0] != v)
		return 0; /* the SQ slot is not this doorbell's WQE (DS-0 style, or reused): a doorbell */
	const volatile uint64_t *p = (const volatile uint64_t *)(pg->proxy + pg->offs[k]);
	uint64_t t0 = 0, limit = s->bfmode > 0 ? BF_WAIT_NS : s->bfmode <= -BF_PROBES ? 0 : BF_PROBE_NS;
	for (unsigned spin = 0;; spin++) {
		for (size_t i = 0; i < n / 8; i++)
			buf[i] = p[i];
		if (buf[0] != v)
			return 0; /* rung again on this word meanwhile: the newer value comes with the next scan */
		if (!memcmp(buf, want, n)) {
			s->bfmode = 1;
			pg->bf_forwarded++;
			return n;
		}
		uint64_t now = st_now_ns();
		if (!t0)
			t0 = now;
		if (now - t0 >= limit)
			break;
		if (spin & 63)
			cpu_relax();
		else
			sched_yield(); /* the writer may need this core to finish its copy */
	}
	if (s->bfmode > 0)
		pg->bf_torn++; /* a copy begun and not finished in time: its ctrl word alone (the NIC reads the SQ) */
	else {
		if (s->bfmode > -BF_PROBES)
			s->bfmode--; /* one more probe without a copy */
		pg->bf_db++;
	}
	return 0;
}

/* guarded mode: the uncopied span (WQEBBs) at which a doorbell waits for the copies */
static inline uint32_t guard_wqebb(const struct qpstate *s)
{
	uint32_t g = (uint32_t)(((uint64_t)hijack_cfg.guard_pct << s->log_sq) / 100);
	return g ? g : 1;
}

/* The producer index (mod 2^16) and QPN a doorbell value announces. */
static void db_decode(uint64_t v, uint16_t *pi16, uint32_t *qpn)
{
	uint8_t b[8];
	memcpy(b, &v, 8);
	uint16_t pi = (uint16_t)((b[1] << 8) | b[2]); /* ref §3.3: bytes 1-2 */
	if (b[7] & 0x3f) /* rdma-core convention: last WQE's ctrl, PI = index + WQEBBs(DS) */
		pi = (uint16_t)(pi + ((b[7] & 0x3f) * 16 + 63) / 64);
	*pi16 = pi;
	*qpn = ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 8) | b[6];
}

/* One QP's doorbells in the order they were rung (finding 1).  A QP that
 * alternates the BlueFlame halves (rdma-core, UCX rc_mlx5: reg, reg ^ 0x100,
 * reg, ...) can ring both between two scans; the scan reads the words in a
 * fixed order and may then see the newer value first and the older one
 * after it.  The older one must not reach the NIC after the newer one (its
 * last doorbell would be stale, and the 16-bit producer index would appear
 * to wrap by ~65k WQEBBs).  An older value can only come from another word
 * than the QP's last doorbell (the same word holds the newest value rung
 * there), so: a value from another word whose producer index lies behind the
 * last one forwarded -- by at most the ring size, or half the 16-bit space
 * when the QP's ring is unknown -- was overtaken and is dropped (counted in
 * the summary as stale_doorbells).  Returns 1 for such a value; else notes
 * the word and returns 0.  A writer that rings one word only is never
 * filtered. */
static int overtaken(struct qpstate *s, int word, uint16_t pi16)
{
	if (s->rung && word != s->word) {
		uint16_t behind = (uint16_t)((uint16_t)s->pi - pi16);
		uint32_t win = s->known ? (1u << s->log_sq) : 0x7fffu;
		if (behind && behind <= win) {
			s->stale++;
			return 1;
		}
	}
	s->rung = 1;
	s->word = word;
	return 0;
}

/* A new doorbell value v at watched offset k of the CPU proxy (src 0) or of
 * the GPU proxy (src 1). */
static void on_doorbell(struct page *pg, int k, int src, uint64_t v)
{
	uint64_t t_obs = st_tsc();
	uint16_t pi16;
	uint32_t qpn;
	db_decode(v, &pi16, &qpn);
	/* a GPU write is seen only after its device pointer was handed out, i.e.
	 * after the attach request was posted: take it before anything else */
	if (__atomic_load_n(&pg->gpu_seq, __ATOMIC_ACQUIRE) != pg->gpu_seen)
		poller_sync(pg);
	if (!pg->installed)
		poller_install(pg);
	int mode = hijack_cfg.mode;
	struct qpstate *s = hijack_page_qp(pg, qpn); /* every mode: the order of its doorbells */
	if (!s)
		pg->untracked++; /* more live QPs on this page than qs[] holds: forwarded, not recovered */
	if (s && overtaken(s, k | (src << 8), pi16)) {
		pg->stale++;
		return;
	}
	if (s && s->rung && pg->npsh && (uint16_t)s->pi == pi16 && s->doorbells) {
		/* a shared word: announced already from the QP's doorbell record */
		pg->dbr_dups++;
		return;
	}
	uint32_t delta = 0, first = 0;
	int recover = 0;
	if (s) {
		s->doorbells++;
		delta = (uint16_t)(pi16 - (uint16_t)s->pi);
		first = s->pi;
		if (mode == HIJACK_FORWARD)
			; /* no recovery: the producer index only */
		else if (s->have_sq && delta) {
			if (delta > (1u << s->log_sq)) {
				st_ev_ext(ST_EV_DB_WQE_LOST, (uint16_t)first, qpn, delta, 0, 0, ST_WQE_LOST_CORRUPT, 0);
				s->wqebb_lost += delta;
			} else
				recover = 1;
		} else if (!s->have_sq)
			pg->unknown_qp++;
		s->pi += delta;
	}
	if (recover && (mode == HIJACK_SYNC || mode == HIJACK_BLOCKING)) {
		hijack_issue_copy(pg, s, first, delta);
		if (mode == HIJACK_SYNC || pg->batch_wqebb >= st_cfg.batch_threshold) {
			/* paper's mode: a threshold-crossing doorbell waits for the copy */
			hijack_close_batch(pg);
			hijack_drain(pg, 1);
		}
	}
	/* A host-memory SQ (CPU writers, F24d) is copied with a plain memcpy:
	 * done before the forward in every recovering mode, so the NIC cannot
	 * complete, nor the application reuse, a slot before it is copied. */
	int pre = recover && !s->gpu && (mode == HIJACK_NONBLOCKING || mode == HIJACK_GUARDED);
	if (pre)
		hijack_issue_copy(pg, s, first, delta);
	int held = 0;
	if (recover && mode == HIJACK_GUARDED && !pre) {
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
			hijack_issue_copy(pg, s, first, delta);
			hijack_close_batch(pg);
			hijack_drain(pg, 1);
			s->guard_waits++;
			pg->guard_waits++;
			held = 1;
		}
	}
	uint64_t bfbuf[32];
	size_t bfn = src == 0 && pg->verbs && __atomic_load_n(&pg->bfsz[k], __ATOMIC_ACQUIRE) >= 64 ? bf_capture(pg, k, s, v, bfbuf) : 0;
	forward_word(pg, k, bfbuf, bfn, v);
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
	if (recover && mode == HIJACK_NONBLOCKING) {
		if (!pre)
			hijack_issue_copy(pg, s, first, delta);
		if (pg->batch_wqebb >= st_cfg.batch_threshold)
			hijack_close_batch(pg);
		hijack_drain(pg, 0);
	} else if (recover && mode == HIJACK_GUARDED && !held) {
		if (!pre)
			hijack_issue_copy(pg, s, first, delta);
		/* close batches early enough that completions are known well before
		 * the span reaches the guard */
		uint32_t g = guard_wqebb(s) / 2;
		if (pg->batch_wqebb >= st_cfg.batch_threshold || pg->batch_wqebb >= (g ? g : 1))
			hijack_close_batch(pg);
		hijack_drain(pg, 0);
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
		pg->cpu = hijack_next_poller_cpu();
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
	st_json_hex(&j, "proxy_dev", __atomic_load_n(&pg->proxy_dev, __ATOMIC_ACQUIRE));
	st_json_hex(&j, "real_dev", __atomic_load_n(&pg->real_dev, __ATOMIC_ACQUIRE));
	st_json_uint(&j, "page_id", pg->page_id);
	st_json_str(&j, "mode", hijack_mode_names[hijack_cfg.mode]);
	st_json_str(&j, "wait", hijack_wait_name(hijack_cfg.wait_kind));
	st_json_int(&j, "cpu", pg->cpu);
	st_json_uint(&j, "batch_threshold", st_cfg.batch_threshold);
	st_json_bool(&j, "async_copy", pg->stream != NULL);
	st_json_bool(&j, "double_copy", hijack_cfg.double_copy);
	if (hijack_cfg.mode == HIJACK_GUARDED)
		st_json_uint(&j, "guard_pct", (uint64_t)hijack_cfg.guard_pct);
	if (pg->cpuproxy) {
		st_json_bool(&j, "cpu_doorbells", 1);
		st_json_hex(&j, "cpu_proxy", (uintptr_t)pg->proxy);
		st_json_int(&j, "gpu", pg->proxy_dev ? pg->gpu : -1);
	}
	st_json_close(&j, '}');
	uint64_t id = st_side_json(buf, j.len);
	st_ev(ST_EV_DB_HIJACK_INSTALL, (uint16_t)pg->gpu, pg->page_id, id);
}

/* ---- shared register words (finding 9) ---------------------------------------
 * Verbs QPs on one register word (rdma-core's shared bfregs) all ring the same
 * proxy word: when two ring between two scans the later value hides the
 * earlier, and that QP's doorbell would never reach the NIC.  Every mlx5
 * writer stores the doorbell record (SQ counter, BE32 at +4) before ringing,
 * so the poller reads the records of the word's other QPs and forwards, for
 * each one that moved past the last index forwarded, a doorbell of its own
 * (NVSHMEM's form: index = producer index, DS 0, ref §3.3) to that word --
 * the poller stays the only writer of the real word.  The QP's own value,
 * seen later with the same index, is then not forwarded again. */
static void sharers_refresh(struct page *pg)
{
	uint32_t g = __atomic_load_n(&pg->sh_gen, __ATOMIC_ACQUIRE);
	if (g == pg->psh_gen)
		return;
	pthread_mutex_lock(&hijack_lock);
	pg->npsh = pg->nsh;
	memcpy(pg->psh, pg->sh, sizeof pg->psh[0] * (size_t)pg->nsh);
	pg->psh_gen = __atomic_load_n(&pg->sh_gen, __ATOMIC_ACQUIRE);
	pthread_mutex_unlock(&hijack_lock);
}

static inline uint64_t db_value(uint16_t pi, uint32_t qpn)
{
	uint8_t b[8] = {0, (uint8_t)(pi >> 8), (uint8_t)pi, 0, (uint8_t)(qpn >> 16), (uint8_t)(qpn >> 8), (uint8_t)qpn, 0};
	uint64_t v;
	memcpy(&v, b, 8);
	return v;
}

static int word_index(const struct page *pg, uint16_t off, int noffs)
{
	for (int k = 0; k < noffs; k++)
		if (pg->offs[k] == off)
			return k;
	return -1;
}

/* QP qpn rings word off: forward what its doorbell record announces beyond
 * the last index forwarded.  1 if something was forwarded. */
static int dbr_catch_up_qp(struct page *pg, uint32_t qpn, uint16_t off, int noffs)
{
	int k = word_index(pg, off, noffs);
	struct qpstate *s = k < 0 ? NULL : hijack_page_qp(pg, qpn);
	if (!s || !s->dbr || !s->known)
		return 0;
	uint32_t be = __atomic_load_n((const volatile uint32_t *)(s->dbr + 4), __ATOMIC_ACQUIRE);
	uint16_t pi = (uint16_t)(__builtin_bswap32(be) & 0xffff);
	uint16_t delta = (uint16_t)(pi - (uint16_t)s->pi);
	if (!delta || delta > (1u << s->log_sq))
		return 0;
	udma_from_device_barrier(); /* the WQEs written before the record, as the NIC would read them */
	pg->dbr_recovered++;
	on_doorbell(pg, k, 0, db_value(pi, qpn));
	return 1;
}

/* After a change of word k (or idle: k < 0, every shared word): catch up the
 * QPs of that register (both halves) from their doorbell records. */
static int dbr_catch_up(struct page *pg, int k)
{
	sharers_refresh(pg);
	if (!pg->npsh)
		return 0;
	int noffs = __atomic_load_n(&pg->noffs, __ATOMIC_ACQUIRE), n = 0;
	for (int i = 0; i < pg->npsh; i++) {
		uint16_t off = pg->psh[i].off;
		if (k >= 0 && (off & ~0x100) != (pg->offs[k] & ~0x100))
			continue;
		n += dbr_catch_up_qp(pg, pg->psh[i].qpn, off, noffs);
		/* and the owner of the word (both halves: one QP; a second check finds nothing new) */
		for (int w = 0; w < noffs; w++) {
			uint32_t who = __atomic_load_n(&pg->owner[w], __ATOMIC_RELAXED); /* set under hijack_lock */
			if ((pg->offs[w] & ~0x100) == (off & ~0x100) && who && who != OWNER_FREE)
				n += dbr_catch_up_qp(pg, who, pg->offs[w], noffs);
		}
	}
	return n;
}

static int scan_words(struct page *pg, const uint8_t *base, uint64_t *last)
{
	int n = 0, src = base != pg->proxy;
	int noffs = __atomic_load_n(&pg->noffs, __ATOMIC_ACQUIRE); /* grows when a verbs QP shares the page */
	for (int k = 0; k < noffs; k++) {
		uint64_t v = __atomic_load_n((const volatile uint64_t *)(base + pg->offs[k]), __ATOMIC_ACQUIRE);
		if (v != last[k]) {
			last[k] = v;
			on_doorbell(pg, k, src, v);
			n++;
			if (!src && pg->verbs)
				n += dbr_catch_up(pg, k);
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
		hijack_close_batch(pg);
		hijack_drain(pg, 1);
		hijack_poller_attach_cuda(pg);
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
		hijack_close_batch(pg);
		hijack_drain(pg, 1);
		hijack_poller_detach_cuda(pg);
	}
	__atomic_store_n(&pg->gpu_ack, seq, __ATOMIC_RELEASE);
}

static int scan(struct page *pg)
{
	if (__atomic_load_n(&pg->gpu_seq, __ATOMIC_ACQUIRE) != pg->gpu_seen)
		poller_sync(pg);
	int n = scan_words(pg, pg->proxy, pg->last);
	/* gwatch (acquire) before gproxy: gpu_attach publishes gproxy first */
	if (__atomic_load_n(&pg->gwatch, __ATOMIC_ACQUIRE) && pg->gproxy)
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
			/* gwatch (acquire) before gproxy, as in scan */
			if (src && !__atomic_load_n(&pg->gwatch, __ATOMIC_ACQUIRE))
				continue;
			const uint8_t *base = src ? pg->gproxy : pg->proxy;
			uint64_t *last = src ? pg->glast : pg->last;
			if (!base)
				continue;
			int noffs = __atomic_load_n(&pg->noffs, __ATOMIC_ACQUIRE);
			for (int k = 0; k < noffs; k++) {
				uint64_t v = __atomic_load_n((const volatile uint64_t *)(base + pg->offs[k]), __ATOMIC_ACQUIRE);
				if (v != last[k]) {
					last[k] = v;
					n++;
					/* in the QP's order, as on_doorbell (nothing recorded) */
					uint16_t pi16;
					uint32_t qpn;
					db_decode(v, &pi16, &qpn);
					struct qpstate *s = hijack_page_qp(pg, qpn);
					if (s && overtaken(s, k | (src << 8), pi16))
						continue;
					if (s)
						s->pi += (uint16_t)(pi16 - (uint16_t)s->pi);
					forward_word(pg, k, NULL, 0, v);
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

/* Start pg's poller thread with every signal blocked (finding 6): a thread
 * inherits its creator's mask, and a poller that could take a signal would
 * change where the program's process-directed signals go (a sigwait thread
 * of the program would miss them; their default action would run, or their
 * handler on a tracer thread).  As the core's writer thread.  0 on success. */
int hijack_start_poller(struct page *pg)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&pg->thr, NULL, hijack_poller, pg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

void *hijack_poller(void *arg)
{
	struct page *pg = arg;
	st_tls_depth++; /* nothing this thread calls is the application's */
	/* never wait for the writer: side records go to a ring of this thread's,
	 * events are dropped (and counted) rather than waited for */
	st_side_lane_open();
	char name[16];
	snprintf(name, sizeof name, "st-poll-%u", pg->page_id);
	pthread_setname_np(pthread_self(), name);
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* back-off sleeps of ~1 us, not the default 50 us slack */
	pin_self(pg);
	hijack_poller_stage_alloc(pg);
	if (!pg->cpuproxy) {
		hijack_poller_attach_cuda(pg);
		poller_install(pg);
	}
	uint64_t idle_since = st_now_ns();
	unsigned sleep_us = 1;
	unsigned spins = 0;
	int quiesce = 0;
	for (;;) {
		uint32_t sync = __atomic_load_n(&pg->sync_seq, __ATOMIC_ACQUIRE);
		if (sync != __atomic_load_n(&pg->sync_ack, __ATOMIC_RELAXED)) {
			/* a QP or umem of this page is being forgotten: take what was rung,
			 * finish every copy, then nothing reads its SQ any more */
			scan(pg);
			hijack_close_batch(pg);
			hijack_drain(pg, 1);
			hijack_page_qp_refresh(pg); /* the forgotten QP's state goes, SQ pointers are looked up again */
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
			if (pg->batch_wqebb && (hijack_cfg.mode == HIJACK_NONBLOCKING || hijack_cfg.mode == HIJACK_GUARDED))
				hijack_close_batch(pg);
			hijack_drain(pg, 0);
		}
		if (++spins < 64) {
			cpu_relax();
			continue;
		}
		spins = 0;
		if (pg->verbs && dbr_catch_up(pg, -1)) { /* a doorbell hidden on a shared word */
			idle_since = 0;
			sleep_us = 1;
			continue;
		}
		uint64_t now = st_now_ns();
		if (!idle_since)
			idle_since = now;
		/* spin forever (SIGMATRACE_POLLER_SPIN_US<0) only on a page that is in
		 * use: a never-rung CPU-doorbell page always backs off */
		int in_use = !pg->cpuproxy || pg->installed;
		if (hijack_cfg.spin_us < 0 ? in_use : now - idle_since < (uint64_t)hijack_cfg.spin_us * 1000)
			continue;
#if defined(__x86_64__)
		if ((hijack_cfg.wait_kind == 1 || hijack_cfg.wait_kind == 2) && pg->noffs == 1 && !pg->cpuproxy) {
			monitor_wait(hijack_cfg.wait_kind == 1 ? &umwait_ops : &mwaitx_ops,
				     (const volatile uint64_t *)(pg->proxy + pg->offs[0]), pg->last[0], 200000);
			continue;
		}
#endif
		struct timespec ts = {0, (long)sleep_us * 1000};
		nanosleep(&ts, NULL);
		/* a CPU-doorbell page nobody has rung yet (a CQ's UAR, say) idles cheaply */
		unsigned cap = (unsigned)hijack_cfg.max_sleep_us;
		if (pg->cpuproxy && !pg->installed && cap < 1000)
			cap = 1000;
		if (sleep_us < cap)
			sleep_us = sleep_us * 2 > cap ? cap : sleep_us * 2;
	}
	/* test hook: a poller stuck for good in a driver call (say
	 * cuEventSynchronize on a copy that never ends) as it stops */
	while (hijack_cfg.test_stuck)
		pause();
	hijack_close_batch(pg);
	hijack_drain(pg, 1);
	if (pg->installed) {
		uint64_t ok = pg->gone_ok, lost = pg->gone_lost, wqes = pg->gone_wqes;
		for (int i = 0; i < pg->nqs; i++)
			if (pg->qs[i].used) {
				ok += pg->qs[i].wqebb_ok;
				lost += pg->qs[i].wqebb_lost;
				wqes += pg->qs[i].wqe_ok;
			}
		char buf[768];
		struct st_json j;
		st_json_init(&j, buf, sizeof buf);
		st_json_open(&j, NULL, '{');
		st_json_uint(&j, "doorbells", pg->seen);
		st_json_uint(&j, "wqes_verified", wqes);
		st_json_uint(&j, "wqebb_verified", ok);
		st_json_uint(&j, "wqebb_lost", lost);
		st_json_uint(&j, "unknown_qp_doorbells", pg->unknown_qp);
		st_json_uint(&j, "untracked_qp_doorbells", pg->untracked);
		st_json_uint(&j, "copies", pg->copies);
		st_json_uint(&j, "sync_waits", pg->sync_waits);
		st_json_uint(&j, "guard_waits", pg->guard_waits);
		st_json_uint(&j, "stale_doorbells", pg->stale);
		if (pg->verbs) {
			st_json_uint(&j, "bf_copies_forwarded", pg->bf_forwarded);
			st_json_uint(&j, "bf_doorbells_8b", pg->bf_db);
			st_json_uint(&j, "bf_copies_torn", pg->bf_torn);
			st_json_uint(&j, "dbr_recovered_doorbells", pg->dbr_recovered);
			st_json_uint(&j, "dbr_duplicate_doorbells", pg->dbr_dups);
		}
		if (pg->cpuproxy)
			st_json_bool(&j, "cpu_doorbells", 1);
		st_json_close(&j, '}');
		st_side_json(buf, j.len);
		st_ev(ST_EV_DB_HIJACK_REMOVE, 0, pg->page_id, pg->seen);
		if (pg->untracked)
			st_warn("hijack: UAR page %#x: %llu doorbell(s) of QPs beyond the poller's %d live QP states were "
				"forwarded without WQE recovery", pg->page_id, (unsigned long long)pg->untracked, MAX_QPS_PER_PAGE);
	}
	hijack_poller_teardown_cuda(pg);
	st_thread_exit_current();
	st_side_lane_close();
	if (quiesce) {
		__atomic_store_n(&pg->quiesced, 1, __ATOMIC_RELEASE);
		forward_only(pg);
	}
	st_tls_depth--;
	__atomic_store_n(&pg->exited, 1, __ATOMIC_RELEASE);
	return NULL;
}
