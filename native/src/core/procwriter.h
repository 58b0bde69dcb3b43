/*
 * The traced process's half of the consumer-process writer
 * (SIGMATRACE_WRITER=process; procwriter.c, layout in shm.h).  Hidden; used
 * by the core only.
 */
#ifndef ST_PROCWRITER_H
#define ST_PROCWRITER_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h"

extern struct st_shm_ctl *st_shm ST_HIDDEN; /* non-NULL: this process's writer is a consumer process */

/* Whether to start a consumer (activation): asked for, or the default and no CUDA driver loaded. */
int st_pw_wanted(void) ST_HIDDEN;
/* Activation (act_lock held, trace file open): the memfd, the control block,
 * the consumer.  0 on success; -1: nothing changed (the caller starts the
 * writer thread instead). */
int st_pw_activate(int trace_fd) ST_HIDDEN;
/* A recording thread's region (thread_create): its slot, its mapping.  NULL
 * when none can be had (the thread records nothing, as a failed mmap). */
void *st_pw_thread_region(size_t bytes, uint32_t *index_out) ST_HIDDEN;
void st_pw_thread_gone(void *region, size_t bytes) ST_HIDDEN;
/* A region for a side lane; NULL on failure. */
void *st_pw_region(size_t bytes, uint64_t *off) ST_HIDDEN;
void st_pw_kick(void) ST_HIDDEN;
/* The consumer is known to be gone: block-policy waits give up at once. */
int st_pw_consumer_gone(void) ST_HIDDEN;
/* Publish the PROCESS header text (process.c builds it). */
void st_pw_publish_header(const char *json, size_t len) ST_HIDDEN;
/* The end (exit, _exit, exec, fatal signal): async-signal-safe, bounded. */
void st_pw_end(const char *reason, int sig) ST_HIDDEN;
void st_pw_atfork_child(void) ST_HIDDEN;
/* The consumer executable beside libsigmatrace.so (found at load). */
void st_pw_init(void) ST_HIDDEN;

#endif
