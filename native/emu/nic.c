/* The emulated NIC: one per process, created by the first ibv_open_device.
 * This file holds its configuration (environment, read once), its identity
 * and its thread's main loop, which samples doorbells (doorbell.c), serves
 * the inbox (fabric.c, responder.c), runs WQEs (requester.c) and sleeps on
 * the inbox futex when idle.  Everything the NIC learns about work comes
 * from mlx5 bytes; everything it reports is an mlx5 CQE.  Layouts:
 * sigmatrace/mlx5.h (reference /work/shared/reference/mlx5.md). */
#include <arpa/inet.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"

EXPORT int emu_debug;

static struct emu_nic *g_nic;
static struct emu_stats g_stats; /* the process's NIC counters */
static pthread_mutex_t g_nic_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t emu_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* ---- configuration ------------------------------------------------------- */
static void sanitize(char *s)
{
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
			*s = '_';
}

static void parse_gid(const char *s, uint8_t gid[16])
{
	/* accept "fe80::1", or 32 hex digits with optional ':' separators */
	if (inet_pton(AF_INET6, s, gid) == 1)
		return;
	memset(gid, 0, 16);
	int n = 0;
	for (const char *p = s; *p && n < 32; p++) {
		int v;
		if (*p >= '0' && *p <= '9') v = *p - '0';
		else if (*p >= 'a' && *p <= 'f') v = *p - 'a' + 10;
		else if (*p >= 'A' && *p <= 'F') v = *p - 'A' + 10;
		else continue;
		gid[n / 2] |= (uint8_t)(v << ((n & 1) ? 0 : 4));
		n++;
	}
}

static void nic_config(struct emu_nic *nic)
{
	const char *e;
	e = getenv("SIGMATRACE_EMU_DEBUG");
	emu_debug = !e || !*e || !strcmp(e, "0") ? 0 : !strcmp(e, "errors") ? 1 : 2;
	/* Busy-poll instead of sleeping when idle: for latency baselines on machines
	 * with a core to spare (a sleeping NIC thread would set the baseline). */
	nic->busy_poll = (e = getenv("SIGMATRACE_EMU_NIC_SPIN")) && *e && *e != '0';
	/* A hang hunt: a NIC idle this long dumps what every QP and UAR holds (watchdog_dump) */
	e = getenv("SIGMATRACE_EMU_WATCHDOG_MS");
	nic->watchdog_ns = e && *e ? strtoull(e, NULL, 10) * 1000000ull : 0;
	e = getenv("SIGMATRACE_EMU_BFREG");
	nic->bfreg_share = !e ? 0 : !strcmp(e, "page") ? 1 : !strcmp(e, "word") ? 2 : 0;
	e = getenv("SIGMATRACE_EMU_BF");
	nic->bf_enabled = !(e && *e == '0');
	e = getenv("SIGMATRACE_EMU_BF_POST");
	nic->bf_post = e && *e && *e != '0';
	e = getenv("SIGMATRACE_EMU_BF_BURST_NS");
	nic->bf_burst_ns = e ? strtoull(e, NULL, 10) : 0;
	e = getenv("SIGMATRACE_EMU_DC");
	nic->dc_enabled = e && *e && *e != '0';
	e = getenv("SIGMATRACE_EMU_DMABUF");
	nic->dmabuf_enabled = e && *e && *e != '0';
	e = getenv("SIGMATRACE_EMU_STATS");
	snprintf(nic->stats_path, sizeof nic->stats_path, "%s", e ? e : "");
	e = getenv("SIGMATRACE_EMU_DEV_NAME");
	snprintf(nic->dev_name, sizeof nic->dev_name, "%s", e && *e ? e : "mlx5_0");
	e = getenv("SIGMATRACE_EMU_FABRIC");
	snprintf(nic->fabric, sizeof nic->fabric, "%s", e && *e ? e : "default");
	sanitize(nic->fabric);
	e = getenv("SIGMATRACE_EMU_LID");
	nic->lid = e && *e ? (uint32_t)strtoul(e, NULL, 0) : (uint32_t)(getpid() % 0xbffe) + 1;
	nic->lid &= 0xffff;
	if (!nic->lid)
		nic->lid = 1;
	e = getenv("SIGMATRACE_EMU_NODE_GUID");
	nic->guid = e && *e ? strtoull(e, NULL, 0) : (0x0002c90300000000ull | nic->lid);
	e = getenv("SIGMATRACE_EMU_GID");
	if (e && *e) {
		parse_gid(e, nic->gid);
	} else {
		memset(nic->gid, 0, 16);
		nic->gid[0] = 0xfe;
		nic->gid[1] = 0x80;
		for (int i = 0; i < 8; i++)
			nic->gid[8 + i] = (uint8_t)(nic->guid >> (56 - 8 * i));
	}
}

