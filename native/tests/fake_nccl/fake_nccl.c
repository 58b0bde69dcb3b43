/*
 * fake_nccl.c -- a tiny libnccl.so.2 for the NCCL provider's tests (tests/test_tracer_nccl.py): NCCL 2.28's
 * API (fake_nccl.h: the real signatures and enum values) over plain verbs on the emulated HCA, so that a
 * traced program's collectives cause real RDMA writes without a GPU or NCCL.
 *
 * Like NCCL: the unique id carries the communicator's rendezvous (here a random token; the ranks meet
 * through files in $FAKE_NCCL_DIR); ncclCommInitRank starts the communicator's proxy thread ("NCCL
 * Progress") and creates one RC QP per peer -- on the calling thread, or ($FAKE_NCCL_CONNECT) on the proxy
 * thread at the first call, which waits for it (NCCL's runtime connection), or on the proxy thread 50 ms
 * after the init returned, nobody waiting (a non-blocking communicator); a collective call only enqueues
 * the operation and returns (NCCL returns once the work is on the stream), the proxy executes the queue in
 * call order and posts the work requests; ncclGroupStart/End defer the calls of a group to the end of the group (one
 * proxy item per communicator); fakeNcclWait(comm) is the stream synchronize.
 *
 * Algorithms (host buffers; ring order rank -> rank+1): all-reduce = ring reduce-scatter + all-gather of
 * n chunks; all-gather, reduce-scatter: n-1 ring steps; broadcast and reduce: a ring pipeline from / to
 * the root; all-to-all, gather, scatter, send/recv: direct.  Every transfer is one signalled
 * RDMA_WRITE_WITH_IMM from a registered staging area into the peer's receive area for this sender; flow
 * control: at the end of an item a receiver acknowledges every peer it received from (an 8-byte
 * RDMA_WRITE_WITH_IMM, imm bit 31), and a sender waits for that acknowledgement before it writes to the
 * peer's area again.  FAKE_NCCL_NET=ib is NCCL's net transport instead: two QPs per peer, a sending one
 * (its writes with immediate consume the peer's receives; no receive posted on it) and a receiving one
 * (receives posted); at the start of each item a rank announces to every peer it receives from in the
 * item that its area is free for this item (an 8-byte RDMA_WRITE, no immediate, on the receiving QP into
 * the peer's memory: NCCL's clear-to-send FIFO entry), and a sender writes an item's data only after the
 * receiver's announcement of that item -- so a receiver's data cannot come before the receiver's own call.
 * wr_id = (operation sequence number << 20) | WR counter, so a test can tell from a work request which
 * operation posted it.
 *
 * Ground truth ($FAKE_NCCL_GT_DIR/gt-<token>-r<rank>.jsonl): the communicator's QPs, then per executed
 * proxy item its operations (sequence numbers, kind, count, bytes) and the work requests and bytes it
 * posted.  Environment: FAKE_NCCL_DIR (rendezvous, default /tmp), FAKE_NCCL_GT_DIR (no file without),
 * FAKE_NCCL_CAP (bytes of each per-peer area, default 2 MiB), FAKE_NCCL_CONNECT (init | call | async),
 * FAKE_NCCL_NET (plain | ib).
 *
 * Over 600 lines: a test library standing in for libnccl.so.2 (communicators, proxy thread,
 * algorithms, ground-truth log) as one shared object, like the library it stands for.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "../file_exchange.h"
#include "../rc_qp.h"
#include "fake_nccl.h"

#define EXPORT __attribute__((visibility("default")))
#define FAKE_VERSION 22809 /* NCCL_VERSION(2, 28, 9) */
#define RECV_DEPTH 128
#define SEND_DEPTH 256
#define IMM_ACK 0x80000000u
#define ACK_BYTES 8
#define XCHG_TIMEOUT 20.0

enum kind { K_ALL_REDUCE, K_BROADCAST, K_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_ALL_TO_ALL, K_GATHER, K_SCATTER,
	    K_SEND, K_RECV };
static const char *const kind_name[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
					"all_to_all", "gather", "scatter", "send", "recv"};
static const uint8_t dt_size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

struct op {
	int kind;
	const void *sendbuf;
	void *recvbuf;
	size_t count;
	int dt, redop, root; /* root, or the peer of send / recv */
	uint64_t seq;        /* k-th operation enqueued on the communicator */
};

struct item { /* what the proxy executes at once: one call, or one communicator's calls of a group */
	int nops;
	struct op *ops;
	struct item *next;
};

struct peer {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	uint64_t raddr; /* my area in the peer's memory */
	uint32_t rkey;
	struct ibv_qp *rqp; /* FAKE_NCCL_NET=ib: the receiving QP (pe->qp then only sends) */
	char *stage, *area; /* staging of what I send it; where it writes to me */
	uint64_t data_in, data_used;
	int unacked, sent, got, sends_out;
	size_t send_off, recv_off;
};

