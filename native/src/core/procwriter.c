/*
 * The consumer-process writer, the traced process's half (SIGMATRACE_WRITER=
 * process; layout and rules in shm.h, design in docs/tracer.md).
 *
 *  - activation: a memfd holding the control block and the application
 *    threads' side ring; the consumer executable (sigmatrace-consumer, beside
 *    libsigmatrace.so) is started with the memfd, the trace file and a pidfd
 *    of this process;
 *  - the consumer is never this program's child: it is started by a
 *    short-lived intermediate made with a raw clone and no exit signal,
 *    which the tracer reaps by its pid with __WALL (no SIGCHLD reaches the
 *    program, and the program's wait(-1) cannot see it, since it has no exit
 *    signal); the consumer, orphaned, belongs to init (or to a subreaper);
 *  - the end: the request goes into the control block and the consumer
 *    writes it; the tracer waits a bounded time (a dead consumer is replaced
 *    once, so what the rings still hold and END are written).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "procwriter.h"
#include "writer_internal.h"

struct st_shm_ctl *st_shm;
static int shm_fd = -1, pid_fd = -1, trace_fd_ = -1;
static uint64_t next_off;
static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static void *slot_local[ST_SHM_MAX_THREADS]; /* this process's mapping of each live slot */
static uint32_t next_index = 1;
static int consumer_pid, consumer_pidfd = -1, gone, respawned;
static char exe_path[PATH_MAX];

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC 4
#endif

void st_pw_init(void)
{
	Dl_info info;
	if (dladdr((void *)st_pw_init, &info) && info.dli_fname) {
		const char *slash = strrchr(info.dli_fname, '/');
		size_t n = slash ? (size_t)(slash - info.dli_fname) : 0;
		if (n + sizeof("/sigmatrace-consumer") < sizeof(exe_path)) {
			memcpy(exe_path, info.dli_fname, n);
			strcpy(exe_path + n, slash ? "/sigmatrace-consumer" : "sigmatrace-consumer");
		}
	}
}

static size_t page_round(size_t n)
{
	return (n + 4095) & ~(size_t)4095;
}

/* A new region at the end of the memfd, mapped here (never into a fork child). */
static void *map_region(uint64_t off, size_t bytes)
{
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, (off_t)off);
	if (m == MAP_FAILED)
		return NULL;
	madvise(m, bytes, MADV_DONTFORK);
	return m;
}

static void *new_region(size_t bytes, uint64_t *off)
{
	bytes = page_round(bytes);
	uint64_t o = next_off;
	if (ftruncate(shm_fd, (off_t)(o + bytes)) != 0)
		return NULL;
	void *m = map_region(o, bytes);
	if (!m)
		return NULL;
	next_off = o + bytes;
	*off = o;
	return m;
}

void *st_pw_region(size_t bytes, uint64_t *off)
{
	int saved = errno;
	pthread_mutex_lock(&region_lock);
	void *m = new_region(bytes, off);
	pthread_mutex_unlock(&region_lock);
	errno = saved;
	return m;
}

void *st_pw_thread_region(size_t bytes, uint32_t *index_out)
{
	struct st_shm_ctl *c = st_shm;
	bytes = page_round(bytes);
	pthread_mutex_lock(&region_lock);
	uint32_t n = __atomic_load_n(&c->nslots, __ATOMIC_ACQUIRE), slot = ST_SHM_MAX_THREADS;
	void *m = NULL;
	for (uint32_t i = 0; i < n && slot == ST_SHM_MAX_THREADS; i++) {
		uint32_t s = __atomic_load_n(&c->slots[i].state, __ATOMIC_ACQUIRE);
		if (s == ST_SLOT_RECLAIMED && c->slots[i].bytes == bytes) {
			/* the consumer wrote it out and punched its pages: the same file range, fresh zero pages */
			m = map_region(c->slots[i].off, bytes);
			if (m) {
				slot = i;
				__atomic_store_n(&c->slots[i].state, ST_SLOT_EMPTY, __ATOMIC_RELEASE); /* taken */
			}
		}
	}
	if (slot == ST_SHM_MAX_THREADS && n < ST_SHM_MAX_THREADS) {
		uint64_t off;
		m = new_region(bytes, &off);
		if (m) {
			slot = n;
			c->slots[slot].off = off;
			c->slots[slot].bytes = bytes;
			__atomic_store_n(&c->nslots, n + 1, __ATOMIC_RELEASE); /* EMPTY until published: skipped */
		}
	}
	if (slot == ST_SHM_MAX_THREADS) {
		pthread_mutex_unlock(&region_lock);
		return NULL;
	}
	slot_local[slot] = m;
	*index_out = next_index++;
	pthread_mutex_unlock(&region_lock);
	return m;
}

