/*
 * sigmatrace-consumer: the writer of one traced process, as a process of its
 * own (SIGMATRACE_WRITER=process; docs/tracer.md "Consumer process", layout
 * in core/shm.h).
 *
 *   sigmatrace-consumer SHM_FD TRACE_FD PIDFD PID
 *
 * Started by the tracer (core/procwriter.c) with the traced process's memfd,
 * its trace file (already created, the PROCESS header not yet written) and a
 * pidfd of it (-1 where the kernel has none: then kill(PID, 0) is polled).
 * It does what the in-process writer thread does — full chunks as they are
 * handed over, partly filled ones every FLUSH_MS, side records, calibration
 * pairs every CALIB_MS, the PROCESS header when it changes — in the same
 * format (docs/format.md), and then either
 *   - the end the traced process asked for (exit, _exit, exec, a fatal
 *     signal): everything committed, the live aggregates, an END calibration
 *     and END; or
 *   - the traced process died without asking (SIGKILL): everything committed
 *     and the aggregates, no END (the reader: complete == False).
 * It never signals, waits for or blocks the traced process: the only shared
 * state is memory the traced process writes records into and this process
 * reads, plus the chunk states it hands back (FULL -> FREE).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/shm.h"

struct st_config st_cfg; /* the traced process's (clock.c, json.c use none of it) */

static struct st_shm_ctl *ctl;
static int shm_fd, trace_fd, pid_fd;
static pid_t pid;
static void *slot_map[ST_SHM_MAX_THREADS];
static uint64_t slot_off[ST_SHM_MAX_THREADS];
static unsigned char *lane_map[ST_SHM_MAX_LANES];
static unsigned char *side_map;
static double tsc_hz;

/* ---- chunk output ------------------------------------------------------------- */

static void write_chunk(uint16_t kind, uint32_t thread_index, uint32_t count, const void *p, size_t len)
{
	static const unsigned char zeros[8];
	if (ctl->trace_closed)
		return;
	size_t pad = (8 - (len & 7)) & 7;
	struct st_chunk_header h = {
		.magic = ST_FORMAT_MAGIC,
		.version = ST_FORMAT_VERSION,
		.kind = kind,
		.process_uid = ctl->trace_uid,
		.thread_index = thread_index,
		.payload_len = (uint32_t)(len + pad),
		.count = count,
	};
	uint32_t crc = st_crc32(0, &h, 28);
	if (len)
		crc = st_crc32(crc, p, len);
	if (pad)
		crc = st_crc32(crc, zeros, pad);
	h.crc32 = crc;
	if (st_cfg.test_writer_delay_ms && !__atomic_load_n(&ctl->end_req, __ATOMIC_ACQUIRE)) {
		/* test hook: a slow disk (the background rounds; never the end, as the writer thread's final pass) */
		struct timespec ts = {(time_t)(st_cfg.test_writer_delay_ms / 1000), (long)(st_cfg.test_writer_delay_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)p, len}, {(void *)zeros, pad}};
	if (st_writev_all(trace_fd, iov, 3) == 0) {
		ctl->chunks_written++;
		ctl->file_good += sizeof(h) + len + pad;
	}
}

static void write_json(uint16_t kind, uint32_t thread_index, const struct st_json *j)
{
	write_chunk(kind, thread_index, 0, j->buf, j->len);
}

static void write_calibration(uint32_t point)
{
	struct st_calibration c;
	st_calibrate(&c, point);
	write_chunk(ST_CHUNK_CALIBRATION, 0, 1, &c, sizeof(c));
}

static void estimate_tsc_hz(void)
{
	struct st_calibration now;
	st_calibrate(&now, ST_CALIB_PERIODIC);
	double hz = st_tsc_hz_estimate(&ctl->calib_start, &now);
	if (hz > 0)
		tsc_hz = hz;
}

/* ---- the PROCESS header: the traced process's text, this process's tsc_hz ---------- */