struct ncclComm {
	int rank, nranks, splits;
	char token[112];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	char *mem;
	size_t cap;
	struct peer *peers;
	pthread_t proxy;
	int proxy_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct item *head, *tail;
	int busy, stop;
	ncclResult_t async_err;
	uint64_t next_seq, wr_counter, item_wrs, item_bytes, cur_seq;
	FILE *gt;
	int connect_mode; /* FAKE_NCCL_CONNECT: 0 init, 1 call (the proxy, first call waits), 2 async (the proxy) */
	int connected;    /* 1 done, -1 failed */
	int net_ib;       /* FAKE_NCCL_NET=ib: NCCL's net transport (sending / receiving QPs, clear-to-send) */
	uint64_t items;   /* items started: the clear-to-send value of the current one */
	struct ibv_port_attr port;
};

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);
	return v && *v ? v : dflt;
}

#define MOD(x) ((((x) % n) + n) % n) /* a rank index around the ring of n ranks */

/* ---- transfers (proxy thread) ----------------------------------------------------------------------- */
static int poll_peer(struct ncclComm *c, int p)
{
	struct peer *pe = &c->peers[p];
	struct ibv_wc wc[16];
	int n = ibv_poll_cq(pe->cq, 16, wc);
	if (n < 0)
		return -1;
	for (int i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "fake nccl: rank %d peer %d: completion status %d\n", c->rank, p, wc[i].status);
			return -1;
		}
		if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			uint32_t imm = ntohl(wc[i].imm_data);
			if (imm & IMM_ACK)
				pe->unacked = 0;
			else
				pe->data_in++;
			struct ibv_recv_wr rw = {.wr_id = 0, .num_sge = 0}, *bad;
			if (ibv_post_recv(c->net_ib ? pe->rqp : pe->qp, &rw, &bad))
				return -1;
		} else {
			pe->sends_out--;
		}
	}
	if (n == 0) {
		static __thread unsigned idle;
		if (++idle % 64 == 0) {
			struct timespec ts = {0, 20000};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

/* One signalled RDMA write (opcode, imm) on qp of len bytes from my staging area for peer p at off into
 * its area for me at off, once the SQ has room; counted in the item's work requests and bytes. */
static int post_rdma(struct ncclComm *c, int p, struct ibv_qp *qp, size_t off, size_t len, enum ibv_wr_opcode opcode,
		     uint32_t imm)
{
	struct peer *pe = &c->peers[p];
	while (pe->sends_out >= SEND_DEPTH - 1)
		if (poll_peer(c, p))
			return -1;
	struct ibv_sge sge = {.addr = (uintptr_t)(pe->stage + off), .length = (uint32_t)len, .lkey = c->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = (c->cur_seq << 20) | (c->wr_counter++ & 0xfffff), .sg_list = &sge,
				 .num_sge = 1, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED, .imm_data = imm};
	wr.wr.rdma.remote_addr = pe->raddr + off;
	wr.wr.rdma.rkey = pe->rkey;
	struct ibv_send_wr *bad;
	if (ibv_post_send(qp, &wr, &bad))
		return -1;
	pe->sends_out++;
	c->item_wrs++;
	c->item_bytes += len;
	return 0;
}

/* One RDMA_WRITE_WITH_IMM to peer p: data (len bytes of src at the running offset) or an acknowledgement. */
static int post_write(struct ncclComm *c, int p, const void *src, size_t len, int ack)
{
	struct peer *pe = &c->peers[p];
	size_t off;
	if (ack) {
		off = c->cap - ACK_BYTES;
		len = ACK_BYTES;
		memset(pe->stage + off, 0xac, ACK_BYTES);
	} else {
		if (!pe->sent && c->net_ib) { /* the peer announced its area free for this item (in its own call) */
			while (__atomic_load_n((uint64_t *)(pe->area + c->cap - ACK_BYTES), __ATOMIC_ACQUIRE) < c->items)
				if (poll_peer(c, p))
					return -1;
			pe->sent = 1;
		} else if (!pe->sent) { /* the peer has consumed what I wrote in my previous item */
			while (pe->unacked)
				if (poll_peer(c, p))
					return -1;
			pe->sent = 1;
			pe->unacked = 1;
		}
		if (pe->send_off + len > c->cap - ACK_BYTES)
			return -1;
		off = pe->send_off;
		memcpy(pe->stage + off, src, len);
		pe->send_off += len;
	}
	return post_rdma(c, p, pe->qp, off, len, IBV_WR_RDMA_WRITE_WITH_IMM,
			 htonl(ack ? IMM_ACK : (uint32_t)(c->cur_seq & 0x7fffffff)));
}

/* Whether an operation of this rank receives from peer p (the algorithms of run_op): NCCL's receiver
 * announces its buffers only to the peers it receives from. */
static int receives_from(const struct ncclComm *c, const struct op *o, int p)
{
	int n = c->nranks, r = c->rank, prev = MOD(r - 1);
	switch (o->kind) {
	case K_ALL_REDUCE:
	case K_ALL_GATHER:
	case K_REDUCE_SCATTER:
		return p == prev;
	case K_BROADCAST:
		return r != o->root && p == prev;
	case K_REDUCE:
		return MOD(r - o->root - 1) > 0 && p == prev;
	case K_ALL_TO_ALL:
		return 1;
	case K_GATHER:
		return r == o->root;
	case K_SCATTER:
		return r != o->root && p == o->root;
	case K_RECV:
		return p == o->root;
	}
	return 0;
}

/* FAKE_NCCL_NET=ib: tell peer p that my area for it is free for the current item (clear-to-send). */
static int post_clear_to_send(struct ncclComm *c, int p)
{
	struct peer *pe = &c->peers[p];
	size_t off = c->cap - ACK_BYTES;
	memcpy(pe->stage + off, &c->items, sizeof(c->items));
	return post_rdma(c, p, pe->rqp, off, ACK_BYTES, IBV_WR_RDMA_WRITE, 0);
}

/* The next data message from peer p (len bytes): where it landed, or NULL on an error. */
static const char *recv_from(struct ncclComm *c, int p, size_t len)
{
	struct peer *pe = &c->peers[p];
	while (pe->data_in == pe->data_used)
		if (poll_peer(c, p))
			return NULL;
	pe->data_used++;
	pe->got = 1;
	const char *at = pe->area + pe->recv_off;
	pe->recv_off += len;
	return at;
}

/* The next data message from peer p copied to dst: 0, or -1 on an error. */
static int recv_into(struct ncclComm *c, int p, void *dst, size_t len)
{
	const char *in = recv_from(c, p, len);
	if (!in)
		return -1;
	memcpy(dst, in, len);
	return 0;
}

/* Slice p of src (len bytes each) to every other rank p; and the other way round, slice p of dst from
 * every other rank p. */
static int send_slices(struct ncclComm *c, const void *src, size_t len)
{
	for (int p = 0; p < c->nranks; p++)
		if (p != c->rank && post_write(c, p, (const char *)src + (size_t)p * len, len, 0))
			return -1;
	return 0;
}

static int recv_slices(struct ncclComm *c, void *dst, size_t len)
{
	for (int p = 0; p < c->nranks; p++)
		if (p != c->rank && recv_into(c, p, (char *)dst + (size_t)p * len, len))
			return -1;
	return 0;
}

/* ---- reductions -------------------------------------------------------------------------------------- */
#define REDUCE_T(T)                                                                              \
	do {                                                                                     \
		T *a = acc;                                                                      \
		const T *b = in;                                                                 \
		for (size_t i = 0; i < n; i++)                                                   \
			a[i] = op == ncclProd ? (T)(a[i] * b[i])                                 \
			       : op == ncclMax ? (a[i] > b[i] ? a[i] : b[i])                     \
			       : op == ncclMin ? (a[i] < b[i] ? a[i] : b[i]) : (T)(a[i] + b[i]); \
	} while (0)

/* The datatypes the fake reduces: (ncclDataType_t, C type). */
#define REDUCIBLE_TYPES(X)                                                                  \
	X(ncclInt8, int8_t) X(ncclUint8, uint8_t) X(ncclInt32, int32_t) X(ncclUint32, uint32_t) \
	X(ncclInt64, int64_t) X(ncclUint64, uint64_t) X(ncclFloat32, float) X(ncclFloat64, double)
#define CASE_REDUCE(code, T) case code: REDUCE_T(T); break;
#define CASE_AVG(code, T) case code: AVG_T(T); break;
#define CASE_KNOWN(code, T) case code: return 1;

static void reduce_into(void *acc, const void *in, size_t n, int dt, int op)
{
	switch (dt) { REDUCIBLE_TYPES(CASE_REDUCE) }
}

#define AVG_T(T)                                     \
	do {                                         \
		T *a = buf;                          \
		for (size_t i = 0; i < n; i++)       \
			a[i] = (T)(a[i] / nranks);   \
	} while (0)

static void finish_avg(void *buf, size_t n, int dt, int nranks)
{
	switch (dt) { REDUCIBLE_TYPES(CASE_AVG) }
}

static int reducible(int dt)
{
	switch (dt) { REDUCIBLE_TYPES(CASE_KNOWN) }
	return 0;
}

/* ---- the algorithms ---------------------------------------------------------------------------------- */

/* n - 1 steps around the ring, starting with chunk `first`: send chunk cs to the next rank, receive
 * chunk cr from the previous one and reduce it into buf (reduce-scatter, dt/redop) or copy it there
 * (all-gather, dt < 0). */
static int ring_pass(struct ncclComm *c, char *buf, size_t esz, const size_t *lo, const size_t *hi, int first, int dt,
		     int redop)
{
	int n = c->nranks, r = c->rank, next = MOD(r + 1), prev = MOD(r - 1);
	for (int s = 0; s < n - 1; s++) {
		int cs = MOD(first - s), cr = MOD(first - s - 1);
		if (post_write(c, next, buf + lo[cs] * esz, (hi[cs] - lo[cs]) * esz, 0))
			return -1;
		const char *in = recv_from(c, prev, (hi[cr] - lo[cr]) * esz);
		if (!in)
			return -1;
		if (dt >= 0)
			reduce_into(buf + lo[cr] * esz, in, hi[cr] - lo[cr], dt, redop);
		else
			memcpy(buf + lo[cr] * esz, in, (hi[cr] - lo[cr]) * esz);
	}
	return 0;
}

static int ring_reduce_scatter(struct ncclComm *c, char *acc, size_t esz, const size_t *lo, const size_t *hi,
			       int dt, int redop, int first)
{
	return ring_pass(c, acc, esz, lo, hi, first, dt, redop);
}

static int ring_all_gather(struct ncclComm *c, char *buf, size_t esz, const size_t *lo, const size_t *hi, int first)
{
	return ring_pass(c, buf, esz, lo, hi, first, -1, 0);
}

static int run_op(struct ncclComm *c, struct op *o)
{
	int n = c->nranks, r = c->rank, next = MOD(r + 1), prev = MOD(r - 1);
	size_t esz = dt_size[o->dt], bytes = o->count * esz;
	size_t lo[64], hi[64];
	c->cur_seq = o->seq;
	switch (o->kind) {
	case K_ALL_REDUCE: {
		if (o->recvbuf != o->sendbuf)
			memmove(o->recvbuf, o->sendbuf, bytes);
		for (int i = 0; i < n; i++) {
			lo[i] = o->count * (size_t)i / (size_t)n;
			hi[i] = o->count * (size_t)(i + 1) / (size_t)n;
		}
		if (n > 1 && (ring_reduce_scatter(c, o->recvbuf, esz, lo, hi, o->dt, o->redop, r) ||
			      ring_all_gather(c, o->recvbuf, esz, lo, hi, r + 1)))
			return -1;
		if (o->redop == ncclAvg)
			finish_avg(o->recvbuf, o->count, o->dt, n);
		return 0;
	}
	case K_ALL_GATHER: {
		for (int i = 0; i < n; i++) {
			lo[i] = o->count * (size_t)i;
			hi[i] = o->count * (size_t)(i + 1);
		}
		memmove((char *)o->recvbuf + lo[r] * esz, o->sendbuf, bytes);
		return n > 1 ? ring_all_gather(c, o->recvbuf, esz, lo, hi, r) : 0;
	}
	case K_REDUCE_SCATTER: {
		char *acc = malloc(bytes * (size_t)n);
		if (!acc)
			return -1;
		memcpy(acc, o->sendbuf, bytes * (size_t)n);
		for (int i = 0; i < n; i++) {
			lo[i] = o->count * (size_t)i;
			hi[i] = o->count * (size_t)(i + 1);
		}
		int bad = n > 1 && ring_reduce_scatter(c, acc, esz, lo, hi, o->dt, o->redop, r - 1);
		if (!bad) {
			memcpy(o->recvbuf, acc + lo[r] * esz, bytes);
			if (o->redop == ncclAvg)
				finish_avg(o->recvbuf, o->count, o->dt, n);
		}
		free(acc);
		return bad ? -1 : 0;
	}
	case K_BROADCAST: {
		if (r == o->root) {
			if (o->recvbuf != o->sendbuf)
				memmove(o->recvbuf, o->sendbuf, bytes);
			return n > 1 ? post_write(c, next, o->recvbuf, bytes, 0) : 0;
		}
		if (recv_into(c, prev, o->recvbuf, bytes))
			return -1;
		return next != o->root ? post_write(c, next, o->recvbuf, bytes, 0) : 0;
	}
	case K_REDUCE: {
		char *acc = malloc(bytes ? bytes : 1);
		if (!acc)
			return -1;
		memcpy(acc, o->sendbuf, bytes);
		int pos = MOD(r - o->root - 1), bad = 0;
		if (pos > 0) {
			const char *in = recv_from(c, prev, bytes);
			if (in)
				reduce_into(acc, in, o->count, o->dt, o->redop);
			bad = !in;
		}
		if (!bad && r != o->root)
			bad = post_write(c, next, acc, bytes, 0);
		if (!bad && r == o->root) {
			memcpy(o->recvbuf, acc, bytes);
			if (o->redop == ncclAvg)
				finish_avg(o->recvbuf, o->count, o->dt, n);
		}
		free(acc);
		return bad ? -1 : 0;
	}
	case K_ALL_TO_ALL:
		if (send_slices(c, o->sendbuf, bytes))
			return -1;
		memmove((char *)o->recvbuf + (size_t)r * bytes, (const char *)o->sendbuf + (size_t)r * bytes, bytes);
		return recv_slices(c, o->recvbuf, bytes);
	case K_GATHER:
		if (r != o->root)
			return post_write(c, o->root, o->sendbuf, bytes, 0);
		memmove((char *)o->recvbuf + (size_t)r * bytes, o->sendbuf, bytes);
		return recv_slices(c, o->recvbuf, bytes);
	case K_SCATTER:
		if (r != o->root)
			return recv_into(c, o->root, o->recvbuf, bytes);
		if (send_slices(c, o->sendbuf, bytes))
			return -1;
		memmove(o->recvbuf, (const char *)o->sendbuf + (size_t)r * bytes, bytes);
		return 0;
	case K_SEND:
		return post_write(c, o->root, o->sendbuf, bytes, 0);
	case K_RECV:
		return recv_into(c, o->root, o->recvbuf, bytes);
	}
	return -1;
}

/* One item: its operations in call order (a group of point-to-point calls only: the sends first, so that
 * two ranks receiving from each other in one group do not wait for each other), then the
 * acknowledgements, then every completion of what was posted. */
static int run_item(struct ncclComm *c, struct item *it)
{
	int n = c->nranks, bad = 0, p2p = 1;
	for (int p = 0; p < n; p++) {
		struct peer *pe = &c->peers[p];
		pe->send_off = pe->recv_off = 0;
		pe->sent = pe->got = 0;
	}
	c->item_wrs = c->item_bytes = 0;
	for (int i = 0; i < it->nops; i++)
		p2p &= it->ops[i].kind == K_SEND || it->ops[i].kind == K_RECV;
	if (c->net_ib) {
		c->items++;
		c->cur_seq = it->nops ? it->ops[0].seq : 0;
		for (int p = 0; p < n && !bad; p++) {
			int from = 0;
			for (int i = 0; i < it->nops; i++)
				from |= p != c->rank && receives_from(c, &it->ops[i], p);
			if (from)
				bad = post_clear_to_send(c, p);
		}
	}
	for (int pass = 0; pass < (p2p ? 2 : 1) && !bad; pass++)
		for (int i = 0; i < it->nops && !bad; i++)
			if (!p2p || (pass == 0) == (it->ops[i].kind == K_SEND))
				bad = run_op(c, &it->ops[i]);
	for (int p = 0; p < n && !bad && !c->net_ib; p++)
		if (p != c->rank && c->peers[p].got)
			bad = post_write(c, p, NULL, 0, 1);
	for (int p = 0; p < n && !bad; p++)
		while (p != c->rank && c->peers[p].sends_out > 0 && !bad)
			bad = poll_peer(c, p);
	if (c->gt) {
		fprintf(c->gt, "{\"item\": [");
		for (int i = 0; i < it->nops; i++)
			fprintf(c->gt, "%s{\"seq\": %llu, \"op\": \"%s\", \"count\": %zu, \"bytes\": %zu, \"peer\": %d}",
				i ? ", " : "", (unsigned long long)it->ops[i].seq, kind_name[it->ops[i].kind],
				it->ops[i].count, it->ops[i].count * dt_size[it->ops[i].dt], it->ops[i].root);
		fprintf(c->gt, "], \"wrs\": %llu, \"wire_bytes\": %llu, \"ok\": %s}\n", (unsigned long long)c->item_wrs,
			(unsigned long long)c->item_bytes, bad ? "false" : "true");
		fflush(c->gt);
	}
	return bad;
}

static int proxy_connect(struct ncclComm *c);

static void *proxy_main(void *arg)
{
	struct ncclComm *c = arg;
	pthread_setname_np(pthread_self(), "NCCL Progress"); /* before its first verbs call */
	if (c->connect_mode == 2) { /* well after ncclCommInitRank returned, as a non-blocking init may */
		struct timespec ts = {0, 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
		proxy_connect(c);
	}
	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (!c->head && !c->stop)
			pthread_cond_wait(&c->cv, &c->mu);
		if (!c->head)
			break;
		if (c->connected == 0) {
			pthread_mutex_unlock(&c->mu);
			proxy_connect(c);
			pthread_mutex_lock(&c->mu);
		}
		if (c->connected < 0 && !c->async_err)
			c->async_err = ncclSystemError;
		struct item *it = c->head;
		c->head = it->next;
		if (!c->head)
			c->tail = NULL;
		c->busy = 1;
		pthread_mutex_unlock(&c->mu);
		int bad = c->async_err ? 1 : run_item(c, it);
		pthread_mutex_lock(&c->mu);
		if (bad && !c->async_err)
			c->async_err = ncclSystemError;
		c->busy = 0;
		free(it->ops);
		free(it);
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

static void enqueue(struct ncclComm *c, struct item *it)
{
	pthread_mutex_lock(&c->mu);
	if (c->tail)
		c->tail->next = it;
	else
		c->head = it;
	c->tail = it;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

/* ---- communicators ------------------------------------------------------------------------------------ */
static void comm_free(struct ncclComm *c)
{
	if (c->proxy_started) {
		pthread_mutex_lock(&c->mu);
		c->stop = 1;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->proxy, NULL);
	}
	for (int p = 0; c->peers && p < c->nranks; p++) {
		if (c->peers[p].qp)
			ibv_destroy_qp(c->peers[p].qp);
		if (c->peers[p].rqp)
			ibv_destroy_qp(c->peers[p].rqp);
		if (c->peers[p].cq)
			ibv_destroy_cq(c->peers[p].cq);
	}
	if (c->mr)
		ibv_dereg_mr(c->mr);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->ctx)
		ibv_close_device(c->ctx);
	if (c->gt)
		fclose(c->gt);
	free(c->mem);
	free(c->peers);
	free(c);
}

/* The QPs: one RC QP per peer, addresses swapped through $FAKE_NCCL_DIR, every rank ready; then the
 * ground truth's first line.  On the calling thread (FAKE_NCCL_CONNECT=init, like NCCL < 2.22 at init) or
 * on the proxy thread (call: at the first call, which waits for it, like NCCL's runtime connection; async:
 * at once, nobody waiting, like a non-blocking communicator). */
static int comm_connect(struct ncclComm *c)
{
	const char *dir = env_or("FAKE_NCCL_DIR", "/tmp");
	const char *token = c->token;
	int rank = c->rank, nranks = c->nranks;
	char name[160], text[256];
	for (int p = 0; p < nranks; p++) {
		struct peer *pe = &c->peers[p];
		if (p == rank)
			continue;
		pe->cq = ibv_create_cq(c->ctx, SEND_DEPTH + RECV_DEPTH, NULL, NULL, 0);
		struct ibv_qp_init_attr qa = {.send_cq = pe->cq, .recv_cq = pe->cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = SEND_DEPTH, .max_recv_wr = RECV_DEPTH,
						      .max_send_sge = 1, .max_recv_sge = 1}};
		if (!pe->cq || !(pe->qp = ibv_create_qp(c->pd, &qa)) || rc_to_init(pe->qp))
			return -1;
		if (c->net_ib && (!(pe->rqp = ibv_create_qp(c->pd, &qa)) || rc_to_init(pe->rqp)))
			return -1;
		for (int i = 0; i < RECV_DEPTH; i++) {
			struct ibv_recv_wr rw = {.wr_id = 0, .num_sge = 0}, *bad;
			if (ibv_post_recv(c->net_ib ? pe->rqp : pe->qp, &rw, &bad))
				return -1;
		}
		snprintf(name, sizeof(name), "%s.%d.%d", token, rank, p);
		snprintf(text, sizeof(text), "%u %u %u %llu %u", c->port.lid, pe->qp->qp_num,
			 pe->rqp ? pe->rqp->qp_num : 0u, (unsigned long long)(uintptr_t)pe->area, c->mr->rkey);
		if (xchg_put(dir, name, text))
			return -1;
	}
	for (int p = 0; p < nranks; p++) {
		if (p == rank)
			continue;
		struct peer *pe = &c->peers[p];
		unsigned lid, qpn, rqpn, rkey;
		unsigned long long raddr;
		snprintf(name, sizeof(name), "%s.%d.%d", token, p, rank);
		if (xchg_get(dir, name, text, sizeof(text), XCHG_TIMEOUT) ||
		    sscanf(text, "%u %u %u %llu %u", &lid, &qpn, &rqpn, &raddr, &rkey) != 5) {
			fprintf(stderr, "fake nccl: rank %d: no address from rank %d\n", rank, p);
			return -1;
		}
		pe->raddr = raddr;
		pe->rkey = rkey;
		/* net_ib: my sending QP to its receiving one, my receiving QP to its sending one */
		if (rc_to_rtr_rts(pe->qp, c->net_ib ? rqpn : qpn, (uint16_t)lid, 1) ||
		    (c->net_ib && rc_to_rtr_rts(pe->rqp, qpn, (uint16_t)lid, 1)))
			return -1;
	}
	snprintf(name, sizeof(name), "%s.%d.ready", token, rank);
	if (xchg_put(dir, name, "1"))
		return -1;
	for (int p = 0; p < nranks; p++) {
		snprintf(name, sizeof(name), "%s.%d.ready", token, p);
		if (xchg_get(dir, name, text, sizeof(text), XCHG_TIMEOUT))
			return -1;
	}
	const char *gdir = getenv("FAKE_NCCL_GT_DIR");
	if (gdir && *gdir) {
		char path[512];
		snprintf(path, sizeof(path), "%s/gt-%s-r%d.jsonl", gdir, token, rank);
		c->gt = fopen(path, "w");
		if (c->gt) {
			fprintf(c->gt, "{\"init\": true, \"token\": \"%s\", \"rank\": %d, \"nranks\": %d, \"qpns\": [", token,
				rank, nranks);
			for (int p = 0, k = 0; p < nranks; p++) {
				if (p != rank)
					fprintf(c->gt, "%s%u", k++ ? ", " : "", c->peers[p].qp->qp_num);
				if (p != rank && c->peers[p].rqp)
					fprintf(c->gt, ", %u", c->peers[p].rqp->qp_num);
			}
			fprintf(c->gt, "], \"pid\": %d}\n", (int)getpid());
			fflush(c->gt);
		}
	}
	return 0;
}

/* the proxy connects (call / async modes) and tells whoever waits */
static int proxy_connect(struct ncclComm *c)
{
	int r = comm_connect(c) ? -1 : 1;
	pthread_mutex_lock(&c->mu);
	c->connected = r;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return r;
}

static ncclResult_t comm_init(struct ncclComm **out, const char *token, int nranks, int rank)
{
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (!c)
		return ncclSystemError;
	c->rank = rank;
	c->nranks = nranks;
	snprintf(c->token, sizeof(c->token), "%s", token);
	c->cap = (size_t)strtoull(env_or("FAKE_NCCL_CAP", "2097152"), NULL, 0);
	const char *how = env_or("FAKE_NCCL_CONNECT", "init");
	c->connect_mode = !strcmp(how, "call") ? 1 : !strcmp(how, "async") ? 2 : 0;
	c->net_ib = !strcmp(env_or("FAKE_NCCL_NET", "plain"), "ib");
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	int ndev = 0;
	struct ibv_device **devs = ibv_get_device_list(&ndev);
	if (!devs || ndev < 1) {
		fprintf(stderr, "fake nccl: no RDMA device\n");
		goto fail;
	}
	c->ctx = ibv_open_device(devs[0]);
	ibv_free_device_list(devs);
	if (!c->ctx || !(c->pd = ibv_alloc_pd(c->ctx)) || ibv_query_port(c->ctx, 1, &c->port))
		goto fail;
	size_t total = (size_t)nranks * 2 * c->cap;
	if (posix_memalign((void **)&c->mem, 4096, total))
		goto fail;
	memset(c->mem, 0, total);
	c->mr = ibv_reg_mr(c->pd, c->mem, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	c->peers = calloc((size_t)nranks, sizeof(*c->peers));
	if (!c->mr || !c->peers)
		goto fail;
	for (int p = 0; p < nranks; p++) {
		c->peers[p].stage = c->mem + (size_t)p * 2 * c->cap;
		c->peers[p].area = c->peers[p].stage + c->cap;
	}
	if (c->connect_mode == 0) {
		if (comm_connect(c))
			goto fail;
		c->connected = 1;
	}
	if (pthread_create(&c->proxy, NULL, proxy_main, c))
		goto fail;
	c->proxy_started = 1;
	*out = c;
	return ncclSuccess;
fail:
	comm_free(c);
	return ncclSystemError;
}

static int parse_id(const ncclUniqueId *id, char *token, size_t n)
{
	if (memcmp(id->internal, "FAKENCCL", 8))
		return -1;
	snprintf(token, n, "%.32s", id->internal + 8);
	return 0;
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = FAKE_VERSION;
	return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
	static const char *const s[] = {"no error", "unhandled cuda error", "unhandled system error",
					"internal error", "invalid argument", "invalid usage", "remote error",
					"operation in progress"};
	return (unsigned)r < 8 ? s[r] : "unknown result code";
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	if (!id)
		return ncclInvalidArgument;
	unsigned char rnd[16];
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, rnd, sizeof(rnd)) != (ssize_t)sizeof(rnd)) {
		if (fd >= 0)
			close(fd);
		return ncclSystemError;
	}
	close(fd);
	memset(id, 0, sizeof(*id));
	memcpy(id->internal, "FAKENCCL", 8);
	for (int i = 0; i < 16; i++)
		snprintf(id->internal + 8 + 2 * i, 3, "%02x", rnd[i]);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	char token[40];
	if (!comm || nranks < 1 || nranks > 64 || rank < 0 || rank >= nranks || parse_id(&commId, token, sizeof(token)))
		return ncclInvalidArgument;
	return comm_init(comm, token, nranks, rank);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
					   ncclConfig_t *config)
{
	return ncclCommInitRank(comm, nranks, commId, rank);
}

EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
					     ncclUniqueId *commIds, ncclConfig_t *config)
{
	if (nId < 1 || !commIds)
		return ncclInvalidArgument;
	return ncclCommInitRank(newcomm, nranks, commIds[0], myrank);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	return ncclInvalidUsage; /* one emulated device per process: no single-process cliques */
}