/* The caller fills the region, then publishes it (release): see buffer.c. */
ST_HIDDEN void st_pw_thread_publish(void *region)
{
	struct st_shm_ctl *c = st_shm;
	pthread_mutex_lock(&region_lock);
	for (uint32_t i = 0; i < ST_SHM_MAX_THREADS; i++)
		if (slot_local[i] == region) {
			__atomic_store_n(&c->slots[i].state, ST_SLOT_LIVE, __ATOMIC_RELEASE);
			break;
		}
	pthread_mutex_unlock(&region_lock);
}

/* The thread handed everything over (exited is set): this process's mapping
 * goes; the consumer keeps its own until it has written the rest. */
void st_pw_thread_gone(void *region, size_t bytes)
{
	pthread_mutex_lock(&region_lock);
	for (uint32_t i = 0; i < ST_SHM_MAX_THREADS; i++)
		if (slot_local[i] == region) {
			slot_local[i] = NULL;
			break;
		}
	pthread_mutex_unlock(&region_lock);
	munmap(region, page_round(bytes));
}

void st_pw_kick(void)
{
	struct st_shm_ctl *c = st_shm;
	__atomic_fetch_add(&c->wseq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->wsleeping, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &c->wseq, FUTEX_WAKE, 1, NULL, NULL, 0); /* shared: the consumer is another process */
}

static int alive(int pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

int st_pw_consumer_gone(void)
{
	if (gone)
		return 1;
	int saved = errno;
	if (consumer_pidfd >= 0) {
		/* readable once it has exited, reaped or not (a container's init may never reap it) */
		struct pollfd p = {.fd = consumer_pidfd, .events = POLLIN};
		if (poll(&p, 1, 0) > 0)
			gone = 1;
	} else if (consumer_pid > 0 && !alive(consumer_pid))
		gone = 1;
	errno = saved;
	return gone;
}

/* ---- starting the consumer ------------------------------------------------------ */

struct spawn_args {
	int fds[3];
	char *argv[8];
	char bufs[5][24];
};

static void itoa_(char *out, long v)
{
	char tmp[24];
	int n = 0, neg = v < 0;
	unsigned long u = neg ? (unsigned long)-v : (unsigned long)v;
	do
		tmp[n++] = (char)('0' + u % 10);
	while ((u /= 10) && n < 22);
	int k = 0;
	if (neg)
		out[k++] = '-';
	while (n)
		out[k++] = tmp[--n];
	out[k] = 0;
}

/* The consumer itself, in the grandchild (a copy of this process, every
 * signal blocked): only system calls until execve. */
__attribute__((noreturn)) static void spawn_exec(struct spawn_args *a)
{
	static char *const envp[] = {NULL}; /* no LD_PRELOAD: the consumer is not traced */
	int null = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR);
	if (null >= 0) {
		/* never hold the program's pipes (a reader waiting for EOF would wait for the consumer) */
		for (int f = 0; f < 3; f++)
			if (null != f)
				syscall(SYS_dup3, null, f, 0);
	}
	for (int i = 0; i < 3; i++)
		if (a->fds[i] >= 0)
			syscall(SYS_fcntl, a->fds[i], F_SETFD, 0);
	/* every other descriptor of the program: closed at exec */
	int sorted[3] = {a->fds[0], a->fds[1], a->fds[2]};
	for (int i = 0; i < 3; i++)
		for (int j = i + 1; j < 3; j++)
			if (sorted[j] < sorted[i]) {
				int t = sorted[i];
				sorted[i] = sorted[j];
				sorted[j] = t;
			}
	int lo = 3;
	for (int i = 0; i < 3; i++) {
		if (sorted[i] < lo)
			continue;
		if (sorted[i] > lo)
			syscall(436 /* close_range */, lo, sorted[i] - 1, CLOSE_RANGE_CLOEXEC);
		lo = sorted[i] + 1;
	}
	syscall(436 /* close_range */, lo, ~0u, CLOSE_RANGE_CLOEXEC);
	/* the mask (all blocked) goes through exec: the consumer unblocks what it wants */
	syscall(SYS_execve, a->argv[0], a->argv, envp);
	syscall(SYS_exit_group, 127);
	__builtin_unreachable();
}

