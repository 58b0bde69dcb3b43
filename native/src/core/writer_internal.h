/*
 * The trace file's state, shared by the files of the writer:
 *
 *   writer.c     the writer thread: io lock, chunk output, draining the
 *                threads' rings
 *   side.c       the side channel (st_side_add) and its draining
 *   process.c    the process identity: PROCESS header, calibration, rank
 *   lifecycle.c  activation, the final pass (exit, fatal signals), fork
 *
 * One process has one trace file and one writer, so this is plain global
 * state (hidden); who may touch what, and under which lock, is said at
 * each declaration.  Nothing here is for providers: they use core.h.
 */
#ifndef ST_WRITER_INTERNAL_H
#define ST_WRITER_INTERNAL_H

#include <limits.h>
#include <pthread.h>

#include "core.h"

#define ST_MAX_THREADS 4096

/* ---- the file (writer.c) ------------------------------------------------- */
extern int st_trace_fd ST_HIDDEN;       /* -1 until activation opens it */
extern uint64_t st_trace_uid ST_HIDDEN; /* process_uid in every chunk header */
extern pid_t st_owner_pid ST_HIDDEN;    /* the process the file belongs to (not a fork child) */
extern int st_trace_closed ST_HIDDEN;   /* END written; nothing more may be written */

/* Every chunk write happens under the io lock: a spin lock with an owner
 * (thread id, 0 = free), so the fatal-signal path can take it with a
 * bounded wait and never deadlock against itself. */
extern int st_io_owner ST_HIDDEN;
void st_io_lock(void) ST_HIDDEN;
int st_io_trylock_bounded(void) ST_HIDDEN; /* for signal handlers; -1 when we interrupted ourselves */
void st_io_unlock(void) ST_HIDDEN;
/* A mutex for at most ms milliseconds (trylock + sleeps; async-signal-safe):
 * 0 when taken.  For the signal and _exit paths, where the interrupted thread
 * may hold it. */
int st_mutex_lock_bounded(pthread_mutex_t *m, unsigned ms) ST_HIDDEN;
/* How the io lock holder takes the side and identity locks.  The writer only
 * tries (it must never wait for them while it holds the io lock: a signal
 * handler that interrupted their holder may be waiting for the io lock), the
 * signal and _exit paths try for a bounded time, the normal exit waits. */
enum st_lock_how { ST_LOCK_WAIT = 0, ST_LOCK_BOUNDED = 1, ST_LOCK_TRY = 2 };
int st_mutex_take(pthread_mutex_t *m, int how) ST_HIDDEN; /* 0 when taken */

/* io lock held */
void st_write_chunk(uint16_t kind, uint32_t thread_index, uint32_t count, const void *p, size_t len,
		    const void *p2, size_t len2) ST_HIDDEN;
void st_write_json_chunk(uint16_t kind, uint32_t thread_index, const struct st_json *j) ST_HIDDEN;

/* thread registry: slots written under st_thread_reg_lock, read lock-free */
extern struct st_thread *st_threads[ST_MAX_THREADS] ST_HIDDEN;
extern uint32_t st_nthreads ST_HIDDEN; /* slots in use (high-water mark) */
extern uint32_t st_next_thread_index ST_HIDDEN;
extern pthread_mutex_t st_thread_reg_lock ST_HIDDEN;
/* One thread's pending output (io lock held); 1 when its state was reclaimed. */
int st_drain_thread(uint32_t slot, int partial, int final) ST_HIDDEN;

/* totals for the END chunk */
extern uint64_t st_total_events ST_HIDDEN, st_total_dropped_reclaimed ST_HIDDEN, st_chunks_written ST_HIDDEN;
extern uint32_t st_threads_seen ST_HIDDEN;

void *st_writer_main(void *arg) ST_HIDDEN;

/* ---- side channel (side.c): the shared buffer under st_side_lock --------- */
extern pthread_mutex_t st_side_lock ST_HIDDEN;
extern unsigned char *st_side_buf ST_HIDDEN;   /* st_side_cap bytes, mapped at activation */
extern unsigned char *st_side_spare ST_HIDDEN; /* the other half: written out while the first fills */
extern size_t st_side_cap ST_HIDDEN;         /* SIGMATRACE_SIDE_KB */
extern size_t st_side_len ST_HIDDEN;
extern uint32_t st_side_count ST_HIDDEN;
extern uint64_t st_next_side_id ST_HIDDEN;         /* atomic */
extern uint64_t st_dropped_side_bytes ST_HIDDEN;   /* atomic */
extern uint64_t st_dropped_side_records ST_HIDDEN; /* atomic */
/* io lock held; how: enum st_lock_how.  0 if the side lock was not taken. */
int st_drain_side(int how) ST_HIDDEN;
/* io lock held: the private lanes (pollers); final: never frees one. */
void st_drain_lanes(int final) ST_HIDDEN;
void st_side_atfork_child(void) ST_HIDDEN;

/* ---- process identity (process.c) ----------------------------------------- */
extern struct st_calibration st_calib_start ST_HIDDEN; /* taken at load (and in a fork child) */
extern int st_have_calib_start ST_HIDDEN;
extern int st_tsc_hz_refined ST_HIDDEN; /* the final pass estimated the TSC rate again */
extern char st_host[256] ST_HIDDEN;
extern int st_rank ST_HIDDEN; /* -1: not launched as a rank */
extern uint64_t st_start_realtime_ns ST_HIDDEN;
extern int st_header_dirty ST_HIDDEN; /* NIC/GPU lists changed since the last PROCESS chunk */
extern pthread_mutex_t st_ident_lock ST_HIDDEN;
/* io lock held; how: enum st_lock_how (the identity lock).  Not taken: nothing
 * written (the header stays dirty). */
void st_write_process_header(int how) ST_HIDDEN;
void st_write_calibration(uint32_t point) ST_HIDDEN; /* io lock held */
void st_estimate_tsc_hz(void) ST_HIDDEN;

#endif /* ST_WRITER_INTERNAL_H */