/* The ranks of one color, ordered by (key, rank), form the new communicator; its token is the parent's
 * with the split's number and color. */
EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	if (!comm || !newcomm)
		return ncclInvalidArgument;
	fakeNcclWait(comm);
	const char *dir = env_or("FAKE_NCCL_DIR", "/tmp");
	int k = comm->splits++, n = comm->nranks;
	char name[200], text[64];
	snprintf(name, sizeof(name), "%s.split%d.%d", comm->token, k, comm->rank);
	snprintf(text, sizeof(text), "%d %d", color, key);
	if (xchg_put(dir, name, text))
		return ncclSystemError;
	int colors[64], keys[64], newrank = 0, nnew = 0;
	for (int p = 0; p < n; p++) {
		snprintf(name, sizeof(name), "%s.split%d.%d", comm->token, k, p);
		if (xchg_get(dir, name, text, sizeof(text), XCHG_TIMEOUT) || sscanf(text, "%d %d", &colors[p], &keys[p]) != 2)
			return ncclSystemError;
	}
	*newcomm = NULL;
	if (color == NCCL_SPLIT_NOCOLOR)
		return ncclSuccess;
	for (int p = 0; p < n; p++) {
		if (colors[p] != color)
			continue;
		nnew++;
		if (keys[p] < key || (keys[p] == key && p < comm->rank))
			newrank++;
	}
	char token[112];
	snprintf(token, sizeof(token), "%.32ss%dc%d", comm->token, k, color);
	return comm_init(newcomm, token, nnew, newrank);
}

