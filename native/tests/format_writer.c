/*
 * Conformance writer: drives the native recorder core (linked in directly,
 * see tests/test_format_conformance.py) from several threads and prints, on
 * stdout, what it recorded so the Python reader's output can be compared
 * record for record:
 *
 *   T <k> <tid>                              thread k's kernel tid
 *   E <tid> <type> <aux> <obj> <arg>         primary record (tsc unknown here)
 *   X <tid> <x0> <x1> <x2> <x3>              its EXT continuation
 *   S <side_id> <kind> <hex data>            side record
 *   A <tid> <type> <aux> <obj> <peer> <count> <bytes>   aggregate totals
 *
 * Usage: format_writer THREADS EVENTS_PER_THREAD
 * Run with SIGMATRACE_MODE=aggregate (so threads get counter tables; events
 * are recorded in every mode through st_ev) and SIGMATRACE_DROP_POLICY=block.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/core.h"

static int nevents;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static const uint16_t types[] = {ST_EV_OFI_SEND, ST_EV_OFI_RECV, ST_EV_UCP_PUT, ST_EV_IBV_POST_SEND,
				 ST_EV_DB_DOORBELL, ST_EV_OFI_CQ_READ};

struct line_buf {
	char *buf;
	size_t len, cap;
};

static void emit(struct line_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct line_buf *b, const char *fmt, ...)
{
	va_list ap;
	if (b->cap - b->len < 256) {
		b->cap = b->cap ? b->cap * 2 : 1 << 20;
		b->buf = realloc(b->buf, b->cap);
	}
	va_start(ap, fmt);
	b->len += (size_t)vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
}

static void *worker(void *arg)
{
	unsigned k = (unsigned)(uintptr_t)arg;
	pid_t tid = (pid_t)syscall(SYS_gettid);
	struct line_buf out = {0};
	emit(&out, "T %u %d\n", k, tid);
	for (int i = 0; i < nevents; i++) {
		uint16_t type = types[(i + k) % (sizeof(types) / sizeof(types[0]))];
		uint16_t aux = (uint16_t)(i * 7 + k);
		uint32_t obj = k * 1000000u + (uint32_t)i;
		uint64_t arg64 = (uint64_t)i * (uint64_t)i + ((uint64_t)k << 40);
		if (i % 3 == 0) {
			uint64_t x0 = (uint64_t)i * 3 + 0xabc0000000000000ull;
			uint16_t x1 = (uint16_t)k;
			uint32_t x2 = (uint32_t)i ^ 0x5a5a5a5au;
			uint64_t x3 = ~(uint64_t)i;
			st_ev_ext(type, aux, obj, arg64, x0, x1, x2, x3);
			emit(&out, "E %d %u %u %u %llu\n", tid, type, aux, obj, (unsigned long long)arg64);
			emit(&out, "X %d %llu %u %u %llu\n", tid, (unsigned long long)x0, x1, x2, (unsigned long long)x3);
		} else {
			st_ev(type, aux, obj, arg64);
			emit(&out, "E %d %u %u %u %llu\n", tid, type, aux, obj, (unsigned long long)arg64);
		}
		/* counters under a handful of keys */
		st_agg_add(type, (uint16_t)(i % 2), k, (uint64_t)(i % 5) + 100, (uint64_t)i);
	}
	/* totals of the counters, computed independently */
	for (unsigned t = 0; t < sizeof(types) / sizeof(types[0]); t++)
		for (unsigned a = 0; a < 2; a++)
			for (unsigned p = 0; p < 5; p++) {
				unsigned long long cnt = 0, bytes = 0;
				for (int i = 0; i < nevents; i++)
					if (types[(i + k) % (sizeof(types) / sizeof(types[0]))] == types[t] &&
					    (unsigned)(i % 2) == a && (unsigned)(i % 5) == p) {
						cnt++;
						bytes += (unsigned long long)i;
					}
				if (cnt)
					emit(&out, "A %d %u %u %u %u %llu %llu\n", tid, types[t], a, k, p + 100, cnt, bytes);
			}
	pthread_mutex_lock(&out_lock);
	fwrite(out.buf, 1, out.len, stdout);
	pthread_mutex_unlock(&out_lock);
	free(out.buf);
	return NULL;
}

static void hex_line(uint64_t id, int kind, const void *parts[], const size_t lens[], int n)
{
	printf("S %llu %d ", (unsigned long long)id, kind);
	for (int p = 0; p < n; p++)
		for (size_t i = 0; i < lens[p]; i++)
			printf("%02x", ((const unsigned char *)parts[p])[i]);
	printf("\n");
}

int main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 4;
	nevents = argc > 2 ? atoi(argv[2]) : 10000;

	/* side records of every kind, from the main thread */
	const char *s = "hello from the conformance writer";
	const char *js = "{\"k\":1,\"name\":\"x\"}";
	unsigned char in[40], outb[24], wqe[2 * 64], blob[13];
	for (unsigned i = 0; i < sizeof(in); i++)
		in[i] = (unsigned char)(i * 3);
	for (unsigned i = 0; i < sizeof(outb); i++)
		outb[i] = (unsigned char)(255 - i);
	for (unsigned i = 0; i < sizeof(wqe); i++)
		wqe[i] = (unsigned char)(i ^ 0x77);
	for (unsigned i = 0; i < sizeof(blob); i++)
		blob[i] = (unsigned char)(i + 1);
	struct st_side_prm prm = {sizeof(in), sizeof(outb)};
	struct st_side_wqe wh = {.qpn = 0x1234, .first_wqe_index = 0xfffe, .num_wqebb = 2, .log_sq_size = 6,
				 .flags = ST_WQE_F_VERIFIED};
	uint64_t id;
	id = st_side_add(ST_SIDE_STRING, s, strlen(s), NULL, 0, NULL, 0);
	hex_line(id, ST_SIDE_STRING, (const void *[]){s}, (size_t[]){strlen(s)}, 1);
	id = st_side_json(js, strlen(js));
	hex_line(id, ST_SIDE_JSON, (const void *[]){js}, (size_t[]){strlen(js)}, 1);
	id = st_side_add(ST_SIDE_PRM_COMMAND, &prm, sizeof(prm), in, sizeof(in), outb, sizeof(outb));
	hex_line(id, ST_SIDE_PRM_COMMAND, (const void *[]){&prm, in, outb}, (size_t[]){sizeof(prm), sizeof(in), sizeof(outb)}, 3);
	id = st_side_add(ST_SIDE_WQE_BYTES, &wh, sizeof(wh), wqe, sizeof(wqe), NULL, 0);
	hex_line(id, ST_SIDE_WQE_BYTES, (const void *[]){&wh, wqe}, (size_t[]){sizeof(wh), sizeof(wqe)}, 2);
	id = st_side_add(ST_SIDE_BLOB, blob, sizeof(blob), NULL, 0, NULL, 0);
	hex_line(id, ST_SIDE_BLOB, (const void *[]){blob}, (size_t[]){sizeof(blob)}, 1);
	fflush(stdout);

	pthread_t th[64];
	if (nthreads > 64)
		nthreads = 64;
	for (int k = 0; k < nthreads; k++)
		pthread_create(&th[k], NULL, worker, (void *)(uintptr_t)(k + 1));
	for (int k = 0; k < nthreads; k++)
		pthread_join(th[k], NULL);
	fflush(stdout);
	return 0;
}