static char hdr[ST_SHM_HEADER_MAX + 64];

static void write_header(int force)
{
	uint32_t s = __atomic_load_n(&ctl->hdr_seq, __ATOMIC_ACQUIRE);
	if ((s & 1) || s == 0 || (!force && s == ctl->hdr_written_seq))
		return;
	uint32_t len = ctl->hdr_len;
	if (len > ST_SHM_HEADER_MAX)
		return;
	static char text[ST_SHM_HEADER_MAX + 1];
	memcpy(text, ctl->hdr, len);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(&ctl->hdr_seq, __ATOMIC_ACQUIRE) != s)
		return; /* being rewritten: next round */
	text[len] = 0;
	/* `,"tsc_hz":<number>`: the key occurs once outside strings (a quote inside a JSON string is escaped) */
	char *k = strstr(text, ",\"tsc_hz\":");
	size_t n;
	if (k) {
		char *v = k + strlen(",\"tsc_hz\":");
		char *e = v + strcspn(v, ",}");
		size_t pre = (size_t)(v - text);
		memcpy(hdr, text, pre);
		int w = snprintf(hdr + pre, 64, "%.17g", tsc_hz);
		n = pre + (size_t)w;
		size_t rest = len - (size_t)(e - text);
		memcpy(hdr + n, e, rest);
		n += rest;
	} else {
		memcpy(hdr, text, len);
		n = len;
	}
	write_chunk(ST_CHUNK_PROCESS, 0, 0, hdr, n);
	ctl->hdr_written_seq = s;
}

/* ---- threads ------------------------------------------------------------------------- */

static struct st_thread *thread_at(uint32_t slot)
{
	struct st_shm_slot *s = &ctl->slots[slot];
	if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != ST_SLOT_LIVE)
		return NULL;
	if (!slot_map[slot] || slot_off[slot] != s->off) {
		if (slot_map[slot])
			munmap(slot_map[slot], ctl->slots[slot].bytes);
		void *m = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, (off_t)s->off);
		slot_map[slot] = m == MAP_FAILED ? NULL : m;
		slot_off[slot] = s->off;
	}
	return slot_map[slot];
}

static uint64_t count_events(const struct st_event *e, uint32_t n)
{
	uint64_t k = 0;
	for (uint32_t i = 0; i < n; i++)
		k += e[i].type != ST_EV_EXT;
	return k;
}

static void describe(struct st_thread *t)
{
	struct st_json j;
	char buf[512];
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "thread_index", t->index);
	st_json_int(&j, "tid", t->tid);
	char name[sizeof(t->name) + 1];
	memcpy(name, t->name, sizeof(t->name));
	name[sizeof(t->name)] = 0;
	st_json_str(&j, "name", name);
	st_json_str(&j, "role", t->tid == ctl->owner_pid ? "main" : "app");
	st_json_close(&j, '}');
	write_json(ST_CHUNK_THREAD, t->index, &j);
	t->described = 1;
	ctl->threads_seen++;
}

static unsigned char *chunk_data(struct st_thread *t, uint32_t i)
{
	return (unsigned char *)t + t->data_off + (size_t)i * st_cfg.chunk_bytes;
}

static void write_records(struct st_thread *t, struct st_chunk *c, unsigned char *data, uint32_t from, uint32_t to)
{
	if (to <= from)
		return;
	if (c->kind == ST_CHUNK_AGGREGATE) {
		const struct st_aggregate *a = (const struct st_aggregate *)data;
		write_chunk(ST_CHUNK_AGGREGATE, t->index, to - from, a + from, (size_t)(to - from) * sizeof(*a));
	} else {
		const struct st_event *e = (const struct st_event *)data;
		write_chunk(ST_CHUNK_EVENTS, t->index, to - from, e + from, (size_t)(to - from) * sizeof(*e));
		ctl->total_events += count_events(e + from, to - from);
	}
}

