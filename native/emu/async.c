/* libibverbs.so.1 of the emulated HCA: asynchronous events.  Each context
 * has a pipe: the NIC writes struct ibv_async_event records into it
 * (emu_async_event), ibv_get_async_event reads one -- blocking until one
 * comes, or failing with EAGAIN when the application made async_fd
 * non-blocking, like rdma-core's event file.  Raised today:
 * IBV_EVENT_QP_LAST_WQE_REACHED when a QP attached to an SRQ enters the
 * error state (UCX waits for it before it destroys such a QP). */
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
	struct ibv_async_event ev;
	ev.element.qp = element;
	ev.event_type = type;
	ssize_t r = write(e->async_wfd, &ev, sizeof ev);
	if (r == (ssize_t)sizeof ev)
		__atomic_add_fetch(&e->nic->stats->async_events, 1, __ATOMIC_RELAXED);
	EMU_LOG("async event %d on %p%s", (int)type, element, r == (ssize_t)sizeof ev ? "" : " (lost: pipe full)");
}

/* ---- async events ----------------------------------------------------------- */
EXPORT int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	size_t got = 0;
	while (got < sizeof *ev) {
		ssize_t r = read(c->async_fd, (char *)ev + got, sizeof *ev - got);
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
	return 0;
}
EXPORT void ibv_ack_async_event(struct ibv_async_event *ev) {}
