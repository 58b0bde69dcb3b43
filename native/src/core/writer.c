/*
 * The background writer: the only code that writes the trace file while
 * the program runs.
 *
 *  - activation (first recorded event, or SIGMATRACE_EAGER=1): create the
 *    file safely (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), start the writer thread,
 *    install fatal-signal handlers;
 *  - the writer sleeps on a futex; application threads wake it only when
 *    they hand over a full chunk; otherwise it wakes every flush_ms to write
 *    partly filled chunks (so SIGKILL loses at most flush_ms of events) and
 *    every calib_ms to record a calibration pair;
 *  - every chunk write happens under io_lock, a spin lock with an owner so
 *    the fatal-signal path can take it with a bounded wait and never
 *    deadlock against itself;
 *  - exit (atexit / destructor / _exit), fatal signals: one final pass writes
 *    everything committed, an END calibration and the END chunk.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

#ifndef TRACER_VERSION
#define TRACER_VERSION "0.1.0"
#endif
#define MAX_THREADS 4096
#define SIDE_CAP (4u << 20)

int st_active;
static pthread_mutex_t act_lock = PTHREAD_MUTEX_INITIALIZER;
static int act_failed;
static pid_t owner_pid;
static uint64_t uid;
static int fd = -1;
static char path[PATH_MAX];
static pthread_t writer_tid;
static int writer_running;

/* wake-up */
static uint32_t wseq;
static uint32_t wsleeping;

/* io lock: owner tid, 0 = free */
static int io_owner;
static int closed; /* END written; nothing more may be written */

/* thread registry */
static struct st_thread *threads[MAX_THREADS];
static uint32_t nthreads; /* slots in use (high-water mark) */
static uint32_t next_thread_index = 1;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

/* totals */
static uint64_t total_events, total_dropped_reclaimed, chunks_written, dropped_side_bytes;
static uint32_t threads_seen;

/* side channel */
static pthread_mutex_t side_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *side_buf;
static size_t side_len;
static uint32_t side_count;
static uint64_t next_side_id = 1;

/* process identity */
static struct st_calibration calib_start;
static int have_calib_start;
static double tsc_hz;
static int tsc_hz_refined;
static char host[256];
static int rank = -1, local_rank = -1, world_size = -1;
static char launcher[32];
static uint64_t start_realtime_ns;
static char nics_json[16384] = "[]";
static char gpus_json[16384] = "[]";
static int header_dirty;
static pthread_mutex_t ident_lock = PTHREAD_MUTEX_INITIALIZER;

/* scratch buffers: used only under io_lock */
static char jbuf[65536];
static struct st_aggregate aggbuf[512];

static struct sigaction old_act[65];
static int sig_installed[65];
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTERM, SIGINT, SIGQUIT, SIGHUP};

static pid_t gettid_(void)
{
	return (pid_t)syscall(SYS_gettid);
}

uint64_t st_process_uid(void)
{
	return uid;
}

/* ---- io lock ------------------------------------------------------------ */

