/*
 * The process identity: the PROCESS header chunk (who wrote the trace, with
 * which options, on which NICs and GPUs) and the calibration pairs that map
 * the TSC to wall time.
 *
 * Rank, launcher and host are read once at load time (st_writer_init); the
 * NIC and GPU lists (and the libraries loaded but not traced,
 * interpose/libraries.c) arrive while the program runs and mark
 * the header dirty, so the writer writes it again (the last PROCESS chunk of
 * a process_uid is the authoritative one).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "procwriter.h"
#include "writer_internal.h"

#ifndef TRACER_VERSION
#define TRACER_VERSION "0.1.0"
#endif

struct st_calibration st_calib_start;
int st_have_calib_start;
static double tsc_hz;
int st_tsc_hz_refined;
char st_host[256];
int st_rank = -1;
static int local_rank = -1, world_size = -1;
static char launcher[32];
uint64_t st_start_realtime_ns;
static char nics_json[16384] = "[]";
static char gpus_json[16384] = "[]";
static char untraced_json[4096] = "[]"; /* ST_HEADER_UNTRACED_LIBRARIES (interpose/libraries.c) */
int st_header_dirty;
pthread_mutex_t st_ident_lock = PTHREAD_MUTEX_INITIALIZER;

/* scratch buffer: used only under io_lock */
static char jbuf[65536];

uint64_t st_process_uid(void)
{
	return st_trace_uid;
}

/* ---- process header ------------------------------------------------------ */

static void json_rank(struct st_json *j, const char *k, int v)
{
	if (v < 0)
		st_json_null(j, k);
	else
		st_json_int(j, k, v);
}

/* 0 when built; -1 when the identity lock could not be had (how: enum st_lock_how). */
static int build_process_header(struct st_json *j, int how)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;

	st_json_begin_object(j, jbuf, sizeof(jbuf));
	st_json_int(j, "format_version", ST_FORMAT_VERSION);
	st_json_hex(j, "process_uid", st_trace_uid);
	st_json_str(j, "tracer", "native");
	st_json_str(j, "tracer_version", TRACER_VERSION);
	st_json_str(j, "host", st_host);
	st_json_str(j, "node_id", st_cfg.node_id[0] ? st_cfg.node_id : st_host);
	st_json_int(j, "pid", st_owner_pid);
	st_json_int(j, "ppid", getppid());
	json_rank(j, "rank", st_rank);
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
	st_json_uint(j, "start_realtime_ns", st_start_realtime_ns);
	st_json_open(j, "options", '{');
	st_json_str(j, "mode", st_mode_name(st_cfg.mode));
	st_json_str(j, "output_dir", st_cfg.output_dir);
	st_json_uint(j, "buffer_kb", st_cfg.chunk_bytes / 1024);
	st_json_uint(j, "chunks", st_cfg.chunks);
	st_json_str(j, "drop_policy", st_cfg.drop_policy == ST_DROP_BLOCK ? "block" : "drop");
	st_json_str(j, "idle_polls", st_cfg.idle_polls_each ? "each" : "coalesce");
	st_json_uint(j, "batch_threshold", st_cfg.batch_threshold);
	st_json_uint(j, "flush_ms", st_cfg.flush_ms);
	st_json_uint(j, "calib_ms", st_cfg.calib_ms);
	st_json_bool(j, "signals", st_cfg.signals);
	st_json_str(j, "writer", st_shm ? "process" : "thread"); /* who wrote the file */
	st_json_close(j, '}');
	if (st_mutex_take(&st_ident_lock, how) != 0)
		return -1;
	st_json_raw(j, ",\"nics\":");
	st_json_raw(j, nics_json);
	st_json_raw(j, ",\"gpus\":");
	st_json_raw(j, gpus_json);
	st_json_raw(j, ",\"" ST_HEADER_UNTRACED_LIBRARIES "\":");
	st_json_raw(j, untraced_json);
	pthread_mutex_unlock(&st_ident_lock);
	j->need_comma = 1;
	st_json_close(j, '}');
	return 0;
}

/* how (enum st_lock_how): the identity lock may only be tried (the writer:
 * it retries on its next round; the fatal-signal and _exit paths, whose
 * interrupted thread may hold it: then no new header is written and the last
 * one written stays the process's header). */
void st_write_process_header(int how)
{
	struct st_json j;
	/* cleared before the lists are read: a change made meanwhile marks it again */
	__atomic_store_n(&st_header_dirty, 0, __ATOMIC_RELEASE);
	if (build_process_header(&j, how) != 0) {
		__atomic_store_n(&st_header_dirty, 1, __ATOMIC_RELEASE);
		return;
	}
	if (j.overflow) { /* never write broken JSON: drop the lists that made it too big */
		if (st_mutex_take(&st_ident_lock, how) != 0) {
			__atomic_store_n(&st_header_dirty, 1, __ATOMIC_RELEASE);
			return;
		}
		strcpy(nics_json, "[]");
		strcpy(gpus_json, "[]");
		pthread_mutex_unlock(&st_ident_lock);
		if (build_process_header(&j, how) != 0) {
			__atomic_store_n(&st_header_dirty, 1, __ATOMIC_RELEASE);
			return;
		}
	}
	st_write_json_chunk(ST_CHUNK_PROCESS, 0, &j);
}

/* The consumer process's writer: the header text is built here (the
 * process's own identity: /proc/self, its NIC and GPU lists) and published in
 * the shared block; the consumer writes it with its own tsc_hz estimate.
 * Serialised by pub_lock (jbuf). */