static void write_live_aggregates(struct st_thread *t)
{
	if (!t->agg_off)
		return;
	static struct st_aggregate buf[512];
	const struct st_agg_entry *agg = (const struct st_agg_entry *)((unsigned char *)t + t->agg_off);
	uint32_t k = 0;
	for (uint32_t i = 0; i < ST_AGG_SLOTS; i++) {
		if (agg[i].a.count) {
			buf[k++] = agg[i].a;
			if (k == sizeof(buf) / sizeof(buf[0])) {
				write_chunk(ST_CHUNK_AGGREGATE, t->index, k, buf, k * sizeof(buf[0]));
				k = 0;
			}
		}
	}
	if (k)
		write_chunk(ST_CHUNK_AGGREGATE, t->index, k, buf, k * sizeof(buf[0]));
}

/* The same rules as the writer thread's st_drain_thread (core/writer.c). */
static void drain_thread(uint32_t slot, int partial, int final)
{
	struct st_thread *t = thread_at(slot);
	if (!t)
		return;
	if (!t->described)
		describe(t);
	int exited = __atomic_load_n(&t->exited, __ATOMIC_ACQUIRE);
	for (uint32_t guard = 0; guard < t->nchunks; guard++) {
		struct st_chunk *c = &t->chunks[t->writer_idx];
		if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != ST_CHUNK_FULL)
			break;
		write_records(t, c, chunk_data(t, t->writer_idx), c->flushed, c->count);
		c->flushed = 0;
		__atomic_store_n(&c->committed, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&c->state, ST_CHUNK_FREE, __ATOMIC_RELEASE);
		t->writer_idx = (t->writer_idx + 1) % t->nchunks;
	}
	if (exited && !final) {
		/* everything was handed over: the memory goes (the tracer may reuse the range) */
		ctl->dropped_reclaimed += t->dropped_total;
		struct st_shm_slot *s = &ctl->slots[slot];
		munmap(slot_map[slot], s->bytes);
		slot_map[slot] = NULL;
		fallocate(shm_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)s->off, (off_t)s->bytes);
		__atomic_store_n(&s->state, ST_SLOT_RECLAIMED, __ATOMIC_RELEASE);
		return;
	}
	if (exited)
		return;
	if (partial) {
		struct st_chunk *c = &t->chunks[t->writer_idx];
		uint32_t n = __atomic_load_n(&c->committed, __ATOMIC_ACQUIRE) / (uint32_t)sizeof(struct st_event);
		if (n > c->flushed && __atomic_load_n(&c->kind, __ATOMIC_RELAXED) == ST_CHUNK_EVENTS) {
			write_records(t, c, chunk_data(t, t->writer_idx), c->flushed, n);
			c->flushed = n;
		}
	}
	if (final)
		write_live_aggregates(t);
}

/* ---- side records (the rules of core/side.c st_drain_lanes) ------------------------------ */

static void write_side_run(uint32_t count, const unsigned char *p, uint32_t bytes)
{
	write_chunk(ST_CHUNK_SIDE, 0, count, p, bytes);
}

static void drain_lane(struct st_side_lane *l, const unsigned char *buf)
{
	uint64_t tail = st_lane_read(l, buf, l->tail, __atomic_load_n(&l->head, __ATOMIC_ACQUIRE), write_side_run);
	__atomic_store_n(&l->tail, tail, __ATOMIC_RELEASE);
}