static struct spawn_args spawn_buf; /* static: may run in a signal handler (no large stack frame) */

/* Raw clone system calls, not fork/vfork/clone/posix_spawn: no atfork handler
 * of the program runs, the intermediate has no exit signal (no SIGCHLD, and
 * the program's wait(-1) cannot reap it), and a sanitizer runtime that
 * intercepts those functions never sees a "fork" (ThreadSanitizer would
 * then refuse new threads in the program).  The price: the intermediate is
 * a copy-on-write copy of this process (page tables, once per activation). */
static int spawn_consumer(void)
{
	if (!exe_path[0] || shm_fd < 0)
		return -1;
	struct spawn_args *a = &spawn_buf;
	memset(a, 0, sizeof(*a));
	a->fds[0] = shm_fd;
	a->fds[1] = trace_fd_;
	a->fds[2] = pid_fd;
	a->argv[0] = exe_path;
	itoa_(a->bufs[0], shm_fd);
	itoa_(a->bufs[1], trace_fd_);
	itoa_(a->bufs[2], pid_fd);
	itoa_(a->bufs[3], (long)getpid());
	for (int i = 0; i < 4; i++)
		a->argv[i + 1] = a->bufs[i];
	a->argv[5] = NULL;
	if (access(exe_path, X_OK) != 0)
		return -1;
	int32_t zero = 0;
	if (pwrite(shm_fd, &zero, sizeof(zero), offsetof(struct st_shm_ctl, spawned_pid)) != sizeof(zero))
		return -1;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old); /* no handler of the program may run in the children */
	long mid = syscall(SYS_clone, 0L /* exit signal: none */, 0L, 0L, 0L, 0L);
	if (mid == 0) {
		long g = syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L);
		if (g == 0)
			spawn_exec(a);
		int32_t gp = (int32_t)g;
		if (g > 0) /* the parent learns the consumer's pid through the memfd (its mapping is not here) */
			syscall(SYS_pwrite64, shm_fd, &gp, sizeof(gp), (long)offsetof(struct st_shm_ctl, spawned_pid));
		syscall(SYS_exit_group, g > 0 ? 0 : 1);
	}
	int saved = errno;
	int status = -1;
	if (mid > 0) {
		while (waitpid((pid_t)mid, &status, __WALL) < 0 && errno == EINTR)
			;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = saved;
	int32_t g = __atomic_load_n(&st_shm->spawned_pid, __ATOMIC_ACQUIRE);
	if (mid <= 0 || status != 0 || g <= 0)
		return -1;
	consumer_pid = g;
	if (consumer_pidfd >= 0)
		close(consumer_pidfd);
	consumer_pidfd = (int)syscall(434 /* pidfd_open */, consumer_pid, 0);
	if (consumer_pidfd >= 0)
		fcntl(consumer_pidfd, F_SETFD, FD_CLOEXEC);
	gone = 0;
	return 0;
}

/* The consumer has mapped the block (it says so in consumer_pid): 0; -1 when
 * it died first (it could not be executed) or took more than ~2 s. */
