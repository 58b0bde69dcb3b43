/*
 * Proxy page lifecycle.  The GPU path (F8): when the application asks the
 * driver for the device pointer of a doorbell register, it gets a pointer
 * into a pinned host page of ours at the same offset (st_hijack_devptr), and
 * the page's poller starts.  Also here: the GPU part of a CPU-doorbell page
 * (attach at a device-pointer request, detach at unregister), stopping a
 * page, process exit (stop, or quiesce CPU-doorbell pages) and fork.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "hijack_private.h"

struct page hijack_pages[MAX_PAGES];
static int exit_hook;
static uint32_t incarnations; /* under hijack_lock */

uint32_t hijack_page_incarnation(void)
{
	return ++incarnations;
}

/* The page's device pointers go (caller holds hijack_lock; translate_dev
 * reads them without it). */
static void dev_clear(struct page *pg)
{
	__atomic_store_n(&pg->proxy_dev, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&pg->real_dev, 0, __ATOMIC_RELEASE);
}

uint64_t hijack_stop_deadline(void)
{
	hijack_cfg_load();
	return st_now_ns() + (uint64_t)hijack_cfg.stop_timeout_ms * 1000000ull;
}

/* Wait (hijack_lock not held) until *flag is set or the deadline passes; 1 if set. */
static int wait_flag(const int *flag, uint64_t deadline)
{
	while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
		if (st_now_ns() >= deadline)
			return 0;
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	return 1;
}

/* Pollers that did not answer a stop, quiesce or detach in time, and what
 * they had copied but not parsed (under hijack_lock; reported at exit). */
static uint64_t stuck_pollers, undrained_ranges, undrained_wqebb;

/* pg's poller did not answer within SIGMATRACE_HIJACK_STOP_TIMEOUT_MS (stuck
 * in a driver call, say): nobody waits for it again, its proxy stays mapped
 * (it may still read it; the slot is never reused), and the ranges it had
 * not drained are counted lost and reported in place of its own summary
 * (its counters read while it runs: a snapshot).  Caller holds hijack_lock. */
static void report_stuck(struct page *pg, const char *when)
{
	if (pg->stuck)
		return;
	pg->stuck = 1;
	uint32_t head = __atomic_load_n(&pg->pend_head, __ATOMIC_RELAXED), tail = __atomic_load_n(&pg->pend_tail, __ATOMIC_RELAXED);
	uint64_t n = 0, w = 0;
	for (uint32_t i = tail; i != head && n < MAX_PEND; i++, n++)
		w += __atomic_load_n(&pg->pend[i % MAX_PEND].cnt, __ATOMIC_RELAXED);
	stuck_pollers++;
	undrained_ranges += n;
	undrained_wqebb += w;
	uint64_t seen = __atomic_load_n(&pg->seen, __ATOMIC_RELAXED);
	st_warn("hijack: the poller of UAR page %#x did not answer (%s) within %d ms; %llu copied range(s), %llu WQEBBs not drained",
		pg->page_id, when, hijack_cfg.stop_timeout_ms, (unsigned long long)n, (unsigned long long)w);
	if (!__atomic_load_n(&pg->installed, __ATOMIC_RELAXED))
		return; /* never used: it would have recorded nothing */
	char buf[384];
	struct st_json j;
	st_json_init(&j, buf, sizeof buf);
	st_json_open(&j, NULL, '{');
	st_json_uint(&j, "doorbells", seen);
	st_json_uint(&j, "wqebb_lost", w);
	st_json_bool(&j, "stuck", 1);
	st_json_str(&j, "when", when);
	st_json_uint(&j, "undrained_ranges", n);
	st_json_uint(&j, "undrained_wqebb", w);
	if (pg->cpuproxy)
		st_json_bool(&j, "cpu_doorbells", 1);
	st_json_close(&j, '}');
	/* hijack_lock is held (the pollers take it): never wait for the writer here */
	int nb = st_never_block_begin();
	st_side_json(buf, j.len);
	st_ev(ST_EV_DB_HIJACK_REMOVE, 0, pg->page_id, seen);
	st_never_block_end(nb);
}

