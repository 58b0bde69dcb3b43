// Per-operation latency of NVSHMEM's public API between two PEs (the paper's Fig. 4 setting), timed on the
// GPU with %globaltimer: put + quiet, get, atomic fetch-add, ping-pong.  Two processes bootstrap with a
// unique id exchanged through a file (no MPI): PE 0 writes it, PE 1 reads it.
//
//   nvshmem_lat RANK NPES ID_FILE [ITERS [WARMUP [BYTES]]]
//
// Prints per op "LAT op=<name> pe=<r> iters=<n> bytes=<b> p50_ns=<x> mean_ns=<y>" from PE 0, and
// "RESULT OK|BAD" per PE after checking the data (every put landed, the gets read what the peer holds, the
// fetch-adds summed).  Each op issues exactly ITERS + WARMUP NVSHMEM operations to the peer (the ground
// truth the trace is checked against: tests/test_gpu_nvshmem.py).
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, "CUDA %s: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)

__device__ __forceinline__ unsigned long long gtimer() {
	unsigned long long t;
	asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
	return t;
}

enum { OP_PUT, OP_GET, OP_FADD, OP_PINGPONG };

__global__ void lat_kernel(int op, int peer, char *buf, size_t bytes, uint64_t *counter, int *flag, int iters,
                           unsigned long long *times) {
	int me = nvshmem_my_pe();
	for (int i = 0; i < iters; i++) {
		unsigned long long t0 = gtimer();
		switch (op) {
		case OP_PUT:
			nvshmem_putmem(buf, buf + bytes, bytes, peer);
			nvshmem_quiet();
			break;
		case OP_GET:
			nvshmem_getmem(buf, buf + bytes, bytes, peer);   // the peer's second half into our first
			break;
		case OP_FADD:
			(void)nvshmem_uint64_atomic_fetch_add(counter, 1, peer);
			break;
		case OP_PINGPONG:
			if (me == 0) {
				nvshmem_int_p(flag, i + 1, peer);
				nvshmem_quiet();
				nvshmem_int_wait_until(flag + 1, NVSHMEM_CMP_GE, i + 1);
			} else {
				nvshmem_int_wait_until(flag, NVSHMEM_CMP_GE, i + 1);
				nvshmem_int_p(flag + 1, i + 1, peer);
				nvshmem_quiet();
			}
			break;
		}
		times[i] = gtimer() - t0;
	}
}

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: %s RANK NPES ID_FILE [ITERS [WARMUP [BYTES]]]\n", argv[0]);
		return 2;
	}
	int rank = atoi(argv[1]), npes = atoi(argv[2]);
	const char *idf = argv[3];
	int iters = argc > 4 ? atoi(argv[4]) : 5000, warmup = argc > 5 ? atoi(argv[5]) : 1000;
	size_t bytes = argc > 6 ? (size_t)atoll(argv[6]) : 8;
	CK(cudaSetDevice(0));
	nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
	if (rank == 0) {
		nvshmemx_get_uniqueid(&id);
		char tmp[512];
		snprintf(tmp, sizeof tmp, "%s.tmp", idf);
		FILE *f = fopen(tmp, "wb");
		fwrite(&id, sizeof id, 1, f);
		fclose(f);
		rename(tmp, idf);
	} else {
		FILE *f = NULL;
		for (int k = 0; k < 600 && !(f = fopen(idf, "rb")); k++)
			usleep(100000);
		if (!f || fread(&id, sizeof id, 1, f) != 1) {
			fprintf(stderr, "no unique id in %s\n", idf);
			return 2;
		}
		fclose(f);
	}
	nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
	nvshmemx_set_attr_uniqueid_args(rank, npes, &id, &attr);
	if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) {
		fprintf(stderr, "nvshmemx_init_attr failed\n");
		return 3;
	}
	int me = nvshmem_my_pe(), peer = (me + 1) % nvshmem_n_pes();
	char *buf = (char *)nvshmem_malloc(2 * bytes);
	uint64_t *counter = (uint64_t *)nvshmem_malloc(sizeof(uint64_t));
	int *flag = (int *)nvshmem_malloc(2 * sizeof(int));
	CK(cudaMemset(buf, me + 1, 2 * bytes));
	CK(cudaMemset(counter, 0, sizeof(uint64_t)));
	unsigned long long *times;
	CK(cudaMalloc(&times, sizeof(unsigned long long) * (iters + warmup)));
	const char *names[] = {"put", "get", "fadd", "pingpong"};
	int ok = 1;
	for (int op = OP_PUT; op <= OP_PINGPONG; op++) {
		CK(cudaMemset(flag, 0, 2 * sizeof(int)));
		nvshmem_barrier_all();
		// PE 0 drives put/get/fadd; both take part in ping-pong
		if (op == OP_PINGPONG || me == 0) {
			lat_kernel<<<1, 1>>>(op, peer, buf, bytes, counter, flag, iters + warmup, times);
			CK(cudaGetLastError());
			CK(cudaDeviceSynchronize());
		}
		nvshmem_barrier_all();
		if (me == 0) {
			std::vector<unsigned long long> t(iters + warmup);
			CK(cudaMemcpy(t.data(), times, sizeof(unsigned long long) * t.size(), cudaMemcpyDeviceToHost));
			std::vector<unsigned long long> m(t.begin() + warmup, t.end());
			std::sort(m.begin(), m.end());
			double mean = 0;
			for (auto v : m) mean += (double)v;
			mean /= m.size() ? m.size() : 1;
			printf("LAT op=%s pe=%d iters=%d warmup=%d bytes=%zu p50_ns=%llu mean_ns=%.1f\n", names[op], me, iters,
			       warmup, op == OP_FADD ? (size_t)8 : (op == OP_PINGPONG ? sizeof(int) : bytes),
			       m.empty() ? 0ULL : m[m.size() / 2], mean);
			fflush(stdout);
		}
	}
	// checks: PE 1 received PE 0's puts (PE 0's buffer holds 0x01 bytes); PE 1's counter got every fetch-add
	std::vector<char> h(2 * bytes);
	CK(cudaMemcpy(h.data(), buf, 2 * bytes, cudaMemcpyDeviceToHost));
	uint64_t cnt = 0;
	CK(cudaMemcpy(&cnt, counter, sizeof cnt, cudaMemcpyDeviceToHost));
	if (me == 1) {
		for (size_t k = 0; k < bytes; k++) ok &= h[k] == 1;       // the put target range
		ok &= cnt == (uint64_t)(iters + warmup);
	} else {
		for (size_t k = 0; k < bytes; k++) ok &= h[k] == 2;   // the get landing range: PE 1's second half
	}
	nvshmem_barrier_all();
	printf("RESULT %s pe=%d counter=%lld\n", ok ? "OK" : "BAD", me, (long long)cnt);
	nvshmem_free(buf);
	nvshmem_free(counter);
	nvshmem_free(flag);
	nvshmem_finalize();
	return ok ? 0 : 1;
}