static int consumer_started(void)
{
	uint64_t deadline = 0;
	for (unsigned i = 0;; i++) {
		if (__atomic_load_n(&st_shm->consumer_pid, __ATOMIC_ACQUIRE) == consumer_pid)
			return 0;
		if (st_pw_consumer_gone())
			return -1;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t now = (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
		if (!deadline)
			deadline = now + 2000;
		else if (now >= deadline)
			return -1;
		struct timespec nap = {0, i < 100 ? 50000 : 1000000};
		nanosleep(&nap, NULL);
	}
}

/* ---- activation ---------------------------------------------------------------------- */

static int cuda_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	const char *path = info->dlpi_name, *b = path ? strrchr(path, '/') : NULL;
	b = b ? b + 1 : path;
	if (b && !strncmp(b, "libcuda.so", 10)) {
		*(int *)arg = 1;
		return 1;
	}
	return 0;
}

/* Whether this process's trace is written by a consumer process: asked for
 * (SIGMATRACE_WRITER=process), or by default unless the CUDA driver is
 * already loaded.  A GPU process has the driver's threads (and the hijack's
 * pollers) anyway, so the consumer saves it no thread, and its start -- a
 * copy-on-write clone of the whole process, the driver's device mappings
 * included -- has not been validated on a GPU machine yet (docs/tracer.md). */
int st_pw_wanted(void)
{
	if (st_cfg.writer_process != 2)
		return st_cfg.writer_process == 1;
	int cuda = 0;
	dl_iterate_phdr(cuda_cb, &cuda);
	return !cuda;
}

int st_pw_activate(int trace_fd)
{
	if (!exe_path[0] || access(exe_path, X_OK) != 0) {
		if (st_cfg.writer_process == 1)
			st_warn("SIGMATRACE_WRITER=process: no consumer executable beside the library (%s); using the writer thread",
				exe_path[0] ? exe_path : "?");
		return -1;
	}
	int fd = (int)syscall(SYS_memfd_create, "sigmatrace", 1u /* MFD_CLOEXEC */);
	if (fd < 0)
		goto fail;
	size_t ctl_bytes = page_round(sizeof(struct st_shm_ctl));
	size_t side_cap = ((size_t)st_cfg.side_kb * 1024) & ~(size_t)7;
	if (ftruncate(fd, (off_t)(ctl_bytes + page_round(side_cap))) != 0) {
		close(fd);
		goto fail;
	}
	shm_fd = fd;
	struct st_shm_ctl *c = map_region(0, ctl_bytes);
	unsigned char *side = c ? map_region(ctl_bytes, page_round(side_cap)) : NULL;
	if (!c || !side) {
		if (c)
			munmap(c, ctl_bytes);
		close(fd);
		shm_fd = -1;
		goto fail;
	}
	next_off = ctl_bytes + page_round(side_cap);
	c->magic = ST_SHM_MAGIC;
	c->version = ST_SHM_VERSION;
	c->ctl_bytes = ctl_bytes;
	c->cfg = st_cfg;
	c->owner_pid = st_owner_pid;
	c->trace_uid = st_trace_uid;
	c->calib_start = st_calib_start;
	c->have_calib_start = (uint32_t)st_have_calib_start;
	c->side.buf = side;
	c->side.cap = (uint32_t)side_cap;
	c->side.off = ctl_bytes;
	c->side.state = 1; /* LANE_OPEN */
	trace_fd_ = trace_fd;
	pid_fd = (int)syscall(434 /* pidfd_open */, getpid(), 0);
	if (pid_fd >= 0)
		fcntl(pid_fd, F_SETFD, FD_CLOEXEC);
	st_shm = c;
	if (spawn_consumer() != 0 || consumer_started() != 0) {
		if (st_cfg.writer_process == 1)
			st_warn("SIGMATRACE_WRITER=process: cannot start %s; using the writer thread", exe_path);
		/* one that comes up late must never write beside the writer thread */
		__atomic_store_n(&c->trace_closed, 1, __ATOMIC_RELEASE);
		if (consumer_pidfd >= 0) {
			syscall(424 /* pidfd_send_signal */, consumer_pidfd, SIGKILL, NULL, 0);
			close(consumer_pidfd);
			consumer_pidfd = -1;
		}
		consumer_pid = 0;
		st_shm = NULL;
		munmap(side, page_round(side_cap));
		munmap(c, ctl_bytes);
		close(fd);
		shm_fd = -1;
		if (pid_fd >= 0)
			close(pid_fd);
		pid_fd = -1;
		return -1;
	}
	return 0;
fail:
	if (st_cfg.writer_process == 1)
		st_warn("SIGMATRACE_WRITER=process: no shared memory (%s); using the writer thread", strerror(errno));
	return -1;
}