void hijack_sync_pages(const unsigned char *want)
{
	static uint32_t seq[MAX_PAGES], inc[MAX_PAGES]; /* under hijack_lock (only its holder waits here) */
	unsigned char asked[MAX_PAGES];
	int any = 0;
	for (int k = 0; k < MAX_PAGES; k++) {
		struct page *pg = &hijack_pages[k];
		asked[k] = want[k] && pg->live && pg->thr_started && !pg->stuck && !__atomic_load_n(&pg->quiesced, __ATOMIC_ACQUIRE);
		if (!asked[k])
			continue;
		seq[k] = __atomic_add_fetch(&pg->sync_seq, 1, __ATOMIC_ACQ_REL);
		inc[k] = pg->incarnation;
		any = 1;
	}
	if (!any)
		return;
	uint64_t deadline = hijack_stop_deadline();
	unsigned char late[MAX_PAGES];
	pthread_mutex_unlock(&hijack_lock);
	for (int k = 0; k < MAX_PAGES; k++) {
		late[k] = 0;
		if (!asked[k])
			continue;
		struct page *pg = &hijack_pages[k];
		/* until answered, or the page stopped (its stop drains everything), or quiesced (forwards only) */
		while ((int32_t)(__atomic_load_n(&pg->sync_ack, __ATOMIC_ACQUIRE) - seq[k]) < 0 &&
		       __atomic_load_n(&pg->incarnation, __ATOMIC_ACQUIRE) == inc[k] && !__atomic_load_n(&pg->stop, __ATOMIC_ACQUIRE) &&
		       !__atomic_load_n(&pg->quiesced, __ATOMIC_ACQUIRE) && !__atomic_load_n(&pg->exited, __ATOMIC_ACQUIRE)) {
			if (st_now_ns() >= deadline) {
				late[k] = 1;
				break;
			}
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
	}
	pthread_mutex_lock(&hijack_lock);
	for (int k = 0; k < MAX_PAGES; k++)
		if (late[k] && hijack_pages[k].incarnation == inc[k] && hijack_pages[k].live)
			report_stuck(&hijack_pages[k], "sync");
}

void hijack_pages_of_uar(uint32_t uar_page, unsigned char *want)
{
	for (int k = 0; k < MAX_PAGES; k++) {
		const struct page *pg = &hijack_pages[k];
		if (pg->live && !pg->verbs && (pg->page_id == uar_page || pg->page_id == 0))
			want[k] = 1;
	}
}

/* hijack_stop_page, waiting until deadline at most. */
static void stop_page_until(struct page *pg, uint64_t deadline)
{
	/* caller holds hijack_lock */
	if (!pg->live)
		return;
	__atomic_store_n(&pg->live, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&pg->stop, 1, __ATOMIC_RELEASE);
	pthread_t t = pg->thr;
	int started = pg->thr_started;
	if (started && pg->stuck)
		return; /* it did not answer before: nobody waits for it again */
	pthread_mutex_unlock(&hijack_lock);
	int done = !started || wait_flag(&pg->exited, deadline);
	if (!done) {
		pthread_detach(t);
		pthread_mutex_lock(&hijack_lock);
		report_stuck(pg, "stop");
		return;
	}
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
		dev_clear(pg);
	} else if (d && pg->proxy_dev)
		d->MemHostUnregister(pg->proxy);
	munmap(pg->proxy, PAGE_SZ);
	pg->proxy = NULL;
	pthread_mutex_lock(&hijack_lock);
}

void hijack_stop_page(struct page *pg)
{
	stop_page_until(pg, hijack_stop_deadline());
}

/* Process exit, CPU-doorbell page: summary and flush now, but keep
 * forwarding until the process is gone.  The request (quiesce) was posted by
 * the caller, which holds hijack_lock; wait until deadline at most. */
static void quiesce_wait(struct page *pg, uint64_t deadline)
{
	if (!pg->live || !pg->thr_started || pg->stuck)
		return;
	pthread_mutex_unlock(&hijack_lock);
	int done = wait_flag(&pg->quiesced, deadline);
	pthread_mutex_lock(&hijack_lock);
	if (!done)
		report_stuck(pg, "exit");
}

/* A device pointer for a CPU-doorbell page: register a second proxy page
 * (the GPU's) with the driver; the page's poller watches it too (caller
 * holds hijack_lock).  0 on success. */
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
	__atomic_store_n(&pg->proxy_dev, pd, __ATOMIC_RELEASE); /* translate_dev reads it without the lock */
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
 * objects released), the CPU part stays (caller holds hijack_lock). */
