/* emu_forklock -- fork while another thread holds the tracer's locks
 * (issue 12 review d), on the emulated HCA.
 *
 *   emu_forklock [--forks N]
 *
 * Three threads allocate and deallocate PDs without pause (the tracer's
 * object-id table takes its lock for each), another opens and closes the
 * device (the ibv provider's lock, the identity lock).  The main thread forks
 * N times; each child deallocates a PD the parent made before the fork (the
 * object-id lock again, and no lock of the emulated HCA) and _exits.  A lock
 * the child inherited locked would hang it: the parent gives each child 10 s.
 * Prints "FORKLOCK forks=N ok=K" (exit 0 when every child exited in time).
 */
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
	pthread_t t[4];
	for (int k = 0; k < 4; k++)
		pthread_create(&t[k], NULL, churn, k == 3 ? (void *)g_dev : NULL);
	int ok = 0;
	for (int i = 0; i < forks; i++) {
		struct ibv_pd *pd = ibv_alloc_pd(g_ctx);
		pid_t pid = fork();
		if (pid == 0) {
			ibv_dealloc_pd(pd);
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
	for (int k = 0; k < 4; k++)
		pthread_join(t[k], NULL);
	printf("FORKLOCK forks=%d ok=%d\n", forks, ok);
	return ok == forks ? 0 : 1;
}