static void io_lock(void)
{
	int me = gettid_(), zero;
	for (unsigned i = 0;; i++) {
		zero = 0;
		if (__atomic_compare_exchange_n(&io_owner, &zero, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return;
		if (i > 64) {
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
	}
}

/* Bounded: for signal handlers.  Fails when we interrupted ourselves. */
static int io_trylock_bounded(void)
{
	int me = gettid_(), zero;
	if (__atomic_load_n(&io_owner, __ATOMIC_RELAXED) == me)
		return -1;
	for (unsigned i = 0; i < 50000; i++) { /* ~1 s */
		zero = 0;
		if (__atomic_compare_exchange_n(&io_owner, &zero, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return 0;
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	return -1;
}

static void io_unlock(void)
{
	__atomic_store_n(&io_owner, 0, __ATOMIC_RELEASE);
}

/* ---- raw chunk output (io_lock held) ------------------------------------ */

static int write_all(const struct iovec *iov, int n)
{
	struct iovec v[4];
	memcpy(v, iov, sizeof(*iov) * (size_t)n);
	int i = 0;
	while (i < n) {
		ssize_t w = writev(fd, v + i, n - i);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		while (i < n && (size_t)w >= v[i].iov_len) {
			w -= (ssize_t)v[i].iov_len;
			i++;
		}
		if (i < n) {
			v[i].iov_base = (char *)v[i].iov_base + w;
			v[i].iov_len -= (size_t)w;
		}
	}
	return 0;
}

static void write_chunk(uint16_t kind, uint32_t thread_index, uint32_t count, const void *p, size_t len,
			const void *p2, size_t len2)
{
	static const unsigned char zeros[8];
	if (fd < 0 || closed)
		return;
	size_t pad = (8 - ((len + len2) & 7)) & 7;
	struct st_chunk_header h = {
		.magic = ST_FORMAT_MAGIC,
		.version = ST_FORMAT_VERSION,
		.kind = kind,
		.process_uid = uid,
		.thread_index = thread_index,
		.payload_len = (uint32_t)(len + len2 + pad),
		.count = count,
	};
	uint32_t crc = st_crc32(0, &h, 28);
	if (len)
		crc = st_crc32(crc, p, len);
	if (len2)
		crc = st_crc32(crc, p2, len2);
	if (pad)
		crc = st_crc32(crc, zeros, pad);
	h.crc32 = crc;
	struct iovec iov[4] = {{&h, sizeof(h)}, {(void *)p, len}, {(void *)p2, len2}, {(void *)zeros, pad}};
	int saved = errno;
	if (write_all(iov, 4) == 0)
		chunks_written++;
	errno = saved;
}

static void write_json_chunk(uint16_t kind, uint32_t thread_index, const struct st_json *j)
{
	write_chunk(kind, thread_index, 0, j->buf, j->len, NULL, 0);
}

/* ---- process header ------------------------------------------------------ */

static void json_rank(struct st_json *j, const char *k, int v)
{
	if (v < 0)
		st_json_null(j, k);
	else
		st_json_int(j, k, v);
}

static void build_process_header(struct st_json *j)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;

	st_json_init(j, jbuf, sizeof(jbuf));
	st_json_open(j, NULL, '{');
	st_json_int(j, "format_version", ST_FORMAT_VERSION);
	st_json_hex(j, "process_uid", uid);
	st_json_str(j, "tracer", "native");
	st_json_str(j, "tracer_version", TRACER_VERSION);
	st_json_str(j, "host", host);
	st_json_str(j, "node_id", st_cfg.node_id[0] ? st_cfg.node_id : host);
	st_json_int(j, "pid", owner_pid);
	st_json_int(j, "ppid", getppid());
	json_rank(j, "rank", rank);
	json_rank(j, "local_rank", local_rank);
	json_rank(j, "world_size", world_size);
	st_json_str(j, "launcher", launcher[0] ? launcher : NULL);
	st_json_str(j, "mode", st_mode_name(st_cfg.mode));
	st_json_open(j, "providers", '[');
	for (unsigned b = 1; b < ST_PROV_ALL; b <<= 1)
		if (st_cfg.providers & b)
			st_json_str(j, NULL, st_provider_name(b));
	st_json_close(j, ']');
	st_json_str(j, "exe", exe);
	st_json_open(j, "argv", '[');
	int cfd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (cfd >= 0) {
		static char cmd[8192];
		ssize_t r = read(cfd, cmd, sizeof(cmd) - 1);
		close(cfd);
		if (r > 0) {
			cmd[r] = 0;
			for (char *a = cmd; a < cmd + r; a += strlen(a) + 1)
				st_json_str(j, NULL, a);
		}
	}
	st_json_close(j, ']');
	st_json_double(j, "tsc_hz", tsc_hz);
	st_json_bool(j, "tsc_invariant", st_tsc_invariant());
	st_json_uint(j, "start_realtime_ns", start_realtime_ns);
	st_json_open(j, "options", '{');
	st_json_str(j, "mode", st_mode_name(st_cfg.mode));
	st_json_str(j, "output_dir", st_cfg.output_dir);
	st_json_uint(j, "buffer_kb", st_cfg.chunk_bytes / 1024);
	st_json_uint(j, "chunks", st_cfg.chunks);
	st_json_str(j, "drop_policy", st_cfg.drop_policy == ST_DROP_BLOCK ? "block" : "drop");
	st_json_uint(j, "batch_threshold", st_cfg.batch_threshold);
	st_json_uint(j, "flush_ms", st_cfg.flush_ms);
	st_json_uint(j, "calib_ms", st_cfg.calib_ms);
	st_json_bool(j, "signals", st_cfg.signals);
	st_json_close(j, '}');
	pthread_mutex_lock(&ident_lock);
	st_json_raw(j, ",\"nics\":");
	st_json_raw(j, nics_json);
	st_json_raw(j, ",\"gpus\":");
	st_json_raw(j, gpus_json);
	pthread_mutex_unlock(&ident_lock);
	j->need_comma = 1;
	st_json_close(j, '}');
}

static void write_process_header(void)
{
	struct st_json j;
	build_process_header(&j);
	if (j.overflow) { /* never write broken JSON: drop the lists that made it too big */
		pthread_mutex_lock(&ident_lock);
		strcpy(nics_json, "[]");
		strcpy(gpus_json, "[]");
		pthread_mutex_unlock(&ident_lock);
		build_process_header(&j);
	}
	write_json_chunk(ST_CHUNK_PROCESS, 0, &j);
	header_dirty = 0;
}

static void set_list(char *dst, size_t cap, const char *json_array)
{
	pthread_mutex_lock(&ident_lock);
	if (json_array && strlen(json_array) < cap && json_array[0] == '[')
		strcpy(dst, json_array);
	pthread_mutex_unlock(&ident_lock);
	__atomic_store_n(&header_dirty, 1, __ATOMIC_RELEASE);
	st_writer_kick();
}

void st_process_set_nics(const char *json_array)
{
	set_list(nics_json, sizeof(nics_json), json_array);
}

void st_process_set_gpus(const char *json_array)
{
	set_list(gpus_json, sizeof(gpus_json), json_array);
}

static void write_calibration(uint32_t point)
{
	struct st_calibration c;
	st_calibrate(&c, point);
	write_chunk(ST_CHUNK_CALIBRATION, 0, 1, &c, sizeof(c), NULL, 0);
}

/* ---- threads -------------------------------------------------------------- */

int st_thread_register(struct st_thread *t)
{
	pthread_mutex_lock(&reg_lock);
	uint32_t slot = MAX_THREADS;
	for (uint32_t i = 0; i < nthreads; i++)
		if (!threads[i]) {
			slot = i;
			break;
		}
	if (slot == MAX_THREADS && nthreads < MAX_THREADS)
		slot = nthreads;
	if (slot == MAX_THREADS) {
		pthread_mutex_unlock(&reg_lock);
		return -1;
	}
	t->index = next_thread_index++;
	__atomic_store_n(&threads[slot], t, __ATOMIC_RELEASE);
	if (slot == nthreads)
		__atomic_store_n(&nthreads, nthreads + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&reg_lock);
	return 0;
}

static uint64_t count_events(const struct st_event *e, uint32_t n)
{
	uint64_t k = 0;
	for (uint32_t i = 0; i < n; i++)
		k += e[i].type != ST_EV_EXT;
	return k;
}

static void describe_thread(struct st_thread *t)
{
	struct st_json j;
	char buf[512];
	st_json_init(&j, buf, sizeof(buf));
	st_json_open(&j, NULL, '{');
	st_json_uint(&j, "thread_index", t->index);
	st_json_int(&j, "tid", t->tid);
	st_json_str(&j, "name", t->name);
	st_json_str(&j, "role", t->tid == owner_pid ? "main" : "app");
	st_json_close(&j, '}');
	write_json_chunk(ST_CHUNK_THREAD, t->index, &j);
	t->described = 1;
	threads_seen++;
}

static void write_records(struct st_thread *t, struct st_chunk *c, uint32_t from, uint32_t to)
{
	if (to <= from)
		return;
	if (c->kind == ST_CHUNK_AGGREGATE) {
		const struct st_aggregate *a = (const struct st_aggregate *)c->data;
		write_chunk(ST_CHUNK_AGGREGATE, t->index, to - from, a + from, (size_t)(to - from) * sizeof(*a), NULL, 0);
	} else {
		const struct st_event *e = (const struct st_event *)c->data;
		write_chunk(ST_CHUNK_EVENTS, t->index, to - from, e + from, (size_t)(to - from) * sizeof(*e), NULL, 0);
		total_events += count_events(e + from, to - from);
	}
}

/* Write a live thread's counters directly (final pass only; values may be
 * a moment stale for threads still running while the process exits). */
static void write_live_aggregates(struct st_thread *t)
{
	if (!t->agg)
		return;
	uint32_t k = 0;
	for (uint32_t i = 0; i < ST_AGG_SLOTS; i++) {
		if (t->agg[i].a.count) {
			aggbuf[k++] = t->agg[i].a;
			if (k == sizeof(aggbuf) / sizeof(aggbuf[0])) {
				write_chunk(ST_CHUNK_AGGREGATE, t->index, k, aggbuf, k * sizeof(aggbuf[0]), NULL, 0);
				k = 0;
			}
		}
	}
	if (k)
		write_chunk(ST_CHUNK_AGGREGATE, t->index, k, aggbuf, k * sizeof(aggbuf[0]), NULL, 0);
}

/* One thread's pending output.  partial: also the committed part of the
 * chunk being filled.  Returns 1 when the thread's state was reclaimed. */
static int drain_thread(uint32_t slot, int partial, int final)
{
	struct st_thread *t = __atomic_load_n(&threads[slot], __ATOMIC_ACQUIRE);
	if (!t)
		return 0;
	if (!t->described)
		describe_thread(t);
	int exited = __atomic_load_n(&t->exited, __ATOMIC_ACQUIRE);
	for (uint32_t guard = 0; guard < t->nchunks; guard++) {
		struct st_chunk *c = &t->chunks[t->writer_idx];
		if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != ST_CHUNK_FULL)
			break;
		write_records(t, c, c->flushed, c->count);
		c->flushed = 0;
		__atomic_store_n(&c->committed, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&c->state, ST_CHUNK_FREE, __ATOMIC_RELEASE);
		t->writer_idx = (t->writer_idx + 1) % t->nchunks;
	}
	if (exited) {
		if (!final) {
			/* everything was handed over before `exited`: give the memory back */
			total_dropped_reclaimed += t->dropped_total;
			__atomic_store_n(&threads[slot], NULL, __ATOMIC_RELEASE);
			munmap(t, t->map_bytes);
			return 1;
		}
		return 0;
	}
	if (partial) {
		struct st_chunk *c = &t->chunks[t->writer_idx];
		if (c->kind == ST_CHUNK_EVENTS) {
			uint32_t n = __atomic_load_n(&c->committed, __ATOMIC_ACQUIRE);
			if (n > c->flushed) {
				write_records(t, c, c->flushed, n);
				c->flushed = n;
			}
		}
	}
	if (final)
		write_live_aggregates(t);
	return 0;
}

static void drain_side(int blocking)
{
	if (blocking)
		pthread_mutex_lock(&side_lock);
	else if (pthread_mutex_trylock(&side_lock) != 0)
		return;
	if (side_len) {
		write_chunk(ST_CHUNK_SIDE, 0, side_count, side_buf, side_len, NULL, 0);
		side_len = 0;
		side_count = 0;
	}
	pthread_mutex_unlock(&side_lock);
}

static void drain_all(int partial, int final)
{
	uint32_t n = __atomic_load_n(&nthreads, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n; i++) {
		io_lock();
		if (!closed)
			drain_thread(i, partial, 0);
		io_unlock();
	}
	(void)final;
	io_lock();
	if (!closed) {
		drain_side(1);
		if (__atomic_load_n(&header_dirty, __ATOMIC_ACQUIRE))
			write_process_header();
	}
	io_unlock();
}

/* ---- the writer thread --------------------------------------------------- */

void st_writer_kick(void)
{
	__atomic_fetch_add(&wseq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&wsleeping, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &wseq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void estimate_tsc_hz(void)
{
	struct st_calibration now;
	st_calibrate(&now, ST_CALIB_PERIODIC);
	double hz = st_tsc_hz_estimate(&calib_start, &now);
	if (hz > 0)
		tsc_hz = hz;
}

static void *writer_main(void *arg)
{
	(void)arg;
	/* TSC frequency: from the load-time calibration to now (at least 2 ms,
	 * so the header is usable for short programs); refined at exit. */
	struct st_calibration now;
	st_calibrate(&now, ST_CALIB_PERIODIC);
	if (now.monotonic_raw_ns < calib_start.monotonic_raw_ns + 2000000ull) {
		uint64_t left = calib_start.monotonic_raw_ns + 2000000ull - now.monotonic_raw_ns;
		struct timespec ts = {0, (long)(left > 2000000ull ? 2000000ull : left)};
		nanosleep(&ts, NULL);
	}
	estimate_tsc_hz();

	io_lock();
	write_process_header();
	if (have_calib_start)
		write_chunk(ST_CHUNK_CALIBRATION, 0, 1, &calib_start, sizeof(calib_start), NULL, 0);
	io_unlock();

	uint64_t next_flush = st_now_ns() + (uint64_t)st_cfg.flush_ms * 1000000ull;
	uint64_t next_calib = st_now_ns() + (uint64_t)st_cfg.calib_ms * 1000000ull;
	uint32_t seen = __atomic_load_n(&wseq, __ATOMIC_SEQ_CST);
	for (;;) {
		if (__atomic_load_n(&closed, __ATOMIC_ACQUIRE))
			break;
		uint64_t now = st_now_ns();
		int partial = now >= next_flush;
		drain_all(partial, 0);
		if (partial)
			next_flush = now + (uint64_t)st_cfg.flush_ms * 1000000ull;
		if (now >= next_calib) {
			io_lock();
			if (!closed)
				write_calibration(ST_CALIB_PERIODIC);
			io_unlock();
			next_calib = now + (uint64_t)st_cfg.calib_ms * 1000000ull;
		}
		/* sleep until a hand-over or the next deadline */
		__atomic_store_n(&wsleeping, 1, __ATOMIC_SEQ_CST);
		uint32_t s = __atomic_load_n(&wseq, __ATOMIC_SEQ_CST);
		if (s == seen) {
			now = st_now_ns();
			uint64_t dl = next_flush < next_calib ? next_flush : next_calib;
			uint64_t wait = dl > now ? dl - now : 0;
			if (wait) {
				struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
				syscall(SYS_futex, &wseq, FUTEX_WAIT_PRIVATE, s, &ts, NULL, 0);
			}
		}
		__atomic_store_n(&wsleeping, 0, __ATOMIC_SEQ_CST);
		seen = __atomic_load_n(&wseq, __ATOMIC_SEQ_CST);
	}
	return NULL;
}

/* ---- signals ----------------------------------------------------------------- */

static void final_pass(const char *reason, int sig, int have_lock);

static void on_signal(int sig, siginfo_t *si, void *uctx)
{
	int saved = errno;
	struct sigaction *old = &old_act[sig];
	int chain = !(old->sa_flags & SA_SIGINFO) ? (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) : 1;
	if (chain) {
		/* Someone else handles this signal (UCX, a runtime...): write what
		 * we have without closing the file, then let them decide. */
		if (io_trylock_bounded() == 0) {
			if (!closed) {
				uint32_t n = __atomic_load_n(&nthreads, __ATOMIC_ACQUIRE);
				for (uint32_t i = 0; i < n; i++)
					drain_thread(i, 1, 0);
				drain_side(0);
			}
			io_unlock();
		}
		errno = saved;
		if (old->sa_flags & SA_SIGINFO)
			old->sa_sigaction(sig, si, uctx);
		else
			old->sa_handler(sig);
		return;
	}
	if (getpid() == owner_pid && io_trylock_bounded() == 0)
		final_pass("signal", sig, 1);
	/* restore the original disposition and re-raise */
	sigaction(sig, old, NULL);
	errno = saved;
	if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL) {
		/* synchronous: returning re-executes the faulting instruction with the
		 * default action in place (and keeps si_addr meaningful for a core) */
		if (si && si->si_code > 0)
			return;
	}
	raise(sig);
}

static void install_signals(void)
{
	if (!st_cfg.signals)
		return;
	for (size_t i = 0; i < sizeof(fatal_signals) / sizeof(fatal_signals[0]); i++) {
		int s = fatal_signals[i];
		struct sigaction old, sa;
		if (sigaction(s, NULL, &old) != 0)
			continue;
		int sync = (s == SIGSEGV || s == SIGBUS || s == SIGABRT || s == SIGFPE || s == SIGILL);
		/* An ignored signal stays ignored.  For termination requests
		 * (TERM/INT/QUIT/HUP) a program handler means the program decides
		 * what happens (it may not exit): we leave it alone. */
		if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN)
			continue;
		if (!sync && ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL))
			continue;
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_signal;
		sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
		sigemptyset(&sa.sa_mask);
		old_act[s] = old;
		if (sigaction(s, &sa, NULL) == 0)
			sig_installed[s] = 1;
	}
}

/* ---- activation ---------------------------------------------------------------- */

static uint64_t random_uid(void)
{
	uint64_t x = 0;
	if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != sizeof(x))
		x = 0;
	x ^= st_tsc() * 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 32);
	return x ? x : 1;
}

static void sanitize(char *s)
{
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '-' ||
		      *s == '_' || *s == '.'))
			*s = '_';
}