static void gpu_detach(struct page *pg)
{
	if (!pg->proxy_dev)
		return;
	__atomic_store_n(&pg->gpu_want, 0, __ATOMIC_RELEASE);
	uint32_t seq = __atomic_add_fetch(&pg->gpu_seq, 1, __ATOMIC_RELEASE);
	int timed_out = 0;
	if (pg->thr_started && !pg->stuck && !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE)) {
		uint64_t deadline = hijack_stop_deadline();
		pthread_mutex_unlock(&hijack_lock);
		while (__atomic_load_n(&pg->gpu_ack, __ATOMIC_ACQUIRE) != seq && __atomic_load_n(&pg->live, __ATOMIC_ACQUIRE) &&
		       !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE)) {
			if (st_now_ns() >= deadline) {
				timed_out = 1;
				break;
			}
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&hijack_lock);
	}
	if (timed_out)
		report_stuck(pg, "detach"); /* the GPU proxy stays registered: the poller may still scan it */
	if (!pg->live || !pg->proxy_dev || pg->stuck)
		return;
	const struct st_cudrv *d = drv();
	if (d && !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE))
		d->MemHostUnregister(pg->gproxy);
	dev_clear(pg);
}
void st_hijack_shutdown(void)
{
	pthread_mutex_lock(&hijack_lock);
	/* every poller is asked first and then waited for against one deadline:
	 * stuck ones cost the timeout once, not once each */
	static unsigned char ask[MAX_PAGES];
	for (int i = 0; i < MAX_PAGES; i++) {
		struct page *pg = &hijack_pages[i];
		ask[i] = 0;
		if (!pg->live)
			continue;
		if (!pg->cpuproxy)
			__atomic_store_n(&pg->stop, 1, __ATOMIC_RELEASE);
		else if (pg->thr_started && !__atomic_load_n(&pg->quiesce, __ATOMIC_ACQUIRE)) {
			__atomic_store_n(&pg->quiesce, 1, __ATOMIC_RELEASE);
			ask[i] = 1;
		}
	}
	uint64_t deadline = hijack_stop_deadline();
	for (int i = 0; i < MAX_PAGES; i++) {
		struct page *pg = &hijack_pages[i];
		if (pg->live && pg->cpuproxy) {
			if (ask[i])
				quiesce_wait(pg, deadline);
		} else
			stop_page_until(pg, deadline);
	}
	if (hijack_cpu_proxy_failed)
		st_warn("hijack: %llu UAR register(s) left unproxied (CPU doorbells not traced there)",
			(unsigned long long)hijack_cpu_proxy_failed);
	if (hijack_qp_table_full)
		st_warn("hijack: %llu QP(s) not recorded (QP table full, %d live records): their WQEs are not recovered",
			(unsigned long long)hijack_qp_table_full, QP_SLOTS);
	if (stuck_pollers)
		st_warn("hijack: %llu poller(s) did not stop within %d ms (stuck in a driver call?); %llu copied range(s), "
			"%llu WQEBBs not drained, counted lost",
			(unsigned long long)stuck_pollers, hijack_cfg.stop_timeout_ms, (unsigned long long)undrained_ranges,
			(unsigned long long)undrained_wqebb);
	pthread_mutex_unlock(&hijack_lock);
}

static void at_exit_hook(void)
{
	st_hijack_shutdown();
}

void hijack_hook_exit(void)
{
	if (!exit_hook) {
		exit_hook = 1;
		atexit(at_exit_hook); /* registered after the core's: runs before it */
	}
}

void st_hijack_forget_uar(void *reg_addr)
{
	uintptr_t pgaddr = (uintptr_t)reg_addr & ~(uintptr_t)(PAGE_SZ - 1);
	pthread_mutex_lock(&hijack_lock);
	for (int i = 0; i < MAX_UARS; i++)
		if (hijack_uars[i].live && hijack_uars[i].reg == (uintptr_t)reg_addr)
			hijack_uars[i].live = 0;
	/* a GPU-path page of this UAR stops here; a CPU-proxy page in the same real
	 * page belongs to another UAR or to verbs QPs and stops at their release
	 * (st_hijack_cpu_uar_release, st_hijack_cpu_release_ctx) */
	for (int i = 0; i < MAX_PAGES; i++)
		if (hijack_pages[i].live && hijack_pages[i].page == pgaddr && !hijack_pages[i].cpuproxy)
			hijack_stop_page(&hijack_pages[i]);
	pthread_mutex_unlock(&hijack_lock);
}

void st_hijack_on_unregister(void *p)
{
	pthread_mutex_lock(&hijack_lock);
	for (int i = 0; i < MAX_REGS; i++)
		if (hijack_regs[i].live && hijack_regs[i].p == (uintptr_t)p) {
			/* the range, copied: stopping a page drops the lock, and a
			 * concurrent registration may take the freed slot meanwhile */
			uintptr_t lo = hijack_regs[i].p, hi = lo + hijack_regs[i].size;
			hijack_regs[i].live = 0;
			for (int k = 0; k < MAX_PAGES; k++)
				if (hijack_pages[k].live && hijack_pages[k].page + PAGE_SZ > lo && hijack_pages[k].page < hi) {
					if (hijack_pages[k].cpuproxy)
						gpu_detach(&hijack_pages[k]); /* the CPU may still ring */
					else
						hijack_stop_page(&hijack_pages[k]);
				}
		}
	pthread_mutex_unlock(&hijack_lock);
}