EXPORT ncclResult_t fakeNcclWait(ncclComm_t c)
{
	if (!c)
		return ncclInvalidArgument;
	pthread_mutex_lock(&c->mu);
	while (c->head || c->busy)
		pthread_cond_wait(&c->cv, &c->mu);
	ncclResult_t r = c->async_err;
	pthread_mutex_unlock(&c->mu);
	return r;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	return comm ? fakeNcclWait(comm) : ncclInvalidArgument;
}

/* Every rank has executed everything before any destroys its QPs (each rank's last acknowledgements are
 * completed, so acknowledged by the peer, before it says so). */
static void goodbye(struct ncclComm *c)
{
	const char *dir = env_or("FAKE_NCCL_DIR", "/tmp");
	char name[160], text[8];
	snprintf(name, sizeof(name), "%s.%d.bye", c->token, c->rank);
	if (xchg_put(dir, name, "1"))
		return;
	for (int p = 0; p < c->nranks; p++) {
		snprintf(name, sizeof(name), "%s.%d.bye", c->token, p);
		xchg_get(dir, name, text, sizeof(text), XCHG_TIMEOUT);
	}
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	if (!comm)
		return ncclInvalidArgument;
	fakeNcclWait(comm);
	goodbye(comm);
	comm_free(comm);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	if (!comm)
		return ncclInvalidArgument;
	pthread_mutex_lock(&comm->mu);
	comm->async_err = ncclRemoteError; /* what is still queued is not executed */
	pthread_mutex_unlock(&comm->mu);
	fakeNcclWait(comm);
	comm_free(comm);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
	if (!comm || !err)
		return ncclInvalidArgument;
	pthread_mutex_lock(&comm->mu);
	*err = comm->async_err;
	pthread_mutex_unlock(&comm->mu);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	if (!comm || !count)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	if (!comm || !device)
		return ncclInvalidArgument;
	*device = 0;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!comm || !rank)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

