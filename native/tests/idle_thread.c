/*
 * Preloaded by benchmarks/bench_tracer.py into an untraced program: one idle
 * thread, started from a constructor with every signal blocked, that never
 * runs.  It makes the program multi-threaded and nothing else, so the
 * benchmark can show what being multi-threaded alone costs a program (glibc
 * takes its single-threaded fast paths, e.g. for mutexes, only while a
 * process has one thread) next to what the tracer costs.
 *
 *   cc -shared -fPIC -o idle_thread.so idle_thread.c -lpthread
 */
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

__attribute__((constructor)) static void start_idle_thread(void)
{
	sigset_t all, old;
	pthread_t t;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&t, NULL, idle, NULL) == 0)
		pthread_detach(t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}