/* d inside a live page's device-pointer range (the proxy's, to_real; else
 * the real one's) maps to the same offset of the other; anything else is d.
 * Lock-free: the CUDA wrappers call it on every pointer query. */
static uint64_t translate_dev(uint64_t d, int to_real)
{
	for (int i = 0; i < MAX_PAGES; i++) {
		const struct page *pg = &hijack_pages[i];
		/* written under hijack_lock with release stores, read here with
		 * acquire loads (as cpumap): a page seen live has its pointers */
		if (!__atomic_load_n(&pg->live, __ATOMIC_ACQUIRE))
			continue;
		uint64_t pd = __atomic_load_n(&pg->proxy_dev, __ATOMIC_ACQUIRE), rd = __atomic_load_n(&pg->real_dev, __ATOMIC_ACQUIRE);
		uint64_t from = to_real ? pd : rd, to = to_real ? rd : pd;
		if (from && to && d >= from && d < from + PAGE_SZ)
			return to + (d - from);
	}
	return d;
}

uint64_t st_hijack_real_of_proxy(uint64_t d)
{
	return translate_dev(d, 1);
}

uint64_t st_hijack_proxy_of_real(uint64_t d)
{
	return translate_dev(d, 0);
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
	pthread_mutex_lock(&hijack_lock); /* the table is consistent when copied */
}
static void fork_parent(void)
{
	pthread_mutex_unlock(&hijack_lock);
}
static void fork_child(void)
{
	pthread_mutex_init(&hijack_lock, NULL);
	for (int i = 0; i < MAX_PAGES; i++) {
		struct page *pg = &hijack_pages[i];
		if (!pg->live && !pg->proxy && !pg->thr_started)
			continue; /* untouched slot: do not dirty its copy-on-write pages */
		pg->live = 0;
		pg->thr_started = 0;
		memset(pg->ring_lock, 0, sizeof pg->ring_lock); /* a poller of the parent may have held one */
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

void hijack_hook_fork(void)
{
	pthread_once(&fork_once, fork_register);
}

uint64_t st_hijack_devptr(void *p, uint64_t real_dptr, int *hijacked)
{
	*hijacked = 0;
	hijack_cfg_load();
	if (hijack_cfg.mode == HIJACK_OFF)
		return real_dptr;
	hijack_hook_fork(); /* before the first poller; outside the lock */
	uintptr_t a = (uintptr_t)p, pgaddr = a & ~(uintptr_t)(PAGE_SZ - 1);
	const struct st_cudrv *d = drv();
	if (!d || !d->MemHostRegister || !d->MemHostGetDevicePointer)
		return real_dptr;
	pthread_mutex_lock(&hijack_lock);
	/* the registration that holds p */
	struct reg_rec *r = NULL;
	for (int i = 0; i < MAX_REGS; i++)
		if (hijack_regs[i].live && a >= hijack_regs[i].p && a < hijack_regs[i].p + (hijack_regs[i].size ? hijack_regs[i].size : 1)) {
			r = &hijack_regs[i];
			break;
		}
	/* doorbell registers in p's page: noted UARs, else an IOMEMORY registration */
	uint16_t offs[MAX_WATCH];
	int noffs = 0;
	uint32_t page_id = 0;
	for (int i = 0; i < MAX_UARS && noffs < MAX_WATCH; i++)
		if (hijack_uars[i].live && (hijack_uars[i].reg & ~(uintptr_t)(PAGE_SZ - 1)) == pgaddr) {
			offs[noffs++] = (uint16_t)(hijack_uars[i].reg & (PAGE_SZ - 1));
			page_id = hijack_uars[i].page_id;
		}
	if (!noffs && r && (r->flags & ST_CU_MEMHOSTREGISTER_IOMEMORY) && !(a & 7))
		offs[noffs++] = (uint16_t)(a & (PAGE_SZ - 1));
	if (!noffs) {
		pthread_mutex_unlock(&hijack_lock);
		return real_dptr;
	}
	struct page *pg = NULL, *freep = NULL;
	for (int i = 0; i < MAX_PAGES; i++) {
		if (hijack_pages[i].live && hijack_pages[i].page == pgaddr) {
			pg = &hijack_pages[i];
			break;
		}
		if (!hijack_pages[i].live && !hijack_pages[i].proxy && !freep)
			freep = &hijack_pages[i];
	}
	if (pg && pg->cpuproxy) {
		/* a CPU-doorbell page: the GPU gets a proxy of its own, same hijack_poller,
		 * which also watches the page's other noted registers (a DevX UAR the
		 * CPU side left real may be the one the GPU rings) */
		for (int k = 0; k < noffs; k++)
			if (hijack_word_owner(pg, offs[k]) < 0)
				hijack_watch_offset(pg, offs[k], 0);
		if (gpu_attach(pg, d) != 0) {
			pthread_mutex_unlock(&hijack_lock);
			st_warn("hijack: cannot register a GPU proxy page; doorbell at %p not traced from the GPU", p);
			return real_dptr;
		}
		if (!pg->real_dev)
			__atomic_store_n(&pg->real_dev, real_dptr - (a - pgaddr), __ATOMIC_RELEASE);
		uint64_t out = pg->proxy_dev + (a - pgaddr);
		pthread_mutex_unlock(&hijack_lock);
		*hijacked = 1;
		return out;
	}
	if (pg) {
		/* registers noted (or asked for) since the page was made: its poller
		 * watches them too, as the CPU-proxy branch does above (noffs is
		 * published last; the poller picks them up at its next scan) */
		int n = pg->noffs;
		for (int k = 0; k < noffs && n < MAX_WATCH; k++) {
			int have = 0;
			for (int w = 0; w < n && !have; w++)
				have = pg->offs[w] == offs[k];
			if (have)
				continue;
			pg->offs[n] = offs[k];
			pg->last[n] = 0;
			n++;
		}
		__atomic_store_n(&pg->noffs, n, __ATOMIC_RELEASE);
		uint64_t out = pg->proxy_dev + (a - pgaddr);
		if (!pg->real_dev)
			__atomic_store_n(&pg->real_dev, real_dptr - (a - pgaddr), __ATOMIC_RELEASE);
		pthread_mutex_unlock(&hijack_lock);
		*hijacked = 1;
		return out;
	}
	if (!freep) {
		pthread_mutex_unlock(&hijack_lock);
		return real_dptr;
	}
	pg = freep;
	memset(pg, 0, sizeof *pg);
	pg->incarnation = hijack_page_incarnation();
	pg->proxy = mmap(NULL, PAGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (pg->proxy == MAP_FAILED) {
		pg->proxy = NULL;
		pthread_mutex_unlock(&hijack_lock);
		return real_dptr;
	}
	/* The GPU writes this page through its pinned mapping: after a fork a
	 * copy-on-write fault in the parent would move the parent's virtual page
	 * away from the physical page the GPU writes (the classic RDMA fork
	 * problem).  Not inherited, it stays the parent's alone, and a child
	 * cannot write into it. */
	madvise(pg->proxy, PAGE_SZ, MADV_DONTFORK);
	st_CUdeviceptr pd = 0;
	int registered = d->MemHostRegister(pg->proxy, PAGE_SZ, ST_CU_MEMHOSTREGISTER_PORTABLE | ST_CU_MEMHOSTREGISTER_DEVICEMAP) == 0;
	if (!registered || d->MemHostGetDevicePointer(&pd, pg->proxy, 0) || !pd) {
		/* undo the registration whenever it succeeded (the pointer call may
		 * have failed after writing a pointer), never when it did not */
		if (registered)
			d->MemHostUnregister(pg->proxy);
		munmap(pg->proxy, PAGE_SZ);
		pg->proxy = NULL;
		pthread_mutex_unlock(&hijack_lock);
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
	pg->cpu = hijack_next_poller_cpu();
	__atomic_store_n(&pg->live, 1, __ATOMIC_RELEASE); /* every field above first (translate_dev) */
	hijack_hook_exit();
	if (hijack_start_poller(pg) == 0)
		pg->thr_started = 1;
	else {
		__atomic_store_n(&pg->live, 0, __ATOMIC_RELEASE);
		d->MemHostUnregister(pg->proxy);
		munmap(pg->proxy, PAGE_SZ);
		pg->proxy = NULL;
		pthread_mutex_unlock(&hijack_lock);
		return real_dptr;
	}
	uint64_t out = pg->proxy_dev + (a - pgaddr);
	pthread_mutex_unlock(&hijack_lock);
	*hijacked = 1;
	return out;
}
