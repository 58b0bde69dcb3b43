/*
 * The consumer-process writer (SIGMATRACE_WRITER=process): the memory the
 * traced process shares with its consumer (docs/tracer.md, "Consumer
 * process").
 *
 * One memfd per traced process.  At offset 0 the control block (this
 * struct), then regions the tracer carves out as it needs them: the side ring
 * of the application threads, one region per recording thread (its struct
 * st_thread, aggregate table and chunk ring: the same layout as the
 * in-process writer's), one per poller side lane.  Both processes map every
 * region themselves (at addresses of their own), so nothing shared holds a
 * pointer: regions are named by their file offset.  The traced process only
 * ever writes records into this memory and wakes the consumer (a futex on
 * wseq); every byte of the trace file is written by the consumer, so a
 * SIGKILL of the traced process loses nothing that was committed, and a
 * consumer that dies leaves the program running (its rings fill, events are
 * counted as drops, and a new consumer is started at the end to write them
 * out and the END chunk).
 */
#ifndef ST_SHM_H
#define ST_SHM_H

#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "core.h"

#define ST_SHM_MAGIC 0x4d485354u /* "STHM" */
#define ST_SHM_VERSION 1u
#define ST_SHM_MAX_THREADS 4096
#define ST_SHM_MAX_LANES 256
#define ST_SHM_HEADER_MAX 65536

/* A single-producer byte ring of side records (side.c): a poller's lane, or
 * the application threads' shared ring (producers serialised by the tracer's
 * side mutex).  head and tail count bytes since the ring was opened; a record
 * never wraps: at the end the producer leaves fewer than 16 bytes (skipped)
 * or a header with side_id 0 (skip to the start). */
struct st_side_lane {
	unsigned char *buf; /* the tracer's mapping (the consumer maps off itself) */
	uint32_t cap;       /* bytes, multiple of 8 */
	uint32_t state;     /* atomic: LANE_* (side.c) */
	uint64_t head;      /* producer; published with release */
	uint64_t tail;      /* consumer; published with release */
	uint64_t off;       /* region in the memfd (process writer) */
};

/* Reading a lane, the one rule for both of its consumers (the io lock holder,
 * core/side.c, and the consumer process): the bytes from tail to head of the
 * ring at buf, as runs of whole records, each up to the ring's end, handed to
 * emit (how many records, their bytes); fewer than a header's bytes before the
 * end, or a header with side_id 0, skip to the start.  Returns the new tail
 * (published by the caller). */
static inline uint64_t st_lane_read(const struct st_side_lane *l, const unsigned char *buf, uint64_t tail,
				    uint64_t head, void (*emit)(uint32_t count, const unsigned char *p, uint32_t bytes))
{
	while (tail < head) {
		uint32_t off = (uint32_t)(tail % l->cap), room = l->cap - off;
		struct st_side_header h;
		if (room < sizeof(h)) {
			tail += room;
			continue;
		}
		memcpy(&h, buf + off, sizeof(h));
		if (!h.side_id) {
			tail += room;
			continue;
		}
		uint32_t k = 0, bytes = 0;
		while (tail + bytes < head && bytes + sizeof(h) <= room) {
			memcpy(&h, buf + off + bytes, sizeof(h));
			if (!h.side_id)
				break;
			bytes += (uint32_t)(sizeof(h) + ((h.length + 7u) & ~7u));
			k++;
		}
		emit(k, buf + off, bytes);
		tail += bytes;
	}
	return tail;
}

enum { ST_SLOT_EMPTY = 0, ST_SLOT_LIVE = 1, ST_SLOT_RECLAIMED = 2 };
struct st_shm_slot {
	uint64_t off;   /* region of the thread's struct st_thread */
	uint64_t bytes; /* its size */
	uint32_t state; /* atomic: ST_SLOT_* */
	uint32_t pad;
};

struct st_shm_ctl {
	uint32_t magic, version;
	uint64_t ctl_bytes;
	struct st_config cfg; /* the traced process's configuration */
	int32_t owner_pid;
	uint32_t have_calib_start;
	uint64_t trace_uid;
	struct st_calibration calib_start;

	/* wake-up: the consumer sleeps on wseq (a shared futex) */
	uint32_t wseq, wsleeping;
	int32_t consumer_pid; /* the running consumer (0: none yet) */
	int32_t spawned_pid;  /* written by the intermediate (pwrite): the consumer it started */
	uint32_t pad0;
	uint32_t consumer_ready; /* the consumer has mapped the block */

	/* the end: the traced process asks, the consumer writes it and says done */
	uint32_t end_req;  /* 1: write everything and END */
	int32_t end_signal;
	char end_reason[16];
	uint32_t end_done; /* futex word: END written (or the trace closed) */
	uint64_t dropped_side_bytes, dropped_side_records; /* at the end request */
	struct st_obj_stats obj;                           /* at the end request */

	/* the PROCESS header text (built by the traced process; the consumer puts
	 * in its tsc_hz): seqlock, odd while it is written */
	uint32_t hdr_seq;
	uint32_t hdr_len;
	char hdr[ST_SHM_HEADER_MAX];

	/* side records */
	struct st_side_lane side; /* the application threads' ring */
	uint32_t nlanes;          /* high-water mark of lanes[] (atomic) */
	uint32_t pad1;
	struct st_side_lane lanes[ST_SHM_MAX_LANES];

	/* recording threads */
	uint32_t nslots; /* high-water mark (atomic) */
	uint32_t pad2;
	struct st_shm_slot slots[ST_SHM_MAX_THREADS];

	/* the consumer's own progress, here so that a consumer started after the
	 * first one died continues where it stopped */
	uint64_t total_events, dropped_reclaimed, chunks_written;
	uint32_t threads_seen, trace_closed;
	uint32_t hdr_written_seq; /* the header text last written */
	uint32_t calib_start_written;
	uint64_t file_good; /* bytes of the file that are whole chunks: a consumer killed mid-write left a torn
			     * chunk past it, which the next one cuts off (the chunk is still FULL: written again) */
};

#endif /* ST_SHM_H */