static int mkdirs(const char *dir)
{
	char tmp[PATH_MAX];
	if (strlen(dir) >= sizeof(tmp))
		return -1;
	strcpy(tmp, dir);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	}
	if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
		return -1;
	return 0;
}

static int open_output(void)
{
	char h[256], r[32];
	snprintf(h, sizeof(h), "%s", st_cfg.node_id[0] ? st_cfg.node_id : host);
	sanitize(h);
	if (rank >= 0)
		snprintf(r, sizeof(r), "r%d", rank);
	else
		snprintf(r, sizeof(r), "r-");
	if (mkdirs(st_cfg.output_dir) != 0) {
		st_warn("cannot create output directory %s: %s; tracing disabled", st_cfg.output_dir, strerror(errno));
		return -1;
	}
	for (int attempt = 0; attempt < 8; attempt++) {
		snprintf(path, sizeof(path), "%s/%s.%d.%s.%016llx.trace", st_cfg.output_dir, h, (int)getpid(), r,
			 (unsigned long long)uid);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0)
			return 0;
		if (errno != EEXIST)
			break;
		uid = random_uid();
	}
	st_warn("cannot create trace file %s: %s; tracing disabled", path, strerror(errno));
	return -1;
}

void st_activate(void)
{
	if (!st_cfg.enabled || act_failed || !st_initialized)
		return;
	int saved = errno;
	pthread_mutex_lock(&act_lock);
	if (!st_active && !act_failed) {
		owner_pid = getpid();
		uid = random_uid();
		if (!side_buf) {
			void *m = mmap(NULL, SIDE_CAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			side_buf = (m == MAP_FAILED) ? NULL : m;
		}
		if (open_output() != 0) {
			act_failed = 1;
		} else {
			/* the writer must never receive the program's signals */
			sigset_t all, old;
			sigfillset(&all);
			pthread_sigmask(SIG_SETMASK, &all, &old);
			int rc = pthread_create(&writer_tid, NULL, writer_main, NULL);
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			if (rc != 0) {
				st_warn("cannot start the writer thread: %s; tracing disabled", strerror(rc));
				close(fd);
				unlink(path);
				fd = -1;
				act_failed = 1;
			} else {
				writer_running = 1;
				pthread_setname_np(writer_tid, "sigmatrace-wr");
				install_signals();
				__atomic_store_n(&st_active, 1, __ATOMIC_RELEASE);
			}
		}
	}
	pthread_mutex_unlock(&act_lock);
	errno = saved;
}

/* ---- side channel ----------------------------------------------------------------- */

uint64_t st_side_add(uint16_t kind, const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen)
{
	size_t len = alen + blen + clen;
	size_t need = sizeof(struct st_side_header) + ((len + 7) & ~(size_t)7);
	st_ensure_active();
	if (!st_active || !side_buf || need > SIDE_CAP || len > UINT32_MAX) {
		__atomic_fetch_add(&dropped_side_bytes, len, __ATOMIC_RELAXED);
		return 0;
	}
	int saved = errno;
	for (int tries = 0;; tries++) {
		pthread_mutex_lock(&side_lock);
		if (side_len + need <= SIDE_CAP)
			break;
		pthread_mutex_unlock(&side_lock);
		if (tries > 1000 || closed) {
			__atomic_fetch_add(&dropped_side_bytes, len, __ATOMIC_RELAXED);
			errno = saved;
			return 0;
		}
		st_writer_kick();
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	uint64_t id = next_side_id++;
	struct st_side_header h = {.side_id = id, .length = (uint32_t)len, .kind = kind, .flags = 0};
	unsigned char *p = side_buf + side_len;
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	if (alen)
		memcpy(p, a, alen);
	if (blen)
		memcpy(p + alen, b, blen);
	if (clen)
		memcpy(p + alen + blen, c, clen);
	memset(p + len, 0, need - sizeof(h) - len);
	side_len += need;
	side_count++;
	int kick = side_len > SIDE_CAP / 2;
	pthread_mutex_unlock(&side_lock);
	if (kick)
		st_writer_kick();
	errno = saved;
	return id;
}

/* ---- final pass ---------------------------------------------------------------------- */

static void final_pass(const char *reason, int sig, int have_lock)
{
	if (!have_lock)
		io_lock();
	if (closed) {
		io_unlock();
		return;
	}
	uint32_t n = __atomic_load_n(&nthreads, __ATOMIC_ACQUIRE);
	uint64_t dropped = total_dropped_reclaimed;
	uint32_t live = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct st_thread *t = __atomic_load_n(&threads[i], __ATOMIC_ACQUIRE);
		if (!t)
			continue;
		drain_thread(i, 1, 1);
		dropped += t->dropped_total;
		live++;
	}
	drain_side(sig == 0);
	if (!tsc_hz_refined && have_calib_start) {
		estimate_tsc_hz();
		tsc_hz_refined = 1;
		write_process_header(); /* the last PROCESS chunk of a uid is authoritative */
	} else if (header_dirty) {
		write_process_header();
	}
	write_calibration(ST_CALIB_END);

	struct st_json j;
	char buf[8192];
	st_json_init(&j, buf, sizeof(buf));
	st_json_open(&j, NULL, '{');
	st_json_str(&j, "reason", reason);
	if (sig)
		st_json_int(&j, "signal", sig);
	else
		st_json_null(&j, "signal");
	st_json_uint(&j, "events", total_events);
	st_json_uint(&j, "dropped_events", dropped);
	st_json_uint(&j, "dropped_side_bytes", dropped_side_bytes);
	st_json_uint(&j, "chunks_written", chunks_written + 1);
	st_json_uint(&j, "threads", threads_seen);
	st_json_open(&j, "thread_drops", '{');
	for (uint32_t i = 0; i < n; i++) {
		struct st_thread *t = __atomic_load_n(&threads[i], __ATOMIC_ACQUIRE);
		if (t && t->dropped_total) {
			char k[16];
			snprintf(k, sizeof(k), "%u", t->index);
			st_json_uint(&j, k, t->dropped_total);
		}
	}
	st_json_close(&j, '}');
	st_json_close(&j, '}');
	write_json_chunk(ST_CHUNK_END, 0, &j);
	__atomic_store_n(&closed, 1, __ATOMIC_RELEASE);
	(void)live;
	io_unlock();
	st_writer_kick(); /* let the writer see `closed` and exit */
}

void st_flush_all(const char *reason, int sig)
{
	if (!__atomic_load_n(&st_active, __ATOMIC_ACQUIRE) || getpid() != owner_pid || closed)
		return;
	final_pass(reason, sig, 0);
}

/* atexit / destructor / _exit: this thread's buffers first, then the rest. */
ST_HIDDEN void st_process_exit(const char *reason)
{
	if (!__atomic_load_n(&st_active, __ATOMIC_ACQUIRE) || getpid() != owner_pid || closed)
		return;
	st_thread_exit_current();
	final_pass(reason, 0, 0);
	if (writer_running) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 2;
		if (pthread_timedjoin_np(writer_tid, NULL, &ts) == 0)
			writer_running = 0;
	}
	if (fd >= 0) {
		close(fd);
		fd = -1;
	}
}

