/*
 * CPU doorbells (F24d): proxies for the doorbell registers the CPU rings.
 * DevX UARs get one at mlx5dv_devx_alloc_uar, verbs QPs at mlx5dv_init_obj
 * (sharing a page per context, never a word); the page's poller (poller.c)
 * forwards and records them as for GPU doorbells.  The CUDA wrappers
 * translate proxy addresses back to the real UAR (st_hijack_cpu_real) with
 * the lock-free cpumap.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "arch.h"
#include "hijack_private.h"

uint64_t hijack_cpu_proxy_failed; /* CPU-doorbell proxies not installed (the real UAR was left alone) */

/* proxy page -> real UAR page, for the CUDA wrappers (lock-free readers) and
 * for putting reg_addr back at free, even after the poller stopped */
struct cpumap_ent {
	uintptr_t proxy, real; /* page addresses; proxy 0 = free */
};
static struct cpumap_ent cpumap[MAX_PAGES];
static int cpumap_n; /* entries ever used (high-water mark) */

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
 * hijack_lock; the poller picks new offsets up at its next scan (noffs is
 * published last).  0 if the watch list cannot take the register itself. */
int hijack_watch_offset(struct page *pg, uint16_t off, uint32_t owner)
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
		__atomic_store_n(&pg->bfsz[n], 0, __ATOMIC_RELAXED);
		n++;
	}
	__atomic_store_n(&pg->noffs, n, __ATOMIC_RELEASE);
	return ok;
}

/* The QPN that rings watched word off of pg, -1 if the word is not watched. */
long hijack_word_owner(const struct page *pg, uint16_t off)
{
	for (int k = 0; k < pg->noffs; k++)
		if (pg->offs[k] == off)
			return pg->owner[k];
	return -1;
}

/* Gate shared by the CPU-doorbell entry points. */
static int cpu_doorbells_on(void)
{
	hijack_cfg_load();
	/* The GPU side needs the CUDA wrappers (they translate the proxy address);
	 * without them an IOMEMORY registration of the proxy would fail. */
	return hijack_cfg.cpu_doorbells && hijack_cfg.mode != HIJACK_OFF && st_provider_on(ST_PROV_CUDA);
}

/* A new CPU-proxy page for real page pgaddr with register off watched and its
 * poller started; the register's proxy address, NULL on failure (hijack_lock
 * held). */
static void *cpu_page_new(uintptr_t pgaddr, uint16_t off, uint32_t page_id, void *ctx, int verbs, uint32_t owner)
{
	struct page *pg = NULL;
	int slot = -1;
	for (int i = 0; i < MAX_PAGES && !pg; i++)
		if (!hijack_pages[i].live && !hijack_pages[i].proxy)
			pg = &hijack_pages[i];
	for (int i = 0; i < MAX_PAGES && slot < 0; i++)
		if (!cpumap[i].proxy)
			slot = i;
	if (!pg || slot < 0)
		return NULL;
	memset(pg, 0, sizeof *pg);
	pg->incarnation = hijack_page_incarnation();
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
	hijack_watch_offset(pg, off, owner);
	/* A core from SIGMATRACE_POLLER_CPUS only once the page is rung (see
	 * poller_install): unused UARs (a CQ's, an idle peer's) must not take the
	 * cores meant for the doorbells that are. */
	pg->cpu = -1;
	__atomic_store_n(&pg->live, 1, __ATOMIC_RELEASE); /* lock-free readers: translate_dev */
	hijack_hook_exit();
	if (hijack_start_poller(pg) != 0) {
		__atomic_store_n(&pg->live, 0, __ATOMIC_RELEASE);
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
	pthread_mutex_lock(&hijack_lock);
	hijack_cpu_proxy_failed++;
	pthread_mutex_unlock(&hijack_lock);
	st_warn("hijack: %s %#x left unproxied; its CPU doorbells are not traced", what, id);
	return NULL;
}

void *st_hijack_cpu_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx, uint32_t flags)
{
	(void)base_addr;
	(void)flags; /* every type: a BlueFlame write arrives as its first 8 bytes, see docs/hijack.md */
	uintptr_t reg = (uintptr_t)reg_addr, pgaddr = reg & ~(uintptr_t)(PAGE_SZ - 1);
	if (!cpu_doorbells_on() || !reg_addr || (reg & 7))
		return NULL;
	hijack_hook_fork();
	pthread_mutex_lock(&hijack_lock);
	void *out = NULL;
	int watched = 0;
	for (int i = 0; i < MAX_PAGES && !watched; i++)
		watched = hijack_pages[i].live && hijack_pages[i].page == pgaddr;
	/* a page watched already (another DevX UAR in it, verbs QPs, the GPU
	 * path): this UAR stays real -- its free must not stop the others' poller */
	if (!watched)
		out = cpu_page_new(pgaddr, (uint16_t)(reg & (PAGE_SZ - 1)), page_id, ctx, 0, 0);
	pthread_mutex_unlock(&hijack_lock);
	return out ? out : cpu_proxy_failed_for("DevX UAR page", page_id);
}

