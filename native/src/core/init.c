/*
 * Load-time initialisation and process lifecycle hooks.
 *
 * The constructor only reads the configuration and takes the START
 * calibration pair; no file, no thread.  Recording starts on the first
 * event (st_activate), so programs that never touch a traced library run
 * exactly as without the tracer and leave no file (SIGMATRACE_EAGER=1
 * changes that).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "core.h"
#include "interpose/interpose.h"

int st_initialized;

void st_writer_init(void) ST_HIDDEN;
void st_writer_register_atfork(void) ST_HIDDEN;
void st_process_exit(const char *reason) ST_HIDDEN;
void st_process_exit_safe(const char *reason) ST_HIDDEN;
static void (*real_exit_fn)(int); /* resolved at load: never a dlsym in a signal handler */

static void at_exit(void)
{
	st_process_exit("exit");
}

__attribute__((constructor(101))) static void st_ctor(void)
{
	st_init();
}

void st_init(void)
{
	if (st_initialized)
		return;
	int saved = errno;
	st_config_load();
	st_interpose_init();
	st_writer_init();
	st_writer_register_atfork();
	real_exit_fn = (void (*)(int))st_resolve_next("_exit");
	atexit(at_exit);
	st_initialized = 1;
	if (st_cfg.enabled && st_cfg.eager)
		st_activate();
	errno = saved;
}

__attribute__((destructor(101))) static void st_dtor(void)
{
	st_process_exit("exit");
}

/* ---- fork / _exit ------------------------------------------------------- */

ST_EXPORT pid_t fork(void)
{
	static pid_t (*real)(void);
	if (!real)
		real = (pid_t(*)(void))st_resolve_next("fork");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	pid_t pid = real();
	if (pid > 0 && __atomic_load_n(&st_active, __ATOMIC_ACQUIRE)) {
		int saved = errno;
		st_ev(ST_EV_FORK, 0, (uint32_t)pid, 0);
		errno = saved;
	}
	return pid;
}

/* A process that leaves with _exit() skips atexit handlers: write the END
 * chunk anyway (only in the process that owns the trace: a vfork child
 * shares our memory and must not touch it).  _exit is async-signal-safe and
 * programs call it from signal handlers, so this path is too: bounded tries
 * of every lock (st_process_exit_safe), the real _exit resolved at load. */
ST_EXPORT void _exit(int status)
{
	st_process_exit_safe("exit");
	if (real_exit_fn)
		real_exit_fn(status);
	syscall(231 /* exit_group */, status);
	__builtin_unreachable();
}