/* ---- load time, fork ---------------------------------------------------------------- */

static int env_int(const char *const *names)
{
	for (; *names; names++) {
		const char *v = getenv(*names);
		if (v && *v) {
			char *end;
			long x = strtol(v, &end, 10);
			if (!*end && x >= 0 && x < INT_MAX)
				return (int)x;
		}
	}
	return -1;
}

ST_HIDDEN void st_writer_init(void)
{
	static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK", NULL};
	static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
						 "SLURM_LOCALID", "LOCAL_RANK", NULL};
	static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", NULL};
	rank = env_int(rank_vars);
	local_rank = env_int(local_vars);
	world_size = env_int(size_vars);
	if (getenv("OMPI_COMM_WORLD_RANK"))
		strcpy(launcher, "mpirun");
	else if (getenv("PMI_RANK") || getenv("PMIX_RANK"))
		strcpy(launcher, "mpiexec");
	else if (getenv("SLURM_PROCID"))
		strcpy(launcher, "srun");
	else if (getenv("TORCHELASTIC_RUN_ID") || (getenv("RANK") && getenv("LOCAL_RANK")))
		strcpy(launcher, "torchrun");
	else if (st_cfg.launcher[0])
		strcpy(launcher, st_cfg.launcher);
	if (gethostname(host, sizeof(host) - 1) != 0)
		strcpy(host, "unknown");
	st_calibrate(&calib_start, ST_CALIB_START);
	have_calib_start = 1;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	start_realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&act_lock);
	pthread_mutex_lock(&side_lock);
	pthread_mutex_lock(&reg_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&reg_lock);
	pthread_mutex_unlock(&side_lock);
	pthread_mutex_unlock(&act_lock);
}