/* Is qpn a sharer of pg's word off (or its twin)?  Under hijack_lock. */
static int is_sharer(const struct page *pg, uint32_t qpn, uint16_t off)
{
	for (int i = 0; i < pg->nsh; i++)
		if (pg->sh[i].qpn == qpn && (pg->sh[i].off & ~0x100) == (off & ~0x100))
			return 1;
	return 0;
}

/* F24d on verbs QPs (mlx5dv_init_obj): the proxy for QP qpn's BlueFlame
 * register, or NULL (the QP keeps the real one).  QPs of one context whose
 * registers share a UAR page share its proxy and poller (released at
 * ibv_close_device).  A second QP on a register word another QP rings
 * (rdma-core's shared bfregs) is proxied on the same word (finding 9): the
 * poller is then the only writer of the real word, so its forwards never
 * interleave with a QP's 64-byte BlueFlame burst there (that QP, left on the
 * real register, wrote it outside the hijack's reach; a QP that rdma-core rings
 * there takes turns with the poller through the bfreg's ring lock, below).  The later value on a
 * shared proxy word hides the earlier one, so the poller catches the other
 * QPs of the word up from their doorbell records (poller.c). */
/* Words off and its twin of pg are BlueFlame registers of bf_size bytes
 * (capped at the 256 bytes of one half).  Under hijack_lock. */
static void note_bf_size(struct page *pg, uint16_t off, uint32_t bf_size)
{
	uint16_t sz = (uint16_t)(bf_size > 0x100 ? 0x100 : bf_size & ~63u);
	/* the watch list is published to the poller with release stores: read it the same way */
	int n = __atomic_load_n(&pg->noffs, __ATOMIC_ACQUIRE);
	for (int k = 0; k < n; k++)
		if ((__atomic_load_n(&pg->offs[k], __ATOMIC_RELAXED) & ~0x100) == (off & ~0x100))
			__atomic_store_n(&pg->bfsz[k], sz, __ATOMIC_RELEASE);
}

void *st_hijack_cpu_verbs_reg(void *reg_addr, void *ctx, uint32_t qpn, uint32_t bf_size)
{
	uintptr_t reg = (uintptr_t)reg_addr, pgaddr = reg & ~(uintptr_t)(PAGE_SZ - 1);
	uint16_t off = (uint16_t)(reg & (PAGE_SZ - 1));
	if (!cpu_doorbells_on() || !reg_addr || (reg & 7) || !ctx || !qpn)
		return NULL;
	hijack_hook_fork();
	pthread_mutex_lock(&hijack_lock);
	void *out = NULL;
	struct page *pg = NULL;
	for (int i = 0; i < MAX_PAGES && !pg; i++)
		if (hijack_pages[i].live && hijack_pages[i].page == pgaddr)
			pg = &hijack_pages[i];
	if (!pg) {
		out = cpu_page_new(pgaddr, off, ST_HIJACK_VERBS_UAR_PAGE, ctx, 1, qpn);
	} else if (pg->cpuproxy && pg->verbs && pg->ctx == ctx) {
		long who = hijack_word_owner(pg, off), twin = hijack_word_owner(pg, (uint16_t)(off ^ 0x100));
		if (who == (long)qpn || is_sharer(pg, qpn, off)) /* the same QP asks again */
			out = pg->proxy + off;
		else if ((who < 0 || who == OWNER_FREE) && (twin < 0 || twin == OWNER_FREE) && hijack_watch_offset(pg, off, qpn))
			out = pg->proxy + off;
		else if (who >= 0 && pg->nsh < MAX_SHARERS) {
			/* the word (or its twin) is another QP's: share it */
			pg->sh[pg->nsh].qpn = qpn;
			pg->sh[pg->nsh].off = off;
			pg->nsh++;
			__atomic_add_fetch(&pg->sh_gen, 1, __ATOMIC_RELEASE);
			out = pg->proxy + off;
		}
	}
	if (out) {
		pg = NULL;
		for (int i = 0; i < MAX_PAGES && !pg; i++)
			if (hijack_pages[i].live && hijack_pages[i].page == pgaddr)
				pg = &hijack_pages[i];
		if (pg)
			note_bf_size(pg, off, bf_size);
	}
	pthread_mutex_unlock(&hijack_lock);
	return out ? out : cpu_proxy_failed_for("verbs QP", qpn);
}

/* ---- the real bfreg's two writers take turns (finding 9) -------------------------- */
uint32_t *st_hijack_ring_lock(void *ctx, void *real_reg)
{
	uintptr_t reg = (uintptr_t)real_reg, pgaddr = reg & ~(uintptr_t)(PAGE_SZ - 1);
	if (!ctx || !reg || !__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE))
		return NULL;
	/* lock-free (the ibv provider asks with its own lock held; hijack_lock nests outside it): a
	 * page's fields are set before its live flag is published (cpu_page_new) */
	for (int i = 0; i < MAX_PAGES; i++) {
		struct page *pg = &hijack_pages[i];
		if (__atomic_load_n(&pg->live, __ATOMIC_ACQUIRE) && pg->cpuproxy && pg->verbs && pg->ctx == ctx &&
		    pg->page == pgaddr)
			return hijack_ring_lock_of(pg, (uint16_t)(reg & (PAGE_SZ - 1)));
	}
	return NULL; /* a lock is in the static page table: valid memory for ever (a reused slot only serialises more) */
}

