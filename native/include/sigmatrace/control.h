/*
 * sigmatrace control API.  Optional: programs that want to annotate their
 * trace call these; without the tracer preloaded, resolve them weakly:
 *
 *     #pragma weak sigmatrace_mark
 *     if (sigmatrace_mark) sigmatrace_mark("phase 2");
 */
#ifndef SIGMATRACE_CONTROL_H
#define SIGMATRACE_CONTROL_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this process is recording (its trace file exists). */
int sigmatrace_active(void);
/* A MARK event with the text as a side STRING record (starts recording). */
void sigmatrace_mark(const char *text);
/* Ask the writer to write what it has now (asynchronous, returns at once). */
void sigmatrace_flush(void);
#ifdef __cplusplus
}
#endif
#endif /* SIGMATRACE_CONTROL_H */