/* ---- the calls: checked, then enqueued (or kept for the end of the group) ------------------------------ */
struct pending {
	struct ncclComm *comm;
	struct op op;
};
static __thread int group_depth;
static __thread struct pending *group_ops;
static __thread int group_n, group_cap;

/* FAKE_NCCL_CONNECT=call: the call that made the proxy connect returns once the QPs are up (NCCL's runtime
 * connection blocks the caller the same way) */
static ncclResult_t wait_connected(struct ncclComm *c)
{
	if (c->connect_mode != 1)
		return ncclSuccess;
	pthread_mutex_lock(&c->mu);
	while (c->connected == 0)
		pthread_cond_wait(&c->cv, &c->mu);
	int r = c->connected;
	pthread_mutex_unlock(&c->mu);
	return r > 0 ? ncclSuccess : ncclSystemError;
}

static ncclResult_t submit(struct ncclComm *c, int kind, const void *sendbuf, void *recvbuf, size_t count, int dt,
			   int redop, int root)
{
	if (!c || dt < 0 || dt >= ncclNumTypes)
		return ncclInvalidArgument;
	int reduces = kind == K_ALL_REDUCE || kind == K_REDUCE || kind == K_REDUCE_SCATTER;
	if (reduces && (!reducible(dt) || redop < 0 || redop > ncclAvg))
		return ncclInvalidArgument;
	if ((kind == K_SEND || kind == K_RECV) && (root < 0 || root >= c->nranks || root == c->rank))
		return ncclInvalidArgument;
	if ((kind == K_BROADCAST || kind == K_REDUCE || kind == K_GATHER || kind == K_SCATTER) &&
	    (root < 0 || root >= c->nranks))
		return ncclInvalidArgument;
	size_t per_peer = count * dt_size[dt] *
			  (kind == K_ALL_REDUCE ? 2 : kind == K_ALL_GATHER || kind == K_REDUCE_SCATTER ? (size_t)c->nranks : 1);
	if (per_peer > c->cap - ACK_BYTES)
		return ncclInvalidUsage;
	struct op o = {.kind = kind, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = dt, .redop = redop,
		       .root = root, .seq = c->next_seq++};
	if (group_depth > 0) {
		if (group_n == group_cap) {
			int cap = group_cap ? 2 * group_cap : 16;
			struct pending *g = realloc(group_ops, (size_t)cap * sizeof(*g));
			if (!g)
				return ncclSystemError;
			group_ops = g;
			group_cap = cap;
		}
		group_ops[group_n++] = (struct pending){c, o};
		return ncclSuccess;
	}
	struct item *it = calloc(1, sizeof(*it));
	if (!it || !(it->ops = malloc(sizeof(o)))) {
		free(it);
		return ncclSystemError;
	}
	it->nops = 1;
	it->ops[0] = o;
	enqueue(c, it);
	return wait_connected(c);
}

