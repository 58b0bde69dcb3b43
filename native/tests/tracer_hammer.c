/*
 * Test and benchmark client for the tracer: several threads hammer a cheap
 * wrapped call, fi_cq_read() on an empty CQ (an inline call through the CQ's
 * ops table, so it exercises the ops-table path).
 *
 *   tracer_hammer [-p PROV] [-t THREADS] [-n CALLS] [-a ACTION] [-k AFTER]
 *
 * ACTION (what the main thread does after AFTER calls of thread 0, or at the end):
 *   none      exit normally (default)
 *   segv      dereference NULL
 *   abort     abort()
 *   sleep     print "ready" and sleep (the test sends SIGKILL/SIGTERM)
 *   fork      fork(); the child does CALLS calls on a new CQ and exits
 *   time      print "ns_per_call <x>" (1 thread) and "ns_per_rdtsc <y>", the machine's own
 *             cost of the timestamp the recorder takes (a loop of rdtsc): both the best of 5
 *             repetitions of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time the
 *             thread spends preempted by other programs on a shared machine is not counted;
 *             "background_ns_per_call <z>": CPU time of the other threads (the tracer's writer)
 *             per call over the same 5 repetitions
 *
 * -D resets SIGSEGV/SIGBUS/SIGABRT/SIGTERM/SIGINT to SIG_DFL after fi_getinfo
 * (some libfabric providers, e.g. psm2, install their own crash handlers
 * that print a backtrace and exit(1); -D checks the tracer's own path).
 * -i starts an idle extra thread first: a process with one thread gets
 * glibc's single-threaded fast paths (mutexes ~3x cheaper), which the
 * tracer's writer thread takes away; -i puts the untraced baseline on the
 * same footing so `time` isolates the recording cost itself.
 *
 * Prints "calls <total>" (calls issued by all threads) on stdout.
 */
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static long ncalls = 100000;
static long after = -1;
static const char *action = "none";
static volatile long progress0;

static struct fid_cq *open_cq(void)
{
	struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 64, .wait_obj = FI_WAIT_NONE};
	struct fid_cq *cq;
	int r = fi_cq_open(domain, &attr, &cq, NULL);
	if (r) {
		fprintf(stderr, "fi_cq_open: %s\n", fi_strerror(-r));
		exit(2);
	}
	return cq;
}

static void hammer(struct fid_cq *cq, long n, int idx)
{
	struct fi_cq_entry e[4];
	for (long i = 0; i < n; i++) {
		ssize_t r = fi_cq_read(cq, e, 4);
		if (r != -FI_EAGAIN) {
			fprintf(stderr, "unexpected fi_cq_read result %zd\n", r);
			exit(3);
		}
		if (idx == 0)
			progress0 = i + 1;
	}
}

static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static void *worker(void *arg)
{
	int idx = (int)(long)arg;
	struct fid_cq *cq = open_cq();
	hammer(cq, ncalls, idx);
	fi_close(&cq->fid);
	return NULL;
}

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* CPU time of the whole process: what the other threads (the tracer's writer) spent. */
static double process_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* The cost of one timestamp as the recorder takes it (core.h st_tsc). */
static double rdtsc_ns(long n)
{
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		uint64_t sink = 0;
		double t = now_ns();
		for (long i = 0; i < n; i++) {
#if defined(__x86_64__) || defined(__i386__)
			uint32_t lo, hi;
			__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
			sink += ((uint64_t)hi << 32) | lo;
#else
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
			sink += (uint64_t)ts.tv_nsec;
#endif
		}
		double d = (now_ns() - t) / (double)n;
		if (d < best && sink)
			best = d;
	}
	return best;
}

int main(int argc, char **argv)
{
	const char *prov = "udp";
	int nthreads = 1, opt, reset_signals = 0;
	while ((opt = getopt(argc, argv, "p:t:n:a:k:iD")) != -1) {
		switch (opt) {
		case 'D': reset_signals = 1; break;
		case 'i': {
			pthread_t it;
			pthread_create(&it, NULL, idle, NULL);
			break;
		}
		case 'p': prov = optarg; break;
		case 't': nthreads = atoi(optarg); break;
		case 'n': ncalls = atol(optarg); break;
		case 'a': action = optarg; break;
		case 'k': after = atol(optarg); break;
		default: return 2;
		}
	}
	struct fi_info *hints = fi_allocinfo();
	hints->fabric_attr->prov_name = strdup(prov);
	hints->ep_attr->type = FI_EP_DGRAM;
	hints->caps = FI_MSG;
	hints->mode = ~0ull;
	int r = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info);
	if (r) {
		hints->ep_attr->type = FI_EP_RDM;
		r = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info);
	}
	if (r) {
		fprintf(stderr, "fi_getinfo(%s): %s\n", prov, fi_strerror(-r));
		return 2;
	}
	if (reset_signals) {
		const int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGTERM, SIGINT};
		for (unsigned i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
			signal(sigs[i], SIG_DFL);
	}
	if ((r = fi_fabric(info->fabric_attr, &fabric, NULL)) || (r = fi_domain(fabric, info, &domain, NULL))) {
		fprintf(stderr, "fabric/domain: %s\n", fi_strerror(-r));
		return 2;
	}

	if (!strcmp(action, "time")) {
		struct fid_cq *cq = open_cq();
		hammer(cq, ncalls / 10, 1); /* warm up */
		double best = 1e30, thread0 = now_ns(), process0 = process_ns();
		for (int rep = 0; rep < 5; rep++) {
			double t = now_ns();
			hammer(cq, ncalls, 1);
			double d = (now_ns() - t) / (double)ncalls;
			if (d < best)
				best = d;
		}
		double thread = now_ns() - thread0, process = process_ns() - process0;
		printf("ns_per_call %.3f\n", best);
		printf("background_ns_per_call %.3f\n", (process - thread) / (5.0 * (double)ncalls));
		printf("ns_per_rdtsc %.3f\n", rdtsc_ns(ncalls));
		printf("calls %ld\n", ncalls * 5 + ncalls / 10);
		fi_close(&cq->fid);
		return 0;
	}

	pthread_t th[64];
	if (nthreads > 64)
		nthreads = 64;
	for (int i = 0; i < nthreads; i++)
		pthread_create(&th[i], NULL, worker, (void *)(long)i);
	if (after >= 0) {
		while (progress0 < after)
			sched_yield();
		if (!strcmp(action, "segv")) {
			fflush(stdout);
			volatile int *p = NULL;
			*p = 1;
		} else if (!strcmp(action, "abort")) {
			abort();
		} else if (!strcmp(action, "sleep")) {
			printf("ready\n");
			fflush(stdout);
			for (;;)
				pause();
		}
	}
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	if (!strcmp(action, "fork")) {
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			struct fid_cq *cq = open_cq();
			hammer(cq, ncalls, 1);
			printf("child calls %ld\n", ncalls);
			fflush(stdout);
			exit(0);
		}
		int st;
		waitpid(pid, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "child failed\n");
			return 4;
		}
	}
	printf("calls %ld\n", ncalls * nthreads);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	return 0;
}
