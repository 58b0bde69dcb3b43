/*
 * nccl_client.c -- one rank of an NCCL program, for the NCCL provider's tests (tests/test_tracer_nccl.py):
 * built against fake_nccl.h, run over the fake libnccl.so.2 on the emulated HCA.
 *
 *   nccl_client RANK NRANKS DIR [--ops LIST] [--iters N] [--count N] [--nowait | --nowait-rank R]
 *
 * Rank 0 makes the unique id and hands it to the others through DIR (as MPI would broadcast it); every
 * rank creates the communicator, runs each operation of LIST --iters times on --count float32 elements,
 * waits for it (fakeNcclWait: the stream synchronize) unless --nowait (or --nowait-rank R and this is rank R:
 * a broadcast root running ahead of its proxy, as NCCL's does), checks the result and prints one
 * line per call: the operation, the iteration, NCCL's result and a checksum of what it received -- the
 * same lines traced and untraced.  Operations: all_reduce, broadcast, bcast, reduce, all_gather,
 * reduce_scatter, all_to_all, gather, scatter, send_recv (rank 0 -> 1, ungrouped), p2p_ring (a group of a
 * send to the next rank and a receive from the previous), group (a group of two all_reduces), split (an
 * all_reduce on ncclCommSplit(comm, 0, rank)), errors (calls NCCL refuses: bad datatype, bad peer,
 * ncclGroupEnd outside a group).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../file_exchange.h"
#include "fake_nccl.h"

static int rank, nranks, bad;
static cudaStream_t stream = (cudaStream_t)0x5151;

static uint64_t checksum(const float *v, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) {
		uint32_t x;
		memcpy(&x, &v[i], 4);
		h = (h ^ x) * 1099511628211ull;
	}
	return h;
}

static void report(const char *op, int it, ncclResult_t r, int ok, const float *v, size_t n)
{
	printf("OP %s it=%d ret=%d ok=%d sum=%016llx\n", op, it, (int)r, ok, (unsigned long long)(v ? checksum(v, n) : 0));
	if (!ok)
		bad = 1;
}

static void fill(float *v, size_t n, int who)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (float)(who + 1 + (int)(i % 7));
}

static ncclResult_t wait(ncclComm_t c, int nowait)
{
	return nowait ? ncclSuccess : fakeNcclWait(c);
}

static void run(ncclComm_t comm, const char *op, int it, size_t n, int nowait)
{
	size_t bytes = n * sizeof(float) * (size_t)nranks;
	float *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes);
	ncclResult_t r = ncclSuccess;
	int ok = 1;
	size_t outn = n;
	memset(b, 0, bytes);
	if (!strcmp(op, "all_reduce") || !strcmp(op, "group")) {
		fill(a, n, rank);
		for (size_t i = 0; i < n; i++) {
			want[i] = 0;
			for (int q = 0; q < nranks; q++)
				want[i] += (float)(q + 1 + (int)(i % 7));
		}
		if (!strcmp(op, "group")) {
			float *c2 = malloc(bytes);
			ncclGroupStart();
			r = ncclAllReduce(a, b, n, ncclFloat32, ncclSum, comm, stream);
			ncclResult_t r2 = ncclAllReduce(a, c2, n / 2, ncclFloat32, ncclMax, comm, stream);
			ncclResult_t r3 = ncclGroupEnd();
			r = r ? r : r2 ? r2 : r3;
			wait(comm, nowait);
			for (size_t i = 0; i < n / 2 && !nowait; i++)
				ok &= c2[i] == (float)(nranks + (int)(i % 7));
			if (!nowait)
				free(c2);
		} else {
			r = ncclAllReduce(a, b, n, ncclFloat32, ncclSum, comm, stream);
			wait(comm, nowait);
		}
		for (size_t i = 0; i < n && !nowait; i++)
			ok &= b[i] == want[i];
	} else if (!strcmp(op, "broadcast") || !strcmp(op, "bcast")) {
		fill(a, n, 0);
		if (!strcmp(op, "bcast")) {
			if (rank != 0)
				memset(a, 0, n * sizeof(float));
			r = ncclBcast(a, n, ncclFloat32, 0, comm, stream);
			wait(comm, nowait);
			memcpy(b, a, n * sizeof(float));
			fill(a, n, 0);
		} else {
			r = ncclBroadcast(a, b, n, ncclFloat32, 0, comm, stream);
			wait(comm, nowait);
		}
		for (size_t i = 0; i < n && !nowait; i++)
			ok &= b[i] == a[i];
	} else if (!strcmp(op, "reduce")) {
		fill(a, n, rank);
		r = ncclReduce(a, b, n, ncclFloat32, ncclSum, nranks - 1, comm, stream);
		wait(comm, nowait);
		for (size_t i = 0; i < n && rank == nranks - 1 && !nowait; i++) {
			float w = 0;
			for (int q = 0; q < nranks; q++)
				w += (float)(q + 1 + (int)(i % 7));
			ok &= b[i] == w;
		}
	} else if (!strcmp(op, "all_gather")) {
		fill(a, n, rank);
		r = ncclAllGather(a, b, n, ncclFloat32, comm, stream);
		wait(comm, nowait);
		outn = n * (size_t)nranks;
		for (int q = 0; q < nranks && !nowait; q++)
			for (size_t i = 0; i < n; i++)
				ok &= b[(size_t)q * n + i] == (float)(q + 1 + (int)(i % 7));
	} else if (!strcmp(op, "reduce_scatter")) {
		fill(a, n * (size_t)nranks, rank);
		r = ncclReduceScatter(a, b, n, ncclFloat32, ncclSum, comm, stream);
		wait(comm, nowait);
		for (size_t i = 0; i < n && !nowait; i++) {
			size_t g = (size_t)rank * n + i;
			float w = 0;
			for (int q = 0; q < nranks; q++)
				w += (float)(q + 1 + (int)(g % 7));
			ok &= b[i] == w;
		}
	} else if (!strcmp(op, "all_to_all") || !strcmp(op, "gather") || !strcmp(op, "scatter")) {
		for (int q = 0; q < nranks; q++)
			for (size_t i = 0; i < n; i++)
				a[(size_t)q * n + i] = (float)(rank * 100 + q * 10 + (int)(i % 7));
		outn = n * (size_t)nranks;
		if (!strcmp(op, "all_to_all")) {
			r = ncclAlltoAll(a, b, n, ncclFloat32, comm, stream);
			wait(comm, nowait);
			for (int q = 0; q < nranks && !nowait; q++)
				for (size_t i = 0; i < n; i++)
					ok &= b[(size_t)q * n + i] == (float)(q * 100 + rank * 10 + (int)(i % 7));
		} else if (!strcmp(op, "gather")) {
			r = ncclGather(a, b, n, ncclFloat32, 0, comm, stream);   /* each rank's first block */
			wait(comm, nowait);
			for (int q = 0; q < nranks && rank == 0 && !nowait; q++)
				for (size_t i = 0; i < n; i++)
					ok &= b[(size_t)q * n + i] == (float)(q * 100 + (int)(i % 7));
		} else {
			r = ncclScatter(a, b, n, ncclFloat32, 0, comm, stream);
			wait(comm, nowait);
			outn = n;
			for (size_t i = 0; i < n && !nowait; i++)
				ok &= b[i] == (float)(rank * 10 + (int)(i % 7));
		}
	} else if (!strcmp(op, "send_recv")) {
		fill(a, n, 0);
		if (rank == 0)
			r = ncclSend(a, n, ncclFloat32, 1, comm, stream);
		else if (rank == 1)
			r = ncclRecv(b, n, ncclFloat32, 0, comm, stream);
		wait(comm, nowait);
		for (size_t i = 0; i < n && rank == 1 && !nowait; i++)
			ok &= b[i] == a[i];
	} else if (!strcmp(op, "p2p_ring")) {
		fill(a, n, rank);
		int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
		ncclGroupStart();
		ncclResult_t r1 = ncclSend(a, n, ncclFloat32, next, comm, stream);
		ncclResult_t r2 = ncclRecv(b, n, ncclFloat32, prev, comm, stream);
		r = ncclGroupEnd();
		r = r1 ? r1 : r2 ? r2 : r;
		wait(comm, nowait);
		for (size_t i = 0; i < n && !nowait; i++)
			ok &= b[i] == (float)(prev + 1 + (int)(i % 7));
	} else if (!strcmp(op, "split")) {
		ncclComm_t sub = NULL;
		r = ncclCommSplit(comm, 0, rank, &sub, NULL);
		if (r == ncclSuccess && sub) {
			fill(a, n, rank);
			r = ncclAllReduce(a, b, n, ncclFloat32, ncclSum, sub, stream);
			wait(sub, nowait);
			fakeNcclWait(sub);
			for (size_t i = 0; i < n; i++) {
				float w = 0;
				for (int q = 0; q < nranks; q++)
					w += (float)(q + 1 + (int)(i % 7));
				ok &= b[i] == w;
			}
			ncclCommDestroy(sub);
		} else {
			ok = 0;
		}
	} else if (!strcmp(op, "errors")) {
		fill(a, n, rank);
		ncclResult_t e1 = ncclAllReduce(a, b, n, (ncclDataType_t)99, ncclSum, comm, stream);
		ncclResult_t e2 = ncclSend(a, n, ncclFloat32, nranks + 5, comm, stream);
		ncclResult_t e3 = ncclGroupEnd();
		printf("ERRORS %d %d %d\n", (int)e1, (int)e2, (int)e3);
		ok = e1 == ncclInvalidArgument && e2 == ncclInvalidArgument && e3 == ncclInvalidUsage;
		r = ncclSuccess;
		outn = 0;
	} else {
		fprintf(stderr, "unknown op %s\n", op);
		exit(2);
	}
	report(op, it, r, ok && r == ncclSuccess, outn ? b : NULL, outn);
	if (nowait)
		return; /* the proxy may still read and write them */
	free(a);
	free(b);
	free(want);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s RANK NRANKS DIR [--ops LIST] [--iters N] [--count N] "
				"[--nowait | --nowait-rank R]\n", argv[0]);
		return 2;
	}
	rank = atoi(argv[1]);
	nranks = atoi(argv[2]);
	const char *dir = argv[3], *ops = "all_reduce";
	int iters = 3, nowait = 0;
	size_t count = 4096;
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--ops") && i + 1 < argc)
			ops = argv[++i];
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--count") && i + 1 < argc)
			count = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--nowait"))
			nowait = 1;
		else if (!strcmp(argv[i], "--nowait-rank") && i + 1 < argc)
			nowait = atoi(argv[++i]) == rank;
	}
	ncclUniqueId id;
	char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
	if (rank == 0) {
		if (ncclGetUniqueId(&id) != ncclSuccess)
			return 3;
		for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
			snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
		if (xchg_put(dir, "unique_id", hex))
			return 3;
	} else {
		if (xchg_get(dir, "unique_id", hex, sizeof(hex), 20.0))
			return 3;
		for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
			unsigned v;
			sscanf(hex + 2 * i, "%2x", &v);
			id.internal[i] = (char)v;
		}
	}
	ncclComm_t comm;
	ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
	int v = 0, cnt = 0, me = -1;
	ncclGetVersion(&v);
	if (r == ncclSuccess) {
		ncclCommCount(comm, &cnt);
		ncclCommUserRank(comm, &me);
	}
	printf("INIT ret=%d version=%d count=%d rank=%d\n", (int)r, v, cnt, me);
	if (r != ncclSuccess)
		return 4;
	char list[512];
	snprintf(list, sizeof(list), "%s", ops);
	for (char *op = strtok(list, ","); op; op = strtok(NULL, ","))
		for (int it = 0; it < iters; it++)
			run(comm, op, it, count, nowait);
	ncclResult_t w = fakeNcclWait(comm);
	ncclResult_t d = ncclCommDestroy(comm);
	printf("DONE wait=%d destroy=%d %s\n", (int)w, (int)d, bad ? "BAD" : "OK");
	return bad || w || d ? 1 : 0;
}