int st_hijack_ctx_proxied(void *ctx)
{
	if (!ctx || !__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE))
		return 0;
	for (int i = 0; i < MAX_PAGES; i++) {
		const struct page *pg = &hijack_pages[i];
		if (__atomic_load_n(&pg->live, __ATOMIC_ACQUIRE) && pg->verbs && pg->ctx == ctx)
			return 1;
	}
	return 0;
}

/* Held for one post or one forward: a few hundred ns, a preempted holder a time slice. */
void st_hijack_ring_enter(uint32_t *lock)
{
	for (unsigned spin = 0; __atomic_exchange_n(lock, 1, __ATOMIC_ACQUIRE); spin++) {
		if (spin & 63)
			cpu_relax();
		else
			sched_yield();
	}
}

void st_hijack_ring_leave(uint32_t *lock)
{
	__atomic_store_n(lock, 0, __ATOMIC_RELEASE);
}

/* ibv_close_device: the context's UAR pages go away with it; stop the pollers
 * of the proxies handed out for its verbs QPs first (a last forward each). */
void st_hijack_cpu_release_ctx(void *ctx)
{
	if (!ctx || !__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&hijack_lock);
	for (int k = 0; k < MAX_PAGES; k++) {
		struct page *pg = &hijack_pages[k];
		if (!pg->live || !pg->cpuproxy || !pg->verbs || pg->ctx != ctx)
			continue;
		int i = cpumap_find((uintptr_t)pg->proxy, 1); /* before the proxy is unmapped (and reusable) */
		hijack_stop_page(pg); /* last values forwarded, poller joined, proxy unmapped */
		if (i >= 0)
			__atomic_store_n(&cpumap[i].proxy, 0, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&hijack_lock);
}

void *st_hijack_cpu_uar_release(void *app_reg)
{
	if (!app_reg || !__atomic_load_n(&cpumap_n, __ATOMIC_ACQUIRE))
		return NULL;
	uintptr_t a = (uintptr_t)app_reg, ppg = a & ~(uintptr_t)(PAGE_SZ - 1);
	pthread_mutex_lock(&hijack_lock);
	int i = cpumap_find(ppg, 1);
	if (i < 0) {
		pthread_mutex_unlock(&hijack_lock);
		return NULL;
	}
	uintptr_t real = cpumap[i].real;
	for (int k = 0; k < MAX_PAGES; k++)
		if (hijack_pages[k].live && hijack_pages[k].cpuproxy && (uintptr_t)hijack_pages[k].proxy == ppg) {
			hijack_stop_page(&hijack_pages[k]); /* last values forwarded, poller joined, proxy unmapped */
			break;
		}
	__atomic_store_n(&cpumap[i].proxy, 0, __ATOMIC_RELEASE); /* real stays: a racing reader never sees 0 */
	pthread_mutex_unlock(&hijack_lock);
	return (void *)(real + (a - ppg));
}

/* ibv_destroy_qp: forget QP qpn and its SQ/doorbell-record umems, if they are
 * the ones registered for it as a verbs QP (a DevX QP's record is left alone). */
void st_hijack_forget_verbs_qp(uint32_t qpn, uint32_t sq_umem_id, uint32_t dbr_umem_id)
{
	pthread_mutex_lock(&hijack_lock);
	struct qp_rec *q = hijack_qp_slot(qpn, 0);
	if (!q || q->wq_umem != sq_umem_id || !__atomic_load_n(&q->live, __ATOMIC_ACQUIRE)) {
		pthread_mutex_unlock(&hijack_lock);
		return;
	}
	hijack_qp_free(q);
	for (int i = 0; i < MAX_UMEMS; i++)
		if (hijack_umems[i].live && (hijack_umems[i].id == sq_umem_id || hijack_umems[i].id == dbr_umem_id))
			hijack_umems[i].live = 0;
	/* its words become free for the QP that gets its bfreg next, and its
	 * page's poller finishes with it before the SQ is freed (the caller
	 * destroys the QP after this returns) */
	unsigned char want[MAX_PAGES] = {0};
	for (int k = 0; k < MAX_PAGES; k++) {
		struct page *pg = &hijack_pages[k];
		if (!pg->live || !pg->verbs || !pg->thr_started)
			continue;
		int mine = 0;
		for (int w = 0; w < pg->noffs; w++)
			if (pg->owner[w] == qpn) {
				pg->owner[w] = OWNER_FREE;
				mine = 1;
			}
		for (int i = 0; i < pg->nsh; i++)
			if (pg->sh[i].qpn == qpn) {
				pg->sh[i--] = pg->sh[--pg->nsh];
				mine = 1;
			}
		if (mine)
			__atomic_add_fetch(&pg->sh_gen, 1, __ATOMIC_RELEASE);
		want[k] = (unsigned char)mine;
	}
	hijack_sync_pages(want); /* bounded: a poller sleeps at most ~1 ms between scans */
	pthread_mutex_unlock(&hijack_lock);
}
