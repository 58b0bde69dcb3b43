/* libibverbs.so.1 of the emulated HCA: asynchronous events.  Each context
 * has a pipe: the NIC writes struct ibv_async_event records into it
 * (emu_async_event), ibv_get_async_event reads one -- blocking until one
 * comes, or failing with EAGAIN when the application made async_fd
 * non-blocking, like rdma-core's event file.  Raised today:
 * IBV_EVENT_QP_LAST_WQE_REACHED when a QP attached to an SRQ enters the
 * error state (UCX waits for it before it destroys such a QP).
 *
 * A QP's events not yet read when it is destroyed are never delivered, as
 * the kernel's uverbs drops a destroyed object's pending events
 * (ib_uverbs_release_uevent): each record names the QP's number and
 * registration (emu_qp.serial), and one whose QP is gone is skipped
 * (docs/emulator.md: the UCX crash it was found by).
 *
 * A QP's event once handed out keeps the QP alive: ibv_destroy_qp waits until
 * every event it reported was acknowledged (ibv_ack_async_event), as
 * rdma-core's destroy waits for events_completed to reach the kernel's
 * events_reported -- UCX's async thread reads element.qp->qp_num after
 * ibv_get_async_event returns, while its main thread may be destroying that QP. */
#include <errno.h>
#include <unistd.h>

#include "emu_internal.h"

/* Called with or without the NIC lock, from the NIC thread or a verbs call. */
EXPORT void emu_async_event(struct ibv_context *c, enum ibv_event_type type, void *element)
{
	if (!c)
		return;
	struct emu_context *e = to_ectx(c);
	if (e->async_wfd < 0)
		return;
	struct emu_async_rec rec = {.ev = {.element.qp = element, .event_type = type}};
	if (type == IBV_EVENT_QP_LAST_WQE_REACHED && element) {
		struct emu_qp *qp = to_eqp((struct ibv_qp *)element);
		rec.qpn = qp->qpn;
		rec.serial = qp->serial;
	}
	ssize_t r = write(e->async_wfd, &rec, sizeof rec);
	if (r == (ssize_t)sizeof rec)
		__atomic_add_fetch(&e->nic->stats->async_events, 1, __ATOMIC_RELAXED);
	EMU_LOG("async event %d on %p%s", (int)type, element, r == (ssize_t)sizeof rec ? "" : " (lost: pipe full)");
}

/* ---- async events ----------------------------------------------------------- */
/* Whether the QP a record names is still the one registered under its number;
 * if so the event is reported against it (under the NIC lock, so that
 * ibv_destroy_qp, which unregisters under it, sees every report). */
static int qp_alive_report(struct ibv_context *c, const struct emu_async_rec *rec)
{
	if (!rec->serial)
		return 1; /* not a QP event */
	struct emu_nic *nic = to_ectx(c)->nic;
	pthread_mutex_lock(&nic->lock);
	struct emu_qp *qp = emu_qp_lookup(nic, rec->qpn);
	int alive = qp && qp->serial == rec->serial;
	if (alive)
		qp->async_reported++;
	pthread_mutex_unlock(&nic->lock);
	return alive;
}

EXPORT int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	for (;;) {
		struct emu_async_rec rec;
		size_t got = 0;
		while (got < sizeof rec) {
			ssize_t r = read(c->async_fd, (char *)&rec + got, sizeof rec - got);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0 && errno == EAGAIN && got)
				continue; /* records are written whole: the rest is there */
			if (r <= 0) {
				if (r == 0)
					errno = EIO; /* the context is being closed */
				return -1;
			}
			got += (size_t)r;
		}
		if (qp_alive_report(c, &rec)) {
			*ev = rec.ev;
			return 0;
		}
		__atomic_add_fetch(&to_ectx(c)->nic->stats->async_events_dropped, 1, __ATOMIC_RELAXED);
	}
}

/* The QP events (those whose element is a QP, as rdma-core's ibv_ack_async_event
 * sorts them) count towards events_completed; the NIC raises no CQ or SRQ events. */
EXPORT void ibv_ack_async_event(struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ibv_qp *qp = ev->element.qp;
		pthread_mutex_lock(&qp->mutex);
		qp->events_completed++;
		pthread_cond_signal(&qp->cond);
		pthread_mutex_unlock(&qp->mutex);
		break;
	}
	default:
		break;
	}
}

/* ibv_destroy_qp's wait (qp.c): the QP is unregistered, so `reported` is final. */
EXPORT void emu_qp_wait_async_acks(struct emu_qp *qp, uint32_t reported)
{
	struct ibv_qp *b = &qp->qpx.qp_base;
	pthread_mutex_lock(&b->mutex);
	while (b->events_completed != reported)
		pthread_cond_wait(&b->cond, &b->mutex);
	pthread_mutex_unlock(&b->mutex);
}