/* ---- header --------------------------------------------------------------------------- */

void st_pw_publish_header(const char *json, size_t len)
{
	struct st_shm_ctl *c = st_shm;
	if (!c || len > ST_SHM_HEADER_MAX)
		return;
	uint32_t s = __atomic_load_n(&c->hdr_seq, __ATOMIC_RELAXED);
	__atomic_store_n(&c->hdr_seq, s + 1, __ATOMIC_RELAXED); /* odd: being written */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memcpy(c->hdr, json, len);
	c->hdr_len = (uint32_t)len;
	__atomic_store_n(&c->hdr_seq, s + 2, __ATOMIC_RELEASE);
	st_pw_kick();
}

/* ---- the end ------------------------------------------------------------------------------ */

static void nap_ms(long ms)
{
	struct timespec ts = {0, ms * 1000000L};
	nanosleep(&ts, NULL);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void st_pw_end(const char *reason, int sig)
{
	struct st_shm_ctl *c = st_shm;
	if (!c)
		return;
	int saved = errno;
	c->dropped_side_bytes = __atomic_load_n(&st_dropped_side_bytes, __ATOMIC_RELAXED);
	c->dropped_side_records = __atomic_load_n(&st_dropped_side_records, __ATOMIC_RELAXED);
	st_obj_stats(&c->obj);
	size_t n = strlen(reason);
	if (n >= sizeof(c->end_reason))
		n = sizeof(c->end_reason) - 1;
	memcpy(c->end_reason, reason, n);
	c->end_reason[n] = 0;
	c->end_signal = sig;
	__atomic_store_n(&c->end_req, 1, __ATOMIC_RELEASE);
	st_pw_kick();
	/* bounded: a consumer that is gone is replaced once; one that is alive is
	 * waited for while it makes progress (the file grows), at most ~2 s
	 * without any (the file keeps what it wrote, and the consumer still
	 * writes the END it was asked for when it gets there) */
	uint64_t deadline = mono_ms() + 2000, good = __atomic_load_n(&c->file_good, __ATOMIC_ACQUIRE);
	while (!__atomic_load_n(&c->end_done, __ATOMIC_ACQUIRE)) {
		uint64_t g = __atomic_load_n(&c->file_good, __ATOMIC_ACQUIRE);
		if (g != good) {
			good = g;
			deadline = mono_ms() + 2000;
		}
		if (mono_ms() >= deadline)
			break;
		if (st_pw_consumer_gone()) {
			if (respawned)
				break;
			respawned = 1;
			if (spawn_consumer() != 0)
				break;
			deadline = mono_ms() + 2000;
		}
		struct timespec ts = {0, 2000000};
		syscall(SYS_futex, &c->end_done, FUTEX_WAIT, 0, &ts, NULL, 0);
	}
	(void)nap_ms;
	st_trace_closed = 1;
	errno = saved;
}

/* ---- fork ------------------------------------------------------------------------------------ */

/* The child: the regions were not inherited (MADV_DONTFORK), the descriptors
 * are the parent's; it starts afresh (own memfd, own consumer) on its first
 * event. */
void st_pw_atfork_child(void)
{
	if (!st_shm)
		return;
	st_shm = NULL;
	if (shm_fd >= 0)
		close(shm_fd);
	if (pid_fd >= 0)
		close(pid_fd);
	if (consumer_pidfd >= 0)
		close(consumer_pidfd);
	shm_fd = pid_fd = consumer_pidfd = -1;
	trace_fd_ = -1; /* closed by the caller (st_trace_fd) */
	next_off = 0;
	memset(slot_local, 0, sizeof(slot_local));
	next_index = 1;
	consumer_pid = 0;
	gone = respawned = 0;
	pthread_mutex_init(&region_lock, NULL);
}
