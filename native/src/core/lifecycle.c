/*
 * The trace's lifecycle in a process: activation, the end, fork.
 *
 *  - activation (first recorded event, or SIGMATRACE_EAGER=1): create the
 *    file safely (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), start the writer thread,
 *    install fatal-signal handlers;
 *  - exit (atexit / destructor / _exit), fatal signals: one final pass writes
 *    everything committed, an END calibration and the END chunk;
 *  - fork: the child starts afresh (new process_uid, own file) on its first
 *    event.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "procwriter.h"
#include "writer_internal.h"

void st_publish_header(void) ST_HIDDEN;
void st_side_use_shared(struct st_side_lane *shared, uint32_t *n) ST_HIDDEN;
void st_publish_header_atfork_child(void) ST_HIDDEN;

int st_active;
static pthread_mutex_t act_lock = PTHREAD_MUTEX_INITIALIZER;
static int act_failed;
static char path[PATH_MAX];
static pthread_t writer_tid;
static int writer_running;

static struct sigaction old_act[65];
static int sig_installed[65];
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTERM, SIGINT, SIGQUIT, SIGHUP};

/* ---- signals ----------------------------------------------------------------- */

static void final_pass(const char *reason, int sig, int have_lock, int safe);

static void on_signal(int sig, siginfo_t *si, void *uctx)
{
	int saved = errno;
	struct sigaction *old = &old_act[sig];
	int chain = !(old->sa_flags & SA_SIGINFO) ? (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) : 1;
	if (chain) {
		/* Someone else handles this signal (UCX, a runtime...): write what
		 * we have without closing the file, then let them decide (the
		 * consumer process's writer: everything is in shared memory already,
		 * the consumer is only woken). */
		if (st_shm)
			st_writer_kick();
		else if (st_io_trylock_bounded() == 0) {
			if (!st_trace_closed) {
				uint32_t n = __atomic_load_n(&st_nthreads, __ATOMIC_ACQUIRE);
				for (uint32_t i = 0; i < n; i++)
					st_drain_thread(i, 1, 0);
				st_drain_lanes(1);
				st_drain_side(ST_LOCK_BOUNDED);
			}
			st_io_unlock();
		}
		errno = saved;
		if (old->sa_flags & SA_SIGINFO)
			old->sa_sigaction(sig, si, uctx);
		else
			old->sa_handler(sig);
		return;
	}
	if (st_shm) {
		if (getpid() == st_owner_pid && !st_trace_closed)
			st_pw_end("signal", sig);
	} else if (getpid() == st_owner_pid && st_io_trylock_bounded() == 0)
		final_pass("signal", sig, 1, 1);
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
	snprintf(h, sizeof(h), "%s", st_cfg.node_id[0] ? st_cfg.node_id : st_host);
	sanitize(h);
	if (st_rank >= 0)
		snprintf(r, sizeof(r), "r%d", st_rank);
	else
		snprintf(r, sizeof(r), "r-");
	if (mkdirs(st_cfg.output_dir) != 0) {
		st_warn("cannot create output directory %s: %s; tracing disabled", st_cfg.output_dir, strerror(errno));
		return -1;
	}
	for (int attempt = 0; attempt < 8; attempt++) {
		snprintf(path, sizeof(path), "%s/%s.%d.%s.%016llx.trace", st_cfg.output_dir, h, (int)getpid(), r,
			 (unsigned long long)st_trace_uid);
		st_trace_fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (st_trace_fd >= 0)
			return 0;
		if (errno != EEXIST)
			break;
		st_trace_uid = random_uid();
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
		st_owner_pid = getpid();
		st_trace_uid = random_uid();
		if (!st_side_buf) {
			/* two halves: one fills while the writer writes the other */
			size_t cap = (size_t)st_cfg.side_kb * 1024;
			void *m = mmap(NULL, 2 * cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (m == MAP_FAILED)
				m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			else
				st_side_spare = (unsigned char *)m + cap;
			st_side_buf = (m == MAP_FAILED) ? NULL : m;
			st_side_cap = st_side_buf ? cap : 0;
		}
		if (open_output() != 0) {
			act_failed = 1;
		} else if (st_pw_wanted() && st_pw_activate(st_trace_fd) == 0) {
			/* the consumer process writes the file: no thread here */
			st_side_use_shared(st_shm->lanes, &st_shm->nlanes);
			__atomic_store_n(&st_active, 1, __ATOMIC_RELEASE);
			st_publish_header();
			install_signals();
		} else {
			/* the writer must never receive the program's signals */
			sigset_t all, old;
			sigfillset(&all);
			pthread_sigmask(SIG_SETMASK, &all, &old);
			int rc = pthread_create(&writer_tid, NULL, st_writer_main, NULL);
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			if (rc != 0) {
				st_warn("cannot start the writer thread: %s; tracing disabled", strerror(rc));
				close(st_trace_fd);
				unlink(path);
				st_trace_fd = -1;
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

/* ---- final pass ---------------------------------------------------------------------- */


static struct st_thread *thread_slot(uint32_t i)
{
	return __atomic_load_n(&st_threads[i], __ATOMIC_ACQUIRE);
}

/* Everything committed, an END calibration and the END chunk.  safe: the
 * fatal-signal and _exit paths, which may run in a signal handler that
 * interrupted a thread holding any of the tracer's locks: every lock is only
 * tried, for a bounded time (the io lock: never when this thread holds it),
 * and what stays behind a lock that could not be had is counted lost. */
static void final_pass(const char *reason, int sig, int have_lock, int safe)
{
	if (!have_lock) {
		if (safe) {
			if (st_io_trylock_bounded() != 0)
				return; /* the file keeps what the writer flushed (no END) */
		} else
			st_io_lock();
	}
	if (st_trace_closed) {
		st_io_unlock();
		return;
	}
	uint32_t n = __atomic_load_n(&st_nthreads, __ATOMIC_ACQUIRE);
	uint64_t dropped = st_total_dropped_reclaimed;
	for (uint32_t i = 0; i < n; i++) {
		struct st_thread *t = __atomic_load_n(&st_threads[i], __ATOMIC_ACQUIRE);
		if (!t)
			continue;
		st_drain_thread(i, 1, 1);
		dropped += t->dropped_total;
	}
	st_drain_lanes(1);
	int how = safe ? ST_LOCK_BOUNDED : ST_LOCK_WAIT;
	if (!st_drain_side(how)) {
		/* the side lock is held (by the thread we interrupted): its buffer is lost (a racy read, the
		 * process is ending) */
		__atomic_fetch_add(&st_dropped_side_records, st_side_count, __ATOMIC_RELAXED);
		__atomic_fetch_add(&st_dropped_side_bytes, st_side_len, __ATOMIC_RELAXED);
	}
	if (!st_tsc_hz_refined && st_have_calib_start) {
		st_estimate_tsc_hz();
		st_tsc_hz_refined = 1;
		st_write_process_header(how); /* the last PROCESS chunk of a uid is authoritative */
	} else if (st_header_dirty) {
		st_write_process_header(how);
	}
	st_write_calibration(ST_CALIB_END);

	struct st_json j;
	char buf[8192];
	st_json_begin_object(&j, buf, sizeof(buf));
	struct st_end_facts f = {reason, sig, st_total_events, dropped,
				 __atomic_load_n(&st_dropped_side_bytes, __ATOMIC_RELAXED),
				 __atomic_load_n(&st_dropped_side_records, __ATOMIC_RELAXED), st_chunks_written + 1,
				 st_threads_seen, {0}};
	st_obj_stats(&f.obj);
	st_end_record_json(&j, &f, thread_slot, n);
	st_json_close(&j, '}');
	st_write_json_chunk(ST_CHUNK_END, 0, &j);
	__atomic_store_n(&st_trace_closed, 1, __ATOMIC_RELEASE);
	st_io_unlock();
	st_writer_kick(); /* let the writer see `closed` and exit */
}

static int eager_pending; /* a fork child of an eager process: activate at exit if nothing did before */

static int owns_trace(void)
{
	return __atomic_load_n(&st_active, __ATOMIC_ACQUIRE) && getpid() == st_owner_pid && !st_trace_closed;
}


/* atexit / destructor: this thread's buffers first, then the rest; the
 * writer is given a moment to finish (bounded). */
ST_HIDDEN void st_process_exit(const char *reason)
{
	if (eager_pending && !__atomic_load_n(&st_active, __ATOMIC_ACQUIRE)) {
		eager_pending = 0;
		st_activate(); /* SIGMATRACE_EAGER in a fork child that recorded nothing: its file (header, END) */
	}
	if (!owns_trace())
		return;
	st_thread_exit_current();
	if (st_shm) {
		st_pw_end(reason, 0);
		if (st_trace_fd >= 0) {
			close(st_trace_fd);
			st_trace_fd = -1;
		}
		return;
	}
	final_pass(reason, 0, 0, 0);
	if (writer_running) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 2;
		if (pthread_timedjoin_np(writer_tid, NULL, &ts) == 0)
			writer_running = 0;
	}
	if (st_trace_fd >= 0) {
		close(st_trace_fd);
		st_trace_fd = -1;
	}
}

/* _exit, possibly from a signal handler: async-signal-safe.  The calling
 * thread's ring is read as it stands (its committed records; handing its
 * chunks over could race with the code the handler interrupted), no join
 * (the process ends with this call), bounded tries of every lock. */
ST_HIDDEN void st_process_exit_safe(const char *reason)
{
	if (!owns_trace())
		return;
	if (st_shm) {
		st_pw_end(reason, 0);
		return;
	}
	final_pass(reason, 0, 0, 1);
}

/* exec replaces the image without atexit: an open trace ends here (END,
 * reason "exec"), async-signal-safe as exec is.  1 if it was ended. */
ST_HIDDEN int st_process_exec(void)
{
	if (!owns_trace())
		return 0;
	if (st_shm)
		st_pw_end("exec", 0);
	else
		final_pass("exec", 0, 0, 1);
	return 1;
}

/* ---- fork ------------------------------------------------------------------------- */

/* Every mutex of the tracer that a fork child may need is held across the
 * fork (prepare: in rank order, the order in which the code nests them;
 * parent: released; child: made new), so a child never inherits one that
 * another thread held at the fork.  The core's locks are registered here, the
 * providers' from their constructors (st_fork_guard).  The hijack's lock has
 * its own handlers, registered later, so they run first: hijack_lock is
 * taken before all of these, as the code nests it. */
#define MAX_FORK_GUARDS 16
static struct {
	pthread_mutex_t *m;
	unsigned rank;
} guards[MAX_FORK_GUARDS];
static unsigned nguards;

void st_fork_guard(pthread_mutex_t *m, unsigned rank)
{
	unsigned n = __atomic_load_n(&nguards, __ATOMIC_ACQUIRE);
	if (n == MAX_FORK_GUARDS)
		return;
	unsigned i = n;
	while (i > 0 && guards[i - 1].rank > rank) { /* kept sorted by rank */
		guards[i] = guards[i - 1];
		i--;
	}
	guards[i].m = m;
	guards[i].rank = rank;
	__atomic_store_n(&nguards, n + 1, __ATOMIC_RELEASE);
}

static void atfork_prepare(void)
{
	for (unsigned i = 0; i < nguards; i++)
		pthread_mutex_lock(guards[i].m);
}

static void atfork_parent(void)
{
	for (unsigned i = nguards; i-- > 0;)
		pthread_mutex_unlock(guards[i].m);
}

ST_HIDDEN void st_buffer_atfork_child(void);

/* The child: no writer thread, the parent's buffers are the parent's.  It
 * starts afresh (new process_uid, own file) on its first event. */
static void atfork_child(void)
{
	for (unsigned i = 0; i < nguards; i++)
		pthread_mutex_init(guards[i].m, NULL);
	st_objmap_atfork_child();
	int was_pw = st_shm != NULL;
	st_pw_atfork_child(); /* the consumer process's writer: the shared regions were not inherited */
	st_publish_header_atfork_child();
	/* SIGMATRACE_EAGER: the child's file is made on its first event or at its
	 * exit, not here: a child that execs (a shell, subprocess) would leave
	 * a file without END (exec skips atexit), and an atfork child handler
	 * of a multi-threaded parent should not open files and start threads */
	eager_pending = st_active && st_cfg.eager;
	st_active = 0;
	act_failed = 0;
	st_trace_closed = 0;
	st_io_owner = 0;
	writer_running = 0;
	if (st_trace_fd >= 0)
		close(st_trace_fd);
	st_trace_fd = -1;
	for (uint32_t i = 0; i < st_nthreads; i++) {
		struct st_thread *t = st_threads[i];
		if (t && t != st_tls_self)
			munmap(t, t->map_bytes);
		st_threads[i] = NULL;
	}
	struct st_thread *me = st_tls_self;
	st_buffer_atfork_child();
	if (me && !was_pw)
		munmap(me, me->map_bytes);
	st_nthreads = 0;
	st_next_thread_index = 1;
	st_total_events = st_total_dropped_reclaimed = st_chunks_written = st_dropped_side_bytes = 0;
	st_dropped_side_records = 0;
	st_side_atfork_child();
	st_threads_seen = 0;
	st_side_len = st_side_count = 0;
	st_next_side_id = 1;
	st_tsc_hz_refined = 0;
	st_calibrate(&st_calib_start, ST_CALIB_START);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	st_start_realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	for (int s = 1; s < 65; s++)
		if (sig_installed[s]) {
			sigaction(s, &old_act[s], NULL);
			sig_installed[s] = 0;
		}
}

ST_HIDDEN void st_writer_register_atfork(void)
{
	st_fork_guard(&act_lock, ST_FORK_RANK_ACTIVATION);
	st_fork_guard(&st_side_lock, ST_FORK_RANK_SIDE);
	st_fork_guard(&st_thread_reg_lock, ST_FORK_RANK_THREADS);
	st_fork_guard(&st_ident_lock, ST_FORK_RANK_IDENTITY);
	st_fork_guard(&st_objmap_lock, ST_FORK_RANK_OBJMAP);
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