static int work_pending(struct emu_nic *nic)
{
	if (nic->inbox->head != __atomic_load_n(&nic->inbox->tail, __ATOMIC_ACQUIRE))
		return 1;
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		if (u->cq_page) {
			if (__atomic_load_n((uint64_t *)(u->page + ST_MLX5_CQ_DOORBELL), __ATOMIC_ACQUIRE) != u->last_arm)
				return 1;
			continue;
		}
		int nreg = u->devx ? 4 : 1;
		for (int r = 0; r < nreg; r++)
			if (__atomic_load_n((uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r), __ATOMIC_ACQUIRE) != u->last[r])
				return 1;
	}
	return 0;
}

static int has_backlog(struct emu_nic *nic)
{
	for (int i = 0; i < nic->nnodes; i++)
		if (nic->nodes[i].outq)
			return 1;
	for (int i = 0; i < nic->nq; i++)
		if (nic->qlist[i]->pend || (uint16_t)(nic->qlist[i]->sq_announced - nic->qlist[i]->sq_exec))
			return 1;
	return 0;
}

/* The watchdog's dump (SIGMATRACE_EMU_WATCHDOG_MS, nic->lock held): for each QP what the application
 * announced in its doorbell record, what the NIC was told by doorbells and what it executed, and for each
 * UAR page the values its doorbell registers hold now beside those last sampled -- a doorbell rung but not
 * seen, seen but not executed, or executed with nothing waiting, told apart.  Then the stats file, which a
 * process ended by a signal would not write. */
static uint64_t progress_signature(const struct emu_nic *nic)
{
	uint64_t sig = nic->stats->doorbells + nic->stats->recvs_consumed + nic->inbox->head * 3;
	for (int i = 0; i < 64; i++)
		sig += nic->stats->wqes_by_opcode[i] * 7;
	for (int i = 0; i < nic->nq; i++)
		sig += (uint64_t)nic->qlist[i]->sq_exec * 11 + nic->qlist[i]->rq_ci * 13;
	return sig;
}

static void watchdog_dump(struct emu_nic *nic, uint64_t idle_ns)
{
	uint64_t copies = 0, failed = 0;
	emu_dma_counts(&copies, &failed);
	EMU_PRINT("watchdog: no NIC progress for %llu ms; inbox head %llu tail %llu; rounds with work: uar scan %llu "
		  "inbox %llu qp service %llu node flush %llu; gpu copies %llu failed %llu",
		  (unsigned long long)(idle_ns / 1000000), (unsigned long long)nic->inbox->head,
		  (unsigned long long)__atomic_load_n(&nic->inbox->tail, __ATOMIC_ACQUIRE),
		  (unsigned long long)nic->work_by_source[0], (unsigned long long)nic->work_by_source[1],
		  (unsigned long long)nic->work_by_source[2], (unsigned long long)nic->work_by_source[3],
		  (unsigned long long)copies, (unsigned long long)failed);
	for (int i = 0; i < nic->nnodes; i++)
		if (nic->nodes[i].outq)
			EMU_PRINT("watchdog: node %d has messages queued", i);
	for (int i = 0; i < nic->nq; i++) {
		struct emu_qp *q = nic->qlist[i];
		long dbr = q->dbrec ? (long)(emu_dma_load_be32(&q->dbrec[ST_MLX5_SND_DBR]) & 0xffff) : -1;
		uint32_t page_id = 0;
		for (struct emu_uar *u = nic->uars; u; u = u->next)
			if (u->page == q->uar)
				page_id = u->page_id;
		EMU_PRINT("watchdog: qp 0x%x type %d devx %d state %d uar %u: dbr_pi %ld announced %u executed %u "
			  "inflight %u pend %d resp_active %d rq_ci %u db_seen 0x%x db_last %u %u %u %u",
			  q->qpn, q->qp_type, q->devx, q->state, page_id, dbr,
			  q->sq_announced & 0xffff, q->sq_exec & 0xffff, q->inflight_tail - q->inflight_head,
			  q->pend != NULL, q->resp_active, q->rq_ci, q->db_seen, q->db_last[0], q->db_last[1], q->db_last[2], q->db_last[3]);
	}
	for (int i = 0; i < EMU_MAX_CQ; i++) {
		struct emu_cq *c = nic->cqs[i];
		if (c && c->pi)
			EMU_PRINT("watchdog: cq 0x%x devx %d collapsed %d: written %u polled %u", c->cqn, c->devx, c->collapsed,
				  c->pi, c->ci);
	}
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		if (u->cq_page)
			continue;
		uint64_t now[4];
		for (int r = 0; r < 4; r++)
			now[r] = __atomic_load_n((uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r), __ATOMIC_ACQUIRE);
		EMU_PRINT("watchdog: uar %u devx %d regs now %016llx %016llx %016llx %016llx sampled %016llx %016llx "
			  "%016llx %016llx", u->page_id, u->devx, (unsigned long long)now[0], (unsigned long long)now[1],
			  (unsigned long long)now[2], (unsigned long long)now[3], (unsigned long long)u->last[0],
			  (unsigned long long)u->last[1], (unsigned long long)u->last[2], (unsigned long long)u->last[3]);
	}
	emu_stats_write(nic);
}