static void drain_side(void)
{
	if (!side_map) {
		void *m = mmap(NULL, ctl->side.cap, PROT_READ, MAP_SHARED, shm_fd, (off_t)ctl->side.off);
		side_map = m == MAP_FAILED ? NULL : m;
	}
	if (side_map)
		drain_lane(&ctl->side, side_map);
	uint32_t n = __atomic_load_n(&ctl->nlanes, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n && i < ST_SHM_MAX_LANES; i++) {
		struct st_side_lane *l = &ctl->lanes[i];
		uint32_t state = __atomic_load_n(&l->state, __ATOMIC_ACQUIRE);
		if (state != 1 && state != 2) /* LANE_OPEN, LANE_EXITED (core/side.c) */
			continue;
		if (!lane_map[i]) {
			void *m = mmap(NULL, l->cap, PROT_READ, MAP_SHARED, shm_fd, (off_t)l->off);
			if (m == MAP_FAILED)
				continue;
			lane_map[i] = m;
		}
		drain_lane(l, lane_map[i]);
	}
}

static void drain_all(int partial, int final)
{
	uint32_t n = __atomic_load_n(&ctl->nslots, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n; i++)
		drain_thread(i, partial, final);
	drain_side();
	write_header(0);
}

/* ---- the end --------------------------------------------------------------------------------- */

static void write_end(void)
{
	drain_all(1, 1);
	estimate_tsc_hz();
	write_header(1); /* with the refined tsc_hz: the last PROCESS chunk of a uid is its header */
	write_calibration(ST_CALIB_END);
	uint32_t n = __atomic_load_n(&ctl->nslots, __ATOMIC_ACQUIRE);
	uint64_t dropped = ctl->dropped_reclaimed;
	for (uint32_t i = 0; i < n; i++) {
		struct st_thread *t = thread_at(i);
		if (t)
			dropped += t->dropped_total;
	}
	struct st_json j;
	static char buf[65536];
	st_json_begin_object(&j, buf, sizeof(buf));
	struct st_end_facts f = {ctl->end_reason, ctl->end_signal, ctl->total_events, dropped, ctl->dropped_side_bytes,
				 ctl->dropped_side_records, ctl->chunks_written + 1, ctl->threads_seen, ctl->obj};
	st_end_record_json(&j, &f, thread_at, n);
	st_json_close(&j, '}');
	write_json(ST_CHUNK_END, 0, &j);
	ctl->trace_closed = 1;
}

static int owner_gone(void)
{
	if (pid_fd >= 0) {
		struct pollfd p = {.fd = pid_fd, .events = POLLIN};
		return poll(&p, 1, 0) > 0;
	}
	return kill(pid, 0) != 0 && errno == ESRCH;
}

static void say_done(void)
{
	__atomic_store_n(&ctl->end_done, 1, __ATOMIC_RELEASE);
	syscall(SYS_futex, &ctl->end_done, FUTEX_WAKE, 64, NULL, NULL, 0);
}

