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
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

#include "core.h"
#include "interpose/interpose.h"
#include "procwriter.h"

int st_initialized;

void st_writer_init(void) ST_HIDDEN;
void st_writer_register_atfork(void) ST_HIDDEN;
void st_process_exit(const char *reason) ST_HIDDEN;
void st_process_exit_safe(const char *reason) ST_HIDDEN;
int st_process_exec(void) ST_HIDDEN;
static void (*real_exit_fn)(int); /* resolved at load: never a dlsym in a signal handler */
/* the exec family, resolved at load for the same reason (exec is async-signal-safe) */
static int (*real_execve)(const char *, char *const[], char *const[]);
static int (*real_execv)(const char *, char *const[]);
static int (*real_execvp)(const char *, char *const[]);
static int (*real_execvpe)(const char *, char *const[], char *const[]);
static int (*real_fexecve)(int, char *const[], char *const[]);
static int (*real_execveat)(int, const char *, char *const[], char *const[], int);

static void at_exit(void)
{
	st_libraries_check(); /* a library loaded late and never called through a shim */
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
	st_pw_init();
	real_exit_fn = (void (*)(int))st_resolve_next("_exit");
	real_execve = (int (*)(const char *, char *const[], char *const[]))st_resolve_next("execve");
	real_execv = (int (*)(const char *, char *const[]))st_resolve_next("execv");
	real_execvp = (int (*)(const char *, char *const[]))st_resolve_next("execvp");
	real_execvpe = (int (*)(const char *, char *const[], char *const[]))st_resolve_next("execvpe");
	real_fexecve = (int (*)(int, char *const[], char *const[]))st_resolve_next("fexecve");
	real_execveat = (int (*)(int, const char *, char *const[], char *const[], int))st_resolve_next("execveat");
	atexit(at_exit);
	st_initialized = 1;
	if (st_cfg.enabled && st_cfg.eager)
		st_activate();
	errno = saved;
}

__attribute__((destructor(101))) static void st_dtor(void)
{
	st_libraries_check();
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

/* ---- exec ------------------------------------------------------------------
 * The new image starts without our atexit handlers: the trace of this image
 * ends before the call (END, reason "exec"; the new image, preloaded too,
 * writes a file of its own).  A failed exec leaves the trace closed: the
 * process records nothing more (said once on stderr).  execl, execlp and
 * execle are built on the vector forms. */
static void exec_failed(int ended)
{
	static int told;
	if (ended && !told) {
		told = 1;
		st_warn("exec failed after this process's trace was closed; pid %d records nothing more", (int)getpid());
	}
}

#define EXEC_BODY(real, name, call)                                                \
	do {                                                                       \
		int ended = st_process_exec();                                     \
		if (!(real)) /* called before our constructor ran */              \
			(real) = (__typeof__(real))st_resolve_next(name);          \
		if (!(real)) {                                                     \
			errno = ENOSYS;                                            \
			return -1;                                                 \
		}                                                                  \
		int r = call;                                                      \
		int saved = errno;                                                 \
		exec_failed(ended);                                                \
		errno = saved;                                                     \
		return r;                                                          \
	} while (0)

ST_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	EXEC_BODY(real_execve, "execve", real_execve(path, argv, envp));
}

ST_EXPORT int execv(const char *path, char *const argv[])
{
	EXEC_BODY(real_execv, "execv", real_execv(path, argv));
}

ST_EXPORT int execvp(const char *file, char *const argv[])
{
	EXEC_BODY(real_execvp, "execvp", real_execvp(file, argv));
}

ST_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	EXEC_BODY(real_execvpe, "execvpe", real_execvpe(file, argv, envp));
}

ST_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	EXEC_BODY(real_fexecve, "fexecve", real_fexecve(fd, argv, envp));
}

ST_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
	EXEC_BODY(real_execveat, "execveat", real_execveat(dirfd, path, argv, envp, flags));
}

/* The list forms: count the arguments, copy them into a vector on the stack. */
#define LIST_TO_ARGV(argv, arg0, ap, extra)                           \
	va_list ap;                                                   \
	size_t n_ = 1;                                                \
	va_start(ap, arg0);                                           \
	while (va_arg(ap, const char *))                              \
		n_++;                                                 \
	va_end(ap);                                                   \
	char *argv[n_ + 1];                                           \
	argv[0] = (char *)(arg0);                                     \
	va_start(ap, arg0);                                           \
	for (size_t i_ = 1; i_ <= n_; i_++)                           \
		argv[i_] = va_arg(ap, char *); /* the last is NULL */ \
	extra;                                                        \
	va_end(ap)

ST_EXPORT int execl(const char *path, const char *arg, ...)
{
	LIST_TO_ARGV(argv, arg, ap, (void)0);
	return execv(path, argv);
}

ST_EXPORT int execlp(const char *file, const char *arg, ...)
{
	LIST_TO_ARGV(argv, arg, ap, (void)0);
	return execvp(file, argv);
}

ST_EXPORT int execle(const char *path, const char *arg, ...)
{
	char *const *envp;
	LIST_TO_ARGV(argv, arg, ap, envp = va_arg(ap, char *const *));
	return execve(path, argv, envp);
}
