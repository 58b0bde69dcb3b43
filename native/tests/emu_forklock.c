/* emu_forklock -- fork while another thread holds the tracer's locks
 * (issue 12 review d), on the emulated HCA.
 *
 *   emu_forklock [--forks N]
 *
 * Three threads allocate and deallocate PDs without pause (the tracer's
 * object-id table takes its lock for each), another opens and closes the
 * device (the ibv provider's lock, the identity lock), and one more drops a
 * reference to libc with dlclose (the tracer's dlclose looks for unloaded
 * objects with dl_iterate_phdr, whose loader lock glibc's fork does not
 * reset in the child).  The main thread forks N times; each child deallocates
 * a PD the parent made before the fork (the object-id lock again; the
 * emulated HCA takes no lock there, as rdma-core's mlx5 takes none), drops a
 * libc reference the same way (the loader's lock, and the tracer's walk) and
 * _exits.  A lock the child inherited locked would hang it: the parent gives
 * each child 10 s.
 * Prints "FORKLOCK forks=N ok=K" (exit 0 when every child exited in time).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NOLOAD */
#endif
#include <dlfcn.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static struct ibv_context *g_ctx;
static struct ibv_device *g_dev;
static volatile int g_stop;

/* a reference to libc taken and dropped: dlclose of an object that stays loaded */
static void drop_libc_reference(void)
{
	void *h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	if (h)
		dlclose(h);
}

static void *dlclose_churn(void *unused)
{
	while (!g_stop)
		drop_libc_reference();
	return NULL;
}

/* arg NULL: PDs made and freed; else device contexts opened and closed */
static void *churn(void *arg)
{
	while (!g_stop) {
		if (!arg) {
			struct ibv_pd *pd = ibv_alloc_pd(g_ctx);
			if (pd)
				ibv_dealloc_pd(pd);
		} else {
			struct ibv_context *c = ibv_open_device(g_dev);
			if (c)
				ibv_close_device(c);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int forks = 200;
	static struct option opts[] = {{"forks", required_argument, 0, 'f'}, {0, 0, 0, 0}};
	int ch;
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (ch == 'f')
			forks = atoi(optarg);
		else
			return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1 || !(g_ctx = ibv_open_device(list[0])))
		return 2;
	g_dev = list[0];
	pthread_t t[5];
	for (int k = 0; k < 4; k++)
		pthread_create(&t[k], NULL, churn, k == 3 ? (void *)g_dev : NULL);
	pthread_create(&t[4], NULL, dlclose_churn, NULL);
	int ok = 0;
	for (int i = 0; i < forks; i++) {
		struct ibv_pd *pd = ibv_alloc_pd(g_ctx);
		pid_t pid = fork();
		if (pid == 0) {
			ibv_dealloc_pd(pd);
			drop_libc_reference();
			_exit(0);
		}
		int status = 0, done = 0;
		for (int w = 0; w < 10000 && !done; w++) {
			pid_t r = waitpid(pid, &status, WNOHANG);
			if (r == pid)
				done = 1;
			else {
				struct timespec ts = {0, 1000000};
				nanosleep(&ts, NULL);
			}
		}
		if (!done) {
			printf("HUNG child %d (fork %d)\n", (int)pid, i);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			break;
		}
		ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
		ibv_dealloc_pd(pd);
	}
	g_stop = 1;
	for (int k = 0; k < 5; k++)
		pthread_join(t[k], NULL);
	printf("FORKLOCK forks=%d ok=%d\n", forks, ok);
	return ok == forks ? 0 : 1;
}
