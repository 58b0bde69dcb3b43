/* tracer_sigexit -- a signal handler that calls _exit while the interrupted
 * thread holds one of the tracer's locks (issue 12 finding 3).
 *
 *   tracer_sigexit --loop side|header --after-us N [--threads T]
 *
 * Opens the first (emulated) RDMA device, arms a one-shot timer whose SIGALRM
 * goes to the main thread (timer_create + SIGEV_THREAD_ID) after N us, and
 * loops until it fires:
 *   side    mlx5dv_devx_general_cmd with 60 KiB input and output mailboxes:
 *           the traced call copies both into a side record, under the side
 *           lock, most of the time the loop runs;
 *   header  ibv_open_device / ibv_close_device: each open publishes the NIC
 *           list (the process header's identity lock) and marks the header
 *           for rewriting.
 * --threads T adds T-1 threads running the same loop (with SIGALRM blocked),
 * so other threads hold the locks too.  The handler calls _exit(7): the
 * tracer's _exit path must end the trace without waiting for a lock the
 * interrupted thread holds (it would wait forever).  Prints "ARMED" first.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#define MBOX (60 * 1024)

static struct ibv_device *g_dev;
static struct ibv_context *g_ctx;
static int g_header;
static volatile sig_atomic_t g_stop;

static void on_alarm(int sig)
{
	(void)sig;
	_exit(7);
}

static void one_round(unsigned char *in, unsigned char *out)
{
	if (g_header) {
		struct ibv_context *c = ibv_open_device(g_dev);
		if (c)
			ibv_close_device(c);
	} else {
		/* an opcode the device refuses: the call (and its record) happens anyway */
		in[0] = 0x7f;
		in[1] = 0xf0;
		mlx5dv_devx_general_cmd(g_ctx, in, MBOX, out, MBOX);
	}
}

static void *worker(void *arg)
{
	(void)arg;
	unsigned char *in = calloc(1, MBOX), *out = calloc(1, MBOX);
	while (!g_stop)
		one_round(in, out);
	return NULL;
}

int main(int argc, char **argv)
{
	long after_us = 10000;
	int threads = 1;
	for (int i = 1; i + 1 < argc; i += 2) { /* --name value pairs */
		if (!strcmp(argv[i], "--loop"))
			g_header = !strcmp(argv[i + 1], "header");
		else if (!strcmp(argv[i], "--after-us"))
			after_us = atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else
			return 2;
	}
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("no device\n");
		return 2;
	}
	g_dev = list[0];
	g_ctx = ibv_open_device(g_dev);
	if (!g_ctx) {
		printf("open failed\n");
		return 2;
	}
	/* the other threads never take the signal */
	sigset_t alrm;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alrm, NULL);
	for (int i = 1; i < threads; i++) {
		pthread_t t;
		pthread_create(&t, NULL, worker, NULL);
	}
	pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	struct sigevent sev;
	memset(&sev, 0, sizeof sev);
	sev.sigev_notify = SIGEV_THREAD_ID;
	sev.sigev_signo = SIGALRM;
	sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
	timer_t tm;
	if (timer_create(CLOCK_MONOTONIC, &sev, &tm) != 0) {
		printf("timer_create: %s\n", strerror(errno));
		return 2;
	}
	struct itimerspec its = {{0, 0}, {after_us / 1000000, (after_us % 1000000) * 1000}};
	unsigned char *in = calloc(1, MBOX), *out = calloc(1, MBOX);
	printf("ARMED\n");
	fflush(stdout);
	timer_settime(tm, 0, &its, NULL);
	for (;;)
		one_round(in, out);
}