/* The watchdog thread (SIGMATRACE_EMU_WATCHDOG_MS; a diagnosis, never on by default): progress, not work,
 * is what it watches -- a NIC can loop on work that moves nothing, or be stuck inside one round, which a
 * check in the NIC's own loop would never see.  It dumps under the NIC's lock when it can have it within a
 * second, else (the NIC thread stuck holding it) without: racy reads of a NIC that is not moving. */
static void *watchdog_main(void *arg)
{
	struct emu_nic *nic = arg;
	EMU_DEVICE_THREAD();
	while (__atomic_load_n(&nic->running, __ATOMIC_ACQUIRE)) {
		struct timespec ts = {0, 100 * 1000000L};
		nanosleep(&ts, NULL);
		uint64_t now = emu_now_ns(), sig = progress_signature(nic);
		if (sig != nic->progress || !nic->last_work_ns) {
			nic->progress = sig;
			nic->last_work_ns = now;
			nic->watchdog_dumped = 0;
			continue;
		}
		if (nic->watchdog_dumped || now - nic->last_work_ns <= nic->watchdog_ns)
			continue;
		nic->watchdog_dumped = 1;
		int locked = 0;
		for (int i = 0; i < 100 && !(locked = !pthread_mutex_trylock(&nic->lock)); i++) {
			struct timespec w = {0, 10 * 1000000L};
			nanosleep(&w, NULL);
		}
		uint64_t dev = 0;
		int stage = emu_dma_in_progress(&dev);
		EMU_PRINT("watchdog: the NIC thread is in phase %d after %llu rounds%s; GPU copy stage %d (%s) address 0x%llx",
			  nic->phase, (unsigned long long)nic->rounds, locked ? "" : "; it holds its lock (dump without it)",
			  stage, stage == 2 ? "waiting for its stream" : stage == 1 ? "being queued" : "none",
			  (unsigned long long)dev);
		watchdog_dump(nic, now - nic->last_work_ns);
		if (locked)
			pthread_mutex_unlock(&nic->lock);
	}
	EMU_DEVICE_THREAD_END();
	return NULL;
}