EXPORT ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

static ncclResult_t group_close(int launch)
{
	if (group_depth <= 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	ncclResult_t ret = ncclSuccess;
	for (int i = 0; i < group_n; i++) { /* one item per communicator, in first-call order */
		struct ncclComm *c = group_ops[i].comm;
		if (!c)
			continue;
		int k = 0;
		for (int j = i; j < group_n; j++)
			k += group_ops[j].comm == c;
		struct item *it = calloc(1, sizeof(*it));
		if (!it || !(it->ops = malloc((size_t)k * sizeof(struct op)))) {
			free(it);
			ret = ncclSystemError;
			break;
		}
		for (int j = i; j < group_n; j++)
			if (group_ops[j].comm == c) {
				it->ops[it->nops++] = group_ops[j].op;
				group_ops[j].comm = NULL;
			}
		if (launch) {
			enqueue(c, it);
			if (wait_connected(c) != ncclSuccess)
				ret = ncclSystemError;
		} else {
			free(it->ops);
			free(it);
		}
	}
	group_n = 0;
	return ret;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
	return group_close(1);
}

EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
	return group_close(0);
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, -1);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				  int root, ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_BROADCAST, sendbuff, recvbuff, count, datatype, -1, root);
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
			      cudaStream_t stream)
{
	return ncclBroadcast(buff, buff, count, datatype, root, comm, stream); /* as NCCL does: through its export */
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_REDUCE, sendbuff, recvbuff, count, datatype, op, root);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
				  ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, -1, -1);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
				      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1);
}

EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
				 ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_ALL_TO_ALL, sendbuff, recvbuff, count, datatype, -1, -1);
}

EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			       ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_GATHER, sendbuff, recvbuff, count, datatype, -1, root);
}

EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
				ncclComm_t comm, cudaStream_t stream)
{
	return submit(comm, K_SCATTER, sendbuff, recvbuff, count, datatype, -1, root);
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
			     cudaStream_t stream)
{
	return submit(comm, K_SEND, sendbuff, NULL, count, datatype, -1, peer);
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
			     cudaStream_t stream)
{
	return submit(comm, K_RECV, NULL, recvbuff, count, datatype, -1, peer);
}
