/*
 * What the in-process writer (writer.c, lifecycle.c) and the consumer process
 * (consumer/consumer.c) both write, defined once: whole writes of a chunk's
 * pieces and the END record's JSON (docs/format.md).  Async-signal-safe: the
 * final pass may run in a fatal-signal handler.
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "core.h"

/* A short writev goes on from where it stopped, EINTR is retried; any other
 * error is the caller's (the chunk is then not counted as written). */
int st_writev_all(int fd, const struct iovec *iov, int n)
{
	struct iovec v[ST_WRITEV_MAX];
	if (n < 0 || n > ST_WRITEV_MAX)
		return -1;
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

/* The decimal digits of v (async-signal-safe, unlike snprintf). */
static void utoa(char *out, uint64_t v)
{
	char tmp[24];
	int n = 0;
	do
		tmp[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < 23);
	for (int i = 0; i < n; i++)
		out[i] = tmp[n - 1 - i];
	out[n] = 0;
}

void st_end_record_json(struct st_json *j, const struct st_end_facts *f, struct st_thread *(*thread_at)(uint32_t),
			uint32_t nthreads)
{
	st_json_str(j, "reason", f->reason);
	if (f->signal)
		st_json_int(j, "signal", f->signal);
	else
		st_json_null(j, "signal");
	st_json_uint(j, "events", f->events);
	st_json_uint(j, "dropped_events", f->dropped_events);
	st_json_uint(j, "dropped_side_bytes", f->dropped_side_bytes);
	st_json_uint(j, "dropped_side_records", f->dropped_side_records);
	st_json_uint(j, "chunks_written", f->chunks_written);
	st_json_uint(j, "threads", f->threads);
	st_json_open(j, "object_ids", '{');
	st_json_uint(j, "live", f->obj.live);
	st_json_uint(j, "peak", f->obj.peak);
	st_json_uint(j, "capacity", f->obj.capacity);
	st_json_uint(j, "unmapped", f->obj.unmapped);
	st_json_uint(j, "first_seen_on_use", f->obj.first_seen_on_use);
	st_json_close(j, '}');
	st_json_open(j, "thread_drops", '{');
	for (uint32_t i = 0; i < nthreads; i++) {
		struct st_thread *t = thread_at(i);
		if (t && t->dropped_total) {
			char k[24];
			utoa(k, t->index);
			st_json_uint(j, k, t->dropped_total);
		}
	}
	st_json_close(j, '}');
	/* runs of idle polls still open on threads that outlive the END record: their calls after the first
	 * (a racy read of a running thread's counter; the first call of each run is in the trace) */
	st_json_open(j, "open_idle_polls", '{');
	for (uint32_t i = 0; i < nthreads; i++) {
		struct st_thread *t = thread_at(i);
		uint64_t polls = 0;
		for (uint32_t r = 0; t && r < ST_IDLE_RUNS; r++)
			polls += __atomic_load_n(&t->idle[r].polls, __ATOMIC_RELAXED);
		if (polls) {
			char k[24];
			utoa(k, t->index);
			st_json_uint(j, k, polls);
		}
	}
	st_json_close(j, '}');
}