static void *nic_main(void *arg)
{
	struct emu_nic *nic = arg;
	unsigned idle = 0;
	EMU_DEVICE_THREAD();
	uint64_t backoff_us = 20;
	/* short sleeps must be short: the default 50 us timer slack would set the
	 * latency of raw doorbells */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	while (__atomic_load_n(&nic->running, __ATOMIC_ACQUIRE)) {
		int work = 0, w[4] = {0, 0, 0, 0};
		pthread_mutex_lock(&nic->lock);
		nic->rounds++;
		nic->phase = 1;
		w[0] = emu_scan_uars(nic);
		nic->phase = 2;
		w[1] = emu_service_inbox(nic);
		nic->phase = 3;
		w[2] = emu_service_qps(nic);
		nic->phase = 4;
		for (int i = 0; i < nic->nnodes; i++)
			w[3] += emu_node_flush(&nic->nodes[i]);
		nic->phase = 0;
		for (int i = 0; i < 4; i++) {
			work += w[i];
			nic->work_by_source[i] += w[i] != 0;
		}
		uint64_t now = emu_now_ns();
		if (now - nic->last_liveness_ns > 50000000ull) {
			nic->last_liveness_ns = now;
			emu_liveness(nic);
		}
		int backlog = has_backlog(nic);
		pthread_mutex_unlock(&nic->lock);
		if (work) {
			idle = 0;
			backoff_us = 20;
			continue;
		}
		if (nic->busy_poll) {
#if defined(__x86_64__) || defined(__i386__)
			__builtin_ia32_pause();
#endif
			continue;
		}
		/* Raw doorbells (polled pages: DevX UARs, init_obj QPs, CQ arm pages)
		 * come without a kick.  Their writers usually spin on memory (UCX
		 * rc_mlx5 polls its CQs itself): a NIC thread spinning with
		 * sched_yield beside them gets the CPU back only when a time slice
		 * ends (ms on 2 cores).  So these NICs do not spin: they sleep
		 * 10 us at a time -- a wakeup preempts the spinner -- for the first
		 * ~300 idle rounds, then back off to 2 ms.  Without polled pages a
		 * verbs call kicks the NIC: spin briefly, then sleep until kicked. */
		int polled = __atomic_load_n(&nic->have_devx_uars, __ATOMIC_RELAXED) > 0;
		++idle;
		if (!polled && idle < 64) {
			sched_yield();
			continue;
		}
		/* sleep until kicked; poll (devx UARs have no kick) with back-off */
		uint32_t seq = __atomic_load_n(&nic->inbox->wake_seq, __ATOMIC_SEQ_CST);
		__atomic_store_n(&nic->inbox->sleeping, 1, __ATOMIC_SEQ_CST);
		pthread_mutex_lock(&nic->lock); /* the UAR list changes as QPs and UARs come and go */
		int pending = work_pending(nic);
		pthread_mutex_unlock(&nic->lock);
		if (!pending) {
			uint64_t us;
			if (backlog)
				us = 200;
			else if (polled)
				us = idle < 300 ? 10 : backoff_us;
			else
				us = 50000;
			struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };
			emu_futex(&nic->inbox->wake_seq, FUTEX_WAIT, seq, &ts);
			if (backoff_us < 2000 && (!polled || idle >= 300))
				backoff_us *= 2;
		}
		__atomic_store_n(&nic->inbox->sleeping, 0, __ATOMIC_SEQ_CST);
		if (!polled)
			idle = 32; /* a short spin after waking */
	}
	EMU_DEVICE_THREAD_END();
	return NULL;
}

/* SIGMATRACE_EMU_STATS=<path> ("%p" becomes the pid): the NIC's counters
 * as one JSON object, written when the NIC is released or the process exits. */
EXPORT void emu_stats_write(struct emu_nic *nic)
{
	if (!nic->stats_path[0])
		return;
	char path[300], tmp[320];
	const char *s = nic->stats_path;
	size_t o = 0;
	for (; *s && o < sizeof path - 16; s++) {
		if (s[0] == '%' && s[1] == 'p') {
			o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
			s++;
		} else {
			path[o++] = *s;
		}
	}
	path[o] = 0;
	snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	emu_dma_counts(&nic->stats->dma_gpu_copies, &nic->stats->dma_gpu_errors);
	fprintf(f, "{\"pid\": %d, \"lid\": %u, \"fabric\": \"%s\", \"dev\": \"%s\"", (int)getpid(), nic->lid,
		nic->fabric, nic->dev_name);
#define EMU_STAT_JSON(name, what) fprintf(f, ", \"%s\": %llu", #name, (unsigned long long)nic->stats->name);
	EMU_STATS(EMU_STAT_JSON)
#undef EMU_STAT_JSON
	fprintf(f, ", \"recvs_consumed\": %llu", (unsigned long long)nic->stats->recvs_consumed);
	for (int k = 0; k < 2; k++) {
		const uint64_t *v = k ? nic->stats->bytes_by_opcode : nic->stats->wqes_by_opcode;
		fprintf(f, ", \"%s\": {", k ? "bytes_by_opcode" : "wqes_by_opcode");
		const char *sep = "";
		for (int op = 0; op < 64; op++)
			if (v[op]) {
				fprintf(f, "%s\"0x%02x\": %llu", sep, op, (unsigned long long)v[op]);
				sep = ", ";
			}
		fprintf(f, "}");
	}
	/* the memory regions registered in the run: what a remote key in a trace must name */
	fprintf(f, ", \"mrs\": [");
	for (int i = 0; i < nic->mr_log_n; i++) {
		const struct emu_mr_log *m = &nic->mr_log[i];
		fprintf(f, "%s{\"rkey\": %u, \"addr\": %llu, \"length\": %zu, \"gpu\": %d}", i ? ", " : "", m->rkey,
			(unsigned long long)m->addr, m->len, m->gpu);
	}
	fprintf(f, "]}\n");
	if (fclose(f) == 0)
		rename(tmp, path);
	else
		unlink(tmp);
}