ST_HIDDEN void st_buffer_atfork_child(void);

/* The child: no writer thread, the parent's buffers are the parent's.  It
 * starts afresh (new process_uid, own file) on its first event. */
static void atfork_child(void)
{
	pthread_mutex_init(&reg_lock, NULL);
	pthread_mutex_init(&side_lock, NULL);
	pthread_mutex_init(&act_lock, NULL);
	pthread_mutex_init(&ident_lock, NULL);
	int was_active = st_active;
	st_active = 0;
	act_failed = 0;
	closed = 0;
	io_owner = 0;
	writer_running = 0;
	if (fd >= 0)
		close(fd);
	fd = -1;
	for (uint32_t i = 0; i < nthreads; i++) {
		struct st_thread *t = threads[i];
		if (t && t != st_tls_self)
			munmap(t, t->map_bytes);
		threads[i] = NULL;
	}
	struct st_thread *me = st_tls_self;
	st_buffer_atfork_child();
	if (me)
		munmap(me, me->map_bytes);
	nthreads = 0;
	next_thread_index = 1;
	total_events = total_dropped_reclaimed = chunks_written = dropped_side_bytes = 0;
	threads_seen = 0;
	side_len = side_count = 0;
	next_side_id = 1;
	tsc_hz_refined = 0;
	st_calibrate(&calib_start, ST_CALIB_START);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	start_realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	for (int s = 1; s < 65; s++)
		if (sig_installed[s]) {
			sigaction(s, &old_act[s], NULL);
			sig_installed[s] = 0;
		}
	if (was_active && st_cfg.eager)
		st_activate();
}

ST_HIDDEN void st_writer_register_atfork(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