int main(int argc, char **argv)
{
	if (argc != 5)
		return 2;
	shm_fd = atoi(argv[1]);
	trace_fd = atoi(argv[2]);
	pid_fd = atoi(argv[3]);
	pid = (pid_t)atoi(argv[4]);
	/* Its own process group, not its own session: a terminal's ^C, ^\\ or hang-up goes to the foreground
	 * group (the program, which then asks for its END) and `kill -- -PGID` of the program's group misses
	 * it.  Not setsid(): a new session is a new scheduler autogroup (CONFIG_SCHED_AUTOGROUP), and a group
	 * of one mostly sleeping task was measured runnable but unscheduled for seconds beside the program's
	 * busy threads (kernel 6.18, 2 cores), so its pollers' side lanes overflowed; in the program's
	 * session it is scheduled as the writer thread was (docs/tracer.md, "The process tree"). */
	setpgid(0, 0);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	signal(SIGQUIT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	struct st_shm_ctl probe;
	if (pread(shm_fd, &probe, sizeof(probe.magic) + sizeof(probe.version) + sizeof(probe.ctl_bytes), 0) <= 0)
		return 3;
	if (probe.magic != ST_SHM_MAGIC || probe.version != ST_SHM_VERSION)
		return 3;
	void *m = mmap(NULL, probe.ctl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
	if (m == MAP_FAILED)
		return 3;
	ctl = m;
	st_cfg = ctl->cfg;
	/* a consumer before this one may have died in the middle of a chunk */
	if (ftruncate(trace_fd, (off_t)ctl->file_good) != 0 || lseek(trace_fd, (off_t)ctl->file_good, SEEK_SET) < 0)
		return 3;
	__atomic_store_n(&ctl->consumer_pid, (int32_t)getpid(), __ATOMIC_RELEASE);

	/* the TSC rate from the traced process's load-time pair (at least 2 ms apart, as the writer thread) */
	struct st_calibration now;
	st_calibrate(&now, ST_CALIB_PERIODIC);
	if (now.monotonic_raw_ns < ctl->calib_start.monotonic_raw_ns + 2000000ull) {
		uint64_t left = ctl->calib_start.monotonic_raw_ns + 2000000ull - now.monotonic_raw_ns;
		struct timespec ts = {0, (long)(left > 2000000ull ? 2000000ull : left)};
		nanosleep(&ts, NULL);
	}
	estimate_tsc_hz();
	__atomic_store_n(&ctl->consumer_ready, 1, __ATOMIC_RELEASE);
	if (ctl->trace_closed) {
		say_done();
		return 0;
	}
	/* the header first (it may not be published yet: then on a later round) */
	for (int i = 0; i < 50 && !(__atomic_load_n(&ctl->hdr_seq, __ATOMIC_ACQUIRE) & ~1u); i++) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	write_header(1);
	if (ctl->have_calib_start && !ctl->calib_start_written) {
		write_chunk(ST_CHUNK_CALIBRATION, 0, 1, &ctl->calib_start, sizeof(ctl->calib_start));
		ctl->calib_start_written = 1;
	}

	uint64_t flush_ns = (uint64_t)st_cfg.flush_ms * 1000000ull, calib_ns = (uint64_t)st_cfg.calib_ms * 1000000ull;
	uint64_t next_flush = st_now_ns() + flush_ns, next_calib = st_now_ns() + calib_ns;
	uint32_t seen = __atomic_load_n(&ctl->wseq, __ATOMIC_SEQ_CST);
	for (;;) {
		if (__atomic_load_n(&ctl->end_req, __ATOMIC_ACQUIRE)) {
			write_end();
			say_done();
			break;
		}
		int gone = owner_gone();
		uint64_t t = st_now_ns();
		int partial = gone || t >= next_flush;
		drain_all(partial, gone);
		if (gone) {
			/* SIGKILL (or a death no handler saw): everything committed is written, no END; a request
			 * made just before the end is still honoured */
			if (__atomic_load_n(&ctl->end_req, __ATOMIC_ACQUIRE)) {
				write_end();
				say_done();
			}
			break;
		}
		if (partial)
			next_flush = t + flush_ns;
		if (t >= next_calib) {
			write_calibration(ST_CALIB_PERIODIC);
			next_calib = t + calib_ns;
		}
		__atomic_store_n(&ctl->wsleeping, 1, __ATOMIC_SEQ_CST);
		uint32_t s = __atomic_load_n(&ctl->wseq, __ATOMIC_SEQ_CST);
		if (s == seen && !__atomic_load_n(&ctl->end_req, __ATOMIC_ACQUIRE)) {
			t = st_now_ns();
			uint64_t dl = next_flush < next_calib ? next_flush : next_calib;
			uint64_t wait = dl > t ? dl - t : 0;
			if (wait > 50000000ull)
				wait = 50000000ull; /* the traced process's death is seen within 50 ms */
			if (wait) {
				struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
				syscall(SYS_futex, &ctl->wseq, FUTEX_WAIT, s, &ts, NULL, 0);
			}
		}
		__atomic_store_n(&ctl->wsleeping, 0, __ATOMIC_SEQ_CST);
		seen = __atomic_load_n(&ctl->wseq, __ATOMIC_SEQ_CST);
	}
	return 0;
}