static void emu_atexit(void)
{
	if (g_nic && g_nic->shm_name[0])
		shm_unlink(g_nic->shm_name);
	if (g_nic)
		emu_stats_write(g_nic);
}

/* Whether [addr, addr + len) lies inside one of this process's UAR pages:
 * the query the test-only CUDA shim (cudashim.c) asks before it registers a
 * UAR with the CUDA driver without CU_MEMHOSTREGISTER_IOMEMORY. */
EXPORT int emu_uar_contains(const void *addr, size_t len)
{
	int r = 0;
	uintptr_t a = (uintptr_t)addr;
	pthread_mutex_lock(&g_nic_lock);
	struct emu_nic *nic = g_nic;
	if (nic) {
		pthread_mutex_lock(&nic->lock);
		for (struct emu_uar *u = nic->uars; u && !r; u = u->next) {
			uintptr_t p = (uintptr_t)u->page;
			r = a >= p && a - p < ST_MLX5_ADAPTER_PAGE_SIZE && len <= ST_MLX5_ADAPTER_PAGE_SIZE - (a - p);
		}
		pthread_mutex_unlock(&nic->lock);
	}
	pthread_mutex_unlock(&g_nic_lock);
	return r;
}

EXPORT struct emu_nic *emu_nic_get(void)
{
	pthread_mutex_lock(&g_nic_lock);
	if (g_nic) {
		g_nic->refcnt++;
		pthread_mutex_unlock(&g_nic_lock);
		return g_nic;
	}
	struct emu_nic *nic = calloc(1, sizeof *nic);
	if (!nic) {
		pthread_mutex_unlock(&g_nic_lock);
		return NULL;
	}
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&nic->lock, &a);
	nic_config(nic);
	nic->stats = &g_stats;
	if (emu_inbox_create(nic)) {
		free(nic);
		pthread_mutex_unlock(&g_nic_lock);
		return NULL;
	}
	nic->running = 1;
	nic->refcnt = 1;
	nic->next_pdn = 1;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_create(&nic->thread, NULL, nic_main, nic);
	if (nic->watchdog_ns && pthread_create(&nic->watchdog, NULL, watchdog_main, nic))
		nic->watchdog_ns = 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	static int atexit_done;
	if (!atexit_done++)
		atexit(emu_atexit);
	g_nic = nic;
	EMU_LOG("NIC up: dev %s lid %u guid 0x%016llx fabric %s", nic->dev_name, nic->lid,
		(unsigned long long)nic->guid, nic->fabric);
	pthread_mutex_unlock(&g_nic_lock);
	return nic;
}

EXPORT void emu_nic_put(struct emu_nic *nic)
{
	pthread_mutex_lock(&g_nic_lock);
	if (--nic->refcnt > 0) {
		pthread_mutex_unlock(&g_nic_lock);
		return;
	}
	__atomic_store_n(&nic->running, 0, __ATOMIC_RELEASE);
	emu_nic_kick(nic);
	pthread_join(nic->thread, NULL);
	if (nic->watchdog_ns)
		pthread_join(nic->watchdog, NULL);
	/* deliver what is still queued for peers (bounded) */
	for (int tries = 0; tries < 100; tries++) {
		int left = 0;
		for (int i = 0; i < nic->nnodes; i++) {
			emu_node_flush(&nic->nodes[i]);
			left |= nic->nodes[i].outq != NULL;
		}
		if (!left)
			break;
		usleep(1000);
	}
	shm_unlink(nic->shm_name);
	nic->shm_name[0] = 0;
	emu_stats_write(nic);
	g_nic = NULL;
	pthread_mutex_unlock(&g_nic_lock);
	/* the struct and mappings are left for late readers (process exit frees them) */
}

/* The configuration in force: the running NIC's, else a snapshot read from
 * the environment (query_* and the device list start nothing). */
EXPORT const struct emu_nic *emu_config(void)
{
	static struct emu_nic *cfg;
	if (g_nic)
		return g_nic;
	if (!cfg) {
		struct emu_nic *c = calloc(1, sizeof *c);
		if (!c)
			return NULL;
		nic_config(c);
		cfg = c;
	}
	return cfg;
}

/* Snapshot of the identity, used by query_* without starting anything. */
EXPORT void emu_identity(char *name, size_t n, uint64_t *guid, uint32_t *lid, uint8_t gid[16])
{
	const struct emu_nic *src = emu_config();
	if (!src)
		return;
	if (name)
		snprintf(name, n, "%s", src->dev_name);
	if (guid)
		*guid = src->guid;
	if (lid)
		*lid = src->lid;
	if (gid)
		memcpy(gid, src->gid, 16);
}