static pthread_mutex_t pub_lock = PTHREAD_MUTEX_INITIALIZER;
void st_publish_header(void)
{
	if (!st_shm)
		return;
	pthread_mutex_lock(&pub_lock);
	struct st_json j;
	__atomic_store_n(&st_header_dirty, 0, __ATOMIC_RELEASE);
	if (build_process_header(&j, ST_LOCK_WAIT) == 0) {
		if (j.overflow) {
			pthread_mutex_lock(&st_ident_lock);
			strcpy(nics_json, "[]");
			strcpy(gpus_json, "[]");
			pthread_mutex_unlock(&st_ident_lock);
			build_process_header(&j, ST_LOCK_WAIT);
		}
		if (!j.overflow)
			st_pw_publish_header(j.buf, j.len);
	}
	pthread_mutex_unlock(&pub_lock);
}

void st_publish_header_atfork_child(void)
{
	pthread_mutex_init(&pub_lock, NULL);
}

static void set_list(char *dst, size_t cap, const char *json_array)
{
	pthread_mutex_lock(&st_ident_lock);
	if (json_array && strlen(json_array) < cap && json_array[0] == '[')
		strcpy(dst, json_array);
	pthread_mutex_unlock(&st_ident_lock);
	__atomic_store_n(&st_header_dirty, 1, __ATOMIC_RELEASE);
	if (__atomic_load_n(&st_shm, __ATOMIC_ACQUIRE))
		st_publish_header();
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

void st_process_set_untraced(const char *json_array)
{
	set_list(untraced_json, sizeof(untraced_json), json_array);
}

void st_write_calibration(uint32_t point)
{
	struct st_calibration c;
	st_calibrate(&c, point);
	st_write_chunk(ST_CHUNK_CALIBRATION, 0, 1, &c, sizeof(c), NULL, 0);
}

void st_estimate_tsc_hz(void)
{
	struct st_calibration now;
	st_calibrate(&now, ST_CALIB_PERIODIC);
	double hz = st_tsc_hz_estimate(&st_calib_start, &now);
	if (hz > 0)
		tsc_hz = hz;
}

/* ---- load time: rank, launcher, host, start calibration -------------------------- */

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

/* Which launcher started this process, and the variables it gives its rank, local rank and world size
 * in.  The innermost launcher describes the process, so the order matters: torchrun's elastic agent
 * (TORCHELASTIC_RUN_ID, set for its workers only) spawns workers inside an srun task or an mpirun rank,
 * whose SLURM_* / OMPI_* variables the workers inherit and which describe the agent, not the worker;
 * mpirun inside a Slurm allocation likewise inherits the allocation's SLURM_*.  RANK and LOCAL_RANK
 * without TORCHELASTIC_RUN_ID (torchrun --standalone of old, torch.distributed.launch) still win over
 * Slurm's, which a job's every process inherits, but not over an MPI launcher's: scripts under mpirun
 * often export RANK themselves.  Each launcher's three values come from its own variables only. */
struct launcher_vars {
	const char *name;
	const char *const *detect; /* all set: this launcher (NULL-terminated) */
	const char *const *rank, *const *local, *const *size;
};

#define ST_VARS(...) ((const char *const[]){__VA_ARGS__, NULL})
static const struct launcher_vars launchers[] = {
	{"torchrun", ST_VARS("TORCHELASTIC_RUN_ID"), ST_VARS("RANK"), ST_VARS("LOCAL_RANK"), ST_VARS("WORLD_SIZE")},
	{"mpirun", ST_VARS("OMPI_COMM_WORLD_RANK"), ST_VARS("OMPI_COMM_WORLD_RANK"),
	 ST_VARS("OMPI_COMM_WORLD_LOCAL_RANK"), ST_VARS("OMPI_COMM_WORLD_SIZE")},
	/* a PMI/PMIx rank (MPICH's Hydra, srun --mpi=pmi2/pmix): the local rank and size, where the PMI
	 * gives none, are the Slurm task's, the same process */
	{"mpiexec", ST_VARS("PMI_RANK"), ST_VARS("PMI_RANK"), ST_VARS("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"),
	 ST_VARS("PMI_SIZE", "SLURM_NTASKS")},
	{"mpiexec", ST_VARS("PMIX_RANK"), ST_VARS("PMIX_RANK"), ST_VARS("PMI_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
	 ST_VARS("PMI_SIZE", "SLURM_NTASKS")},
	{"torchrun", ST_VARS("RANK", "LOCAL_RANK"), ST_VARS("RANK"), ST_VARS("LOCAL_RANK"), ST_VARS("WORLD_SIZE")},
	{"srun", ST_VARS("SLURM_PROCID"), ST_VARS("SLURM_PROCID"), ST_VARS("SLURM_LOCALID"), ST_VARS("SLURM_NTASKS")},
	/* none of them: whatever rank variable there is, under the launcher --launcher names */
	{NULL, ST_VARS(NULL), ST_VARS("RANK"), ST_VARS("LOCAL_RANK"), ST_VARS("WORLD_SIZE")},
};
#undef ST_VARS

static int all_set(const char *const *names)
{
	for (; *names; names++)
		if (!getenv(*names))
			return 0;
	return 1;
}

ST_HIDDEN void st_writer_init(void)
{
	const struct launcher_vars *l = launchers;
	while (!all_set(l->detect))
		l++;
	st_rank = env_int(l->rank);
	local_rank = env_int(l->local);
	world_size = env_int(l->size);
	if (l->name)
		strcpy(launcher, l->name);
	else if (st_cfg.launcher[0])
		strcpy(launcher, st_cfg.launcher);
	if (gethostname(st_host, sizeof(st_host) - 1) != 0)
		strcpy(st_host, "unknown");
	st_calibrate(&st_calib_start, ST_CALIB_START);
	st_have_calib_start = 1;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	st_start_realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
