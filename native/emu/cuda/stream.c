/* Emulated CUDA driver: streams are worker threads (the "copy engine")
 * executing copies and event records in order; the NULL stream executes
 * synchronously. */
#include <stdlib.h>
#include <string.h>

#include "emucuda_internal.h"

/* ---- streams, events, copies ----------------------------------------------------------- */
enum { OP_COPY = 1, OP_EVENT = 2, OP_SET = 3 };
struct stream_op {
	struct stream_op *next;
	int kind;
	uint64_t dst, src;
	size_t n;
	uint8_t val;
	struct emu_event *ev;
	uint64_t ticket;
};
struct emu_stream {
	pthread_mutex_t lock;
	pthread_cond_t cond, done_cond;
	struct stream_op *head, *tail;
	uint64_t submitted, completed;
	int stop;
	pthread_t thr;
	unsigned flags;
	int copy_errors;
};
struct emu_event {
	struct emu_stream *s; /* NULL: complete */
	uint64_t ticket;
	unsigned flags;
};

static int exec_op(struct stream_op *o)
{
	if (o->kind == OP_COPY) {
		void *d = emucu_xlate_any(o->dst, o->n), *s = emucu_xlate_any(o->src, o->n);
		if (!d || !s)
			return -1;
		memmove(d, s, o->n);
	} else if (o->kind == OP_SET) {
		void *d = emucu_xlate_any(o->dst, o->n);
		if (!d)
			return -1;
		memset(d, o->val, o->n);
	}
	return 0;
}

static void *copy_engine(void *arg)
{
	struct emu_stream *s = arg;
	pthread_setname_np(pthread_self(), "emucu-stream");
	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cond, &s->lock);
		if (!s->head && s->stop)
			break;
		struct stream_op *o = s->head;
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->lock);
		if (exec_op(o) != 0)
			__atomic_fetch_add(&s->copy_errors, 1, __ATOMIC_RELAXED);
		pthread_mutex_lock(&s->lock);
		s->completed = o->ticket;
		pthread_cond_broadcast(&s->done_cond);
		free(o);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned flags)
{
	NEED_CTX_OUT(ps);
	struct emu_stream *s;
	NEW_OR_OOM(s);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_cond_init(&s->done_cond, NULL);
	s->flags = flags;
	if (pthread_create(&s->thr, NULL, copy_engine, s) != 0) {
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*ps = s;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned flags, int prio) { return cuStreamCreate(ps, flags); }

static uint64_t enqueue(struct emu_stream *s, struct stream_op *o)
{
	pthread_mutex_lock(&s->lock);
	o->ticket = ++s->submitted;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return o->ticket;
}

static CUresult stream_sync(struct emu_stream *s)
{
	if (!s)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&s->lock);
	while (s->completed < s->submitted)
		pthread_cond_wait(&s->done_cond, &s->lock);
	int err = __atomic_exchange_n(&s->copy_errors, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
	return err ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) { NEED_INIT(); return stream_sync(s); }
EXPORT CUresult cuStreamQuery(CUstream s)
{
	NEED_INIT();
	if (!s)
		return CUDA_SUCCESS;
	return __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE) >= __atomic_load_n(&s->submitted, __ATOMIC_ACQUIRE)
		       ? CUDA_SUCCESS
		       : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	NEED_INIT();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	stream_sync(s);
	pthread_mutex_lock(&s->lock);
	s->stop = 1;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thr, NULL);
	free(s);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

static CUresult copy(uint64_t dst, uint64_t src, size_t n, CUstream s, int check_dst, int check_src)
{
	NEED_CTX();
	if (!n)
		return CUDA_SUCCESS;
	/* device operands must be mapped device addresses */
	if ((check_dst && !emucu_translate(dst, n)) || (check_src && !emucu_translate(src, n)))
		return CUDA_ERROR_INVALID_VALUE;
	if (!s) {
		struct stream_op o = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
		return exec_op(&o) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	}
	struct stream_op *o;
	NEW_OR_OOM(o);
	*o = (struct stream_op){.kind = OP_COPY, .dst = dst, .src = src, .n = n};
	enqueue(s, o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return copy(d, (uintptr_t)h, n, NULL, 1, 0); }
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return copy((uintptr_t)h, d, n, NULL, 0, 1); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n, NULL, 1, 1); }
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n, NULL, 0, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s)
{
	return copy(d, (uintptr_t)h, n, s, 1, 0);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s)
{
	return copy((uintptr_t)h, d, n, s, 0, 1);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s)
{
	return copy(d, src, n, s, 1, 1);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) { return copy(dst, src, n, stream, 0, 0); }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
	NEED_CTX();
	void *p = emucu_translate(d, n);
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	memset(p, v, n);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned flags)
{
	NEED_CTX_OUT(pe);
	struct emu_event *e;
	NEW_OR_OOM(e);
	e->flags = flags;
	*pe = e;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!s) {
		e->s = NULL;
		return CUDA_SUCCESS;
	}
	struct stream_op *o;
	NEW_OR_OOM(o);
	o->kind = OP_EVENT;
	uint64_t t = enqueue(s, o);
	e->ticket = t;
	__atomic_store_n(&e->s, s, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct emu_stream *s = __atomic_load_n(&e->s, __ATOMIC_ACQUIRE);
	if (!s)
		return CUDA_SUCCESS;
	return __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE) >= e->ticket ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventSynchronize(CUevent e)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct emu_stream *s = e->s;
	if (!s)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&s->lock);
	while (s->completed < e->ticket)
		pthread_cond_wait(&s->done_cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
	NEED_INIT();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	free(e);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }
